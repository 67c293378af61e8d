"""Memory per pod cycle of tessera-scheduler: what `make soak` does, in one process.

The simulated API server runs in a child process; this process runs a real Service (its
informers watching that server, its extender port on loopback) and plays kube-scheduler
and the kubelet. Each cycle creates a pod asking for a quarter of a GPU (a new name and
UID), filters and binds it over HTTP as kube-scheduler does, waits until the pod watch
confirms the bind, writes the pod's status as a kubelet does (Running, then Succeeded),
deletes it and waits until the scheduler has released its devices.

Memory is read with tracemalloc (every Python allocation of this process, so of the
scheduler: the driver's own are a few fixed objects) after a warm-up and at the end; the
figure is the growth per cycle. With `--top N` the allocation sites that grew most are
printed, grouped by traceback, with the growth of gc object counts by type.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from collections import Counter
from typing import Any

from bench.bench_memory import vm_kib
from bench.common import BenchContext, Result
from tessera.resources import DEFAULT_POLICY

NODE = "cycle-node"
NAMESPACE = "default"
WARMUP = 8500
"""Cycles before the measurement: the fragmentation policy remembers the last 8,192 pod
UIDs it counted (OnlineWorkload), so the first 8,192 cycles fill a bounded table."""


def _types() -> Counter[str]:
    return Counter(type(o).__name__ for o in gc.get_objects())


class Cycles:
    """A Service on a simulated API server, and kube-scheduler's and the kubelet's steps."""

    def __init__(self, url: str, policy: str) -> None:
        from kube_edge.client import KubeClient, lease_path
        from scheduler_plugin.service import Options, Service
        from tessera.record import Keyring
        from tessera_testbed.inventory import heartbeat_lease, make_spec
        from tests.scheduler.helpers import Http

        self.api = KubeClient.for_host(url)
        self.api.create("/api/v1/nodes", {"metadata": {"name": NODE}})
        self.api.create(
            "/apis/tessera.dev/v1alpha1/nodedevices",
            {"metadata": {"name": NODE}, "spec": make_spec(NODE)},
        )
        self.lease = heartbeat_lease(NODE, time.time(), 3600)
        self.api.create(lease_path("tessera-system"), self.lease)
        self.service = Service(
            Options(
                host="127.0.0.1",
                port=0,
                policy=policy,
                leader_elect=False,
                status_interval=0.2,
            ),
            KubeClient.for_host(url),
            Keyring.generate("bench"),
        ).start()
        if not self.service.wait_ready(60):
            raise RuntimeError(f"the scheduler is not ready: {self.service.readiness()}")
        self.http = Http(self.service.server.port)

    def stop(self) -> None:
        self.http.close()
        self.service.stop()
        self.api.close()

    def _wait(self, check: Any, what: str) -> None:
        deadline = time.monotonic() + 30
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.001)

    def cycle(self, i: int) -> None:
        from kube_edge.client import pod_path
        from tessera import resources as rn

        name = f"cycle-{i}"
        shape = {rn.GPU_CORE: "25", rn.GPU_MEMORY_RATIO: "25"}
        created = self.api.create(
            pod_path(NAMESPACE),
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "cycle"}},
                "spec": {
                    "containers": [
                        {"name": "main", "image": "busybox", "resources": {"limits": shape}}
                    ]
                },
            },
        )
        uid = created["metadata"]["uid"]
        status, reply = self.http.post("/filter", {"Pod": created, "NodeNames": [NODE]})
        if status != 200 or reply["NodeNames"] != [NODE]:
            raise RuntimeError(f"filter: {status} {reply}")
        bind = {"PodName": name, "PodNamespace": NAMESPACE, "PodUID": uid, "Node": NODE}
        status, reply = self.http.post("/bind", bind)
        if status != 200 or reply["Error"]:
            raise RuntimeError(f"bind: {status} {reply}")
        cache = self.service.cache
        self._wait(lambda: uid not in cache.pods.assumed(), "the watch to confirm the bind")
        path = pod_path(NAMESPACE, name)
        for phase in ("Running", "Succeeded"):
            state = "running" if phase == "Running" else "terminated"
            self.api.merge_patch(
                path + "/status",
                {
                    "status": {
                        "phase": phase,
                        "containerStatuses": [{"name": "main", "state": {state: {}}}],
                    }
                },
            )
        self.api.request("DELETE", path)
        self._wait(lambda: cache.pods.allocation(uid) is None, "the scheduler to release the pod")


def measure(cycles: int, warmup: int, top: int = 0, policy: str = DEFAULT_POLICY) -> dict[str, Any]:
    """Runs `warmup` cycles, then `cycles` more; tracemalloc's traced bytes and the RSS
    along the measured ones. Tracing starts with the first cycle: a bounded table that
    evicted entries allocated before tracing would look as if it grew."""
    from bench.bench_scheduler import fake_api

    with fake_api() as url:
        run = Cycles(url, policy)
        try:
            tracemalloc.start(8 if top else 1)
            for i in range(warmup):
                run.cycle(i)
            gc.collect()
            snap_before = tracemalloc.take_snapshot() if top else None
            types_before = _types() if top else Counter()
            traced, rss = [tracemalloc.get_traced_memory()[0]], [vm_kib("VmRSS")]
            step = max(1, cycles // 10)
            start = time.perf_counter()
            for i in range(cycles):
                run.cycle(warmup + i)
                if (i + 1) % step == 0:
                    traced.append(tracemalloc.get_traced_memory()[0])
                    rss.append(vm_kib("VmRSS"))
            seconds = time.perf_counter() - start
            gc.collect()
            traced.append(tracemalloc.get_traced_memory()[0])
            if top and snap_before is not None:
                grown = _types() - types_before
                diff = tracemalloc.take_snapshot().compare_to(snap_before, "traceback")
                for stat in diff[:top]:
                    print(f"{stat.size_diff:+d} B {stat.count_diff:+d} blocks", file=sys.stderr)
                    for line in stat.traceback.format():
                        print("   ", line, file=sys.stderr)
                print("objects grown:", grown.most_common(top), file=sys.stderr)
            tracemalloc.stop()
            return {
                "warmup": warmup,
                "cycles": cycles,
                "bytes_per_cycle": (traced[-1] - traced[0]) / cycles,
                "cycles_per_s": cycles / seconds,
                "traced_kib": [t // 1024 for t in traced],
                "rss_kib": rss,
            }
        finally:
            run.stop()


def run(ctx: BenchContext) -> list[Result]:
    warmup, cycles = ctx.sized(quick=(200, 200), full=(WARMUP, 1500))
    f = measure(cycles, warmup)
    rss = f["rss_kib"]
    return [
        Result(
            "scheduler memory per pod cycle, after the warm-up",
            f["bytes_per_cycle"],
            "B",
            200.0,
            note=f"traced Python memory (tracemalloc) of a tessera-scheduler (fragmentation "
            f"policy) over {cycles} pod cycles after {warmup} (create, filter, bind, watch, "
            "Running, Succeeded, delete; a new name and UID each), per cycle; "
            f"RSS {rss[0] / 1024:.1f} -> {rss[-1] / 1024:.1f} MiB over them; "
            f"{f['cycles_per_s']:.0f} cycles/s with tracemalloc on",
        )
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--cycles", type=int, default=1500, help="measured cycles")
    parser.add_argument("--policy", default=DEFAULT_POLICY)
    parser.add_argument("--top", type=int, default=0, help="print the N sites that grew most")
    args = parser.parse_args()
    print(json.dumps(measure(args.cycles, args.warmup, args.top, args.policy), indent=1))
