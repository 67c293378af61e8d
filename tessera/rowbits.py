"""Per-row counts and tests over small boolean rows (a node's GPU slots), fast.

numpy reduces a short last axis (8 slots) slowly: a sum or `any` over a [nodes, 8] bool
array costs about as much as arithmetic on ten times as many numbers. Rows of 1, 2, 4 or
8 booleans are read instead as one unsigned integer each: a row has a true entry when its
integer is non-zero, and its count of true entries is the integer's bit count (each True
is the byte 1).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

_WORD = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_POPCOUNT = getattr(np, "bitwise_count", None)


def _words(a: BoolArray) -> npt.NDArray[np.unsignedinteger] | None:
    """Each row of the 2-D `a` as one integer, or None when its rows do not fit one."""
    if a.ndim != 2:
        return None
    word = _WORD.get(a.shape[1])
    if word is None:
        return None
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    out: npt.NDArray[np.unsignedinteger] = a.view(word).reshape(a.shape[0])
    return out


def row_any(a: BoolArray) -> BoolArray:
    """`a.any(axis=1)` for a 2-D bool array."""
    words = _words(a)
    if words is None:
        out: BoolArray = np.asarray(a.any(axis=1), dtype=np.bool_)
        return out
    nonzero: BoolArray = words != 0
    return nonzero


def row_count(a: BoolArray) -> IntArray:
    """`a.sum(axis=1)` for a 2-D bool array, as int64."""
    words = _words(a) if _POPCOUNT is not None else None
    if words is None:
        out: IntArray = a.sum(axis=1, dtype=np.int64)
        return out
    assert _POPCOUNT is not None
    counted: IntArray = _POPCOUNT(words).astype(np.int64)
    return counted
