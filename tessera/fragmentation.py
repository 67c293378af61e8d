"""Fragmentation-aware placement, tessera's default policy.

The measure follows Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
Workloads with Fragmentation Gradient Descent" (USENIX ATC 2023): given the workload the
cluster expects (a distribution over pod classes), the fragment of a node is the idle GPU
compute that a pod drawn from that distribution could not use, in expectation. For one
class the fragment is all the node's idle GPU when the class does not fit the node at all
(too few suitable GPUs, or too little host CPU / memory left), and otherwise the idle
compute on the GPUs that cannot take one of its GPUs (the partial leftovers).

With the classes grouped by their GPU shape g (GPU count k_g, per-GPU compute and memory),
the expected fragment of a node is

    F = P * idle - sum_g W_g * [cnt_g >= k_g] * usable_g

where `idle` is the node's free GPU compute, P the total weight of GPU classes, `cnt_g` and
`usable_g` the number and free compute of GPUs that could take a GPU of shape g, and W_g
the weight of the classes of shape g whose host CPU and memory still fit. That form makes a
whole cluster cheap to evaluate with array operations (`FragmentMeasure`).

`FragmentationPolicy` places a pod where the expected fragment grows least (the gradient
step of the paper), keeps host CPU and memory in step with the GPUs they must feed,
fills equally good nodes in a fixed order, and learns the distribution online from the
pods it is asked to place (`OnlineWorkload`), starting from a prior.
docs/fragmentation.md has the design and the measurements.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tessera.model import model_matches
from tessera.node_state import NodeState
from tessera.policy import (
    POLICIES,
    FloatArray,
    HostCase,
    IntArray,
    Option,
    Policy,
    ShareCase,
    VectorCase,
    WholeCase,
)
from tessera.request import PodRequest
from tessera.resources import POLICY_FRAGMENTATION, UNITS_PER_DEVICE

if TYPE_CHECKING:
    from tessera.index import ClusterIndex

BoolArray = npt.NDArray[np.bool_]
_FULL = UNITS_PER_DEVICE
_BIG = np.iinfo(np.int64).max // 4
_MAX_GPUS = 8.0
"""GPUs of a large node: `pack_by="free"` counts free GPUs in these units."""


# --- the workload ---------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class PodClass:
    """A kind of pod, as the fragmentation measure sees it (the paper's "typical pod")."""

    gpu_count: int = 0
    """Whole GPUs; 0 for a share or a pod without GPUs."""
    core: int = 0
    """For a share: percent of one GPU's compute."""
    memory_ratio: int = 0
    """For a share: percent of the GPU's memory."""
    memory_units: int = 0
    """For a share: GPU memory in the node's memory units."""
    cpu_milli: int = 0
    memory_mib: int = 0
    """Host memory; 0 when the measure ignores it."""
    models: tuple[str, ...] = ()
    """Allowed GPU models (sorted); empty: any."""

    @property
    def wants_gpu(self) -> bool:
        return self.gpu_count > 0 or self.core > 0 or self.memory_ratio > 0 or self.memory_units > 0

    @property
    def is_share(self) -> bool:
        return self.gpu_count == 0 and self.wants_gpu

    @property
    def gpus(self) -> int:
        """GPUs the pod touches (1 for a share)."""
        return self.gpu_count if self.gpu_count else (1 if self.wants_gpu else 0)

    @property
    def gpu_percent(self) -> int:
        """GPU demand in percent of one GPU (a share counts its compute, else its memory)."""
        if self.gpu_count:
            return _FULL * self.gpu_count
        return self.core or self.memory_ratio

    def shape(self) -> GpuShape:
        if self.gpu_count:
            return GpuShape(self.gpu_count, _FULL, _FULL, 0, self.models)
        return GpuShape(1, self.core, self.memory_ratio, self.memory_units, self.models)

    @classmethod
    def of(cls, request: PodRequest, host_memory: bool = True) -> PodClass:
        """The class of a pod: its largest running device container, its host request."""
        running = [c for c in request.containers if c.wants_gpu and (not c.init or c.sidecar)]
        mem = request.memory_mib if host_memory else 0
        models = tuple(sorted(request.hints.models))
        if not running:
            return cls(cpu_milli=request.cpu_milli, memory_mib=mem)
        c = max(running, key=lambda x: (x.gpu_count, x.core, x.memory_ratio, x.memory_units))
        if c.gpu_count:
            return cls(c.gpu_count, cpu_milli=request.cpu_milli, memory_mib=mem, models=models)
        return cls(0, c.core, c.memory_ratio, c.memory_units, request.cpu_milli, mem, models=models)


@dataclass(frozen=True, order=True)
class GpuShape:
    """What one pod class needs of a node's GPUs: `count` GPUs, each with this much free."""

    count: int
    core: int
    memory_ratio: int
    memory_units: int
    models: tuple[str, ...] = ()

    def memory_need(self, total_mib: int, unit_mib: int) -> int:
        if self.memory_units:
            return self.memory_units * unit_mib
        return total_mib * self.memory_ratio // _FULL


@dataclass(frozen=True)
class Workload:
    """A distribution over pod classes (weights sum to 1)."""

    classes: tuple[PodClass, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.classes) != len(self.weights):
            raise ValueError("one weight per class")
        if any(w < 0 for w in self.weights):
            raise ValueError("weights must not be negative")

    @classmethod
    def from_counts(
        cls, counts: Mapping[PodClass, float], coverage: float = 1.0, max_classes: int = 0
    ) -> Workload:
        """The most popular classes until they cover `coverage` of the pods (the paper's
        typical pods: 95%), at most `max_classes` (0: no limit), renormalized.

        Popularity ties go to the larger class (CPU, then GPU, then count, then models), so
        the choice does not depend on the order the counts were made in.
        """
        total = float(sum(counts.values()))
        if total <= 0:
            return cls((), ())
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], _tie_key(kv[0])), reverse=True)
        chosen: list[tuple[PodClass, float]] = []
        cum = 0.0
        for pod_class, count in ranked:
            if cum >= coverage * total - 1e-9 or (max_classes and len(chosen) >= max_classes):
                break
            chosen.append((pod_class, count))
            cum += count
        return cls(tuple(c for c, _ in chosen), tuple(n / cum for _, n in chosen))

    @classmethod
    def from_requests(
        cls, requests: Iterable[PodRequest], coverage: float = 1.0, host_memory: bool = True
    ) -> Workload:
        counts = Counter(PodClass.of(r, host_memory) for r in requests)
        return cls.from_counts(counts, coverage)

    def weight_of(self, pod_class: PodClass) -> float:
        for c, w in zip(self.classes, self.weights, strict=True):
            if c == pod_class:
                return w
        return 0.0

    def distance(self, other: Workload) -> float:
        """Total variation distance between two workloads."""
        mine = dict(zip(self.classes, self.weights, strict=True))
        theirs = dict(zip(other.classes, other.weights, strict=True))
        keys = set(mine) | set(theirs)
        return 0.5 * sum(abs(mine.get(k, 0.0) - theirs.get(k, 0.0)) for k in keys)


def _tie_key(c: PodClass) -> tuple[int, int, int, str]:
    milli = 1000 if c.gpu_count else 10 * (c.core or c.memory_ratio)
    return (c.cpu_milli, milli, c.gpus, "|".join(c.models))


DEFAULT_PRIOR: tuple[tuple[PodClass, float], ...] = (
    (PodClass(gpu_count=1), 0.35),
    (PodClass(gpu_count=2), 0.05),
    (PodClass(gpu_count=4), 0.05),
    (PodClass(gpu_count=8), 0.05),
    (PodClass(core=50, memory_ratio=50), 0.25),
    (PodClass(core=25, memory_ratio=25), 0.25),
)
"""What the policy expects before it has seen any pod: mostly one-GPU and half or quarter
GPU pods, some multi-GPU ones, no host constraint."""


class OnlineWorkload:
    """The workload as learned from the pods seen so far, plus a prior.

    Each distinct pod (by UID) counts once, however often it is evaluated. The published
    `workload` is reconsidered after 16, 32, 64, ... new pods, then every `max_interval`
    pods, and replaced only when it has drifted from the current one by more than `drift`
    (total variation distance): every replacement makes cached scores stale, so it should
    be rare once the estimate has settled. Counts age (halve) every `window` pods, so a
    workload that changes over time is followed.
    """

    def __init__(
        self,
        prior: Sequence[tuple[PodClass, float]] = DEFAULT_PRIOR,
        prior_weight: float = 10.0,
        coverage: float = 0.99,
        max_classes: int = 48,
        first_check: int = 16,
        max_interval: int = 1024,
        drift: float = 0.02,
        host_memory: bool = True,
        window: int = 65536,
        remember: int = 8192,
    ) -> None:
        total = sum(w for _, w in prior) or 1.0
        self._prior = {c: prior_weight * w / total for c, w in prior}
        self._counts: dict[PodClass, float] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._remember = remember
        self.coverage = coverage
        self.max_classes = max_classes
        self.max_interval = max(1, max_interval)
        self.drift = drift
        self.host_memory = host_memory
        self.window = window
        self.observed = 0
        self._interval = max(1, first_check)
        self._next_check = self._interval
        self.version = 0
        self.workload = self._current()

    def _current(self) -> Workload:
        counts = dict(self._prior)
        for c, n in self._counts.items():
            counts[c] = counts.get(c, 0.0) + n
        return Workload.from_counts(counts, self.coverage, self.max_classes)

    def observe(self, request: PodRequest) -> bool:
        """Count one pod; True when the published workload changed."""
        if request.uid:
            if request.uid in self._seen:
                return False
            self._seen[request.uid] = None
            if len(self._seen) > self._remember:
                self._seen.popitem(last=False)
        cls = PodClass.of(request, self.host_memory)
        self._counts[cls] = self._counts.get(cls, 0.0) + 1.0
        self.observed += 1
        if self.window and self.observed % self.window == 0:
            for c in list(self._counts):
                self._counts[c] /= 2
        if self.observed < self._next_check:
            return False
        self._interval = min(self._interval * 2, self.max_interval)
        self._next_check = self.observed + self._interval
        fresh = self._current()
        # sampling noise alone moves an estimate from n pods by about 1/sqrt(n)
        if fresh.distance(self.workload) <= max(self.drift, 1.5 / self.observed**0.5):
            return False
        self.workload = fresh
        self.version += 1
        return True


# --- the measure ------------------------------------------------------------------------------


@dataclass
class _NodeSlots:
    inventory: object
    per_shape: list[list[int]]
    healthy: list[int]


@dataclass
class _RowCache:
    """Per-row results of one request shape, valid while the row's stamp is unchanged."""

    stamp: IntArray
    values: FloatArray


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
        healthy = [s for s, g in enumerate(gpus) if g.healthy]
        per_shape = [
            [s for s in healthy if _allowed(gpus[s].model, shape.models)]
            for shape in self._c.shapes
        ]
        entry = _NodeSlots(inv, per_shape, healthy)
        if len(self._nodes) > 65536:
            self._nodes.clear()
        self._nodes[id(inv)] = entry
        return entry

    def fragment(
        self,
        node: NodeState,
        core: Sequence[int],
        mem: Sequence[int],
        cpu_free: int | None,
        mem_free: int | None,
    ) -> float:
        """Expected fragment of `node` with these free vectors and host CPU / memory."""
        c = self._c
        slots = self._slots(node)
        idle = sum(core[s] for s in slots.healthy)
        total_mem = node.total_mem
        unit = node.inventory.memory_unit_mib
        result = c.idle_weight * idle
        for g, shape in enumerate(c.shapes):
            w = 0.0
            for cpu_t, mem_t, p in c.host_by_shape[g]:
                if (cpu_free is None or cpu_free >= cpu_t) and (
                    mem_free is None or mem_free >= mem_t
                ):
                    w += p
            if w == 0.0:
                continue
            count = usable = 0
            for s in slots.per_shape[g]:
                if core[s] >= shape.core and mem[s] >= shape.memory_need(total_mem[s], unit):
                    count += 1
                    usable += core[s]
            if count >= shape.count:
                result -= w * usable
        return result

    def delta(
        self,
        node: NodeState,
        core_before: Sequence[int],
        mem_before: Sequence[int],
        core_after: Sequence[int],
        mem_after: Sequence[int],
        cpu_milli: int,
        memory_mib: int,
    ) -> float:
        """How much a placement lowers the node's expected fragment (negative: raises it)."""
        cpu, mem = node.cpu_free, node.mem_free
        before = self.fragment(node, core_before, mem_before, cpu, mem)
        after = self.fragment(
            node,
            core_after,
            mem_after,
            None if cpu is None else cpu - cpu_milli,
            None if mem is None else mem - memory_mib,
        )
        return before - after

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
                    hit[g, m] = _allowed(model, shape.models)
            c.allowed[known] = hit
        return hit

    def _host_weights(self, cpu: IntArray, mem: IntArray) -> FloatArray:
        """[R, G] weight of the classes of each shape whose host request fits."""
        c = self._c
        fits = (cpu[:, None] >= c.cls_cpu[None, :]) & (mem[:, None] >= c.cls_mem[None, :])
        out: FloatArray = fits.astype(np.float64) @ c.cls_to_shape
        return out

    def _state(self, index: ClusterIndex, rows: IntArray) -> _RowState:
        """What the measure needs of each row's current state."""
        c = self._c
        fc = index.free_core[rows]
        fm = index.free_mem[rows]
        tm = index.total_mem[rows]
        model = index.model[rows]
        base = index.healthy[rows] & (model >= 0)
        allowed = self._allowed_matrix(index)
        elig = base[:, :, None] & allowed.T[np.where(model >= 0, model, -1)]
        # memory a GPU of shape g needs on each slot: units * unit, or total * ratio // 100;
        # free >= total * ratio // 100  <=>  100 * free + 100 > total * ratio  (integers)
        tm_ratio = tm[:, :, None] * c.ratio[None, None, :]
        units_need = c.units[None, None, :] * index.unit_mib[rows][:, None, None]

        def mem_ok(free_mem: IntArray) -> BoolArray:
            by_ratio = (_FULL * free_mem + _FULL)[:, :, None] > tm_ratio
            by_units = free_mem[:, :, None] >= units_need
            out: BoolArray = np.where(c.has_units[None, None, :], by_units, by_ratio)
            return out

        ok = elig & (fc[:, :, None] >= c.core[None, None, :]) & mem_ok(fm)
        cnt = ok.sum(axis=1)
        usable = np.einsum("rs,rsg->rg", fc, ok, dtype=np.int64)
        idle = (fc * base).sum(axis=1)
        return _RowState(fc, fm, base, elig, ok, cnt, usable, idle, mem_ok)

    def rows_fragment(self, index: ClusterIndex, rows: IntArray) -> FloatArray:
        """Expected fragment of each row as it is now."""
        c = self._c
        st = self._state(index, rows)
        w = self._host_weights(index.cpu_free[rows], index.mem_free[rows])
        held = (w * (st.cnt >= c.count[None, :]) * st.usable).sum(axis=1)
        result: FloatArray = c.idle_weight * st.idle - held
        return result

    def vector_deltas(
        self, index: ClusterIndex, rows: IntArray, case: VectorCase
    ) -> tuple[FloatArray, FloatArray]:
        """(delta, idle after) per row for the request; for a share, delta is [R, S] per
        candidate GPU (-inf where it does not fit) and idle after is [R]. NaN marks rows
        the measure cannot settle without knowing which GPUs the core picks."""
        c = self._c
        st = self._state(index, rows)
        cnt, usable, idle = st.cnt, st.usable, st.idle
        cpu = index.cpu_free[rows]
        mem = index.mem_free[rows]
        w = self._host_weights(cpu, mem)
        k = c.count[None, :]
        before = c.idle_weight * idle - (w * (cnt >= k) * usable).sum(axis=1)
        w2 = self._host_weights(cpu - case.cpu_milli, mem - case.memory_mib)
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
            rep = st.ok[np.arange(rows.size), first, :]  # [R, G]: a free GPU's usability
            cnt2 = cnt - case.count * rep
            usable2 = usable - _FULL * case.count * rep
            idle2 = idle - _FULL * case.count
            after = c.idle_weight * idle2 - (w2 * (cnt2 >= k) * usable2).sum(axis=1)
            delta = np.where(same, before - after, np.nan)
            return delta, idle2.astype(np.float64)
        # a share on one GPU: every candidate GPU at once; only that GPU changes
        fc, ok = st.fc, st.ok
        fc2 = fc - case.core
        ok2 = st.elig & (fc2[:, :, None] >= c.core[None, None, :]) & st.mem_ok(st.fm - case.need)
        cnt2 = cnt[:, None, :] + (ok2.view(np.int8) - ok.view(np.int8))
        usable2 = usable[:, None, :] - fc[:, :, None] * ok + fc2[:, :, None] * ok2
        held2 = np.einsum("rg,rsg->rs", w2, (cnt2 >= k[:, None, :]) * usable2)
        after = c.idle_weight * (idle[:, None] - case.core) - held2
        delta = np.where(case.fits, before[:, None] - after, -np.inf)
        return delta, (idle - case.core).astype(np.float64)


@dataclass
class _RowState:
    fc: IntArray
    fm: IntArray
    base: BoolArray
    elig: BoolArray
    ok: BoolArray
    cnt: IntArray
    usable: IntArray
    idle: IntArray
    mem_ok: Callable[[IntArray], BoolArray]


def _one_hot(column: Sequence[int], weight: Sequence[float], columns: int) -> FloatArray:
    out = np.zeros((len(column), columns), dtype=np.float64)
    for t, (g, w) in enumerate(zip(column, weight, strict=True)):
        out[t, g] = w
    return out


def _allowed(model: str, models: tuple[str, ...]) -> bool:
    return not models or any(model_matches(model, m) for m in models)


# --- caching vector results per request shape --------------------------------------------


class ShapeCache:
    """Per-row results for each request shape, recomputed only for rows that changed.

    A decision looks at every node, but between two decisions only a few nodes change;
    results are keyed by the request's shape and kept per index row with the row's stamp.
    """

    def __init__(self, max_shapes: int = 512) -> None:
        self._index: object = None
        self._generation = -1
        self._entries: OrderedDict[object, _RowCache] = OrderedDict()
        self.max_shapes = max_shapes

    def get(
        self,
        index: ClusterIndex,
        rows: IntArray,
        key: object,
        generation: int,
        compute: Callable[[IntArray], FloatArray],
    ) -> FloatArray:
        if self._index is not index or self._generation != generation:
            self._index = index
            self._generation = generation
            self._entries.clear()
        stamps = index.stamp
        entry = self._entries.get(key)
        if entry is None or entry.stamp.size != stamps.size:
            entry = _RowCache(
                np.full(stamps.size, -2, dtype=np.int64), np.zeros(stamps.size, dtype=np.float64)
            )
            self._entries[key] = entry
            if len(self._entries) > self.max_shapes:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        current = stamps[rows]
        stale = rows[entry.stamp[rows] != current]
        if stale.size:
            entry.values[stale] = compute(stale)
            entry.stamp[stale] = stamps[stale]
        result: FloatArray = entry.values[rows]
        return result


# --- the policy ---------------------------------------------------------------------------------


def squash(x: FloatArray | float, scale: float) -> FloatArray:
    """Map any real number into [0, 1], monotonically, keeping resolution over a wide range
    (-inf -> 0, +inf -> 1, NaN stays NaN)."""
    v = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out: FloatArray = np.where(np.isinf(v), (v > 0) * 1.0, 0.5 + 0.5 * v / (np.abs(v) + scale))
    return out


class FragmentationPolicy(Policy):
    """Place where the expected fragment grows least, keep host CPU and memory in step
    with the GPUs, and fill equally good nodes in a fixed order.

    The raw score of a placement, in GPUs, is

        dF + balance * dS + pack * used_after

    dF: how much the node's expected fragment drops (`FragmentMeasure`, under the workload
    learned so far); dS: how much the node's GPU stranded by host CPU or memory drops, where
    the GPU a node can still feed is its free CPU (memory) over the CPU (memory) the
    workload asks per GPU; used_after: the node's share of GPU in use after the pod (per GPU
    the scarcer of compute and memory; `pack_by="free"`: minus its free GPUs / 8). The raw
    score is coarsened to steps of `quantum` GPUs, and `order` times a fixed per-node number
    in [0, 1) (a hash of the name) breaks what then ties, so equally good placements keep
    filling the same nodes whatever the scheduler's own tie rule; the node score squashes
    it into (0, 1). Inside a node the same score picks the GPU, and among GPUs of equal
    score the one left with the least free compute.

    Without a `workload`, the policy learns it online (`observe`); options: `prior_weight`,
    `coverage`, `first_check`, `max_interval`, `drift` (see `OnlineWorkload`),
    `host_memory` (host memory in the pod classes), `weighting` ("count": classes weigh by
    popularity as in the paper; "demand": by popularity times GPU demand).
    """

    name = POLICY_FRAGMENTATION
    pack_nics = True

    def __init__(
        self,
        workload: Workload | None = None,
        *,
        pack: float = 0.1,
        balance: float = 1.0,
        prior_weight: float = 10.0,
        coverage: float = 0.99,
        first_check: int = 16,
        max_interval: int = 1024,
        drift: float = 0.02,
        host_memory: bool = True,
        weighting: str = "count",
        pack_by: str = "fraction",
        quantum: float = 0.1,
        order: float = 1e-6,
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
        self.weighting = weighting
        self.online: OnlineWorkload | None = None
        if workload is None:
            self.online = OnlineWorkload(
                prior_weight=prior_weight,
                coverage=coverage,
                first_check=first_check,
                max_interval=max_interval,
                drift=drift,
                host_memory=host_memory,
            )
            workload = self.online.workload
        self.generation = 0
        self._cache = ShapeCache()
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
        feed = np.full(np.shape(idle), np.inf)
        if self._cpu_per_pct > 0:
            feed = np.minimum(feed, np.maximum(cpu, 0) / self._cpu_per_pct)
        if self._mem_per_pct > 0:
            feed = np.minimum(feed, np.maximum(mem, 0) / self._mem_per_pct)
        out: FloatArray = np.maximum(idle - feed, 0.0)
        return out

    def _raw(
        self,
        delta: FloatArray,
        idle_before: FloatArray,
        idle_after: FloatArray,
        cpu_before: FloatArray,
        cpu_after: FloatArray,
        mem_before: FloatArray,
        mem_after: FloatArray,
        used_after: FloatArray,
    ) -> FloatArray:
        raw = delta / _FULL + self.pack * used_after
        if self.balance:
            strand = self._stranded(idle_before, cpu_before, mem_before) - self._stranded(
                idle_after, cpu_after, mem_after
            )
            raw = raw + self.balance * strand / _FULL
        return raw

    def _final(self, raw: FloatArray, priority: FloatArray) -> FloatArray:
        """Optionally coarsen the score to `quantum` (GPUs) and break what then ties by a
        fixed per-node order, so equal placements fill the same nodes first."""
        raw = np.asarray(raw, dtype=np.float64).reshape(np.shape(priority))
        if self.quantum > 0:
            with np.errstate(invalid="ignore"):
                # the nudge keeps float noise (~1e-15) from flipping a value across a step
                raw = np.floor(raw / self.quantum + 1e-7) * self.quantum
        if self.order:
            raw = raw + self.order * priority
        return raw

    def _priority(self, name: str) -> float:
        value = self._order_of.get(name)
        if value is None:
            digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
            value = self._order_of[name] = int.from_bytes(digest, "little") / 2.0**64
        return value

    def _priorities(self, index: ClusterIndex, rows: IntArray) -> FloatArray:
        names = index.names
        return np.asarray([self._priority(names[r] or "") for r in rows.tolist()])

    def _exact(
        self,
        node: NodeState,
        core_before: Sequence[int],
        mem_before: Sequence[int],
        core_after: Sequence[int],
        mem_after: Sequence[int],
        cpu_milli: int,
        memory_mib: int,
    ) -> float:
        delta = self.measure.delta(
            node, core_before, mem_before, core_after, mem_after, cpu_milli, memory_mib
        )
        gpus = node.inventory.gpus
        healthy = [s for s in range(len(core_before)) if gpus[s].healthy]
        idle_b = float(sum(core_before[s] for s in healthy))
        idle_a = float(sum(core_after[s] for s in healthy))
        cpu = float(_BIG if node.cpu_free is None else node.cpu_free)
        mem = float(_BIG if node.mem_free is None else node.mem_free)
        total = node.total_mem
        free_after = sum(
            min(core_after[s] / _FULL, mem_after[s] / total[s]) if total[s] > 0 else 0.0
            for s in healthy
        )
        if self.pack_by == "free":
            used_after = -free_after / _MAX_GPUS
        else:
            used_after = 1.0 - free_after / len(healthy) if healthy else 0.0
        raw = self._raw(
            *(
                np.asarray(v, dtype=np.float64)
                for v in (
                    delta,
                    idle_b,
                    idle_a,
                    cpu,
                    cpu - cpu_milli,
                    mem,
                    mem - memory_mib,
                    used_after,
                )
            )
        )
        return float(squash(self._final(raw, np.asarray([self._priority(node.name)])), 4.0)[0])

    def option_score(
        self, node: NodeState, core: Sequence[int], mem: Sequence[int], option: Option
    ) -> float:
        after_core = list(core)
        after_mem = list(mem)
        for s, c, m in zip(option.slots, option.core_after, option.mem_after, strict=True):
            after_core[s] = c
            after_mem[s] = m
        score = self._exact(
            node, core, mem, after_core, after_mem, option.cpu_milli, option.memory_mib
        )
        # best fit among equal scores: the least free compute left on the chosen GPUs
        leftover = sum(option.core_after) / (_FULL * max(len(option.slots), 1))
        return score - 1e-9 * leftover

    def node_score(
        self,
        node: NodeState,
        core_before: Sequence[int],
        mem_before: Sequence[int],
        core_after: Sequence[int],
        mem_after: Sequence[int],
    ) -> float:
        return self._exact(node, core_before, mem_before, core_after, mem_after, 0, 0)

    def placement_score(
        self,
        node: NodeState,
        request: PodRequest,
        core_before: Sequence[int],
        mem_before: Sequence[int],
        core_after: Sequence[int],
        mem_after: Sequence[int],
    ) -> float:
        return self._exact(
            node,
            core_before,
            mem_before,
            core_after,
            mem_after,
            request.cpu_milli,
            request.memory_mib,
        )

    def vector_node_scores(
        self, index: ClusterIndex, rows: IntArray, case: VectorCase
    ) -> FloatArray | None:
        measure = self.measure

        def compute(stale: IntArray) -> FloatArray:
            # only rows where the request can fit need a score (the rest: NaN, unused)
            out = np.full(stale.size, np.nan)
            fit = _may_fit(index, rows, stale, case)
            if fit.any():
                out[fit] = score(stale[fit])
            return out

        def score(sub: IntArray) -> FloatArray:
            sub_case = _sub_case(case, rows, sub)
            delta, idle_after = measure.vector_deltas(index, sub, sub_case)
            fc = index.free_core[sub]
            fm = index.free_mem[sub]
            tm = index.total_mem[sub]
            healthy = index.healthy[sub] & (index.model[sub] >= 0)
            idle_before = (fc * healthy).sum(axis=1).astype(np.float64)
            gpus = np.maximum(healthy.sum(axis=1), 1)
            # each GPU's free fraction: the scarcer of compute and memory
            free = np.where(healthy, np.minimum(fc / _FULL, fm / np.maximum(tm, 1)), 0.0)
            free_sum = free.sum(axis=1)
            cpu = index.cpu_free[sub].astype(np.float64)
            mem = index.mem_free[sub].astype(np.float64)
            if delta.ndim == 2:
                assert isinstance(sub_case, ShareCase)
                free2 = np.minimum(
                    (fc - sub_case.core) / _FULL, (fm - sub_case.need) / np.maximum(tm, 1)
                )
                left2 = free_sum[:, None] - free + free2
                if self.pack_by == "free":
                    used2 = -left2 / _MAX_GPUS
                else:
                    used2 = 1.0 - left2 / gpus[:, None]
                idle2 = idle_before[:, None] - sub_case.core
                raw = self._raw(
                    delta,
                    idle_before[:, None],
                    idle2,
                    cpu[:, None],
                    cpu[:, None] - sub_case.cpu_milli,
                    mem[:, None],
                    mem[:, None] - sub_case.memory_mib,
                    np.where(np.isfinite(delta), used2, 0.0),
                )
                final = self._final(raw.max(axis=1), self._priorities(index, sub))
                best: FloatArray = np.asarray(squash(final, 4.0), dtype=np.float64)
                return best
            taken = sub_case.count if isinstance(sub_case, WholeCase) else 0
            if self.pack_by == "free":
                used = -(free_sum - taken) / _MAX_GPUS
            else:
                used = np.where(healthy.any(axis=1), 1.0 - (free_sum - taken) / gpus, 0.0)
            raw1 = self._raw(
                delta,
                idle_before,
                idle_after,
                cpu,
                cpu - sub_case.cpu_milli,
                mem,
                mem - sub_case.memory_mib,
                used,
            )
            final1 = self._final(raw1, self._priorities(index, sub))
            out: FloatArray = np.asarray(squash(final1, 4.0), dtype=np.float64)
            return out

        key = _case_key(case)
        if key is None:
            return compute(rows)
        return self._cache.get(index, rows, key, self.generation, compute)


def _may_fit(index: ClusterIndex, rows: IntArray, sub: IntArray, case: VectorCase) -> BoolArray:
    """Rows of `sub` (a subset of `rows`) where the request fits the host and the GPUs."""
    host: BoolArray = (index.cpu_free[sub] >= case.cpu_milli) & (
        index.mem_free[sub] >= case.memory_mib
    )
    if isinstance(case, HostCase):
        return host
    pos = _positions_of(rows, sub)
    if isinstance(case, WholeCase):
        gpus: BoolArray = case.free_whole[pos].sum(axis=1) >= case.count
    else:
        gpus = np.asarray(case.fits[pos].any(axis=1), dtype=np.bool_)
    return host & gpus


def _positions_of(rows: IntArray, sub: IntArray) -> IntArray:
    if sub is rows:
        return np.arange(rows.size)
    return np.searchsorted(rows, sub) if _sorted(rows) else _positions(rows, sub)


def _case_key(case: VectorCase) -> object | None:
    key = getattr(case, "shape", None)
    if key is None:
        return None
    return (type(case).__name__, key)


def _sub_case(case: VectorCase, rows: IntArray, sub: IntArray) -> VectorCase:
    """The case restricted to the rows `sub` (a subset of `rows`)."""
    if sub is rows or isinstance(case, HostCase):
        return case
    pos = _positions_of(rows, sub)
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


POLICIES[FragmentationPolicy.name] = FragmentationPolicy

__all__ = [
    "DEFAULT_PRIOR",
    "FragmentMeasure",
    "FragmentationPolicy",
    "GpuShape",
    "OnlineWorkload",
    "PodClass",
    "ShapeCache",
    "Workload",
    "squash",
]
