"""FragmentationPolicy: tessera's default placement policy (see the package doc)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tessera.cluster_index import UNTRACKED, name_order
from tessera.fragmentation.measure import FragmentMeasure
from tessera.fragmentation.packing import NO_VALUES, PackingValues, packing_values
from tessera.fragmentation.shape_cache import ShapeCache
from tessera.fragmentation.workload import OnlineWorkload, Workload
from tessera.model import models_allow
from tessera.node_state import GpuCapacity, NodeState
from tessera.request import PodRequest
from tessera.resources import POLICY_FRAGMENTATION, UNITS_PER_DEVICE
from tessera.rowbits import row_any, row_count
from tessera.scoring_policy import (
    BoolArray,
    FloatArray,
    HostCase,
    IntArray,
    Option,
    Policy,
    ShareCase,
    VectorCase,
    WholeCase,
    case_at,
    case_positions,
    gpu_slots,
)

if TYPE_CHECKING:
    from tessera.cluster_index import ClusterIndex

_FULL = UNITS_PER_DEVICE
_MAX_GPUS = 8.0
"""GPUs of a large node: `pack_by="free"` counts free GPUs in these units."""


def squash(x: FloatArray | float, scale: float) -> FloatArray:
    """Map any real number into [0, 1], monotonically, keeping resolution over a wide range
    (-inf -> 0, +inf -> 1, NaN stays NaN)."""
    v = np.asarray(x, dtype=np.float64)
    if not np.isinf(v).any():  # NaN passes through the arithmetic quietly
        direct: FloatArray = 0.5 + 0.5 * v / (np.abs(v) + scale)
        return direct
    with np.errstate(invalid="ignore"):
        out: FloatArray = np.where(np.isinf(v), (v > 0) * 1.0, 0.5 + 0.5 * v / (np.abs(v) + scale))
    return out


class FragmentationPolicy(Policy):
    """Place where the expected fragment grows least, keep host CPU and memory in step
    with the GPUs, and fill equally good nodes in a fixed order.

    The raw score of a placement, in GPUs, is

        dF + balance * dS + pack * used_after - packing * dP

    dP: for a share, the packing value it gives up on the GPU it takes (`PackingValues.loss`
    under the learned mix of share sizes: 0 when the placement can be part of an optimal
    packing of the mix); `packing` (10) makes it come first, before what the other terms can
    tell apart. dF: how much the node's expected fragment drops (`FragmentMeasure`, under
    the workload learned so far); dS: how much the node's GPU stranded by host CPU or memory
    drops, where the GPU a node can still feed is its free CPU (memory) over the CPU
    (memory) the workload asks per GPU; used_after: the node's share of GPU in use after the
    pod (per GPU the scarcer of compute and memory; `pack_by="free"`: minus its free GPUs /
    8). The raw score is coarsened to steps of `quantum` GPUs, and `order` times a fixed
    per-node number in [0, 1) (a hash of the name) breaks what then ties, so equally good
    placements keep filling the same nodes whatever the scheduler's own tie rule; the node
    score squashes it into (0, 1). Inside a node the same score picks the GPU, and among
    GPUs of equal score the one left with the least free compute.

    Without a fixed `workload`, the policy learns it online (`observe`) with an
    `OnlineWorkload` (given, or one with its defaults); `weighting` ("count": classes weigh
    by popularity as in the paper; "demand": by popularity times GPU demand).
    """

    name = POLICY_FRAGMENTATION
    pack_nics = True

    def __init__(
        self,
        workload: Workload | OnlineWorkload | None = None,
        *,
        pack: float = 0.1,
        balance: float = 1.0,
        weighting: str = "count",
        pack_by: str = "fraction",
        quantum: float = 0.1,
        order: float = 1e-3,
        scarcity: float = 1.0,
        packing: float = 10.0,
    ) -> None:
        if weighting not in ("count", "demand"):
            raise ValueError(f"weighting must be 'count' or 'demand', got {weighting!r}")
        if pack_by not in ("fraction", "free"):
            raise ValueError(f"pack_by must be 'fraction' or 'free', got {pack_by!r}")
        self.pack_by = pack_by
        self.quantum = quantum
        self.order = order
        self._order_of: dict[str, float] = {}
        self.pack = pack
        self.balance = balance
        self.scarcity = scarcity
        self.packing = packing
        self.values: PackingValues = NO_VALUES
        """What shares and free GPU room are worth under the learned workload (`packing`)."""
        self._prot_key: tuple[object, ...] | None = None
        self._prot: FloatArray | None = None
        """Per model id of the last index (and a last 0 for "no GPU"): how likely a GPU of
        that model is wanted by pods that may run on few models (see `_protection`)."""
        self._prot_by_name: dict[str, float] = {}
        self.weighting = weighting
        self.online: OnlineWorkload | None = None
        if not isinstance(workload, Workload):
            self.online = OnlineWorkload() if workload is None else workload
            workload = self.online.workload
        self.generation = 0
        self._cache = ShapeCache()
        self._facts: _RowFacts | None = None
        self._use(workload)

    def _use(self, workload: Workload) -> None:
        if self.weighting == "demand":
            raw = [
                w * c.gpu_percent for c, w in zip(workload.classes, workload.weights, strict=True)
            ]
            total = sum(raw) or 1.0
            workload = Workload(workload.classes, tuple(r / total for r in raw))
        self.measure = FragmentMeasure(workload)
        gpu = cpu = mem = 0.0
        for c, w in zip(workload.classes, workload.weights, strict=True):
            if c.wants_gpu:
                gpu += w * c.gpu_percent
                cpu += w * c.cpu_milli
                mem += w * c.memory_mib
        # host CPU and memory the GPU workload asks per percent of a GPU (0: unconstrained)
        self._cpu_per_pct = cpu / gpu if gpu else 0.0
        self._mem_per_pct = mem / gpu if gpu else 0.0
        # shares whose GPU memory follows their compute are one-dimensional items; those
        # that ask GPU memory in absolute units are not, and 1-D prices would mislead
        shares: dict[int, float] = {}
        for c, w in zip(workload.classes, workload.weights, strict=True):
            if c.is_share and 0 < c.core < _FULL and not c.memory_units:
                shares[c.core] = shares.get(c.core, 0.0) + w
        self.values = packing_values(shares) if self.packing else NO_VALUES

    @property
    def workload(self) -> Workload:
        return self.measure.workload

    def observe(self, request: PodRequest) -> None:
        if self.online is not None and self.online.observe(request):
            self._use(self.online.workload)
            self.generation += 1

    # --- scores ---------------------------------------------------------------------------

    def _stranded(self, idle: FloatArray, cpu: FloatArray, mem: FloatArray) -> FloatArray:
        """GPU compute (percent) that the node's host CPU and memory cannot feed."""
        by_cpu = np.maximum(cpu, 0) / self._cpu_per_pct if self._cpu_per_pct > 0 else None
        by_mem = np.maximum(mem, 0) / self._mem_per_pct if self._mem_per_pct > 0 else None
        if by_cpu is None:
            if by_mem is None:
                return np.zeros(np.shape(idle))
            feed = by_mem
        else:
            feed = by_cpu if by_mem is None else np.minimum(by_cpu, by_mem)
        out: FloatArray = np.maximum(idle - feed, 0.0)
        return out

    def _raw(
        self,
        delta: FloatArray,
        stranded_before: FloatArray,
        idle_after: FloatArray,
        cpu_after: FloatArray,
        mem_after: FloatArray,
        used_after: FloatArray,
    ) -> FloatArray:
        """`stranded_before`: `_stranded` of the node before the placement."""
        raw = delta / _FULL + self.pack * used_after
        if self.balance:
            strand = stranded_before - self._stranded(idle_after, cpu_after, mem_after)
            raw = raw + self.balance * strand / _FULL
        return raw

    def _final(self, raw: FloatArray, priority: FloatArray) -> FloatArray:
        """Optionally coarsen the score to `quantum` (GPUs) and break what then ties by a
        fixed per-node order, so equal placements fill the same nodes first."""
        raw = np.asarray(raw, dtype=np.float64).reshape(np.shape(priority))
        if self.quantum > 0:
            # the nudge keeps float noise (~1e-15) from flipping a value across a step
            # (NaN and infinities pass through floor quietly)
            raw = np.floor(raw / self.quantum + 1e-7) * self.quantum
        if self.order:
            raw = raw + self.order * priority
        return raw

    def _priority(self, name: str) -> float:
        value = self._order_of.get(name)
        if value is None:
            value = self._order_of[name] = name_order(name)
        return value

    def _priorities(self, index: ClusterIndex, rows: IntArray) -> FloatArray:
        return index.name_order[rows]

    def _exact(
        self,
        node: NodeState,
        before: GpuCapacity,
        after: GpuCapacity,
        cpu_milli: int,
        memory_mib: int,
        base: float = 0.0,
    ) -> float:
        delta = self.measure.delta(node, before, after, cpu_milli, memory_mib)
        core_before, core_after, mem_after = before.core, after.core, after.mem
        gpus = node.inventory.gpus
        healthy = [s for s in range(len(core_before)) if gpus[s].healthy]
        idle_b = float(sum(core_before[s] for s in healthy))
        idle_a = float(sum(core_after[s] for s in healthy))
        cpu = float(UNTRACKED if node.cpu_free is None else node.cpu_free)
        mem = float(UNTRACKED if node.mem_free is None else node.mem_free)
        total = node.total_mem
        free_after = sum(
            min(core_after[s] / _FULL, mem_after[s] / total[s]) if total[s] > 0 else 0.0
            for s in healthy
        )
        if self.pack_by == "free":
            used_after = -free_after / _MAX_GPUS
        else:
            used_after = 1.0 - free_after / len(healthy) if healthy else 0.0
        # the vector form's arithmetic on Python floats (same IEEE operations, same
        # results; numpy's per-call cost dominates on one node)
        raw = delta / _FULL + self.pack * used_after
        if self.balance:
            strand = self._stranded_one(idle_b, cpu, mem) - self._stranded_one(
                idle_a, cpu - cpu_milli, mem - memory_mib
            )
            raw = raw + self.balance * strand / _FULL
        if self.packing and self.values.gpus:
            # a share gives up packing value (whole GPUs and untouched slots lose none)
            lost = 0.0
            for s in healthy:
                taken = core_before[s] - core_after[s]
                if 0 < taken < _FULL:
                    lost += self.values.loss(int(core_before[s]), int(taken))
            raw = raw - self.packing * lost
        if self._prot_by_name:
            prot = self._prot_by_name
            cost = sum(
                (core_before[s] - core_after[s]) / _FULL * (prot.get(gpus[s].model, 0.0) - base)
                for s in healthy
            )
            raw = raw - self.scarcity * cost
        if self.quantum > 0:
            raw = math.floor(raw / self.quantum + 1e-7) * self.quantum
        if self.order:
            raw = raw + self.order * self._priority(node.name)
        return 0.5 + 0.5 * raw / (abs(raw) + 4.0)

    def _stranded_one(self, idle: float, cpu: float, mem: float) -> float:
        """`_stranded` of one node."""
        feed = math.inf
        if self._cpu_per_pct > 0:
            feed = min(feed, max(cpu, 0.0) / self._cpu_per_pct)
        if self._mem_per_pct > 0:
            feed = min(feed, max(mem, 0.0) / self._mem_per_pct)
        return max(idle - feed, 0.0)

    def option_score(self, node: NodeState, free: GpuCapacity, option: Option) -> float:
        after = free.with_slots(option.slots, option.core_after, option.mem_after)
        # the same base as the node's score (placement_score) and the vector form: with
        # coarse score steps, another base could pick another GPU among the options
        score = self._exact(
            node,
            free,
            after,
            option.cpu_milli,
            option.memory_mib,
            self._base_by_name(option.models),
        )
        # best fit among equal scores: the least free compute left on the chosen GPUs
        leftover = sum(option.core_after) / (_FULL * max(len(option.slots), 1))
        return score - 1e-9 * leftover

    def node_score(self, node: NodeState, before: GpuCapacity, after: GpuCapacity) -> float:
        return self._exact(node, before, after, 0, 0)

    def placement_score(
        self, node: NodeState, request: PodRequest, before: GpuCapacity, after: GpuCapacity
    ) -> float:
        return self._exact(
            node,
            before,
            after,
            request.cpu_milli,
            request.memory_mib,
            self._base_by_name(request.hints.models),
        )

    # --- scarce GPU models ---------------------------------------------------------------

    def _protection(self, index: ClusterIndex) -> FloatArray | None:
        """Per model id: the share of that model's GPUs that pods limited to a few models
        are expected to want, capped at 1 (None: the workload has no such pods).

        Each class c limited to the models S_c spreads its GPU demand over the GPUs of
        S_c; relative to the whole cluster being asked for (the total expected demand
        scaled to the cluster's GPUs), model m is wanted by
        rho_m = (GPUs / mean demand) * sum over c with m in S_c of w_c d_c / GPUs(S_c).
        min(1, rho_m) is then how likely a GPU of model m is one such a pod will need,
        the expected cost, in GPUs, of giving it to a pod that could have run elsewhere.
        The demand counts every class seen, not only the published ones (pods limited to
        models spread over many small classes). Recomputed when the workload is replaced
        or nodes come or go (not when a GPU's health flips: the capacity moves little
        then); a change makes cached scores stale (`generation`)."""
        key = (self.generation, id(index), len(index.row_of), len(index.models))
        if key == self._prot_key:
            return self._prot
        before = self._prot_by_name
        prot = self._compute_protection(index)
        if self._prot_by_name != before:
            # cached scores of unchanged nodes used the old values
            self.generation += 1
        self._prot = prot
        self._prot_key = (self.generation, id(index), len(index.row_of), len(index.models))
        return prot

    def _compute_protection(self, index: ClusterIndex) -> FloatArray | None:
        self._prot_by_name = {}
        by_models = (
            self.online.demand_by_models()
            if self.online is not None
            else self.workload.demand_by_models()
        )
        limited = [(m, d) for m, d in by_models.items() if m]
        if not limited or not self.scarcity:
            return None
        rows = index.all_rows()
        present = gpu_slots(index, rows)
        cap = np.bincount(index.model[rows][present], minlength=len(index.models)).astype(
            np.float64
        )
        demand = sum(by_models.values()) / _FULL
        if cap.sum() <= 0 or demand <= 0:
            return None
        load = np.zeros(len(index.models), dtype=np.float64)
        for models, d in limited:
            allowed = np.asarray([models_allow(models, m) for m in index.models], dtype=np.bool_)
            total = cap[allowed].sum()
            if total > 0:
                load[allowed] += d / _FULL / total
        prot = np.minimum(1.0, cap.sum() / demand * load)
        self._prot_by_name = {
            m: float(v) for m, v, n in zip(index.models, prot, cap, strict=True) if n > 0
        }
        out: FloatArray = np.append(prot, 0.0)  # model id -1 (no GPU) reads the last entry
        return out

    def _base(self, index: ClusterIndex, prot: FloatArray, models: tuple[str, ...]) -> float:
        """The least protection among the models the pod may use: what it costs anyway."""
        values = [
            float(prot[i])
            for i, m in enumerate(index.models)
            if m in self._prot_by_name and models_allow(models, m)
        ]
        return min(values) if values else 0.0

    def _base_by_name(self, models: Sequence[str] | frozenset[str]) -> float:
        wanted = tuple(models)
        values = [v for m, v in self._prot_by_name.items() if models_allow(wanted, m)]
        return min(values) if values else 0.0

    def _row_facts(self, index: ClusterIndex, rows: IntArray) -> _RowFacts:
        """The request-independent part of the score for each row (kept per row while
        its stamp and the policy's generation are unchanged)."""
        facts = self._facts
        if (
            facts is None
            or facts.index is not index
            or facts.generation != self.generation
            or facts.free.shape != (index.capacity_rows, index.slots)
        ):
            facts = self._facts = _RowFacts.empty(index, self.generation)
        stale = rows[facts.stamp[rows] != index.stamp[rows]]
        if stale.size:
            fc = index.free_core[stale]
            fm = index.free_mem[stale]
            tm = index.total_mem[stale]
            healthy = gpu_slots(index, stale)
            idle = (fc * healthy).sum(axis=1).astype(np.float64)
            cpu = index.cpu_free[stale].astype(np.float64)
            mem = index.mem_free[stale].astype(np.float64)
            # each GPU's free fraction: the scarcer of compute and memory
            free = np.where(healthy, np.minimum(fc / _FULL, fm / np.maximum(tm, 1)), 0.0)
            facts.idle[stale] = idle
            facts.gpus[stale] = np.maximum(row_count(healthy), 1)
            facts.any_gpu[stale] = row_any(healthy)
            facts.free[stale] = free
            facts.free_sum[stale] = free.sum(axis=1)
            facts.cpu[stale] = cpu
            facts.mem[stale] = mem
            facts.stranded[stale] = self._stranded(idle, cpu, mem)
            facts.stamp[stale] = index.stamp[stale]
        return facts

    def vector_node_scores(
        self, index: ClusterIndex, rows: IntArray, case: VectorCase
    ) -> FloatArray | None:
        prot = self._protection(index)
        base = 0.0 if prot is None else self._base(index, prot, _case_models(case))

        def compute(stale: IntArray) -> FloatArray:
            return self._compute(index, rows, case, prot, base, stale)

        return self._cache.for_case(index, rows, case, self.generation, compute)

    def _compute(
        self,
        index: ClusterIndex,
        rows: IntArray,
        case: VectorCase,
        prot: FloatArray | None,
        base: float,
        stale: IntArray,
    ) -> FloatArray:
        """Node scores of the rows `stale` (NaN where the request cannot fit)."""
        # only rows where the request can fit need a score (the rest: NaN, unused)
        out = np.full(stale.size, np.nan)
        pos = _positions(index, rows, stale)
        fit = case.fit[pos] if case.fit is not None else _may_fit(index, stale, pos, case)
        if not fit.any():
            return out
        sub, sub_pos = stale[fit], pos[fit]
        alike = _alike_rows(index, sub) if sub.size >= _DEDUP_ROWS else None
        if alike is None:
            raw = self._raw_scores(index, sub, case_at(case, sub_pos), prot, base)
        else:
            # rows in the same state score alike but for the node order: score one of
            # each (the case's per-row arrays follow from the row's state too)
            first, inverse = alike
            raw = self._raw_scores(index, sub[first], case_at(case, sub_pos[first]), prot, base)[
                inverse
            ]
        final = self._final(raw, self._priorities(index, sub))
        out[fit] = squash(final, 4.0)
        return out

    def _raw_scores(
        self,
        index: ClusterIndex,
        sub: IntArray,
        sub_case: VectorCase,
        prot: FloatArray | None,
        base: float,
    ) -> FloatArray:
        """Raw scores (`_raw`, before `_final`) of the rows `sub`, where the request fits."""
        delta, idle_after = self.measure.vector_deltas(index, sub, sub_case)
        facts = self._row_facts(index, sub)
        idle_before = facts.idle[sub]
        gpus = facts.gpus[sub]
        free_sum = facts.free_sum[sub]
        cpu = facts.cpu[sub]
        mem = facts.mem[sub]
        strand_before = facts.stranded[sub]
        if delta.ndim == 2:
            assert isinstance(sub_case, ShareCase)
            fc = index.free_core[sub]
            fm = index.free_mem[sub]
            tm = index.total_mem[sub]
            free2 = np.minimum(
                (fc - sub_case.core) / _FULL, (fm - sub_case.need) / np.maximum(tm, 1)
            )
            left2 = free_sum[:, None] - facts.free[sub] + free2
            used2 = -left2 / _MAX_GPUS if self.pack_by == "free" else 1.0 - left2 / gpus[:, None]
            idle2 = idle_before[:, None] - sub_case.core
            raw = self._raw(
                delta,
                strand_before[:, None],
                idle2,
                cpu[:, None] - sub_case.cpu_milli,
                mem[:, None] - sub_case.memory_mib,
                np.where(np.isfinite(delta), used2, 0.0),
            )
            if self.packing and self.values.gpus:
                raw = raw - self.packing * self.values.losses(fc, sub_case.core)
            if prot is not None:
                # the share's part of a GPU, on each candidate GPU's model
                raw = raw - self.scarcity * sub_case.core / _FULL * (prot[index.model[sub]] - base)
            best: FloatArray = raw.max(axis=1)
            return best
        taken = sub_case.count if isinstance(sub_case, WholeCase) else 0
        if self.pack_by == "free":
            used = -(free_sum - taken) / _MAX_GPUS
        else:
            used = np.where(facts.any_gpu[sub], 1.0 - (free_sum - taken) / gpus, 0.0)
        raw1 = self._raw(
            delta,
            strand_before,
            idle_after,
            cpu - sub_case.cpu_milli,
            mem - sub_case.memory_mib,
            used,
        )
        if prot is not None and isinstance(sub_case, WholeCase):
            first = sub_case.free_whole.argmax(axis=1)
            model = index.model[sub, first]
            raw1 = raw1 - self.scarcity * sub_case.count * (prot[model] - base)
        return raw1


@dataclass
class _RowFacts:
    """Per index row, what a node's score needs of its current state whatever the
    request: idle GPU compute, healthy GPUs (at least 1), whether it has any, each
    GPU's free fraction and their sum, free host CPU and memory, and the GPU compute
    that host CPU and memory cannot feed (which depends on the learned workload)."""

    index: object
    generation: int
    stamp: IntArray
    idle: FloatArray
    gpus: IntArray
    any_gpu: BoolArray
    free: FloatArray
    free_sum: FloatArray
    cpu: FloatArray
    mem: FloatArray
    stranded: FloatArray

    @classmethod
    def empty(cls, index: ClusterIndex, generation: int) -> _RowFacts:
        rows, slots = index.capacity_rows, index.slots
        return cls(
            index,
            generation,
            np.full(rows, -2, dtype=np.int64),
            np.zeros(rows),
            np.ones(rows, dtype=np.int64),
            np.zeros(rows, dtype=np.bool_),
            np.zeros((rows, slots)),
            np.zeros(rows),
            np.zeros(rows),
            np.zeros(rows),
            np.zeros(rows),
        )


_DEDUP_ROWS = 128
"""From this many rows to score at once (a new request shape, a new workload), rows in
identical states are scored once: early on most nodes are untouched, late most are full."""


def _alike_rows(index: ClusterIndex, rows: IntArray) -> tuple[IntArray, IntArray] | None:
    """(positions of one row per distinct state, each row's state among those), or None
    when nearly every row is distinct. The state is everything a score reads of a row."""
    state = np.concatenate(
        (
            index.free_core[rows],
            index.free_mem[rows],
            index.total_mem[rows],
            index.model[rows],
            index.healthy[rows].astype(np.int64),
            index.cpu_free[rows, None],
            index.mem_free[rows, None],
            index.unit_mib[rows, None],
        ),
        axis=1,
    )
    # group by a hash of the state (integer products wrap), then check every row against
    # its group's first row, so a collision can only cost the saving, never a wrong score
    mix = _state_mix(state.shape[1])
    _, first, inverse = np.unique(state @ mix, return_index=True, return_inverse=True)
    inverse = inverse.reshape(rows.size)
    if first.size > 0.8 * rows.size or not np.array_equal(state, state[first][inverse]):
        return None
    return first, inverse


_MIXES: dict[int, IntArray] = {}


def _state_mix(width: int) -> IntArray:
    """Fixed odd 63-bit multipliers for hashing a row state of `width` integers."""
    mix = _MIXES.get(width)
    if mix is None:
        rng = np.random.default_rng(width)
        mix = _MIXES[width] = rng.integers(1, 2**62, width, dtype=np.int64) | 1
    return mix


def _positions(index: ClusterIndex, rows: IntArray, sub: IntArray) -> IntArray:
    """Positions in `rows` of the rows `sub`; fast for every row of the index (the
    scheduler's and the simulator's usual case), which is ascending."""
    if rows is index.all_rows():
        if rows.size and int(rows[-1]) == rows.size - 1:
            return sub
        return np.searchsorted(rows, sub)
    return case_positions(rows, sub)


def _may_fit(index: ClusterIndex, sub: IntArray, pos: IntArray, case: VectorCase) -> BoolArray:
    """Rows `sub` (at positions `pos` of the case's rows) where the request fits the
    host and the GPUs."""
    host: BoolArray = (index.cpu_free[sub] >= case.cpu_milli) & (
        index.mem_free[sub] >= case.memory_mib
    )
    if isinstance(case, HostCase):
        return host
    if isinstance(case, WholeCase):
        gpus: BoolArray = row_count(case.free_whole[pos]) >= case.count
    else:
        gpus = row_any(case.fits[pos])
    return host & gpus


def _case_models(case: VectorCase) -> tuple[str, ...]:
    """The GPU models the request may use (empty: any), from its shape."""
    shape = case.shape
    hints = shape[1] if isinstance(shape, tuple) and len(shape) > 1 else None
    models = getattr(hints, "models", ())
    return tuple(models)
