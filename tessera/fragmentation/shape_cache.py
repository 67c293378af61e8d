"""Vector results cached per request shape and index row, recomputed only for rows that changed."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tessera.scoring_policy import FloatArray, IntArray, VectorCase

if TYPE_CHECKING:
    from tessera.cluster_index import ClusterIndex


@dataclass
class _RowCache:
    """Per-row results of one request shape, valid while the row's stamp is unchanged."""

    stamp: IntArray
    values: FloatArray


class ShapeCache:
    """Per-row results for each request shape, recomputed only for rows that changed.

    A decision looks at every node, but between two decisions only a few nodes change;
    results are keyed by the request's shape and kept per index row with the row's stamp.
    """

    def __init__(self, max_shapes: int = 512) -> None:
        self._index: object = None
        self._generation = -1
        self._entries: OrderedDict[object, _RowCache] = OrderedDict()
        self.max_shapes = max_shapes

    def get(
        self,
        index: ClusterIndex,
        rows: IntArray,
        key: object,
        generation: int,
        compute: Callable[[IntArray], FloatArray],
    ) -> FloatArray:
        if self._index is not index or self._generation != generation:
            self._index = index
            self._generation = generation
            self._entries.clear()
        stamps = index.stamp
        entry = self._entries.get(key)
        if entry is None or entry.stamp.size != stamps.size:
            entry = _RowCache(
                np.full(stamps.size, -2, dtype=np.int64), np.zeros(stamps.size, dtype=np.float64)
            )
            self._entries[key] = entry
            if len(self._entries) > self.max_shapes:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        sel = index.selector(rows)
        current = stamps[sel]
        stale = rows[entry.stamp[sel] != current]
        if stale.size:
            entry.values[stale] = compute(stale)
            entry.stamp[stale] = stamps[stale]
        result: FloatArray = (
            entry.values[sel].copy() if isinstance(sel, slice) else entry.values[sel]
        )
        return result

    def for_case(
        self,
        index: ClusterIndex,
        rows: IntArray,
        case: VectorCase,
        generation: int,
        compute: Callable[[IntArray], FloatArray],
    ) -> FloatArray:
        """`get` keyed by the case's kind and request shape; a case of unknown shape is
        computed for every row, uncached."""
        if case.shape is None:
            return compute(rows)
        return self.get(index, rows, (type(case).__name__, case.shape), generation, compute)
