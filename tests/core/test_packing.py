"""Packing values: the LP's optimum is certified (a packing and prices that agree), and
the losses say what the module promises."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.fragmentation.packing import FULL, NO_VALUES, packing_values

# the openb default trace's shares: percent of a GPU -> pods
OPENB_SHARES = {
    5: 7, 11: 24, 14: 1, 16: 74, 22: 62, 23: 140, 27: 4, 29: 1, 32: 328, 33: 7, 35: 6,
    37: 47, 44: 2, 46: 128, 47: 750, 48: 19, 55: 72, 59: 75, 65: 253, 81: 1078,
}  # fmt: skip


def _certify(demand: dict[int, float]) -> None:
    """The values are optimal: the packing covers the demand, no way of filling one GPU is
    worth more than 1 at these prices, and both sides agree on the number of GPUs."""
    values = packing_values(demand)
    covered = dict.fromkeys(demand, 0.0)
    for sizes, times in values.patterns:
        assert sum(sizes) <= FULL and times > 0
        for s in sizes:
            covered[s] += times
    for s, want in demand.items():
        assert covered[s] >= want - 1e-6 * max(1.0, want)
    assert values.room[FULL] <= 1.0 + 1e-9  # the most any one GPU's fill is worth
    priced = sum(w * values.unit[s] for s, w in demand.items())
    used = sum(times for _, times in values.patterns)
    assert abs(priced - used) <= 1e-6 * max(1.0, used)
    assert abs(values.gpus - used) <= 1e-6 * max(1.0, used)


def test_the_openb_mix_is_packed_optimally() -> None:
    _certify({s: float(n) for s, n in OPENB_SHARES.items()})


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.integers(1, 99), st.floats(0.01, 1000.0), min_size=1, max_size=12))
def test_any_mix_is_packed_optimally(demand: dict[int, float]) -> None:
    _certify(demand)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(st.integers(1, 99), st.floats(0.01, 1000.0), min_size=1, max_size=12),
    st.integers(0, FULL),
    st.integers(1, FULL - 1),
)
def test_losses_are_never_negative_and_the_vector_form_agrees(
    demand: dict[int, float], room: int, size: int
) -> None:
    values = packing_values(demand)
    loss = values.loss(room, size)
    assert loss >= 0.0
    if size > room:
        assert loss == 0.0
    assert values.losses(np.asarray([room]), size)[0] == loss
    assert np.all(np.diff(values.room) >= -1e-12), "more room is never worth less"


def test_what_the_openb_mix_protects() -> None:
    values = packing_values({s: float(n) for s, n in OPENB_SHARES.items()})
    # 81% shares outnumber everything that could join them: an empty GPU loses nothing
    assert values.loss(FULL, 81) == 0.0
    # a 32% share beside a 65% share completes a GPU; in the room a 47% share left it
    # spoils a place for another 47% share
    assert values.loss(35, 32) == 0.0
    assert abs(values.loss(53, 32) - 1 / 6) < 1e-9
    # a second 47% share in that room is what an optimal packing does
    assert values.loss(53, 47) == 0.0


def test_sizes_without_a_share_or_weight_count_for_nothing() -> None:
    assert packing_values({}) is NO_VALUES
    assert packing_values({0: 5.0, 100: 3.0, 250: 1.0, 40: 0.0}) is NO_VALUES
    assert NO_VALUES.loss(FULL, 50) == 0.0
    values = packing_values({50: 1.0})
    assert values.unit[50] == 0.5 and values.loss(FULL, 50) == 0.0
    assert values.loss(FULL, FULL) == 0.0  # a whole GPU is not a share
