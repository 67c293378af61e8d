"""The GET side of a server: health, readiness, /metrics, the allocation page and the
/debug views (JSON answers and the /debug/watch change streams).

/debug needs a verified client certificate or a bearer token that may `get` the path
(TokenReview + SubjectAccessReview, serving/auth.py); the page itself is a fixed shell
without data, its data calls need the same credentials as /debug. Everything that reads
the state runs on a pool, off the event loop that answers the extender verbs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote

from scheduler_plugin.serving.answers import (
    Receive,
    Scope,
    Send,
    _ReplyError,
    dumps,
    header,
    send_body,
)
from scheduler_plugin.serving.auth import TokenAuthorizer, client_cert
from scheduler_plugin.views import overview, ui
from scheduler_plugin.views.debug import DebugViews
from scheduler_plugin.views.metrics import CONTENT_TYPE, Metrics

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Reads:
    """The GET routes of one server (`extender` or `health` role). `readiness` says
    whether this replica answers and why not; `stopping` ends the change streams."""

    role: str
    views: DebugViews
    metrics: Metrics | None
    readiness: Callable[[], tuple[bool, str]]
    stopping: threading.Event
    authorizer: TokenAuthorizer | None
    open_debug: bool
    pool: ThreadPoolExecutor
    watch_pool: ThreadPoolExecutor

    async def get(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        if path == "/healthz":
            await send_body(send, 200, b"ok\n", b"text/plain")
        elif path == "/readyz":
            ready, why = self.readiness()
            await send_body(send, 200 if ready else 503, (why + "\n").encode(), b"text/plain")
        elif path == "/metrics":
            if self.metrics is None:
                await send_body(send, 404, b"metrics disabled\n", b"text/plain")
            else:
                await self._chunked(send, self.metrics.chunks(), CONTENT_TYPE.encode())
        elif self.role == "extender" and path == ui.PAGE_PATH:
            await send_body(send, 200, ui.PAGE, b"text/html; charset=utf-8")
        elif self.role == "extender" and path == ui.SCRIPT_PATH:
            await send_body(send, 200, ui.script(), b"text/javascript; charset=utf-8")
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
        if self.open_debug or client_cert(scope):
            return
        auth = (header(scope, b"authorization") or b"").decode("latin-1")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip() or self.authorizer is None:
            raise _ReplyError(401, "/debug needs a client certificate or a bearer token")
        loop = asyncio.get_running_loop()
        decision = await loop.run_in_executor(self.pool, self.authorizer.check, token.strip(), path)
        if not decision.allowed:
            raise _ReplyError(403, decision.reason)

    async def _debug(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        views = self.views
        loop = asyncio.get_running_loop()
        if path == "/debug/nodes":
            data = await loop.run_in_executor(self.pool, lambda: dumps(views.nodes()))
        elif path.startswith("/debug/nodes/"):
            name = unquote(path[len("/debug/nodes/") :])
            summary = await loop.run_in_executor(self.pool, views.node, name)
            if summary is None:
                raise _ReplyError(404, "no such node")
            data = dumps(summary)
        elif path == "/debug/pods":
            data = await loop.run_in_executor(self.pool, lambda: dumps(views.pods()))
        elif path == "/debug/overview":
            data = await loop.run_in_executor(self.pool, lambda: dumps(views.overview()))
        elif path == "/debug/search":
            q = _query(scope).get("q", "")
            if len(q) > overview.MAX_QUERY:
                raise _ReplyError(400, f"a search is at most {overview.MAX_QUERY} characters")
            data = await loop.run_in_executor(self.pool, lambda: dumps(views.search(q)))
        elif path == "/debug/pending":
            only = _query(scope).get("pod") or None
            data = await loop.run_in_executor(self.pool, lambda: dumps(views.pending(only)))
        elif path == "/debug/watch":
            query = _query(scope)
            if query.get("view") == "overview":
                await self._stream_overview(receive, send)
            else:
                await self._stream(receive, send, query.get("node"))
            return
        else:
            raise _ReplyError(404, f"nothing at {path}")
        await send_body(send, 200, data)

    async def _stream(self, receive: Receive, send: Send, only: str | None) -> None:
        """Chunked JSON lines: a SYNC line with the node names, then one MODIFIED line with
        the node's summary whenever a node changes, PING lines when idle."""
        views = self.views

        def first() -> list[Any]:
            return [{"type": "SYNC", "nodes": [only] if only else views.node_names()}]

        def changed(dirty: set[str]) -> list[Any]:
            nodes = sorted(n for n in dirty if not only or n == only)
            # off the event loop: a view may decode a usage annotation (up to 64 KiB)
            summaries = [views.node(node) for node in nodes]
            return [
                {"type": "DELETED", "node": {"node": node}}
                if summary is None
                else {"type": "MODIFIED", "node": summary}
                for node, summary in zip(nodes, summaries, strict=True)
            ]

        await self._lines(receive, send, first, changed)

    async def _stream_overview(self, receive: Receive, send: Send) -> None:
        """Chunked JSON lines for the allocation page: an OVERVIEW line (the figures per
        model and every node's row, views/overview.py), then a ROWS line with the rows
        that changed whenever nodes change, PING lines when idle."""
        views = self.views
        sent: dict[str, Any] = {}

        def first() -> list[Any]:
            whole = views.overview()
            sent.update((row["n"], row) for row in whole["nodes"])
            return [{"type": "OVERVIEW", **whole}]

        def changed(dirty: set[str]) -> list[Any]:
            return [views.changes(sorted(dirty), sent)]

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
        views = self.views
        if views.watchers_full():
            raise _ReplyError(503, "too many /debug/watch streams")
        changes = views.watch_changes()
        loop = asyncio.get_running_loop()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def emit(objs: list[Any]) -> None:
            for obj in objs:
                body = dumps(obj) + b"\n"
                await send({"type": "http.response.body", "body": body, "more_body": True})

        gone = _departure(receive)
        try:
            await emit(await loop.run_in_executor(self.watch_pool, first))
            while not self.stopping.is_set() and not gone.done():
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
