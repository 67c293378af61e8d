"""The paper's baselines, re-implemented as tessera policies (they run through the core).

Weng et al. (USENIX ATC 2023) compare FGD with Random, DotProd (Tetris), BestFit and a
few GPU-count heuristics in a kube-scheduler based simulator. What carries over from that
simulator, in our own code:

- Node scores are the integers 0..100 a kube-scheduler score plugin returns (here divided
  by 100; truncated as Go truncates); the replay breaks ties among the nodes with the
  highest score (see `tessera_sim.replay`), so truncation to integers matters and is kept.
- Random: every feasible node scores the same; a share goes to a random fitting GPU.
- DotProd: the free vector [host CPU, total free GPU] of the node dotted with the pod's
  request [CPU, GPU], both divided by the largest node (128 cores, 8 GPUs); score =
  100 * (1 - dot / 2). A share goes to the fitting GPU with the least free (best fit).
- BestFit: score = 100 * (1 - (0.5 * (free CPU - CPU) / 128 cores + 0.5 * (free GPU -
  GPU) / 8 GPUs)); best-fit GPU. (Its min-max normalization keeps the argmax set, so it is
  left out.)
- FGD: score = 100 * sigmoid(drop in the node's expected fragment, in GPUs), the fragment
  measured against the trace's typical pods (the most popular (CPU, GPU) classes that make
  up 95% of the pods, CPU-only pods included, which count all idle GPU as fragment). A
  share goes to the GPU with the best score, lowest index first on ties.
GpuPacking and GpuClustering, the paper's two GPU-count heuristics, are in
`tessera_sim.reference_gpu`.

Whole GPUs go to the lowest-indexed free GPUs in every policy (all GPUs of an openb node
are alike, and so is tessera's choice there).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tessera.fragmentation import FragmentMeasure, ShapeCache, Workload
from tessera.node_state import GpuCapacity, NodeState
from tessera.request import PodRequest
from tessera.resources import UNITS_PER_DEVICE
from tessera.scoring_policy import (
    FloatArray,
    IntArray,
    Option,
    Policy,
    VectorCase,
    idle_core,
    restrict_case,
)

if TYPE_CHECKING:
    from tessera.cluster_index import ClusterIndex

MAX_CPU_MILLI = 128_000
"""The largest node's CPU in the paper's normalization."""
MAX_GPU_PERCENT = 8 * UNITS_PER_DEVICE
"""The largest node's GPUs (8), in percent of one GPU."""

RANDOM, DOTPROD, BESTFIT, FGD = "random", "dotprod", "bestfit", "fgd"


def _request_demand(request: PodRequest) -> int:
    total = 0
    for c in request.containers:
        if c.init and not c.sidecar:
            continue
        total += UNITS_PER_DEVICE * c.gpu_count if c.gpu_count else c.core
    return total


def _gpu_free(node: NodeState, core: Sequence[int]) -> int:
    gpus = node.inventory.gpus
    return sum(core[s] for s in range(len(core)) if gpus[s].healthy)


def _cpu(value: int | None) -> int:
    return MAX_CPU_MILLI if value is None else value


def _int_score(x: float) -> float:
    """A kube-scheduler plugin's integer score (0..100, truncated as Go's int64() does),
    as a fraction. BestFit and DotProd compute x with the plugins' own floating-point
    operations in the same order, so the truncation lands where theirs does."""
    return math.floor(x * 100) / 100


def _best_fit_option(node: NodeState, option: Option) -> float:
    return -float(sum(option.core_after))


class ReferencePolicy(Policy):
    """Shared parts: best-fit GPU choice for shares, lowest free GPUs for whole ones."""

    pack_nics = True

    def option_score(self, node: NodeState, free: GpuCapacity, option: Option) -> float:
        return _best_fit_option(node, option)

    def node_score(self, node: NodeState, before: GpuCapacity, after: GpuCapacity) -> float:
        used = _gpu_free(node, before.core) - _gpu_free(node, after.core)
        return self._score(node, before.core, node.cpu_free, 0, used)

    def placement_score(
        self, node: NodeState, request: PodRequest, before: GpuCapacity, after: GpuCapacity
    ) -> float:
        return self._score(
            node, before.core, node.cpu_free, request.cpu_milli, _request_demand(request)
        )

    def _score(
        self, node: NodeState, core: Sequence[int], cpu_free: int | None, cpu: int, gpu: int
    ) -> float:
        raise NotImplementedError


def _key(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _uniform(keys: npt.NDArray[np.uint64]) -> FloatArray:
    """splitmix64's finalizer: well-mixed 64-bit keys -> uniform floats in [0, 1)."""
    with np.errstate(over="ignore"):
        z = keys + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    out: FloatArray = (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return out


class RandomPolicy(ReferencePolicy):
    """Any feasible node, uniformly; a share on a uniformly chosen fitting GPU.

    Each node gets a score drawn uniformly for each pod (a hash of the seed, the pod's UID
    and the node's name, so the vector form and place_pod agree); the best one wins, which
    is a uniform choice among the feasible nodes, as the paper's plugin makes it.
    """

    name = RANDOM
    option_score_draws = True

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self._names: dict[str, int] = {}
        self._pod = 0

    def observe(self, request: PodRequest) -> None:
        self._pod = _key(f"{self.seed}|{request.uid}|{request.key}")

    def _name_key(self, name: str) -> int:
        key = self._names.get(name)
        if key is None:
            key = self._names[name] = _key(name)
        return key

    def placement_score(
        self, node: NodeState, request: PodRequest, before: GpuCapacity, after: GpuCapacity
    ) -> float:
        pod = _key(f"{self.seed}|{request.uid}|{request.key}")
        keys = np.asarray([self._name_key(node.name) ^ pod], dtype=np.uint64)
        return float(_uniform(keys)[0])

    def option_score(self, node: NodeState, free: GpuCapacity, option: Option) -> float:
        # place_pod scores one GPU per group of identical GPUs; the largest of n uniform
        # draws (u ** (1/n)) makes each GPU equally likely, as a uniform pick over GPUs.
        slot = option.slots[0]
        core, mem = free.core, free.mem
        total = node.total_mem
        same = sum(
            1
            for s in range(len(core))
            if core[s] == core[slot] and mem[s] == mem[slot] and total[s] == total[slot]
        )
        return float(self.rng.random() ** (1.0 / max(same, 1)))

    def _score(
        self, node: NodeState, core: Sequence[int], cpu_free: int | None, cpu: int, gpu: int
    ) -> float:
        return 0.5

    def vector_node_scores(
        self, index: ClusterIndex, rows: IntArray, case: VectorCase
    ) -> FloatArray | None:
        names = index.names
        keys = np.asarray(
            [self._name_key(names[r] or "") ^ self._pod for r in rows.tolist()], dtype=np.uint64
        )
        return _uniform(keys)


class DotProdPolicy(ReferencePolicy):
    """Tetris' alignment score on [CPU, GPU], normalized by the largest node."""

    name = DOTPROD

    def _score(
        self, node: NodeState, core: Sequence[int], cpu_free: int | None, cpu: int, gpu: int
    ) -> float:
        dot = (_cpu(cpu_free) / MAX_CPU_MILLI) * (cpu / MAX_CPU_MILLI) + (
            _gpu_free(node, core) / MAX_GPU_PERCENT
        ) * (gpu / MAX_GPU_PERCENT)
        return _int_score(1.0 - dot / 2)

    def vector_node_scores(
        self, index: ClusterIndex, rows: IntArray, case: VectorCase
    ) -> FloatArray | None:
        cpu_free = np.minimum(index.cpu_free[rows], MAX_CPU_MILLI)
        dot = (cpu_free / MAX_CPU_MILLI) * (case.cpu_milli / MAX_CPU_MILLI) + (
            idle_core(index, rows) / MAX_GPU_PERCENT
        ) * (case.core_asked / MAX_GPU_PERCENT)
        out: FloatArray = np.floor((1.0 - dot / 2) * 100) / 100
        return out


class BestFitPolicy(ReferencePolicy):
    """The node left with the least (CPU, GPU), weighted half and half."""

    name = BESTFIT

    def _score(
        self, node: NodeState, core: Sequence[int], cpu_free: int | None, cpu: int, gpu: int
    ) -> float:
        left = (
            0.5 * (_cpu(cpu_free) - cpu) / MAX_CPU_MILLI
            + 0.5 * (_gpu_free(node, core) - gpu) / MAX_GPU_PERCENT
        )
        return _int_score(1.0 - left)

    def vector_node_scores(
        self, index: ClusterIndex, rows: IntArray, case: VectorCase
    ) -> FloatArray | None:
        cpu_free = np.minimum(index.cpu_free[rows], MAX_CPU_MILLI)
        left = (
            0.5 * (cpu_free - case.cpu_milli) / MAX_CPU_MILLI
            + 0.5 * (idle_core(index, rows) - case.core_asked) / MAX_GPU_PERCENT
        )
        out: FloatArray = np.floor((1.0 - left) * 100) / 100
        return out


def _sigmoid(x: float) -> float:
    if x < -700:
        return 0.0
    return 1.0 / (1.0 + math.exp(-x))


class FgdPolicy(Policy):
    """Fragmentation gradient descent as published: score = 100 * sigmoid(drop of the
    expected fragment, in GPUs), integer; the fragment measured against fixed typical
    pods (the trace's)."""

    name = FGD
    pack_nics = True

    def __init__(self, workload: Workload) -> None:
        self.measure = FragmentMeasure(workload, count_host_classes=True)
        self._cache = ShapeCache()

    def _value(self, delta: float) -> float:
        return math.floor(_sigmoid(delta / UNITS_PER_DEVICE) * 100 + 1e-9) / 100

    def option_score(self, node: NodeState, free: GpuCapacity, option: Option) -> float:
        after = free.with_slots(option.slots, option.core_after, option.mem_after)
        delta = self.measure.delta(node, free, after, option.cpu_milli, option.memory_mib)
        return self._value(delta)

    def node_score(self, node: NodeState, before: GpuCapacity, after: GpuCapacity) -> float:
        delta = self.measure.delta(node, before, after, 0, 0)
        return self._value(delta)

    def placement_score(
        self, node: NodeState, request: PodRequest, before: GpuCapacity, after: GpuCapacity
    ) -> float:
        delta = self.measure.delta(node, before, after, request.cpu_milli, request.memory_mib)
        return self._value(delta)

    def vector_node_scores(
        self, index: ClusterIndex, rows: IntArray, case: VectorCase
    ) -> FloatArray | None:
        measure = self.measure

        def compute(sub: IntArray) -> FloatArray:

            delta, _ = measure.vector_deltas(index, sub, restrict_case(case, rows, sub))
            if delta.ndim == 2:
                delta = delta.max(axis=1)
            with np.errstate(over="ignore"):
                value = 1.0 / (1.0 + np.exp(-delta / UNITS_PER_DEVICE))
            out: FloatArray = np.floor(value * 100 + 1e-9) / 100
            return np.where(np.isnan(delta), np.nan, out)

        return self._cache.for_case(index, rows, case, 0, compute)


FGD_COVERAGE = 0.95
"""The paper's typical pods cover this share of the trace's pods."""


def fgd_workload(requests: Iterable[PodRequest]) -> Workload:
    """The paper's typical pods: (CPU, GPU) classes, CPU-only pods included, the most
    popular ones covering 95% of the pods, renormalized."""
    return Workload.from_requests(requests, coverage=FGD_COVERAGE, host_memory=False)


REFERENCE_POLICIES = (RANDOM, DOTPROD, BESTFIT, FGD)
