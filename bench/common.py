"""Shared pieces of the benchmarks: the context and the result record."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BenchContext:
    openb: Path
    """Folder of the openb traces (read in place; never copied into the repository)."""
    quick: bool = False


@dataclass(frozen=True)
class Result:
    name: str
    value: float
    unit: str
    target: float | None = None
    """The goal; None when the figure is informational."""
    lower_is_better: bool = True
    note: str = ""

    @property
    def ok(self) -> bool:
        if self.target is None:
            return True
        return self.value <= self.target if self.lower_is_better else self.value >= self.target

    def measured_text(self) -> str:
        return f"{self.value:.3g} {self.unit}"

    def target_text(self) -> str:
        if self.target is None:
            return "-"
        return f"{'<=' if self.lower_is_better else '>='} {self.target:g} {self.unit}"


def percentile(samples: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (p99 of 1000 samples is the 990th smallest)."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def mean(samples: Sequence[float]) -> float:
    return statistics.fmean(samples) if samples else math.nan
