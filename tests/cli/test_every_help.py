"""Every console script of the package prints a --help that says what its switches do: no
`--no-...` switch is shown with `(default: True)`, which reads as if the switch were on by
default. The programs are the ones pyproject.toml installs, and each subcommand's help is
read too, so a new program or subcommand is checked without touching this test."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tessera_cli import CliParser, DefaultsHelpFormatter

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SCRIPTS = sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
_ENTRY = re.compile(r"^  (-\S.*)$")
_SUBCOMMANDS = re.compile(r"^  \{([a-z0-9,-]+)\}$", re.MULTILINE)


def _help(*argv: str) -> str:
    proc = subprocess.run(
        [*argv, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, (argv, proc.stderr)
    return proc.stdout


def _entries(text: str) -> list[str]:
    """Each option's entry of a --help text (its names and help, on one line)."""
    entries: list[str] = []
    for line in text.splitlines():
        if _ENTRY.match(line):
            entries.append(line.strip())
        elif entries and line.startswith("   ") and line.strip():
            entries[-1] += " " + line.strip()
        elif not line.strip() or not line.startswith(" "):
            entries.append("")  # a section ends the entry before it
    return [" ".join(e.split()) for e in entries if e]


def misleading_switches(text: str) -> list[str]:
    """Entries of `--no-...` switches (without their positive twin) that name a default."""
    bad = []
    for entry in _entries(text):
        names = entry.split("  ")[0] if "  " in entry else entry
        offs = re.findall(r"--no-[a-z0-9-]+", entry.split(" ", 1)[0] + " " + names)
        if not offs:
            continue
        paired = any(f"--{off[5:]}," in entry or f"--{off[5:]} " in entry for off in offs)
        if not paired and "(default:" in entry:
            bad.append(entry)
    return bad


def test_the_check_finds_what_the_plain_formatter_prints() -> None:
    """The check can fail: argparse's own defaults formatter shows an off-switch as
    `(default: True)`; ours does not, and still names a value flag's default."""
    for formatter, misleading in (
        (argparse.ArgumentDefaultsHelpFormatter, True),
        (DefaultsHelpFormatter, False),
    ):
        p = CliParser(prog="x", formatter_class=formatter, env={})
        p.add_argument("--no-watch", dest="watch", action="store_false", help="do not watch")
        p.add_argument("--interval", type=float, default=2.5, help="seconds between rounds")
        p.add_argument("--elect", action=argparse.BooleanOptionalAction, default=True, help="e")
        text = p.format_help()
        assert bool(misleading_switches(text)) is misleading, text
        assert "(default: 2.5)" in " ".join(text.split())
        assert "--elect, --no-elect" in text


@pytest.mark.parametrize("program", SCRIPTS)
def test_no_program_shows_an_off_switch_as_on_by_default(program: str) -> None:
    text = _help(str(BIN / program))
    checked = [text]
    for found in _SUBCOMMANDS.findall(text):
        for sub in found.split(","):
            checked.append(_help(str(BIN / program), sub))
    for help_text in checked:
        assert not misleading_switches(help_text), misleading_switches(help_text)
    assert any("--" in t for t in checked)
