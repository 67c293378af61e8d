"""What the HTTP edge answers, and how it is written: the extender verbs' names, the status
each error becomes, the answers decided before a verb runs, and the ASGI send helpers."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from scheduler_plugin.decisions.binder import BindRefusedError
from scheduler_plugin.serving.protocol import Answer
from tessera.errors import ErrorTable, InputError, TesseraError

log = logging.getLogger(__name__)

VERBS = ("filter", "prioritize", "bind", "preempt")
INLINE_VERBS = frozenset({"filter", "prioritize"})
"""The verbs decided at once on the serving loop (CPU-bound and short)."""

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


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

    Private control flow of the HTTP edge (serving/): an answer already decided, raised to
    unwind to the application, which sends it; it never leaves the edge (errors that reach
    it from the service are mapped by HTTP_ERRORS)."""

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
        return Answer(self.status, dumps({"Error": f"tessera: {self.error}"}), self.close)


def body_too_slow() -> _ReplyError:
    return _ReplyError(408, "the body did not arrive in time", close=True)


def failure(verb: str, exc: Exception) -> _ReplyError:
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


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


async def send_answer(send: Send, answer: Answer) -> None:
    await send_body(send, answer.status, answer.body, close=answer.close)


async def send_body(
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


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
