"""A lower bound on the GPU that must sit idle at 100% arrived if every GPU share is placed.

For each trace and seed, take the GPU-share pods that have arrived when the arrived GPU
request reaches 100% of the cluster (the simulator's arrival order), and solve the linear
relaxation of packing them into GPUs (Gilmore-Gomory cutting-stock LP, by column
generation; its optimum is a lower bound on the number of GPUs any packing needs). The
GPUs those shares occupy minus the shares themselves is idle capacity, so it bounds the
unallocated GPU at 100% from below for any policy that does not leave share pods
unplaced. Needs scipy (not a tessera dependency):

    python3 docs/fragmentation/share_packing_bound.py ../shared/data/openb > bound.json
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from scipy.optimize import linprog

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tessera.sim.replay import arrival_order
from tessera.sim.runner import NODE_FILE, OPENB_TRACES, POD_PREFIX
from tessera.sim.trace import load_nodes, load_pods


def lp_gpus(shares_pct: list[int]) -> float:
    """LP lower bound on the GPUs needed to pack shares given in percent of a GPU."""
    count = Counter(shares_pct)
    sizes = sorted(count)
    demand = np.asarray([count[s] for s in sizes], dtype=float)
    patterns = [
        [(100 // s if j == i else 0) for j in range(len(sizes))] for i, s in enumerate(sizes)
    ]
    while True:
        a = np.asarray(patterns, dtype=float).T
        res = linprog(
            np.ones(len(patterns)), A_ub=-a, b_ub=-demand, bounds=(0, None), method="highs"
        )
        duals = -res.ineqlin.marginals
        best = [0.0] * 101
        take: list[int | None] = [None] * 101
        for cap in range(1, 101):
            best[cap], take[cap] = best[cap - 1], None
            for i, s in enumerate(sizes):
                if s <= cap and best[cap - s] + duals[i] > best[cap] + 1e-12:
                    best[cap], take[cap] = best[cap - s] + duals[i], i
        if best[100] <= 1 + 1e-9:
            return float(res.fun)
        pattern = [0] * len(sizes)
        cap = 100
        while cap > 0:
            i = take[cap]
            if i is None:
                cap -= 1
            else:
                pattern[i] += 1
                cap -= sizes[i]
        patterns.append(pattern)


def main() -> None:
    openb = Path(sys.argv[1])
    nodes = load_nodes(openb / NODE_FILE)
    capacity = 1000 * sum(n.gpus for n in nodes)
    out = {}
    for trace in OPENB_TRACES:
        pods = load_pods(openb / f"{POD_PREFIX}{trace}.csv")
        bounds = []
        for seed in range(42, 52):
            arrived = 0
            shares: list[int] = []
            for pod in arrival_order(pods, seed, capacity):
                arrived += pod.gpu_milli_total
                if pod.is_share:
                    shares.append(pod.gpu_milli // 10)
                if round(100 * arrived / capacity) >= 100:
                    break
            gpus = math.ceil(lp_gpus(shares) - 1e-6)
            bounds.append(100 * (gpus - sum(shares) / 100) / (capacity / 1000))
        out[trace] = {
            "mean": round(statistics.fmean(bounds), 3),
            "per_seed": [round(b, 3) for b in bounds],
        }
        print(trace, out[trace]["mean"], file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
