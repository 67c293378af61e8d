"""Aligned text tables, as kubectl prints them."""

from __future__ import annotations

from collections.abc import Sequence


def render(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns left-aligned, separated by three spaces; the last column is not padded."""
    cells = [[clean(c) for c in headers], *[[clean(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        lines.append("   ".join([*padded, row[-1]]).rstrip())
    return "\n".join(lines)


def clean(cell: str) -> str:
    """One line, no control characters: names and reasons come from the cluster, and a
    writer must not be able to forge table rows or terminal escapes."""
    return "".join(ch if ch.isprintable() else "?" for ch in " ".join(str(cell).split()))
