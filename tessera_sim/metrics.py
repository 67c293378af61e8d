"""The paper's figures from a run's records.

The records are one per arrived pod. For each arrived percentage X (0..130), the paper
takes the records whose arrived GPU, in percent of capacity and rounded to a whole number
(half to even), equals X, and averages the allocated GPU percentage over them (when there
are none, over the records within X-1..X+1). Unallocated GPU at X is 100 minus that
allocation; the fragmentation rate at X is the fragment over the idle GPU, averaged the
same way. (Only for clusters so small that one pod moves the arrived percentage by more
than 2 points, an empty window falls back to the last record before X.)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tessera_sim.replay import RunResult

FloatArray = npt.NDArray[np.float64]
CURVE = tuple(range(75, 131))
"""Arrived percentages of the reported curves."""


def _bucket_means(
    arrived_pct: FloatArray, values: FloatArray, points: Sequence[int]
) -> list[float]:
    keys = np.round(arrived_pct)
    out: list[float] = []
    for x in points:
        hit = values[keys == x]
        if hit.size == 0:
            hit = values[(keys >= x - 1) & (keys <= x + 1)]
        if hit.size == 0 and arrived_pct.size and arrived_pct[0] <= x <= arrived_pct[-1]:
            # small clusters arrive in steps wider than 2%: the last record before X
            hit = values[arrived_pct <= x][-1:]
        out.append(float(hit.mean()) if hit.size else math.nan)
    return out


def allocation_curve(run: RunResult, points: Sequence[int] = CURVE) -> list[float]:
    """Allocated GPU, percent of capacity, at each arrived percentage."""
    cap = run.capacity_milli
    return _bucket_means(100.0 * run.arrived_milli / cap, 100.0 * run.allocated_milli / cap, points)


def unallocated_curve(run: RunResult, points: Sequence[int] = CURVE) -> list[float]:
    return [100.0 - a for a in allocation_curve(run, points)]


def fragmentation_curve(run: RunResult, points: Sequence[int] = CURVE) -> list[float]:
    """The fragment as a percentage of idle GPU, at each arrived percentage."""
    idle = np.where(run.idle_milli > 0, run.idle_milli, np.nan)
    with np.errstate(invalid="ignore"):
        ratio = 100.0 * run.frag_milli / idle
    return _bucket_means(100.0 * run.arrived_milli / run.capacity_milli, ratio, points)


def unallocated_at(run: RunResult, arrived: int = 100) -> float:
    return unallocated_curve(run, (arrived,))[0]


def fragmentation_at(run: RunResult, arrived: int = 80) -> float:
    return fragmentation_curve(run, (arrived,))[0]


class PerSeed(tuple[float, ...]):
    """One figure per seed, with its mean and sample standard deviation."""

    __slots__ = ()

    @property
    def mean(self) -> float:
        return statistics.fmean(self)

    @property
    def sd(self) -> float:
        """Sample standard deviation (n - 1), 0 for a single value, NaN if a value is NaN."""
        if any(math.isnan(v) for v in self):
            return math.nan
        return statistics.stdev(self) if len(self) > 1 else 0.0


@dataclass(frozen=True)
class Summary:
    """One policy on one trace over several seeds."""

    policy: str
    trace: str
    seeds: tuple[int, ...]
    unallocated_at_100: PerSeed
    fragmentation_at_80: PerSeed
    curve_points: tuple[int, ...]
    unallocated_curve_mean: tuple[float, ...]
    failed_pods: tuple[int, ...]
    pods: tuple[int, ...]
    seconds: tuple[float, ...]
    memory_mode: str = "share"

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "trace": self.trace,
            "seeds": list(self.seeds),
            "gpu_memory": self.memory_mode,
            "unallocated_gpu_pct_at_100_mean": _num(self.unallocated_at_100.mean),
            "unallocated_gpu_pct_at_100_sd": _num(self.unallocated_at_100.sd),
            "unallocated_gpu_pct_at_100": [_num(v) for v in self.unallocated_at_100],
            "fragmentation_rate_pct_at_80_mean": _num(self.fragmentation_at_80.mean),
            "fragmentation_rate_pct_at_80_sd": _num(self.fragmentation_at_80.sd),
            "curve_arrived_pct": list(self.curve_points),
            "curve_unallocated_gpu_pct_mean": [_num(v) for v in self.unallocated_curve_mean],
            "failed_pods": list(self.failed_pods),
            "pods": list(self.pods),
            "seconds_per_seed": [round(s, 2) for s in self.seconds],
        }


def _num(value: float) -> float | None:
    """A JSON-safe number: rounded, None for NaN."""
    return None if math.isnan(value) else round(value, 4)


def summarize(
    policy: str, trace: str, runs: Sequence[RunResult], memory_mode: str = "share"
) -> Summary:
    curves = np.asarray([unallocated_curve(r) for r in runs])
    return Summary(
        policy=policy,
        trace=trace,
        seeds=tuple(r.seed for r in runs),
        unallocated_at_100=PerSeed(float(unallocated_at(r)) for r in runs),
        fragmentation_at_80=PerSeed(float(fragmentation_at(r)) for r in runs),
        curve_points=CURVE,
        unallocated_curve_mean=tuple(float(v) for v in curves.mean(axis=0)),
        failed_pods=tuple(r.failed for r in runs),
        pods=tuple(r.pods for r in runs),
        seconds=tuple(r.seconds for r in runs),
        memory_mode=memory_mode,
    )
