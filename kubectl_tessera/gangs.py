"""`kubectl tessera gangs`: each gang (PodGroup) with its members, its state and why it
waits, read from the API server like the other views.

What the objects alone decide (no PodGroup or one that does not parse, fewer members
than minMember, a member whose request breaks a rule, members that disagree on their
topology) is worked out with the scheduler's own core (`tessera.gang.roster`). Whether a
complete gang's devices fit is tessera-scheduler's call: its reason is the one it gave on
a pending member, as kube-scheduler recorded it in the pod's PodScheduled condition.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kubectl_tessera.objects import (
    FINISHED_PHASES,
    age,
    name_of,
    node_of,
    parse_time,
    phase_of,
    text,
    uid_of,
)
from kubectl_tessera.table import render
from tessera.errors import GangError, RequestError
from tessera.gang.roster import GangRoster, Member, Waiting
from tessera.gang.spec import NO_TOPOLOGY, GangKey, GangSpec, PodGroupSource
from tessera.pod_fields import section
from tessera.request import PodRequest, parse_pod
from tessera.resources import DEFAULT_GANG_TIMEOUT_SECONDS

SOURCE = PodGroupSource()
MAX_REASON = 512
"""Characters kept of a reason read from a pod (kube-scheduler's message lists them all)."""
MAX_NAMES = 8
"""Pending members named per gang in the table (`-o json` has them all)."""
NOT_TRIED = "complete; tessera-scheduler has not reported on it yet"
HEADERS = ["NAMESPACE", "GANG", "MIN", "PENDING", "BOUND", "STATE", "WAITED", "WAITING", "REASON"]
"""The table's columns, in order."""


@dataclass
class GangRow:
    namespace: str
    name: str
    min_member: int | None
    """None: no usable PodGroup (the reason says why)."""
    members: int
    pending: int
    bound: int
    state: str
    """bound (every member bound), reserved (placed, members being bound) or waiting."""
    reason: str
    pending_members: list[str] = field(default_factory=list)
    waited_seconds: float | None = None
    """How long its longest-waiting pending member has existed (None: none pending)."""
    timeout_seconds: int = DEFAULT_GANG_TIMEOUT_SECONDS
    """The PodGroup's scheduleTimeoutSeconds (the scheduler's default without one)."""
    past_timeout: bool = False
    """A pending member has waited longer than `timeout_seconds`: the gang the scheduler
    counts in tessera_scheduler_gangs_waiting_past_timeout (it counts from when it first
    saw the member pending, this from the member's creation)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def waited(self) -> str:
        """The WAITED column: `45s`, `12m (timeout 60s)` once past the timeout, `-`."""
        if self.waited_seconds is None:
            return "-"
        shown = age(self.waited_seconds)
        return f"{shown} (timeout {self.timeout_seconds}s)" if self.past_timeout else shown


def _member(pod: Mapping[str, Any], nvidia_gpu: bool) -> Member | None:
    """A live gang pod as the scheduler's roster keeps it (None: no gang, or finished)."""
    try:
        key = SOURCE.member_of(pod)
    except GangError:
        return None
    if key is None or phase_of(pod) in FINISHED_PHASES or not uid_of(pod):
        return None
    if section(pod, "metadata").get("deletionTimestamp"):
        return None
    problem = None
    topology = NO_TOPOLOGY
    request: PodRequest | None = None
    try:
        topology = SOURCE.topology(pod)
    except GangError as exc:
        problem = str(exc)
    try:
        parsed = parse_pod(pod, nvidia_gpu_enabled=nvidia_gpu)
        request = parsed if parsed.wants_devices else None
    except RequestError as exc:
        problem = problem or f"invalid device request: {exc}"
    return Member(uid_of(pod), name_of(pod), key, node_of(pod), request, topology, problem)


def recorded_reason(pod: Mapping[str, Any], key: GangKey) -> str:
    """tessera's reason for the gang as kube-scheduler recorded it on a pending member
    ("gang ns/name: ...", up to the end of that reason), or ""."""
    conditions = section(pod, "status").get("conditions")
    for c in conditions[:32] if isinstance(conditions, list) else []:
        if not (isinstance(c, Mapping) and c.get("type") == "PodScheduled"):
            continue
        message = text(c.get("message"))[:4096]
        found = re.search(rf"gang {re.escape(str(key))}: (.*?)(?:\.(?:\s|$)|$)", message)
        if found:
            return f"gang {key}: {found[1]}"[:MAX_REASON]
    return ""


def rows(
    groups: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    nvidia_gpu: bool,
    now: float,
) -> list[GangRow]:
    """One row per gang that has a PodGroup or a live member, sorted by namespace/name.
    `now` (seconds since the epoch) dates how long pending members have waited, from their
    creation (a member without a readable creationTimestamp counts from now)."""
    roster = GangRoster()
    keys: set[GangKey] = set()
    for obj in groups:
        key = SOURCE.key(obj)
        if key is None:
            continue
        try:
            spec: GangSpec | str = SOURCE.parse(obj)
        except GangError as exc:
            spec = str(exc)
        roster.spec_seen(key, spec)
        keys.add(key)
    recorded: dict[GangKey, str] = {}
    for pod in pods:
        member = _member(pod, nvidia_gpu)
        if member is None:
            continue
        created = parse_time(section(pod, "metadata").get("creationTimestamp"))
        roster.member_seen(member, now=now if created is None else min(created, now))
        keys.add(member.key)
        if member.pending and not recorded.get(member.key):
            recorded[member.key] = recorded_reason(pod, member.key)
    out = []
    for key in sorted(keys):
        found = roster.spec(key)
        since = roster.waiting_since(key)
        waited = None if since is None else now - since
        timeout = (
            found.timeout_seconds if isinstance(found, GangSpec) else DEFAULT_GANG_TIMEOUT_SECONDS
        )
        members = roster.members(key)
        pending = sorted(m.name for m in members if m.pending)
        readiness = roster.readiness(key)
        said = recorded.get(key, "")
        if isinstance(readiness, Waiting):
            state, reason = "waiting", readiness.reason
        elif not pending:
            state, reason = "bound", ""
        elif said.endswith(": reserved, waiting for its members to bind"):
            state, reason = "reserved", said
        else:
            state, reason = "waiting", said or f"gang {key}: {NOT_TRIED}"
        out.append(
            GangRow(
                key.namespace,
                key.name,
                found.min_member if isinstance(found, GangSpec) else None,
                len(members),
                len(pending),
                len(members) - len(pending),
                state,
                reason,
                pending,
                waited,
                timeout,
                waited is not None and waited > timeout,  # as the scheduler's roster judges
            )
        )
    return out


def gang_of(pod: Mapping[str, Any]) -> GangKey | None:
    """The gang a pod names by its label (None: none, or a label that names no PodGroup:
    explain then shows the rule it breaks)."""
    try:
        return SOURCE.member_of(pod)
    except GangError:
        return None


def row_of(pod: Mapping[str, Any], gang_rows: list[GangRow]) -> GangRow | None:
    key = gang_of(pod)
    return next((r for r in gang_rows if key is not None and r.key == str(key)), None)


def render_rows(gang_rows: list[GangRow]) -> str:
    if not gang_rows:
        return "No gangs (PodGroups or pods with a pod-group label) found."
    table = []
    for r in gang_rows:
        names = ", ".join(r.pending_members[:MAX_NAMES])
        if len(r.pending_members) > MAX_NAMES:
            names += f" and {len(r.pending_members) - MAX_NAMES} more"
        table.append(
            [
                r.namespace,
                r.name,
                "-" if r.min_member is None else str(r.min_member),
                str(r.pending),
                str(r.bound),
                r.state,
                r.waited(),
                names or "-",
                r.reason.removeprefix(f"gang {r.key}: ") or "-",
            ]
        )
    return render(HEADERS, table)


def as_json(gang_rows: list[GangRow]) -> dict[str, Any]:
    return {"gangs": [asdict(r) | {"gang": r.key} for r in gang_rows]}
