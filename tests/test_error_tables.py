"""Every edge's error table: complete over the tree, client mistakes never server failures,
the rows the edges answered before the tables, and the edges really answer from them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from deviceplugin.request_bounds import BadRequestError
from deviceplugin.server import GRPC_ERRORS, _unary
from kube_edge.errors import ApiError
from nri_hook.errors import NRI_ERRORS, RejectError
from nri_hook.netdev import NetdevError
from nri_hook.plugin import _guarded
from scheduler_plugin.decisions.binder import BindRefusedError
from scheduler_plugin.decisions.extender import BadArgsError
from scheduler_plugin.serving.answers import HTTP_ERRORS
from scheduler_plugin.views.events import EVENT_REASONS, UNTRUSTED_RECORD
from tessera.boundedjson import JsonLimitError
from tessera.errors import (
    ErrorTable,
    InputError,
    IntegrityError,
    RecordError,
    RecordMismatchError,
    RequestError,
    StateError,
    TesseraError,
)
from tessera.record_keys import KeyFileError
from tessera_cli import ConfigError
from tessera_cli.exit_codes import EXIT_CODES, EXIT_FAILURE, EXIT_USAGE
from tessera_sim.trace import TraceError
from tessera_ttrpc import Code, RpcError
from tests.scheduler.helpers import Http, pod, populate, running, share
from tools import errors_doc

TABLES: list[ErrorTable[Any]] = [e.table() for e in errors_doc.EDGES]


def tree() -> list[type[BaseException]]:
    return [c for c in errors_doc.project_exceptions() if issubclass(c, TesseraError)]


def test_the_page_lists_every_table() -> None:
    assert {id(t) for t in TABLES} == {
        id(t) for t in (HTTP_ERRORS, GRPC_ERRORS, NRI_ERRORS, EXIT_CODES, EVENT_REASONS)
    }


def test_every_error_of_the_tree_has_a_row_at_every_edge_it_reaches() -> None:
    for edge, table in zip(errors_doc.EDGES, TABLES, strict=True):
        reached = [c for c in tree() if errors_doc.reaches(edge, c)]
        assert TesseraError in reached and len(reached) > 5, edge
        for cls in reached:
            found = table.row_class(cls)
            assert found in table.rows or found in table.carried, (table.edge, cls)
            assert issubclass(cls, found)


def test_client_mistakes_are_never_server_failures() -> None:
    mistakes = [c for c in tree() if issubclass(c, InputError)]
    assert BadArgsError in mistakes and ConfigError in mistakes and TraceError in mistakes
    for cls in mistakes:
        assert 400 <= HTTP_ERRORS.lookup(cls).status < 500, cls
        assert GRPC_ERRORS.lookup(cls) == grpc.StatusCode.INVALID_ARGUMENT, cls
        assert NRI_ERRORS.lookup(cls) in (Code.INVALID_ARGUMENT, Code.PERMISSION_DENIED), cls
        assert EXIT_CODES.lookup(cls) == EXIT_USAGE, cls


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (BadArgsError("x"), 400),
        (JsonLimitError("filter request", "not valid JSON"), 400),
        (RequestError("c", None, "rule"), 400),
        (BindRefusedError("no room"), 200),
        (ApiError(503, reason="ServiceUnavailable", message="down"), 500),
        (KeyError("a bug"), 500),
    ],
)
def test_http_rows(error: BaseException, status: int) -> None:
    assert HTTP_ERRORS.lookup(error).status == status


def test_grpc_rows() -> None:
    assert GRPC_ERRORS.lookup(BadRequestError("x")) == grpc.StatusCode.INVALID_ARGUMENT
    # anything else: what gRPC answers for an uncaught exception, as before the table
    assert GRPC_ERRORS.lookup(StateError("x")) == grpc.StatusCode.UNKNOWN


def test_nri_rows() -> None:
    assert NRI_ERRORS.lookup(IntegrityError("x")) == Code.PERMISSION_DENIED
    assert NRI_ERRORS.lookup(RecordMismatchError("x")) == Code.PERMISSION_DENIED
    assert NRI_ERRORS.lookup(RecordError("x")) == Code.INVALID_ARGUMENT
    assert NRI_ERRORS.lookup(NetdevError("x")) == Code.FAILED_PRECONDITION
    assert NRI_ERRORS.lookup(KeyError("x")) == Code.INTERNAL
    assert NRI_ERRORS.lookup(RejectError(Code.FAILED_PRECONDITION, "x")) == 9
    assert NRI_ERRORS.lookup(RpcError(Code.NOT_FOUND, "x")) == Code.NOT_FOUND


def test_exit_codes_and_event_reasons() -> None:
    assert EXIT_CODES.lookup(ConfigError("--x", "bad")) == EXIT_USAGE == 2
    assert EXIT_CODES.lookup(KeyFileError("k")) == EXIT_USAGE
    assert EXIT_CODES.lookup(TraceError("t.csv", 3, None, "bad")) == EXIT_USAGE
    assert EXIT_CODES.lookup(ApiError(403, reason="Forbidden", message="no")) == EXIT_FAILURE
    assert EVENT_REASONS.lookup(IntegrityError("x")) == UNTRUSTED_RECORD
    assert EVENT_REASONS.lookup(StateError("x")) == UNTRUSTED_RECORD
    assert EVENT_REASONS.lookup(ApiError(500, reason="", message="x")) is None


def test_the_extender_answers_from_its_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from tessera_testbed.apiserver import FakeApiServer

    with FakeApiServer() as fake:
        populate(fake, ["n"], gpus=1)
        with running(fake) as service:
            body = {"Pod": pod("p", share(10, 10), uid="u"), "Nodes": None, "NodeNames": ["n"]}
            for error, status in (
                (RequestError("main", None, "a rule"), 400),
                (BindRefusedError("tessera: no room"), 200),
                (StateError("a bug"), 500),
            ):

                def fail(verb: str, args: Any, error: BaseException = error) -> Any:
                    raise error

                monkeypatch.setattr(service.verbs, "call", fail)
                h = Http(service.server.port)
                got, reply = h.post("/filter", body)
                assert got == status and str(error) in reply["Error"], (error, got, reply)


class _AbortedError(Exception):
    pass


class _Context:
    code: grpc.StatusCode | None = None

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise _AbortedError(details)


def test_the_device_plugin_answers_from_its_table() -> None:
    for error, code in (
        (BadRequestError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (InputError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (StateError("x"), grpc.StatusCode.UNKNOWN),
    ):

        def handler(request: Any, context: Any, error: BaseException = error) -> Any:
            raise error

        context = _Context()
        with pytest.raises(_AbortedError):
            _unary("Allocate", handler)(object(), context)
        assert context.code == code


def test_the_nri_hook_answers_from_its_table() -> None:
    for error, code in (
        (RejectError(Code.FAILED_PRECONDITION, "no such GPU"), Code.FAILED_PRECONDITION),
        (RecordError("bad"), Code.INVALID_ARGUMENT),
        (KeyError("a bug"), Code.INTERNAL),
    ):

        async def handler(req: Any, ctx: Any, error: BaseException = error) -> Any:
            raise error

        with pytest.raises(RpcError) as raised:
            asyncio.run(_guarded("CreateContainer", handler)(object(), None))  # type: ignore[arg-type]
        assert raised.value.code == code


def test_docs_errors_md_is_generated_from_the_tables() -> None:
    page = Path(errors_doc.DOC).read_text()
    assert errors_doc.page_with(page, errors_doc.render()) == page, (
        "docs/errors.md is stale: run python -m tools.errors_doc"
    )
    for table in TABLES:
        for cls, value in table.rows.items():
            assert f"| `{cls.__name__}` | {errors_doc.show(value)} |" in page
    for cls in tree():
        assert f"`{cls.__name__}` ({cls.__module__})" in page
