"""The expected fragment of nodes under a workload, for whole clusters at once.

See the package doc for the measure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tessera.fragmentation.workload import GpuShape, Workload
from tessera.model import models_allow
from tessera.node_state import GpuCapacity, NodeState
from tessera.resources import UNITS_PER_DEVICE
from tessera.scoring_policy import (
    BoolArray,
    FloatArray,
    HostCase,
    IntArray,
    VectorCase,
    WholeCase,
    gpu_slots,
)

if TYPE_CHECKING:
    from tessera.cluster_index import ClusterIndex

_FULL = UNITS_PER_DEVICE
_BIG = np.iinfo(np.int64).max // 4


@dataclass
class _NodeSlots:
    inventory: object
    per_shape: list[list[tuple[int, int]]]
    """Per shape: (slot, GPU memory a GPU of the shape needs there) of the healthy slots
    whose model the shape allows."""
    healthy: list[int]


@dataclass
class _Compiled:
    shapes: list[GpuShape]
    count: IntArray  # [G]
    core: IntArray  # [G]
    ratio: IntArray  # [G]
    units: IntArray  # [G]
    cls_cpu: IntArray  # [T]
    cls_mem: IntArray  # [T]
    cls_weight: FloatArray  # [T]
    cls_shape: IntArray  # [T] index into shapes
    cls_to_shape: FloatArray  # [T, G] the class's weight in its shape's column
    has_units: BoolArray  # [G] memory in units (else a ratio)
    gpu_weight: float
    idle_weight: float
    host_by_shape: list[list[tuple[int, int, float]]]
    allowed: dict[int, BoolArray] = field(default_factory=dict)  # models known -> [G, M]


class FragmentMeasure:
    """The expected fragment of nodes under a workload, for one node or many at once.

    `count_host_classes`: classes without GPUs count all idle GPU as fragment (the paper's
    definition: such a pod cannot use a GPU at all), which adds P_host * idle to F.
    Amounts are in percent of one GPU's compute (100 = one GPU).
    """

    def __init__(self, workload: Workload, count_host_classes: bool = False) -> None:
        self.workload = workload
        self.count_host_classes = count_host_classes
        self._nodes: dict[int, _NodeSlots] = {}
        self._c = self._compile(workload)
        self._row_cache: _RowsCache | None = None
        self._weights_memo: dict[tuple[int | None, int | None], list[float]] = {}
        self._makes: dict[object, tuple[list[list[tuple[int, int]]], list[int]]] = {}

    def _compile(self, workload: Workload) -> _Compiled:
        shapes: list[GpuShape] = []
        index_of: dict[GpuShape, int] = {}
        cpu: list[int] = []
        mem: list[int] = []
        weight: list[float] = []
        shape_of: list[int] = []
        host_weight = 0.0
        for c, w in zip(workload.classes, workload.weights, strict=True):
            if not c.wants_gpu:
                host_weight += w
                continue
            s = c.shape()
            if s not in index_of:
                index_of[s] = len(shapes)
                shapes.append(s)
            cpu.append(c.cpu_milli)
            mem.append(c.memory_mib)
            weight.append(w)
            shape_of.append(index_of[s])
        by_shape: list[list[tuple[int, int, float]]] = [[] for _ in shapes]
        for cp, mm, w, g in zip(cpu, mem, weight, shape_of, strict=True):
            by_shape[g].append((cp, mm, w))
        gpu_weight = float(sum(weight))
        return _Compiled(
            shapes=shapes,
            count=np.asarray([s.count for s in shapes], dtype=np.int64),
            core=np.asarray([s.core for s in shapes], dtype=np.int64),
            ratio=np.asarray([s.memory_ratio for s in shapes], dtype=np.int64),
            units=np.asarray([s.memory_units for s in shapes], dtype=np.int64),
            cls_cpu=np.asarray(cpu, dtype=np.int64),
            cls_mem=np.asarray(mem, dtype=np.int64),
            cls_weight=np.asarray(weight, dtype=np.float64),
            cls_shape=np.asarray(shape_of, dtype=np.int64),
            cls_to_shape=_one_hot(shape_of, weight, len(shapes)),
            has_units=np.asarray([s.memory_units > 0 for s in shapes], dtype=np.bool_),
            gpu_weight=gpu_weight,
            idle_weight=gpu_weight + (host_weight if self.count_host_classes else 0.0),
            host_by_shape=by_shape,
        )

    # --- one node (the exact path) --------------------------------------------------------

    def _slots(self, node: NodeState) -> _NodeSlots:
        inv = node.inventory
        hit = self._nodes.get(id(inv))
        if hit is not None and hit.inventory is inv:
            return hit
        gpus = inv.gpus
        unit = inv.memory_unit_mib
        # nodes of one make (models, health, memory) share their slot lists
        make = (unit, tuple((g.model, g.healthy, g.memory_mib) for g in gpus))
        lists = self._makes.get(make)
        if lists is None:
            healthy = [s for s, g in enumerate(gpus) if g.healthy]
            per_shape = [
                [
                    (s, shape.memory_need(gpus[s].memory_mib, unit))
                    for s in healthy
                    if models_allow(shape.models, gpus[s].model)
                ]
                for shape in self._c.shapes
            ]
            lists = self._makes[make] = (per_shape, healthy)
        entry = _NodeSlots(inv, lists[0], lists[1])
        if len(self._nodes) > 65536:
            self._nodes.clear()
            self._makes.clear()
        self._nodes[id(inv)] = entry
        return entry

    def _shape_weights(self, cpu_free: int | None, mem_free: int | None) -> list[float]:
        """Per shape, the weight of its classes whose host CPU and memory fit (memoized:
        nodes' free host amounts repeat)."""
        key = (cpu_free, mem_free)
        hit = self._weights_memo.get(key)
        if hit is not None:
            return hit
        out: list[float] = []
        for classes in self._c.host_by_shape:
            w = 0.0
            for cpu_t, mem_t, p in classes:
                if (cpu_free is None or cpu_free >= cpu_t) and (
                    mem_free is None or mem_free >= mem_t
                ):
                    w += p
            out.append(w)
        if len(self._weights_memo) > 65536:
            self._weights_memo.clear()
        self._weights_memo[key] = out
        return out

    def fragment(
        self, node: NodeState, free: GpuCapacity, cpu_free: int | None, mem_free: int | None
    ) -> float:
        """Expected fragment of `node` with this free GPU capacity and host CPU / memory."""
        core, mem = free.core, free.mem
        c = self._c
        slots = self._slots(node)
        idle = sum(core[s] for s in slots.healthy)
        result = c.idle_weight * idle
        weights = self._shape_weights(cpu_free, mem_free)
        for shape, w, pairs in zip(c.shapes, weights, slots.per_shape, strict=True):
            if w == 0.0:
                continue
            need_core = shape.core
            count = usable = 0
            for s, need_mem in pairs:
                if core[s] >= need_core and mem[s] >= need_mem:
                    count += 1
                    usable += core[s]
            if count >= shape.count:
                result -= w * usable
        return result

    def delta(
        self,
        node: NodeState,
        before: GpuCapacity,
        after: GpuCapacity,
        cpu_milli: int,
        memory_mib: int,
    ) -> float:
        """How much a placement lowers the node's expected fragment (negative: raises it)."""
        cpu, mem = node.cpu_free, node.mem_free
        fragment_before = self.fragment(node, before, cpu, mem)
        fragment_after = self.fragment(
            node,
            after,
            None if cpu is None else cpu - cpu_milli,
            None if mem is None else mem - memory_mib,
        )
        return fragment_before - fragment_after

    # --- many nodes (the vector path) -----------------------------------------------------

    def _allowed_matrix(self, index: ClusterIndex) -> BoolArray:
        """[G, models+1] whether GPU shape g may use model id m (last column: no GPU)."""
        c = self._c
        known = len(index.models)
        hit = c.allowed.get(known)
        if hit is None:
            hit = np.zeros((len(c.shapes), known + 1), dtype=np.bool_)
            for g, shape in enumerate(c.shapes):
                for m, model in enumerate(index.models):
                    hit[g, m] = models_allow(shape.models, model)
            c.allowed[known] = hit
        return hit

    def _host_weights(self, cpu: IntArray, mem: IntArray) -> FloatArray:
        """[R, G] weight of the classes of each shape whose host request fits."""
        c = self._c
        fits = (cpu[:, None] >= c.cls_cpu[None, :]) & (mem[:, None] >= c.cls_mem[None, :])
        out: FloatArray = fits.astype(np.float64) @ c.cls_to_shape
        return out

    def _mem_ok(self, free_mem: IntArray, tm: IntArray, units: IntArray) -> BoolArray:
        """[R, S, G] whether each slot's free GPU memory holds a GPU of each shape: the
        need is units * unit, or total * ratio // 100; free >= total * ratio // 100
        <=> 100 * free + 100 > total * ratio (integers)."""
        c = self._c
        by_ratio: BoolArray = (_FULL * free_mem + _FULL)[:, :, None] > tm[:, :, None] * c.ratio
        if not c.has_units.any():
            return by_ratio
        by_units = free_mem[:, :, None] >= c.units * units[:, None, None]
        out: BoolArray = np.where(c.has_units, by_units, by_ratio)
        return out

    def _state(self, index: ClusterIndex, rows: IntArray) -> _RowState:
        """What the measure needs of each row's current state (request-independent, so it
        is kept per row while the row's stamp is unchanged: a request shape seen for the
        first time then costs a gather, not a recomputation of every node)."""
        c = self._c
        rc = self._rows_cache(index)
        stale = rows[rc.stamp[rows] != index.stamp[rows]]
        if stale.size:
            sfc = index.free_core[stale]
            model = index.model[stale]
            base = gpu_slots(index, stale)
            allowed = self._allowed_matrix(index)
            elig = base[:, :, None] & allowed.T[np.where(model >= 0, model, -1)]
            ok = (
                elig
                & (sfc[:, :, None] >= c.core)
                & self._mem_ok(index.free_mem[stale], index.total_mem[stale], index.unit_mib[stale])
            )
            cnt = ok.sum(axis=1)
            usable = np.einsum("rs,rsg->rg", sfc, ok, dtype=np.int64)
            idle = (sfc * base).sum(axis=1)
            w = self._host_weights(index.cpu_free[stale], index.mem_free[stale])
            rc.elig[stale] = elig
            rc.ok[stale] = ok
            rc.cnt[stale] = cnt
            rc.usable[stale] = usable
            rc.idle[stale] = idle
            rc.now[stale] = c.idle_weight * idle - (w * (cnt >= c.count) * usable).sum(axis=1)
            rc.stamp[stale] = index.stamp[stale]
        return _RowState(rc, rows)

    def _rows_cache(self, index: ClusterIndex) -> _RowsCache:
        rc = self._row_cache
        shape = (index.capacity_rows, index.slots, len(self._c.shapes))
        if rc is None or rc.index is not index or rc.ok.shape != shape:
            rows, _, g = shape
            rc = self._row_cache = _RowsCache(
                index,
                np.full(rows, -2, dtype=np.int64),
                np.zeros(shape, dtype=np.bool_),
                np.zeros(shape, dtype=np.bool_),
                np.zeros((rows, g), dtype=np.int64),
                np.zeros((rows, g), dtype=np.int64),
                np.zeros(rows, dtype=np.int64),
                np.zeros(rows, dtype=np.float64),
            )
        return rc

    def rows_fragment(self, index: ClusterIndex, rows: IntArray) -> FloatArray:
        """Expected fragment of each row as it is now."""
        self._state(index, rows)
        assert self._row_cache is not None
        result: FloatArray = self._row_cache.now[rows]
        return result

    def vector_deltas(
        self, index: ClusterIndex, rows: IntArray, case: VectorCase
    ) -> tuple[FloatArray, FloatArray]:
        """(delta, idle after) per row for the request; for a share, delta is [R, S] per
        candidate GPU (-inf where it does not fit) and idle after is [R]. NaN marks rows
        the measure cannot settle without knowing which GPUs the core picks."""
        c = self._c
        st = self._state(index, rows)
        rc = st.rc
        cnt, usable, idle = rc.cnt[rows], rc.usable[rows], rc.idle[rows]
        before = rc.now[rows]
        k = c.count
        w2 = self._host_weights(
            index.cpu_free[rows] - case.cpu_milli, index.mem_free[rows] - case.memory_mib
        )
        if isinstance(case, HostCase):
            after = c.idle_weight * idle - (w2 * (cnt >= k) * usable).sum(axis=1)
            return before - after, idle.astype(np.float64)
        if isinstance(case, WholeCase):
            fw = case.free_whole
            tm = index.total_mem[rows]
            model = index.model[rows]
            same = (np.where(fw, tm, -1).max(axis=1) == np.where(fw, tm, _BIG).min(axis=1)) & (
                np.where(fw, model, -1).max(axis=1) == np.where(fw, model, _BIG).min(axis=1)
            )
            first = fw.argmax(axis=1)
            rep = rc.ok[rows, first, :]  # [R, G]: a free GPU's usability
            cnt2 = cnt - case.count * rep
            usable2 = usable - _FULL * case.count * rep
            idle2 = idle - _FULL * case.count
            after = c.idle_weight * idle2 - (w2 * (cnt2 >= k) * usable2).sum(axis=1)
            delta = np.where(same, before - after, np.nan)
            return delta, idle2.astype(np.float64)
        # a share on one GPU: every candidate GPU at once; only that GPU changes
        # A shape g stays usable on the GPU that takes the share (`kept`), or stops being
        # (`lost`: that GPU leaves the shape's count); never the reverse, as free only
        # shrinks. Each case changes the node's held term of g by a per-row amount (lost:
        # also minus the GPU's free compute), so held after is held before plus three
        # [R, S, G] x [R, G] contractions instead of recounting every shape per slot.
        fc = index.free_core[rows]
        ok = rc.ok[rows]
        ok2 = (
            rc.elig[rows]
            & ((fc - case.core)[:, :, None] >= c.core)
            & self._mem_ok(
                index.free_mem[rows] - case.need, index.total_mem[rows], index.unit_mib[rows]
            )
        )
        full = cnt >= k
        held = w2 * full * usable  # [R, G]
        kept_change = w2 * full * (usable - case.core) - held
        lost_weight = w2 * (cnt - 1 >= k)
        lost_change = lost_weight * usable - held
        kept = (ok & ok2).astype(np.float64)
        lost = (ok & ~ok2).astype(np.float64)
        held2 = (
            held.sum(axis=1)[:, None]
            + np.einsum("rsg,rg->rs", kept, kept_change)
            + np.einsum("rsg,rg->rs", lost, lost_change)
            - fc * np.einsum("rsg,rg->rs", lost, lost_weight)
        )
        after = c.idle_weight * (idle[:, None] - case.core) - held2
        delta = np.where(case.fits, before[:, None] - after, -np.inf)
        return delta, (idle - case.core).astype(np.float64)


@dataclass
class _RowsCache:
    """`_state` per index row, valid while `stamp` equals the row's stamp."""

    index: object
    stamp: IntArray
    elig: BoolArray
    ok: BoolArray
    cnt: IntArray
    usable: IntArray
    idle: IntArray
    now: FloatArray
    """The row's expected fragment as it is."""


@dataclass
class _RowState:
    rc: _RowsCache
    rows: IntArray


def _one_hot(column: Sequence[int], weight: Sequence[float], columns: int) -> FloatArray:
    out = np.zeros((len(column), columns), dtype=np.float64)
    for t, (g, w) in enumerate(zip(column, weight, strict=True)):
        out[t, g] = w
    return out
