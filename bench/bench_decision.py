"""Decision latency: fit and score one pod on every node, as the extender's filter +
prioritize do (`Decider.evaluate`), on a half-full cluster of 8-GPU nodes.

The cluster is filled to half its GPUs with pods drawn from an openb-like mix (one-GPU,
GPU shares of several sizes, multi-GPU, CPU-only), placed by the policy itself. Then a
stream of further pods is decided one at a time; each decided pod is bound (so the next
decision sees a changed node, as in a live cluster) and the state is kept near half full
by removing a random earlier pod. Only the decision is timed. A warm-up of 100 decisions
runs first; the first decision of each new pod shape after that is a cache miss and is
included in the figures.
"""

from __future__ import annotations

import random
import resource
import time

from bench.common import BenchContext, Result, percentile
from tessera.cluster_decision import Decider
from tessera.cluster_state import ClusterState
from tessera.model import Gpu, NodeInventory
from tessera.node_placement import Placement
from tessera.node_state import HostCapacity
from tessera.policy_registry import make_policy
from tessera.request import PodRequest
from tessera.resources import DEFAULT_POLICY, POLICY_BINPACK
from tessera_sim.trace import TracePod

MODELS = (("G2", 20000), ("V100M32", 32768), ("T4", 16384))


def _inventory(i: int) -> NodeInventory:
    model, mem = MODELS[i % 7 % 3]
    name = f"node-{i:05d}"
    gpus = tuple(
        Gpu(f"{name}-g{s}", s, s, model, mem, pci_bus_id=f"0000:{s + 1:02x}:00.0") for s in range(8)
    )
    return NodeInventory(name, gpus)


def _pod(rng: random.Random, i: int) -> PodRequest:
    r = rng.random()
    cpu = rng.choice((4000, 8000, 12000, 16000))
    if r < 0.12:
        pod = TracePod(f"p{i}", rng.choice((8000, 16000, 32000)), 32768, 0, 0)
    elif r < 0.50:
        milli = rng.choice((810, 470, 320, 650, 230, 460, 590, 160, 550, 220))
        pod = TracePod(f"p{i}", rng.choice((3000, 4000, 8000)), 16384, 1, milli)
    elif r < 0.96:
        pod = TracePod(f"p{i}", cpu, 32768, 1, 1000)
    else:
        k = rng.choice((2, 4, 8))
        pod = TracePod(f"p{i}", 11000 * k, 32768 * k, k, 1000)
    return pod.request(f"uid-{i}")


def _cluster(nodes: int, policy_name: str, rng: random.Random) -> tuple[Decider, ClusterState]:
    state = ClusterState()
    for i in range(nodes):
        state.set_node(_inventory(i), HostCapacity(96000, 786432))
    policy = make_policy(policy_name)
    decider = Decider(state, {policy.name: policy}, policy.name)
    return decider, state


def _bind(
    decider: Decider, state: ClusterState, request: PodRequest, scores: dict[str, float]
) -> None:
    if not scores:
        return
    best = max(scores.values())
    node = min(n for n, s in scores.items() if s == best)
    placed = decider.place(request, node)
    if isinstance(placed, Placement):
        state.add(placed.allocation)


def measure(nodes: int, policy_name: str, decisions: int) -> list[float]:
    rng = random.Random(7)
    decider, state = _cluster(nodes, policy_name, rng)
    capacity = 8 * nodes
    used = 0.0
    i = 0
    while used < capacity / 2:  # fill to half (not timed)
        request = _pod(rng, i)
        i += 1
        ranking = decider.rank(request)
        if ranking.rows.size:
            row = int(ranking.rows[ranking.scores.argmax()])
            placed = decider.place(request, decider.index.names[row] or "")
            if isinstance(placed, Placement):
                state.add(placed.allocation)
                used += request.gpu_demand
    samples: list[float] = []
    for k in range(decisions + 100):
        request = _pod(rng, i)
        i += 1
        t0 = time.perf_counter()
        evaluation = decider.evaluate(request)
        elapsed = time.perf_counter() - t0
        if k >= 100:
            samples.append(elapsed)
        _bind(decider, state, request, evaluation.scores)
        if state.pods:  # keep the cluster near half full
            state.remove(rng.choice(list(state.pods)))
    return samples


def run(ctx: BenchContext) -> list[Result]:
    results: list[Result] = []
    # (nodes, target p99 ms, decisions measured)
    sizes = (
        (500, 2.0, ctx.sized(quick=500, full=2000)),
        (5000, 10.0, ctx.sized(quick=200, full=1000)),
    )
    for nodes, target, decisions in sizes:
        for policy in (DEFAULT_POLICY, POLICY_BINPACK):
            samples = measure(nodes, policy, decisions)
            ms = [s * 1000 for s in samples]
            results.append(
                Result(
                    f"decision p99, {nodes} nodes x 8 GPUs, {policy}",
                    percentile(ms, 99),
                    "ms",
                    target,
                    note=(
                        f"p50 {percentile(ms, 50):.2f} ms, max {max(ms):.2f} ms over "
                        f"{len(ms)} decisions (Decider.evaluate, half-full cluster)"
                    ),
                )
            )
            if nodes == 500 and policy == DEFAULT_POLICY:
                results.append(
                    Result(
                        f"decisions per second, {nodes} nodes x 8 GPUs, {policy}, one core",
                        len(samples) / sum(samples),
                        "/s",
                        300.0,
                        lower_is_better=False,
                        note="Decider.evaluate back to back in one thread (binds excluded)",
                    )
                )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results.append(Result("peak RSS of the decision benchmark", rss, "MiB"))
    return results


if __name__ == "__main__":
    import sys
    from pathlib import Path

    for r in run(BenchContext(Path("."), quick="--quick" in sys.argv)):
        print(r.name, r.measured_text(), r.target_text(), r.note)
