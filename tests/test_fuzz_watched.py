"""fuzz.common.watched: what the attack runs count as a crash."""

from __future__ import annotations

from fuzz.common import Tally, watched


def test_an_escaping_exception_is_a_crash_described_even_for_unprintable_inputs() -> None:
    tally = Tally("t")
    with watched(tally, 10**5000, slow_s=60):  # repr() of this int raises ValueError
        raise KeyError("boom")
    with watched(tally, b"fine", slow_s=60):
        pass
    assert (tally.inputs, tally.crashes) == (2, 1)
    assert tally.examples == ["crashes: KeyError: 'boom' on <int too large to print>"]


def test_a_slow_input_is_a_crash() -> None:
    tally = Tally("t")
    with watched(tally, b"slow", slow_s=-1.0):  # any duration is over a negative budget
        pass
    assert tally.crashes == 1 and "s on b'slow'" in tally.examples[0]
