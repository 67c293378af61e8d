"""docs/isolation.md's "measured on a real GPU" table is the reports' own: every row comes
from a `make gpu-check` report kept in docs/gpu-check/, none is written by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import gpu_table


def test_the_page_holds_exactly_the_rows_of_the_kept_reports() -> None:
    assert gpu_table.main(["--check"]) == 0
    page = gpu_table.DOC.read_text()
    inside = page.split(gpu_table.BEGIN)[1].split(gpu_table.END)[0]
    reports = sorted(gpu_table.REPORTS.glob("*.json"))
    assert reports, "no gpu-check report is kept"
    rows = sum(len(json.loads(p.read_text())["sharing"]) for p in reports)
    assert inside.count("\n| 20") == rows  # one line per row, each starting with its date


def test_a_row_says_what_was_measured_and_whether_it_held(tmp_path: Path) -> None:
    report = {
        "environment": {"date": "2030-01-02", "models": ["GPU X"], "driver": "1.2", "cuda": "9"},
        "hami-core": {"version": "HAMi-core abc1234 (2030-01-01), built with its options"},
        "sharing": [
            {
                "layer": "hami-core",
                "check": "memory, alone",
                "share": "30% / 10 GiB",
                "limit": "10,240 MiB",
                "measured": "largest | buffer",
                "held": False,
            }
        ],
    }
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    (row,) = gpu_table.table([path]).splitlines()[2:]
    assert row == (
        "| 2030-01-02 | GPU X | 1.2, 9 | HAMi-core abc1234 | memory, alone | 30% / 10 GiB "
        "| 10,240 MiB | largest \\| buffer | **no** |"
    )


def test_a_row_written_by_hand_makes_the_check_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "isolation.md"
    page.write_text(
        gpu_table.DOC.read_text().replace(gpu_table.END, "| by hand |\n" + gpu_table.END)
    )
    monkeypatch.setattr(gpu_table, "DOC", page)
    assert gpu_table.main(["--check"]) == 1
    assert gpu_table.main([]) == 0 and gpu_table.main(["--check"]) == 0
    assert "| by hand |" not in page.read_text()


def test_a_hami_core_row_names_the_stamped_build(tmp_path: Path) -> None:
    """A run with the library `make hami-core` built names its version, patch level
    included, as the GPU check reads it from the stamp."""
    report = {
        "environment": {"date": "2030-01-02", "models": ["GPU X"], "driver": "1.2", "cuda": "9"},
        "hami-core": {"version": "HAMi-core 8f3a89c+tessera.2 (x86_64)"},
        "sharing": [
            {
                "layer": "hami-core",
                "check": "CUDA graph launches, alone",
                "share": "30% / 10 GiB",
                "limit": "<= 30%",
                "measured": "0.31",
                "held": True,
            }
        ],
    }
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    (row,) = gpu_table.table([path]).splitlines()[2:]
    assert "| HAMi-core 8f3a89c+tessera.2 | CUDA graph launches, alone |" in row
