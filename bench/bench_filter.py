"""The extender's filter decision, in process: `Extender.filter` on a decoded body, no HTTP.

The cluster is 5,000 nodes of 8x H100 SXM with 4 RDMA NICs each (as their agents publish
them), about half of the GPU capacity held by a mix of whole GPUs and shares, and the
scheduler's default policy. A stream of varied pods is filtered one at a time with the
default `--filter-answer=best`, as kube-scheduler sends them: a new pod each time, its body
freshly decoded from JSON, with the node names its own filters passed. Each pod belongs to
one of 24 jobs, each job with its own shape drawn from a mix (GPU shares by percent or by
GiB, one to eight whole GPUs, host CPU and memory beside them). The names are 500 (what
kube-scheduler's adaptive percentageOfNodesToScore lets it find at 5,000 nodes: a window
that moves on from pod to pod) or all 5,000. After each filter (not timed) the pod is
bound to the answered node and a random earlier bench pod is deleted, so every decision
sees changed nodes as in a live cluster. The filter's thread CPU (`time.thread_time`) and
wall time are recorded; the first 250 pods are a warm-up and are not counted (the policy
learns the workload from the first pods it sees, as a freshly started scheduler does).

Then the same in `make bench-scale`'s pattern (`scale_pattern`): its four pod shapes in turn,
windows of 500 names moving on by about 500 from pod to pod, p50 per shape.

`python -m bench.bench_filter [--quick] [--profile FILE]`: with --profile, a cProfile of
the 500-name filters goes to FILE (read it with `python -m pstats FILE`).
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import BenchContext, Result, percentile

NODES = 5000
WARMUP = 250
JOBS = 24
GIB = 1024


def cluster(nodes: int = NODES) -> Any:
    """A Cache with `nodes` half-full 8x H100 nodes under the default policy."""
    from bench.bench_scheduler import half_full_cache
    from scheduler_plugin.state.cache import Cache
    from tessera.resources import DEFAULT_POLICY

    return half_full_cache(nodes, cache=Cache(DEFAULT_POLICY, require_heartbeat=True))


def pod_limits(rng: random.Random) -> dict[str, str]:
    """One container's limits: shares by percent (compute and memory ratio) or by GiB of
    GPU memory, and whole GPUs, with host CPU and memory."""
    from tessera import resources as rn

    r = rng.random()
    limits = {
        "cpu": rng.choice(("2", "4", "8", "16")),
        "memory": rng.choice(("8Gi", "16Gi", "32Gi")),
    }
    if r < 0.35:
        pct = rng.choice((10, 20, 25, 30, 50, 70))
        limits |= {rn.GPU_CORE: str(pct), rn.GPU_MEMORY_RATIO: str(pct)}
    elif r < 0.55:
        limits |= {
            rn.GPU_CORE: str(rng.choice((20, 30, 50))),
            rn.GPU_MEMORY: str(rng.choice((10, 20, 40))),
        }
    elif r < 0.85:
        limits |= {rn.GPU: "100"}
    else:
        limits |= {rn.GPU: str(100 * rng.choice((2, 4, 8)))}
    return limits


def pod(i: int, limits: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"bench-{i}",
            "namespace": "default",
            "uid": f"bench-uid-{i}",
            "resourceVersion": str(1000 + i),
        },
        "spec": {
            "containers": [{"name": "main", "resources": {"limits": limits, "requests": limits}}]
        },
    }


def measure(
    cache: Any,
    names: int,
    pods: int,
    seed: int,
    around: Callable[..., Any] | None = None,
) -> tuple[list[float], list[float], list[str]]:
    """(thread CPU ms, wall ms, answered node) of each counted filter call with `names`
    node names; `around` (a profiler's `runcall`) makes each timed call when given."""
    from scheduler_plugin.decisions.extender import Extender
    from scheduler_plugin.state.values import Assumed
    from scheduler_plugin.views.metrics import Metrics

    metrics = Metrics()
    metrics.attach(cache)
    extender = Extender(cache, metrics, answer="best")
    rng = random.Random(seed)
    jobs = [pod_limits(rng) for _ in range(JOBS)]
    every = cache.node_names()
    start = rng.randrange(len(every))
    placed: list[tuple[str, str]] = []
    cpu: list[float] = []
    wall: list[float] = []
    answers: list[str] = []
    for i in range(pods + WARMUP):
        start = (start + rng.randrange(1, 2 * names)) % len(every)
        window = (every[start:] + every[:start])[:names]
        limits = rng.choice(jobs)
        body = {"Pod": pod(seed * 100000 + i, limits), "Nodes": None, "NodeNames": window}
        body = json.loads(json.dumps(body))  # fresh strings, as the server decodes them
        c0, w0 = time.thread_time(), time.perf_counter()
        reply = extender.filter(body) if around is None else around(extender.filter, body)
        w1, c1 = time.perf_counter(), time.thread_time()
        chosen = reply["NodeNames"]
        if i >= WARMUP:
            cpu.append((c1 - c0) * 1000)
            wall.append((w1 - w0) * 1000)
            answers.append(chosen[0] if chosen else "")
        # bind to the answer, then delete a random earlier bench pod (not timed)
        meta = body["Pod"]["metadata"]
        request = extender.remembered(meta["uid"])
        if chosen and request is not None:
            outcome = cache.pods.assume(request, chosen[0])
            if isinstance(outcome, Assumed):
                cache.pods.bind(meta["uid"])
                placed.append((meta["uid"], f"default/{meta['name']}"))
        extender.forget(meta["uid"])
        if placed and rng.random() < 0.9:
            cache.pods.deleted(*placed.pop(rng.randrange(len(placed))))
    return cpu, wall, answers


def scale_pattern(cache: Any, pods: int) -> dict[str, list[float]]:
    """Thread CPU ms of each counted filter call in `make bench-scale`'s pattern, per pod
    shape: its four shapes in turn (bench/scale_common.py), 500 names in a window that
    moves on by about 500 names from pod to pod (kube-scheduler starts where the last
    search stopped), each answer bound, nothing deleted (as in a round)."""
    from bench.scale_common import SHAPES
    from scheduler_plugin.decisions.extender import Extender
    from scheduler_plugin.state.values import Assumed
    from scheduler_plugin.views.metrics import Metrics

    metrics = Metrics()
    metrics.attach(cache)
    extender = Extender(cache, metrics, answer="best")
    rng = random.Random(7)
    every = cache.node_names()
    start = 0
    out: dict[str, list[float]] = {}
    for i in range(pods + WARMUP):
        window = (every[start:] + every[:start])[:500]
        start = (start + 500 + rng.randrange(16)) % len(every)
        limits = SHAPES[i % len(SHAPES)]
        body = {"Pod": pod(900000 + i, dict(limits)), "Nodes": None, "NodeNames": window}
        body = json.loads(json.dumps(body))
        c0 = time.thread_time()
        reply = extender.filter(body)
        c1 = time.thread_time()
        if i >= WARMUP:
            out.setdefault(",".join(f"{k}={v}" for k, v in limits.items()), []).append(
                (c1 - c0) * 1000
            )
        meta = body["Pod"]["metadata"]
        request = extender.remembered(meta["uid"])
        chosen = reply["NodeNames"]
        if (
            chosen
            and request is not None
            and isinstance(cache.pods.assume(request, chosen[0]), Assumed)
        ):
            cache.pods.bind(meta["uid"])
        extender.forget(meta["uid"])
    return out


def _results(names: int, cpu: list[float], wall: list[float], target: float) -> list[Result]:
    note = (
        f"{NODES} nodes x 8 H100 + 4 RDMA NICs, half full, default policy, "
        f"--filter-answer=best; {len(cpu)} varied pods; p50 {percentile(cpu, 50):.3f} ms, "
        f"max {max(cpu):.2f} ms thread CPU; wall p50 {percentile(wall, 50):.3f} ms, "
        f"p99 {percentile(wall, 99):.3f} ms (Extender.filter in process, no HTTP)"
    )
    return [
        Result(
            f"filter decision p50, {names} names of {NODES} nodes",
            percentile(cpu, 50),
            "ms CPU",
            target,
            note=note,
        ),
        Result(
            f"filter decision p99, {names} names of {NODES} nodes",
            percentile(cpu, 99),
            "ms CPU",
        ),
    ]


def run(ctx: BenchContext) -> list[Result]:
    pods = ctx.sized(quick=100, full=400)
    cache = cluster()
    results = []
    for names, target in ((500, 0.4), (NODES, 2.0)):
        cpu, wall, _ = measure(cache, names, pods, seed=names)
        results += _results(names, cpu, wall, target)
    for shape, cpu in scale_pattern(cluster(), pods).items():
        results.append(
            Result(
                f"filter decision p50, bench-scale pattern, {shape}",
                percentile(cpu, 50),
                "ms CPU",
                note=f"500 names of {NODES} nodes; {len(cpu)} pods of this shape; p90 "
                f"{percentile(cpu, 90):.3f} ms thread CPU (Extender.filter in process)",
            )
        )
    return results


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    if "--profile" in argv:
        import cProfile

        profiler = cProfile.Profile()
        cache = cluster()
        measure(cache, 500, 100 if quick else 400, 500, around=profiler.runcall)
        profiler.dump_stats(argv[argv.index("--profile") + 1])
        return
    for r in run(BenchContext(Path("."), quick=quick)):
        print(f"{r.name}: {r.measured_text()} (target {r.target_text()}) {r.note}")


if __name__ == "__main__":
    main(sys.argv[1:])
