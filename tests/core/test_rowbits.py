"""The fast per-row reductions agree with numpy's own on every row width."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.rowbits import row_any, row_count


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 7, 8, 9, 16])
def test_row_any_and_row_count_match_numpy(width: int) -> None:
    rng = np.random.default_rng(width)
    for density in (0.0, 0.3, 1.0):
        a = rng.random((37, width)) < density
        for view in (a, a[::2], a[:, : max(1, width - 1)], np.asfortranarray(a)):
            assert np.array_equal(row_any(view), view.any(axis=1))
            counted = row_count(view)
            assert counted.dtype == np.int64
            assert np.array_equal(counted, view.sum(axis=1))


def test_empty_rows() -> None:
    a = np.zeros((0, 8), dtype=np.bool_)
    assert row_any(a).shape == (0,)
    assert row_count(a).shape == (0,)
