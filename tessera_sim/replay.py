"""The paper's replay protocol, run through tessera's core.

For one seed: the trace's pods sorted by name, then shuffled with the seed; then pods drawn
uniformly with replacement from the trace are appended until the total GPU request would
pass 130% of the cluster's GPU capacity (a trace that already asks for more loses random
pods until it does not). Pods arrive one at a time and never leave; each is placed by the
policy (the Decider ranks every node, the best score wins, and the exact placement is
committed; among nodes with the best score the first one in a node order drawn for the
seed wins, as in the paper's simulator, whose kube-scheduler fork takes the first node
by name "for reproducibility" after giving every node a random per-seed name prefix) or
dropped when no
node fits it, GPUs, host CPU and host memory alike. After every pod the arrived and the
allocated GPU are recorded, and the cluster's fragmentation rate (the paper's measure).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from tessera.allocation import PodAllocation
from tessera.cluster_decision import Decider
from tessera.cluster_state import ClusterState
from tessera.fragmentation import FragmentMeasure, Workload
from tessera.node_placement import NoFit
from tessera.node_state import HostCapacity
from tessera.request import PodRequest
from tessera.scoring_policy import Policy
from tessera_sim.trace import GPU_MEMORY_MIB, TraceNode, TracePod

FloatArray = npt.NDArray[np.float64]
INFLATION = 1.3
"""Arrivals stop before the GPU request passes 130% of capacity."""
TIE_RULES = ("order", "name", "random")
"""Among nodes with the best score: the first in a node order drawn per seed (the paper's
simulator, the default), the first by name, or a random one (kube-scheduler's rule)."""


@dataclass(frozen=True)
class Arrival:
    pod: TracePod
    request: PodRequest


def arrival_order(pods: Sequence[TracePod], seed: int, capacity_milli: int) -> list[TracePod]:
    """The pods in arrival order for one seed (see the module docstring)."""
    ordered = sorted(pods, key=lambda p: p.name)
    rng = random.Random(seed)
    sequence = list(ordered)
    rng.shuffle(sequence)
    total = sum(p.gpu_milli_total for p in sequence)
    target = INFLATION * capacity_milli
    while total > target and sequence:
        total -= sequence.pop(rng.randrange(len(sequence))).gpu_milli_total
    if not any(p.gpu_milli_total for p in ordered):
        return sequence
    drawn = 0
    while True:
        pod = ordered[rng.randrange(len(ordered))]
        if total + pod.gpu_milli_total > target:
            break
        sequence.append(replace(pod, name=f"{pod.name}-tuned-{drawn}"))
        total += pod.gpu_milli_total
        drawn += 1
    return sequence


@dataclass
class RunResult:
    """What one replay recorded, one entry per arrived pod."""

    policy: str
    seed: int
    capacity_milli: int
    arrived_milli: npt.NDArray[np.int64]
    allocated_milli: npt.NDArray[np.int64]
    frag_milli: FloatArray
    idle_milli: FloatArray
    placed: npt.NDArray[np.bool_]
    seconds: float
    decision_seconds: list[float] = field(default_factory=list)
    placements: list[tuple[str, tuple[int, ...]] | None] = field(default_factory=list)
    """Per arrived pod: the node and the GPU indices it got (a GPU once per grant), or
    None when it found no place."""

    @property
    def pods(self) -> int:
        return int(self.placed.size)

    @property
    def failed(self) -> int:
        return int((~self.placed).sum())


class Replayer:
    """Builds the cluster once per run and replays arrivals through a Decider."""

    def __init__(
        self,
        nodes: Sequence[TraceNode],
        measure_workload: Workload,
        memory_mode: str = "share",
        ties: str = "order",
        host: bool = True,
    ) -> None:
        """`host=False`: nodes' host CPU and memory are not tracked (a cluster whose
        scheduler leaves them to kube-scheduler), so only GPUs decide fit and score."""
        self.host = host
        if ties not in TIE_RULES:
            raise ValueError(f"ties must be one of {', '.join(TIE_RULES)}, got {ties!r}")
        self.ties = ties
        self.nodes = list(nodes)
        self.capacity_milli = 1000 * sum(n.gpus for n in self.nodes)
        self.measure_workload = measure_workload
        self.memory_mode = memory_mode
        self.reference_mib = reference_gpu_memory(self.nodes)
        self._requests: dict[tuple[object, ...], PodRequest] = {}

    def request(self, pod: TracePod, uid: str) -> PodRequest:
        # pods with equal resources parse alike but for their name and UID
        key = (pod.num_gpu, pod.gpu_milli, pod.cpu_milli, pod.memory_mib, pod.gpu_spec)
        base = self._requests.get(key)
        if base is None:
            base = pod.request(uid, self.memory_mode, self.reference_mib)
            self._requests[key] = base
        # a copy with the pod's own name and UID (dataclasses.replace would re-run
        # __init__ for every arrival, copy.copy goes through pickling's protocol; the
        # parsed fields are shared and immutable)
        request: PodRequest = object.__new__(PodRequest)
        fields = request.__dict__
        fields.update(base.__dict__)
        fields["name"] = pod.name
        fields["uid"] = uid
        return request

    def run(
        self,
        policy: Policy,
        pods: Sequence[TracePod],
        seed: int,
        time_decisions: bool = False,
        progress: Callable[[int, int], None] | None = None,
        inspect: Callable[[ClusterState], None] | None = None,
    ) -> RunResult:
        """Replay `pods` in order; `inspect` is handed the cluster after the last one."""
        start = time.perf_counter()
        state = ClusterState()
        for node in self.nodes:
            if self.host:
                state.set_node(node.inventory(), HostCapacity(node.cpu_milli, node.memory_mib))
            else:
                state.set_node(node.inventory())
        decider = Decider(state, {policy.name: policy}, policy.name)
        index = decider.index
        measure = FragmentMeasure(self.measure_workload, count_host_classes=True)
        names = [n.name for n in self.nodes]
        order_of = node_order(names, seed, self.ties)
        name_rank = np.zeros(index.capacity_rows, dtype=np.int64)
        for n, row in index.row_of.items():
            name_rank[row] = order_of[n]
        node_pos = {n: i for i, n in enumerate(names)}
        frag = np.asarray([_node_fragment(measure, state, n) for n in names], dtype=np.float64)
        idle = np.asarray([float(sum(state.nodes[n].free_core)) for n in names])
        frag_sum = float(frag.sum())
        idle_sum = float(idle.sum())

        tie_rng = np.random.default_rng(seed)
        # policies that keep their own record of what runs where (GpuClustering)
        bound = getattr(policy, "bound", None)
        count = len(pods)
        arrived = np.zeros(count, dtype=np.int64)
        allocated = np.zeros(count, dtype=np.int64)
        frag_rec = np.zeros(count, dtype=np.float64)
        idle_rec = np.zeros(count, dtype=np.float64)
        placed = np.zeros(count, dtype=np.bool_)
        decision_seconds: list[float] = []
        where: list[tuple[str, tuple[int, ...]] | None] = []
        arrived_total = allocated_total = 0
        for i, pod in enumerate(pods):
            request = self.request(pod, f"{seed}-{i}")
            arrived_total += pod.gpu_milli_total
            t0 = time.perf_counter() if time_decisions else 0.0
            ranking = decider.rank(request)
            chosen: str | None = None
            if ranking.rows.size:
                best = ranking.scores.max()
                top = ranking.rows[ranking.scores == best]
                if top.size == 1:
                    row = int(top[0])
                elif self.ties != "random":
                    row = int(top[name_rank[top].argmin()])
                else:
                    row = int(top[tie_rng.integers(top.size)])
                chosen = index.names[row]
            if time_decisions:
                decision_seconds.append(time.perf_counter() - t0)
            if chosen is not None:
                placement = decider.place(request, chosen, scored=False)
                if isinstance(placement, NoFit):
                    raise RuntimeError(
                        f"{pod.name}: ranked {chosen} but placing it failed: {placement.reason}"
                    )
                state.add(placement.allocation)
                if bound is not None:
                    bound(chosen, request)
                where.append((chosen, _gpu_indices(placement.allocation)))
                allocated_total += pod.gpu_milli_total
                placed[i] = True
                pos = node_pos[chosen]
                new_frag = _node_fragment(measure, state, chosen)
                new_idle = float(sum(state.nodes[chosen].free_core))
                frag_sum += new_frag - frag[pos]
                idle_sum += new_idle - idle[pos]
                frag[pos] = new_frag
                idle[pos] = new_idle
            else:
                where.append(None)
            arrived[i] = arrived_total
            allocated[i] = allocated_total
            frag_rec[i] = frag_sum * 10
            idle_rec[i] = idle_sum * 10
            if progress is not None and (i + 1) % 1000 == 0:
                progress(i + 1, count)
        if inspect is not None:
            inspect(state)
        return RunResult(
            policy=policy.name,
            seed=seed,
            capacity_milli=self.capacity_milli,
            arrived_milli=arrived,
            allocated_milli=allocated,
            frag_milli=frag_rec,
            idle_milli=idle_rec,
            placed=placed,
            seconds=time.perf_counter() - start,
            decision_seconds=decision_seconds,
            placements=where,
        )


def _gpu_indices(allocation: PodAllocation) -> tuple[int, ...]:
    return tuple(g.index for c in allocation.containers if c.counted for g in c.gpus)


def node_order(names: Sequence[str], seed: int, ties: str = "order") -> dict[str, int]:
    """Each node's rank for breaking equal scores: by name ("name"), or in an order drawn
    per seed ("order": the paper's simulator names every node with a random per-seed
    prefix, then takes the first name, which is this)."""
    ordered = sorted(names)
    if ties == "order":
        random.Random(f"node-order-{seed}").shuffle(ordered)
    return {n: i for i, n in enumerate(ordered)}


def _node_fragment(measure: FragmentMeasure, state: ClusterState, name: str) -> float:
    node = state.nodes[name]
    return measure.fragment(node, node.gpu_free, node.cpu_free, None)


def reference_gpu_memory(nodes: Sequence[TraceNode]) -> int:
    """GPU memory of the cluster's most common GPU model (the memory extension's basis)."""
    counts: dict[str, int] = {}
    for n in nodes:
        if n.gpus:
            counts[n.model] = counts.get(n.model, 0) + n.gpus
    if not counts:
        return 16 * 1024
    model = max(sorted(counts), key=lambda m: counts[m])
    return GPU_MEMORY_MIB.get(model, 16 * 1024)
