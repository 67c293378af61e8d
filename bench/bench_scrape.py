"""A real Prometheus scraping tessera-scheduler at 5,000 nodes x 8 GPUs.

A child process holds the scheduler's state as bench_memory builds it (5,000 nodes of 8
GPUs, 50,000 running pods with signed records, a fresh heartbeat Lease per node, loaded
through the watch handlers) and serves its plain-HTTP health port, where Prometheus
scrapes /metrics as shipped: the state gauges, the histograms and counters, and three
series per GPU (120,000), streamed out a few hundred nodes at a time.

Debian's `prometheus` (tests/e2e/prometheus.py runs it) scrapes it every SCRAPE_INTERVAL
seconds, the timeout as long as the interval. Figures:

- scrape duration p50 and p99: Prometheus's own `scrape_duration_seconds` for the target,
  every sample of the measured window read back over its HTTP API. It covers the HTTP
  request, reading the answer, and Prometheus parsing and storing its samples;
- tessera-scheduler's CPU per scrape: the child process's CPU time (user + system, from
  /proc) over the window of scrapes, less its CPU over an idle window of the same length
  just before Prometheus starts, divided by the scrapes in the window. The window opens
  and closes between two scrapes. The scheduler keeps no timing of its own /metrics work,
  so this is the figure; at a 30 s interval (the chart's ServiceMonitor default) it is
  that CPU over 30 s, as a share of one core.

Needs the `prometheus` binary: without it the rows say `not run`, with one line why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from bench.common import BenchContext, Result, percentile

ROOT = Path(__file__).resolve().parent.parent
SCRAPE_INTERVAL = 2.0
"""Seconds between scrapes here: a short interval gets many scrapes in little time, the
scheduler being busy with one at a time (at 30 s it would be the same work, less often)."""
DEPLOYED_INTERVAL = 30.0
"""The chart's ServiceMonitor interval (`metrics.serviceMonitor.interval`)."""
P99_TARGET_S = 2.0
CORE_TARGET_PCT = 5.0


def names(nodes: int) -> tuple[str, str, str, str]:
    """The four rows' names at this size."""
    scale = f"{nodes:,} nodes x 8 GPUs"
    return (
        f"Prometheus scrape of tessera-scheduler, {scale}, p50",
        f"Prometheus scrape of tessera-scheduler, {scale}, p99",
        f"tessera-scheduler CPU per scrape, {scale}",
        f"tessera-scheduler CPU scraped every {DEPLOYED_INTERVAL:g} s, {scale}",
    )


def scrape_child(nodes: int, pods: int) -> None:
    """Builds the scheduler's state, prints its health port, then serves until stdin
    closes."""
    from bench.bench_memory import bench_keyring, node_object, node_pods, serving_with_keyring
    from tessera_testbed.inventory import heartbeat_lease

    keyring = bench_keyring()
    service = serving_with_keyring(keyring, health_port=0)
    handlers = {i.name: i.handler for i in service.informers}
    node_names = [f"node-{n:05d}" for n in range(nodes)]
    handlers["nodes"].replace(iter([{"metadata": {"name": n}} for n in node_names]))
    handlers["nodedevices"].replace(iter(node_object(n, 1) for n in node_names))
    handlers["leases"].replace(iter(heartbeat_lease(n) for n in node_names))
    per_node = pods // nodes
    handlers["pods"].replace(p for n in node_names for p in node_pods(n, per_node, "a", keyring))
    stats = service.cache.stats()
    assert stats.confirmed == per_node * nodes and stats.unusable == 0, stats
    service.settle_memory()
    print(service.health_server.port, flush=True)
    sys.stdin.read()
    service.health_server.stop()
    service.server.stop()


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) the process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Scrapes:
    """The target's scrapes as Prometheus recorded them."""

    def __init__(self, prometheus: Any) -> None:
        self.prometheus = prometheus
        self.last = 0.0

    def next_done(self, timeout: float) -> tuple[float, float]:
        """Wait for a scrape newer than the last one seen to be recorded; its (start,
        duration). Prometheus stores the duration once the scrape is done, so the caller is
        then between two scrapes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.prometheus.query(
                'timestamp(scrape_duration_seconds{job="tessera-scheduler"})'
            )
            if found and float(found[0]["value"][1]) > self.last:
                self.last = float(found[0]["value"][1])
                (duration,) = self.prometheus.query(
                    'scrape_duration_seconds{job="tessera-scheduler"}'
                )
                return self.last, float(duration["value"][1])
            time.sleep(0.05)
        raise RuntimeError(f"no new scrape of tessera-scheduler in {timeout:.0f}s")

    def window(self, start: float, end: float) -> list[tuple[str, list[tuple[float, str]]]]:
        """(metric, [(timestamp, value)]) of each per-scrape series of the target started
        between `start` and `end` (Unix times)."""
        span = f"{max(1, round(time.time() - start + 1))}s"
        out = []
        for metric in ("scrape_duration_seconds", "up", "scrape_samples_scraped"):
            (series,) = self.prometheus.query(f'{metric}{{job="tessera-scheduler"}}[{span}]')
            values = [(float(t), v) for t, v in series["values"] if start < float(t) < end]
            out.append((metric, values))
        return out


@contextmanager
def scheduler_child(nodes: int, pods: int) -> Iterator[tuple[int, int]]:
    """The scheduler in a child process for the block: its (pid, health port)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.bench_scrape", "--child", str(nodes), str(pods)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        line = child.stdout.readline()
        if not line.strip():
            raise RuntimeError(f"the scheduler child failed ({child.wait()})")
        yield child.pid, int(line)
    finally:
        child.stdin.close()
        try:
            child.wait(15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        child.stdout.close()


def not_run(nodes: int, why: str) -> list[Result]:
    """The rows, marked not run, with `why`."""
    p50, p99, cpu, share = names(nodes)
    return [
        Result.not_run(p50, "s", None, why),
        Result.not_run(p99, "s", P99_TARGET_S, why),
        Result.not_run(cpu, "s CPU", None, why),
        Result.not_run(share, "% of a core", CORE_TARGET_PCT, why),
    ]


def run(ctx: BenchContext) -> list[Result]:
    from tests.e2e import prometheus as prom
    from tests.e2e.controlplane import free_port

    nodes = ctx.sized(500, 5000)
    pods = nodes * 10
    scrapes = ctx.sized(10, 45)
    executable = prom.binary()
    if executable is None:
        why = prom.missing("the scrape benchmark")
        print(f"   not run: {why}", flush=True)
        return not_run(nodes, why)
    with scheduler_child(nodes, pods) as (pid, port), TemporaryDirectory() as tmp:
        # the idle baseline: the same length as the window of scrapes, nothing scraping
        length = scrapes * SCRAPE_INTERVAL
        time.sleep(2)
        idle_before = process_cpu(pid)
        time.sleep(length)
        idle_rate = (process_cpu(pid) - idle_before) / length
        config = prom.scrape_config(
            {prom.SCHEDULER_JOB: [f"127.0.0.1:{port}"]},
            scrape_interval=SCRAPE_INTERVAL,
            evaluation_interval=60,
        )
        with prom.running(executable, Path(tmp), config, free_port()) as prometheus:
            seen = _Scrapes(prometheus)
            seen.next_done(60)  # the first scrape (a cold one) is not counted
            start, _ = seen.next_done(30)
            opened, cpu_opened = time.time(), process_cpu(pid)
            last = start
            for _ in range(scrapes):
                last, _ = seen.next_done(30)
            closed, cpu_closed = time.time(), process_cpu(pid)
            recorded = dict(seen.window(start, last + 0.001))
    durations = [float(v) for _, v in recorded["scrape_duration_seconds"]]
    failed = sum(1 for _, v in recorded["up"] if v != "1")
    series = max(int(float(v)) for _, v in recorded["scrape_samples_scraped"])
    counted = len(durations)
    if counted != scrapes:
        raise RuntimeError(f"expected {scrapes} scrapes in the window, Prometheus has {counted}")
    busy = cpu_closed - cpu_opened - idle_rate * (closed - opened)
    per_scrape = busy / counted
    share = per_scrape / DEPLOYED_INTERVAL * 100
    p50, p99, cpu, at_30 = names(nodes)
    where = (
        f"{counted} scrapes {SCRAPE_INTERVAL:g} s apart (the first one left out), "
        f"{series:,} samples each, {failed} failed"
    )
    # a scrape that timed out took longer than its timeout: no p99 holds with one
    slowest = percentile(durations, 99) if failed == 0 else float("inf")
    return [
        Result(
            p50,
            percentile(durations, 50),
            "s",
            note=f"{where}; Prometheus's own scrape_duration_seconds (the request, reading "
            f"the answer, parsing and storing its samples); slowest {max(durations):.2f} s",
        ),
        Result(p99, slowest, "s", P99_TARGET_S),
        Result(
            cpu,
            per_scrape,
            "s CPU",
            note=f"the scheduler process's CPU over the {closed - opened:.0f} s of {counted} "
            f"scrapes ({cpu_closed - cpu_opened:.2f} s) less its idle CPU over as long "
            f"before Prometheus started ({idle_rate * 100:.2f} % of a core), per scrape",
        ),
        Result(at_30, share, "% of a core", CORE_TARGET_PCT),
    ]


if __name__ == "__main__":
    if "--child" in sys.argv:
        at = sys.argv.index("--child")
        scrape_child(int(sys.argv[at + 1]), int(sys.argv[at + 2]))
    else:
        for r in run(BenchContext(openb=ROOT, quick="--quick" in sys.argv)):
            print(f"{r.name}: {r.measured_text()} (target {r.target_text()}) {r.note}")
