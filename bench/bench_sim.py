"""Simulator speed and a quick look at scheduling quality on the openb default trace.

- replay time of one seed (the paper's protocol, about 10,800 pods on 1,213 nodes) for
  tessera's default policy and for FGD, in one process (one core), as CPU time (median
  over the seeds run);
- unallocated GPU % at 100% arrived for FGD and tessera's policy over a few seeds (one in
  quick mode); the full table over seeds 42..51 is `make sim-table`.
"""

from __future__ import annotations

import statistics
import time

from bench.common import BenchContext, Result
from tessera.resources import DEFAULT_POLICY
from tessera_sim import metrics
from tessera_sim.runner import NODE_FILE, POD_PREFIX, Trace, run_one


def run(ctx: BenchContext) -> list[Result]:
    nodes = ctx.openb / NODE_FILE
    pods = ctx.openb / f"{POD_PREFIX}default.csv"
    if not nodes.exists() or not pods.exists():
        return [Result("openb traces not found (skipped)", 0, "", note=str(ctx.openb))]
    trace = Trace.load(nodes, pods)
    seeds = ctx.sized(quick=(42,), full=(42, 43, 44))
    results: list[Result] = []
    for policy in (DEFAULT_POLICY, "fgd"):
        # CPU time of the one process: on a shared machine the wall clock also counts
        # the time other processes hold the core
        runs, cpu = [], []
        for seed in seeds:
            start = time.process_time()
            runs.append(run_one(trace, policy, seed))
            cpu.append(time.process_time() - start)
        results.append(
            Result(
                f"replay one seed, default trace, {policy} (CPU time)",
                statistics.median(cpu),
                "s",
                3.0 if policy == DEFAULT_POLICY else None,
                note=(
                    f"{runs[0].pods} pods, median over seeds {', '.join(map(str, seeds))} "
                    f"(CPU {', '.join(f'{c:.2f}' for c in cpu)} s; wall "
                    f"{', '.join(f'{r.seconds:.2f}' for r in runs)} s), one process"
                ),
            )
        )
        values = [metrics.unallocated_at(r) for r in runs]
        results.append(
            Result(
                f"unallocated GPU % at 100% arrived, default trace, {policy}",
                statistics.fmean(values),
                "%",
                note=f"mean of seeds {', '.join(map(str, seeds))}",
            )
        )
    return results
