"""Running policies over traces and seeds: what the CLI, the table and the benchmarks share."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.fragmentation import FragmentationPolicy, PodClass, Workload
from tessera.policy_registry import POLICIES
from tessera.resources import DEFAULT_POLICY
from tessera.scoring_policy import Policy
from tessera_sim.metrics import Summary, summarize
from tessera_sim.reference import (
    BESTFIT,
    DOTPROD,
    FGD,
    FGD_COVERAGE,
    RANDOM,
    BestFitPolicy,
    DotProdPolicy,
    FgdPolicy,
    RandomPolicy,
)
from tessera_sim.reference_gpu import (
    GPUCLUSTERING,
    GPUPACKING,
    GpuClusteringPolicy,
    GpuPackingPolicy,
)
from tessera_sim.replay import Replayer, RunResult, arrival_order
from tessera_sim.trace import TraceNode, TracePod, load_nodes, load_pods
from tessera_sim.variants import constrain_models, cpu_heavy, cpu_variant_name, variant_name

DEFAULT_SEEDS = tuple(range(42, 52))
NODE_FILE = "openb_node_list_gpu_node.csv"
POD_PREFIX = "openb_pod_list_"
OPENB_TRACES = (
    "default",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
)
BASELINES = (RANDOM, DOTPROD, GPUCLUSTERING, GPUPACKING, BESTFIT, FGD)
"""The paper's baselines, FGD included, in the order of its table."""
TABLE_POLICIES = (*BASELINES, DEFAULT_POLICY)


OFFLINE = "fragmentation-offline"
"""Tessera's policy given the whole trace's workload up front (a study variant: it peeks
at the future, as FGD does; the default learns online)."""


def policy_names() -> tuple[str, ...]:
    """Every policy the simulator can run: tessera's, the paper's baselines, and the
    offline variant of tessera's."""
    return tuple(POLICIES) + tuple(n for n in BASELINES if n not in POLICIES) + (OFFLINE,)


def trace_name(pods_path: Path | str) -> str:
    stem = Path(pods_path).stem
    return stem.removeprefix(POD_PREFIX)


def parse_seeds(text: str) -> tuple[int, ...]:
    """ "42-51", "42,45,50" or a mix ("42-44,50")."""
    seeds: list[int] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        if "-" in part[1:]:
            lo_text, hi_text = part[0] + part[1:].split("-", 1)[0], part[1:].split("-", 1)[1]
            lo, hi = int(lo_text), int(hi_text)
            if hi < lo:
                raise ValueError(f"empty seed range {part!r}")
            seeds.extend(range(lo, hi + 1))
        else:
            seeds.append(int(part))
    if not seeds:
        raise ValueError("no seeds given")
    return tuple(dict.fromkeys(seeds))


@dataclass(frozen=True)
class Trace:
    name: str
    nodes: tuple[TraceNode, ...]
    pods: tuple[TracePod, ...]

    @classmethod
    def load(cls, nodes_path: Path | str, pods_path: Path | str) -> Trace:
        return cls(
            trace_name(pods_path), tuple(load_nodes(nodes_path)), tuple(load_pods(pods_path))
        )


def trace_classes(
    trace: Trace, memory_mode: str = "share", host_memory: bool = True
) -> Counter[PodClass]:
    """How many pods of the trace fall in each pod class (counted per distinct request,
    so a trace of thousands of pods costs a few hundred parses)."""
    replayer = Replayer(trace.nodes, Workload((), ()), memory_mode)
    by_key = Counter(
        (p.num_gpu, p.gpu_milli, p.cpu_milli, p.memory_mib, p.gpu_spec) for p in trace.pods
    )
    out: Counter[PodClass] = Counter()
    for (num_gpu, gpu_milli, cpu, mem, spec), n in by_key.items():
        pod = TracePod("typical", cpu, mem, num_gpu, gpu_milli, spec)
        out[PodClass.of(replayer.request(pod, "typical"), host_memory)] += n
    return out


def make_policy(name: str, trace: Trace, seed: int, memory_mode: str = "share") -> Policy:
    """A fresh policy for one run. FGD gets the trace's typical pods (as published); every
    other policy sees only what a live scheduler sees."""
    if name == "random":
        return RandomPolicy(seed)
    if name == "dotprod":
        return DotProdPolicy()
    if name == "bestfit":
        return BestFitPolicy()
    if name == GPUPACKING:
        return GpuPackingPolicy()
    if name == GPUCLUSTERING:
        return GpuClusteringPolicy()
    if name == "fgd":
        return FgdPolicy(measure_workload(trace, memory_mode))
    if name == OFFLINE:
        counts = trace_classes(trace, memory_mode)
        return FragmentationPolicy(Workload.from_counts(counts, coverage=0.99))
    if name in POLICIES:
        return POLICIES[name]()
    raise ValueError(f"unknown policy {name!r} (one of {', '.join(policy_names())})")


def measure_workload(trace: Trace, memory_mode: str = "share") -> Workload:
    """The workload the reported fragmentation rate is measured against (the paper's
    typical pods, `fgd_workload`)."""
    counts = trace_classes(trace, memory_mode, host_memory=False)
    return Workload.from_counts(counts, coverage=FGD_COVERAGE)


def run_one(
    trace: Trace,
    policy_name: str,
    seed: int,
    memory_mode: str = "share",
    ties: str = "order",
    time_decisions: bool = False,
) -> RunResult:
    replayer = Replayer(trace.nodes, measure_workload(trace, memory_mode), memory_mode, ties)
    policy = make_policy(policy_name, trace, seed, memory_mode)
    order = arrival_order(trace.pods, seed, replayer.capacity_milli)
    return replayer.run(policy, order, seed, time_decisions=time_decisions)


@dataclass(frozen=True)
class Job:
    nodes_path: str
    pods_path: str
    policy: str
    seed: int
    memory_mode: str = "share"
    ties: str = "order"
    gpuspec: int = 0
    """Percent of GPU pods given a GPU model allow-list (`tessera_sim.variants`); 0: none."""
    cpu: int = 0
    """CPU-only pods' CPU request in percent of the trace's (`variants.cpu_heavy`); 0: as is."""

    @property
    def trace(self) -> str:
        name = trace_name(self.pods_path)
        if self.cpu:
            name = cpu_variant_name(name, self.cpu / 100)
        return variant_name(name, self.gpuspec / 100) if self.gpuspec else name


_TRACES: dict[tuple[str, str, int, int], Trace] = {}


def load_trace(nodes_path: str, pods_path: str, gpuspec: int = 0, cpu: int = 0) -> Trace:
    """A trace, with `cpu` percent of its CPU-only pods' CPU request and `gpuspec` percent
    of its GPU pods limited to GPU models (cached)."""
    key = (nodes_path, pods_path, gpuspec, cpu)
    trace = _TRACES.get(key)
    if trace is None:
        trace = Trace.load(nodes_path, pods_path)
        if cpu:
            trace = Trace(
                cpu_variant_name(trace.name, cpu / 100),
                trace.nodes,
                tuple(cpu_heavy(trace.pods, cpu / 100)),
            )
        if gpuspec:
            trace = Trace(
                variant_name(trace.name, gpuspec / 100),
                trace.nodes,
                tuple(constrain_models(trace.pods, trace.nodes, gpuspec / 100)),
            )
        _TRACES[key] = trace
    return trace


def _run_job(job: Job) -> tuple[Job, RunResult]:
    trace = load_trace(job.nodes_path, job.pods_path, job.gpuspec, job.cpu)
    return job, run_one(trace, job.policy, job.seed, job.memory_mode, job.ties)


def run_jobs(
    jobs: Sequence[Job],
    workers: int = 1,
    done: Callable[[Job, RunResult], None] | None = None,
) -> list[tuple[Job, RunResult]]:
    """Run every job, in worker processes when `workers` > 1 (each runs nice'd)."""
    results: list[tuple[Job, RunResult]] = []
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            item = _run_job(job)
            results.append(item)
            if done is not None:
                done(*item)
        return results
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers, initializer=_nice) as pool:
        for item in pool.imap_unordered(_run_job, jobs):
            results.append(item)
            if done is not None:
                done(*item)
    return results


def _nice() -> None:
    with contextlib.suppress(OSError):
        os.nice(5)


def summarize_jobs(results: Iterable[tuple[Job, RunResult]]) -> list[Summary]:
    """One summary per (trace, policy, memory mode), seeds in order."""
    groups: dict[tuple[str, str, str], list[RunResult]] = {}
    for job, run in results:
        groups.setdefault((job.trace, job.policy, job.memory_mode), []).append(run)
    out = []
    for (trace, policy, memory_mode), runs in groups.items():
        runs.sort(key=lambda r: r.seed)
        out.append(summarize(policy, trace, runs, memory_mode))
    return out
