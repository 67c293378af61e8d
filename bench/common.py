"""Shared pieces of the benchmarks: the context, the result record, and a server in a
child process."""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent

T = TypeVar("T")


@dataclass(frozen=True)
class BenchContext:
    openb: Path
    """Folder of the openb traces (read in place; never copied into the repository)."""
    quick: bool = False

    def sized(self, quick: T, full: T) -> T:
        """The sizes for this run: `quick` ones for `make bench-quick` (no verdict, it only
        has to run), `full` ones for the figures `make bench` judges."""
        return quick if self.quick else full


@dataclass(frozen=True)
class Result:
    name: str
    value: float
    unit: str
    target: float | None = None
    """The goal; None when the figure is informational."""
    lower_is_better: bool = True
    note: str = ""
    ran: bool = True
    """False: the benchmark could not run here (`note` says why); no figure, no verdict."""

    @classmethod
    def not_run(cls, name: str, unit: str, target: float | None, why: str) -> Result:
        """A row of a benchmark that could not run here, saying why."""
        return cls(name, math.nan, unit, target, note=f"not run: {why}", ran=False)

    @property
    def ok(self) -> bool:
        if self.target is None or not self.ran:
            return True
        return self.value <= self.target if self.lower_is_better else self.value >= self.target

    def verdict(self) -> str:
        """The table's `holds` column."""
        if not self.ran:
            return "not run"
        return "yes" if self.ok else "NO"

    def measured_text(self) -> str:
        if not self.ran:
            return "not run"
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


def uncache_libraries() -> int:
    """Drop the installed shared libraries (the interpreter's and the environment's) from
    the page cache, where no process maps them; returns how many files were advised.

    Resident memory counts the library pages a process maps, and how many a fault maps
    depends on how the page cache holds the file. Just after a library is written (an
    install) the kernel holds it in large blocks and maps a whole block at a fault; read
    back from disk, it holds it in smaller pieces. The node agent, importing the same
    code, reads about 4 MB more in the first state (most of it gRPC's 17 MB core library).
    Benchmarks start from the second state, so that a figure does not depend on when the
    environment was built."""
    seen: set[Path] = set()
    for root in {Path(sys.prefix), Path(sys.base_prefix)}:
        for path in root.rglob("*.so*"):
            if path in seen or not path.is_file():
                continue
            seen.add(path)
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return len(seen)


@contextmanager
def serving_child(module: str, *args: str) -> Iterator[str]:
    """`python -m module args...` in a child process, a server that prints the port it
    listens on as its first line: its URL for the block, the child killed after it (a
    benchmark's server holds nothing that needs a clean exit)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    try:
        assert proc.stdout is not None
        yield f"http://127.0.0.1:{int(proc.stdout.readline())}"
    finally:
        proc.kill()
        proc.wait()
