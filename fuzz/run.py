"""Run every fuzz surface in its own process and write the figures to docs/security.md.

Each `fuzz/surface_<name>.py` exposes `run(n: int, seed: int) -> Tally`. A surface runs in a
child process so that its peak RSS (the server under attack lives in that process) is its
own; a child that dies counts as a crash.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- fuzz figures: begin (written by make fuzz) -->"
END = "<!-- fuzz figures: end -->"


def discover(only: list[str]) -> list[str]:
    names = sorted(p.stem.removeprefix("surface_") for p in (ROOT / "fuzz").glob("surface_*.py"))
    return [n for n in names if not only or n in only]


def run_child(name: str, n: int, seed: int) -> tuple[dict[str, object], float, float]:
    """Run one surface in a child; return its tally, peak RSS (MiB) and wall seconds."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fuzz.run",
            "--child",
            name,
            "--inputs",
            str(n),
            "--seed",
            str(seed),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - start
    peak_mib = usage.ru_maxrss / 1024
    if proc.returncode != 0:
        return (
            {
                "surface": name,
                "inputs": 0,
                "crashes": 1,
                "server_errors": 0,
                "forgeries": 0,
                "examples": [f"process exited {proc.returncode}"],
            },
            peak_mib,
            wall,
        )
    return json.loads(out.decode().strip().splitlines()[-1]), peak_mib, wall


def render(rows: list[tuple[dict[str, object], float, float]], seed: int) -> str:
    lines = [
        BEGIN,
        "",
        f"`make fuzz` on {time.strftime('%Y-%m-%d')}, {platform.machine()}, "
        f"Python {platform.python_version()}, seed {seed}:",
        "",
        "| surface | inputs tried | crashes | 5xx for client input | accepted forgeries "
        "| peak RSS | time |",
        "|---|---|---|---|---|---|---|",
    ]
    for tally, peak, wall in rows:
        lines.append(
            f"| {tally['surface']} | {tally['inputs']:,} | {tally['crashes']} | "
            f"{tally['server_errors']} | {tally['forgeries']} | {peak:.0f} MiB | {wall:.0f} s |"
        )
    examples = [f"- {t['surface']}: {e}" for t, _, _ in rows for e in t.get("examples", [])]  # type: ignore[attr-defined]
    if examples:
        lines += ["", "Failing inputs seen:", *examples]
    lines += ["", END]
    return "\n".join(lines)


def write_doc(text: str) -> None:
    doc = ROOT / "docs" / "security.md"
    current = doc.read_text()
    head, _, rest = current.partition(BEGIN)
    _, _, tail = rest.partition(END)
    doc.write_text(head + text + tail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs per surface")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", action="append", default=[], help="run only this surface")
    parser.add_argument("--no-write", action="store_true", help="do not rewrite docs/security.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        module = importlib.import_module(f"fuzz.surface_{args.child}")
        tally = module.run(args.inputs, args.seed)
        print(json.dumps(asdict(tally)), flush=True)
        return 0
    rows = []
    for name in discover(args.only):
        print(f"== {name}: {args.inputs:,} inputs", flush=True)
        row = run_child(name, args.inputs, args.seed)
        tally = row[0]
        print(
            f"   crashes {tally['crashes']}, 5xx {tally['server_errors']}, "
            f"forgeries {tally['forgeries']}, peak {row[1]:.0f} MiB, {row[2]:.0f} s",
            flush=True,
        )
        rows.append(row)
    if not args.no_write and not args.only:
        write_doc(render(rows, args.seed))
    bad = sum(
        int(t["crashes"]) + int(t["server_errors"]) + int(t["forgeries"])  # type: ignore[call-overload]
        for t, _, _ in rows
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
