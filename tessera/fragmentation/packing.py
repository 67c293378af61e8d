"""What GPU shares and free GPU room are worth when shares are packed as tightly as they
can be.

Take the shares the workload asks for, in proportion (`demand`: weight per share size in
percent of a GPU), and pack them into GPUs as few as possible: the linear relaxation of
that packing (the cutting-stock LP: how often to use each way of filling one GPU) has a
dual, a value `unit[s]` per share size s, in GPUs, such that no way of filling one GPU is
worth more than 1 and the ways an optimal packing uses are worth exactly 1. From it:

- `room[g]`: what free room of g percent on a GPU is worth, the most that shares fitting
  in it are worth together (a knapsack over the unit values);
- `loss(g, s)`: what placing a share of size s into room g gives up,
  `room[g] - room[g - s] - unit[s]` (>= 0). It is 0 exactly when the placement can be
  part of an optimal packing (the share and what the rest of the room can still take are
  worth the whole room), and otherwise the part of a GPU the packing loses for good.

An 81% share on an empty GPU loses nothing when 81% shares outnumber what could join
them (the rest of that GPU was going to stay idle anyway); a 32% share loses a sixth of a
GPU in the room a 47% share left (worth another 47% share) where it loses nothing beside
a 65% share. Which sizes are scarce enough to be worth protecting is what the dual prices
say, from the whole mix, not from the one placement.

The LP is solved by column generation: the dual of the restricted problem with a simplex
(Bland's rule: the problem is highly degenerate, and Bland's rule cannot cycle), new
ways of filling a GPU priced by an unbounded knapsack. Small: a workload has at most a few
dozen share sizes. No solver library is needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tessera.resources import UNITS_PER_DEVICE

FULL = UNITS_PER_DEVICE
"""A whole GPU, in percent."""
_EPS = 1e-9
_MAX_PATTERNS = 400
"""Ways of filling a GPU the column generation may add before it stops (it needs a few
dozen on the openb traces); values from a stopped run are still feasible, only less
tight."""

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class PackingValues:
    """`unit[s]` and `room[g]` for s, g in 0..100 (see the module doc); `gpus` is the LP's
    optimum for `demand` as given (GPUs per unit of demand), `patterns` how it packs."""

    unit: FloatArray
    room: FloatArray
    gpus: float
    patterns: tuple[tuple[tuple[int, ...], float], ...]
    """(sizes on one GPU, how often), the optimal packing the values are the dual of."""

    def loss(self, room: int, size: int) -> float:
        """GPUs of packing value given up by placing a share of `size` into `room`."""
        if not 0 < size < FULL or size > room:
            return 0.0
        return max(float(self.room[room] - self.room[room - size] - self.unit[size]), 0.0)

    def losses(self, room: npt.NDArray[np.int64], size: int) -> FloatArray:
        """`loss` of a share of `size` over an array of rooms (0 where it does not fit)."""
        if not 0 < size < FULL:
            return np.zeros(np.shape(room))
        g = np.clip(room, 0, FULL)
        after = np.clip(g - size, 0, FULL)
        out: FloatArray = np.where(
            g >= size, np.maximum(self.room[g] - self.room[after] - self.unit[size], 0.0), 0.0
        )
        return out


NO_VALUES = PackingValues(np.zeros(FULL + 1), np.zeros(FULL + 1), 0.0, ())
"""Values of a workload without shares: every loss is 0."""


def packing_values(demand: Mapping[int, float]) -> PackingValues:
    """The packing values of shares asked for in proportion to `demand` (size in percent,
    1..99 -> weight; other sizes and weights <= 0 are ignored)."""
    sizes = sorted(s for s, w in demand.items() if 0 < s < FULL and w > 0)
    if not sizes:
        return NO_VALUES
    weight = np.asarray([float(demand[s]) for s in sizes])
    patterns: list[tuple[int, ...]] = [_single(i, s, len(sizes)) for i, s in enumerate(sizes)]
    while True:
        values, usage = _solve_dual(np.asarray(patterns, dtype=np.float64), weight)
        best, counts = _best_fill(sizes, values)
        if best <= 1.0 + _EPS or len(patterns) >= _MAX_PATTERNS or counts in patterns:
            break
        patterns.append(counts)
    unit = np.zeros(FULL + 1)
    unit[sizes] = values
    room = _rooms(sizes, values)
    used = tuple(
        (tuple(s for s, k in zip(sizes, p, strict=True) for _ in range(k)), float(x))
        for p, x in zip(patterns, usage, strict=True)
        if x > _EPS
    )
    return PackingValues(unit, room, float(weight @ values), used)


def _single(i: int, size: int, n: int) -> tuple[int, ...]:
    """The GPU filled with shares of one size only."""
    counts = [0] * n
    counts[i] = FULL // size
    return tuple(counts)


def _best_fill(sizes: list[int], values: FloatArray) -> tuple[float, tuple[int, ...]]:
    """The most valuable way of filling one GPU (unbounded knapsack): (value, count per
    size)."""
    best = [0.0] * (FULL + 1)
    take = [-1] * (FULL + 1)
    for cap in range(1, FULL + 1):
        best[cap], take[cap] = best[cap - 1], -1
        for i, s in enumerate(sizes):
            if s <= cap and best[cap - s] + values[i] > best[cap] + _EPS:
                best[cap], take[cap] = best[cap - s] + float(values[i]), i
    counts = [0] * len(sizes)
    cap = FULL
    while cap > 0:
        i = take[cap]
        if i < 0:
            cap -= 1
        else:
            counts[i] += 1
            cap -= sizes[i]
    return best[FULL], tuple(counts)


def _rooms(sizes: list[int], values: FloatArray) -> FloatArray:
    """`room[g]`: the most the shares fitting in g percent are worth together."""
    room = np.zeros(FULL + 1)
    for cap in range(1, FULL + 1):
        room[cap] = room[cap - 1]
        for i, s in enumerate(sizes):
            if s <= cap:
                room[cap] = max(room[cap], room[cap - s] + values[i])
    return room


def _solve_dual(patterns: FloatArray, weight: FloatArray) -> tuple[FloatArray, FloatArray]:
    """max weight . u  s.t.  patterns @ u <= 1, u >= 0, by the simplex method from the
    slack basis (feasible: the bounds are 1) with Bland's rule. Returns (u, and the dual
    of this problem: how often each pattern is used in an optimal packing)."""
    m, n = patterns.shape
    # tableau: [patterns | identity | 1], objective row [-weight | 0 | 0]
    table = np.zeros((m + 1, n + m + 1))
    table[:m, :n] = patterns
    table[:m, n : n + m] = np.eye(m)
    table[:m, -1] = 1.0
    table[m, :n] = -weight
    basis = list(range(n, n + m))
    for _ in range(50 * (n + m) + 1000):
        entering = next((j for j in range(n + m) if table[m, j] < -_EPS), -1)
        if entering < 0:
            break
        column = table[:m, entering]
        rows = np.flatnonzero(column > _EPS)
        # the problem is bounded (every size is in a pattern with a positive count)
        ratios = table[rows, -1] / column[rows]
        least = ratios.min()
        tied = rows[ratios <= least + _EPS]
        row = int(min(tied, key=lambda r: basis[r]))
        table[row] /= table[row, entering]
        others = np.abs(table[:, entering]) > 0
        others[row] = False
        table[others] -= np.outer(table[others, entering], table[row])
        basis[row] = entering
    u = np.zeros(n)
    for r, var in enumerate(basis):
        if var < n:
            u[var] = table[r, -1]
    usage = np.maximum(table[m, n : n + m], 0.0)
    return np.maximum(u, 0.0), usage
