"""The workload a cluster expects: pod classes, their GPU shapes, and the online estimate."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tessera.request import GpuAsk, PodRequest
from tessera.resources import UNITS_PER_DEVICE

_FULL = UNITS_PER_DEVICE


@dataclass(frozen=True, order=True)
class PodClass(GpuAsk):
    """A kind of pod, as the fragmentation measure sees it (the paper's "typical pod"): the
    GPU ask of its largest device container, and its host request."""

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

    def demand_by_models(self) -> dict[tuple[str, ...], float]:
        """Expected GPU demand (percent of a GPU per pod) by allowed models (empty: any)."""
        return _demand_by_models(zip(self.classes, self.weights, strict=True))

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


def _demand_by_models(
    weighted: Iterable[tuple[PodClass, float]],
) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    total = 0.0
    for c, w in weighted:
        if c.wants_gpu:
            out[c.models] = out.get(c.models, 0.0) + w * c.gpu_percent
            total += w
    return {m: d / total for m, d in out.items()} if total > 0 else {}


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


MAX_TRACKED_CLASSES = 1024
"""Pod classes an OnlineWorkload counts at once (about 200 bytes each). Host requests and
model lists are the pod author's, so distinct classes have no natural end."""


class OnlineWorkload:
    """The workload as learned from the pods seen so far, plus a prior.

    Each distinct pod (by UID) counts once, however often it is evaluated. The published
    `workload` is reconsidered after 16, 32, 64, ... new pods, then every `max_interval`
    pods, and replaced only when it has drifted from the current one by more than `drift`
    (total variation distance): every replacement makes cached scores stale, so it should
    be rare once the estimate has settled. Counts age (halve) every `window` pods, so a
    workload that changes over time is followed. At most `max_tracked` classes are counted:
    a new class past that first drops the rarer half (the published workload is at most
    `max_classes` of the most popular ones), and at most `remember` UIDs are remembered.
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
        max_tracked: int = MAX_TRACKED_CLASSES,
    ) -> None:
        total = sum(w for _, w in prior) or 1.0
        self._prior = {c: prior_weight * w / total for c, w in prior}
        self._counts: dict[PodClass, float] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._remember = remember
        self.max_tracked = max(2, max_tracked)
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

    def demand_by_models(self) -> dict[tuple[str, ...], float]:
        """Expected GPU demand per GPU pod by allowed models, over every class seen (not
        only the published ones: pods limited to models spread over many small classes)."""
        counts = dict(self._prior)
        for c, n in self._counts.items():
            counts[c] = counts.get(c, 0.0) + n
        return _demand_by_models(counts.items())

    def observe(self, request: PodRequest) -> bool:
        """Count one pod; True when the published workload changed."""
        if request.uid:
            if request.uid in self._seen:
                return False
            self._seen[request.uid] = None
            if len(self._seen) > self._remember:
                self._seen.popitem(last=False)
        cls = PodClass.of(request, self.host_memory)
        count = self._counts.get(cls)
        if count is None and len(self._counts) >= self.max_tracked:
            self._drop_rare()
        self._counts[cls] = (count or 0.0) + 1.0
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

    @property
    def tracked(self) -> int:
        """Pod classes counted now."""
        return len(self._counts)

    def _drop_rare(self) -> None:
        """Keep the more popular half of the counted classes (ties as `from_counts`)."""
        ranked = sorted(self._counts.items(), key=lambda kv: (kv[1], _tie_key(kv[0])))
        for pod_class, _ in ranked[: len(ranked) - self.max_tracked // 2]:
            del self._counts[pod_class]
