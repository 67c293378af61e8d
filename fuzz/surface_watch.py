"""The Kubernetes edge's informer under hostile list pages and watch streams.

A loopback HTTP server plays an API server whose objects were written by a hostile client
(a node agent's NodeDevices, a pod author's annotations) or whose stream is broken: each
input is a watch stream of mutated and crafted event lines followed by one good sentinel
event, or (one input in eight) a mutated list page. The informer must decode and hand over
each object on its own: a crash is any exception other than ApiError escaping the list or
the watch, a handler that sees a non-object, or a watch that ended normally without
delivering the sentinel (a bad line stopped it).
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fuzz.common import Tally, mutate
from kube_edge.client import KubeClient
from kube_edge.errors import ApiError
from kube_edge.informer import Handler, Informer


def _event(kind: str, name: str, rv: int) -> bytes:
    obj = {
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "NodeDevices",
        "metadata": {"name": name, "resourceVersion": str(rv)},
        "spec": {"nodeName": name, "gpus": [{"uuid": f"GPU-{name}", "memoryMiB": 81920}]},
    }
    return json.dumps({"type": kind, "object": obj}).encode()


SEEDS = [
    _event("ADDED", "n1", 5),
    _event("MODIFIED", "n2", 6),
    _event("DELETED", "n3", 7),
    json.dumps({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}).encode(),
]
CRAFTED = [
    b"",
    b"{",
    b"[]",
    b'{"type": "ADDED"}',
    b'{"type": "ADDED", "object": []}',
    b'{"type": "ADDED", "object": {"metadata": []}}',
    b'{"type": "ADDED", "object": {"metadata": {"resourceVersion": {"a": 1}}}}',
    b'{"type": ["ADDED"], "object": {}}',
    b'{"type": "ADDED", "object": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"type": "ADDED", "object": {"n": ' + b"9" * 5000 + b"}}",
    b'{"type": "ERROR", "object": "gone"}',
    b"\xff\xfe\x00",
]
SENTINEL = _event("ADDED", "sentinel", 10)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    body: bytes = b""


class _Reply(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if "watch=" not in self.path:
            self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, *args: object) -> None:
        pass


class _Check(Handler):
    def __init__(self) -> None:
        self.bad = ""
        self.sentinel = False

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        for item in items:
            if not isinstance(item, dict):
                self.bad = f"a list item that is not an object: {type(item).__name__}"

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if not isinstance(obj, dict) or kind not in ("ADDED", "MODIFIED", "DELETED"):
            self.bad = f"handed {kind!r} {type(obj).__name__}"
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if isinstance(meta, dict) and meta.get("name") == "sentinel":
            self.sentinel = True


def _list_page(rng: random.Random) -> bytes:
    items = [json.loads(line)["object"] for line in SEEDS[:3]]
    page = json.dumps({"metadata": {"resourceVersion": "4"}, "items": items}).encode()
    for _ in range(rng.randrange(1, 4)):
        page = mutate(page, rng)
    return page


def run(n: int, seed: int) -> Tally:
    tally = Tally("watch")
    rng = random.Random(seed)
    quiet = logging.getLogger("kube_edge")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # every skipped line is logged; the tally says enough
    server = _Server(("127.0.0.1", 0), _Reply)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = KubeClient.for_host(f"http://127.0.0.1:{server.server_address[1]}", timeout=5)
    try:
        for i in range(n):
            tally.inputs += 1
            check = _Check()
            informer = Informer(client, "/apis/tessera.dev/v1alpha1/nodedevices", check, name="f")
            informer.resource_version = "1"
            listing = i % 8 == 7
            if listing:
                server.body = _list_page(rng)
            else:
                lines = []
                for _ in range(rng.randrange(1, 6)):
                    if rng.random() < 0.2:
                        lines.append(rng.choice(CRAFTED))
                    else:
                        line = rng.choice(SEEDS)
                        for _ in range(rng.randrange(1, 4)):
                            line = mutate(line, rng)
                        lines.append(line.replace(b"\n", b" "))
                server.body = b"\n".join([*lines, SENTINEL]) + b"\n"
            try:
                if listing:
                    informer.list_once()
                    relist = False
                else:
                    relist = informer.watch_once()
            except ApiError:
                continue  # a page that does not decode, a broken stream: retried by the loop
            except Exception as exc:
                tally.fail("crashes", f"input {i}: {type(exc).__name__}: {exc}")
                continue
            if check.bad:
                tally.fail("crashes", f"input {i}: {check.bad}")
            elif not listing and not relist and not check.sentinel:
                tally.fail("crashes", f"input {i}: a bad line stopped the watch")
    finally:
        quiet.setLevel(level)
        client.close()
        server.shutdown()
        server.server_close()
    return tally
