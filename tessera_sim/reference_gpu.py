"""The paper's two GPU-count heuristics, GpuPacking and GpuClustering, as tessera policies.

Both are integer kube-scheduler scores (0..100, here divided by 100) computed from a
node's GPUs alone; CPU-only pods score 0 everywhere (so they go to the first feasible
node of the replay's tie order). Shares go to the fitting GPU with the least free (best
fit), whole GPUs to the lowest-indexed free ones, as for BestFit.

- GpuPacking prefers, in this order: GPUs already in use that the pod fits on (100 minus
  a tenth of the free percent left on the GPU it takes, at least 50), then nodes already
  in use where the pod needs fully free GPUs (50 minus the number it takes, at least 33),
  then untouched nodes (33 minus their GPU count, at least that count).
- GpuClustering keeps pods of one kind together. A pod's kind is "share" or "k-gpu" (k
  whole GPUs); a node scores 25 * (8 GPUs - its free GPU) / 8 GPUs (integer arithmetic,
  in thousandths of a GPU) plus 75 when every GPU pod on it is of the pod's kind, 50 when
  some are, 25 when it holds no GPU pod, and nothing else. The kinds on each node are
  counted from the pods bound so far (`bound`, called by the replay).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from tessera.node_state import GpuCapacity, NodeState
from tessera.request import PodRequest
from tessera.resources import UNITS_PER_DEVICE
from tessera.scoring_policy import (
    FloatArray,
    HostCase,
    IntArray,
    ShareCase,
    VectorCase,
    WholeCase,
    gpu_slots,
    idle_core,
)
from tessera_sim.reference import ReferencePolicy

if TYPE_CHECKING:
    from tessera.cluster_index import ClusterIndex

GPUPACKING, GPUCLUSTERING = "gpupacking", "gpuclustering"
_MILLI_PER_UNIT = 1000 // UNITS_PER_DEVICE
_MAX_GPU_MILLI = 8000
_NO_KIND = ""


def pod_kind(request: PodRequest) -> str:
    """The paper's GPU affinity tag of a pod: "share", "k-gpu", or "" (no GPU)."""
    running = [c for c in request.containers if c.wants_gpu and (not c.init or c.sidecar)]
    if not running:
        return _NO_KIND
    c = running[0]
    return f"{c.gpu_count}-gpu" if c.gpu_count else "share"


def _case_kind(case: VectorCase) -> str:
    if isinstance(case, WholeCase):
        return f"{case.count}-gpu"
    if isinstance(case, ShareCase):
        return "share"
    return _NO_KIND


def _packing(free: list[int], healthy: list[bool], kind: str, count: int, core: int) -> int:
    """GpuPacking's score of one node (free: percent per GPU) for a pod of `count` whole
    GPUs or one share of `core` percent."""
    if not kind:
        return 0
    gpus = [f for f, h in zip(free, healthy, strict=True) if h]
    fully = sum(1 for f in gpus if f == UNITS_PER_DEVICE)
    if fully == len(gpus):
        return max(100 // 3 - fully, fully)
    if count:
        return max(100 // 2 - count, 100 // 3)
    fitting = [f for f in gpus if f >= core]
    left = min(fitting) if fitting else UNITS_PER_DEVICE
    if left == UNITS_PER_DEVICE:
        return max(100 // 2 - 1, 100 // 3)
    # the plugin's left milli * 100 / 1000 is the percent left; a tenth of it, truncated
    return max(100 - left // 10, 100 // 2)


class GpuPackingPolicy(ReferencePolicy):
    """See the module doc."""

    name = GPUPACKING

    def placement_score(
        self, node: NodeState, request: PodRequest, before: GpuCapacity, after: GpuCapacity
    ) -> float:
        kind = pod_kind(request)
        c = request.containers[0] if kind else None
        count = c.gpu_count if c is not None else 0
        core = c.core if c is not None and not count else 0
        healthy = [g.healthy for g in node.inventory.gpus]
        return _packing(list(before.core), healthy, kind, count, core) / 100

    def node_score(self, node: NodeState, before: GpuCapacity, after: GpuCapacity) -> float:
        return 0.0

    def vector_node_scores(
        self, index: ClusterIndex, rows: IntArray, case: VectorCase
    ) -> FloatArray | None:
        if isinstance(case, HostCase):
            return np.zeros(rows.size)
        fc = index.free_core[rows]
        healthy = gpu_slots(index, rows)
        gpus = healthy.sum(axis=1)
        fully = (healthy & (fc == UNITS_PER_DEVICE)).sum(axis=1)
        untouched = np.maximum(100 // 3 - fully, fully)
        if isinstance(case, WholeCase):
            used = np.full(rows.size, max(100 // 2 - case.count, 100 // 3))
        else:
            assert isinstance(case, ShareCase)
            fits = healthy & (fc >= case.core)
            left = np.where(fits, fc, UNITS_PER_DEVICE).min(axis=1)
            used = np.where(
                left == UNITS_PER_DEVICE,
                max(100 // 2 - 1, 100 // 3),
                np.maximum(100 - left // 10, 50),
            )
        out: FloatArray = np.where(fully == gpus, untouched, used) / 100
        return out


class GpuClusteringPolicy(ReferencePolicy):
    """See the module doc."""

    name = GPUCLUSTERING

    def __init__(self) -> None:
        self._kinds: dict[str, Counter[str]] = {}
        self._pending: list[tuple[str, str]] = []
        self._columns: dict[str, int] = {}
        self._counts = np.zeros((0, 0), dtype=np.int64)

    def bound(self, node: str, request: PodRequest) -> None:
        """A pod was bound to `node` (the replay calls this after every placement)."""
        kind = pod_kind(request)
        if kind:
            self._kinds.setdefault(node, Counter())[kind] += 1
            self._pending.append((node, kind))

    def _score_of(self, kinds: Counter[str], kind: str, free_milli: int) -> int:
        if not kind:
            return 0
        base = 100 // 4 * (_MAX_GPU_MILLI - free_milli) // _MAX_GPU_MILLI
        if kinds.get(kind, 0) > 0:
            return base + (75 if len(kinds) == 1 else 50)
        return base + (25 if not kinds else 0)

    def placement_score(
        self, node: NodeState, request: PodRequest, before: GpuCapacity, after: GpuCapacity
    ) -> float:
        free = sum(f for f, g in zip(before.core, node.inventory.gpus, strict=True) if g.healthy)
        kinds = self._kinds.get(node.name, Counter())
        return self._score_of(kinds, pod_kind(request), free * _MILLI_PER_UNIT) / 100

    def node_score(self, node: NodeState, before: GpuCapacity, after: GpuCapacity) -> float:
        return 0.0

    def _sync(self, index: ClusterIndex) -> None:
        """Bring the per-row kind counts up to date with the pods bound since last time."""
        rows = index.capacity_rows
        if self._counts.shape[0] != rows:
            grown = np.zeros((rows, max(self._counts.shape[1], 1)), dtype=np.int64)
            grown[: self._counts.shape[0], : self._counts.shape[1]] = self._counts
            self._counts = grown
        for node, kind in self._pending:
            column = self._columns.get(kind)
            if column is None:
                column = self._columns[kind] = len(self._columns)
                if column >= self._counts.shape[1]:
                    self._counts = np.pad(
                        self._counts, ((0, 0), (0, column + 1 - self._counts.shape[1]))
                    )
            row = index.row_of.get(node)
            if row is not None:
                self._counts[row, column] += 1
        self._pending.clear()

    def vector_node_scores(
        self, index: ClusterIndex, rows: IntArray, case: VectorCase
    ) -> FloatArray | None:
        kind = _case_kind(case)
        if not kind:
            return np.zeros(rows.size)
        self._sync(index)
        free = idle_core(index, rows) * _MILLI_PER_UNIT
        base = 100 // 4 * (_MAX_GPU_MILLI - free) // _MAX_GPU_MILLI
        counts = self._counts[rows]
        kinds = (counts > 0).sum(axis=1)
        column = self._columns.get(kind)
        mine = counts[:, column] > 0 if column is not None else np.zeros(rows.size, dtype=np.bool_)
        bonus = np.where(mine, np.where(kinds == 1, 75, 50), np.where(kinds == 0, 25, 0))
        out: FloatArray = (base + bonus) / 100
        return out
