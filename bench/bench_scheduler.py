"""Scheduler extender speed and size.

- the extender calls kube-scheduler makes per pod, over HTTP (one keep-alive connection, as
  kube-scheduler uses), p99, for 500 and 5,000 node names; nodes have 8 GPUs each, the
  cluster half full. With the default `--filter-answer=best` that is one filter call (a
  lone survivor is bound without scoring); with `all`, filter and then prioritize;
- bind decisions per second on one core: binds against a local (fake) API server in another
  process, both pinned to the same core (so the figure includes the API server's work);
  the scheduler's own CPU per bind is reported beside it;
- what HTTP adds to a filter call: the serving thread's CPU per call over one kept-alive
  connection (the client in another process) against the handler's own CPU in process,
  for the same 500-name bodies;
- resident memory of a scheduler process holding a 5,000-node half-full cluster, after
  serving filter/prioritize calls.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from bench.common import BenchContext, Result, percentile, serving_child

ROOT = Path(__file__).resolve().parent.parent
GPUS_PER_NODE = 8
MEM = 81559
"""Memory of each GPU, MiB: nodes are 8x H100 SXM (`node_spec`)."""


def node_spec(name: str) -> dict[str, Any]:
    """An 8x H100 SXM node as its agent publishes it: NVLinked GPUs, 4 RDMA NICs of 8
    virtual functions."""
    from tessera_testbed.inventory import make_spec

    return make_spec(name)


def create_nodes(client: Any, count: int) -> list[str]:
    """`count` Nodes with their NodeDevices and fresh heartbeat Leases, created through
    `client` on an API server; returns the node names."""
    from kube_edge.client import lease_path
    from tessera_testbed.inventory import heartbeat_lease

    names = [f"node-{n:04d}" for n in range(count)]
    for name in names:
        client.create("/api/v1/nodes", {"metadata": {"name": name}})
        client.create(
            "/apis/tessera.dev/v1alpha1/nodedevices",
            {"metadata": {"name": name}, "spec": node_spec(name)},
        )
        client.create(lease_path("tessera-system"), heartbeat_lease(name))
    return names


def create_running_pod(client: Any, name: str, node: str, record: str | None) -> None:
    """A Running pod bound to `node` with one 25% GPU share and `record` as its allocation
    annotation (None: no annotation)."""
    from tessera import resources as rn

    shape = {rn.GPU_CORE: "25", rn.GPU_MEMORY_RATIO: "25"}
    obj: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "annotations": {} if record is None else {rn.ALLOCATION_ANNOTATION: record},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "resources": {"limits": shape}}],
        },
        "status": {"phase": "Running"},
    }
    client.create("/api/v1/namespaces/default/pods", obj)


def create_signed_pods(client: Any, nodes: list[str], per_node: int, keyring: Any) -> list[str]:
    """`per_node` Running pods on each node, each with a valid record signed by `keyring`
    for a 25% share of one of the node's 8 GPUs; returns the records."""
    from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
    from tessera.record import encode

    records = []
    for node in nodes:
        for i in range(per_node):
            name = f"{node}-p{i}"
            grant = GpuGrant(f"GPU-{node}-{i % 8}", i % 8, i % 8, 25, 20480)
            alloc = PodAllocation(
                f"uid-{name}", "default", name, node, (ContainerAllocation("main", (grant,)),)
            )
            records.append(encode(alloc, keyring))
            create_running_pod(client, name, node, records[-1])
    return records


def half_full_cache(nodes: int, seed: int = 1, cache: Any = None) -> Any:
    """A Cache (`cache`, or a new one) with `nodes` 8-GPU nodes, about half of the GPU
    capacity allocated in a mix of whole GPUs and shares."""
    from scheduler_plugin.state.cache import Cache
    from scheduler_plugin.state.values import Holds, PodSeen
    from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
    from tessera_testbed.inventory import heartbeat_lease

    rng = random.Random(seed)
    if cache is None:
        cache = Cache("binpack", require_heartbeat=True)
    for n in range(nodes):
        name = f"node-{n:05d}"
        cache.nodes.upsert(name, node_spec(name))
        cache.leases.seen(heartbeat_lease(name))
        used = 0.0
        slot = 0
        pod_no = 0
        target = GPUS_PER_NODE * rng.uniform(0.3, 0.7)
        while used < target and slot < GPUS_PER_NODE:
            pod_no += 1
            if rng.random() < 0.5:
                grants = (GpuGrant(f"GPU-{name}-{slot}", slot, slot, 100, MEM),)
                used += 1
            else:
                core = rng.choice((20, 30, 50))
                grants = (GpuGrant(f"GPU-{name}-{slot}", slot, slot, core, MEM * core // 100),)
                used += core / 100
            slot += 1
            uid, pod_name = f"uid-{name}-{pod_no}", f"p-{name}-{pod_no}"
            alloc = PodAllocation(
                uid, "default", pod_name, name, (ContainerAllocation("main", grants),)
            )
            cache.pods.observed(PodSeen(uid, "default", pod_name, name), Holds(alloc))
    return cache


def serving(cache: Any, filter_answer: str = "best") -> Any:
    """A Service around `cache`, serving HTTP on a free port, without an API server."""
    from kube_edge.client import KubeClient
    from scheduler_plugin.service import Options, Service
    from tessera.record import Keyring

    client = KubeClient.for_host("http://127.0.0.1:9")
    service = Service(
        Options(
            host="127.0.0.1",
            port=0,
            leader_elect=False,
            write_status=False,
            filter_answer=filter_answer,
        ),
        client,
        Keyring.generate("bench"),
    )
    service.cache = cache
    service.metrics.attach(cache)
    service.extender.cache = cache
    for informer in service.informers:
        informer.synced.set()
    service.settle_memory()  # what the running service does after its initial sync
    service.server.start()
    return service


def _pods() -> list[dict[str, Any]]:
    from tessera import resources as rn

    shapes = [
        {rn.GPU_CORE: "30", rn.GPU_MEMORY_RATIO: "30"},
        {rn.GPU: "100"},
        {rn.GPU: "200"},
        {rn.GPU_CORE: "50", rn.GPU_MEMORY: "20"},
    ]
    return [
        {
            "metadata": {"name": f"bench-{i}", "namespace": "default", "uid": f"bench-uid-{i}"},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "resources": {"limits": shapes[i % 4], "requests": shapes[i % 4]},
                    }
                ]
            },
        }
        for i in range(4)
    ]


def call_latency(nodes: int, rounds: int, filter_answer: str) -> list[float]:
    """Milliseconds per pod for the extender calls kube-scheduler makes: filter, and
    prioritize on the survivors when there is more than one."""
    import http.client

    cache = half_full_cache(nodes)
    service = serving(cache, filter_answer)
    names = cache.node_names()
    conn = http.client.HTTPConnection("127.0.0.1", service.server.port)
    pods = _pods()
    samples = []
    try:
        for i in range(rounds + 20):
            pod = dict(pods[i % len(pods)])
            # a new pod each round, versioned as the API server's pods always are
            pod["metadata"] = dict(pod["metadata"], uid=f"bench-uid-{i}", resourceVersion=str(i))
            body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()
            start = time.perf_counter()
            conn.request("POST", "/filter", body=body)
            reply = json.loads(conn.getresponse().read())
            passed = reply["NodeNames"]
            if len(passed) > 1:
                body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed}).encode()
                conn.request("POST", "/prioritize", body=body)
                scores = json.loads(conn.getresponse().read())
                assert len(scores) == len(passed)
            elapsed = time.perf_counter() - start
            assert passed and (len(passed) == 1) == (filter_answer == "best")
            if i >= 20:  # warm-up rounds are not counted
                samples.append(elapsed * 1000)
    finally:
        service.server.stop()
    return samples


_HTTP_CLIENT = """
import http.client, json, sys
bodies = json.load(open(sys.argv[1]))
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[2]))
for body in bodies:
    conn.request("POST", "/filter", body.encode(), {"Content-Type": "application/json"})
    conn.getresponse().read()
"""


def http_cost(calls: int, nodes: int = 5000, names: int = 500) -> tuple[float, float]:
    """(serving thread CPU ms per filter call over HTTP, handler CPU ms per call in
    process) for a whole-GPU pod and `names` node names, plain HTTP, one kept-alive
    connection from another process (so the client does not share this interpreter)."""
    import tempfile

    from bench.scale_common import own_thread_cpu_seconds
    from tessera import resources as rn

    cache = half_full_cache(nodes)
    service = serving(cache, "best")
    window = cache.node_names()[:names]
    limits = {rn.GPU: "100"}
    bodies = [
        json.dumps(
            {
                "Pod": {
                    "metadata": {
                        "name": f"http-{i}",
                        "namespace": "default",
                        "uid": f"http-uid-{i}",
                        "resourceVersion": str(i),
                    },
                    "spec": {
                        "containers": [
                            {"name": "main", "resources": {"limits": limits, "requests": limits}}
                        ]
                    },
                },
                "Nodes": None,
                "NodeNames": window,
            }
        )
        for i in range(calls)
    ]
    try:
        thread = next(t for t in threading.enumerate() if t.name == "http-extender")
        assert thread.native_id is not None
        with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
            json.dump(bodies, file)
            file.flush()
            before = own_thread_cpu_seconds(thread.native_id)
            subprocess.run(
                [sys.executable, "-c", _HTTP_CLIENT, file.name, str(service.server.port)],
                check=True,
            )
            over_http = (own_thread_cpu_seconds(thread.native_id) - before) * 1000 / calls
    finally:
        service.server.stop()
    # the same bodies again, as new pods, straight to the handler (decode included)
    extender = service.extender
    start = time.thread_time()
    for body in bodies:
        extender.filter(json.loads(body.replace("http-uid-", "again-uid-")))
    in_process = (time.thread_time() - start) * 1000 / calls
    return over_http, in_process


# --- binds ----------------------------------------------------------------------------------------


def fake_api() -> AbstractContextManager[str]:
    """The simulated API server in a child process (a watch history long enough for every
    benchmark here); its URL."""
    return serving_child("tessera_testbed.apiserver", "--history", "20000")


def bind_rate(binds: int, nodes: int = 50, workers: int = 8) -> tuple[float, float]:
    """(binds per CPU-second of this process, binds per wall-clock second)."""
    from kube_edge.client import KubeClient, lease_path
    from scheduler_plugin.decisions.binder import BindArgs
    from scheduler_plugin.service import Options, Service
    from tessera import resources as rn
    from tessera.record import Keyring
    from tessera_testbed.inventory import heartbeat_lease

    with fake_api() as url:
        setup = KubeClient.for_host(url)
        for n in range(nodes):
            name = f"node-{n:03d}"
            setup.create("/api/v1/nodes", {"metadata": {"name": name}})
            setup.create(
                "/apis/tessera.dev/v1alpha1/nodedevices",
                {"metadata": {"name": name}, "spec": node_spec(name)},
            )
            setup.create(lease_path("tessera-system"), heartbeat_lease(name))
        shape = {rn.GPU_CORE: "10", rn.GPU_MEMORY_RATIO: "10"}
        created = []
        for i in range(binds):
            obj = {
                "metadata": {"name": f"b{i}", "namespace": "default"},
                "spec": {"containers": [{"name": "main", "resources": {"limits": shape}}]},
            }
            created.append(setup.create("/api/v1/namespaces/default/pods", obj))
        service = Service(
            Options(host="127.0.0.1", port=0, leader_elect=False, write_status=False),
            KubeClient.for_host(url, pool_size=workers * 2),
            Keyring.generate("bench"),
        ).start()
        assert service.wait_ready(60)
        # warm the request cache as filter does before each bind
        for obj in created:
            service.extender.remember(obj, service.extender.parse(obj))
        queue = list(enumerate(created))
        lock = threading.Lock()
        errors: list[str] = []

        def worker() -> None:
            while True:
                with lock:
                    if not queue:
                        return
                    i, obj = queue.pop()
                meta = obj["metadata"]
                node = f"node-{i % nodes:03d}"
                result = service.binder.bind(
                    BindArgs(meta["name"], "default", meta["uid"], node).to_json()
                )
                if result["Error"]:
                    errors.append(result["Error"])

        cpu0, wall0 = time.process_time(), time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        service.stop()
        if errors:
            raise RuntimeError(f"{len(errors)} binds failed, e.g. {errors[0]}")
        return binds / cpu, binds / wall


def client_cost(calls: int = 300) -> tuple[float, float]:
    """CPU milliseconds per bind's API call (a Binding carrying the record), made
    sequentially: (our thin urllib3 client, the `kubernetes` package's CoreV1Api)."""
    from kubernetes import client as kclient

    from kube_edge.client import KubeClient, pod_path

    with fake_api() as url:
        thin = KubeClient.for_host(url)
        names = [f"c{i}" for i in range(2 * calls)]
        for name in names:
            spec = {"containers": [{"name": "main", "image": "busybox"}]}
            thin.create(pod_path("default"), {"metadata": {"name": name}, "spec": spec})
        record = {"tessera.dev/allocation": "x" * 400}

        def binding(name: str) -> dict[str, Any]:
            return {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "annotations": record},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "n"},
            }

        start = time.process_time()
        for name in names[:calls]:
            thin.create(pod_path("default", name) + "/binding", binding(name))
        ours = (time.process_time() - start) * 1000 / calls

        cfg = kclient.Configuration()
        cfg.host = url
        api = kclient.CoreV1Api(kclient.ApiClient(cfg))
        start = time.process_time()
        for name in names[calls:]:
            body = kclient.V1Binding(
                metadata=kclient.V1ObjectMeta(name=name, annotations=record),
                target=kclient.V1ObjectReference(api_version="v1", kind="Node", name="n"),
            )
            api.create_namespaced_binding("default", body, _preload_content=False)
        theirs = (time.process_time() - start) * 1000 / calls
        return ours, theirs


# --- memory ---------------------------------------------------------------------------------------


def rss_child() -> None:
    import psutil

    cache = half_full_cache(5000)
    service = serving(cache)
    filter_prioritize_rounds(service, cache, 20)
    print(psutil.Process().memory_info().rss)


def filter_prioritize_rounds(service: Any, cache: Any, rounds: int) -> None:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", service.server.port)
    names = cache.node_names()
    for i in range(rounds):
        pod = _pods()[i % 4]
        conn.request("POST", "/filter", body=json.dumps({"Pod": pod, "NodeNames": names}))
        passed = json.loads(conn.getresponse().read())["NodeNames"]
        conn.request("POST", "/prioritize", body=json.dumps({"Pod": pod, "NodeNames": passed}))
        conn.getresponse().read()


def hostile_rss_child() -> None:
    """RSS growth (bytes) of a scheduler with a 5,000-node cluster while 100 clients at once
    announce the largest allowed body and dribble it (50) or send 4x that (50)."""
    from fuzz.surface_extender import rss_growth_under_slow_clients

    service = serving(half_full_cache(5000))
    print(rss_growth_under_slow_clients(service.server.port, service.options.max_body))


def _child_mib(flag: str) -> float:
    """Run this module with `flag` in a fresh process; its last line is a byte count."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-m", "bench.bench_scheduler", flag],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return int(out.stdout.strip().splitlines()[-1]) / 2**20


def hostile_rss_growth() -> float:
    return _child_mib("--hostile-rss-child")


def rss_at_5000() -> float:
    return _child_mib("--rss-child")


def run(ctx: BenchContext) -> list[Result]:
    rounds = ctx.sized(quick=50, full=300)
    results = []
    for nodes, target in ((500, 5.0), (5000, 15.0)):
        for answer, calls in (("best", "filter"), ("all", "filter+prioritize")):
            samples = call_latency(nodes, rounds, answer)
            results.append(
                Result(
                    f"{calls} p99 (--filter-answer={answer}), {nodes} nodes",
                    percentile(samples, 99),
                    "ms",
                    target,
                    note=(
                        f"{nodes} nodes x {GPUS_PER_NODE} GPUs, half full; p50 "
                        f"{percentile(samples, 50):.2f} ms over {len(samples)} pods, HTTP "
                        "keep-alive"
                    ),
                )
            )
    over_http, in_process = http_cost(ctx.sized(quick=300, full=2000))
    results.append(
        Result(
            "filter call over HTTP, serving thread CPU",
            over_http,
            "ms CPU",
            note=(
                f"a whole-GPU pod, 500 names of 5000 nodes, plain HTTP, one kept-alive "
                f"connection from another process; the handler alone (JSON decode, decision, "
                f"reply) takes {in_process:.3f} ms in process, so HTTP adds "
                f"{over_http - in_process:.3f} ms"
            ),
        )
    )
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})  # the API server process inherits it
    try:
        per_cpu, per_wall = bind_rate(ctx.sized(quick=200, full=1000))
    finally:
        os.sched_setaffinity(0, cpus)
    results.append(
        Result(
            "bind decisions per second, one core",
            per_wall,
            "binds/s",
            300.0,
            lower_is_better=False,
            note=(
                "wall clock, 8 parallel binds (placement, Binding carrying the signed record) with "
                "the scheduler AND its fake API server pinned to the same single core; the "
                f"scheduler alone spends {1000 / per_cpu:.2f} ms CPU per bind "
                f"({per_cpu:.0f} binds per CPU-second)"
            ),
        )
    )
    ours, theirs = client_cost(ctx.sized(quick=100, full=300))
    results.append(
        Result(
            "bind API calls, thin client",
            ours,
            "ms CPU",
            note="one Binding carrying the record, sequential, CPU of the calling process",
        )
    )
    results.append(
        Result(
            "bind API calls, kubernetes package",
            theirs,
            "ms CPU",
            note="the same two calls through kubernetes.client.CoreV1Api (for comparison)",
        )
    )
    results.append(
        Result(
            "resident memory, 5,000 nodes",
            rss_at_5000(),
            "MiB",
            150.0,
            note="5,000 nodes x 8 GPUs half full, after serving filter and prioritize",
        )
    )
    results.append(
        Result(
            "memory growth under 100 hostile clients",
            hostile_rss_growth(),
            "MiB",
            100.0,
            note="RSS growth of a 5,000-node scheduler while 50 clients dribble the largest "
            "allowed body and 50 send bodies over the limit, all at once",
        )
    )
    return results


if __name__ == "__main__":
    if "--rss-child" in sys.argv:
        rss_child()
    elif "--hostile-rss-child" in sys.argv:
        hostile_rss_child()
    else:
        for r in run(BenchContext(openb=ROOT, quick="--quick" in sys.argv)):
            print(f"{r.name}: {r.measured_text()} (target {r.target_text()}) {r.note}")
