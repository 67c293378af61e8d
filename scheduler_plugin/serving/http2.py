"""HTTP/2 on the extender's TLS port, beside uvicorn's HTTP/1.1 (`--http2`; off by default).

Why: kube-scheduler's extender client offers h2 by ALPN and, given it, keeps one connection
and multiplexes every call on it. Over HTTP/1.1 it keeps two idle connections, so each bind
that overlaps another call opens a new one: a full TLS handshake with a verified client
certificate. Why off by default: this protocol runs in Python, and at 5,000 nodes on a
2-core control plane it cost more per call than those handshakes (docs/benchmarks.md).

The `h2` library does the protocol (framing, HPACK, stream states, flow control, settings);
this module connects it to the same ASGI application the HTTP/1.1 side serves. Bounds, on
top of scheduler_plugin.serving.limits:

- connections count against the port's MAX_CONNECTIONS together with HTTP/1.1 ones;
- the client's preface and first request must arrive within HEADER_TIMEOUT; a connection
  with no open stream is closed (GOAWAY) after KEEPALIVE_TIMEOUT;
- at most H2_MAX_STREAMS streams at once; a header block is at most MAX_HEADER_BYTES
  (HPACK-decoded size, enforced by h2 from the settings we announce);
- a request body is read under flow control: a stream's window is reopened only as the
  application reads, so a connection buffers at most H2_MAX_STREAMS x H2_STREAM_WINDOW
  bytes however fast the client sends; the connection's window is reopened on receipt,
  so one stream waiting for the body budget never blocks the others;
- a client that resets streams faster than it lets them finish (H2_MAX_RESETS within
  H2_RESET_WINDOW seconds) is disconnected.

A protocol error from the client ends its connection with GOAWAY; it never reaches the
application and never affects another connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from scheduler_plugin.serving import limits
from scheduler_plugin.serving.auth import client_cert_name
from scheduler_plugin.serving.deadline import Deadline
from tessera_edge.transports import no_delay

if TYPE_CHECKING:
    from uvicorn.config import Config
    from uvicorn.server import ServerState

log = logging.getLogger(__name__)

_H2_CONFIG = h2.config.H2Configuration(
    client_side=False,
    header_encoding=None,
    # headers we send are ours and already valid; headers we receive are still checked
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
)


@dataclass(eq=False)
class _Stream:
    """One request: its body as the client sends it, and its answer as it goes out."""

    sid: int
    body: deque[bytes] = field(default_factory=deque)
    ended: bool = False  # the client's END_STREAM arrived
    delivered: bool = False  # the application was given the body's end
    closed: bool = False  # answered, reset, or the connection went
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    head: list[tuple[bytes, bytes]] | None = None  # the answer's headers, until sent
    head_sent: bool = False
    last: bool = False  # the answer ends the connection (see H2Protocol._send)


class H2Protocol(asyncio.Protocol):
    """One HTTP/2 connection serving the uvicorn server's ASGI application."""

    def __init__(
        self, config: Config, server_state: ServerState, loop: asyncio.AbstractEventLoop
    ) -> None:
        if not config.loaded:
            config.load()
        self.app = config.loaded_app
        self.loop = loop
        self.server_state = server_state
        self.connections = server_state.connections
        self.conn = h2.connection.H2Connection(config=_H2_CONFIG)
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self.cert_name: str | None = None
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.resets: deque[float] = deque()
        self.unread = 0  # body bytes received and not yet read by the application
        self.owed = 0  # connection window withheld while `unread` is over its bound
        self.window_opened = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()
        self.timer = Deadline(loop, self._expire)
        self.closing = False

    # --- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        self.connections.add(self)  # type: ignore[arg-type]
        if len(self.connections) > limits.MAX_CONNECTIONS:
            self.transport.abort()
            return
        no_delay(transport)
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        self.cert_name = client_cert_name(transport)
        self.conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: limits.H2_MAX_STREAMS,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: limits.MAX_HEADER_BYTES,
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
            },
        )
        self.conn.initiate_connection()
        self._flush()
        self.timer.arm(limits.HEADER_TIMEOUT)  # the preface and the first request

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._fail(exc)
            return
        for event in events:
            self._on_event(event)
            if self.transport is None or self.transport.is_closing():
                return
        self._flush()
        if not self.writable.is_set() and self.transport is not None:
            # the client does not read what it asks for (PING or SETTINGS floods): stop
            # reading it until it does
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # close

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self.timer.disarm()
        self.transport = None
        for stream in self.streams.values():
            stream.closed = True
            stream.changed.set()
        self.streams.clear()
        self.window_opened.set()
        self.writable.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()
        if self.transport is not None:
            self.transport.resume_reading()

    def shutdown(self) -> None:
        """Stop gracefully (uvicorn's stop, or this server's own trouble): new streams are
        refused (REFUSED_STREAM: the client retries them elsewhere) and, once the open ones
        have answered, GOAWAY and close. GOAWAY waits for them because h2 sends nothing
        after it."""
        self.closing = True
        self._idle_check()

    # --- h2 events --------------------------------------------------------------------------

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._request(event)
        elif isinstance(event, h2.events.DataReceived):
            self._data(event)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.ended = True
                stream.changed.set()
        elif isinstance(event, h2.events.StreamReset):
            self._reset(event.stream_id)
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self.window_opened.set()
        elif isinstance(event, h2.events.ConnectionTerminated) and self.transport is not None:
            self.transport.close()

    def _request(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        if self.closing:
            self.conn.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        pseudo: dict[bytes, bytes] = {}
        headers: list[tuple[bytes, bytes]] = []
        for raw_name, raw_value in event.headers or ():
            name, value = bytes(raw_name), bytes(raw_value)
            if name.startswith(b":"):
                pseudo[name] = value
            else:
                headers.append((name, value))
        raw_path = pseudo.get(b":path", b"")
        path, _, query = raw_path.partition(b"?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "2",
            "server": self.server,
            "client": self.client,
            "scheme": "https",
            "method": pseudo.get(b":method", b"").decode("latin-1"),
            "root_path": "",
            "path": unquote(path.decode("latin-1")),
            "raw_path": path,
            "query_string": query,
            "headers": headers,
            "extensions": {"tls": {"client_cert_name": self.cert_name}},
        }
        stream = _Stream(sid)
        self.streams[sid] = stream
        self.timer.disarm()
        task = self.loop.create_task(self._serve(stream, scope))
        self.server_state.tasks.add(task)
        task.add_done_callback(self.server_state.tasks.discard)

    def _data(self, event: h2.events.DataReceived) -> None:
        length = event.flow_controlled_length or 0
        data = bytes(event.data or b"")
        stream = self.streams.get(event.stream_id)
        if stream is None or stream.closed:
            self._open_window(length)  # nobody will read it
            return
        # padding counts against both windows but is never read: return it at once
        self._open_window(length - len(data))
        self._open_window(length - len(data), stream)
        self.unread += len(data)
        if self.unread <= limits.H2_UNREAD_BYTES:
            self._open_window(len(data))
        else:
            self.owed += len(data)
        if data:
            stream.body.append(data)
            stream.changed.set()

    def _reset(self, sid: int) -> None:
        stream = self.streams.pop(sid, None)
        if stream is not None:
            self._drop(stream)
        now = time.monotonic()
        self.resets.append(now)
        while self.resets and now - self.resets[0] > limits.H2_RESET_WINDOW:
            self.resets.popleft()
        if len(self.resets) > limits.H2_MAX_RESETS:
            self._fail(None, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
            return
        self._idle_check()

    # --- serving one stream -----------------------------------------------------------------

    async def _serve(self, stream: _Stream, scope: dict[str, Any]) -> None:
        async def receive() -> dict[str, Any]:
            while True:
                if stream.closed:
                    return {"type": "http.disconnect"}
                if stream.body:
                    chunk = stream.body.popleft()
                    self._read(stream, len(chunk))
                    stream.delivered = stream.ended and not stream.body
                    return {
                        "type": "http.request",
                        "body": chunk,
                        "more_body": not stream.delivered,
                    }
                if stream.ended and not stream.delivered:
                    stream.delivered = True
                    return {"type": "http.request", "body": b"", "more_body": False}
                stream.changed.clear()
                await stream.changed.wait()

        async def send(message: dict[str, Any]) -> None:
            await self._send(stream, message)

        try:
            await self.app(scope, receive, send)
        except Exception:
            log.exception("an HTTP/2 request failed")
            if not stream.closed and not stream.head_sent:
                stream.head = [(b":status", b"500"), (b"content-length", b"0")]
                await self._send(stream, {"type": "http.response.body", "body": b""})
        finally:
            if not stream.closed:
                # the application ended without finishing its answer
                with contextlib.suppress(h2.exceptions.ProtocolError, KeyError):
                    self.conn.reset_stream(stream.sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
                self._finish(stream)

    async def _send(self, stream: _Stream, message: dict[str, Any]) -> None:
        if stream.closed or self.transport is None:
            return  # as over HTTP/1.1: answers to a client that went are dropped
        kind = message["type"]
        if kind == "http.response.start":
            status = int(message["status"])
            head = [(b":status", str(status).encode())]
            for raw_name, value in message.get("headers", ()):
                name = bytes(raw_name).lower()
                if name not in _CONNECTION_HEADERS:  # not allowed in HTTP/2
                    head.append((name, bytes(value)))
                elif name == b"connection" and bytes(value).lower() == b"close":
                    # HTTP/1.1's close on this server's own trouble (not the leader, an
                    # internal error) ends the connection after its open streams; a
                    # client's mistake ends only its stream
                    stream.last = status >= 500
            stream.head = head
            return
        if kind != "http.response.body" or stream.head is None:
            return
        body = bytes(message.get("body", b""))
        more = bool(message.get("more_body", False))
        try:
            if not stream.head_sent:
                self.conn.send_headers(stream.sid, stream.head, end_stream=not body and not more)
                stream.head_sent = True
            elif not body and not more:
                self.conn.end_stream(stream.sid)
            while body:
                size = await self._window(stream)
                if size <= 0:
                    return
                chunk, body = body[:size], body[size:]
                self.conn.send_data(stream.sid, chunk, end_stream=not body and not more)
        except h2.exceptions.ProtocolError:  # the stream, or the connection, ended meanwhile
            self._finish(stream)
            return
        if not more:
            self._finish(stream)
            return
        self._flush()
        await self.writable.wait()

    async def _window(self, stream: _Stream) -> int:
        """Bytes the stream may send now, waiting for the client to open its window."""
        while not stream.closed and self.transport is not None:
            try:
                size = min(
                    self.conn.local_flow_control_window(stream.sid),
                    self.conn.max_outbound_frame_size,
                )
            except (h2.exceptions.StreamClosedError, KeyError):
                return 0
            if size > 0:
                return size
            self.window_opened.clear()
            self._flush()
            await self.window_opened.wait()
        return 0

    def _read(self, stream: _Stream, size: int) -> None:
        """The application read `size` bytes of the stream's body: let the client send more
        (on the stream only while more is coming)."""
        if not size:
            return
        self.unread -= size
        if self.owed and self.unread <= limits.H2_UNREAD_BYTES:
            owed, self.owed = self.owed, 0
            self._open_window(owed)
        self._open_window(size, stream)
        self._flush()

    def _open_window(self, size: int, stream: _Stream | None = None) -> None:
        """Let the client send `size` more bytes on the connection, or on `stream` while
        its body is still coming."""
        if size <= 0:
            return
        if stream is None:
            self.conn.increment_flow_control_window(size)
        elif not stream.ended and not stream.closed:
            with contextlib.suppress(h2.exceptions.ProtocolError, KeyError):
                self.conn.increment_flow_control_window(size, stream_id=stream.sid)

    def _drop(self, stream: _Stream) -> None:
        """The stream ended without its answer: return what it held unread."""
        self.streams.pop(stream.sid, None)
        stream.closed = True
        stream.changed.set()
        held = sum(len(chunk) for chunk in stream.body)
        stream.body.clear()
        if held:
            self._read(stream, held)

    def _finish(self, stream: _Stream) -> None:
        if stream.body:
            self._drop(stream)
        stream.closed = True
        stream.changed.set()
        self.streams.pop(stream.sid, None)
        if stream.last and not self.closing:
            self.shutdown()
        self._flush()
        self._idle_check()

    # --- connection upkeep ------------------------------------------------------------------

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _fail(self, exc: Exception | None, code: h2.errors.ErrorCodes | None = None) -> None:
        """End the connection for the client's protocol error."""
        if exc is not None:
            log.debug("closing an HTTP/2 connection: %s", exc)
        if self.transport is None:
            return
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.conn.close_connection(error_code=code or h2.errors.ErrorCodes.PROTOCOL_ERROR)
        self._flush()
        self.transport.close()

    def _idle_check(self) -> None:
        if self.streams or self.transport is None:
            return
        if self.closing:
            self._expire()
        else:
            self.timer.arm(limits.KEEPALIVE_TIMEOUT)

    def _expire(self) -> None:
        if self.streams or self.transport is None:
            return
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.conn.close_connection()
        self._flush()
        self.transport.close()


_CONNECTION_HEADERS = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"proxy-connection"}
)


def _address(info: Any) -> tuple[str, int] | None:
    if isinstance(info, tuple) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None
