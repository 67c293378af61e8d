"""Who is in each gang, as the watches show it, and whether the gang can be planned.

The roster keeps each gang's spec (or why its PodGroup is unusable) and each member's
state: pending or bound, its device request (or why it does not parse), its topology
annotations. `readiness` turns that into either the members to place now or the reason
every member waits. Members that finished do not count.

It also keeps since when each member has waited unbound: from the first time the caller
showed it pending (the caller's clock, passed in) until it is shown bound or gone.
`past_timeout` names the gangs where one has waited longer than the gang's timeout.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tessera.gang.spec import GangKey, GangSpec, GangTopology
from tessera.request import PodRequest


@dataclass(frozen=True, slots=True)
class Member:
    uid: str
    name: str
    key: GangKey
    node: str
    """Where it is bound ("" while pending)."""
    request: PodRequest | None
    """Its device request (None: asks for no tessera device, or it does not parse)."""
    topology: GangTopology
    problem: str | None = None
    """Why its request or gang annotations do not parse (the whole gang waits)."""

    @property
    def pending(self) -> bool:
        return not self.node


@dataclass(frozen=True)
class Ready:
    spec: GangSpec
    pending: tuple[PodRequest, ...]
    """Pending members that ask for devices: what a plan places."""
    placed: tuple[str, ...]
    """Nodes of bound members."""
    topology: GangTopology
    bound: tuple[str, ...] = ()
    """UIDs of bound members (what they hold counts as free to the gang: minResources)."""


@dataclass(frozen=True)
class Waiting:
    reason: str


class GangRoster:
    def __init__(self) -> None:
        self._specs: dict[GangKey, GangSpec | str] = {}
        self._members: dict[GangKey, dict[str, Member]] = {}
        self._key_of: dict[str, GangKey] = {}
        self._since: dict[str, float] = {}
        """UID -> when a member not bound yet was first seen pending (bound ones are not
        here)."""

    # --- gang objects -------------------------------------------------------------------

    def spec_seen(self, key: GangKey, spec: GangSpec | str) -> None:
        """A gang object was seen: its spec, or why it cannot be used."""
        self._specs[key] = spec

    def spec_gone(self, key: GangKey) -> None:
        self._specs.pop(key, None)

    def specs_replaced(self, specs: Iterable[tuple[GangKey, GangSpec | str]]) -> None:
        self._specs = dict(specs)

    def spec(self, key: GangKey) -> GangSpec | str | None:
        return self._specs.get(key)

    # --- members ------------------------------------------------------------------------

    def member_seen(self, member: Member, *, now: float) -> None:
        """A live member as it is `now` (pending or bound)."""
        before = self._key_of.get(member.uid)
        if before is not None and before != member.key:
            self.member_gone(member.uid)
        self._members.setdefault(member.key, {})[member.uid] = member
        self._key_of[member.uid] = member.key
        if member.pending:
            self._since.setdefault(member.uid, now)
        else:
            self._since.pop(member.uid, None)

    def member_gone(self, uid: str) -> GangKey | None:
        self._since.pop(uid, None)
        key = self._key_of.pop(uid, None)
        if key is None:
            return None
        members = self._members.get(key, {})
        members.pop(uid, None)
        if not members:
            self._members.pop(key, None)
        return key

    def members_replaced(self, members: Iterable[Member], *, now: float) -> set[GangKey]:
        """A full list of live members as they are `now`; returns the gangs whose membership
        changed. Members still pending keep the time they were first seen so."""
        before = {k: dict(v) for k, v in self._members.items()}
        since = self._since
        self._members = {}
        self._key_of = {}
        self._since = {}
        for member in members:
            self.member_seen(member, now=since.get(member.uid, now))
        keys = set(before) | set(self._members)
        return {k for k in keys if before.get(k) != self._members.get(k)}

    def key_of(self, uid: str) -> GangKey | None:
        return self._key_of.get(uid)

    def member(self, uid: str) -> Member | None:
        key = self._key_of.get(uid)
        return None if key is None else self._members[key].get(uid)

    def members(self, key: GangKey) -> list[Member]:
        return sorted(self._members.get(key, {}).values(), key=lambda m: m.uid)

    def keys(self) -> list[GangKey]:
        return sorted(self._members)

    # --- waiting ------------------------------------------------------------------------

    def waiting_since(self, key: GangKey) -> float | None:
        """When the gang's longest-waiting member not bound yet was first seen pending
        (None: every member is bound, or it has none)."""
        times = [self._since[uid] for uid in self._members.get(key, ()) if uid in self._since]
        return min(times, default=None)

    def past_timeout(self, now: float, default_timeout: float) -> list[GangKey]:
        """Gangs with a member that has waited unbound, as of `now`, longer than the gang's
        timeout (`default_timeout` where its spec is missing or unusable). Costs the members
        not bound yet, not every member."""
        oldest: dict[GangKey, float] = {}
        for uid, since in self._since.items():
            key = self._key_of[uid]
            if since < oldest.get(key, now):
                oldest[key] = since
        late = []
        for key, since in oldest.items():
            spec = self._specs.get(key)
            timeout = spec.timeout_seconds if isinstance(spec, GangSpec) else default_timeout
            if now - since > timeout:
                late.append(key)
        return sorted(late)

    # --- readiness ----------------------------------------------------------------------

    def readiness(self, key: GangKey) -> Ready | Waiting:
        spec = self._specs.get(key)
        if spec is None:
            return Waiting(f"gang {key}: waiting for its PodGroup {key}")
        if isinstance(spec, str):
            return Waiting(f"gang {key}: {spec}")
        members = self.members(key)
        for m in members:
            if m.problem is not None:
                return Waiting(f"gang {key}: member {key.namespace}/{m.name}: {m.problem}")
        topologies = {m.topology for m in members}
        if len(topologies) > 1:
            return Waiting(f"gang {key}: its members disagree on their gang topology annotations")
        if len(members) < spec.min_member:
            return Waiting(f"gang {key}: {len(members)} of {spec.min_member} members pending")
        pending = tuple(m.request for m in members if m.pending and m.request is not None)
        bound = [m for m in members if not m.pending]
        topology = next(iter(topologies))
        return Ready(
            spec, pending, tuple(m.node for m in bound), topology, tuple(m.uid for m in bound)
        )
