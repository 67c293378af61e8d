"""The least a Python extender spends per pod on this machine: `make bench-scale`'s floor.

tessera-scheduler's CPU per pod is the decision plus what any extender in its place must
do whatever it decides: accept kube-scheduler's TLS connections, read its filter and bind
calls and answer them, write the Binding, and follow the bound pods. This program does
only that, as cheaply as Python does it: a bare asyncio protocol on httptools (no ASGI
server, no routing, no bounds, no metrics but a connection count and call times), the stdlib JSON
decoder, the first candidate as the filter's answer, tessera's Binding without a record
written with tessera's event-loop client, and a bound-pod watch whose events are decoded
and dropped. It is not an extender anyone should run (it places pods anywhere and checks
nothing but a bind's arguments); `python -m bench.scale --floor` runs it in
tessera-scheduler's place, on the same port, certificates and kube-scheduler
configuration, so a round's CPU per pod is the floor under tessera-scheduler's.

It takes tessera-scheduler's command line and reads only --kubeconfig, --listen,
--health-listen and the three --tls-* files (the rest is ignored). The health port answers
/readyz (200 once the pod watch has listed) and /metrics (the connections accepted, as
tessera_scheduler_connections_total, and each call's time from its first byte to its
answer's write, as tessera_scheduler_request_duration_seconds with tessera-scheduler's
buckets: what the floor's bind takes beside the API server's own Binding time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import httptools
import uvloop
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from kube_edge.client import KubeClient
from kube_edge.informer import Handler, Informer
from kube_edge.loop_client import LoopClient
from scheduler_plugin.decisions.binder import BindArgs, binding_body, binding_path
from scheduler_plugin.serving.server import tls_context
from scheduler_plugin.views.metrics import LATENCY_BUCKETS
from scheduler_plugin.watches.informers import BOUND_PODS
from tessera_edge.threads import name_os_threads


class _Dropped(Handler):
    """A watch handler that keeps nothing (the events are decoded by the informer)."""

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        for _ in items:
            pass

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        pass


class _Floor:
    def __init__(self, api: LoopClient | None) -> None:
        self.api = api
        self.connections = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "tessera_scheduler_request_duration_seconds",
            "Time from a call's first byte to its answer's write, by verb",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def filter(self, args: Any) -> dict[str, Any]:
        names = args.get("NodeNames") or []
        return {
            "NodeNames": names[:1],
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {},
            "Error": "" if names else "no candidate nodes",
        }

    async def bind(self, raw: Any) -> dict[str, Any]:
        if self.api is None:
            return {"Error": "no API server"}
        try:
            args = BindArgs.parse(raw)
            await self.api.create(binding_path(args), binding_body(args))
        except Exception as exc:  # any failure goes back to kube-scheduler as the bind's error
            return {"Error": str(exc)}
        return {"Error": ""}


class _Connection(asyncio.Protocol):
    """HTTP/1.1 without pipelining (kube-scheduler's client never pipelines)."""

    def __init__(self, floor: _Floor) -> None:
        self.floor = floor
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []
        self.started = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's own transport class
        self.floor.connections += 1

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_message_begin(self) -> None:
        self.started = time.perf_counter()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        url, body = self.url, b"".join(self.body)
        self.url, self.body = b"", []
        args = json.loads(body)
        if url == b"/bind":
            task = asyncio.ensure_future(self._bind(args, self.started))
            self.floor.tasks.add(task)
            task.add_done_callback(self.floor.tasks.discard)
        else:
            self._answer(self.floor.filter(args), "filter", self.started)

    async def _bind(self, args: Any, started: float) -> None:
        self._answer(await self.floor.bind(args), "bind", started)

    def _answer(self, reply: dict[str, Any], verb: str, started: float) -> None:
        data = json.dumps(reply, separators=(",", ":")).encode()
        head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(data)).encode()
            + b"\r\n\r\n"
        )
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(head + data)
        self.floor.latency.labels(verb).observe(time.perf_counter() - started)


def serve_plain(host: str = "127.0.0.1") -> tuple[int, Callable[[], None]]:
    """Filter calls over plain HTTP on a uvloop event loop in a thread named
    http-extender, with no API server (binds answer an error): (port, stop)."""
    started: queue.SimpleQueue[tuple[int, Callable[[], None]]] = queue.SimpleQueue()

    def run() -> None:
        loop = uvloop.new_event_loop()
        floor = _Floor(None)
        listener = socket.create_server((host, 0))
        server = loop.run_until_complete(
            loop.create_server(lambda: _Connection(floor), sock=listener)
        )

        def stop() -> None:
            loop.call_soon_threadsafe(loop.stop)

        started.put((listener.getsockname()[1], stop))
        loop.run_forever()
        server.close()
        loop.close()

    threading.Thread(target=run, name="http-extender", daemon=True).start()
    return started.get()


def _health(address: tuple[str, int], floor: _Floor, synced: threading.Event) -> None:
    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/readyz":
                body = b"ok" if synced.is_set() else b"listing"
                status = 200 if synced.is_set() else 503
            else:
                status = 200
                body = (
                    "# TYPE tessera_scheduler_connections counter\n"
                    f"tessera_scheduler_connections_total {floor.connections}\n"
                ).encode() + generate_latest(floor.registry)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(address, Health)
    threading.Thread(target=server.serve_forever, name="http-health", daemon=True).start()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--health-listen", required=True)
    parser.add_argument("--tls-cert-file", required=True)
    parser.add_argument("--tls-key-file", required=True)
    parser.add_argument("--tls-client-ca-file", required=True)
    options, _ignored = parser.parse_known_args(argv)
    name_os_threads()
    client = KubeClient.connect(options.kubeconfig)
    api = LoopClient.of(client)
    assert api is not None, "the API server is reached through a proxy"
    floor = _Floor(api)
    watch = Informer(client, "/api/v1/pods", _Dropped(), name="pods", field_selector=BOUND_PODS)
    watch.start()
    _health(_address(options.health_listen), floor, watch.synced)
    tls = tls_context(options.tls_cert_file, options.tls_key_file, options.tls_client_ca_file)
    # tessera-scheduler verifies an offered certificate and refuses extender calls without
    # one; refusing at the handshake costs a certified caller the same
    tls.verify_mode = ssl.CERT_REQUIRED

    async def serve() -> None:
        host, port = _address(options.listen)
        server = await asyncio.get_running_loop().create_server(
            lambda: _Connection(floor), host, port, ssl=tls
        )
        await server.serve_forever()

    def run() -> None:
        uvloop.install()
        asyncio.run(serve())

    thread = threading.Thread(target=run, name="http-extender")
    thread.start()
    thread.join()


if __name__ == "__main__":
    main()
