"""uvicorn's httptools protocol with the bounds uvicorn leaves to its users.

uvicorn bounds idle keep-alive time and (with flow control) how much of a body it buffers
ahead of the application. This subclass adds, per connection:

- a cap on open connections per server (`MAX_CONNECTIONS`): past it, new ones are closed;
- a deadline from a request's first byte (or the connection's start) to the end of its
  headers (`HEADER_TIMEOUT`), so slowloris clients are dropped;
- a cap on request line plus header bytes (`MAX_HEADER_BYTES`): the parser error makes
  uvicorn answer 400 and close;
- TCP_NODELAY, and each reply's status line and headers sent in the same write as its
  body: a split reply can wait on the client's delayed ACK;
- the verified client certificate's subject in the ASGI scope (`extensions.tls`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from scheduler_plugin import limits
from tessera.errors import InputError
from tessera_edge.transports import no_delay

if TYPE_CHECKING:
    from uvicorn.config import Config
    from uvicorn.server import ServerState

ALPN_PROTOCOLS = ["h2", "http/1.1"]
"""What the extender's TLS port offers, preferred first."""


class HeadTooLargeError(InputError):
    """Raised from a parser callback: httptools turns it into a parser error (400)."""


class OneWrite:
    """A transport that holds a response head until the first body write, then sends both
    at once. Everything else goes straight to the real transport."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._head = b""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        data = bytes(data)
        if not self._head and data.startswith(b"HTTP/1.1 ") and not data.startswith(b"HTTP/1.1 1"):
            self._head = data
            return
        if self._head:
            data, self._head = self._head + data, b""
        self._transport.write(data)

    def close(self) -> None:
        if self._head:
            self._transport.write(self._head)
            self._head = b""
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def client_cert_name(transport: asyncio.BaseTransport) -> str | None:
    """The subject of the client certificate the TLS handshake verified, if any."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    if not cert:
        return None
    parts = [f"{k}={v}" for rdn in cert.get("subject", ()) for k, v in rdn]
    return ",".join(parts) or "(no subject)"


class BoundedProtocol(HttpToolsProtocol):
    max_connections: int = limits.MAX_CONNECTIONS
    header_timeout: float = limits.HEADER_TIMEOUT
    max_header_bytes: int = limits.MAX_HEADER_BYTES

    _deadline: asyncio.TimerHandle | None = None
    _head_bytes: int = 0
    _cert_name: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.abort()
            return
        no_delay(transport)
        self._cert_name = client_cert_name(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        if self._deadline is None:
            self._arm()
        tls = {"client_cert_name": self._cert_name}
        self.scope["extensions"] = {"tls": tls}  # type: ignore[dict-item]

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.max_header_bytes:
            raise HeadTooLargeError

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and not isinstance(cycle.transport, OneWrite):
            cycle.transport = OneWrite(cycle.transport)  # type: ignore[assignment]


class AlpnProtocol:
    """The protocol of one accepted connection, chosen once TLS is up: HTTP/2 when the
    client and this server agreed on `h2` by ALPN, HTTP/1.1 (BoundedProtocol) otherwise
    (plain HTTP, or a client without h2). uvicorn constructs it like its own protocols."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._args = (config, server_state, app_state, _loop)
        self._impl: Any = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        config, server_state, app_state, loop = self._args
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2":
            # imported on the first HTTP/2 connection: h2 costs about 1.3 MB resident,
            # and only `--http2` ever offers it
            from scheduler_plugin.http2 import H2Protocol

            self._impl = H2Protocol(config, server_state, loop or asyncio.get_event_loop())
            protocol = "h2"
        else:
            self._impl = BoundedProtocol(config, server_state, app_state, _loop=loop)
            protocol = "http/1.1"
        counted = getattr(config.app, "connection_opened", None)
        if counted is not None:
            counted(protocol)
        self._impl.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._impl.data_received(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self._impl.eof_received()
        return result

    def connection_lost(self, exc: Exception | None) -> None:
        if self._impl is not None:
            self._impl.connection_lost(exc)

    def pause_writing(self) -> None:
        self._impl.pause_writing()

    def resume_writing(self) -> None:
        self._impl.resume_writing()
