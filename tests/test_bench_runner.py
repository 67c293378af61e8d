"""`make bench` fails when a figure misses its target and rewrites docs/benchmarks.md (all
but `make bench-scale`'s and `make soak`'s sections); `make bench-quick` (smaller sizes, no
verdict) does neither."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from bench import run_all, scale, soak
from bench.common import BenchContext, Result


def fake_bench(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, results: list[Result]) -> Path:
    """`make bench` with one benchmark, `fake`, reporting `results`, and the repository at
    `tmp_path`; the benchmarks page it writes."""

    def run(ctx: BenchContext) -> list[Result]:
        return results

    module = types.ModuleType("bench.bench_fake")
    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bench.bench_fake", module)
    monkeypatch.setattr(run_all, "discover", lambda only: ["bench_fake"])
    (tmp_path / "docs").mkdir()
    monkeypatch.setattr(run_all, "ROOT", tmp_path)
    return tmp_path / "docs" / "benchmarks.md"


@pytest.fixture
def one_missed_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    results = [Result("a figure", 3.0, "ms", 2.0), Result("another", 1.0, "ms", 2.0)]
    return fake_bench(monkeypatch, tmp_path, results)


def test_a_full_run_fails_on_a_missed_target_and_writes_the_figures(
    one_missed_target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_all.main([]) == 1
    assert "a figure" in one_missed_target.read_text()
    assert "missed its target: fake: a figure" in capsys.readouterr().out


def test_a_quick_run_neither_fails_nor_writes(one_missed_target: Path) -> None:
    assert run_all.main(["--quick"]) == 0
    assert not one_missed_target.exists()


def test_a_full_run_keeps_the_scale_and_soak_sections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make bench-scale` and `make soak` write their own sections of the page; `make bench`
    rewrites the rest."""
    doc = fake_bench(monkeypatch, tmp_path, [Result("a figure", 1.0, "ms", 2.0)])
    doc.write_text("# Benchmarks\n\nold table\n")
    scale.write_section(["5000 nodes: 100 pods/s"], doc)
    doc.write_text(doc.read_text() + "\n## Where the CPU goes\n\nprofile table\n")
    scale.write_section(
        ["Verdict: flat"], doc, start=soak.SECTION_START, end=soak.SECTION_END, title="Soak"
    )
    assert run_all.main([]) == 0
    text = doc.read_text()
    assert "a figure" in text and "old table" not in text
    assert "5000 nodes: 100 pods/s" in text
    assert "## Soak" in text and "Verdict: flat" in text
    # the written analysis after the section is kept, and so is the section's own update
    assert "## Where the CPU goes\n\nprofile table\n" in text
    scale.write_section(["5000 nodes: 120 pods/s"], doc)
    assert "120 pods/s" in doc.read_text() and "profile table" in doc.read_text()


def test_merge_replaces_one_modules_rows_and_notes_only() -> None:
    old = (
        run_all.render(
            [
                ("a", Result("fast", 1.0, "ms", 2.0, note="a's note")),
                ("ui", Result("paint", 900.0, "ms", 1000.0, note="old paint")),
            ],
            quick=False,
        )
        + f"\n{scale.SECTION_START}\n| scale | row |\n{scale.SECTION_END}\n"
    )
    new = run_all.merge(old, [("ui", Result("paint", 400.0, "ms", 1000.0, note="new paint"))])
    lines = new.splitlines()
    assert "| a | fast | 1 ms | <= 2 ms | yes |" in lines
    assert "| ui | paint | 400 ms | <= 1000 ms | yes |" in lines
    assert not any("900" in line or "old paint" in line for line in lines)
    notes = lines[lines.index("Notes:") + 1 :]
    assert notes[0] == "- fast: a's note" and notes[1].startswith("- paint: new paint (measured ")
    assert new.endswith(f"{scale.SECTION_START}\n| scale | row |\n{scale.SECTION_END}\n")


def test_a_benchmark_that_cannot_run_says_why_and_fails_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row without its tool (Prometheus, say) reads `not run` where the figure and the
    verdict go, with the reason in its note, and does not fail `make bench`."""
    missed = Result.not_run("scrape p99", "s", 2.0, "needs Prometheus")
    doc = fake_bench(monkeypatch, tmp_path, [missed, Result("a figure", 1.0, "ms", 2.0)])
    assert run_all.main([]) == 0
    lines = doc.read_text().splitlines()
    assert "| fake | scrape p99 | not run | <= 2 s | not run |" in lines
    assert "- scrape p99: not run: needs Prometheus" in lines


def test_the_scrape_benchmark_without_prometheus_marks_its_rows_not_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import bench_scrape
    from tests.e2e import prometheus as prom

    monkeypatch.setenv(prom.BINARY_VAR, "/nonexistent/prometheus")
    monkeypatch.setenv("PATH", "/nonexistent")
    results = bench_scrape.run(BenchContext(openb=Path("/nonexistent"), quick=False))
    assert [r.measured_text() for r in results] == ["not run"] * 4
    assert all(r.ok and "apt-get install prometheus" in r.note for r in results)
    (line,) = capsys.readouterr().out.splitlines()
    assert line.strip().startswith("not run: the scrape benchmark needs Prometheus")
