"""`make bench-scale`: how fast pods are placed at cluster scale, tessera beside a stock
kube-scheduler against kube-scheduler alone.

With the Kubernetes binaries ($TESSERA_E2E_BIN: etcd, kube-apiserver, kube-scheduler) it
runs a real control plane (bench/scale_real.py); without them, tessera-scheduler against the
testbed API server with a driver in kube-scheduler's place (bench/scale_testbed.py).
`--write` puts the figures into the "Scale" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from bench import scale_common as sc
from bench.common import percentile, uncache_libraries

SECTION_START = "<!-- scale: written by make bench-scale -->"
SECTION_END = "<!-- /scale -->"
QPS = (200, 50)
"""kube-scheduler's client rate limits: a raised one (burst twice it), and its stock 50/100."""
TARGETS = {200: 0.8, 50: 1.0}
"""tessera's pods/s over kube-scheduler alone's at each qps (at 200, where the machine's CPU
sets the pace, 0.8x is the tessera path costing at most 1.25x kube-scheduler alone's)."""


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def real(args: argparse.Namespace) -> list[str]:
    from bench.scale_real import RealScale, Series

    bench = RealScale(
        args.nodes,
        args.pods,
        args.rounds,
        log,
        args.profile,
        tuple(args.tessera_arg),
        args.py_spy,
        args.py_spy_native,
    )
    load_before = sc.load_text()
    try:
        bench.start()
        series: dict[tuple[str, int], Series] = {}
        for qps in args.qps:
            for tessera in (True, False):
                one = bench.series(tessera, qps)
                series[("tessera" if tessera else "alone", qps)] = one
        rss = bench.tessera_peak_rss()
        if args.floor:
            bench.use_floor()
            for qps in args.qps:
                series[("floor", qps)] = bench.series(True, qps)
    finally:
        bench.stop(keep=args.keep)
    load_after = sc.load_text()
    lines = [
        f"Real control plane: etcd, kube-apiserver, kube-scheduler "
        f"{args.kube_scheduler_version}, tessera-scheduler; {args.nodes} API-only nodes "
        f"(8x H100 80GB, 4 RDMA NICs each); rounds of {args.pods} pods created while "
        "kube-scheduler is stopped, timed from its resume until every pod is bound; best of "
        f"{args.rounds}. Machine: {load_before} before, {load_after} after (shared).",
        "",
        "| kube-scheduler qps/burst | tessera pods/s | alone pods/s | ratio | target | holds |",
        "|---|---|---|---|---|---|",
    ]
    for qps in args.qps:
        t, a = series[("tessera", qps)], series[("alone", qps)]
        ratio = t.pods_per_s / a.pods_per_s
        lines.append(
            f"| {qps}/{2 * qps} | {t.pods_per_s:.1f} | {a.pods_per_s:.1f} | {ratio:.2f}x "
            f"| >= {TARGETS[qps]}x | {'yes' if ratio >= TARGETS[qps] else 'NO'} |"
        )
    lines += [
        "",
        "| run | control-plane CPU s per 1,000 pods (apiserver / etcd / kube-scheduler / "
        "tessera-scheduler) | extender filter p50 / prioritize p50 / bind p99 "
        "| API server's Binding p50 / p99 | extender connections opened | valid records |",
        "|---|---|---|---|---|---|",
    ]
    for (who, qps), s in series.items():
        cpu = s.cpu_per_1000()
        cpu_text = " / ".join(
            f"{cpu.get(k, 0.0):.1f}"
            for k in ("kube-apiserver", "etcd", "kube-scheduler", "tessera-scheduler")
        )
        verbs = s.best.verbs
        if who in ("tessera", "floor"):
            lat = " / ".join(
                sc.ms(verbs[v].quantile(q)) if v in verbs else "-"
                for v, q in (("filter", 0.5), ("prioritize", 0.5), ("bind", 0.99))
            )
            records = f"{s.best.valid_records} of {args.pods}" if who == "tessera" else "-"
            opened = f"{s.best.connections:.0f}"
        else:
            lat, records, opened = "-", "-", "-"
        binding = s.best.binding
        api = f"{sc.ms(binding.quantile(0.5))} / {sc.ms(binding.quantile(0.99))}"
        lines.append(
            f"| {who}, qps {qps} | {cpu_text} (sum {sum(cpu.values()):.1f}) | {lat} | {api} "
            f"| {opened} | {records} |"
        )
    lines += ["", f"tessera-scheduler peak RSS (VmHWM): {rss:.0f} MiB."]
    for (who, qps), s in series.items():
        write = s.best.verbs.get(sc.BINDING_WRITE) if who == "tessera" else None
        if write is not None and write.count:
            lines += [
                "",
                f"tessera-scheduler's binds (qps {qps}, best round): "
                f"{sc.bind_latencies(s.best.verbs, s.best.binding)}. Its Binding POST less "
                "the API server's is the wait on the way and for tessera-scheduler's event loop.",
            ]
    for (who, qps), s in series.items():
        if who != "alone" and s.best.threads:
            name = "The floor extender" if who == "floor" else "tessera-scheduler"
            lines += [
                "",
                f"{name} CPU ms per pod by thread (qps {qps}, best round): "
                f"{sc.by_thread(s.best.threads, args.pods)}.",
            ]
    return lines


def testbed(args: argparse.Namespace) -> list[str]:
    from bench.scale_testbed import TestbedScale

    bench = TestbedScale(args.nodes, args.pods, args.rounds, log)
    load_before = sc.load_text()
    try:
        bench.start()
        rounds = bench.run()
        rss = bench.peak_rss()
    finally:
        bench.stop()
    best = min(rounds, key=lambda r: r.seconds)
    # none when filter answered one node per pod (kube-scheduler then skips prioritize)
    prioritize = f"{percentile(best.prioritize_ms, 50):.1f} ms" if best.prioritize_ms else "-"
    return [
        f"Testbed (no Kubernetes binaries): tessera-scheduler against the testbed API server, "
        f"a driver making kube-scheduler's filter, prioritize and bind calls; {args.nodes} "
        f"nodes (8x H100 80GB, 4 RDMA NICs each), {sc.feasible_to_find(args.nodes)} node "
        f"names per filter, rounds of {args.pods} pods, best of {args.rounds}. Machine: "
        f"{load_before} (shared).",
        "",
        "| pods/s | filter p50 | prioritize p50 | bind p99 | failed | peak RSS |",
        "|---|---|---|---|---|---|",
        f"| {args.pods / best.seconds:.1f} | {percentile(best.filter_ms, 50):.1f} ms "
        f"| {prioritize} | {percentile(best.bind_ms, 99):.1f} ms "
        f"| {best.failed} | {rss:.0f} MiB |",
    ]


def write_section(
    lines: list[str],
    path: Path = sc.ROOT / "docs" / "benchmarks.md",
    *,
    start: str = SECTION_START,
    end: str = SECTION_END,
    title: str = "Scale",
) -> None:
    """Replace a marked section of docs/benchmarks.md (kept by `make bench`): the Scale
    section unless told another (the soak's)."""
    text = path.read_text()
    body = "\n".join([start, f"## {title}", "", *lines, end])
    if start in text and end in text:
        head, rest = text.split(start, 1)
        tail = rest.split(end, 1)[1]
        text = head + body + tail
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    path.write_text(text)


def kube_scheduler_version() -> str:
    import subprocess

    from tests.e2e import binaries

    path = binaries.find("kube-scheduler")
    if path is None:
        return ""
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip().rsplit(" ", 1)[-1]


def choose_mode(requested: str, asked_real: bool, missing: str) -> str:
    """ "real" or "testbed" for `--mode requested`. `auto` falls back to the testbed only when
    no binary was named at all: a named folder or binary that lacks one is a mistake to
    report, not a reason to measure (and maybe --write) the testbed in the real run's place.
    `missing` is binaries.missing()'s line ('' when every binary is there)."""
    if requested == "testbed":
        return "testbed"
    if not missing:
        return "real"
    if requested == "real" or asked_real:
        raise ValueError(missing)
    return "testbed"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, default=500, help="API-only nodes (full run: 5000)")
    p.add_argument("--pods", type=int, default=200, help="pods per round (full run: 1000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per configuration (best counts)")
    p.add_argument(
        "--mode",
        choices=("auto", "real", "testbed"),
        default="auto",
        help="auto: real when $TESSERA_E2E_BIN has the binaries; testbed when no binary is "
        "named at all; an error when a named folder or binary lacks one",
    )
    p.add_argument("--write", action="store_true", help="write docs/benchmarks.md's Scale section")
    p.add_argument("--keep", action="store_true", help="keep the real run's work folder (logs)")
    p.add_argument(
        "--profile",
        type=Path,
        help="real run: sample tessera-scheduler's stacks during its first series into this file",
    )
    p.add_argument(
        "--py-spy",
        type=Path,
        help="real run: py-spy on tessera-scheduler during each round of its first series, "
        "collapsed stacks into FILE.<round> (summarize: python -m bench.profile_table), and "
        "perf's CPU samples into FILE.<round>.perf where perf is installed",
    )
    p.add_argument(
        "--py-spy-native",
        action="store_true",
        help="py-spy with native frames (it stops the process for each sample: slow)",
    )
    p.add_argument(
        "--qps",
        type=int,
        action="append",
        choices=QPS,
        help="real run: only this kube-scheduler qps (repeatable; default: all of them)",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="real run: then the same rounds with bench.floor_extender in tessera-scheduler's "
        "place (the least any Python extender spends per pod here; a 'floor' row)",
    )
    p.add_argument(
        "--tessera-arg",
        action="append",
        default=[],
        help="real run: one more tessera-scheduler flag (repeatable), to compare settings",
    )
    args = p.parse_args(argv)
    args.qps = tuple(args.qps or QPS)
    from tests.e2e import binaries

    asked_real = any(os.environ.get(v) for v in (binaries.FOLDER_VAR, *binaries.VARS.values()))
    try:
        mode = choose_mode(args.mode, asked_real, binaries.missing(*binaries.CONTROL_PLANE))
    except ValueError as exc:
        p.error(str(exc))
    uncache_libraries()  # tessera-scheduler's RSS from libraries read back from disk
    if mode == "real":
        args.kube_scheduler_version = kube_scheduler_version()
        lines = real(args)
    else:
        lines = testbed(args)
    print("\n".join(lines))
    if args.write:
        write_section(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
