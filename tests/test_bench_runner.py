"""`make bench` fails when a figure misses its target and rewrites docs/benchmarks.md;
`make bench-quick` (smaller sizes, no verdict) does neither."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from bench import run_all
from bench.common import BenchContext, Result


@pytest.fixture
def one_missed_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    def run(ctx: BenchContext) -> list[Result]:
        return [Result("a figure", 3.0, "ms", 2.0), Result("another", 1.0, "ms", 2.0)]

    module = types.ModuleType("bench.bench_fake")
    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bench.bench_fake", module)
    monkeypatch.setattr(run_all, "discover", lambda only: ["bench_fake"])
    (tmp_path / "docs").mkdir()
    monkeypatch.setattr(run_all, "ROOT", tmp_path)
    return tmp_path / "docs" / "benchmarks.md"


def test_a_full_run_fails_on_a_missed_target_and_writes_the_figures(
    one_missed_target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_all.main([]) == 1
    assert "a figure" in one_missed_target.read_text()
    assert "missed its target: fake: a figure" in capsys.readouterr().out


def test_a_quick_run_neither_fails_nor_writes(one_missed_target: Path) -> None:
    assert run_all.main(["--quick"]) == 0
    assert not one_missed_target.exists()
