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
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tessera.resources import UNITS_PER_DEVICE

FULL = UNITS_PER_DEVICE
"""A whole GPU, in percent."""
_EPS = 1e-9
_MAX_PIVOTS = 20_000
"""Simplex pivots per solve before giving up on optimality (values stay feasible)."""
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
    _tables: dict[int, FloatArray] = field(default_factory=dict, compare=False, repr=False)

    def loss(self, room: int, size: int) -> float:
        """GPUs of packing value given up by placing a share of `size` into `room`."""
        if not 0 < size < FULL:
            return 0.0
        return float(self._by_room(size)[min(max(room, 0), FULL)])

    def losses(self, room: npt.NDArray[np.int64], size: int) -> FloatArray:
        """`loss` of a share of `size` over an array of rooms (0 where it does not fit)."""
        if not 0 < size < FULL:
            return np.zeros(np.shape(room))
        # mode="clip" reads rooms outside 0..FULL as the nearest end, in one call
        out: FloatArray = np.take(self._by_room(size), room, mode="clip")
        return out

    def _by_room(self, size: int) -> FloatArray:
        """`loss(g, size)` for every room g in 0..100 (kept per size: decisions ask again)."""
        table = self._tables.get(size)
        if table is None:
            g = np.arange(FULL + 1)
            after = np.clip(g - size, 0, FULL)
            gain = self.room - self.room[after] - self.unit[size]
            table = self._tables[size] = np.where(g >= size, np.maximum(gain, 0.0), 0.0)
        return table


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
    table = _DualTable(np.asarray(patterns, dtype=np.float64), weight)
    while True:
        values = table.values()
        best, counts = _best_fill(sizes, values)
        if best <= 1.0 + _EPS or len(patterns) >= _MAX_PATTERNS or counts in patterns:
            break
        patterns.append(counts)
        table.add(np.asarray(counts, dtype=np.float64))
    unit = np.zeros(FULL + 1)
    unit[sizes] = values
    room = _rooms(sizes, values)
    used = tuple(
        (tuple(s for s, k in zip(sizes, p, strict=True) for _ in range(k)), float(x))
        for p, x in zip(patterns, table.usage(), strict=True)
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
    size = np.asarray(sizes)
    best = np.zeros(FULL + 1)
    take = np.full(FULL + 1, -1)
    for cap in range(1, FULL + 1):
        best[cap] = best[cap - 1]
        fits = size <= cap
        if fits.any():
            gain = best[cap - size[fits]] + values[fits]
            i = int(np.argmax(gain))
            if gain[i] > best[cap] + _EPS:
                best[cap], take[cap] = gain[i], int(np.flatnonzero(fits)[i])
    counts = [0] * len(sizes)
    cap = FULL
    while cap > 0:
        i = int(take[cap])
        if i < 0:
            cap -= 1
        else:
            counts[i] += 1
            cap -= sizes[i]
    return float(best[FULL]), tuple(counts)


def _rooms(sizes: list[int], values: FloatArray) -> FloatArray:
    """`room[g]`: the most the shares fitting in g percent are worth together."""
    size = np.asarray(sizes)
    room = np.zeros(FULL + 1)
    for cap in range(1, FULL + 1):
        fits = size <= cap
        room[cap] = room[cap - 1]
        if fits.any():
            room[cap] = max(room[cap], float((room[cap - size[fits]] + values[fits]).max()))
    return room


class _DualTable:
    """The dual of the restricted packing LP, max weight . u s.t. patterns @ u <= 1,
    u >= 0, as a simplex tableau: solved from the slack basis (feasible: the bounds are 1)
    by the primal simplex with Bland's rule (the problem is highly degenerate, and Bland's
    rule cannot cycle); each new pattern is a new row, after which the dual simplex
    restores feasibility from the basis at hand (a few pivots instead of a new solve).
    The objective row holds the dual of this problem under the slack columns: how often
    each pattern is used in an optimal packing."""

    def __init__(self, patterns: FloatArray, weight: FloatArray) -> None:
        m, n = patterns.shape
        self.n = n
        # rows: constraints, then the objective; columns: u, one slack per row, rhs
        table = np.zeros((m + 1, n + m + 1))
        table[:m, :n] = patterns
        table[:m, n : n + m] = np.eye(m)
        table[:m, -1] = 1.0
        table[m, :n] = -weight
        self.table = table
        self.basis = list(range(n, n + m))
        self._primal()

    @property
    def rows(self) -> int:
        return len(self.basis)

    def _pivot(self, row: int, column: int) -> None:
        table = self.table
        table[row] /= table[row, column]
        others = table[:, column] != 0
        others[row] = False
        table[others] -= np.outer(table[others, column], table[row])
        self.basis[row] = column

    def _primal(self) -> None:
        """Primal simplex, Bland's rule, from a feasible basis."""
        m, table = self.rows, self.table
        for _ in range(_MAX_PIVOTS):
            improving = np.flatnonzero(table[m, :-1] < -_EPS)
            if improving.size == 0:
                return
            column = int(improving[0])
            col = table[:m, column]
            rows = np.flatnonzero(col > _EPS)
            # bounded: every u_j has a positive coefficient in its own single-size row
            ratios = table[rows, -1] / col[rows]
            tied = rows[ratios <= ratios.min() + _EPS]
            self._pivot(int(tied[np.argmin(np.asarray(self.basis)[tied])]), column)

    def add(self, pattern: FloatArray) -> None:
        """One more constraint pattern . u <= 1, then the dual simplex."""
        m = self.rows
        old = self.table
        table = np.zeros((m + 2, old.shape[1] + 1))
        table[:m, :-2] = old[:m, :-1]
        table[:m, -1] = old[:m, -1]
        table[m + 1, :-2] = old[m, :-1]
        table[m + 1, -1] = old[m, -1]
        row = np.zeros(table.shape[1])
        row[: self.n] = pattern
        row[-2] = 1.0  # its slack
        row[-1] = 1.0
        # in terms of the current basis: eliminate every basic column from the new row
        for r, var in enumerate(self.basis):
            if row[var] != 0:
                row -= row[var] * table[r]
        table[m] = row
        self.table = table
        self.basis.append(table.shape[1] - 2)
        self._dual()

    def _dual(self) -> None:
        """Dual simplex: the reduced costs stay optimal, pivots until every basic value is
        feasible (the problem is feasible: u = 0 always is)."""
        m, table = self.rows, self.table
        for _ in range(_MAX_PIVOTS):
            rhs = table[:m, -1]
            row = int(np.argmin(rhs))
            if rhs[row] >= -_EPS:
                break
            line = table[row, :-1]
            candidates = np.flatnonzero(line < -_EPS)
            ratios = table[m, candidates] / -line[candidates]
            tied = candidates[ratios <= ratios.min() + _EPS]
            self._pivot(row, int(tied[0]))
        self._primal()  # float noise can leave a reduced cost slightly negative

    def values(self) -> FloatArray:
        u = np.zeros(self.n)
        for r, var in enumerate(self.basis):
            if var < self.n:
                u[var] = self.table[r, -1]
        out: FloatArray = np.maximum(u, 0.0)
        return out

    def usage(self) -> FloatArray:
        out: FloatArray = np.maximum(self.table[self.rows, self.n : -1], 0.0)
        return out
