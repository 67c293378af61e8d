"""The scheduler stays a house of small rooms: no module of scheduler_plugin/ over 600
lines and no class over 400 (docs/architecture.md). A part that outgrows them is cut by
concern, as the state's parts were, rather than left to grow."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.scheduler.helpers import ROOT

PACKAGE = ROOT / "scheduler_plugin"
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400


def _modules() -> list[Path]:
    found = sorted(PACKAGE.rglob("*.py"))
    assert len(found) > 20, "the scheduler's modules were not found"
    return found


def test_no_module_is_over_its_limit() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_class_is_over_its_limit() -> None:
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert not long, f"classes over {MAX_CLASS_LINES} lines: {long}"
