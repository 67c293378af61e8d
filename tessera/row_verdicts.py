"""Per-row verdicts of the vector path, kept per request shape until the row changes.

A vector-path verdict on one node (fits with a score, or the reason it does not) depends
only on the request's shape, the policy and its generation, and the node's row in the
ClusterIndex (every change to a node gives its row a new stamp). Between two pods of one
shape only a few rows change, so the Decider keeps each shape's verdicts per row with the
row's stamp and recomputes only rows whose stamp moved: a decision over 500 names then
costs a gather instead of fitting and scoring 500 nodes.

Everything a verdict reads beyond its row is in the key: the policy's generation (what it
learned), and the index's epoch and number of known models (index-wide facts a policy may
weigh, such as how scarce a model is). A change to any of them starts the shape afresh.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tessera.cluster_index import BoolArray, ClusterIndex, IntArray
from tessera.node_placement import NoFit
from tessera.scoring_policy import FloatArray

MAX_SHAPES = 32
"""Request shapes kept at once (least recently used dropped first): 20 bytes per index
row each; at 5,000 nodes (8,192 rows) 160 KB a shape, 5.2 MB at most."""
MAX_REASONS = 4096
"""Distinct failure reasons one shape keeps before it starts afresh (reasons quote node
figures, so a long-lived shape collects new ones slowly)."""

FITS = -1
"""The code of a row where the request fits."""


@dataclass
class ShapeVerdicts:
    """One shape's verdict per index row, valid where `stamp` equals the row's stamp."""

    key: tuple[int, int, int]
    """(policy generation, index epoch, models known) the verdicts were made under."""
    stamp: IntArray
    score: FloatArray
    """The policy's node score where the request fits."""
    code: npt.NDArray[np.int32]
    """`FITS`, or the position of the row's reason in `reasons`."""
    reasons: list[NoFit] = field(default_factory=list)
    code_of: dict[NoFit, int] = field(default_factory=dict)

    @classmethod
    def empty(cls, key: tuple[int, int, int], rows: int) -> ShapeVerdicts:
        return cls(
            key,
            np.full(rows, -2, dtype=np.int64),
            np.zeros(rows, dtype=np.float64),
            np.full(rows, FITS, dtype=np.int32),
        )

    def codes_for(self, reasons: list[NoFit]) -> list[int]:
        """The codes of `reasons`, adding the new ones."""
        code_of = self.code_of
        out = []
        for nofit in reasons:
            code = code_of.get(nofit)
            if code is None:
                code = code_of[nofit] = len(self.reasons)
                self.reasons.append(nofit)
            out.append(code)
        return out

    def stale(self, index: ClusterIndex, rows: IntArray) -> IntArray:
        """The rows of `rows` whose verdict is missing or out of date."""
        sel = index.selector(rows)
        if isinstance(sel, slice):  # rows 0..n-1: their positions are the rows
            every: IntArray = np.flatnonzero(self.stamp[sel] != index.stamp[sel])
            return every
        out: IntArray = rows[self.stamp[rows] != index.stamp[rows]]
        return out

    def store(
        self,
        index: ClusterIndex,
        rows: IntArray,
        fits: BoolArray,
        scores: FloatArray,
        bad_reasons: list[NoFit],
    ) -> None:
        """Verdicts for `rows`: fit and score each, and the reasons of the rows that do not
        fit, in order."""
        code = np.full(rows.size, FITS, dtype=np.int32)
        code[~fits] = self.codes_for(bad_reasons)
        self.code[rows] = code
        self.score[rows] = scores
        self.stamp[rows] = index.stamp[rows]


class VerdictMemo:
    """`ShapeVerdicts` per (request shape, policy name), bounded."""

    def __init__(self, max_shapes: int = MAX_SHAPES) -> None:
        self.max_shapes = max_shapes
        self._entries: OrderedDict[object, ShapeVerdicts] = OrderedDict()

    def entry(self, shape: object, key: tuple[int, int, int], rows: int) -> ShapeVerdicts:
        """The verdicts of `shape` made under `key` for an index of `rows` rows (a fresh
        one when there are none, or they were made under another key or size)."""
        entry = self._entries.get(shape)
        if (
            entry is None
            or entry.key != key
            or entry.stamp.size != rows
            or len(entry.reasons) > MAX_REASONS
        ):
            entry = ShapeVerdicts.empty(key, rows)
            self._entries[shape] = entry
            if len(self._entries) > self.max_shapes:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(shape)
        return entry

    def peek(self, shape: object, key: tuple[int, int, int]) -> ShapeVerdicts | None:
        """The verdicts of `shape` if they were made under `key` (no entry made, no
        recency changed)."""
        entry = self._entries.get(shape)
        return entry if entry is not None and entry.key == key else None

    def __len__(self) -> int:
        return len(self._entries)
