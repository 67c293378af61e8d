"""Run every benchmark module (bench/bench_*.py) and write docs/benchmarks.md.

A benchmark module exposes `run(ctx: BenchContext) -> list[Result]`. Each result carries
its target, so the table says at a glance which goals hold on this machine.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
import time
from pathlib import Path

from bench.common import BenchContext, Result, uncache_libraries

ROOT = Path(__file__).resolve().parent.parent


def discover(only: list[str]) -> list[str]:
    names = sorted(p.stem for p in (ROOT / "bench").glob("bench_*.py"))
    if only:
        names = [n for n in names if any(o in n for o in only)]
    return names


def render(results: list[tuple[str, Result]], quick: bool) -> str:
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`python -m bench.run_all`); do not edit by hand.",
        "",
        f"- machine: {platform.machine()}, {platform.processor() or 'unknown cpu'}, "
        f"Python {platform.python_version()}",
        f"- date: {time.strftime('%Y-%m-%d')}",
        f"- mode: {'quick (reduced sizes)' if quick else 'full'}",
        "",
        "| module | benchmark | measured | target | holds |",
        "|---|---|---|---|---|",
    ]
    for module, r in results:
        lines.append(
            f"| {module} | {r.name} | {r.measured_text()} | {r.target_text()} | {r.verdict()} |"
        )
    notes = [f"- {r.name}: {r.note}" for _, r in results if r.note]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


def kept_sections(doc: Path) -> str:
    """Everything from the first section that `make bench-scale` or `make soak` wrote to the
    end of the page: those need a control plane, and the written analysis beside them (the
    profile, what did not help) is not `make bench`'s, so `make bench` keeps it as it is."""
    from bench import scale, soak

    text = doc.read_text() if doc.exists() else ""
    found = [text.index(s) for s in (scale.SECTION_START, soak.SECTION_START) if s in text]
    if not found:
        return ""
    return "\n" + text[min(found) :].rstrip() + "\n"


def merge(text: str, results: list[tuple[str, Result]]) -> str:
    """`text` (docs/benchmarks.md) with the rows and notes of the modules in `results`
    replaced by theirs: rows at the end of the table, notes at the end of the notes, each
    note saying when it was measured (the header's date is the whole run's)."""
    fresh = render(results, quick=False).splitlines()
    groups = {group for group, _ in results}
    rows = [line for line in fresh if line.startswith("| ") and not line.startswith("| module")]
    rows = [line for line in rows if not line.startswith("|---")]
    notes = fresh[fresh.index("Notes:") + 1 :] if "Notes:" in fresh else []
    day = time.strftime("%Y-%m-%d")
    notes = [
        f"{line.rstrip()} (measured {day}, `--only {' --only '.join(sorted(groups))}`)"
        for line in notes
        if line
    ]
    names = tuple(f"- {r.name}: " for _, r in results)
    lines = [
        line
        for line in text.splitlines()
        if not (line.startswith("| ") and line[2:].split(" | ")[0] in groups)
        and not line.startswith(names)
    ]
    from bench import scale, soak

    starts = (scale.SECTION_START, soak.SECTION_START)
    end = next((i for i, line in enumerate(lines) if line.startswith(starts)), len(lines))
    last_row = max(i for i, line in enumerate(lines[:end]) if line.startswith("| "))
    lines[last_row + 1 : last_row + 1] = rows
    if "Notes:" in lines[:end]:
        at = lines.index("Notes:") + 1
        while at < len(lines) and lines[at].startswith("- "):
            at += 1
        lines[at:at] = notes
    elif notes:
        at = last_row + 1 + len(rows)
        lines[at:at] = ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--openb", type=Path, default=ROOT.parent / "shared" / "data" / "openb")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="reduced sizes, for a smoke run: never rewrites docs/benchmarks.md and exits 0 "
        "unless a benchmark fails to run",
    )
    parser.add_argument("--only", action="append", default=[], help="substring of module names")
    parser.add_argument("--no-write", action="store_true", help="do not rewrite docs/benchmarks.md")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="with --only: put the figures of the modules run into docs/benchmarks.md in place "
        "of their old rows and notes, leaving the other modules' as they are",
    )
    args = parser.parse_args(argv)
    ctx = BenchContext(openb=args.openb, quick=args.quick)
    uncache_libraries()  # before any benchmark maps them (see its doc)
    results: list[tuple[str, Result]] = []
    for name in discover(args.only):
        module = importlib.import_module(f"bench.{name}")
        print(f"== {name}", flush=True)
        for r in module.run(ctx):
            print(f"   {r.name}: {r.measured_text()} (target {r.target_text()})", flush=True)
            results.append((name.removeprefix("bench_"), r))
    doc = ROOT / "docs" / "benchmarks.md"
    if not args.no_write and not args.only and not args.quick:
        doc.write_text(render(results, args.quick) + kept_sections(doc))
    elif args.merge and args.only and not args.quick and results:
        doc.write_text(merge(doc.read_text(), results))
    missed = [f"{group}: {r.name}" for group, r in results if not r.ok]
    for line in missed:
        print(f"missed its target: {line}", flush=True)
    # a quick run uses smaller sizes, so its figures are no verdict: it only has to run
    return 0 if args.quick or not missed else 1


if __name__ == "__main__":
    sys.exit(main())
