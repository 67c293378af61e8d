"""The ASGI application of one server: the extender verbs' POST side, and the GET side
handed to serving/reads.py.

Extender server (`--listen`), routes matched on the last path segment for the verbs, so any
urlPrefix works:
- POST .../filter, .../prioritize, .../bind, .../preempt: the extender (503 unless ready);
  with a client CA only callers with a verified client certificate (kube-scheduler);
- GET /healthz, /readyz, /metrics as on the health server;
- GET /debug/nodes, /debug/nodes/<name>, /debug/pods, /debug/watch[?node=<name>]: JSON
  views of the devices and pods (see docs/scheduler.md); a verified client certificate or
  a bearer token that may `get` the path (TokenReview + SubjectAccessReview) is needed;
- GET /debug/ui: a page that draws those views live (views/ui.py); the page itself is a
  fixed shell without data, its data calls need the same credentials as /debug.

Health server (`--health-listen`, plain HTTP for kubelet probes and Prometheus):
GET /healthz (alive), /readyz (synced and leader, 503 otherwise), /metrics.

Filter and prioritize run on the event loop (they are CPU-bound and short; a thread hop
costs more than the HTTP work); plain HTTP/1.1 requests for them skip uvicorn's ASGI cycle
and reach `App.answer_inline` from the protocol (serving/protocol.py). Bind runs there too,
its API calls awaited on the loop (kube_edge.loop_client): on a thread it waited for the
interpreter, held by the loop, once to start and once when the API server answered, which
tripled its latency on a busy scheduler. Plain HTTP/1.1 binds skip the ASGI cycle as well
and are awaited in one task (`App.answer_awaited`). Preempt, the debug views, and binds
where the API client needs a proxy run on a bounded pool.
Bodies are counted against a process-wide byte budget before they are read, refused with
413 past --max-body-bytes (Content-Length or chunked), parsed with tessera.boundedjson;
client input that is not ExtenderArgs-shaped gets 400 with a reason, never 5xx.

The application is handed what it serves (the verbs, the debug views, the metrics and the
replica's life cycle) by the service that builds it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol

from kube_edge.client import KubeClient
from kube_edge.loop_client import LoopClient
from scheduler_plugin.decisions.verbs import Verbs
from scheduler_plugin.serving import limits
from scheduler_plugin.serving.answers import (
    HTTP_ERRORS,
    INLINE_VERBS,
    Receive,
    Scope,
    Send,
    _ReplyError,
    body_too_slow,
    dumps,
    failure,
    header,
    send_answer,
    send_body,
    verb_of,
)
from scheduler_plugin.serving.auth import TokenAuthorizer, client_cert
from scheduler_plugin.serving.protocol import Answer
from scheduler_plugin.serving.reads import Reads
from scheduler_plugin.views.debug import DebugViews
from scheduler_plugin.views.metrics import Metrics
from tessera.boundedjson import JsonLimitError, loads

log = logging.getLogger(__name__)


class Lifecycle(Protocol):
    """What the application reads of the replica it serves (scheduler_plugin.service)."""

    stopping: threading.Event

    def answering(self) -> bool:
        """Synced, leading and not stopping: the extender verbs are answered."""
        ...

    def readiness(self) -> tuple[bool, str]:
        """Whether the replica is ready, and why not."""
        ...


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


@dataclass(eq=False)
class App:
    """The ASGI application of one server (`extender` or `health` role)."""

    verbs: Verbs
    views: DebugViews
    metrics: Metrics | None
    life: Lifecycle
    client: KubeClient
    """The blocking API client, whose settings the event loop's own client shares."""
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
    _reads: Reads = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._reads = Reads(
            self.role,
            self.views,
            self.metrics,
            self.life.readiness,
            self.life.stopping,
            self.authorizer,
            self.open_debug,
            self.pool,
            self.watch_pool,
        )

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
            self._api = LoopClient.of(self.client, pool_size=limits.BLOCKING_WORKERS)
        return self._api

    async def close(self) -> None:
        """Close what this app holds open on its event loop (before the loop ends)."""
        if self._api is not None:
            await self._api.close()

    def connection_opened(self, protocol: str) -> None:
        """Counted per protocol (scheduler_plugin.serving.protocol.AlpnProtocol calls it once TLS
        is up)."""
        if self.metrics is not None:
            self.metrics.connections.labels(protocol).inc()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method = scope["method"]
        path = scope["path"].rstrip("/") or "/"
        try:
            if method == "POST" and self.role == "extender":
                await self._post(scope, receive, send, path)
            elif method in ("GET", "HEAD"):
                await self._reads.get(scope, receive, send, path)
            else:
                raise _ReplyError(
                    405 if path in ("/healthz", "/readyz") else 404, f"nothing at {path}"
                )
        except _ReplyError as r:
            await send_answer(send, r.answer())

    # --- POST: the extender ---------------------------------------------------------------

    async def _post(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        verb = verb_of(path)
        if verb is None:
            raise _ReplyError(404, f"no extender verb at {path}", close=True)
        if self.require_client_cert and not client_cert(scope):
            raise _ReplyError(403, "the extender verbs need a client certificate", close=True)
        started = time.perf_counter()
        if verb in INLINE_VERBS:
            try:
                body = await self._body(scope, receive)
            except _ReplyError:
                self._observe(verb, started, "bad_request")
                raise
            answer = self.answer_inline(verb, body, started)
            await send_answer(send, answer)
            if answer.status == 200:
                self.answered(verb)
            return
        verbs = self.verbs
        outcome = "bad_request"
        try:
            body = await self._body(scope, receive)
            args = self._arguments(verb, body)
            outcome = "error"
            try:
                if verb == "bind" and (api := self.loop_api()) is not None:
                    # on this loop: a thread would wait for the interpreter twice per bind
                    reply, outcome = await verbs.bind_on_loop(args, api)
                else:
                    loop = asyncio.get_running_loop()
                    reply, outcome = await loop.run_in_executor(self.pool, verbs.call, verb, args)
            except Exception as exc:
                raise failure(verb, exc) from None
            await send_body(send, 200, reply if isinstance(reply, bytes) else dumps(reply))
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
            return self._replied(verb, started, self.verbs.call(verb, args))
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
            return self._replied(verb, started, await self.verbs.bind_in_task(args, api))
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
        answer = Answer(200, reply if isinstance(reply, bytes) else dumps(reply))
        self._observe(verb, started, outcome)
        return answer

    def _failed(self, verb: str, started: float, exc: Exception) -> Answer:
        """The answer to a verb the service failed with `exc`, counted (call it where
        `exc` is being handled: a failure of this replica is logged with its traceback)."""
        refused = failure(verb, exc)
        self._observe(verb, started, refused.outcome)
        return refused.answer()

    def awaited(self, verb: str) -> bool:
        """Whether a direct verb's answer is awaited (`answer_awaited`), not decided at
        once (`answer_inline`)."""
        return verb not in INLINE_VERBS

    def answered(self, verb: str) -> None:
        """After an inline verb's answer is written (Verbs.answered)."""
        try:
            self.verbs.answered(verb)
        except Exception:  # the answer is out; what follows must not take the loop down
            log.exception("work after the %s answer failed", verb)

    def body_too_slow(self, verb: str, started: float) -> Answer:
        """The answer to a request whose body did not arrive within BODY_TIMEOUT."""
        self._observe(verb, started, "bad_request")
        return body_too_slow().answer()

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
        if not self.life.answering():
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
        metrics = self.metrics
        if metrics is not None:
            metrics.observe(verb, time.perf_counter() - started, outcome)

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        """The whole body, counted against the budget before it is read."""
        length_text = header(scope, b"content-length")
        chunked = (header(scope, b"transfer-encoding") or b"").lower() == b"chunked"
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
            raise body_too_slow() from None
        finally:
            budget.release(expected)
