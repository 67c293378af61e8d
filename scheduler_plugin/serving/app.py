"""The HTTP(S) servers: extender verbs and the debug API; health and metrics.

uvicorn (httptools parser, uvloop event loop) in this process, each server on its own
thread and event loop; bounds in scheduler_plugin.serving.limits and
scheduler_plugin.serving.protocol.
Why uvicorn, and the latency it was measured at: docs/scheduler.md, "HTTP server".

Extender server (`--listen`), routes matched on the last path segment for the verbs, so any
urlPrefix works:
- POST .../filter, .../prioritize, .../bind, .../preempt: the extender (503 unless ready);
  with a client CA only callers with a verified client certificate (kube-scheduler);
- GET /healthz, /readyz, /metrics as on the health server;
- GET /debug/nodes, /debug/nodes/<name>, /debug/pods, /debug/watch[?node=<name>]: JSON
  views of the devices and pods (see docs/scheduler.md); a verified client certificate or
  a bearer token that may `get` the path (TokenReview + SubjectAccessReview) is needed;
- GET /debug/ui: a page that draws those views live (scheduler_plugin.views.ui); the page itself
  is a fixed shell without data, its data calls need the same credentials as /debug.

Health server (`--health-listen`, plain HTTP for kubelet probes and Prometheus):
GET /healthz (alive), /readyz (synced and leader, 503 otherwise), /metrics.

Filter and prioritize run on the event loop (they are CPU-bound and short; a thread hop
costs more than the HTTP work); plain HTTP/1.1 requests for them skip uvicorn's ASGI cycle
and reach `App.answer_inline` from the protocol (scheduler_plugin.serving.protocol). Bind runs
there too, its API calls awaited on the loop (kube_edge.loop_client): on a thread it
waited for the interpreter, held by the loop, once to start and once when the API server
answered, which tripled its latency on a busy scheduler. Plain HTTP/1.1 binds skip the
ASGI cycle as well and are awaited in one task (`App.answer_awaited`). Preempt, the debug
views, and binds where the API client needs a proxy run on a bounded pool.
Bodies are counted against a process-wide byte budget before they are read, refused with
413 past --max-body-bytes (Content-Length or chunked), parsed with tessera.boundedjson;
client input that is not ExtenderArgs-shaped gets 400 with a reason, never 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field
from functools import partial
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qs, unquote

import uvicorn
from uvicorn.config import Config as UvicornConfig
from uvicorn.server import Server as UvicornServer

from kube_edge.loop_client import LoopClient
from scheduler_plugin.decisions.binder import BindRefusedError
from scheduler_plugin.serving import limits
from scheduler_plugin.serving.protocol import ALPN_PROTOCOLS, AlpnProtocol, Answer, BoundedProtocol
from scheduler_plugin.views import overview, ui
from scheduler_plugin.views.metrics import CONTENT_TYPE
from tessera.boundedjson import JsonLimitError, loads
from tessera.errors import ErrorTable, InputError, TesseraError

if TYPE_CHECKING:
    from scheduler_plugin.service import Service
    from scheduler_plugin.serving.auth import TokenAuthorizer

log = logging.getLogger(__name__)
# uvicorn warns once per malformed request: any client could flood the log with them
logging.getLogger("uvicorn.error").setLevel(logging.ERROR)
# uvicorn is a stand-in here (scheduler_plugin/__init__.py); uvicorn.lifespan.off imports
# `Config` from the package: naming it keeps the package __init__ (and click) unrun
uvicorn.__dict__.setdefault("Config", UvicornConfig)

VERBS = ("filter", "prioritize", "bind", "preempt")
DEFAULT_MAX_BODY = limits.MAX_BODY_BYTES
INLINE_VERBS = frozenset({"filter", "prioritize"})

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def tls_context(
    cert_file: str, key_file: str, client_ca_file: str | None, *, http2: bool = False
) -> ssl.SSLContext:
    """TLS 1.2+ with this certificate; with a client CA, client certificates it signed are
    verified when offered (the extender verbs then require one, /debug takes one). With
    `http2`, ALPN offers h2 before http/1.1 (scheduler_plugin.serving.http2; `--http2`)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    # no TLS 1.3 session tickets: kube-scheduler's client keeps no session cache, so a
    # ticket is never used to resume, and issuing two per connection costs CPU
    ctx.num_tickets = 0
    if http2:
        ctx.set_alpn_protocols(ALPN_PROTOCOLS)
    if client_ca_file:
        ctx.load_verify_locations(cafile=client_ca_file)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def requires_client_cert(tls: ssl.SSLContext | None) -> bool:
    return tls is not None and tls.verify_mode != ssl.CERT_NONE


class ByteBudget:
    """Bytes of request bodies held at once; a body waits for room before it is read.
    Used from one event loop only: with room and nobody waiting, taking bytes is a plain
    subtraction (the hot path); the condition is for waiting only."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._waiting = 0
        self._cond: asyncio.Condition | None = None
        self._notifiers: set[asyncio.Task[None]] = set()

    def try_acquire(self, n: int) -> bool:
        """Take `n` bytes if there is room and nobody is waiting for it (never waits)."""
        if not self._waiting and self.free >= n:
            self.free -= n
            return True
        return False

    async def acquire(self, n: int, timeout: float) -> None:
        if self.try_acquire(n):
            return
        if self._cond is None:
            self._cond = asyncio.Condition()
        cond = self._cond
        self._waiting += 1
        try:
            async with asyncio.timeout(timeout), cond:
                await cond.wait_for(lambda: self.free >= n)
                self.free -= n
        finally:
            self._waiting -= 1

    def release(self, n: int) -> None:
        self.free += n
        if self._waiting:
            task = asyncio.get_running_loop().create_task(self._notify())
            self._notifiers.add(task)
            task.add_done_callback(self._notifiers.discard)

    async def _notify(self) -> None:
        if self._cond is not None:
            async with self._cond:
                self._cond.notify_all()


@dataclass(frozen=True)
class HttpAnswer:
    """What an extender verb answers for an error: the HTTP status and the outcome label
    of tessera_scheduler_verb_seconds."""

    status: int
    outcome: str

    def __str__(self) -> str:
        return f"{self.status} {HTTPStatus(self.status).phrase} (outcome `{self.outcome}`)"


HTTP_ERRORS: ErrorTable[HttpAnswer] = ErrorTable(
    "scheduler extender: HTTP status",
    {
        TesseraError: HttpAnswer(500, "error"),
        InputError: HttpAnswer(400, "bad_request"),
        BindRefusedError: HttpAnswer(200, "refused"),
    },
)
"""Error class -> the answer to kube-scheduler (subclasses take their nearest row). The
caller's mistakes (a body that is not ExtenderArgs, a pod that breaks a request rule) are
400, never 5xx; a refused bind is 200 with the reason in `Error`, as the extender protocol
wants (bind answers a body that is JSON but not ExtenderBindingArgs the same way, in
binder.py); anything else is this replica's failure, 500 (logged with its traceback)."""


class _ReplyError(Exception):
    """Answer at once with this status and JSON error (closing the connection if asked).

    Private control flow: an answer already decided, raised to unwind to `App.__call__`,
    which sends it; it never leaves this module (errors that reach this edge from the
    service are mapped by HTTP_ERRORS)."""

    def __init__(
        self, status: int, error: str, *, close: bool = False, outcome: str = "bad_request"
    ) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.close = close
        self.outcome = outcome
        """The verb's outcome label in tessera_scheduler_verb_seconds."""

    def answer(self) -> Answer:
        return Answer(self.status, _dumps({"Error": f"tessera: {self.error}"}), self.close)


def _body_too_slow() -> _ReplyError:
    return _ReplyError(408, "the body did not arrive in time", close=True)


def _failure(verb: str, exc: Exception) -> _ReplyError:
    """The answer to a verb the service failed with `exc` (call it where `exc` is being
    handled: a failure of this replica is logged with its traceback)."""
    answer = HTTP_ERRORS.lookup(exc)
    if answer.status < 400:  # a refusal in the reply's Error, as binder.py words it
        return _ReplyError(answer.status, str(exc), outcome=answer.outcome)
    if answer.status < 500:
        return _ReplyError(answer.status, f"bad {verb} request: {exc}", outcome=answer.outcome)
    log.exception("%s failed", verb)
    return _ReplyError(
        answer.status, f"internal error in {verb}: {exc}", close=True, outcome=answer.outcome
    )


def verb_of(path: bytes | str) -> str | None:
    """The extender verb a POST path names (its last segment, so any urlPrefix works)."""
    text = path.decode("latin-1") if isinstance(path, bytes) else path
    verb = text.rstrip("/").rsplit("/", 1)[-1]
    return verb if verb in VERBS else None


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


async def _send_answer(send: Send, answer: Answer) -> None:
    await _send(send, answer.status, answer.body, close=answer.close)


async def _send(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    *,
    close: bool = False,
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


@dataclass(eq=False)
class App:
    """The ASGI application of one server (`extender` or `health` role)."""

    service: Service
    _: KW_ONLY
    role: str
    max_body: int
    require_client_cert: bool
    authorizer: TokenAuthorizer | None
    open_debug: bool
    pool: ThreadPoolExecutor
    watch_pool: ThreadPoolExecutor
    _budget: ByteBudget | None = field(default=None, init=False, repr=False)
    _api: LoopClient | None = field(default=None, init=False, repr=False)
    _api_made: bool = field(default=False, init=False, repr=False)

    @property
    def budget(self) -> ByteBudget:
        # created on the server's event loop (asyncio primitives bind to their loop)
        if self._budget is None:
            self._budget = ByteBudget(self.max_body * limits.BODY_BUDGET_BODIES)
        return self._budget

    def loop_api(self) -> LoopClient | None:
        """The API client of this server's event loop, made there on first use; None where
        the client's settings need the blocking one (a proxy), and binds then take the
        pool as other blocking verbs do."""
        if not self._api_made:
            self._api_made = True
            self._api = LoopClient.of(self.service.client, pool_size=limits.BLOCKING_WORKERS)
        return self._api

    async def close(self) -> None:
        """Close what this app holds open on its event loop (before the loop ends)."""
        if self._api is not None:
            await self._api.close()

    def connection_opened(self, protocol: str) -> None:
        """Counted per protocol (scheduler_plugin.serving.protocol.AlpnProtocol calls it once TLS
        is up)."""
        metrics = self.service.metrics
        if metrics is not None:
            metrics.connections.labels(protocol).inc()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method = scope["method"]
        path = scope["path"].rstrip("/") or "/"
        try:
            if method == "POST" and self.role == "extender":
                await self._post(scope, receive, send, path)
            elif method in ("GET", "HEAD"):
                await self._get(scope, receive, send, path)
            else:
                raise _ReplyError(
                    405 if path in ("/healthz", "/readyz") else 404, f"nothing at {path}"
                )
        except _ReplyError as r:
            await _send_answer(send, r.answer())

    # --- POST: the extender ---------------------------------------------------------------

    async def _post(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        verb = verb_of(path)
        if verb is None:
            raise _ReplyError(404, f"no extender verb at {path}", close=True)
        if self.require_client_cert and not _client_cert(scope):
            raise _ReplyError(403, "the extender verbs need a client certificate", close=True)
        started = time.perf_counter()
        if verb in INLINE_VERBS:
            try:
                body = await self._body(scope, receive)
            except _ReplyError:
                self._observe(verb, started, "bad_request")
                raise
            answer = self.answer_inline(verb, body, started)
            await _send_answer(send, answer)
            if answer.status == 200:
                self.answered(verb)
            return
        service = self.service
        outcome = "bad_request"
        try:
            body = await self._body(scope, receive)
            args = self._arguments(verb, body)
            outcome = "error"
            try:
                if verb == "bind" and (api := self.loop_api()) is not None:
                    # on this loop: a thread would wait for the interpreter twice per bind
                    reply, outcome = await service.bind_on_loop(args, api)
                else:
                    loop = asyncio.get_running_loop()
                    reply, outcome = await loop.run_in_executor(self.pool, service.call, verb, args)
            except Exception as exc:
                raise _failure(verb, exc) from None
            await _send(send, 200, reply if isinstance(reply, bytes) else _dumps(reply))
        except _ReplyError as r:
            outcome = r.outcome
            raise
        finally:
            self._observe(verb, started, outcome)

    def answer_inline(self, verb: str, body: bytes, started: float) -> Answer:
        """The answer to filter or prioritize with its whole body, decided on the serving
        loop; counted in the verb metrics from `started` (a perf_counter reading). The
        ASGI path and HTTP/1.1's direct path (scheduler_plugin.serving.protocol) both answer
        here."""
        args, refused = self._counted_arguments(verb, body, started)
        if refused is not None:
            return refused
        try:
            return self._replied(verb, started, self.service.call(verb, args))
        except Exception as exc:
            return self._failed(verb, started, exc)

    async def answer_awaited(self, verb: str, body: bytes, started: float) -> Answer:
        """The answer to bind with its whole body, its API calls awaited on the serving
        loop in the caller's task, which nobody may cancel (HTTP/1.1's direct path gives
        it a task of its own): no task and shield of the bind's own, so two turns of a
        busy loop fewer than the ASGI path. Counted in the verb metrics from `started`."""
        api = self.loop_api()
        assert api is not None, "direct_verb names bind only with a loop client"
        args, refused = self._counted_arguments(verb, body, started)
        if refused is not None:
            return refused
        try:
            return self._replied(verb, started, await self.service.bind_in_task(args, api))
        except Exception as exc:
            return self._failed(verb, started, exc)

    def _counted_arguments(
        self, verb: str, body: bytes, started: float
    ) -> tuple[Any, Answer | None]:
        """The verb's arguments; or, where the body gives none or this replica may not
        answer, the answer to send instead, counted in the verb metrics."""
        try:
            return self._arguments(verb, body), None
        except _ReplyError as r:
            self._observe(verb, started, r.outcome)
            return None, r.answer()

    def _replied(self, verb: str, started: float, result: tuple[Any, str]) -> Answer:
        """The 200 answer to a verb the service answered, counted with its outcome."""
        reply, outcome = result
        answer = Answer(200, reply if isinstance(reply, bytes) else _dumps(reply))
        self._observe(verb, started, outcome)
        return answer

    def _failed(self, verb: str, started: float, exc: Exception) -> Answer:
        """The answer to a verb the service failed with `exc`, counted (call it where
        `exc` is being handled: a failure of this replica is logged with its traceback)."""
        refused = _failure(verb, exc)
        self._observe(verb, started, refused.outcome)
        return refused.answer()

    def awaited(self, verb: str) -> bool:
        """Whether a direct verb's answer is awaited (`answer_awaited`), not decided at
        once (`answer_inline`)."""
        return verb not in INLINE_VERBS

    def answered(self, verb: str) -> None:
        """After an inline verb's answer is written (Service.answered)."""
        try:
            self.service.answered(verb)
        except Exception:  # the answer is out; what follows must not take the loop down
            log.exception("work after the %s answer failed", verb)

    def body_too_slow(self, verb: str, started: float) -> Answer:
        """The answer to a request whose body did not arrive within BODY_TIMEOUT."""
        self._observe(verb, started, "bad_request")
        return _body_too_slow().answer()

    def direct_verb(self, path: bytes, client_cert: bool) -> str | None:
        """The verb a POST to `path` names where this app answers it without the ASGI
        cycle, else None (the ASGI path answers it, errors included): filter and
        prioritize, and bind where binds run on this loop (not through a proxy)."""
        if self.role != "extender" or (self.require_client_cert and not client_cert):
            return None
        verb = verb_of(path)
        if verb in INLINE_VERBS or (verb == "bind" and self.loop_api() is not None):
            return verb
        return None

    def take_body_room(self, n: int) -> bool:
        """Room for a body of `n` bytes in the budget, taken only if it is there now."""
        return self.budget.try_acquire(n)

    def give_body_room(self, n: int) -> None:
        self.budget.release(n)

    def _arguments(self, verb: str, body: bytes) -> Any:
        """The verb's decoded arguments, once this replica may answer."""
        if not self.service.answering():
            # closed: the client's next connection reaches the leader (through the
            # Service), where a kept one would keep reaching this replica
            raise _ReplyError(
                503, "this replica is not ready or not the leader", close=True, outcome="not_ready"
            )
        try:
            return loads(
                body,
                what=f"{verb} request",
                max_bytes=self.max_body,
                max_depth=limits.MAX_JSON_DEPTH,
            )
        except JsonLimitError as exc:
            status = HTTP_ERRORS.lookup(exc).status
            raise _ReplyError(status, f"bad {verb} request: {exc.reason}") from None

    def _observe(self, verb: str, started: float, outcome: str) -> None:
        metrics = self.service.metrics
        if metrics is not None:
            metrics.observe(verb, time.perf_counter() - started, outcome)

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        """The whole body, counted against the budget before it is read."""
        length_text = _header(scope, b"content-length")
        chunked = (_header(scope, b"transfer-encoding") or b"").lower() == b"chunked"
        if length_text is not None:
            if not length_text.isdigit() or len(length_text) > 12:
                raise _ReplyError(400, "bad Content-Length", close=True)
            expected = int(length_text)
        elif chunked or scope["http_version"] == "2":
            expected = self.max_body  # unknown: reserve the most it may be
        else:
            expected = 0
        if expected > self.max_body:
            raise _ReplyError(413, f"body of {expected} bytes over {self.max_body}", close=True)
        budget = self.budget
        try:
            await budget.acquire(expected, limits.BODY_TIMEOUT)
        except TimeoutError:
            raise _ReplyError(503, "too many request bodies in flight", close=True) from None
        try:
            parts: list[bytes] = []
            size = 0
            async with asyncio.timeout(limits.BODY_TIMEOUT):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise _ReplyError(400, "the client went away", close=True)
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > expected:
                        raise _ReplyError(413, f"body over {self.max_body} bytes", close=True)
                    parts.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(parts)
        except TimeoutError:
            raise _body_too_slow() from None
        finally:
            budget.release(expected)

    # --- GET: health, metrics, debug -------------------------------------------------------

    async def _get(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        service = self.service
        if path == "/healthz":
            await _send(send, 200, b"ok\n", b"text/plain")
        elif path == "/readyz":
            ready, why = service.readiness()
            await _send(send, 200 if ready else 503, (why + "\n").encode(), b"text/plain")
        elif path == "/metrics":
            if service.metrics is None:
                await _send(send, 404, b"metrics disabled\n", b"text/plain")
            else:
                await self._chunked(send, service.metrics.chunks(), CONTENT_TYPE.encode())
        elif self.role == "extender" and path == ui.PAGE_PATH:
            await _send(send, 200, ui.PAGE, b"text/html; charset=utf-8")
        elif self.role == "extender" and path == ui.SCRIPT_PATH:
            await _send(send, 200, ui.script(), b"text/javascript; charset=utf-8")
        elif self.role == "extender" and (path == "/debug" or path.startswith("/debug/")):
            await self._authorize_debug(scope, path)
            await self._debug(scope, receive, send, path)
        else:
            raise _ReplyError(404, f"nothing at {path}")

    async def _chunked(self, send: Send, chunks: Iterator[bytes], content_type: bytes) -> None:
        """200 with a body made chunk by chunk in the blocking pool, sent as it comes: a
        scrape at 5,000 nodes reads 40,000 GPUs, and meanwhile the event loop answers
        extender calls and the process holds one chunk, not the whole text."""
        loop = asyncio.get_running_loop()
        headers = [(b"content-type", content_type)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        while True:
            try:
                chunk = await loop.run_in_executor(self.pool, next, chunks, None)
            except Exception:
                # the status is sent: end the body (the scraper sees a short answer)
                log.exception("rendering a streamed answer failed")
                break
            if chunk is None:
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def _authorize_debug(self, scope: Scope, path: str) -> None:
        if self.open_debug or _client_cert(scope):
            return
        auth = (_header(scope, b"authorization") or b"").decode("latin-1")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip() or self.authorizer is None:
            raise _ReplyError(401, "/debug needs a client certificate or a bearer token")
        loop = asyncio.get_running_loop()
        decision = await loop.run_in_executor(self.pool, self.authorizer.check, token.strip(), path)
        if not decision.allowed:
            raise _ReplyError(403, decision.reason)

    async def _debug(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        service = self.service
        loop = asyncio.get_running_loop()
        if path == "/debug/nodes":
            data = await loop.run_in_executor(self.pool, lambda: _dumps(service.debug_nodes()))
        elif path.startswith("/debug/nodes/"):
            name = unquote(path[len("/debug/nodes/") :])
            summary = await loop.run_in_executor(self.pool, service.cache.node_view, name)
            if summary is None:
                raise _ReplyError(404, "no such node")
            data = _dumps(summary)
        elif path == "/debug/pods":
            data = await loop.run_in_executor(self.pool, lambda: _dumps(service.debug_pods()))
        elif path == "/debug/overview":
            data = await loop.run_in_executor(self.pool, lambda: _dumps(service.debug_overview()))
        elif path == "/debug/search":
            q = _query(scope).get("q", "")
            if len(q) > overview.MAX_QUERY:
                raise _ReplyError(400, f"a search is at most {overview.MAX_QUERY} characters")
            data = await loop.run_in_executor(self.pool, lambda: _dumps(service.debug_search(q)))
        elif path == "/debug/pending":
            only = _query(scope).get("pod") or None
            data = await loop.run_in_executor(
                self.pool, lambda: _dumps(service.debug_pending(only))
            )
        elif path == "/debug/watch":
            query = _query(scope)
            if query.get("view") == "overview":
                await self._stream_overview(receive, send)
            else:
                await self._stream(receive, send, query.get("node"))
            return
        else:
            raise _ReplyError(404, f"nothing at {path}")
        await _send(send, 200, data)

    async def _stream(self, receive: Receive, send: Send, only: str | None) -> None:
        """Chunked JSON lines: a SYNC line with the node names, then one MODIFIED line with
        the node's summary whenever a node changes, PING lines when idle."""
        service = self.service

        def first() -> list[Any]:
            return [{"type": "SYNC", "nodes": [only] if only else service.cache.node_names()}]

        def changed(dirty: set[str]) -> list[Any]:
            nodes = sorted(n for n in dirty if not only or n == only)
            # off the event loop: a view may decode a usage annotation (up to 64 KiB)
            views = _views(service, nodes)
            return [
                {"type": "DELETED", "node": {"node": node}}
                if summary is None
                else {"type": "MODIFIED", "node": summary}
                for node, summary in zip(nodes, views, strict=True)
            ]

        await self._lines(receive, send, first, changed)

    async def _stream_overview(self, receive: Receive, send: Send) -> None:
        """Chunked JSON lines for the allocation page: an OVERVIEW line (the figures per
        model and every node's row, scheduler_plugin.views.overview), then a ROWS line with the
        rows that changed whenever nodes change, PING lines when idle."""
        service = self.service
        sent: dict[str, Any] = {}

        def first() -> list[Any]:
            whole = service.debug_overview()
            sent.update((row["n"], row) for row in whole["nodes"])
            return [{"type": "OVERVIEW", **whole}]

        def changed(dirty: set[str]) -> list[Any]:
            change = partial(overview.changes, names=sorted(dirty), sent=sent)
            return [service.cache.reading(change)]

        await self._lines(receive, send, first, changed)

    async def _lines(
        self,
        receive: Receive,
        send: Send,
        first: Callable[[], list[Any]],
        changed: Callable[[set[str]], list[Any]],
    ) -> None:
        """One change stream: `first()`'s lines, then `changed(nodes)`'s whenever nodes
        change and a PING line when idle, until the scheduler stops or the reader goes.
        Both run on the watch pool, off the event loop."""
        service = self.service
        if service.watchers_full():
            raise _ReplyError(503, "too many /debug/watch streams")
        changes = service.watch_changes()
        loop = asyncio.get_running_loop()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def emit(objs: list[Any]) -> None:
            for obj in objs:
                body = _dumps(obj) + b"\n"
                await send({"type": "http.response.body", "body": body, "more_body": True})

        gone = _departure(receive)
        try:
            await emit(await loop.run_in_executor(self.watch_pool, first))
            while not service.stopping.is_set() and not gone.done():
                dirty = await loop.run_in_executor(self.watch_pool, changes.take, 1.0)
                if not dirty:
                    await emit([{"type": "PING"}])
                    continue
                await emit(await loop.run_in_executor(self.watch_pool, changed, dirty))
            await send({"type": "http.response.body", "body": b""})
        finally:
            gone.cancel()
            changes.close()


def _departure(receive: Receive) -> asyncio.Task[None]:
    """A task that ends when the client goes away: a stream's sends to a closed connection
    are dropped without an error, so without it the stream (and its place among the
    MAX_WATCHERS) would outlive its reader."""

    async def wait() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    return asyncio.get_running_loop().create_task(wait())


def _query(scope: Scope) -> dict[str, str]:
    """The query string's parameters (the last of each name)."""
    raw = scope.get("query_string", b"").decode("latin-1")
    try:
        return {k: v[-1] for k, v in parse_qs(raw, max_num_fields=16).items()}
    except ValueError:
        raise _ReplyError(400, "too many query parameters") from None


def _views(service: Service, nodes: list[str]) -> list[dict[str, Any] | None]:
    return [service.cache.node_view(node) for node in nodes]


def _client_cert(scope: Scope) -> bool:
    tls = (scope.get("extensions") or {}).get("tls") or {}
    return bool(tls.get("client_cert_name"))


class _Serving(UvicornServer):
    """uvicorn's server, then the app's own connections closed on the same loop."""

    def __init__(self, config: UvicornConfig, app: App) -> None:
        super().__init__(config)
        self._app = app

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().serve(sockets=sockets)
        finally:
            await self._app.close()


class Server:
    """One uvicorn server on its own thread and event loop. The socket is bound in the
    constructor, so a busy or forbidden address fails there (OSError)."""

    def __init__(self, address: tuple[str, int], app: App, *, tls: ssl.SSLContext | None) -> None:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind(address)
        except OSError:
            self.sock.close()
            raise
        self.app = app
        self.tls = tls
        config = UvicornConfig(
            app,
            # over TLS the protocol is chosen by ALPN (HTTP/2 or HTTP/1.1)
            http=cast(type[asyncio.Protocol], AlpnProtocol if tls is not None else BoundedProtocol),
            loop="uvloop",
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            # no proxy sits in front: X-Forwarded-* would be client-written and unused
            proxy_headers=False,
            date_header=False,
            timeout_keep_alive=int(limits.KEEPALIVE_TIMEOUT),
            timeout_graceful_shutdown=1,
            backlog=128,
            ssl_context_factory=(lambda _cfg, _default: tls) if tls is not None else None,
        )
        self._server = _Serving(config, app)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def start(self) -> threading.Thread:
        thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self.sock]},
            daemon=True,
            name=f"http-{self.app.role}",
        )
        thread.start()
        self._thread = thread
        deadline = time.monotonic() + 10
        while not self._server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        if not self._server.started:
            raise OSError(f"the {self.app.role} server did not start")
        return thread

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        with contextlib.suppress(OSError):
            self.sock.close()


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
