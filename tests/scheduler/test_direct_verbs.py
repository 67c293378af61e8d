"""The extender verbs answered by the HTTP/1.1 protocol itself, without uvicorn's ASGI
cycle (scheduler_plugin.serving.protocol): the same answers as the ASGI path, in order when
requests are pipelined (behind an awaited bind too), the ASGI path for everything that is
not a plain request, bodies under the same deadline and budget, a bind that lands when its
client has gone or the server stops, over real sockets to the real server."""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_plugin.service import Service
from scheduler_plugin.serving import app as http_module
from scheduler_plugin.serving import limits
from scheduler_plugin.serving.protocol import BoundedProtocol
from tessera import resources as rn
from tessera_testbed.apiserver import FakeApiServer
from tests.scheduler.helpers import (
    bind_body,
    pod,
    populate,
    running,
    running_nodes,
    share,
    start,
    wait_for,
)

NODES = ["direct-0", "direct-1", "direct-2"]


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    with running_nodes(NODES, gpus=2) as svc:
        yield svc


def _request(path: str, body: bytes, *extra: bytes, version: bytes = b"1.1") -> bytes:
    head = [
        b"POST " + path.encode() + b" HTTP/" + version,
        b"Host: tessera",
        b"Content-Type: application/json",
        b"Content-Length: %d" % len(body),
        *extra,
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


Answer = tuple[int, dict[bytes, bytes], bytes]
"""Status, headers (names in lower case), body."""


class Reader:
    """HTTP/1.1 answers read one after another from a socket (pipelining included)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError
        self.buf += chunk

    def answer(self) -> Answer:
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        status_line, *lines = head.split(b"\r\n")
        headers = dict(line.lower().split(b": ", 1) for line in lines)
        length = int(headers.get(b"content-length", b"0"))
        while len(self.buf) < length:
            self._fill()
        body, self.buf = self.buf[:length], self.buf[length:]
        return int(status_line.split()[1]), headers, body

    def closed(self) -> bool:
        try:
            self._fill()
        except (EOFError, ConnectionResetError):
            return True
        return False


def _connect(service: Service) -> socket.socket:
    return socket.create_connection(("127.0.0.1", service.server.port), timeout=10)


def _filter(name: str, **extra: Any) -> bytes:
    body = {"Pod": pod(name, share(10, 10), uid=f"uid-{name}"), "NodeNames": NODES} | extra
    return json.dumps(body).encode()


BAD_POD = pod("bad", {rn.GPU_CORE: 10, rn.GPU_MEMORY: "1e999"})
BODIES: list[tuple[str, bytes]] = [
    ("/filter", _filter("a")),
    ("/tessera/prioritize", _filter("b")),
    ("/filter/", json.dumps({"Pod": pod("w", {rn.GPU: 100}), "NodeNames": NODES}).encode()),
    ("/filter", _filter("c", NodeNames=[*NODES, "ghost"])),
    ("/filter", json.dumps({"Pod": pod("plain", {"cpu": "1"}), "NodeNames": NODES}).encode()),
    ("/filter", b'{"Pod":{},"NodeNames":NaN}'),
    ("/prioritize", b"[" * 100 + b"]" * 100),
    ("/filter", b'{"Pod":"\xff\xfe"}'),
    ("/filter", json.dumps({"Pod": BAD_POD}).encode()),
]


@pytest.fixture
def asgi_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the ASGI application was called for."""
    calls: list[str] = []
    call = http_module.App.__call__

    async def counted(self: http_module.App, scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["path"])
        await call(self, scope, receive, send)

    monkeypatch.setattr(http_module.App, "__call__", counted)
    return calls


def _answers(service: Service, requests: list[bytes]) -> list[Answer]:
    with _connect(service) as sock:
        reader = Reader(sock)
        out = []
        for request in requests:
            sock.sendall(request)
            out.append(reader.answer())
        return out


def test_the_direct_path_answers_what_the_asgi_path_answers(
    service: Service, asgi_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = [_request(path, body) for path, body in BODIES]
    direct = _answers(service, requests)
    assert asgi_calls == []  # every one answered without the ASGI cycle
    monkeypatch.setattr(BoundedProtocol, "_direct_request", lambda self: None)
    through_asgi = _answers(service, requests)
    assert len(asgi_calls) == len(requests)
    assert direct == through_asgi
    statuses = [status for status, _, _ in direct]
    # malformed bodies are 4xx; a pod breaking a request rule is a filter answer (200)
    assert statuses == [200] * 5 + [400] * 3 + [200], statuses


def test_pipelined_requests_are_answered_in_order(service: Service, asgi_calls: list[str]) -> None:
    bind = json.dumps(bind_body(pod("gone", {rn.GPU: 100}, uid="gone-uid"), NODES[0])).encode()
    with _connect(service) as sock:
        reader = Reader(sock)
        sock.sendall(
            _request("/filter", _filter("p1"))
            + _request("/bind", bind)  # the ASGI path, awaited on the loop
            + _request("/prioritize", _filter("p2"))
            + _request("/filter", _filter("p3"))
        )
        first, second, third, fourth = (reader.answer() for _ in range(4))
    assert first[0] == 200 and json.loads(first[2])["NodeNames"]
    assert second[0] == 200 and json.loads(second[2])["Error"]  # no such pod: refused
    assert third[0] == 200 and {p["Host"] for p in json.loads(third[2])} <= set(NODES)
    assert fourth[0] == 200 and json.loads(fourth[2])["NodeNames"]
    # the first two were answered directly (the bind awaited an API GET for the pod);
    # those pipelined behind the bind queued in uvicorn's pipeline until it was answered
    assert asgi_calls == ["/prioritize", "/filter"]


def test_requests_that_are_not_plain_take_the_asgi_path(
    service: Service, asgi_calls: list[str]
) -> None:
    body = _filter("q")
    with _connect(service) as sock:
        reader = Reader(sock)
        sock.sendall(_request("/filter", body, b"Expect: 100-continue"))
        status, _, _ = reader.answer()
        if status == 100:
            status, _, _ = reader.answer()
        assert status == 200
        head = b"POST /filter HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        sock.sendall(head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        assert reader.answer()[0] == 200
    with _connect(service) as sock:  # HTTP/1.0: answered, then closed
        reader = Reader(sock)
        sock.sendall(_request("/filter", body, version=b"1.0"))
        assert reader.answer()[0] == 200 and reader.closed()
    assert asgi_calls == ["/filter"] * 3


def test_a_client_asking_to_close_is_answered_and_closed(service: Service) -> None:
    with _connect(service) as sock:
        reader = Reader(sock)
        sock.sendall(_request("/filter", _filter("r"), b"Connection: close"))
        status, headers, _ = reader.answer()
        assert status == 200 and headers[b"connection"] == b"close"
        assert reader.closed()


def _budget(service: Service) -> http_module.ByteBudget:
    app = service.server.app
    assert isinstance(app, http_module.App)
    return app.budget


def test_bodies_that_stall_or_are_abandoned_give_their_budget_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "BODY_TIMEOUT", 0.5)
    with FakeApiServer() as fake, running(fake) as svc:
        budget = _budget(svc)
        stalled = _connect(svc)
        stalled.sendall(_request("/filter", b"{" + b" " * 999)[:-500])
        left = _connect(svc)
        left.sendall(_request("/filter", b"{" + b" " * 999)[:-500])
        wait_for(lambda: budget.free == budget.total - 2000)
        left.close()  # gone mid-body: its 1000 bytes come back (the other's may too, soon)
        wait_for(lambda: budget.free >= budget.total - 1000)
        status, headers, body = Reader(stalled).answer()  # the deadline: 408, then closed
        assert status == 408 and headers[b"connection"] == b"close" and b"in time" in body
        wait_for(lambda: budget.free == budget.total)
        stalled.close()


def test_without_room_in_the_budget_the_body_takes_the_asgi_path(
    service: Service, asgi_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # no room now: the ASGI path waits for room (test_edge.py) instead of the direct path
    monkeypatch.setattr(http_module.App, "take_body_room", lambda self, n: False)
    assert _answers(service, [_request("/filter", _filter("s"))])[0][0] == 200
    assert asgi_calls == ["/filter"]
    assert _budget(service).free == _budget(service).total


def test_a_failure_inside_the_direct_path_is_a_500_and_the_server_goes_on(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: http_module.App, verb: str, body: bytes, started: float) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(http_module.App, "answer_inline", broken)
    with _connect(service) as sock:
        reader = Reader(sock)
        sock.sendall(_request("/filter", _filter("u")))
        status, headers, body = reader.answer()
        assert status == 500 and headers[b"connection"] == b"close"
        assert json.loads(body) == {"Error": "tessera: internal error"}
        assert reader.closed()
    monkeypatch.undo()
    assert _answers(service, [_request("/filter", _filter("v"))])[0][0] == 200


def test_the_verb_metrics_count_direct_answers(service: Service) -> None:
    metrics = service.metrics
    assert metrics is not None

    def count() -> float:
        return sum(
            sample.value
            for family in metrics.requests.collect()
            for sample in family.samples
            if sample.name.endswith("_count") and sample.labels.get("verb") == "prioritize"
        )

    before = count()
    _answers(service, [_request("/prioritize", _filter("w"))] * 3)
    assert count() == before + 3


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cuts=st.lists(st.integers(1, 4000), max_size=6), pipelined=st.integers(1, 3))
def test_any_split_of_the_bytes_gets_the_same_answers(
    service: Service, cuts: list[int], pipelined: int
) -> None:
    data = b"".join(_request("/filter", _filter(f"x{k}")) for k in range(pipelined))
    points = sorted({c % len(data) for c in cuts} | {0, len(data)})
    with _connect(service) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for a, b in itertools.pairwise(points):
            sock.sendall(data[a:b])
            time.sleep(0.002)  # separate segments, so the server reads them apart
        reader = Reader(sock)
        answers = [reader.answer() for _ in range(pipelined)]
    assert all(status == 200 for status, _, _ in answers)
    assert all(json.loads(body)["NodeNames"] for _, _, body in answers)


def _bind_bodies(fake: FakeApiServer, tag: str) -> list[tuple[str, bytes]]:
    """Bind requests of every kind, with new pods named after `tag`."""
    fits = fake.create("pods", pod(f"fits-{tag}", share(10, 10), uid=f"uid-fits-{tag}"))
    whole = fake.create("pods", pod(f"whole-{tag}", {rn.GPU: 100}, uid=f"uid-whole-{tag}"))
    plain = fake.create("pods", pod(f"plain-{tag}", {"cpu": "1"}, uid=f"uid-plain-{tag}"))
    gone = pod("gone", {rn.GPU: 100}, uid="uid-gone")
    return [
        ("/bind", json.dumps(bind_body(fits, NODES[0])).encode()),
        ("/tessera/bind/", json.dumps(bind_body(whole, NODES[1])).encode()),
        ("/bind", json.dumps(bind_body(plain, NODES[2])).encode()),
        ("/bind", json.dumps(bind_body(gone, NODES[0])).encode()),  # no such pod
        ("/bind", json.dumps(bind_body(fits, "ghost")).encode()),  # no such node
        ("/bind", b'{"PodName":"p"}'),
        ("/bind", b"[1,2]"),
        ("/bind", b'{"PodName":NaN}'),
        ("/bind", b"{" * 200),
    ]


def _untagged(answer: Answer) -> Answer:
    status, headers, body = answer
    return status, headers, re.sub(rb"(fits|whole|plain)-[da]\b", rb"\1-?", body)


def test_a_direct_bind_answers_what_the_asgi_path_answers(
    asgi_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeApiServer() as fake:
        populate(fake, NODES, gpus=2)
        with running(fake) as svc:
            direct = _answers(svc, [_request(p, b) for p, b in _bind_bodies(fake, "d")])
            assert asgi_calls == []
            with monkeypatch.context() as m:
                m.setattr(BoundedProtocol, "_direct_request", lambda self: None)
                through_asgi = _answers(svc, [_request(p, b) for p, b in _bind_bodies(fake, "a")])
            assert len(asgi_calls) == len(through_asgi)
            bound = {
                name: fake.get("pods", name, "default")["spec"].get("nodeName")
                for tag in "da"
                for name in (f"fits-{tag}", f"whole-{tag}", f"plain-{tag}")
            }
    assert [_untagged(a) for a in direct] == [_untagged(a) for a in through_asgi]
    # bound; refused (no such pod, node taken, not ExtenderBindingArgs) in Error; not JSON
    assert [status for status, _, _ in direct] == [200] * 7 + [400] * 2
    errors = [json.loads(body)["Error"] for _, _, body in direct]
    assert errors[:3] == [""] * 3 and all(errors[3:]), errors
    assert bound == {
        f"{kind}-{tag}": node
        for tag in "da"
        for kind, node in zip(("fits", "whole", "plain"), NODES, strict=True)
    }


class _HeldBinds:
    """The fake API server's Binding writes held until `release`."""

    def __init__(self, fake: FakeApiServer) -> None:
        self.arrived = threading.Event()
        self._gate = threading.Event()
        self._bind = fake.bind

        def held(namespace: str, name: str, binding: dict[str, Any]) -> dict[str, Any]:
            self.arrived.set()
            assert self._gate.wait(10)
            return self._bind(namespace, name, binding)

        fake.bind = held  # type: ignore[method-assign]

    def release(self) -> None:
        self._gate.set()


def test_a_bind_whose_client_went_away_still_lands_and_holds_its_devices() -> None:
    with FakeApiServer() as fake:
        populate(fake, NODES, gpus=2)
        with running(fake) as svc:
            created = fake.create("pods", pod("left", {rn.GPU: 100}, uid="uid-left"))
            held = _HeldBinds(fake)
            sock = _connect(svc)
            sock.sendall(_request("/bind", json.dumps(bind_body(created, NODES[1])).encode()))
            assert held.arrived.wait(10)
            sock.close()  # kube-scheduler gave up on this bind
            held.release()
            wait_for(lambda: fake.get("pods", "left", "default")["spec"].get("nodeName"))
            wait_for(lambda: not svc.cache.pods.assumed())  # the watch saw it: held, not assumed
            summary = svc.cache.node_summary(NODES[1])
            assert summary is not None and "left" in json.dumps(summary)
            assert _answers(svc, [_request("/filter", _filter("after"))])[0][0] == 200


def test_a_stopping_server_answers_the_bind_it_awaits_then_closes() -> None:
    with FakeApiServer() as fake:
        populate(fake, NODES, gpus=2)
        svc = start(fake)
        try:
            assert svc.wait_ready(10)
            created = fake.create("pods", pod("last", {rn.GPU: 100}, uid="uid-last"))
            held = _HeldBinds(fake)
            with _connect(svc) as sock:
                sock.sendall(_request("/bind", json.dumps(bind_body(created, NODES[0])).encode()))
                assert held.arrived.wait(10)
                stopping = threading.Thread(target=svc.server.stop)
                stopping.start()
                time.sleep(0.3)  # the shutdown has begun: the connection is asked to end
                held.release()
                status, headers, body = Reader(sock).answer()
                stopping.join(10)
            assert status == 200 and json.loads(body) == {"Error": ""}
            assert headers.get(b"connection") == b"close"
            assert fake.get("pods", "last", "default")["spec"]["nodeName"] == NODES[0]
        finally:
            svc.stop()


@pytest.mark.parametrize("verb", ["filter", "bind"])
def test_a_kept_connection_idle_after_a_direct_answer_is_closed_at_its_deadline(
    verb: str, monkeypatch: pytest.MonkeyPatch, asgi_calls: list[str]
) -> None:
    """After a direct answer the connection stays open for the next request, and is closed
    once it has been idle for the keep-alive time, as after an ASGI answer."""
    monkeypatch.setattr(limits, "KEEPALIVE_TIMEOUT", 1.0)
    with FakeApiServer() as fake:
        populate(fake, NODES, gpus=2)
        with running(fake) as svc:
            fits = fake.create("pods", pod("kept", share(10, 10), uid="uid-kept"))
            first = (
                _request("/filter", _filter("kept"))
                if verb == "filter"
                else _request("/bind", json.dumps(bind_body(fits, NODES[0])).encode())
            )
            with _connect(svc) as sock:
                sock.settimeout(5)
                reader = Reader(sock)
                sock.sendall(first)
                assert reader.answer()[0] == 200
                sock.sendall(_request("/filter", _filter("next")))  # kept: answered
                assert reader.answer()[0] == 200
                opened = time.monotonic()
                assert reader.closed()  # by the server, idle past its deadline
                assert 0.5 < time.monotonic() - opened < 4
    assert asgi_calls == []
