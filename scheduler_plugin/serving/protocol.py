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

It also answers the extender verbs itself, without uvicorn's ASGI cycle (a task, a
scope, receive and send messages per request), when the request is plain: POST over
HTTP/1.1 with a Content-Length the body budget has room for, no Expect, no request of the
connection still unanswered. The body is gathered from the parser's callbacks under a
deadline. Filter and prioritize are decided at once by the application's `answer_inline`
and written. A bind's answer is awaited (`answer_awaited`) in one task: while it runs, an
`_Awaited` stands in for uvicorn's cycle, so a request pipelined behind it queues in
uvicorn's pipeline and a graceful shutdown lets it finish. Anything else takes the ASGI
path, which answers every error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from scheduler_plugin.serving import limits
from scheduler_plugin.serving.auth import client_cert_name
from scheduler_plugin.serving.deadline import Deadline
from tessera.errors import InputError
from tessera_edge.transports import no_delay

if TYPE_CHECKING:
    from uvicorn.config import Config
    from uvicorn.server import ServerState

log = logging.getLogger(__name__)

ALPN_PROTOCOLS = ["h2", "http/1.1"]
"""What the extender's TLS port offers, preferred first."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole reply to an extender verb: status, JSON body, and whether the connection
    closes after it."""

    status: int
    body: bytes
    close: bool = False


INTERNAL_ERROR = Answer(500, b'{"Error":"tessera: internal error"}', close=True)


class DirectAnswers(Protocol):
    """What the HTTP/1.1 protocol needs of the application to answer a verb itself
    (scheduler_plugin.serving.app.App)."""

    max_body: int

    def direct_verb(self, path: bytes, client_cert: bool) -> str | None: ...

    def take_body_room(self, n: int) -> bool: ...

    def give_body_room(self, n: int) -> None: ...

    def answer_inline(self, verb: str, body: bytes, started: float) -> Answer: ...

    def awaited(self, verb: str) -> bool: ...

    async def answer_awaited(self, verb: str, body: bytes, started: float) -> Answer: ...

    def answered(self, verb: str) -> None: ...

    def body_too_slow(self, verb: str, started: float) -> Answer: ...


@dataclass(slots=True)
class _Direct:
    """A request being answered without the ASGI cycle, while its body arrives."""

    verb: str
    length: int
    """Its Content-Length: the bytes taken from the body budget."""
    started: float
    parts: list[bytes] = field(default_factory=list)


_AWAITING: set[asyncio.Task[None]] = set()
"""Awaited answers under way, held (the event loop keeps only weak references)."""


class _NoEvent:
    """uvicorn sets its cycle's message event when the connection is lost; an awaited
    answer reads `disconnected` instead, so there is nothing to wake."""

    def set(self) -> None:
        pass


class _Awaited:
    """What stands in for uvicorn's RequestResponseCycle while a direct answer is
    awaited: the attributes uvicorn's protocol reads and writes on its current cycle."""

    __slots__ = ("disconnected", "keep_alive", "response_complete")
    message_event = _NoEvent()

    def __init__(self, keep_alive: bool) -> None:
        self.response_complete = False
        self.keep_alive = keep_alive
        """Cleared by uvicorn's shutdown: the connection closes after the answer."""
        self.disconnected = False


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


class BoundedProtocol(HttpToolsProtocol):
    max_connections: int = limits.MAX_CONNECTIONS
    header_timeout: float = limits.HEADER_TIMEOUT
    max_header_bytes: int = limits.MAX_HEADER_BYTES

    _head_bytes: int = 0
    _cert_name: str | None = None
    _answers: DirectAnswers | None = None
    _direct: _Direct | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = Deadline(self.loop, self._too_slow)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.abort()
            return
        no_delay(transport)
        self._cert_name = client_cert_name(transport)
        app: Any = self.config.app
        self._answers = app if callable(getattr(app, "direct_verb", None)) else None
        self._deadline.arm(self.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline.disarm()
        direct, self._direct = self._direct, None
        if direct is not None and self._answers is not None:
            self._answers.give_body_room(direct.length)
        super().connection_lost(exc)

    def _too_slow(self) -> None:
        direct, self._direct = self._direct, None
        if direct is not None and self._answers is not None:
            # a body that stalls is answered as the ASGI path answers it, then closed
            self._answers.give_body_room(direct.length)
            self._write(self._answers.body_too_slow(direct.verb, direct.started), False)
        self.transport.close()

    def _write(self, answer: Answer, keep_alive: bool) -> None:
        self.transport.write(
            b"%scontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
            % (
                STATUS_LINE[answer.status],
                len(answer.body),
                b"" if keep_alive else b"connection: close\r\n",
                answer.body,
            )
        )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        if not self._deadline.armed:
            self._deadline.arm(self.header_timeout)
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
        direct = self._direct_request()
        if direct is not None:
            self._direct = direct
            self._deadline.arm(limits.BODY_TIMEOUT)  # the body's deadline replaces the head's
            return
        self._deadline.disarm()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and not isinstance(cycle.transport, OneWrite):
            cycle.transport = OneWrite(cycle.transport)  # type: ignore[assignment]

    def _direct_request(self) -> _Direct | None:
        """The request as one this protocol answers itself, or None for the ASGI path."""
        answers = self._answers
        parser = self.parser
        if (
            answers is None
            or self.transport.is_closing()
            or self.expect_100_continue
            or (self.cycle is not None and not self.cycle.response_complete)
            or parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or parser.should_upgrade()
        ):
            return None
        verb = answers.direct_verb(httptools.parse_url(self.url).path, bool(self._cert_name))
        if verb is None:
            return None
        length = None
        for name, value in self.headers:
            if name == b"content-length" and length is None:
                length = value
            elif name in (b"content-length", b"transfer-encoding"):
                return None
        if length is None or not length.isdigit() or len(length) > 12:
            return None
        n = int(length)
        if n > answers.max_body or not answers.take_body_room(n):
            return None
        return _Direct(verb, n, time.perf_counter())

    def on_body(self, body: bytes) -> None:
        direct = self._direct
        if direct is None:
            super().on_body(body)
        else:  # the parser stops at Content-Length, so the parts hold at most that
            direct.parts.append(body)

    def on_message_complete(self) -> None:
        direct = self._direct
        if direct is None:
            super().on_message_complete()
            return
        self._direct = None
        self._deadline.disarm()
        answers = self._answers
        assert answers is not None
        body = b"".join(direct.parts)
        answers.give_body_room(direct.length)
        if answers.awaited(direct.verb):
            awaited = _Awaited(self.parser.should_keep_alive())
            self.cycle = awaited  # type: ignore[assignment]
            # held here until done and never cancelled (not in uvicorn's tasks, which a
            # shutdown past its grace cancels): a bind cut off midway could leave its
            # devices held, or free them while its Binding may yet land
            task = self.loop.create_task(self._answer_awaited(answers, awaited, direct, body))
            _AWAITING.add(task)
            task.add_done_callback(_AWAITING.discard)
            return
        try:
            answer = answers.answer_inline(direct.verb, body, direct.started)
        except Exception:  # answer_inline answers every error it expects
            log.exception("%s failed", direct.verb)
            answer = INTERNAL_ERROR
        self._answer(answer, not answer.close and self.parser.should_keep_alive())
        if answer.status == 200:
            answers.answered(direct.verb)

    async def _answer_awaited(
        self, answers: DirectAnswers, awaited: _Awaited, direct: _Direct, body: bytes
    ) -> None:
        try:
            answer = await answers.answer_awaited(direct.verb, body, direct.started)
        except Exception:  # answer_awaited answers every error it expects
            log.exception("%s failed", direct.verb)
            answer = INTERNAL_ERROR
        except BaseException:
            # the task cancelled as its loop ends, or dying: the client is not left
            # waiting (uvicorn answers the ASGI path's the same way)
            self._finish_awaited(awaited, INTERNAL_ERROR)
            raise
        self._finish_awaited(awaited, answer)

    def _finish_awaited(self, awaited: _Awaited, answer: Answer) -> None:
        awaited.response_complete = True
        if awaited.disconnected or self.transport.is_closing():
            return  # nobody to answer; the verb's work is done all the same
        self._answer(answer, not answer.close and awaited.keep_alive)

    def _answer(self, answer: Answer, keep_alive: bool) -> None:
        """Write a direct answer, then close, or go on as uvicorn does once a response is
        complete: count it, read again, start a request pipelined behind it or arm the
        keep-alive deadline."""
        self._write(answer, keep_alive)
        if keep_alive:
            self.on_response_complete()
        else:
            self.server_state.total_requests += 1
            self.transport.close()


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
            from scheduler_plugin.serving.http2 import H2Protocol

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
