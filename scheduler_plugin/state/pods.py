"""The pod ledger: what the watch shows of every pod, and our own binds.

Pods are accounted by the rebuild rule (watches/recovery.judge, applied by the caller
outside the lock: it verifies signatures), with two guards for binds of our own that the
watch has not caught up with:
- while a bind is in flight, what the watch shows of that pod is ignored (the bind
  settles it);
- an *assumed* allocation (bind done, watch not yet seen the binding) is not dropped
  because an older event or list shows the pod unbound; only a deletion, a finished
  phase, an authoritative read, or `assumption_gone` does.
A bind goes through `assume` -> `bind` (or `forget` when it fails).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from scheduler_plugin.state.part import Part, Shared
from scheduler_plugin.state.problems import Problems
from scheduler_plugin.state.reservations import Reservations
from scheduler_plugin.state.values import (
    AlreadyHeld,
    Assumed,
    Assumption,
    Holds,
    Invalid,
    Nothing,
    PodSeen,
    Refused,
    Verdict,
)
from tessera.allocation import PodAllocation
from tessera.errors import StateError
from tessera.gang.spec import GangKey
from tessera.node_placement import NoFit
from tessera.node_state import NodeState
from tessera.request import PodRequest


class Pods(Part):
    """Pods' priorities, binds in flight and assumed allocations (one part of the state:
    state/cache.py says the lock rule)."""

    __slots__ = ("_bound_at", "_inflight", "_priorities", "_problems", "_reservations")

    def __init__(self, shared: Shared, problems: Problems, reservations: Reservations) -> None:
        super().__init__(shared)
        self._problems = problems
        self._reservations = reservations
        self._priorities: dict[str, int] = {}
        """Every pod's priority by UID (all pods, tessera or not), for preempt: the rest of
        what the watch shows of a pod is not kept (there may be 100,000 pods)."""
        self._inflight: set[str] = set()
        """UIDs whose bind is between `assume` and `bind`/`forget`."""
        self._bound_at: dict[str, float] = {}
        """UID -> when our bind finished, for assumed allocations awaiting the watch."""

    # --- the pod watch ------------------------------------------------------------------------

    def observed(self, pod: PodSeen, verdict: Verdict, *, authoritative: bool = False) -> None:
        """Account one pod as the rebuild rule judged it. `authoritative`: the object was
        just read (not a possibly stale event), so it may drop an assumed allocation."""
        with self._lock:
            uid, key = pod.uid, pod.key
            cluster, problems = self._cluster, self._problems
            self._priorities[uid] = pod.priority
            current = cluster.allocation(uid)
            if uid in self._inflight:
                # The bind settles this pod; only note that the watch has seen it bound.
                if isinstance(verdict, Holds) and verdict.allocation == current:
                    cluster.confirm(uid)
                return
            if isinstance(verdict, Holds):
                alloc = verdict.allocation
                self._bound_at.pop(uid, None)
                if current == alloc:
                    cluster.confirm(uid)
                    problems.trust(key, uid)
                    return
                if current is not None:
                    cluster.remove(uid)
                try:
                    cluster.add(alloc)
                except StateError as exc:
                    problems.conflicts(key, uid, pod.node, alloc, exc)
                else:
                    problems.trust(key, uid)
                if current is not None:
                    problems.retry(current.node, self._inflight)
                return
            if isinstance(verdict, Invalid):
                problems.distrust(key, uid, verdict.node or pod.node, verdict.problem)
            else:
                problems.trust(key, uid)
            if current is None:
                return
            protected = (
                uid in cluster.assumed
                and not authoritative
                and not pod.finished
                and isinstance(verdict, Nothing)
            )
            if not protected:
                self.release(uid)
                self._bound_at.pop(uid, None)

    def deleted(self, uid: str, key: str) -> None:
        """The pod is gone: its devices are free (unless its bind is in flight: the bind
        fails on its own and undoes itself)."""
        with self._lock:
            self._priorities.pop(uid, None)
            self._bound_at.pop(uid, None)
            self._problems.trust(key, uid)  # nothing of its record stays
            if uid not in self._inflight:
                self.release(uid)

    def relisted(self, seen: Collection[str]) -> None:
        """A full list of pods has been observed: every pod not among the `seen` UIDs is
        gone, except binds in flight or assumed (the watch may not show them yet)."""
        with self._lock:
            cluster, inflight = self._cluster, self._inflight
            assumed = cluster.assumed
            gone = [
                uid
                for uid in [*cluster.pods, *cluster.pending]
                if uid not in seen and uid not in inflight and uid not in assumed
            ]
            for uid in gone:
                self.release(uid)
            for uid in [u for u in self._priorities if u not in seen and u not in inflight]:
                del self._priorities[uid]
            self._problems.relisted(seen)

    def release(self, uid: str) -> None:
        """Remove a pod's allocation; a record that conflicted with it may count now."""
        with self._lock:
            alloc = self._cluster.remove(uid)
            if alloc is not None:
                self._problems.retry(alloc.node, self._inflight)

    # --- binds --------------------------------------------------------------------------------

    def assume(self, request: PodRequest, node: str, *, gang: GangKey | None = None) -> Assumption:
        """Choose the pod's devices on `node` and hold them for the bind now starting (the
        one serialized step of a bind: concurrent binds see them taken). The caller
        finishes with `bind` (the Binding exists) or `forget` (it failed). A member of
        `gang` binds only to its reserved node, with the reserved devices."""
        with self._lock:
            uid = request.uid
            if uid in self._inflight:
                return Refused(f"a bind of {request.key} is already running")
            if gang is not None or self._reservations.holds(uid):
                return self._assume_reserved(request, node, gang)
            held = self._cluster.allocation(uid)
            if held is not None:
                return AlreadyHeld(held)
            problem = self._problems.of(node)
            if problem is not None:
                return Refused(problem)
            # the node is chosen: only its devices are wanted, not its score
            placed = self._decider.place(request, node, scored=False)
            if isinstance(placed, NoFit):
                return Refused(placed.reason)
            alloc = placed.allocation
            try:
                self._cluster.add(alloc, assumed=True)
            except StateError as exc:  # cannot happen: place() saw the same state
                return Refused(f"internal conflict: {exc}")
            self._inflight.add(uid)
            return Assumed(alloc)

    def _assume_reserved(self, request: PodRequest, node: str, gang: GangKey | None) -> Assumption:
        uid = request.uid
        reserved = self._reservations.take(uid, node)
        if reserved is None:
            held = self._cluster.allocation(uid)
            if held is not None:
                return AlreadyHeld(held)
            return Refused(
                f"gang {gang}: {request.key} has no reservation (the gang is not placed)"
            )
        if reserved.node != node:
            return Refused(f"gang {gang}: {request.key} is reserved on node {reserved.node}")
        self._inflight.add(uid)
        return Assumed(reserved)

    def bind(self, uid: str) -> None:
        """The bind of an assumed pod is done: the allocation stays assumed until the watch
        shows the pod bound (or `expired_assumptions` names it)."""
        with self._lock:
            self._inflight.discard(uid)
            self._bound_at[uid] = self._monotonic()

    def forget(self, uid: str, alloc: PodAllocation) -> None:
        """The bind of an assumed pod failed: its devices are free again."""
        with self._lock:
            if self._cluster.allocation(uid) == alloc:
                self._cluster.remove(uid)
            self._inflight.discard(uid)

    def expired_assumptions(
        self, ttl: float, now: float | None = None
    ) -> list[tuple[str, str, str]]:
        """(uid, namespace, name) of assumed allocations the watch has not confirmed in
        `ttl` seconds after their bind finished (the caller reads each pod back)."""
        with self._lock:
            if now is None:
                now = self._monotonic()
            result = []
            for uid, finished in list(self._bound_at.items()):
                if uid not in self._cluster.assumed:
                    del self._bound_at[uid]
                    continue
                if now - finished >= ttl:
                    alloc = self._cluster.allocation(uid)
                    if alloc is not None:
                        result.append((uid, alloc.namespace, alloc.name))
            return result

    def assumption_gone(self, uid: str) -> None:
        """A read-back found no such pod (deleted, or another pod took the name): drop the
        assumed allocation unless a new bind of it is in flight."""
        with self._lock:
            if uid not in self._inflight:
                self.release(uid)
                self._bound_at.pop(uid, None)

    # --- readers ------------------------------------------------------------------------------

    def allocation(self, uid: str) -> PodAllocation | None:
        """The devices the pod holds (applied, or waiting for its node), or None."""
        with self._lock:
            return self._cluster.allocation(uid)

    def assumed(self) -> frozenset[str]:
        """UIDs of allocations made by a bind that the pod watch has not confirmed yet."""
        with self._lock:
            return frozenset(self._cluster.assumed)

    def in_flight(self) -> frozenset[str]:
        """UIDs whose bind is between `assume` and `bind`/`forget`."""
        with self._lock:
            return frozenset(self._inflight)

    def bound(self, uids: Iterable[str]) -> set[str]:
        """Of `uids`, the pods that hold devices or that the (bound-pod) watch has shown."""
        with self._lock:
            cluster, priorities = self._cluster, self._priorities
            return {u for u in uids if u in priorities or cluster.allocation(u) is not None}

    def priority(self, uid: str) -> int:
        """The pod's priority (0 for a pod the watch has not shown)."""
        with self._lock:
            return self._priorities.get(uid, 0)

    def known(self) -> int:
        """Pods of any kind the watch has shown."""
        with self._lock:
            return len(self._priorities)

    def without_lower(
        self, priority: int, spare: Collection[str], closed: Collection[str]
    ) -> dict[str, NodeState]:
        """Every node not in `closed` as it would be with every pod of lower `priority`
        gone (but those in `spare`, binds in flight and assumed allocations); nodes with
        nothing to remove are the state's own (not to be changed)."""
        with self._lock:
            spared = set(spare) | self._inflight | set(self._cluster.assumed)
            priorities = self._priorities
            nodes: dict[str, NodeState] = {}
            for name, node in self._cluster.nodes.items():
                if name in closed:
                    continue
                trial = None
                for alloc in self._cluster.pods_on(name):
                    uid = alloc.pod_uid
                    if uid not in spared and priorities.get(uid, 0) < priority:
                        trial = trial or node.copy()
                        trial.release(alloc)
                nodes[name] = trial or node
            return nodes
