"""Attack surface: tessera-scheduler's extender port, called over a real socket as
kube-scheduler calls it.

The target is a real `Service` (uvicorn server, the bounded protocol, the ASGI app, the
extender and binder) over a simulated API server with a few 8-GPU nodes. Inputs are
kube-scheduler's requests (the captured ExtenderArgs and ExtenderBindingArgs shapes: a Pod
with managedFields, NodeNames or full Nodes, PascalCase keys) mutated byte-wise and
structurally (a random subtree replaced by a hostile JSON value), plus crafted bodies
(deep nesting, huge numbers, wrong shapes, oversized bodies).

Counted: a request that gets no answer or a malformed one (crash), any 5xx answer (server
error: client input must get 200 or a 4xx with a reason), and a bind that succeeds for a
pod or node that does not exist (forgery).
"""

from __future__ import annotations

import copy
import http.client
import json
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fuzz.common import INTERESTING, Tally, mutate

VECTORS = Path(__file__).resolve().parents[2] / "shared" / "vectors" / "extender"
NODES = ("peer-node-0", "peer-node-1", "peer-node-2")
MAX_BODY = 256 * 1024
"""The target's --max-body-bytes: larger bodies are refused (413) and the connection closed
while the client may still be sending (a broken pipe there is the expected answer)."""
HOSTILE: tuple[Any, ...] = (
    None,
    True,
    0,
    -1,
    1e308,
    "",
    "x" * 300,
    "\ud800",
    [],
    {},
    [None],
    {"": None},
    [[[[[]]]]],
    {"metadata": []},
    {"metadata": {"name": 5}},
    {"items": "x"},
    18446744073709551615,
)


def _pod(name: str = "gpu-pod-1", uid: str = "25819ad2-943d-4230-84be-903ec737827b") -> Any:
    """A Pod as kube-scheduler sends it (the shape of the captured requests)."""
    res = {"tessera.dev/gpu-core": "50", "tessera.dev/gpu-memory-ratio": "50"}
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": uid,
            "resourceVersion": "83",
            "creationTimestamp": "2026-11-22T03:00:06Z",
            "annotations": {"example.com/note": "captured"},
            "managedFields": [
                {
                    "manager": "kubectl-create",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-22T03:00:06Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:spec": {
                            "f:containers": {
                                'k:{"name":"main"}': {
                                    ".": {},
                                    "f:resources": {"f:limits": {".": {}}},
                                }
                            }
                        }
                    },
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": res, "requests": res},
                }
            ],
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "priority": 0,
        },
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }


def seed_bodies() -> list[tuple[str, bytes]]:
    """(verb, body): the captured requests when they are at hand, and the same shapes built
    here (names cached, full Nodes, both victims forms, a bind)."""
    seeds: list[tuple[str, bytes]] = []
    if VECTORS.is_dir():
        for path in sorted(VECTORS.rglob("*.json")):
            seeds.append((path.stem.split("-")[0], path.read_bytes()))
    node = {"metadata": {"name": NODES[0], "labels": {"kubernetes.io/hostname": NODES[0]}}}
    built: list[tuple[str, Any]] = [
        ("filter", {"Pod": _pod(), "Nodes": None, "NodeNames": list(NODES)}),
        ("prioritize", {"Pod": _pod(), "Nodes": None, "NodeNames": list(NODES)}),
        ("filter", {"Pod": _pod(), "Nodes": {"metadata": {}, "items": [node]}, "NodeNames": None}),
        (
            "preempt",
            {
                "Pod": _pod(),
                "NodeNameToMetaVictims": {
                    NODES[0]: {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0}
                },
            },
        ),
        (
            "preempt",
            {
                "Pod": _pod(),
                "NodeNameToVictims": {NODES[1]: {"Pods": [{"metadata": {"uid": "v2"}}]}},
            },
        ),
        (
            "bind",
            {"PodName": "nope", "PodNamespace": "default", "PodUID": "nope", "Node": NODES[0]},
        ),
    ]
    seeds += [(verb, json.dumps(body).encode()) for verb, body in built]
    return seeds


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


def replace_at(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of `doc` with the value at `path` replaced."""
    if not path:
        return value
    doc = copy.deepcopy(doc)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


def structural(body: bytes, rng: random.Random) -> bytes:
    """Replace one random subtree of a JSON body with a hostile value."""
    doc = json.loads(body)
    paths = list(_paths(doc))
    value = rng.choice(HOSTILE)
    return json.dumps(replace_at(doc, rng.choice(paths), value)).encode()


def crafted(rng: random.Random) -> tuple[str, bytes]:
    verb = rng.choice(("filter", "prioritize", "bind", "preempt"))
    depth = rng.choice((65, 1000, 100_000))
    pick = rng.randrange(6)
    if pick == 0:
        return verb, b"[" * depth + b"]" * depth
    if pick == 1:
        return verb, b'{"Pod":' * depth + b"{}" + b"}" * depth
    if pick == 2:
        return verb, b'{"Pod":{"spec":{"priority":' + rng.choice(INTERESTING) + b"}}}"
    if pick == 3:
        return verb, json.dumps({"Pod": _pod(), "NodeNames": ["n"] * 20_000}).encode()
    if pick == 4:
        return verb, b'{"NodeNames":["' + b"a" * 200_000 + b'"]}'
    return verb, bytes(rng.randrange(256) for _ in range(rng.randrange(64)))


@contextmanager
def target() -> Iterator[Any]:
    """A ready Service on a loopback port over a simulated API server."""
    from kube_edge.client import KubeClient
    from scheduler_plugin.service import Options, Service
    from tessera.record import Keyring
    from tessera_testbed.apiserver import FakeApiServer
    from tessera_testbed.inventory import heartbeat_lease, nodedevices

    with FakeApiServer() as fake:
        for node in NODES:
            fake.create("nodes", {"metadata": {"name": node}})
            fake.create("nodedevices", nodedevices(node))
            fake.create("leases", heartbeat_lease(node))
        options = Options(
            host="127.0.0.1",
            port=0,
            leader_elect=False,
            write_status=False,
            max_body=MAX_BODY,
        )
        service = Service(
            options,
            KubeClient.for_host(fake.url, timeout=5),
            Keyring.generate("fuzz"),
        ).start()
        try:
            if not service.wait_ready(30):
                raise RuntimeError(f"the extender did not become ready: {service.readiness()}")
            yield service
        finally:
            service.stop()


def well_formed(verb: str, status: int, data: bytes) -> bool:
    """Whether a reply is what kube-scheduler can decode: 200 with the verb's shape, or a
    4xx with an Error reason."""
    try:
        reply = json.loads(data)
    except ValueError:
        return False
    if status != 200:
        return isinstance(reply, dict) and bool(reply.get("Error"))
    if verb == "prioritize":
        return isinstance(reply, list) and all(
            isinstance(e, dict) and isinstance(e.get("Score"), int) for e in reply
        )
    if verb == "filter":
        return isinstance(reply, dict) and "FailedNodes" in reply and reply.get("Error") == ""
    if verb == "bind":
        return isinstance(reply, dict) and isinstance(reply.get("Error"), str)
    return isinstance(reply, dict) and isinstance(reply.get("NodeNameToMetaVictims"), dict)


def send(port: int, verb: str, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("POST", f"/tessera/{verb}", body=body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def run(n: int, seed: int) -> Tally:
    rng = random.Random(seed)
    tally = Tally("extender")
    seeds = seed_bodies()
    with target() as service:
        port = service.server.port
        for i in range(n):
            verb, body = rng.choice(seeds)
            kind = rng.random()
            if kind < 0.4:
                for _ in range(rng.randrange(1, 4)):
                    body = mutate(body, rng, max_len=1 << 18)
            elif kind < 0.85:
                body = structural(body, rng)
            else:
                verb, body = crafted(rng)
            tally.inputs += 1
            try:
                status, data = send(port, verb, body)
            except (OSError, http.client.HTTPException) as exc:
                if len(body) > MAX_BODY and isinstance(exc, ConnectionError):
                    continue
                tally.fail("crashes", f"#{i} {verb}: no answer ({exc!r}) to {body[:80]!r}")
                continue
            if status >= 500:
                tally.fail("server_errors", f"#{i} {verb}: {status} {data[:120]!r}")
            elif not well_formed(verb, status, data):
                tally.fail("crashes", f"#{i} {verb}: malformed {status} reply {data[:120]!r}")
            elif verb == "bind" and status == 200 and json.loads(data).get("Error") == "":
                tally.fail("forgeries", f"#{i} bind accepted: {body[:120]!r}")
    return tally


def rss_growth_under_slow_clients(port: int, max_body: int, clients: int = 100) -> int:
    """Bytes this process's RSS grows (at its peak) while `clients` connect to the extender
    on `port` at once: half announce the largest allowed body and dribble it, half send 4x
    that. Bodies must wait for room in the byte budget, so the growth stays bounded."""
    import socket
    import threading

    import psutil

    big, drip = b" " * (max_body * 4), b" " * 32768  # shared, allocated before measuring
    me = psutil.Process()
    before = peak = me.memory_info().rss

    def send(length: int, chunks: list[bytes], pause_s: float) -> None:
        head = f"POST /filter HTTP/1.1\r\nContent-Length: {length}\r\n\r\n".encode()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(head)
                for chunk in chunks:
                    sock.sendall(chunk)
                    time.sleep(pause_s)
        except OSError:
            pass

    threads = [
        threading.Thread(target=send, args=(max_body, [drip] * 40, 0.05))
        for _ in range(clients // 2)
    ]
    threads += [
        threading.Thread(target=send, args=(max_body * 4, [big], 0.0))
        for _ in range(clients - clients // 2)
    ]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, me.memory_info().rss)
        time.sleep(0.01)
    return peak - before
