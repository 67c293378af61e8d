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
            f"| {module} | {r.name} | {r.measured_text()} | {r.target_text()} | "
            f"{'yes' if r.ok else 'NO'} |"
        )
    notes = [f"- {r.name}: {r.note}" for _, r in results if r.note]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


def kept_scale_section(doc: Path) -> str:
    """The Scale section `make bench-scale` wrote (it needs a control plane, so `make bench`
    keeps it as it is) and the written analysis after it (its profile, what did not help)."""
    from bench.scale import SECTION_END, SECTION_START

    text = doc.read_text() if doc.exists() else ""
    if SECTION_START not in text or SECTION_END not in text:
        return ""
    section, after = text.split(SECTION_START, 1)[1].split(SECTION_END, 1)
    return f"\n{SECTION_START}{section}{SECTION_END}{after.rstrip()}\n"


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
    if not args.no_write and not args.only and not args.quick:
        doc = ROOT / "docs" / "benchmarks.md"
        doc.write_text(render(results, args.quick) + kept_scale_section(doc))
    missed = [f"{group}: {r.name}" for group, r in results if not r.ok]
    for line in missed:
        print(f"missed its target: {line}", flush=True)
    # a quick run uses smaller sizes, so its figures are no verdict: it only has to run
    return 0 if args.quick or not missed else 1


if __name__ == "__main__":
    sys.exit(main())
