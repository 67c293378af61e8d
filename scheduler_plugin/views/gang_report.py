"""What operators see of the gangs: each gang that waits, for the page's "Why pending",
and every gang with its reservation, for the debug API. Read from the gang roster, the
gangs' last reasons and the state's reservations; the caller holds the gangs' lock."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler_plugin.state.reservations import Reservations
from tessera.gang.roster import GangRoster, Ready, Waiting
from tessera.gang.spec import GangKey, GangSpec

MAX_SHOWN = 200
"""Waiting gangs `waiting` lists (the allocation page's "Why pending"), the oldest keys
first; the count of all is given beside them."""
MAX_MEMBER_NAMES = 16
"""Pending members named per gang (the counts cover every member)."""


def waiting(
    roster: GangRoster, reasons: Mapping[GangKey, str], reservations: Reservations
) -> tuple[list[dict[str, Any]], int]:
    """Every gang with a member not bound yet: its members against `minMember`, why it
    waits, and its reservation (held nodes and the seconds left before the timeout, or the
    seconds before a released gang is planned again). At most MAX_SHOWN, with the number
    of all."""
    everyone = roster.keys()  # sorted, unlike a dict's
    keys = [k for k in everyone if any(m.pending for m in roster.members(k))]
    shown = [_waiting_one(roster, reasons, reservations, k) for k in keys[:MAX_SHOWN]]
    return shown, len(keys)


def _waiting_one(
    roster: GangRoster, reasons: Mapping[GangKey, str], reservations: Reservations, key: GangKey
) -> dict[str, Any]:
    spec = roster.spec(key)
    members = roster.members(key)
    pending = sorted(m.name for m in members if m.pending)
    readiness = roster.readiness(key)
    standing = reservations.standing(key)
    if isinstance(readiness, Waiting):
        reason = readiness.reason
    elif standing.state == "reserved":
        reason = f"gang {key}: reserved, waiting for its members to bind"
    else:
        reason = reasons.get(key) or f"gang {key}: complete, to be planned"
    return {
        "gang": str(key),
        "namespace": key.namespace,
        "name": key.name,
        "minMember": spec.min_member if isinstance(spec, GangSpec) else None,
        "timeoutS": spec.timeout_seconds if isinstance(spec, GangSpec) else None,
        "members": len(members),
        "pending": len(pending),
        "bound": len(members) - len(pending),
        "pendingMembers": pending[:MAX_MEMBER_NAMES],
        "reason": reason,
        "reservation": {
            "state": standing.state,
            "seconds": None if standing.seconds is None else round(standing.seconds, 1),
            "nodes": list(standing.nodes),
        },
    }


def summary(
    roster: GangRoster, reasons: Mapping[GangKey, str], reservations: Reservations
) -> dict[str, Any]:
    """Every gang with its members and reservation (the debug API)."""
    out = []
    everyone = roster.keys()  # sorted, unlike a dict's
    for key in everyone:
        readiness = roster.readiness(key)
        members = roster.members(key)
        reservation = reservations.reservation(key)
        out.append(
            {
                "gang": str(key),
                "members": len(members),
                "bound": sum(1 for m in members if not m.pending),
                "ready": isinstance(readiness, Ready),
                "reason": reasons.get(key)
                or (readiness.reason if isinstance(readiness, Waiting) else ""),
                "reserved": {uid: a.node for uid, a in sorted(reservation.members.items())}
                if reservation is not None
                else {},
            }
        )
    return {"gangs": out}
