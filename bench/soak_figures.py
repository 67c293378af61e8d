"""The soak's arithmetic: samples of each program over the cycles, and whether they stayed
flat after the warm-up. Pure, so its rules are unit-tested (tests/test_bench_soak.py)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

RSS_GROWTH_LIMIT_MIB = 5.0
"""Resident memory a program may gain from the end of the warm-up to the end of the run."""
COUNT_SLACK = 2
"""Open fds and threads may wander by this much (a connection being replaced, a worker
thread between tasks); a leak of one per cycle passes it within a few cycles."""
WARMUP_FRACTION = 0.2
"""The first fifth of the cycles warms caches, pools and the interpreter's arenas."""
WINDOW_FRACTION = 0.1
"""Each end of the measured span is the median over this fraction of the samples, so one
sample taken mid-burst does not decide the verdict."""


@dataclass(frozen=True)
class Sample:
    cycle: int
    rss_kib: int
    fds: int
    threads: int


@dataclass(frozen=True)
class Growth:
    """From the end of the warm-up to the end of the run."""

    program: str
    rss_start_mib: float
    rss_end_mib: float
    rss_peak_mib: float
    fds: tuple[int, int]
    threads: tuple[int, int]

    @property
    def rss_mib(self) -> float:
        return self.rss_end_mib - self.rss_start_mib

    def problems(self) -> list[str]:
        found = []
        if self.rss_mib >= RSS_GROWTH_LIMIT_MIB:
            found.append(f"{self.program}: RSS grew {self.rss_mib:.1f} MiB after the warm-up")
        for what, (start, end) in (("open fds", self.fds), ("threads", self.threads)):
            if end - start > COUNT_SLACK:
                found.append(f"{self.program}: {what} grew from {start} to {end}")
        return found


def _ends(values: Sequence[float]) -> tuple[float, float]:
    """Median of the first and of the last window of `values`."""
    width = max(1, round(len(values) * WINDOW_FRACTION))
    return statistics.median(values[:width]), statistics.median(values[-width:])


def measured(samples: Sequence[Sample], cycles: int) -> list[Sample]:
    """The samples taken after the warm-up."""
    return [s for s in samples if s.cycle >= cycles * WARMUP_FRACTION]


def growth(program: str, samples: Sequence[Sample], cycles: int) -> Growth:
    after = measured(samples, cycles)
    if len(after) < 2:
        raise ValueError(f"{program}: {len(after)} samples after the warm-up; sample more often")
    rss = [s.rss_kib / 1024 for s in after]
    start, end = _ends(rss)
    fds = _ends([s.fds for s in after])
    threads = _ends([s.threads for s in after])
    return Growth(
        program,
        start,
        end,
        max(rss),
        (round(fds[0]), round(fds[1])),
        (round(threads[0]), round(threads[1])),
    )


def object_problems(counts: Sequence[tuple[int, dict[str, int]]], cycles: int) -> list[str]:
    """API objects tessera owns, sampled as (cycle, kind -> count): none may be more at the
    end than at the end of the warm-up."""
    after = [c for cycle, c in counts if cycle >= cycles * WARMUP_FRACTION]
    if len(after) < 2:
        return ["too few object counts after the warm-up"]
    first, last = after[0], after[-1]
    return [
        f"{kind}: {first.get(kind, 0)} after the warm-up, {n} at the end"
        for kind, n in sorted(last.items())
        if n > first.get(kind, 0)
    ]
