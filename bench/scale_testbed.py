"""Scale without Kubernetes binaries: tessera-scheduler (its own process) against the
testbed API server (another process), driven by a stand-in for kube-scheduler that makes
the extender calls kube-scheduler makes, with the same JSON: per pod a filter over the
node names it would send (nodeCacheCapable: names, not Node objects; as many as its
percentageOfNodesToScore lets it find), a prioritize over those that passed (none when one
node passed, as kube-scheduler does), then a bind
to the best-scored node, binds running in the background while the next pod is filtered
(kube-scheduler's scheduling cycle is serial, its binding cycles are not).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import scale_common as sc
from bench.common import percentile
from kube_edge.client import KubeClient, lease_path, pod_path
from tessera import resources as rn
from tessera_testbed.inventory import heartbeat_lease

BIND_WORKERS = 200
"""Bind calls in flight at once, each on its own kept-alive connection. kube-scheduler runs
each binding cycle in its own goroutine, so a pod's bind call reaches the extender right
after its filter, and tessera-scheduler holds the devices (assumes them) before the
Binding is written. A small pool would keep later pods' bind calls waiting in the driver
whenever the API server stalls: the extender cannot see those pods, answers the next
pods of a shape with the same node, and their binds then find it full (16 workers: up to
614 of 1,000 pods refused in a stalled round). 200 covers a stall of half a second at
this pace and stays under the extender's connection limit (limits.MAX_CONNECTIONS)."""


@dataclass
class TestbedRound:
    seconds: float
    filter_ms: list[float] = field(default_factory=list)
    prioritize_ms: list[float] = field(default_factory=list)
    bind_ms: list[float] = field(default_factory=list)
    failed: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    """Why pods failed: the bind's or the filter's refusal, figures left out."""
    cpu_s: float = 0.0
    """tessera-scheduler's CPU seconds (user + system, /proc) during the round."""
    threads: dict[str, float] = field(default_factory=dict)
    """The same by thread name."""


class _Conn(threading.local):
    """One keep-alive connection per thread, as kube-scheduler's HTTP client keeps."""

    conn: http.client.HTTPConnection | None = None


class TestbedScale:
    def __init__(self, nodes: int, pods: int, rounds: int, log: Callable[[str], None]) -> None:
        self.nodes, self.pods, self.rounds = nodes, pods, rounds
        self.log = log
        self.work = Path(tempfile.mkdtemp(prefix="tessera-scale-tb-"))
        self.procs: list[subprocess.Popen[Any]] = []
        self.port = 0
        self.conns = _Conn()

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen[Any]:
        env = dict(os.environ, PYTHONPATH=str(sc.ROOT))
        with (self.work / log).open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, *args], stdout=subprocess.PIPE, stderr=out, env=env
            )
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        from tessera_edge.keyfiles import generate_key_files
        from tessera_testbed.apiserver import write_kubeconfig
        from tests.e2e.controlplane import free_port, wait_for

        api = self._spawn(
            ["-m", "tessera_testbed.apiserver", "--history", "50000"], "apiserver.log"
        )
        assert api.stdout is not None
        url = f"http://127.0.0.1:{int(api.stdout.readline())}"
        self.api = KubeClient.for_host(url, pool_size=16)
        template, units = sc.agent_inventory()
        capacity = sc.node_capacity(units)

        def make(i: int) -> None:
            name = sc.node_name(i)
            self.api.create(
                "/api/v1/nodes",
                {
                    "metadata": {"name": name},
                    "status": {"capacity": capacity, "allocatable": capacity},
                },
            )
            self.api.create(
                f"/apis/{rn.INVENTORY_GROUP}/v1alpha1/{rn.INVENTORY_PLURAL}",
                sc.node_devices(template, i),
            )
            self.api.create(lease_path(rn.DEFAULT_HEARTBEAT_NAMESPACE), heartbeat_lease(name))

        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(make, range(self.nodes)))
        self.log(f"{self.nodes} nodes created in {time.monotonic() - started:.0f}s")
        generate_key_files(self.work / "keys", "bench")
        kubeconfig = write_kubeconfig(self.work / "kubeconfig", url)
        self.port, health = free_port(), free_port()
        self.sched = self._spawn(
            [
                "-m",
                "scheduler_plugin.cli",
                f"--kubeconfig={kubeconfig}",
                f"--listen=127.0.0.1:{self.port}",
                f"--health-listen=127.0.0.1:{health}",
                f"--integrity-key-file={self.work / 'keys' / 'private'}",
                "--no-leader-elect",
                "--log-level=warning",
            ],
            "tessera-scheduler.log",
        )
        started = time.monotonic()

        def ready() -> bool:
            conn = http.client.HTTPConnection("127.0.0.1", health, timeout=5)
            conn.request("GET", "/readyz")
            return conn.getresponse().status == 200

        wait_for(ready, 600, "tessera-scheduler ready", 0.5)
        self.log(f"tessera-scheduler ready in {time.monotonic() - started:.0f}s")

    def _call(self, verb: str, body: dict[str, Any]) -> Any:
        if self.conns.conn is None:
            self.conns.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn = self.conns.conn
        conn.request("POST", f"/{verb}", body=json.dumps(body).encode())
        answer = conn.getresponse()
        raw = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{verb}: HTTP {answer.status}: {raw[:200]!r}")
        return json.loads(raw)

    def one_round(self, run: str) -> TestbedRound:
        from scheduler_plugin.decisions.binder import BindArgs  # the wire form kube-scheduler sends

        names = [sc.node_name(i) for i in range(self.nodes)]
        send = sc.feasible_to_find(self.nodes)
        created = []
        for i in range(self.pods):
            obj = sc.pod(f"{run}-{i}", run, i, tessera=True)
            created.append(self.api.create(pod_path(sc.NAMESPACE), obj))
        result = TestbedRound(0.0)
        lock = threading.Lock()
        offset = 0

        def bind(obj: dict[str, Any], node: str) -> None:
            meta = obj["metadata"]
            args = BindArgs(meta["name"], meta["namespace"], meta["uid"], node).to_json()
            t0 = time.perf_counter()
            answer = self._call("bind", args)
            elapsed = (time.perf_counter() - t0) * 1000
            with lock:
                result.bind_ms.append(elapsed)
                if answer.get("Error"):
                    result.failed += 1
                    result.reasons[_gist(str(answer["Error"]))] += 1

        cpu0 = sc.cpu_seconds(self.sched.pid)
        threads0 = sc.thread_cpu_seconds(self.sched.pid)
        start = time.perf_counter()
        with ThreadPoolExecutor(BIND_WORKERS) as binders:
            for obj in created:
                # kube-scheduler starts each pod's search where the last one stopped
                window = [names[(offset + k) % len(names)] for k in range(send)]
                offset = (offset + send) % len(names)
                t0 = time.perf_counter()
                passed = self._call("filter", {"Pod": obj, "Nodes": None, "NodeNames": window})
                t1 = time.perf_counter()
                candidates = passed.get("NodeNames") or []
                if not candidates:
                    result.failed += 1
                    failed = {**(passed.get("FailedNodes") or {})}
                    result.reasons[_gist(next(iter(failed.values()), "filter: no node"))] += 1
                    continue
                result.filter_ms.append((t1 - t0) * 1000)
                best = candidates[0]
                if len(candidates) > 1:  # kube-scheduler binds a lone survivor unscored
                    scores = self._call(
                        "prioritize", {"Pod": obj, "Nodes": None, "NodeNames": candidates}
                    )
                    result.prioritize_ms.append((time.perf_counter() - t1) * 1000)
                    best = max(scores, key=lambda s: s["Score"])["Host"]
                binders.submit(bind, obj, best)
        result.seconds = time.perf_counter() - start
        result.cpu_s = sc.cpu_seconds(self.sched.pid) - cpu0
        result.threads = sc.cpu_delta(sc.thread_cpu_seconds(self.sched.pid), threads0)
        for obj in created:
            self.api.request("DELETE", pod_path(sc.NAMESPACE, obj["metadata"]["name"]))
        return result

    def run(self) -> list[TestbedRound]:
        out = []
        for r in range(self.rounds):
            done = self.one_round(f"tb{r}")
            out.append(done)
            self.log(
                f"testbed round {r}: {self.pods / done.seconds:.1f} pods/s, bind p99 "
                f"{percentile(done.bind_ms, 99):.1f} ms, filter p50 "
                f"{percentile(done.filter_ms, 50):.1f} ms, prioritize p50 "
                f"{percentile(done.prioritize_ms, 50):.1f} ms, failed {done.failed}, "
                f"tessera-scheduler CPU {done.cpu_s * 1000 / self.pods:.2f} ms per pod"
            )
            self.log(
                f"testbed round {r}: tessera-scheduler CPU ms per pod by thread: "
                f"{sc.by_thread(done.threads, self.pods)}"
            )
            if done.reasons:
                # a pod the driver does not retry (BIND_WORKERS says why binds were refused
                # when the driver queued them)
                top = ", ".join(f"{n} x {why!r}" for why, n in done.reasons.most_common(3))
                self.log(f"testbed round {r}: failed pods, most common reasons: {top}")
        return out

    def peak_rss(self) -> float:
        return sc.peak_rss_mib(self.sched.pid)

    def stop(self) -> None:
        import shutil

        for proc in self.procs:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.work, ignore_errors=True)


def _gist(reason: str) -> str:
    """A refusal without its figures, so that alike refusals count together."""
    return re.sub(r"\d+(\.\d+)?", "N", reason)[:160]
