"""Scale on a real control plane: etcd, kube-apiserver, tessera-scheduler (the extender)
and a stock kube-scheduler, started by the end-to-end suite's helpers, with API-only nodes
(Node objects, NodeDevices inventories and fresh heartbeat Leases; no kubelets).

A round: kube-scheduler is stopped (SIGSTOP), the round's pods are created, and the clock
runs from its SIGCONT until a watch has seen every pod bound. Best of the rounds counts.
The same rounds then run with kube-scheduler alone placing a plain extended resource.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import scale_common as sc
from kube_edge.client import KubeClient, decode_event, lease_path, pod_path
from kube_edge.errors import ApiError
from scheduler_plugin.service import Options
from tessera import resources as rn
from tessera.errors import TesseraError
from tessera.record import decode
from tessera_testbed.inventory import heartbeat_lease

CPU_OF = ("etcd", "kube-apiserver", "kube-scheduler", "tessera-scheduler-0")
E2E_ONLY_FLAGS = frozenset(
    {
        "--status-interval",
        "--heartbeat-grace",
        "--leader-elect-lease-duration",
        "--leader-elect-renew-deadline",
        "--leader-elect-retry-period",
        "--log-level",
    }
)
"""Flags the e2e suite sets to make its tests fast; the benchmark runs the defaults."""
SHIPPED_FLAGS = ("--api-timeout=4", "--log-format=json")
"""What deploy/scheduler/deployment.yaml passes beyond addresses, TLS and keys."""
ROUND_TIMEOUT_S = 600.0
"""A round that has not bound every pod by then has failed (a stuck extender, a full
cluster): the benchmark stops instead of waiting for ever."""


@dataclass
class Round:
    seconds: float
    cpu: dict[str, float]
    verbs: dict[str, sc.Histogram] = field(default_factory=dict)
    valid_records: int = 0
    binding: sc.Histogram = field(default_factory=sc.Histogram)
    """The API server's own latency of the round's Binding POSTs (whoever sent them)."""
    connections: float = 0.0
    """Connections kube-scheduler opened to the extender port during the round."""
    threads: dict[str, float] = field(default_factory=dict)
    """tessera-scheduler's CPU seconds in the round by thread name."""


@dataclass
class Series:
    """The rounds of one configuration (tessera or alone, at one client qps)."""

    label: str
    pods: int
    rounds: list[Round] = field(default_factory=list)

    @property
    def best(self) -> Round:
        return min(self.rounds, key=lambda r: r.seconds)

    @property
    def pods_per_s(self) -> float:
        return self.pods / self.best.seconds

    def cpu_per_1000(self) -> dict[str, float]:
        best = self.best
        return {k: v * 1000 / self.pods for k, v in best.cpu.items()}


def _parallel(items: list[Any], job: Callable[[Any], object], workers: int = 8) -> None:
    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(job, items):
            pass


class RealScale:
    def __init__(
        self,
        nodes: int,
        pods: int,
        rounds: int,
        log: Callable[[str], None],
        profile: Path | None = None,
        tessera_args: tuple[str, ...] = (),
        py_spy: Path | None = None,
        py_spy_native: bool = False,
    ) -> None:
        from tests.e2e import binaries
        from tests.e2e.controlplane import ControlPlane

        found = {n: binaries.find(n) for n in binaries.CONTROL_PLANE}
        self.bins = {n: p for n, p in found.items() if p is not None}
        self.work = Path(tempfile.mkdtemp(prefix="tessera-scale-"))
        self.cp = ControlPlane(self.work, self.bins)
        self.nodes, self.pods, self.rounds = nodes, pods, rounds
        self.log = log
        self.run_no = 0
        self.profile = profile
        self.tessera_args = list(tessera_args)
        """Where to write a sampled profile of tessera-scheduler's first series (None: no
        sampling)."""
        self.py_spy = py_spy
        """Where to write py-spy's collapsed stacks (native frames too) of tessera-scheduler
        during the timed part of each round of the first series (None: not run)."""
        self.py_spy_native = py_spy_native
        self._spies: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.floor = False
        """Whether bench.floor_extender serves in tessera-scheduler's place (`use_floor`)."""

    # --- set-up ----------------------------------------------------------------------------

    def start(self) -> None:
        started = time.monotonic()
        self.cp.start_api()
        self.cp.install()
        self.log(f"control plane up in {time.monotonic() - started:.0f}s ({self.work})")
        template, units = sc.agent_inventory()
        capacity = sc.node_capacity(units)
        admin = self.cp.admin

        def make(i: int) -> None:
            name = sc.node_name(i)
            labels = {"kubernetes.io/hostname": name}
            admin.create("/api/v1/nodes", {"metadata": {"name": name, "labels": labels}})
            ready = {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "lastHeartbeatTime": _now(),
                "lastTransitionTime": _now(),
            }
            status = {"capacity": capacity, "allocatable": capacity, "conditions": [ready]}
            admin.merge_patch(f"/api/v1/nodes/{name}/status", {"status": status})
            self.cp.untaint(name)
            admin.create(
                f"/apis/{rn.INVENTORY_GROUP}/v1alpha1/{rn.INVENTORY_PLURAL}",
                sc.node_devices(template, i),
            )
            admin.create(lease_path(rn.DEFAULT_HEARTBEAT_NAMESPACE), heartbeat_lease(name))

        started = time.monotonic()
        _parallel(list(range(self.nodes)), make)
        self.log(f"{self.nodes} nodes created in {time.monotonic() - started:.0f}s")
        started = time.monotonic()
        self.cp.start_schedulers(replicas=1)
        self._restart_tessera()
        self._wait_tessera_ready()
        self.log(f"tessera-scheduler ready in {time.monotonic() - started:.0f}s")
        self._settle_status_writes()

    def _settle_status_writes(self, limit: float = 300.0) -> None:
        """Wait until tessera-scheduler's allocation summaries are written (a new leader
        writes every node's, and a round's deletions dirty hundreds of nodes; a few hundred
        are written per interval): each round measures its own work, not the tail of the
        last one's. Settled means a whole status interval (the shipped default) passed
        without a write: a shorter look could fall between two batches."""
        every = Options().status_interval + 2.0
        started = time.monotonic()
        key = "PATCH nodedevices/status"
        last = self.api_requests().get(key, 0.0)
        while time.monotonic() - started < limit:
            time.sleep(every)
            now = self.api_requests().get(key, 0.0)
            if now == last:
                break
            last = now
        self.log(f"status writes settled in {time.monotonic() - started:.0f}s")

    def _restart_tessera(self) -> None:
        """tessera-scheduler again with the shipped Deployment's flags where the e2e suite
        speeds things up for its tests (status writes, heartbeat grace, election timing, log
        format), plus `tessera_args`; under bench.sampler when profiling."""
        proc = self.cp.procs["tessera-scheduler-0"]
        proc.stop()
        cmd = [a for a in proc.cmd if a.split("=", 1)[0] not in E2E_ONLY_FLAGS]
        cmd += [*SHIPPED_FLAGS, *self.tessera_args]
        if self.profile is not None:
            at = cmd.index("scheduler_plugin.cli")
            cmd[at:at] = ["bench.sampler"]
            proc.env = dict(proc.env or os.environ, TESSERA_SAMPLE_OUT=str(self.profile))
        proc.cmd = cmd
        proc.start()

    def use_floor(self) -> None:
        """From now on bench.floor_extender serves in tessera-scheduler's place: the same
        process slot, command line, port, certificates and kube-scheduler configuration."""
        proc = self.cp.procs["tessera-scheduler-0"]
        proc.stop()
        cmd = [a for a in proc.cmd if a != "bench.sampler"]
        cmd[cmd.index("scheduler_plugin.cli")] = "bench.floor_extender"
        proc.cmd = cmd
        proc.start()
        self.floor = True
        self._wait_tessera_ready()

    def _signal_tessera(self, sig: signal.Signals) -> None:
        popen = self.cp.procs["tessera-scheduler-0"].popen
        if self.profile is not None and popen is not None:
            popen.send_signal(sig)

    def api_requests(self) -> dict[str, float]:
        """kube-apiserver's request counters by verb and resource (its /metrics)."""
        return self.api_metrics()[0]

    def api_metrics(self) -> tuple[dict[str, float], sc.Histogram]:
        """kube-apiserver's request counters by verb and resource, and its latency
        histogram of Binding POSTs (its /metrics)."""
        import urllib3

        from tests.e2e.controlplane import ADMIN_TOKEN

        http = urllib3.PoolManager(ca_certs=str(self.cp.cluster_ca.path), retries=False)
        answer = http.request(
            "GET",
            f"{self.cp.server}/metrics",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=30,
        )
        return sc.api_server_metrics(answer.data.decode())

    def _wait_tessera_ready(self) -> None:
        from tests.e2e.controlplane import wait_for

        port = self.cp.health_ports["tessera-scheduler-0"]

        def ready() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                return int(r.status) == 200

        wait_for(ready, 600, "tessera-scheduler ready", 1)

    def metrics(self) -> str:
        port = self.cp.health_ports["tessera-scheduler-0"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return str(r.read().decode())

    def kube_scheduler(self, tessera: bool, qps: int) -> None:
        port = self.cp.replica_ports["tessera-scheduler-0"]
        url = f"https://127.0.0.1:{port}" if tessera else None
        config = self.cp.kube_scheduler_config(url)
        config["clientConnection"].update(qps=qps, burst=2 * qps)
        self.cp.start_kube_scheduler(config)
        # its informers synced and its extender reachable: a first pod is placed
        self._round(f"warm-{self.run_no}", 1, tessera, pause=False)

    # --- rounds ----------------------------------------------------------------------------

    def _pids(self) -> dict[str, int]:
        out = {}
        for name in CPU_OF:
            proc = self.cp.procs.get(name)
            if proc is not None and proc.popen is not None:
                out[name.removesuffix("-0")] = proc.popen.pid
        return out

    def _round(self, run: str, count: int, tessera: bool, pause: bool = True) -> Round:
        admin = self.cp.admin
        sched = self.cp.procs["kube-scheduler"].popen
        assert sched is not None
        names = [f"{run}-{i}" for i in range(count)]
        if pause:
            self._settle_status_writes()  # the last round's deletions are written first
            sched.send_signal(signal.SIGSTOP)
        try:
            _parallel(
                list(enumerate(names)),
                lambda item: admin.create(
                    pod_path(sc.NAMESPACE), sc.pod(item[1], run, item[0], tessera)
                ),
            )
            listed = admin.list(pod_path(sc.NAMESPACE), labelSelector=f"{sc.LABEL}={run}")
            bound = {p["metadata"]["name"] for p in listed["items"] if p["spec"].get("nodeName")}
            watcher = _BoundWatch(admin, run, listed["metadata"]["resourceVersion"], bound, count)
            pids = self._pids()
            before = self.metrics()
            requests, binding = self.api_metrics()
            self._spy_start(run, pids.get("tessera-scheduler"))
            cpu0 = {k: sc.cpu_seconds(p) for k, p in pids.items()}
            tessera_pid = pids.get("tessera-scheduler")
            threads0 = sc.thread_cpu_seconds(tessera_pid) if tessera_pid else {}
            start = time.perf_counter()
        finally:
            if pause:
                sched.send_signal(signal.SIGCONT)
        watcher.done.wait(ROUND_TIMEOUT_S)
        seconds = time.perf_counter() - start
        cpu = {k: sc.cpu_seconds(p) - cpu0[k] for k, p in pids.items()}
        threads = sc.cpu_delta(sc.thread_cpu_seconds(tessera_pid), threads0) if tessera_pid else {}
        self._spy_stop()
        watcher.stop()
        if not watcher.done.is_set():
            self.cp.check_alive()
            raise RuntimeError(f"round {run}: {len(watcher.bound)} of {count} pods bound")
        now = self.metrics()
        result = Round(seconds, cpu, sc.histogram_delta(now, before))
        result.connections = sc.connections_opened(now) - sc.connections_opened(before)
        result.threads = threads
        after, binding_after = self.api_metrics()
        result.binding = binding_after.minus(binding)
        calls = {k: v - requests.get(k, 0.0) for k, v in after.items()}
        busiest = sorted(calls.items(), key=lambda kv: -kv[1])[:8]
        self.log(f"{run} API calls: " + ", ".join(f"{k} {v:.0f}" for k, v in busiest if v))
        if tessera:
            self.log(f"{run} extender connections opened: {result.connections:.0f}")
            per_thread = sc.by_thread(threads, count)
            who = "the floor extender" if self.floor else "tessera-scheduler"
            self.log(f"{run} {who} CPU ms per pod by thread: {per_thread}")
            self.log(f"{run} {sc.bind_latencies(result.verbs, result.binding)}")
        if tessera and not self.floor:
            result.valid_records = self._valid_records(run)
        self._delete(run)
        return result

    def _spy_start(self, run: str, pid: int | None) -> None:
        """Profilers on tessera-scheduler for this round's timed part (first series only):
        py-spy (Python frames, threads that are running; without stopping the process) and,
        where `perf` is installed, perf's CPU-clock samples with native stacks (which
        library the CPU goes to)."""
        if self.py_spy is None or self.run_no != 1 or pid is None or run.startswith("warm"):
            return
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        out = self.py_spy.with_name(f"{self.py_spy.name}.{run}")
        cmd = [spy, "record", "--threads", "--format", "raw", "--rate", "100"]
        # --native stops the process for every sample: 10 pods/s instead of 130 at 250 Hz
        cmd += ["--native"] if self.py_spy_native else ["--nonblocking"]
        cmd += ["--pid", str(pid), "--output", str(out)]
        self._spies = [
            ("py-spy", subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        ]
        perf = shutil.which("perf")
        if perf is not None:
            data = self.py_spy.with_name(f"{self.py_spy.name}.{run}.perf")
            cmd = [perf, "record", "-e", "cpu-clock", "-F", "499", "-g", "-p", str(pid)]
            cmd += ["-o", str(data)]
            self._spies.append(
                ("perf", subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            )
        time.sleep(0.5)  # attached before the round starts

    def _spy_stop(self) -> None:
        for name, spy in self._spies:
            spy.send_signal(signal.SIGINT)
            try:
                _, err = spy.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                spy.kill()
                err = b""
            if spy.returncode not in (0, -signal.SIGINT):
                self.log(f"{name}: {err.decode(errors='replace')[-300:]}")
        self._spies = []

    def _valid_records(self, run: str) -> int:
        from tests.e2e.controlplane import keyring

        ring = keyring(self.cp.integrity_dir)
        valid = 0
        listed = self.cp.admin.list(pod_path(sc.NAMESPACE), labelSelector=f"{sc.LABEL}={run}")
        for obj in listed["items"]:
            meta, spec = obj["metadata"], obj["spec"]
            text = (meta.get("annotations") or {}).get(rn.ALLOCATION_ANNOTATION)
            if not text:
                continue
            try:
                decode(text, ring, pod_uid=meta["uid"], node=spec.get("nodeName"))
            except TesseraError:
                continue
            valid += 1
        return valid

    def _delete(self, run: str) -> None:
        """Every pod of the round, at once and without grace (no kubelet would confirm)."""
        from tests.e2e.controlplane import wait_for

        admin = self.cp.admin
        admin.request(
            "DELETE",
            pod_path(sc.NAMESPACE),
            {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
            query={"labelSelector": f"{sc.LABEL}={run}"},
        )

        def gone() -> bool:
            left = admin.list(pod_path(sc.NAMESPACE), labelSelector=f"{sc.LABEL}={run}")
            return not left["items"]

        wait_for(gone, 120, f"the pods of {run} deleted", 0.5)

    def series(self, tessera: bool, qps: int) -> Series:
        label = f"{'alone' if not tessera else 'floor' if self.floor else 'tessera'}, qps {qps}"
        self.run_no += 1
        self.kube_scheduler(tessera, qps)
        out = Series(label, self.pods)
        if self.run_no == 1:
            self._signal_tessera(signal.SIGUSR2)  # sample this series only
        for r in range(self.rounds):
            done = self._round(f"r{self.run_no}-{r}", self.pods, tessera)
            out.rounds.append(done)
            self.log(
                f"{label}, round {r}: {self.pods / done.seconds:.1f} pods/s "
                f"({done.seconds:.2f}s), records valid {done.valid_records}"
            )
        if self.run_no == 1:
            self._signal_tessera(signal.SIGUSR1)
        return out

    def tessera_peak_rss(self) -> float:
        proc = self.cp.procs["tessera-scheduler-0"].popen
        assert proc is not None
        return sc.peak_rss_mib(proc.pid)

    def stop(self, keep: bool = False) -> None:
        self.cp.stop()
        if not keep:
            shutil.rmtree(self.work, ignore_errors=True)


class _BoundWatch:
    """Counts a round's pods with spec.nodeName set, from a watch started at the list."""

    def __init__(
        self, client: KubeClient, run: str, version: str, bound: set[str], count: int
    ) -> None:
        self.client, self.run, self.version = client, run, version
        self.bound, self.count = bound, count
        self.done = threading.Event()
        self._stop = threading.Event()
        if len(bound) >= count:
            self.done.set()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        query = {"watch": "1", "labelSelector": f"{sc.LABEL}={self.run}"}
        while not self._stop.is_set() and not self.done.is_set():
            try:
                for line in self.client.stream(
                    pod_path(sc.NAMESPACE),
                    {**query, "resourceVersion": self.version},
                    read_timeout=30,
                ):
                    event = decode_event(line, "pods")
                    if event is None:
                        continue
                    obj = event.get("object") or {}
                    meta = obj.get("metadata") or {}
                    self.version = meta.get("resourceVersion", self.version)
                    if (obj.get("spec") or {}).get("nodeName"):
                        self.bound.add(meta.get("name", ""))
                        if len(self.bound) >= self.count:
                            self.done.set()
                            return
                    if self._stop.is_set():
                        return
            except ApiError:
                time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
