"""The generated part of a page: what lies between two marker lines, rewritten from code."""

from __future__ import annotations

import sys
from pathlib import Path


def replace_between(text: str, begin: str, end: str, generated: str, page: Path) -> str:
    """`text` with the part between `begin` and `end` replaced by `generated` (which ends
    with a newline)."""
    head, sep, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise ValueError(f"{page}: the markers {begin!r} and {end!r} are missing")
    return f"{head}{begin}\n{generated}{end}{tail}"


def write_or_check(page: Path, wanted: str, check: bool, command: str) -> int:
    """Write `wanted` to `page`; with `check`, only say (exit status 1) that the page is
    stale and which command rewrites it."""
    if not check:
        page.write_text(wanted)
        return 0
    if wanted != page.read_text():
        print(f"{page} is stale: run {command}", file=sys.stderr)
        return 1
    return 0
