"""The HTTP(S) server: extender verbs, health, metrics and the debug API.

Stdlib `ThreadingHTTPServer` speaking HTTP/1.1 with keep-alive (kube-scheduler's Go client
reuses connections). TLS is set up per connection in the connection's own thread, so a
slow or failed handshake never blocks accepting others; with a client CA, clients must
present a certificate it signed.

Routes (the verbs are matched on the last path segment, so any urlPrefix works):
- POST .../filter, .../prioritize, .../bind, .../preempt: the extender (503 unless ready);
- GET /healthz: the process is alive; GET /readyz: synced and leader (503 otherwise);
- GET /metrics: Prometheus text format;
- GET /debug/nodes, /debug/nodes/<name>, /debug/pods, /debug/watch[?node=<name>]: JSON
  views of every node's devices (total, free, used, which pod holds what), of pods whose
  records do not count, and a stream of node summaries as they change (JSON lines).

Bodies over `max_body` bytes get 413 without being read; a body that is not JSON or not
ExtenderArgs-shaped gets 400 with `{"Error": ...}`; the server keeps serving.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from scheduler_plugin.extender import BadArgsError
from scheduler_plugin.metrics import CONTENT_TYPE

if TYPE_CHECKING:
    from scheduler_plugin.service import Service

log = logging.getLogger(__name__)

VERBS = ("filter", "prioritize", "bind", "preempt")
DEFAULT_MAX_BODY = 32 * 1024 * 1024
"""Large enough for 5,000 full Node objects (nodeCacheCapable: false)."""


def tls_context(cert_file: str, key_file: str, client_ca_file: str | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        ctx.load_verify_locations(cafile=client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        service: Service,
        *,
        tls: ssl.SSLContext | None = None,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        self.service = service
        self.tls = tls
        self.max_body = max_body
        self._streams: set[Any] = set()
        self._streams_lock = threading.Lock()
        super().__init__(address, Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address, exc_info=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, daemon=True, name="http")
        thread.start()
        return thread

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server
    timeout = 120

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.settimeout(10)
            self.connection.do_handshake()
            self.connection.settimeout(self.timeout)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    # --- replies ----------------------------------------------------------------------

    def _reply(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        # status line, headers and body leave in one write: split small writes can wait on
        # the peer's delayed ACK (tens of milliseconds per request)
        self.log_request(code)
        phrase = self.responses.get(code, ("",))[0]
        head = [
            f"{self.protocol_version} {code} {phrase}",
            f"Server: {self.version_string()}",
            f"Date: {self.date_time_string()}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
        ]
        if self.close_connection:
            head.append("Connection: close")
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)

    def _json(self, code: int, obj: Any) -> None:
        self._reply(code, json.dumps(obj, separators=(",", ":")).encode())

    # --- POST: the extender ---------------------------------------------------------------

    def do_POST(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        verb = path.rsplit("/", 1)[-1]
        if verb not in VERBS:
            self._discard_body()
            self._json(404, {"Error": f"no extender verb at {path}"})
            return
        service = self.server.service
        started = time.perf_counter()
        outcome = "error"
        try:
            body = self._read_body()
            if body is None:
                return
            if not service.answering():
                self._json(503, {"Error": "tessera: this replica is not ready or not the leader"})
                outcome = "not_ready"
                return
            try:
                args = json.loads(body)
            except (ValueError, UnicodeDecodeError) as exc:
                self._json(400, {"Error": f"tessera: the body is not JSON: {exc}"})
                outcome = "bad_request"
                return
            try:
                reply, outcome = service.call(verb, args)
            except BadArgsError as exc:
                self._json(400, {"Error": f"tessera: bad {verb} request: {exc}"})
                outcome = "bad_request"
                return
            if isinstance(reply, bytes):
                self._reply(200, reply)
            else:
                self._json(200, reply)
        except Exception as exc:
            log.exception("%s failed", verb)
            self.close_connection = True
            with contextlib.suppress(OSError):
                self._json(500, {"Error": f"tessera: internal error in {verb}: {exc}"})
        finally:
            if service.metrics is not None:
                service.metrics.observe(verb, time.perf_counter() - started, outcome)

    def _read_body(self) -> bytes | None:
        length_text = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked" or length_text is None:
            self.close_connection = True
            self._json(411, {"Error": "tessera: a Content-Length is required"})
            return None
        try:
            length = int(length_text)
        except ValueError:
            self.close_connection = True
            self._json(400, {"Error": "tessera: bad Content-Length"})
            return None
        if length < 0 or length > self.server.max_body:
            self.close_connection = True  # the body stays unread: drop the connection
            self._json(
                413, {"Error": f"tessera: body of {length} bytes over {self.server.max_body}"}
            )
            return None
        data = self.rfile.read(length)
        if len(data) != length:
            self.close_connection = True
            return None
        return data

    def _discard_body(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        if 0 < length <= self.server.max_body:
            self.rfile.read(length)
        elif length:
            self.close_connection = True

    # --- GET: health, metrics, debug ---------------------------------------------------------

    def do_GET(self) -> None:
        split = urlsplit(self.path)
        path = split.path.rstrip("/") or "/"
        service = self.server.service
        if path == "/healthz":
            self._reply(200, b"ok\n", "text/plain")
        elif path == "/readyz":
            ready, why = service.readiness()
            self._reply(200 if ready else 503, (why + "\n").encode(), "text/plain")
        elif path == "/metrics":
            if service.metrics is None:
                self._reply(404, b"metrics disabled\n", "text/plain")
            else:
                self._reply(200, service.metrics.render(), CONTENT_TYPE)
        elif path == "/debug/nodes":
            self._json(200, service.debug_nodes())
        elif path.startswith("/debug/nodes/"):
            summary = service.cache.node_summary(unquote(path[len("/debug/nodes/") :]))
            if summary is None:
                self._json(404, {"error": "no such node"})
            else:
                self._json(200, summary)
        elif path == "/debug/pods":
            self._json(200, service.debug_pods())
        elif path == "/debug/watch":
            query = {k: v[-1] for k, v in parse_qs(split.query).items()}
            self._stream(service, query.get("node"))
        else:
            self._json(404, {"error": f"nothing at {path}"})

    def _stream(self, service: Service, only: str | None) -> None:
        """Chunked JSON lines: a SYNC line with the node names, then one MODIFIED line with
        the node's summary whenever a node changes, PING lines when idle."""
        changes = service.watch_changes()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True

        def send(obj: Any) -> None:
            data = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        try:
            names = [only] if only else service.cache.node_names()
            send({"type": "SYNC", "nodes": names})
            while not service.stopping.is_set():
                dirty = changes.take(timeout=5.0)
                if not dirty:
                    send({"type": "PING"})
                    continue
                for node in sorted(dirty):
                    if only and node != only:
                        continue
                    summary = service.cache.node_summary(node)
                    if summary is None:
                        send({"type": "DELETED", "node": {"node": node}})
                    else:
                        send({"type": "MODIFIED", "node": summary})
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass
        finally:
            changes.close()


class ChangeFeed:
    """Node names changed since the last `take`, for one debug watcher."""

    def __init__(self, on_close: Callable[[ChangeFeed], None]) -> None:
        self._dirty: set[str] = set()
        self._cond = threading.Condition()
        self._on_close = on_close

    def add(self, node: str) -> None:
        with self._cond:
            self._dirty.add(node)
            self._cond.notify()

    def take(self, timeout: float) -> set[str]:
        with self._cond:
            if not self._dirty:
                self._cond.wait(timeout)
            dirty, self._dirty = self._dirty, set()
            return dirty

    def close(self) -> None:
        self._on_close(self)
