"""docs/operations.md's table of tessera-scheduler's flags is the parser's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_plugin.cli import build_parser
from tools import flags_doc


def test_the_flags_table_matches_the_parser() -> None:
    assert flags_doc.main(["--check"]) == 0, "run python -m tools.flags_doc"


def test_the_table_lists_every_flag_with_its_variable_and_default() -> None:
    table = flags_doc.render()
    for action in build_parser()._actions:
        for option in action.option_strings:
            if option.startswith("--") and option != "--help":
                assert f"`{option}`" in table, option
    (gangs,) = [row for row in table.splitlines() if row.startswith("| `--no-gangs`")]
    assert "`TESSERA_NO_GANGS`" in gangs and "one by one" in gangs
    (timeout,) = [row for row in table.splitlines() if row.startswith("| `--gang-timeout`")]
    assert "| `60.0` |" in timeout and "planned again 10 seconds later" in timeout


def test_a_stale_table_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "operations.md"
    page.write_text(f"x\n{flags_doc.BEGIN}\n| old |\n{flags_doc.END}\ny\n")
    monkeypatch.setattr(flags_doc, "DOC", page)
    assert flags_doc.main(["--check"]) == 1
    assert flags_doc.main([]) == 0 and flags_doc.main(["--check"]) == 0
    assert page.read_text().startswith("x\n") and page.read_text().endswith("y\n")
