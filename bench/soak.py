"""`make soak`: pod create/delete cycles through the real control plane and a real node,
chaos off, watching tessera's programs for leaks.

The end-to-end suite's pieces (tests/e2e): etcd, kube-apiserver, kube-scheduler with the
extender, one tessera-scheduler, and one node with the newest containerd given, the real
kubelet, tessera's node agent (fake backend) and NRI hook. Each cycle creates a pod asking
for a quarter of a GPU, waits until its container runs (scheduled, bound with a record,
device plugin Allocate, the hook's adjustment at creation) and deletes it; `--parallel`
cycles are in flight at once. Every `--sample-every` cycles it reads the RSS, open fds
and threads of tessera-scheduler, the agent and the hook from /proc, and counts the API
objects tessera owns. After the warm-up (the first fifth) RSS may grow less than 5 MiB,
fds and threads stay flat and no object count grows (bench/soak_figures.py); `--write`
puts the figures into docs/benchmarks.md's Soak section. Needs root and
$TESSERA_E2E_BIN, as the node suite does.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import scale_common as sc
from bench import soak_figures as sf
from bench.scale import write_section
from kube_edge.client import pod_path
from tessera import resources as rn

SECTION_START = "<!-- soak: written by make soak -->"
SECTION_END = "<!-- /soak -->"
NODE = "soak-node"
DEFAULT_CYCLES = 10_000
BOUNDED = [
    "",
    "What tessera-scheduler keeps per pod, and the most it can reach (tracemalloc, with "
    "`python -m bench.bench_pod_cycles` driving its real code in one process through 20,000 "
    "cycles on the simulated API server):",
    "",
    "- the fragmentation policy's memory of the last 8,192 pod UIDs it counted (a pod filtered "
    "again counts once): 0.6 MiB when full, after 8,192 pods; a short soak sees it filling;",
    "- the extender's parsed requests between filter and bind: each bind drops its own, so "
    "only pods filtered and never bound here stay, at most 4,096: 4.9 MiB when full "
    "(about 1.2 KiB for a one-container pod);",
    "- the Event recorder's rate-limit memory (Warning Events, only for pods that fence their "
    "node): at most 10,000 (pod, reason) pairs, 1.5 MiB;",
    "- the online workload's pod classes: at most 1,024 (about 200 B each, 0.2 MiB);",
    "- everything else about a pod (its allocation, verdict memo, priority, assumed bind, "
    "invalid record, fence) goes when its deletion is seen; no metric has a pod, namespace "
    "or node label that outlives its object (the per-GPU series are read from the state at "
    "each scrape).",
    "",
    "Over those 20,000 cycles the traced memory stops growing once the UID memory is full "
    "(+0.14 MiB over the last 8,400 cycles, about 16 B a cycle) and RSS with it (+0.1 MiB): "
    "the scheduler's growth over a short run is that table filling, not a per-pod leak.",
]
"""Bounded per-pod tables, written under the figures (see bench/bench_pod_cycles.py)."""
RUN_TIMEOUT = 180.0
"""Seconds from one pod's creation to its container running."""


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def read_proc(pid: int) -> tuple[int, int, int]:
    """(VmRSS in KiB, open fds, threads) of a live process."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    fds = sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
    return int(status["VmRSS"].split()[0]), fds, int(status["Threads"])


class Soak:
    def __init__(self, cycles: int, parallel: int, sample_every: int, keep: bool) -> None:
        self.cycles = cycles
        self.parallel = parallel
        self.sample_every = sample_every
        self.keep = keep
        self.samples: dict[str, list[sf.Sample]] = {}
        self.objects: list[tuple[int, dict[str, int]]] = []
        self.done = 0
        self.failed: list[str] = []
        self._lock = threading.Lock()

    # --- the cluster -----------------------------------------------------------------------

    def start(self) -> None:
        from tests.e2e import binaries
        from tests.e2e.controlplane import ControlPlane
        from tests.e2e.node import Node, device_root, node_host_or_skip

        bins = binaries.require(*binaries.CONTROL_PLANE, "kubelet", "runc")
        busybox = node_host_or_skip("make soak")
        self.work = Path(tempfile.mkdtemp(prefix="tessera-soak-"))
        self.cp = ControlPlane(self.work, bins)
        self.cp.start_api()
        self.cp.install()
        self.cp.start_schedulers(replicas=1)
        self.node = Node.h100(self.cp, NODE, binaries.containerd_releases()[-1], busybox)
        devices = device_root(self.node.work / "host", gpus=8, uverbs=36)
        self.node.start_containerd()
        self.node.import_image()
        self.node.start_hook(devices)
        self.node.start_kubelet()
        self.node.start_agent()
        from tests.e2e.controlplane import wait_for

        def advertised() -> bool:
            node = self.cp.admin.get(f"/api/v1/nodes/{NODE}")
            return int((node["status"].get("allocatable") or {}).get(rn.GPU, "0")) > 0

        wait_for(advertised, 120, "the node advertising tessera resources", every=1)
        self.programs = {
            "tessera-scheduler": self.cp.procs["tessera-scheduler-0"],
            "node agent": self.node.procs["agent"],
            "NRI hook": self.node.procs["nri-hook"],
        }

    def stop(self) -> None:
        self.node.stop()
        self.cp.stop()
        if self.keep:
            log(f"work folder kept: {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)

    # --- the cycles ------------------------------------------------------------------------

    def cycle(self, i: int) -> None:
        from tests.e2e import pods as P  # noqa: N812
        from tests.e2e.node import IMAGE

        name = f"soak-{i}"
        obj = P.pod(name, {rn.GPU: "25"})
        obj["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
        for c in obj["spec"]["containers"]:
            c["image"] = IMAGE
            c["imagePullPolicy"] = "Never"
        admin = self.cp.admin
        admin.create(pod_path(P.NS), obj)
        deadline = time.monotonic() + RUN_TIMEOUT
        try:
            while True:
                got = admin.get(pod_path(P.NS, name))
                statuses = got.get("status", {}).get("containerStatuses") or []
                if statuses and "running" in (statuses[0].get("state") or {}):
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{name} not running after {RUN_TIMEOUT:.0f}s: {got.get('status')}"
                    )
                time.sleep(0.2)
        finally:
            P.delete_now(admin, name)
        with self._lock:
            self.done += 1
            if self.done % self.sample_every == 0:
                self.sample(self.done)

    def sample(self, cycle: int) -> None:
        for program, proc in self.programs.items():
            assert proc.popen is not None and proc.running(), f"{program} is not running"
            rss, fds, threads = read_proc(proc.popen.pid)
            self.samples.setdefault(program, []).append(sf.Sample(cycle, rss, fds, threads))
        self.objects.append((cycle, self.count_objects()))
        if cycle % (self.sample_every * 10) == 0:
            last = {p: s[-1] for p, s in self.samples.items()}
            log(
                f"{cycle}/{self.cycles} cycles; "
                + "; ".join(
                    f"{p} {s.rss_kib / 1024:.1f} MiB {s.fds} fds {s.threads} threads"
                    for p, s in last.items()
                )
            )

    def count_objects(self) -> dict[str, int]:
        """The API objects tessera's programs create: inventories, Leases, Events, and
        pods still carrying a record (the in-flight ones at most)."""
        from tests.e2e.controlplane import NAMESPACE

        admin = self.cp.admin
        events = admin.list("/api/v1/events").get("items") or []
        return {
            "NodeDevices": len(
                admin.list(f"/apis/{rn.INVENTORY_GROUP}/v1alpha1/{rn.INVENTORY_PLURAL}").get(
                    "items"
                )
                or []
            ),
            "Leases": len(
                admin.list(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases").get(
                    "items"
                )
                or []
            ),
            "Events from tessera": sum(
                1
                for e in events
                if str((e.get("source") or {}).get("component", "")).startswith("tessera")
            ),
        }

    def run(self) -> None:
        self.load_before = sc.load_text()
        started = time.monotonic()
        with ThreadPoolExecutor(self.parallel) as pool:
            for future in [pool.submit(self.cycle, i) for i in range(self.cycles)]:
                try:
                    future.result()
                except Exception as exc:  # every failure is reported below
                    self.failed.append(str(exc)[:300])
                    if len(self.failed) >= 10:
                        pool.shutdown(cancel_futures=True)
                        break
        self.seconds = time.monotonic() - started
        self.load_after = sc.load_text()

    # --- the verdict -----------------------------------------------------------------------

    def report(self) -> tuple[list[str], list[str]]:
        growths = [sf.growth(p, s, self.cycles) for p, s in self.samples.items()]
        problems = [x for g in growths for x in g.problems()]
        problems += sf.object_problems(self.objects, self.cycles)
        problems += [f"cycle failed: {f}" for f in self.failed]
        warm = int(self.cycles * sf.WARMUP_FRACTION)
        lines = [
            f"{self.done} pod create/delete cycles ({self.parallel} in flight) through the real "
            "control plane (etcd, kube-apiserver, kube-scheduler with the extender, one "
            "tessera-scheduler) and one real node (kubelet, containerd, node agent on the fake "
            f"backend, NRI hook), chaos off, in {self.seconds / 60:.1f} min "
            f"({self.done / self.seconds:.2f} cycles/s); each pod asks for 25% of a GPU and is "
            f"deleted once its container runs. Sampled every {self.sample_every} cycles; growth "
            f"from the end of the warm-up (cycle {warm}) to the end, medians of the first and "
            f"last {sf.WINDOW_FRACTION:.0%} of the samples. Machine: {self.load_before} before, "
            f"{self.load_after} after (shared)."
            + (
                ""
                if self.cycles == DEFAULT_CYCLES
                else f" A shortened run (`--cycles {self.cycles}`; `make soak` runs "
                f"{DEFAULT_CYCLES:,})."
            ),
            "",
            "| program | RSS after warm-up | RSS at the end | growth (limit 5 MiB) | peak "
            "| open fds | threads |",
            "|---|---|---|---|---|---|---|",
        ]
        for g in growths:
            lines.append(
                f"| {g.program} | {g.rss_start_mib:.1f} MiB | {g.rss_end_mib:.1f} MiB | "
                f"{g.rss_mib:+.1f} MiB | {g.rss_peak_mib:.1f} MiB | {g.fds[0]} -> {g.fds[1]} | "
                f"{g.threads[0]} -> {g.threads[1]} |"
            )
        after = [c for cycle, c in self.objects if cycle >= warm]
        if after:
            lines += [
                "",
                "API objects tessera owns, after the warm-up -> at the end: "
                + ", ".join(f"{k} {after[0].get(k, 0)} -> {v}" for k, v in after[-1].items())
                + ".",
            ]
        lines += [
            "",
            "Verdict: " + ("flat, every limit held." if not problems else "; ".join(problems)),
            *BOUNDED,
        ]
        return lines, problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--cycles",
        type=int,
        default=DEFAULT_CYCLES,
        help="pod create/delete cycles (default 10000)",
    )
    p.add_argument("--parallel", type=int, default=4, help="cycles in flight at once")
    p.add_argument(
        "--sample-every",
        type=int,
        default=0,
        help="cycles between samples (default: cycles/200, at least 5)",
    )
    p.add_argument("--write", action="store_true", help="write docs/benchmarks.md's Soak section")
    p.add_argument("--keep", action="store_true", help="keep the work folder (every program's log)")
    args = p.parse_args(argv)
    every = args.sample_every or max(5, args.cycles // 200)
    soak = Soak(args.cycles, args.parallel, every, args.keep)
    soak.start()
    try:
        soak.run()
    finally:
        soak.stop()
    lines, problems = soak.report()
    print("\n".join(lines))
    if args.write:
        write_section(lines, start=SECTION_START, end=SECTION_END, title="Soak")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
