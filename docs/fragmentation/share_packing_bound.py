"""A lower bound on the GPU that must sit idle at 100% arrived if every GPU share is placed.

For each trace and seed, take the GPU-share pods that have arrived when the arrived GPU
request reaches 100% of the cluster (the simulator's arrival order), and solve the linear
relaxation of packing them into GPUs (Gilmore-Gomory cutting-stock LP, by column
generation; its optimum is a lower bound on the number of GPUs any packing needs). The
GPUs those shares occupy minus the shares themselves is idle capacity, so it bounds the
unallocated GPU at 100% from below for any policy that does not leave share pods
unplaced. Needs scipy (not a tessera dependency):

    python3 docs/fragmentation/share_packing_bound.py OPENB_DIR > bound.json

With `--failing [TRACE]` it computes instead the bound for any policy, shares allowed to
fail (`lp_failed`, `failing_bound`), on one trace (default: the default trace):

    python3 docs/fragmentation/share_packing_bound.py OPENB_DIR --failing default
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import linprog

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tessera_sim.replay import arrival_order
from tessera_sim.runner import NODE_FILE, OPENB_TRACES, POD_PREFIX
from tessera_sim.trace import TracePod, load_nodes, load_pods


def _best_pattern(sizes: list[int], duals: Sequence[float]) -> tuple[float, list[int]]:
    """Column generation's pricing step: the packing of one GPU (100 %) with the most dual
    value, by an unbounded knapsack over the share sizes; (that value, count per size)."""
    best = [0.0] * 101
    take: list[int | None] = [None] * 101
    for cap in range(1, 101):
        best[cap], take[cap] = best[cap - 1], None
        for i, s in enumerate(sizes):
            if s <= cap and best[cap - s] + duals[i] > best[cap] + 1e-12:
                best[cap], take[cap] = best[cap - s] + duals[i], i
    pattern = [0] * len(sizes)
    cap = 100
    while cap > 0:
        i = take[cap]
        if i is None:
            cap -= 1
        else:
            pattern[i] += 1
            cap -= sizes[i]
    return best[100], pattern


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
        value, pattern = _best_pattern(sizes, duals)
        if value <= 1 + 1e-9:
            return float(res.fun)
        patterns.append(pattern)


def lp_failed(shares_pct: list[int], whole_gpus: int, gpus: int) -> float:
    """LP lower bound on the GPU demand (in GPUs) left unplaced when shares may fail.

    Whatever is placed must pack: the placed shares into the GPUs that placed whole-GPU
    pods leave free. Minimize the dropped demand (shares d_i of each size, whole GPUs g)
    over packings x_p of share patterns:
        min sum_i s_i d_i + g   s.t.  sum_p a_ip x_p + d_i >= n_i,  sum_p x_p - g <= gpus - W.
    Host CPU and memory and whole pods' per-node GPU counts are left out, which only
    loosens the bound.
    """
    count = Counter(shares_pct)
    sizes = sorted(count)
    n = np.asarray([count[s] for s in sizes], dtype=float)
    k = len(sizes)
    patterns = [[(100 // s if j == i else 0) for j in range(k)] for i, s in enumerate(sizes)]
    while True:
        a = np.asarray(patterns, dtype=float).T  # [k, P]
        p = a.shape[1]
        # variables: x (P), d (k), g (1)
        c = np.concatenate([np.zeros(p), np.asarray(sizes, dtype=float) / 100, [1.0]])
        rows = np.hstack([-a, -np.eye(k), np.zeros((k, 1))])
        cap = np.concatenate([np.ones(p), np.zeros(k), [-1.0]])[None, :]
        res = linprog(
            c,
            A_ub=np.vstack([rows, cap]),
            b_ub=np.concatenate([-n, [gpus - whole_gpus]]),
            bounds=[(0, None)] * p + [(0, float(v)) for v in n] + [(0, float(whole_gpus))],
            method="highs",
        )
        duals = -res.ineqlin.marginals[:k]
        mu = -res.ineqlin.marginals[k]
        value, pattern = _best_pattern(sizes, duals)
        if value <= mu + 1e-9:
            return float(res.fun)
        patterns.append(pattern)


def failing_bound(pods: list[TracePod], seed: int, capacity: int, step: int = 8) -> float:
    """Lower bound on the unallocated GPU % at 100% arrived (the simulator's figure: the
    mean over the records whose arrived percentage rounds to 100) for any policy, shares
    allowed to fail. For a record after arrived GPU A, unallocated = (capacity - A) +
    the demand that failed, and the least demand that must have failed grows with every
    arrival, so the LP at an earlier record bounds every later one."""
    gpus = capacity // 1000
    arrived = 0
    shares: list[int] = []
    whole = 0
    window: list[tuple[int, list[int], int]] = []
    for pod in arrival_order(pods, seed, capacity):
        arrived += pod.gpu_milli_total
        if pod.is_share:
            shares.append(pod.gpu_milli // 10)
        elif pod.num_gpu:
            whole += pod.num_gpu
        pct = round(100 * arrived / capacity)
        if pct == 100:
            window.append((arrived, list(shares), whole))
        elif pct > 100:
            break
    values = []
    failed = 0.0
    for j, (arr, sh, wh) in enumerate(window):
        if j % step == 0:
            failed = lp_failed(sh, wh, gpus)
        values.append(100 * ((capacity - arr) / 1000 + failed) / gpus)
    return statistics.fmean(values)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[2] == "--failing":
        openb = Path(sys.argv[1])
        nodes = load_nodes(openb / NODE_FILE)
        capacity = 1000 * sum(n.gpus for n in nodes)
        trace = sys.argv[3] if len(sys.argv) > 3 else "default"
        pods = load_pods(openb / f"{POD_PREFIX}{trace}.csv")
        per = [failing_bound(pods, s, capacity) for s in range(42, 52)]
        rounded = [round(v, 3) for v in per]
        print(json.dumps({"mean": round(statistics.fmean(per), 3), "per_seed": rounded}))
        return
    main_all_placed()


def main_all_placed() -> None:
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
