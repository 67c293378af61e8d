"""A small built-in cluster and workload, for the demo and the tests (no external data).

The shape follows the openb traces, scaled down: mostly 8-GPU nodes with 12 cores per GPU,
some CPU-rich 2-GPU nodes and 4-GPU nodes; pods are one-GPU, GPU shares (a few sizes,
some large ones that leave hard-to-use leftovers), multi-GPU and CPU-only.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence

from tessera.resources import DEFAULT_POLICY
from tessera_sim.metrics import Summary, summarize
from tessera_sim.runner import Trace, run_one
from tessera_sim.trace import TraceNode, TracePod

SYNTHETIC_POLICIES = ("random", "bestfit", "fgd", DEFAULT_POLICY)

_SHARES = ((810, 14), (470, 10), (650, 3), (320, 4), (230, 2), (160, 1), (550, 1))
"""(gpu_milli, weight) of the GPU-share pods."""


def synthetic_nodes(nodes: int = 48, seed: int = 0) -> list[TraceNode]:
    """A cluster of `nodes` nodes (sorted names): 70% 8-GPU, 20% 2-GPU CPU-rich, 10% 4-GPU."""
    rng = random.Random(seed)
    out: list[TraceNode] = []
    for i in range(nodes):
        r = rng.random()
        if r < 0.7:
            node = TraceNode(f"syn-node-{i:04d}", 96_000, 393_216, 8, "G2")
        elif r < 0.9:
            node = TraceNode(f"syn-node-{i:04d}", 104_000, 524_288, 2, "T4")
        else:
            node = TraceNode(f"syn-node-{i:04d}", 32_000, 131_072, 4, "V100M16")
        out.append(node)
    return out


def synthetic_pods(gpus: int, seed: int = 0) -> list[TracePod]:
    """Pods asking for about 95% of `gpus` GPUs."""
    rng = random.Random(seed)
    pods: list[TracePod] = []
    total = 0
    target = 950 * gpus
    i = 0
    while total < target:
        r = rng.random()
        cpu = rng.choice((4000, 8000, 12000, 12000, 16000))
        if r < 0.13:
            pod = TracePod(f"syn-pod-{i:05d}", rng.choice((8000, 16000, 32000)), 32768, 0, 0)
        elif r < 0.50:
            milli = rng.choices([m for m, _ in _SHARES], [w for _, w in _SHARES])[0]
            pod = TracePod(
                f"syn-pod-{i:05d}", rng.choice((3000, 4000, 8000, 12000)), 16384, 1, milli
            )
        elif r < 0.96:
            pod = TracePod(f"syn-pod-{i:05d}", cpu, 32768, 1, 1000)
        else:
            count = rng.choice((2, 4, 8))
            pod = TracePod(f"syn-pod-{i:05d}", 11_000 * count, 32768 * count, count, 1000)
        pods.append(pod)
        total += pod.gpu_milli_total
        i += 1
    return pods


def synthetic_trace(nodes: int = 48, seed: int = 0) -> Trace:
    cluster = synthetic_nodes(nodes, seed)
    pods = synthetic_pods(sum(n.gpus for n in cluster), seed)
    return Trace("synthetic", tuple(cluster), tuple(pods))


def run_synthetic(
    policy_names: Sequence[str] = SYNTHETIC_POLICIES,
    seed: int = 42,
    seeds: int = 3,
    nodes: int = 48,
) -> list[Summary]:
    """Replay the synthetic trace with each policy over `seeds` seeds from `seed` on."""
    trace = synthetic_trace(nodes)
    out = []
    for name in policy_names:
        runs = [run_one(trace, name, s) for s in range(seed, seed + seeds)]
        out.append(summarize(name, trace.name, runs))
    return out


def main(argv: list[str] | None = None) -> int:
    from tessera_sim.cli import format_table

    del argv
    print(format_table(run_synthetic()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
