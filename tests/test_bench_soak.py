"""The soak's verdict (bench/soak_figures.py): a leak fails it, a flat run with noise passes."""

from __future__ import annotations

import pytest

from bench import soak_figures as sf

CYCLES = 1000


def _series(rss_kib: list[int], fds: int = 20, threads: int = 9) -> list[sf.Sample]:
    step = CYCLES // len(rss_kib)
    return [sf.Sample((i + 1) * step, r, fds, threads) for i, r in enumerate(rss_kib)]


def test_a_flat_run_with_noise_and_warm_up_growth_passes() -> None:
    warm = [40_000 + 3000 * i for i in range(40)]  # grows during the warm-up only
    noisy = [160_000 + (700 if i % 3 else -900) for i in range(160)]
    g = sf.growth("hook", _series(warm + noisy), CYCLES)
    assert g.problems() == []
    assert abs(g.rss_mib) < 1 and g.rss_peak_mib == pytest.approx(160_700 / 1024)


def test_memory_that_keeps_growing_fails() -> None:
    leak = [50_000 + 40 * i for i in range(200)]  # 40 KiB a sample: about 6 MiB after warm-up
    (problem,) = sf.growth("agent", _series(leak), CYCLES).problems()
    assert problem.startswith("agent: RSS grew") and "after the warm-up" in problem


def test_fds_and_threads_that_grow_fail_and_small_wander_passes() -> None:
    samples = [sf.Sample(c, 50_000, 20 + c // 100, 9 + (c // 10) % 2) for c in range(5, 1001, 5)]
    problems = sf.growth("scheduler", samples, CYCLES).problems()
    assert problems == ["scheduler: open fds grew from 22 to 29"]


def test_too_few_samples_after_the_warm_up_is_an_error() -> None:
    with pytest.raises(ValueError, match="sample more often"):
        sf.growth("hook", [sf.Sample(100, 1, 1, 1), sf.Sample(900, 1, 1, 1)], CYCLES)


def test_object_counts_may_not_grow_after_the_warm_up() -> None:
    flat = [(c, {"Leases": 3, "NodeDevices": 1}) for c in range(0, 1001, 100)]
    assert sf.object_problems(flat, CYCLES) == []
    grown = [*flat[:-1], (1000, {"Leases": 4, "NodeDevices": 1})]
    assert sf.object_problems(grown, CYCLES) == ["Leases: 3 after the warm-up, 4 at the end"]
    early = [(100, {"Leases": 9}), *flat[2:]]  # growth inside the warm-up does not count
    assert sf.object_problems(early, CYCLES) == []
