"""The scheduler's memory at 5,000 nodes and 50,000 placed pods, and over node churn.

A fresh process builds a Service (no API server: its handlers get what the informers
would hand them, as API objects) with 5,000 nodes of 8 GPUs and 50,000 Running pods, each
holding a share of one GPU under a signed allocation record; the pods come decoded from
JSON lines that this process writes to the child's stdin (made and signed here, as an API
server would hold them: the scheduler only decodes and verifies). It then does what the
running scheduler does at that size: filter and prioritize calls over HTTP, every node's
status summary rendered for writing, one /metrics scrape. The figure is the peak resident
memory of that process (VmHWM), the interpreter and libraries included.

Every node's heartbeat Lease carries a usage reading, as its agent writes it (each of its
pods on a GPU and a host process), which the scheduler keeps for its page.

Then churn cycles: 250 nodes and their pods are deleted (Node, NodeDevices, Lease and pod
DELETED events), then loaded again with new pods (new UIDs), every pod's and node's object
going through the handlers as a watch delivers it, with the status-only echoes of the
scheduler's own status writes. The first 20 cycles churn every node once (a warm-up: the
allocator settles once the initial load's objects are all replaced); resident memory after
the next 20 against after the first 20 says whether anything is retained per churned
object.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from bench.common import BenchContext, Result

ROOT = Path(__file__).resolve().parent.parent
NODES = 5000
PODS = 50_000
CYCLES = 20
"""Churn cycles measured, after as many again to warm up (see `run`)."""
CHURN_NODES = 250
GPUS = 8
"""GPUs of a node: each is an 8x H100 SXM with 4 RDMA NICs of 8 virtual functions, as its
node agent publishes it (`make_spec`)."""
MEM = 81559
"""Memory of each GPU, MiB (the make's)."""
SHARES = (20, 25, 30, 50)


def vm_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(field)


class _Sink:
    """Stands in for the API server's status subresource (the writes are not the point)."""

    def __init__(self) -> None:
        self.writes = 0

    def merge_patch(self, path: str, patch: Any, *, answer: bool = True) -> dict[str, Any]:
        self.writes += 1
        return {}


def node_object(name: str, version: int) -> dict[str, Any]:
    from tessera_testbed.inventory import make_spec

    return {
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "NodeDevices",
        "metadata": {
            "name": name,
            "uid": f"nd-{name}-{version}",
            "resourceVersion": str(version),
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": make_spec(name),
    }


def pod_object(
    name: str, uid: str, node: str, slot: int, core: int, keyring: Any
) -> dict[str, Any]:
    """A Running pod as the API server lists it, with its signed record."""
    from tessera import resources as rn
    from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
    from tessera.record import encode

    grant = GpuGrant(f"GPU-{node}-{slot}", slot, slot, core, MEM * core // 100)
    alloc = PodAllocation(uid, "default", name, node, (ContainerAllocation("main", (grant,)),))
    shape = {rn.GPU_CORE: str(core), rn.GPU_MEMORY_RATIO: str(core)}
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": uid,
            "resourceVersion": "1",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "bench"},
            "annotations": {rn.ALLOCATION_ANNOTATION: encode(alloc, keyring)},
        },
        "spec": {
            "nodeName": node,
            "schedulerName": "default-scheduler",
            "priority": 0,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": shape}}],
        },
        "status": {"phase": "Running", "qosClass": "BestEffort"},
    }


def node_pods(node: str, count: int, tag: str, keyring: Any) -> list[dict[str, Any]]:
    """`count` pods on `node`, spread over its GPUs (at most 4 x 25%... per GPU)."""
    pods = []
    for i in range(count):
        slot = i % GPUS
        core = SHARES[(i // GPUS) % len(SHARES)] if i < 2 * GPUS else 10
        name = f"{node}-{tag}-{i}"
        pods.append(pod_object(name, f"uid-{name}", node, slot, core, keyring))
    return pods


def scrape(service: Any) -> int:
    """GET /metrics as Prometheus does, read as it streams in; returns its size."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", service.server.port)
    conn.request("GET", "/metrics")
    reply = conn.getresponse()
    size = 0
    while chunk := reply.read(1 << 16):
        size += len(chunk)
    conn.close()
    return size


def _scrape_and_status(service: Any) -> None:
    scrape(service)
    writer = service.status_writer
    writer.mark_all()
    while writer.flush():
        pass


def bench_keyring() -> Any:
    """One fixed signing key, so that the parent signs what the child verifies."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from tessera.record import Keyring

    return Keyring(signing=("bench", Ed25519PrivateKey.from_private_bytes(bytes(range(32)))))


def node_names() -> list[str]:
    return [f"node-{n:05d}" for n in range(NODES)]


def churned(cycle: int, names: list[str]) -> list[str]:
    first = (cycle * CHURN_NODES) % NODES
    return names[first : first + CHURN_NODES]


def write_pods(out: IO[bytes]) -> None:
    """Every pod the child loads, as JSON lines in the order it reads them: the first list,
    then each cycle's new pods. Made (and signed) in the parent: the scheduler decodes
    pods, it never builds or signs them."""
    keyring = bench_keyring()
    names = node_names()
    per_node = PODS // NODES
    try:
        for name in names:
            for obj in node_pods(name, per_node, "a", keyring):
                out.write(json.dumps(obj).encode() + b"\n")
        for cycle in range(2 * CYCLES):
            for name in churned(cycle, names):
                for obj in node_pods(name, per_node, f"c{cycle}", keyring):
                    out.write(json.dumps(obj).encode() + b"\n")
    except BrokenPipeError:
        pass  # the child failed; its exit status says so
    finally:
        out.close()


def usage_lease(obj: dict[str, Any], node: str, tag: str, pods: int) -> dict[str, Any]:
    """`obj` carrying the usage reading its agent would write: each of the node's pods on
    its GPU, and one process of the host."""
    from tessera import resources as rn
    from tessera.usage import ContainerUsage, NodeUsage, UnattributedUsage, encode_usage

    n = sum(node.encode()) & 0xFFFFFFFF
    rows = tuple(  # UIDs and UUIDs as long as real ones (36 and 40 characters)
        ContainerUsage(
            f"{n:08x}-{len(tag):04x}-4000-8000-{i:012d}",
            "default",
            f"{node}-{tag}-{i}",
            "main",
            f"GPU-{n:08x}-0000-4000-8000-{i % GPUS:012d}",
            12_000 + i,
            30 + i,
        )
        for i in range(pods)
    )
    reading = NodeUsage("2026-11-27T14:10:03Z", rows, (UnattributedUsage("GPU-x", "host", 500, 1),))
    obj["metadata"]["annotations"] = {rn.USAGE_ANNOTATION: encode_usage(reading)}
    return obj


def memory_child() -> None:
    """Reads the pods from stdin (`write_pods`); prints the peak KiB after loading, the RSS
    KiB after each churn cycle, and the peak KiB at the end."""
    import gc
    from itertools import islice

    from bench.bench_scheduler import filter_prioritize_rounds
    from tessera_testbed.inventory import heartbeat_lease

    def lease(name: str, tag: str = "a") -> dict[str, Any]:
        """The node's Lease as its agent renews it: with its last usage reading."""
        return usage_lease(heartbeat_lease(name), name, tag, PODS // NODES)

    pods_in = (json.loads(line) for line in sys.stdin.buffer)
    keyring = bench_keyring()
    service = serving_with_keyring(keyring)
    handlers = {i.name: i.handler for i in service.informers}
    per_node = PODS // NODES
    names = node_names()
    handlers["nodes"].replace(iter([{"metadata": {"name": n}} for n in names]))
    handlers["nodedevices"].replace(iter(node_object(n, 1) for n in names))
    handlers["leases"].replace(iter(lease(n) for n in names))
    handlers["pods"].replace(islice(pods_in, PODS))
    service.settle_memory()
    cache = service.cache
    assert cache.stats().confirmed == PODS, cache.stats()
    filter_prioritize_rounds(service, cache, 20)
    _scrape_and_status(service)
    gc.collect()
    print(vm_kib("VmHWM"), flush=True)

    tags: dict[str, str] = {}
    for cycle in range(2 * CYCLES):
        tag = f"c{cycle}"
        for name in churned(cycle, names):
            for i in range(per_node):
                pod = f"{name}-{tags.get(name, 'a')}-{i}"
                meta = {"uid": f"uid-{pod}", "namespace": "default", "name": pod}
                handlers["pods"].event("DELETED", {"metadata": meta})
            handlers["nodedevices"].event("DELETED", node_object(name, cycle + 2))
            handlers["nodes"].event("DELETED", {"metadata": {"name": name}})
            handlers["leases"].event("DELETED", lease(name, tags.get(name, "a")))
        _scrape_and_status(service)
        for name in churned(cycle, names):
            handlers["nodes"].event("ADDED", {"metadata": {"name": name}})
            handlers["nodedevices"].event("ADDED", node_object(name, cycle + 2))
            handlers["leases"].event("ADDED", lease(name, tag))
            for obj in islice(pods_in, per_node):
                handlers["pods"].event("ADDED", obj)
            tags[name] = tag
        _scrape_and_status(service)
        for name in churned(cycle, names):  # the echoes of our own status writes
            echo = node_object(name, cycle + 2)
            echo["status"] = {"allocation": cache.node_summary(name)}
            handlers["nodedevices"].event("MODIFIED", echo)
        assert cache.stats().confirmed == PODS, cache.stats()
        gc.collect()
        print(vm_kib("VmRSS"), flush=True)
    print(vm_kib("VmHWM"), flush=True)
    service.server.stop()


def serving_with_keyring(keyring: Any, health_port: int | None = None) -> Any:
    """A Service around `keyring` serving HTTP on a free port (and with `health_port`, 0
    for a free one, its plain-HTTP health port too); its status writer writes into a sink
    and leads (no API server)."""
    from kube_edge.client import KubeClient
    from scheduler_plugin.service import Options, Service

    client = KubeClient.for_host("http://127.0.0.1:9")
    options = Options(
        host="127.0.0.1",
        port=0,
        leader_elect=False,
        write_status=False,
        health_host="127.0.0.1",
        health_port=health_port,
    )
    service = Service(options, client, keyring)
    service.status_writer.client = _Sink()  # type: ignore[assignment]
    for informer in service.informers:
        informer.synced.set()
    service.server.start()
    if service.health_server is not None:
        service.health_server.start()
    return service


def run(ctx: BenchContext) -> list[Result]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.bench_memory", "--child"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None
    writer = threading.Thread(target=write_pods, args=(child.stdin,), daemon=True)
    writer.start()
    text = child.stdout.read().decode()
    if child.wait() != 0:
        raise RuntimeError(f"bench_memory child failed ({child.returncode})")
    writer.join()
    lines = [int(x) / 1024 for x in text.split()]
    peak, after, churn_peak = lines[0], lines[1:-1], lines[-1]
    # The first CYCLES cycles churn every node once: each replaces objects laid out by the
    # initial load, and the allocator's arenas settle at a somewhat higher level. What
    # must not grow is the level after that: the next CYCLES cycles are the measure.
    warm, measured = after[:CYCLES], after[CYCLES:]
    growth = measured[-1] - warm[-1]
    return [
        Result(
            "scheduler peak memory, 5,000 nodes + 50,000 pods",
            peak,
            "MiB",
            150.0,
            note=f"peak RSS (VmHWM) of a process holding {NODES} nodes x {GPUS} GPUs and "
            f"{PODS} running pods with signed records, loaded through the watch handlers, "
            "after filter/prioritize calls, every node's status summary and a /metrics scrape",
        ),
        Result(
            f"memory growth over {CYCLES} node churn cycles",
            growth,
            "MiB",
            2.0,
            note=f"RSS after cycle {2 * CYCLES} minus after cycle {CYCLES}; each cycle deletes "
            f"{CHURN_NODES} nodes with their pods and loads them again with new pods, so the "
            f"first {CYCLES} (every node churned once, RSS "
            f"{', '.join(f'{x:.0f}' for x in warm)} MiB) are the warm-up; then "
            f"{', '.join(f'{x:.0f}' for x in measured)} MiB",
        ),
        Result(
            "scheduler peak memory, with churn",
            churn_peak,
            "MiB",
            note=f"peak RSS over the load and all {2 * CYCLES} churn cycles",
        ),
    ]


if __name__ == "__main__":
    if "--child" in sys.argv:
        memory_child()
    else:
        print(json.dumps([r.__dict__ for r in run(BenchContext(openb=ROOT))], indent=1))
