"""The filter call's latency as kube-scheduler sees it: over HTTP, one call at a time.

kube-scheduler waits for the extender's filter answer before it goes on with the pod, so
on a control plane with cores to spare the extender's latency bounds its pace. This
benchmark serves the extender as tessera-scheduler does (the same Service, uvicorn and
protocol, plain HTTP) on a 5,000-node half-full cluster (`bench_filter.cluster`) and sends
filter calls from another process over one kept-alive connection, one at a time, as
kube-scheduler's scheduling cycle does, in `make bench-scale`'s pattern: its four pod
shapes in turn, each Pod as the API server stores it (`stored_pod`, about 2 KB), 500 names
in a window that moves on by about 500 from pod to pod, or all 5,000 names. Each answered
node is then bound in the server (the cache's assume and bind, after the answer is
written, outside the client's timing) so every call sees nodes that changed. The client
waits between calls as kube-scheduler does (`GAP`); it is a bare socket loop (prepared
request bytes, a read to the end of the answer), so its own cost in the round trip is a
few microseconds. The figures are the client's wall time per call and the
serving thread's CPU per call.

TLS is left out: on a kept-alive connection it adds about 0.014 ms a call here
(`python -m bench.tls_setup`).

`python -m bench.bench_filter_latency [--quick]`
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import random
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from bench.common import BenchContext, Result, percentile

WARMUP = 250
"""Calls before the counted ones (the policy learns the workload from its first pods)."""
GAP = 0.002
"""Seconds between an answer and the next call: kube-scheduler's own scheduling cycle for
the next pod (its filter plugins over the nodes until it has found 500 feasible ones, at
5,000 nodes a few milliseconds: kube-scheduler alone schedules 220-330 pods a second in
`make bench-scale`, one cycle at a time). Work the extender leaves for after an answer
(binding the answered node here, as kube-scheduler's bind call soon does) happens then."""

_CLIENT = """
import json, socket, sys, time
port, path, gap = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
requests = [r.encode("latin-1") for r in json.load(open(path))]
sock = socket.create_connection(("127.0.0.1", port))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times = []
for request in requests:
    time.sleep(gap)
    t0 = time.perf_counter_ns()
    sock.sendall(request)
    data = b""
    while True:
        data += sock.recv(1 << 20)
        end = data.find(b"\\r\\n\\r\\n")
        if end < 0:
            continue
        head = data[:end].lower()
        at = head.find(b"content-length:")
        length = int(head[at + 15:].split(b"\\r\\n", 1)[0])
        if len(data) >= end + 4 + length:
            break
    times.append(time.perf_counter_ns() - t0)
    if not data.startswith(b"HTTP/1.1 200"):
        sys.exit("not answered: " + data[:200].decode("latin-1"))
print(json.dumps(times))
"""


CAPTURED_FILTER = Path(__file__).resolve().parent.parent / "tests/vectors/extender/filter-001.json"
"""A filter call's body as a real kube-scheduler sent it (kept with the tests)."""


@functools.cache
def _captured_pod() -> dict[str, Any]:
    pod: dict[str, Any] = json.loads(CAPTURED_FILTER.read_text())["Pod"]
    return pod


def stored_pod(i: int, limits: dict[str, str]) -> dict[str, Any]:
    """Pod `i` asking for `limits` as kube-scheduler sends it to the extender: the Pod of a
    captured filter call (what the API server keeps of a pod created by a client: its
    managedFields, the defaults it fills in, the default tolerations, a status), with a
    name, UID and resources of its own. `make bench-scale`'s pods are created the same way
    (limits only; the API server copies them into requests)."""
    pod = copy.deepcopy(_captured_pod())
    meta = pod["metadata"]
    meta.update(name=f"bench-{i}", uid=f"bench-uid-{i}", resourceVersion=str(1000 + i))
    pod["spec"]["containers"][0]["resources"] = {"limits": dict(limits), "requests": dict(limits)}
    fields = meta["managedFields"][0]["fieldsV1"]["f:spec"]["f:containers"]
    listed: dict[str, Any] = {".": {}, **{f"f:{name}": {} for name in limits}}
    fields['k:{"name":"main"}']["f:resources"] = {".": {}, "f:limits": listed, "f:requests": listed}
    pod["status"]["qosClass"] = "BestEffort"  # extended resources only
    return pod


def requests(every: list[str], names: int, calls: int, seed: int) -> list[str]:
    """HTTP/1.1 filter requests in `make bench-scale`'s pattern, as latin-1 text."""
    from bench.scale_common import SHAPES

    rng = random.Random(seed)
    start = 0
    out = []
    for i in range(calls):
        window = (every[start:] + every[:start])[:names]
        start = (start + names + rng.randrange(16)) % len(every)
        body = json.dumps(
            {
                "Pod": stored_pod(seed * 100000 + i, dict(SHAPES[i % len(SHAPES)])),
                "Nodes": None,
                "NodeNames": window,
            },
            separators=(",", ":"),
        ).encode()
        head = (
            "POST /filter HTTP/1.1\r\nHost: tessera\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        out.append(head + body.decode("latin-1"))
    return out


def bind_answers(service: Any) -> None:
    """Make `service` bind each filter's answered node right after the answer is written
    (the serving loop's next turn), as kube-scheduler's bind call would soon after."""
    from scheduler_plugin.state.values import Assumed

    extender, cache = service.extender, service.cache
    filter_call = extender.filter

    def bind(uid: str, node: str) -> None:
        request = extender.remembered(uid)
        if request is not None and isinstance(cache.pods.assume(request, node), Assumed):
            cache.pods.bind(uid)
        extender.forget(uid)

    def filter_then_bind(args: Any) -> Any:
        reply = filter_call(args)
        chosen = reply.get("NodeNames") if isinstance(reply, dict) else None
        if chosen:
            uid = args["Pod"]["metadata"]["uid"]
            asyncio.get_running_loop().call_soon(bind, uid, chosen[0])
        return reply

    extender.filter = filter_then_bind


def measure(names: int, calls: int, seed: int = 11, gap: float = GAP) -> tuple[list[float], float]:
    """(wall ms of each counted call, serving thread CPU ms per counted call), the client
    waiting `gap` seconds between an answer and its next call."""
    from bench.bench_filter import cluster
    from bench.bench_scheduler import serving

    cache = cluster()
    service = serving(cache, "best")
    bind_answers(service)
    try:
        return _drive(service.server.port, cache.node_names(), names, calls, seed, gap)
    finally:
        service.server.stop()


def measure_floor(
    names: int, calls: int, seed: int = 11, gap: float = GAP
) -> tuple[list[float], float]:
    """`measure` against bench.floor_extender's HTTP/1.1 protocol (a bare asyncio protocol
    on httptools, the stdlib JSON decoder, the first name as the answer, no decision): the
    least a Python extender's filter call costs on this machine, as kube-scheduler sees it."""
    from bench.floor_extender import serve_plain

    port, stop = serve_plain()
    try:
        every = [f"node-{n:05d}" for n in range(5000)]  # bench_filter.cluster's names
        return _drive(port, every, names, calls, seed, gap)
    finally:
        stop()


def _drive(
    port: int, every: list[str], names: int, calls: int, seed: int, gap: float
) -> tuple[list[float], float]:
    """Warm-up then counted calls from the client process to `port`: (wall ms of each
    counted call, CPU ms per counted call of the thread named http-extender)."""
    from bench.scale_common import own_thread_cpu_seconds

    thread = next(t for t in threading.enumerate() if t.name == "http-extender")
    assert thread.native_id is not None
    batches = (requests(every, names, WARMUP, seed), requests(every, names, calls, seed + 1))
    times: list[int] = []
    cpu = 0.0
    for counted, batch in enumerate(batches):
        with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
            json.dump(batch, file)
            file.flush()
            before = own_thread_cpu_seconds(thread.native_id)
            out = subprocess.run(
                [sys.executable, "-c", _CLIENT, str(port), file.name, str(gap)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            cpu = own_thread_cpu_seconds(thread.native_id) - before
        times = json.loads(out) if counted else times
    # the client's start (interpreter, connection) is in the CPU span: a few ms over
    # `calls` calls, under 0.01 ms a call
    return [t / 1e6 for t in times], cpu * 1000 / calls


def run(ctx: BenchContext) -> list[Result]:
    calls = ctx.sized(quick=100, full=1000)
    results = []
    for names, target in ((500, 0.5), (5000, None)):
        wall, cpu = measure(names, calls)
        note = (
            f"{names} names of 5000 nodes, half full, bench-scale's four pod shapes in turn "
            "as the API server stores them, "
            f"--filter-answer=best, plain HTTP, one kept-alive connection, one call at a time, "
            f"{GAP * 1000:g} ms between an answer and the next call; "
            f"{len(wall)} calls after {WARMUP} warm-up; p99 {percentile(wall, 99):.3f} ms, "
            f"serving thread {cpu:.3f} ms CPU per call"
        )
        results.append(
            Result(
                f"filter latency p50 as kube-scheduler sees it, {names} names",
                percentile(wall, 50),
                "ms",
                target,
                note=note,
            )
        )
        results.append(
            Result(
                f"filter latency p99 as kube-scheduler sees it, {names} names",
                percentile(wall, 99),
                "ms",
            )
        )
    wall, cpu = measure_floor(500, calls)
    results.append(
        Result(
            "filter latency p50 without a decision (the floor), 500 names",
            percentile(wall, 50),
            "ms",
            note=(
                "the same calls answered by bench.floor_extender's protocol (bare asyncio "
                "protocol on httptools, stdlib JSON decode, the first name as the answer): "
                f"what any Python extender's call costs here; p99 {percentile(wall, 99):.3f} "
                f"ms, serving thread {cpu:.3f} ms CPU per call"
            ),
        )
    )
    return results


def main(argv: list[str]) -> None:
    for r in run(BenchContext(Path("."), quick="--quick" in argv)):
        print(f"{r.name}: {r.measured_text()} (target {r.target_text()}) {r.note}")


if __name__ == "__main__":
    main(sys.argv[1:])
