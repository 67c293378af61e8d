"""The scheduler's state: one owner, one lock, a part per concern.

`Cache` holds the cluster state (every node's free devices and every pod's allocation) and
the decider, and composes the parts that keep the rest, each with its own fields:

- `nodes` (nodes.py): NodeDevices inventories and Node objects, which decide the nodes
  whose devices the cluster state holds;
- `leases` (leases.py): the node agents' heartbeat Leases and the usage readings they carry;
- `problems` (problems.py): why nodes take no new tessera pods: their inventory, the
  allocation records that do not count and the nodes they fence, their heartbeat;
- `pods` (pods.py): the pod ledger: priorities, binds in flight, assumed allocations;
- `reservations` (reservations.py): the gangs' reservations.

The watches tell the parts what they saw (`cache.nodes.upsert`, `cache.leases.seen`,
`cache.pods.observed`, ...), a bind goes through `cache.pods.assume` -> `bind` (or
`forget`), and readers get immutable values (`assess`, `preemption_view`, `snapshot`,
`stats`, `node_summary`, ...); what spans several parts is here.

The lock rule: there is one lock, the Cache's (reentrant), handed to every part as it is
built. Every public method of a part or of the Cache takes it for a short, CPU-only section
(a part may call another's: the lock is reentrant); no API call is ever made while holding
it, and listeners called under it only take note.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from scheduler_plugin.state import summaries
from scheduler_plugin.state.heartbeats import HeartbeatTracker
from scheduler_plugin.state.leases import Leases
from scheduler_plugin.state.nodes import Nodes
from scheduler_plugin.state.part import Shared
from scheduler_plugin.state.pods import Pods
from scheduler_plugin.state.problems import Problems
from scheduler_plugin.state.reservations import Reservations
from scheduler_plugin.state.usage import with_usage
from scheduler_plugin.state.values import (
    Assessment,
    GpuUsage,
    PreemptionView,
    Snapshot,
    StateReading,
    Stats,
)
from tessera.allocation import PodAllocation
from tessera.cluster_decision import Decider, RowVerdicts
from tessera.cluster_state import ClusterState
from tessera.gang.plan import GangAsk, GangPlan, LabelOf, plan_gang
from tessera.gang.spec import GangKey
from tessera.policy_registry import make_policies
from tessera.request import PodRequest
from tessera.resources import DEFAULT_HEARTBEAT_NAMESPACE
from tessera.scoring_policy import Policy
from tessera.stranded import StrandedGrant, stranded

_T = TypeVar("_T")

DEFAULT_HEARTBEAT_GRACE = 5.0

NodeListener = Callable[[str], None]


@dataclass(slots=True)
class _AssessMemo:
    """One assessment, kept for the same pod's next question (prioritize after filter)."""

    key: object
    generation: int
    names: Sequence[str]
    """The names asked about (not copied: callers do not change a request's names)."""
    judgement: RowVerdicts
    _asked: frozenset[str] | None = None

    def covers(self, names: Sequence[str]) -> bool:
        """Whether every one of `names` was asked about. The set is made on the first
        question only: most filters are never followed by one (the best-node answer names
        one node, so kube-scheduler skips prioritize), and making it costs ~30 µs at 500
        names."""
        if self._asked is None:
            self._asked = frozenset(self.names)
        return self._asked.issuperset(names)


class Cache:
    """The scheduler's state behind one lock (see the module doc). Thread-safe."""

    __slots__ = (
        "_assess_memo",
        "_cluster",
        "_decider",
        "_generation",
        "_listeners",
        "_lock",
        "leases",
        "nodes",
        "pods",
        "problems",
        "reservations",
    )

    def __init__(
        self,
        policy: str,
        *,
        heartbeat_namespace: str = DEFAULT_HEARTBEAT_NAMESPACE,
        heartbeat_grace: float = DEFAULT_HEARTBEAT_GRACE,
        require_heartbeat: bool = True,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        policies = make_policies()
        if policy not in policies:
            raise ValueError(f"unknown policy {policy!r} (have {sorted(policies)})")
        lock = self._lock = threading.RLock()
        cluster = self._cluster = ClusterState()
        self._decider = Decider(cluster, policies, policy)
        shared = Shared(lock, cluster, self._decider, clock, monotonic, self._recheck, self._notify)
        self.nodes = Nodes(shared)
        self.leases = Leases(shared, HeartbeatTracker(heartbeat_namespace, heartbeat_grace))
        self.problems = Problems(
            shared, self.nodes, self.leases, require_heartbeat=require_heartbeat
        )
        self.reservations = Reservations(shared, self.problems)
        self.pods = Pods(shared, self.problems, self.reservations)
        self._generation = 0
        """Grows on every change to any node's devices or pods (the assessment memo's key)."""
        self._assess_memo: _AssessMemo | None = None
        """The last assessment: prioritize usually asks what filter just asked."""
        self._listeners: list[NodeListener] = []
        cluster.subscribe(self._bump)

    # --- listeners ------------------------------------------------------------------------

    def subscribe(self, listener: NodeListener) -> None:
        """Call `listener(node)` after any change to a node's devices, pods or usability
        (inside the lock: listeners must only take note, e.g. mark the node dirty)."""
        with self._lock:
            self._listeners.append(listener)

    def _notify(self, node: str) -> None:
        for listener in self._listeners:
            listener(node)

    def _bump(self, node: str) -> None:
        self._generation += 1
        self._notify(node)

    def _recheck(self, node: str, now: float | None = None) -> None:
        """A part changed what `node`'s usability rests on."""
        self.problems.recheck(node, now)

    @property
    def generation(self) -> int:
        """Grows on every change to any node's devices or pods."""
        return self._generation

    # --- decisions ------------------------------------------------------------------------

    def assess(self, request: PodRequest, names: Sequence[str]) -> Assessment:
        """Fit and score of `request` on each of `names`, with the unusable nodes; while
        nothing changed, the same pod asked about the same nodes (or fewer) gets the same
        evaluation back (prioritize follows filter)."""
        with self._lock:
            key = (request.uid, request.shape())
            memo = self._assess_memo
            if (
                memo is not None
                and memo.key == key
                and memo.generation == self._generation
                and memo.covers(names)
            ):
                judgement = memo.judgement
            else:
                judgement = self._decider.judge(request, names)
                self._assess_memo = _AssessMemo(key, self._generation, names, judgement)
            return Assessment(judgement, self.problems.by_node())

    def catch_up(self, request: PodRequest) -> int:
        """Judge the nodes that changed since `request`'s shape was last judged on them
        (Decider.catch_up), so that the next filter of the shape need not; the rows judged."""
        with self._lock:
            return self._decider.catch_up(request)

    def policy_for(self, request: PodRequest) -> Policy:
        return self._decider.policy_for(request)

    def preemption_view(
        self, node: str, request: PodRequest, victims: Iterable[str]
    ) -> PreemptionView | None:
        """`node` as preempt needs it; None when its devices are unknown or it is unusable."""
        with self._lock:
            state = self._cluster.nodes.get(node)
            if state is None or self.problems.of(node) is not None:
                return None
            return PreemptionView(
                inventory=state.inventory,
                held=MappingProxyType({a.pod_uid: a for a in self._cluster.pods_on(node)}),
                priorities=MappingProxyType({uid: self.pods.priority(uid) for uid in victims}),
                policy=self.policy_for(request),
            )

    def gang_preemption_plan(
        self, ask: GangAsk, priority: int, spare: Collection[str], *, label_of: LabelOf
    ) -> GangPlan | None:
        """The plan of `ask` on the usable nodes with every pod of lower `priority` gone
        (but those in `spare`: the gang's own members, reservations, binds in flight), or
        None when the gang would not fit even then, or its minResources would not be free
        even then. Changes nothing."""
        with self._lock:
            nodes = self.pods.without_lower(priority, spare, self.problems.by_node())
            if self.reservations.min_resources_gap(ask, nodes) is not None:
                return None
            result = plan_gang(ask, nodes, label_of=label_of, policy_for=self._decider.policy_for)
            return result if isinstance(result, GangPlan) else None

    def release_gang(self, key: GangKey, now: float | None = None) -> list[PodAllocation]:
        """End a gang's reservation: its members' held devices are free again."""
        with self._lock:
            freed = self.reservations.release(key, now)
            for alloc in freed:
                if self._cluster.allocation(alloc.pod_uid) == alloc:
                    self.pods.release(alloc.pod_uid)
            return freed

    # --- readers ----------------------------------------------------------------------------

    def node_names(self) -> list[str]:
        """Every node the state can say something about (accounted or unusable)."""
        with self._lock:
            return sorted(set(self._cluster.nodes) | self.nodes.invalid())

    def snapshot(self) -> Snapshot:
        """Everything, as of now (O(nodes + pods): tests and debugging, not hot paths)."""
        with self._lock:
            gpus, nics = summaries.usage(self._cluster)
            cluster = self._cluster
            return Snapshot(
                nodes=frozenset(cluster.nodes),
                gpus=gpus,
                nics=nics,
                allocations=MappingProxyType(dict(cluster.pods)),
                pending=MappingProxyType(dict(cluster.pending)),
                assumed=frozenset(cluster.assumed),
                inflight=self.pods.in_flight(),
                fences=self.problems.fences(),
                problems=self.problems.by_node(),
                invalid_records=self.problems.invalid_records(),
                accounts=cluster.snapshot(),
            )

    def stats(self) -> Stats:
        with self._lock:
            cluster = self._cluster
            assumed = len(cluster.assumed)
            return Stats(
                unusable=self.problems.count(),
                invalid_records=self.problems.invalid_count(),
                fenced_untrusted=len(self.problems.fenced_by_records()),
                fenced_inventory=len(self.nodes.invalid()),
                assumed=assumed,
                confirmed=len(cluster.pods) - assumed,
                pending_node=len(cluster.pending),
                pods_known=self.pods.known(),
            )

    def gpu_usage(self, names: Iterable[str]) -> tuple[GpuUsage, ...]:
        """Every GPU of the nodes `names` (those the state holds), in that order: /metrics
        reads 40,000 GPUs a few hundred nodes at a time, never all under the lock at once."""
        with self._lock:
            nodes = self._cluster.nodes
            return tuple(
                usage
                for name in names
                if (node := nodes.get(name)) is not None
                for usage in summaries.gpu_usage(name, node)
            )

    def reading(self, read: Callable[[StateReading], _T]) -> _T:
        """`read(reading)` under the state's lock: one moment for every node it looks at.
        For the allocation page's overview and search (a few ms at 5,000 nodes)."""
        with self._lock:
            return read(
                StateReading(
                    self._cluster,
                    self._decider,
                    self.problems.by_node(),
                    self.problems.fenced(),
                    frozenset(self._cluster.assumed),
                )
            )

    def pods_summary(self) -> dict[str, Any]:
        """Invalid records, assumed and in-flight binds, pods waiting for their node (the
        debug API; a fresh value the caller owns)."""
        with self._lock:
            cluster = self._cluster
            return {
                "invalidRecords": [
                    {"pod": key, "uid": uid, "problem": problem}
                    for key, (uid, problem) in sorted(self.problems.invalid_records().items())
                ],
                "assumed": sorted(cluster.assumed),
                "inflight": sorted(self.pods.in_flight()),
                "waitingForNode": sorted(
                    f"{a.namespace}/{a.name} -> {a.node}" for a in cluster.pending.values()
                ),
                "allocated": len(cluster.pods),
            }

    def node_view(self, name: str) -> dict[str, Any] | None:
        """`node_summary` with what the node agent reads its containers use set beside
        their grants (usage.with_usage): the debug API and page. Not the NodeDevices
        status, which would be rewritten on every reading. The annotation is decoded
        outside the lock, at most once per text."""
        with self._lock:  # one moment for both
            summary = self.node_summary(name)
            reading = self.leases.reading(name)
        if summary is None:
            return None
        decoded = reading.decoded()
        self.leases.note(name, decoded)
        return with_usage(summary, decoded)

    def node_summary(self, name: str) -> dict[str, Any] | None:
        """Each device's total/free/used and who holds what (debug API and CR status; a
        fresh value the caller owns)."""
        with self._lock:
            return summaries.node_summary(
                self._cluster,
                name,
                problem=self.problems.of(name),
                fenced=self.problems.fencing(name),
                invalid=self.nodes.error(name) is not None,
            )

    def stranded_on(self, name: str) -> list[StrandedGrant]:
        """The grants of the node's pods on a device its inventory marks unhealthy or no
        longer lists (tessera.stranded)."""
        with self._lock:
            node = self._cluster.nodes.get(name)
            if node is None:
                return []
            return stranded(node.inventory, self._cluster.pods_on(name))
