"""Gangs in the running scheduler: the watches feed the roster, filter and a ticker plan
and reserve, bind takes a member's reservation, and members are nudged to be retried.

- The gang objects (PodGroups, through `GangSource`) and the gang's pods (every pod with
  the gang label, pending or bound) are watched apart from the state's own informers; a
  gang waits until both have listed. Node labels come from the Node watch (topology).
- A member's filter: while its gang cannot be planned, every node fails with the gang's
  reason (resolvable: kube-scheduler retries); once the gang is reserved, only the
  member's reserved node passes. The first filter that finds the gang complete plans it.
- kube-scheduler retries an unschedulable pod only on events it sees, so when a gang is
  reserved each other pending member gets a small patch (`GANG_RESERVED_ANNOTATION`, its
  node); that update moves it back to kube-scheduler's active queue at once.
- `tick` (about once a second, leader only) releases reservations past their timeout
  and plans complete gangs again when the cluster or the gang changed.

Only the leader plans (extender calls reach the leader alone). Reservations live in
memory: after a restart the gang is planned again around the members already bound.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from sys import intern
from typing import Any

from scheduler_plugin.state.cache import Cache
from scheduler_plugin.views import gang_report
from tessera.errors import GangError, RequestError
from tessera.gang.min_resources import judged
from tessera.gang.plan import GangAsk, GangShortfall
from tessera.gang.roster import GangRoster, Member, Ready, Waiting
from tessera.gang.spec import NO_TOPOLOGY, GangKey, GangSource, GangSpec, PodGroupSource
from tessera.pod_fields import is_finished, pod_identity, pod_node, section
from tessera.request import PodRequest

log = logging.getLogger(__name__)

MAX_EARLY = 4096
"""Members remembered as refused before the gang watches listed (nudged once they have)."""
MAX_NODE_LABELS = 64
"""Labels kept per node for topology (a Node carrying more keeps the first, sorted)."""

Poke = tuple[str, str, str, str]
"""(namespace, name, uid, reserved node) of a member to nudge."""


@dataclass(frozen=True)
class GangAnswer:
    """What filter answers a gang member: its reserved node, or why it waits."""

    node: str | None
    reason: str


class Gangs:
    """Gang bookkeeping of one scheduler (thread-safe). `parse` reads a pod's device
    request (the extender's own parser); `on_reserved` is told the members to nudge;
    `nvidia_gpu`: the scheduler manages `nvidia.com/gpu` (a PodGroup's minResources of it
    is then judged here)."""

    def __init__(
        self,
        cache: Cache,
        parse: Callable[[Mapping[str, Any]], PodRequest],
        *,
        source: GangSource | None = None,
        on_reserved: Callable[[list[Poke]], None] | None = None,
        nvidia_gpu: bool = False,
    ) -> None:
        self.cache = cache
        self.parse = parse
        self.source: GangSource = source or PodGroupSource()
        self.on_reserved = on_reserved
        self.nvidia_gpu = nvidia_gpu
        self._lock = threading.Lock()
        self._roster = GangRoster()
        self._labels: dict[str, dict[str, str]] = {}
        self._reasons: dict[GangKey, str] = {}
        self._tried: dict[GangKey, tuple[int, int, int, frozenset[str] | None]] = {}
        """Gang -> (state generation, nodes opened or closed, roster version, nodes looked
        at) of its last failed plan: it is not tried again until one of them changes."""
        self._version = 0
        """Grows on every roster change."""
        self._candidates: dict[GangKey, frozenset[str]] = {}
        """Gang -> the nodes kube-scheduler last offered one of its members (its own
        filters passed there: taints, selectors, host resources). A plan made in filter
        keeps to them; the ticker's plans look at every node (the offer may be stale)."""
        self._early: dict[str, Poke] = {}
        """Members whose filter came before the gang watches had listed: kube-scheduler
        recorded "waiting for the scheduler to list" on them and would not ask again for
        minutes; once both have listed, each is nudged (no node) to be asked again."""
        self.groups_synced = threading.Event()
        self.members_synced = threading.Event()

    # --- what the watches show ----------------------------------------------------------------

    def _changed(self) -> None:
        self._version += 1

    def groups_replaced(self, items: Iterable[Mapping[str, Any]]) -> None:
        specs = []
        for obj in items:
            key = self.source.key(obj)
            if key is not None:
                specs.append((key, self._spec(obj)))
        with self._lock:
            self._roster.specs_replaced(specs)
            self._changed()
        self.groups_synced.set()

    def group_seen(self, obj: Mapping[str, Any]) -> None:
        key = self.source.key(obj)
        if key is None:
            return
        spec = self._spec(obj)
        with self._lock:
            self._roster.spec_seen(key, spec)
            self._changed()

    def group_gone(self, obj: Mapping[str, Any]) -> None:
        key = self.source.key(obj)
        if key is None:
            return
        with self._lock:
            self._roster.spec_gone(key)
            self._changed()
        self.cache.release_gang(key)

    def _spec(self, obj: Mapping[str, Any]) -> GangSpec | str:
        try:
            return self.source.parse(obj)
        except GangError as exc:
            return str(exc)

    def member_of(self, pod: Mapping[str, Any]) -> Member | None:
        """A live gang pod as the roster keeps it (None: no gang, finished or deleting)."""
        try:
            key = self.source.member_of(pod)
        except GangError:
            return None  # its own filter answers the error; no gang can be named
        if key is None or is_finished(pod) or section(pod, "metadata").get("deletionTimestamp"):
            return None
        uid, _, name = pod_identity(pod)
        if not uid:
            return None
        problem = None
        request: PodRequest | None = None
        topology = NO_TOPOLOGY
        try:
            topology = self.source.topology(pod)
        except GangError as exc:
            problem = str(exc)
        try:
            parsed = self.parse(pod)
            request = parsed if parsed.wants_devices else None
        except RequestError as exc:
            problem = problem or f"invalid device request: {exc}"
        return Member(
            uid,
            name,
            key,
            intern(pod_node(pod)),
            request,
            topology,
            problem,
        )

    def members_replaced(self, items: Iterable[Mapping[str, Any]]) -> None:
        members = [m for m in map(self._safe_member, items) if m is not None]
        with self._lock:
            gone = self._roster.members_replaced(members, now=self.cache.reservations.now())
            self._changed()
        for key in gone:
            self._void_if_member_left(key)
        self.members_synced.set()

    def _safe_member(self, pod: Mapping[str, Any]) -> Member | None:
        try:
            return self.member_of(pod)
        except Exception:
            log.exception("bug: reading gang pod %s failed; skipped it", pod_identity(pod)[1:])
            return None

    def member_seen(self, pod: Mapping[str, Any]) -> None:
        member = self._safe_member(pod)
        uid = pod_identity(pod)[0]
        with self._lock:
            if member is None:
                key = self._roster.member_gone(uid)
            else:
                key = member.key
                if self._roster.member(uid) == member:
                    return
                self._roster.member_seen(member, now=self.cache.reservations.now())
            self._changed()
        if member is None and key is not None:
            self._void_if_member_left(key, uid)

    def member_gone(self, pod: Mapping[str, Any]) -> None:
        uid = pod_identity(pod)[0]
        with self._lock:
            key = self._roster.member_gone(uid)
            self._changed()
        if key is not None:
            self._void_if_member_left(key, uid)

    def _void_if_member_left(self, key: GangKey, uid: str | None = None) -> None:
        """A member left a reserved gang: the plan no longer stands (it is made again)."""
        reservation = self.cache.reservations.reservation(key)
        if reservation is None:
            return
        if uid is None or uid in reservation.members:
            log.info("gang %s: a reserved member is gone; reservation released", key)
            self.cache.release_gang(key, now=-1e18)  # no retry delay: the gang changed

    def node_labels(self, name: str, labels: Any) -> None:
        """A Node's labels (None: the Node is gone), kept for topology domains."""
        with self._lock:
            if labels is None or not isinstance(labels, Mapping):
                self._labels.pop(name, None)
            else:
                kept = {
                    intern(k): intern(v)
                    for k, v in sorted(labels.items())[:MAX_NODE_LABELS]
                    if isinstance(k, str) and isinstance(v, str) and len(k) <= 317 and len(v) <= 63
                }
                if self._labels.get(name) == kept:
                    return
                self._labels[name] = kept
            self._changed()

    def label_of(self, node: str, key: str) -> str | None:
        labels = self._labels.get(node)
        return None if labels is None else labels.get(key)

    # --- filter -------------------------------------------------------------------------------

    def filter(
        self, pod: Mapping[str, Any], request: PodRequest, names: Collection[str]
    ) -> GangAnswer | None:
        """The answer for a gang member (None: the pod is in no gang)."""
        try:
            key = self.source.member_of(pod)
        except GangError as exc:
            return GangAnswer(None, str(exc))
        if key is None:
            return None
        node = self.cache.reservations.reserved_node(request.uid)
        if node is not None:
            if node in names:
                return GangAnswer(node, "")
            return GangAnswer(
                None,
                f"gang {key}: node {node}, reserved for this member, is not among the nodes "
                "kube-scheduler offers it",
            )
        member = self._safe_member(pod)
        with self._lock:
            if member is not None and self._roster.member(member.uid) != member:
                self._roster.member_seen(member, now=self.cache.reservations.now())
                self._changed()
            offered = frozenset(names)
            if self._candidates.get(key) != offered:
                self._candidates[key] = offered
                self._changed()
        reason = self._try(key, exclude=request.uid, names=offered)
        if not self._synced():
            with self._lock:
                if len(self._early) < MAX_EARLY:
                    self._early[request.uid] = (key.namespace, request.name, request.uid, "")
        node = self.cache.reservations.reserved_node(request.uid)
        if node is not None and node in names:
            return GangAnswer(node, "")
        return GangAnswer(None, reason)

    # --- planning -----------------------------------------------------------------------------

    def _try(self, key: GangKey, exclude: str = "", names: frozenset[str] | None = None) -> str:
        """Plan and reserve the gang if it is complete and anything changed since its last
        try; the reason its members wait (or "" once reserved). Every member but `exclude`
        (the one being filtered) is nudged."""
        if not self._synced():
            return f"gang {key}: waiting for the scheduler to list gangs and their pods"
        with self._lock:
            readiness = self._roster.readiness(key)
            stamp = (self.cache.generation, self.cache.problems.closings, self._version, names)
            if isinstance(readiness, Waiting):
                self._reasons[key] = readiness.reason
                return readiness.reason
            if not readiness.pending:
                return ""  # every member that asks for devices is bound
            if self.cache.reservations.reservation(key) is not None:
                return f"gang {key}: reserved, waiting for its members to bind"
            if self._tried.get(key) == stamp and key in self._reasons:
                return self._reasons[key]
            if not self.cache.reservations.may_plan(key):
                return self._reasons.get(key) or f"gang {key}: released, retrying soon"
            result = self.cache.reservations.reserve(
                self._ask(key, readiness),
                readiness.spec.timeout_seconds,
                names=names,
                label_of=self.label_of,
            )
            if isinstance(result, GangShortfall):
                self._tried[key] = stamp
                self._reasons[key] = result.reason
                return result.reason
            self._tried.pop(key, None)
            self._reasons.pop(key, None)
        log.info(
            "gang %s reserved: %d members on %s%s",
            key,
            len(result.allocations),
            ", ".join(sorted({a.node for a in result.allocations})),
            f" ({result.domain})" if result.domain else "",
        )
        pokes = [
            (a.namespace, a.name, a.pod_uid, a.node)
            for a in result.allocations
            if a.pod_uid != exclude
        ]
        if self.on_reserved is not None and pokes:
            self.on_reserved(pokes)
        return ""

    def _synced(self) -> bool:
        return self.groups_synced.is_set() and self.members_synced.is_set()

    def _ask(self, key: GangKey, readiness: Ready) -> GangAsk:
        return GangAsk(
            key,
            readiness.pending,
            readiness.placed,
            readiness.topology,
            judged(readiness.spec.min_resources, nvidia_gpu=self.nvidia_gpu),
            readiness.bound,
        )

    def preemption(
        self, pod: Mapping[str, Any], request: PodRequest
    ) -> Mapping[str, Mapping[str, PodRequest]] | None:
        """For a gang member kube-scheduler would preempt for: node -> the members the
        whole gang's plan puts there (this one among them), with every lower-priority pod
        outside the gang gone; {} when the gang is not complete or would not fit even then
        (no victims anywhere: a gang preempts for all its members or for none); None when
        the pod is in no gang."""
        try:
            key = self.source.member_of(pod)
        except GangError:
            return {}
        if key is None:
            return None
        with self._lock:
            readiness = self._roster.readiness(key)
            if not isinstance(readiness, Ready):
                return {}
            spare = [m.uid for m in self._roster.members(key)]
        pending = {r.uid: r for r in readiness.pending}
        if request.uid not in pending:
            return {}
        ask = self._ask(key, readiness)
        value = section(pod, "spec").get("priority")
        priority = value if isinstance(value, int) and not isinstance(value, bool) else 0
        plan = self.cache.gang_preemption_plan(ask, priority, spare, label_of=self.label_of)
        if plan is None:
            return {}
        mine = next(a.node for a in plan.allocations if a.pod_uid == request.uid)
        return {mine: {a.pod_uid: pending[a.pod_uid] for a in plan.allocations if a.node == mine}}

    def tick(self) -> None:
        """Release reservations past their timeout; plan complete, unreserved gangs."""
        for key in self.cache.reservations.expired():
            freed = self.cache.release_gang(key)
            log.info(
                "gang %s: reservation timed out with %d members not bound; released",
                key,
                len(freed),
            )
        with self._lock:
            keys = self._roster.keys()
            early = list(self._early.values()) if self._synced() else []
            if early:
                self._early.clear()
        if early and self.on_reserved is not None:
            log.info("gangs listed: %d members refused before are asked about again", len(early))
            self.on_reserved(early)
        for key in keys:
            try:
                self._try(key)
            except Exception:
                log.exception("bug: planning gang %s failed", key)

    def past_timeout(self) -> int:
        """Gangs with a member that has waited unbound longer than the gang's timeout: its
        PodGroup's scheduleTimeoutSeconds (or the default, where the PodGroup does not say,
        is missing or does not parse). A member waits from the first time this scheduler
        saw it pending (its creation, for a scheduler running then) until it is bound or
        gone; reserved members not bound yet still wait."""
        with self._lock:
            late = self._roster.past_timeout(
                self.cache.reservations.now(), self.source.default_timeout
            )
        return len(late)

    def reason(self, key: GangKey) -> str | None:
        with self._lock:
            return self._reasons.get(key)

    def waiting(self) -> tuple[list[dict[str, Any]], int]:
        """Every gang with a member not bound yet, for "Why pending" (views/gang_report.py)."""
        with self._lock:
            return gang_report.waiting(self._roster, self._reasons, self.cache.reservations)

    def key_of(self, uid: str) -> GangKey | None:
        """The gang a pod belongs to, as the watch or a filter showed it."""
        with self._lock:
            return self._roster.key_of(uid)

    def summary(self) -> dict[str, Any]:
        """Every gang with its members and reservation, for the debug API."""
        with self._lock:
            return gang_report.summary(self._roster, self._reasons, self.cache.reservations)
