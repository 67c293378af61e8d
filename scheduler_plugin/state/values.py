"""The values the scheduler's state (scheduler_plugin/state/cache.py) takes in and hands out.

Everything here is immutable: a reader gets a value it may keep, pass to another thread
or compare, and nothing it does to it reaches the state (mappings are read-only proxies
over copies).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tessera.allocation import PodAllocation
from tessera.cluster_decision import Decider, Evaluation, RowVerdicts
from tessera.cluster_state import ClusterState
from tessera.model import NodeInventory
from tessera.scoring_policy import Policy


@dataclass(frozen=True, slots=True)
class PodSeen:
    """What the state keeps of a pod the watch showed (small: there may be 100k pods)."""

    uid: str
    namespace: str
    name: str
    node: str = ""
    """spec.nodeName ("" while unbound)."""
    priority: int = 0
    finished: bool = False
    """Phase Succeeded or Failed."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Fence:
    """A bound, unfinished pod whose record does not count, and the node it fences."""

    node: str
    pod: str
    """namespace/name"""
    uid: str
    problem: str


# --- the rebuild rule's verdict on a watched pod (scheduler_plugin.watches.recovery) ----


@dataclass(frozen=True, slots=True)
class Holds:
    """The pod holds this allocation."""

    allocation: PodAllocation


@dataclass(frozen=True, slots=True)
class Nothing:
    """The pod holds no tessera devices (and why, for the debug API)."""

    why: str


@dataclass(frozen=True, slots=True)
class Invalid:
    """The pod carries a record that must not count. It is bound and has not finished
    (judge only decodes such records), so its real device use is unknown: its node
    is fenced."""

    problem: str
    node: str = ""
    """The node the pod is bound to (the one to fence)."""


Verdict = Holds | Nothing | Invalid


# --- assume: the in-memory step of a bind ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Assumed:
    """The devices are chosen and held (assumed) for the bind now in flight."""

    allocation: PodAllocation


@dataclass(frozen=True, slots=True)
class AlreadyHeld:
    """The pod already holds devices (e.g. a retried bind whose answer was lost)."""

    allocation: PodAllocation


@dataclass(frozen=True, slots=True)
class Refused:
    """No devices were taken; `reason` goes back to kube-scheduler."""

    reason: str


Assumption = Assumed | AlreadyHeld | Refused


# --- reader values -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Assessment:
    """Filter and prioritize's view: fit and score per node, and the nodes that take no
    new tessera pods with the reason, both as of one moment."""

    judgement: RowVerdicts
    """The fit and score per node, as arrays (`evaluation` gives them as dicts)."""
    problems: Mapping[str, str]

    @property
    def evaluation(self) -> Evaluation:
        return self.judgement.evaluation()


@dataclass(frozen=True, slots=True)
class PreemptionView:
    """One usable node as preempt needs it: its devices, who holds what, the victims'
    priorities (0 for pods the state has not seen) and the pod's placement policy."""

    inventory: NodeInventory
    held: Mapping[str, PodAllocation]
    priorities: Mapping[str, int]
    policy: Policy


@dataclass(frozen=True, slots=True)
class GpuUsage:
    node: str
    index: int
    uuid: str
    model: str
    memory_mib: int
    """The device's memory (its capacity; compute capacity is UNITS_PER_DEVICE)."""
    free_core: int
    free_memory_mib: int


@dataclass(frozen=True, slots=True)
class NicUsage:
    node: str
    ibdev: str
    pci_bus_id: str
    free_share: int
    vfs: int
    free_vfs: int


@dataclass(frozen=True, slots=True)
class Stats:
    """Counts for /metrics (no pod or GPU list: cheap under the lock; per-GPU usage is
    read in batches of nodes, `Cache.gpu_usage`)."""

    unusable: int
    """Nodes that take no new tessera pods, for any reason."""
    invalid_records: int
    fenced_untrusted: int
    """Nodes fenced by a pod with an untrusted record."""
    fenced_inventory: int
    """Nodes whose NodeDevices does not parse or index."""
    assumed: int
    confirmed: int
    pending_node: int
    """Allocations whose node has no inventory (yet)."""
    pods_known: int
    """Pods of any kind the watch has shown."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the state holds, as of one moment (tests, invariants, the debug API)."""

    nodes: frozenset[str]
    """Nodes whose devices are accounted (inventory parsed, Node object exists)."""
    gpus: tuple[GpuUsage, ...]
    nics: tuple[NicUsage, ...]
    allocations: Mapping[str, PodAllocation]
    """Applied allocations by pod UID."""
    pending: Mapping[str, PodAllocation]
    """Allocations whose node has no inventory (yet), by pod UID."""
    assumed: frozenset[str]
    inflight: frozenset[str]
    fences: tuple[Fence, ...]
    problems: Mapping[str, str]
    invalid_records: Mapping[str, tuple[str, str]]
    """Pod key -> (UID, problem) of records that do not count."""
    accounts: tuple[object, ...]
    """Equal to `ClusterState.snapshot()` of a rebuild holding the same capacity and pods."""

    @property
    def record_fenced_nodes(self) -> frozenset[str]:
        """Nodes fenced by a pod with an untrusted record (`fences`)."""
        return frozenset(f.node for f in self.fences)


@dataclass(frozen=True, slots=True)
class StateReading:
    """The live state, for a reader that runs under the state's lock (`Cache.reading`):
    the allocation page's overview, search and explanations. Read only, and only while
    the call lasts: nothing here may be kept or changed."""

    state: ClusterState
    decider: Decider
    problems: Mapping[str, str]
    """Nodes that take no new tessera pods, with the reason."""
    fenced: frozenset[str]
    """Of those, the nodes fenced (an untrusted record on them, or an invalid inventory)."""
    assumed: frozenset[str]
