"""The core (`tessera/`) does no I/O: no file opened or read, no clock read, no log set-up,
no process started. The import contract in pyproject.toml forbids the modules; this test
also catches what an import contract cannot see (`open` is a builtin, `Path` objects can
arrive from a caller)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "tessera"

FORBIDDEN_CALLS = frozenset({"open", "input", "print", "exec", "eval", "__import__"})
FORBIDDEN_METHODS = frozenset(
    {"read_text", "read_bytes", "write_text", "write_bytes", "open", "iterdir", "unlink"}
)
FORBIDDEN_ATTRIBUTES = frozenset(
    {
        ("time", "time"),
        ("time", "monotonic"),
        ("time", "sleep"),
        ("datetime", "now"),
        ("logging", "basicConfig"),
        ("os", "environ"),
        ("os", "getenv"),
        ("sys", "stdin"),
        ("sys", "stdout"),
        ("sys", "stderr"),
    }
)
FORBIDDEN_MODULES = frozenset(
    {"os", "io", "sys", "time", "logging", "pathlib", "subprocess", "socket", "shutil"}
)


def io_uses(source: str) -> list[str]:
    """Every I/O use in `source`, as 'line: what'."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in FORBIDDEN_CALLS:
                found.append(f"{node.lineno}: {f.id}()")
            elif isinstance(f, ast.Attribute) and f.attr in FORBIDDEN_METHODS:
                found.append(f"{node.lineno}: .{f.attr}()")
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (node.value.id, node.attr) in FORBIDDEN_ATTRIBUTES
        ):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
        if isinstance(node, ast.Import):
            found += [
                f"{node.lineno}: import {a.name}"
                for a in node.names
                if a.name.split(".")[0] in FORBIDDEN_MODULES
            ]
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
            FORBIDDEN_MODULES
        ):
            found.append(f"{node.lineno}: from {node.module} import")
    return found


@pytest.mark.parametrize(
    "snippet",
    [
        "open('x')",
        "p.read_text()",
        "Path(x).read_bytes()",
        "t = time.time()",
        "time.monotonic()",
        "logging.basicConfig(level=1)",
        "import subprocess",
        "from os import path",
        "print('hi')",
    ],
)
def test_the_scan_sees_io(snippet: str) -> None:
    assert io_uses(snippet)


def test_the_scan_leaves_pure_code_alone() -> None:
    assert io_uses("import json\nx = json.loads(s)\nd = {}.get('open')\n") == []


def test_no_core_module_does_io() -> None:
    modules = sorted(CORE.rglob("*.py"))
    assert len(modules) > 10
    problems = [
        f"{m.relative_to(CORE.parent)}:{use}" for m in modules for use in io_uses(m.read_text())
    ]
    assert problems == []
