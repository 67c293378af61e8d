"""Placement policies: which GPUs inside a node, and how good a node is.

A policy answers two questions with plain numbers, so placement stays policy-agnostic:
- `option_score`: among ways to place one container on a node, which is best (higher wins);
- `node_score`: how good the node is after the whole pod is placed, in [0, 1].

Free GPU capacity comes as `GpuCapacity` values (compute and memory per slot): the node's
before a placement, and what placement would leave after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tessera.node_state import GpuCapacity, NodeState
from tessera.request import PodRequest
from tessera.resources import POLICY_BINPACK, POLICY_SPREAD, UNITS_PER_DEVICE

if TYPE_CHECKING:
    from tessera.cluster_index import ClusterIndex

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Option:
    """A way to place one container's GPUs: slots touched and their free amounts after."""

    slots: tuple[int, ...]
    core_after: tuple[int, ...]
    mem_after: tuple[int, ...]
    cpu_milli: int = 0
    """The pod's host CPU request (the node's `cpu_free` is before the pod)."""
    memory_mib: int = 0
    """The pod's host memory request."""
    models: frozenset[str] = frozenset()
    """The GPU models the pod may use (empty: any); a policy that weighs models scores an
    option relative to what the pod would cost on any model it may use."""


@dataclass(frozen=True)
class ShareCase:
    """A one-container share request over index rows (vector path)."""

    core: int
    need: IntArray
    """[rows, slots] memory the share needs on each GPU slot."""
    fits: BoolArray
    """[rows, slots] slots where it fits."""
    cpu_milli: int = 0
    """The pod's host CPU request."""
    memory_mib: int = 0
    """The pod's host memory request."""
    shape: object = None
    """The request's shape (`PodRequest.shape()`): equal shapes fit and score alike, so a
    policy may cache per shape and index row (see `ClusterIndex.stamp`). None: unknown."""
    fit: BoolArray | None = None
    """[rows] whether the request fits each row's host and GPUs, where the caller knows
    (the Decider does); None: unknown."""

    @property
    def core_asked(self) -> int:
        """GPU compute the container asks, in percent of one GPU."""
        return self.core


@dataclass(frozen=True)
class WholeCase:
    """A one-container whole-GPU request over index rows (vector path)."""

    count: int
    free_whole: BoolArray
    """[rows, slots] eligible GPUs that are entirely free."""
    cpu_milli: int = 0
    memory_mib: int = 0
    shape: object = None
    fit: BoolArray | None = None
    """[rows] whether the request fits each row's host and GPUs, where the caller knows
    (the Decider does); None: unknown."""

    @property
    def core_asked(self) -> int:
        """GPU compute the container asks, in percent of one GPU: all of each GPU."""
        return UNITS_PER_DEVICE * self.count


@dataclass(frozen=True)
class HostCase:
    """A request for host CPU and memory only, no devices (vector path)."""

    cpu_milli: int = 0
    memory_mib: int = 0
    shape: object = None
    fit: BoolArray | None = None
    """[rows] whether the request fits each row's host and GPUs, where the caller knows
    (the Decider does); None: unknown."""

    core_asked = 0
    """No GPU compute."""


VectorCase = ShareCase | WholeCase | HostCase


class Policy:
    """Base policy; subclasses override the two scores."""

    name = "base"
    pack_nics = True
    """Whether NICs are packed (least free remaining first) or spread."""
    generation = 0
    """Changes whenever the policy's scores for an unchanged node may change (a policy that
    learns its workload moved on); score caches include it in their key."""
    option_score_draws = False
    """Whether `option_score` draws from a random stream, so `place_pod` must ask it even
    when only one GPU option exists (for every other policy a lone option needs no score)."""

    def option_score(self, node: NodeState, free: GpuCapacity, option: Option) -> float:
        """How good `option` is on `node`, whose GPUs have `free` left so far."""
        raise NotImplementedError

    def node_score(self, node: NodeState, before: GpuCapacity, after: GpuCapacity) -> float:
        raise NotImplementedError

    def whole_set_score(self, node: NodeState, free: GpuCapacity, slots: Sequence[int]) -> float:
        """Among whole-GPU sets with equal interconnect rank, which is best (higher wins)."""
        return 0.0

    def placement_score(
        self, node: NodeState, request: PodRequest, before: GpuCapacity, after: GpuCapacity
    ) -> float:
        """The node score of a whole pod placement, in [0, 1]; `place_pod` calls this.

        The default is `node_score`; a policy that also weighs the pod's host CPU and
        memory (`request.cpu_milli`, `request.memory_mib` against `node.cpu_free`) overrides it.
        """
        return self.node_score(node, before, after)

    def observe(self, request: PodRequest) -> None:
        """A pod asked to be placed (called once per decision, before scoring). Policies that
        learn the workload online use it; the default ignores it."""

    def vector_node_scores(
        self, index: ClusterIndex, rows: IntArray, case: VectorCase
    ) -> FloatArray | None:
        """Node scores for every row at once, equal to what `place_pod` would score on the
        rows where the request fits (other rows: any value). None: no vector form; NaN on a
        fitting row: score that row with `place_pod`."""
        return None


def _utilization_after(index: ClusterIndex, rows: IntArray, case: VectorCase) -> FloatArray:
    """Each node's utilization once the request is placed the way `_chosen_slots` says."""
    n = index.gpu_count[rows]
    cap = np.maximum(UNITS_PER_DEVICE * n, 1)
    sum_mem = np.maximum(index.sum_mem[rows], 1)
    added_mem: int | IntArray
    if isinstance(case, HostCase):
        added_mem = 0
    elif isinstance(case, WholeCase):
        # Whole GPUs take all their memory; within a node GPUs are (nearly always) alike, so
        # the k GPUs' memory is k times the smallest free-whole GPU's.
        totals = np.where(case.free_whole, index.total_mem[rows], np.iinfo(np.int64).max)
        added_mem = totals.min(axis=1) * case.count
    else:
        chosen = _chosen_share_slot(index, rows, case, pack=True)
        added_mem = np.take_along_axis(case.need, chosen[:, None], axis=1)[:, 0]
    core_used = (index.used_core[rows] + case.core_asked) / cap
    mem_used = (index.used_mem[rows] + added_mem) / sum_mem
    result: FloatArray = (core_used + mem_used) / 2
    return result


def _chosen_share_slot(
    index: ClusterIndex, rows: IntArray, case: ShareCase, pack: bool
) -> IntArray:
    """The slot `place_pod` picks: least (pack) or most remaining free, lowest slot on ties."""
    total = np.where(case.fits, index.total_mem[rows], 1)
    remaining = (
        (index.free_core[rows] - case.core) / UNITS_PER_DEVICE
        + (index.free_mem[rows] - case.need) / total
    ) / 2
    if pack:
        chosen: IntArray = np.where(case.fits, remaining, np.inf).argmin(axis=1)
    else:
        chosen = np.where(case.fits, remaining, -np.inf).argmax(axis=1)
    return chosen


def utilization(node: NodeState, free: GpuCapacity) -> float:
    """Share of a node's GPU capacity in use, compute and memory averaged, in [0, 1]."""
    if not node.total_mem:
        return 0.0
    n = len(free.core)
    core_used = (UNITS_PER_DEVICE * n - sum(free.core)) / (UNITS_PER_DEVICE * n)
    total_mem = sum(node.total_mem)
    mem_used = (total_mem - sum(free.mem)) / total_mem if total_mem else 0.0
    return (core_used + mem_used) / 2


def _remaining(node: NodeState, option: Option) -> float:
    """Free fraction left on the touched GPUs after the option, averaged."""
    total = 0.0
    for slot, core, mem in zip(option.slots, option.core_after, option.mem_after, strict=True):
        total += core / UNITS_PER_DEVICE + mem / node.total_mem[slot]
    return total / (2 * len(option.slots)) if option.slots else 0.0


def _busy_neighbours(node: NodeState, core: Sequence[int], slots: Sequence[int]) -> int:
    """How many GPUs already in use share a PCIe switch or NUMA node with the chosen ones."""
    tiers = node.tiers
    chosen = set(slots)
    busy = [s for s in range(len(core)) if s not in chosen and core[s] < UNITS_PER_DEVICE]
    return sum(1 for s in slots for b in busy if tiers.tier[s][b] <= 3)


class BinpackPolicy(Policy):
    """Fill the fullest nodes and the fullest GPUs first (best fit)."""

    name = POLICY_BINPACK
    pack_nics = True

    def option_score(self, node: NodeState, free: GpuCapacity, option: Option) -> float:
        return -_remaining(node, option)

    def node_score(self, node: NodeState, before: GpuCapacity, after: GpuCapacity) -> float:
        return utilization(node, after)

    def whole_set_score(self, node: NodeState, free: GpuCapacity, slots: Sequence[int]) -> float:
        return float(_busy_neighbours(node, free.core, slots))

    def vector_node_scores(
        self, index: ClusterIndex, rows: IntArray, case: VectorCase
    ) -> FloatArray | None:
        return _utilization_after(index, rows, case)


class SpreadPolicy(Policy):
    """Use the emptiest nodes and GPUs first, for isolation from noisy neighbours."""

    name = POLICY_SPREAD
    pack_nics = False

    def option_score(self, node: NodeState, free: GpuCapacity, option: Option) -> float:
        return _remaining(node, option)

    def node_score(self, node: NodeState, before: GpuCapacity, after: GpuCapacity) -> float:
        return 1.0 - utilization(node, after)

    def whole_set_score(self, node: NodeState, free: GpuCapacity, slots: Sequence[int]) -> float:
        return -float(_busy_neighbours(node, free.core, slots))

    def vector_node_scores(
        self, index: ClusterIndex, rows: IntArray, case: VectorCase
    ) -> FloatArray | None:
        if isinstance(case, ShareCase):
            # Spread picks the roomiest GPU, which changes which memory amount is added.
            chosen = _chosen_share_slot(index, rows, case, pack=False)
            n = index.gpu_count[rows]
            cap = np.maximum(UNITS_PER_DEVICE * n, 1)
            added_mem = np.take_along_axis(case.need, chosen[:, None], axis=1)[:, 0]
            util = (
                (index.used_core[rows] + case.core) / cap
                + (index.used_mem[rows] + added_mem) / np.maximum(index.sum_mem[rows], 1)
            ) / 2
            return 1.0 - util
        return 1.0 - _utilization_after(index, rows, case)


def gpu_slots(index: ClusterIndex, rows: IntArray) -> BoolArray:
    """[rows, slots] the slots of each row that hold a healthy GPU (a row's slots past its
    GPUs have no model)."""
    out: BoolArray = index.healthy[rows] & (index.model[rows] >= 0)
    return out


def idle_core(index: ClusterIndex, rows: IntArray) -> IntArray:
    """Each row's free GPU compute on its healthy GPUs (percent of one GPU)."""
    out: IntArray = (index.free_core[rows] * gpu_slots(index, rows)).sum(axis=1)
    return out


def case_positions(rows: IntArray, sub: IntArray) -> IntArray:
    """Positions in `rows` of the rows `sub` (a subset of `rows`)."""
    if sub is rows:
        return np.arange(rows.size)
    return np.searchsorted(rows, sub) if _sorted(rows) else _positions(rows, sub)


def restrict_case(case: VectorCase, rows: IntArray, sub: IntArray) -> VectorCase:
    """The case restricted to the rows `sub` (a subset of `rows`)."""
    if sub is rows or isinstance(case, HostCase):
        return case
    return case_at(case, case_positions(rows, sub))


def case_at(case: VectorCase, pos: IntArray) -> VectorCase:
    """The case restricted to the rows at positions `pos` of its rows."""
    if isinstance(case, HostCase):
        return case
    if isinstance(case, WholeCase):
        return WholeCase(
            case.count, case.free_whole[pos], case.cpu_milli, case.memory_mib, case.shape
        )
    return ShareCase(
        case.core, case.need[pos], case.fits[pos], case.cpu_milli, case.memory_mib, case.shape
    )


def _sorted(rows: IntArray) -> bool:
    return bool(rows.size < 2 or np.all(rows[1:] > rows[:-1]))


def _positions(rows: IntArray, sub: IntArray) -> IntArray:
    where = {int(r): i for i, r in enumerate(rows.tolist())}
    return np.asarray([where[int(r)] for r in sub.tolist()], dtype=np.int64)
