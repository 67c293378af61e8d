"""Short JSON requests to the API server from an asyncio event loop.

`KubeClient` blocks: called from an event loop it needs a worker thread, and that thread
waits for the GIL the loop holds (up to the 5 ms switch interval, once to start and once to
hand back). `LoopClient` sends the same requests on the loop itself, for the few calls an
asyncio server makes per request (the scheduler extender's bind). It speaks HTTP/1.1 over
asyncio transports and parses answers with httptools (llhttp, in C; uvicorn already loads
it): aiohttp cost 25 MiB of resident memory on import, httpx is pure Python.

It shares everything but the sockets with the `KubeClient` it is made from: the server,
TLS settings, credentials (and their refresh hook), the deadline, the JSON bounds and the
errors, which read the same. Bounds: `pool_size` connections at most, idle ones reused
(last used first) and dropped when the server closed them; answer headers within 64 KiB,
bodies within `max_bytes` (refused from Content-Length when it says more); the client's
`timeout` covers the whole request, waiting for a connection included. Nothing is retried:
a write may have happened, the caller judges.
"""

from __future__ import annotations

import asyncio
import select
import ssl
from collections import deque
from collections.abc import Mapping
from typing import Any, Final, cast
from urllib.parse import urlsplit

import httptools

from kube_edge import lean
from kube_edge.client import (
    JSON,
    KubeClient,
    answer_error,
    as_object,
    decode_answer,
    json_body,
    no_answer,
    too_large,
)
from tessera_edge.transports import no_delay

MAX_HEADER_BYTES: Final = 64 * 1024
"""Bytes an answer may send before its headers end."""
_METHODS: Final = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
"""Methods whose answers carry a body when they say so (a HEAD answer would not)."""
_BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})
_IDENTITY: Final = "Accept-Encoding: identity"
_STALE: Final = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP


class _Answer:
    """One answer, fed as it arrives to an httptools parser that calls back these methods."""

    def __init__(self, loop: asyncio.AbstractEventLoop, method: str, path: str, max_bytes: int):
        self.parser = httptools.HttpResponseParser(self)
        self.done: asyncio.Future[Exception | None] = loop.create_future()
        self.method, self.path, self.max_bytes = method, path, max_bytes
        self.reason = b""
        self.chunks: list[bytes] = []
        self.size = 0
        self.head_bytes = 0  # bytes fed while the headers were not complete
        self.head_size = 0  # bytes of the status line and headers
        self.framed = False  # Content-Length or Transfer-Encoding: not ended by the close
        self.length = -1
        self.headers_done = self.complete = self.keep_alive = self.over = False
        self.extra = False  # bytes beyond this answer: the connection is not reused

    # --- parser callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            self.extra = True

    def on_status(self, reason: bytes) -> None:
        self.reason += reason
        self.head_size += len(reason)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value) + 4
        name = name.lower()
        if name == b"content-length":
            self.framed = True
            digits = value.strip()  # llhttp refuses a malformed one
            if digits.isdigit():
                self.length = int(digits) if len(digits) <= 18 else 1 << 62
        elif name == b"transfer-encoding":
            self.framed = True

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.over = self.length > self.max_bytes

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.max_bytes:
            self.over = True
        elif not self.over:
            self.chunks.append(body)

    def on_message_complete(self) -> None:
        if not self.complete:
            self.complete = True
            self.keep_alive = self.parser.should_keep_alive()

    # --- transport events -----------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        if self.done.done():
            self.extra = True
            return
        if not self.headers_done:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # HttpParserError, HttpParserUpgrade (a 101 or CONNECT)
            self.extra = True
            if not self.complete and not self.over:
                self._end(no_answer(self.method, self.path, f"malformed answer: {exc}"))
                return
        head = self.head_size if self.headers_done else max(self.head_size, self.head_bytes)
        if head > MAX_HEADER_BYTES:
            why = f"answer headers over {MAX_HEADER_BYTES} bytes"
            self._end(no_answer(self.method, self.path, why))
        elif self.over:
            status = self.parser.get_status_code()
            self._end(too_large(status, self.method, self.path, self.max_bytes))
        elif self.complete:
            self._end(None)

    def closed(self, exc: Exception | None) -> None:
        if self.done.done():
            return
        if self.headers_done and not self.framed:  # a body that ends with the connection
            self.complete, self.keep_alive = True, False
            self._end(None)
            return
        why = "the server closed the connection before the answer was complete"
        self._end(no_answer(self.method, self.path, f"{why}: {exc}" if exc else why))

    def _end(self, error: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(error)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: one request at a time, its answer parsed as it arrives."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.broken = False  # closed, at EOF, or sent what nobody asked for: never reused
        self._answer: _Answer | None = None
        self._poll: select.poll | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        no_delay(transport)
        sock = transport.get_extra_info("socket")
        if sock is None:
            return
        fd = sock.fileno()
        if fd >= 0:
            self._poll = select.poll()
            self._poll.register(fd, _STALE)

    def data_received(self, data: bytes) -> None:
        if self._answer is None:  # an idle connection has nothing to say
            self.abort()
            return
        self._answer.feed(data)
        if self._answer.extra:
            self.broken = True

    def eof_received(self) -> bool:
        self.broken = True
        if self._answer is not None:
            self._answer.closed(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.broken = True
        if self._answer is not None:
            self._answer.closed(exc)

    def reusable(self) -> bool:
        """Whether an idle connection can carry a request: still open, and nothing (a FIN,
        an alert, stray bytes) waiting on its socket that the loop has not yet handled."""
        if self.broken or self.transport is None or self.transport.is_closing():
            return False
        return not (self._poll is not None and self._poll.poll(0))

    async def exchange(self, request: bytes, answer: _Answer) -> Exception | None:
        """Send `request`; None once `answer` is complete, or the ApiError it ended with."""
        assert self.transport is not None
        if self.broken or self.transport.is_closing():  # closed while it was being opened
            return no_answer(answer.method, answer.path, "the server closed the connection")
        self._answer = answer
        try:
            self.transport.write(request)
            return await answer.done
        finally:
            self._answer = None

    def abort(self) -> None:
        self.broken = True
        if self.transport is not None:
            self.transport.abort()


class LoopClient:
    """HTTP/1.1 JSON requests to one API server from the event loop that calls them."""

    def __init__(
        self,
        client: KubeClient,
        *,
        scheme: str,
        hostname: str,
        port: int,
        prefix: str,
        tls: ssl.SSLContext | None,
        tls_error: str = "",
        pool_size: int = 16,
    ) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, not {pool_size}")
        self.client = client
        self._scheme = scheme
        self._hostname, self._port, self._prefix = hostname, port, prefix
        self._tls, self._tls_error = tls, tls_error
        self._server_name = str(client.configuration.tls_server_name or hostname)
        name = f"[{hostname}]" if ":" in hostname else hostname
        default = 443 if scheme == "https" else 80
        self._host_header = name if port == default else f"{name}:{port}"
        self._slots = asyncio.Semaphore(pool_size)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: deque[_Connection] = deque(maxlen=pool_size)

    @classmethod
    def of(cls, client: KubeClient, *, pool_size: int = 16) -> LoopClient | None:
        """A LoopClient speaking to the same server with the same TLS settings and
        credentials as `client`; None where it cannot (a proxy is configured and not
        bypassed for the host, or the host's scheme is neither http nor https)."""
        conf = client.configuration
        if conf.proxy:
            bypass = lean.load().should_bypass_proxies
            if bypass is None or not bypass(conf.host, conf.no_proxy or ""):
                return None
        try:
            url = urlsplit(client.host)
            scheme, hostname = url.scheme.lower(), url.hostname
            port = url.port or (443 if scheme == "https" else 80)
        except ValueError:  # a port that is not a number
            return None
        if scheme not in {"http", "https"} or not hostname:
            return None
        tls, tls_error = None, ""
        if scheme == "https":
            try:
                tls = tls_context(conf)
            except (OSError, ValueError) as exc:  # each request reports it, as KubeClient's do
                tls_error = f"TLS settings: {exc}"
        return cls(
            client,
            scheme=scheme,
            hostname=hostname,
            port=port,
            prefix=url.path.rstrip("/"),
            tls=tls,
            tls_error=tls_error,
            pool_size=pool_size,
        )

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = JSON,
        *,
        max_bytes: int = 1024 * 1024,
    ) -> Any:
        """As KubeClient.request: the decoded JSON answer (None when empty); ApiError
        otherwise."""
        if method not in _METHODS:
            raise ValueError(f"unsupported method {method!r}")
        data = None if body is None else json_body(body)
        timeout = self.client.timeout
        try:
            async with asyncio.timeout(timeout):
                status, reason, raw = await self._exchange(
                    method, path, data, content_type, max_bytes
                )
        except TimeoutError:
            raise no_answer(method, path, f"no answer within {timeout} s") from None
        if not 200 <= status < 300:
            self.client.answered(status)
            raise answer_error(status, reason, raw, method, path)
        if not raw:
            return None
        return decode_answer(raw, method, path, max_bytes, self.client.max_depth)

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return as_object(await self.request("POST", path, body))

    async def get(self, path: str) -> dict[str, Any]:
        return as_object(await self.request("GET", path))

    async def close(self) -> None:
        """Close the idle connections (those in use close or come back when done)."""
        while self._idle:
            # no TLS close_notify exchange: an idle connection has nothing left to say, and
            # a graceful close would outlive a loop that is shutting down
            self._idle.pop().abort()
        await asyncio.sleep(0)  # the sockets close on the next turn of the loop

    # --- plumbing ---------------------------------------------------------------------------

    def _head(self, method: str, path: str, data: bytes | None, content_type: str) -> bytes:
        """The request line and headers, checked: no byte may end a line or the target."""
        target = self._prefix + path
        if not target.startswith("/") or not target.isascii() or not target.isprintable():
            raise no_answer(method, path, "the path is not a printable ASCII path")
        if " " in target:
            raise no_answer(method, path, "the path holds a space")
        # identity: as http.client asks, so no answer comes compressed
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self._host_header}", _IDENTITY]
        headers = self.client.headers(content_type if data is not None else None)
        for name, value in headers.items():
            if any(c in f"{name}{value}" for c in "\r\n\0") or not name or ":" in name:
                raise no_answer(method, path, f"header {name!r} cannot be sent")
            lines.append(f"{name}: {value}")
        if data is not None or method in _BODY_METHODS:
            lines.append(f"Content-Length: {len(data or b'')}")
        try:
            return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n"
        except UnicodeEncodeError as exc:
            raise no_answer(method, path, f"a header cannot be sent: {exc}") from None

    async def _exchange(
        self, method: str, path: str, data: bytes | None, content_type: str, max_bytes: int
    ) -> tuple[int, str, bytes]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:  # its connections and semaphore belong to that loop
                raise RuntimeError("a LoopClient serves the one event loop it was first used on")
            self._loop = loop
        request = self._head(method, path, data, content_type) + (data or b"")
        async with self._slots:
            conn = self._reuse() or await self._connect(method, path)
            answer = _Answer(loop, method, path, max_bytes)
            keep = False
            try:
                error = await conn.exchange(request, answer)
                if error is not None:
                    raise error
                keep = answer.keep_alive and not conn.broken  # broken: it also sent more
                status = answer.parser.get_status_code()
                return status, answer.reason.decode("latin-1"), answer.body
            finally:
                # cancelled, failed or told to close: a half-read connection never goes back
                if keep:
                    self._idle.append(conn)
                else:
                    conn.abort()

    def _reuse(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable():
                return conn
            conn.abort()
        return None

    async def _connect(self, method: str, path: str) -> _Connection:
        if self._tls_error:
            raise no_answer(method, path, self._tls_error)
        loop = asyncio.get_running_loop()
        try:
            if self._tls is None:
                _, conn = await loop.create_connection(_Connection, self._hostname, self._port)
            else:
                _, conn = await loop.create_connection(
                    _Connection,
                    self._hostname,
                    self._port,
                    ssl=self._tls,
                    server_hostname=self._server_name,
                )
        except Exception as exc:  # refused, unreachable, DNS, TLS, a reset handshake
            raise no_answer(method, path, exc) from None
        return conn


def tls_context(conf: Any) -> ssl.SSLContext:
    """The client TLS settings urllib3 builds for kubernetes.client.rest from a
    `Configuration`: the peer verified (unless verify_ssl is off) against ssl_ca_cert /
    ca_cert_data or the system's CAs, its name checked (unless assert_hostname is False)
    against tls_server_name or the host, a client certificate when one is set, TLS 1.2 or
    newer, HTTP/1.1 by ALPN. Raises OSError / ValueError for files that cannot be read."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if conf.verify_ssl:
        context.check_hostname = conf.assert_hostname is not False
        context.verify_mode = ssl.CERT_REQUIRED
        if conf.ssl_ca_cert or conf.ca_cert_data:
            context.load_verify_locations(cafile=conf.ssl_ca_cert, cadata=conf.ca_cert_data)
        else:
            context.load_default_certs()
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if conf.cert_file:
        context.load_cert_chain(conf.cert_file, conf.key_file or None)
    context.set_alpn_protocols(["http/1.1"])
    return context
