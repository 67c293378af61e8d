"""The extender's HTTP edge against hostile clients, over real sockets to the real server:
client input gets 200 or a 4xx with a reason (never 5xx), bodies over the limit are refused
before they are read, slow and numerous clients neither block others nor grow memory
without bound, health and metrics live on their own port, /debug needs a certificate or a
bearer token allowed by RBAC."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.surface_extender import (
    HOSTILE,
    replace_at,
    rss_growth_under_slow_clients,
    seed_bodies,
    well_formed,
)
from scheduler_plugin.decisions.binder import BindArgs
from scheduler_plugin.service import Service
from scheduler_plugin.serving import limits
from scheduler_plugin.serving.protocol import BoundedProtocol
from scheduler_plugin.serving.server import tls_context
from tessera import resources as rn
from tessera_testbed.apiserver import FakeApiServer
from tests.scheduler.helpers import Http, pod, populate, running, running_nodes, share, start

NODES = ["peer-node-0", "peer-node-1", "peer-node-2"]


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    with running_nodes(NODES, gpus=2) as svc:
        yield svc


def _filter(**extra: object) -> dict[str, Any]:
    return {"Pod": pod("p", share(10, 10), uid="u"), "Nodes": None, "NodeNames": NODES} | extra


MALFORMED: dict[str, tuple[str, str | bytes]] = {
    "deep arrays": ("filter", b"[" * 100_000 + b"]" * 100_000),
    "deep objects": ("filter", b'{"Pod":' * 5_000 + b"{}" + b"}" * 5_000),
    "huge integer": ("prioritize", b'{"Pod":{},"NodeNames":[],"x":' + b"9" * 5000 + b"}"),
    "NaN": ("filter", b'{"Pod":{},"NodeNames":NaN}'),
    "Nodes a list": ("filter", json.dumps(_filter(Nodes=[1], NodeNames=None)).encode()),
    "Nodes.items metadata a number": (
        "prioritize",
        json.dumps(_filter(Nodes={"items": [{"metadata": 5}]}, NodeNames=None)).encode(),
    ),
    "Nodes.items strings": (
        "filter",
        json.dumps(_filter(Nodes={"items": ["x"]}, NodeNames=None)).encode(),
    ),
    "victims a string": (
        "preempt",
        json.dumps({"Pod": pod("p"), "NodeNameToMetaVictims": {"n": "x"}}).encode(),
    ),
    "victim metadata a list": (
        "preempt",
        json.dumps({"Pod": pod("p"), "NodeNameToVictims": {"n": {"Pods": [{"metadata": []}]}}}),
    ),
    "not UTF-8": ("filter", b'{"Pod":"\xff\xfe"}'),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_requests_get_400_with_a_reason(service: Service, name: str) -> None:
    verb, body = MALFORMED[name]
    status, data = Http(service.server.port).post_raw(
        f"/{verb}", body if isinstance(body, bytes) else body.encode()
    )
    assert status == 400, (status, data[:300])
    assert json.loads(data)["Error"].startswith("tessera: bad ")


@pytest.mark.parametrize("verb", ["filter", "prioritize", "preempt"])
def test_huge_exponents_anywhere_get_a_well_formed_answer(service: Service, verb: str) -> None:
    doc = _filter(Pod=pod("p", share(10, 10), uid="u"))
    doc["Pod"]["spec"]["priority"] = 0
    body = json.dumps(doc).replace('"priority": 0', '"priority": 1e999999').encode()
    status, data = Http(service.server.port).post_raw(f"/{verb}", body)
    assert status in (200, 400) and well_formed(verb, status, data), data[:300]


def test_bind_names_that_cannot_name_objects_are_refused_in_the_reply(service: Service) -> None:
    h = Http(service.server.port)
    for field, value in (("PodNamespace", "\ud800"), ("PodName", "a/b"), ("Node", "x" * 300)):
        body = BindArgs("p", "default", "u", NODES[0]).to_json()
        status, reply = h.post("/bind", body | {field: value})
        assert status == 200 and f"{field} " in reply["Error"], reply


_NAME = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", fullmatch=True)


@given(_NAME, _NAME, st.from_regex(r"[!-~]{1,40}", fullmatch=True), _NAME)
def test_bind_args_read_back_what_they_write(name: str, ns: str, uid: str, node: str) -> None:
    args = BindArgs(name, ns, uid, node)
    body = args.to_json()
    assert set(body) == {"PodName", "PodNamespace", "PodUID", "Node"}  # kube-scheduler's keys
    assert BindArgs.parse(json.loads(json.dumps(body))) == args


def test_a_pod_that_breaks_a_request_rule_is_a_filter_answer(service: Service) -> None:
    body = _filter(Pod=pod("p", {rn.GPU_CORE: 10, rn.GPU_MEMORY: "1e999999"}, uid="u"))
    status, reply = Http(service.server.port).post("/filter", body)
    assert status == 200 and reply["NodeNames"] == []
    reasons = reply["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(NODES) and "invalid device request" in reasons[NODES[0]]


def _raw(port: int, head: bytes, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(head)
    return sock


def _read_reply(sock: socket.socket) -> bytes:
    """Everything up to the server's close (or the timeout); the socket is closed after."""
    data = b""
    with sock:
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return data


def test_oversized_bodies_are_refused_before_they_are_read() -> None:
    with FakeApiServer() as fake, running(fake, max_body=64 * 1024) as svc:
        # the headers announce 100 MB and no body byte is sent: the answer comes anyway
        sock = _raw(
            svc.server.port,
            b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n",
        )
        reply = _read_reply(sock)
        assert reply.startswith(b"HTTP/1.1 413") and b"over 65536" in reply
        # chunked: refused once the chunks pass the limit, long before the client is done
        sock = _raw(svc.server.port, b"POST /filter HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        with pytest.raises(OSError):
            for _ in range(10_000):
                sock.sendall(b"10000\r\n" + b"x" * 0x10000 + b"\r\n")
        assert _read_reply(sock).startswith(b"HTTP/1.1 413")
        assert Http(svc.server.port).post("/filter", {"Pod": pod("p"), "NodeNames": []})[0] == 200


def test_slow_clients_do_not_block_others_and_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BoundedProtocol, "header_timeout", 0.5)
    monkeypatch.setattr(limits, "BODY_TIMEOUT", 0.5)
    with FakeApiServer() as fake, running(fake) as svc:
        slow = [_raw(svc.server.port, b"POST /filter HTTP/1.1\r\nHost: x\r\n") for _ in range(50)]
        stalled_body = _raw(
            svc.server.port, b"POST /filter HTTP/1.1\r\nContent-Length: 100\r\n\r\n{"
        )
        h = Http(svc.server.port)
        assert h.post("/filter", {"Pod": pod("p"), "NodeNames": []})[0] == 200
        for sock in slow:  # headers not done within the deadline: closed without a word
            assert _read_reply(sock) == b""
        assert _read_reply(stalled_body).startswith(b"HTTP/1.1 408")
        assert h.get("/healthz")[0] == 200


def test_connections_past_the_cap_are_closed_and_others_still_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(BoundedProtocol, "max_connections", 8)
    with FakeApiServer() as fake, running(fake) as svc:
        port = svc.server.port
        held = [_raw(port, b"GET /healthz HTTP/1.1\r\n\r\n") for _ in range(8)]
        for sock in held:
            assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        extra = _raw(port, b"GET /healthz HTTP/1.1\r\n\r\n")
        assert _read_reply(extra) == b""
        held.pop().close()
        time.sleep(0.2)
        assert Http(port).get("/healthz")[0] == 200
        for sock in held:
            sock.close()


def test_memory_stays_bounded_under_100_oversized_or_slow_clients() -> None:
    """100 clients at once: half announce the largest allowed body and dribble it, half
    send bodies over the limit. Bodies wait for room in the byte budget before they are
    read, so the process grows by a bounded amount (the figure is in bench/)."""
    with FakeApiServer() as fake, running(fake) as svc:
        port = svc.server.port
        grown = rss_growth_under_slow_clients(port, svc.options.max_body) / 2**20
        assert grown < 200, f"RSS grew by {grown:.0f} MiB"
        assert Http(port).get("/healthz")[0] == 200


def test_health_port_serves_probes_and_metrics_and_nothing_else(service: Service) -> None:
    assert service.health_server is not None
    h = Http(service.health_server.port)
    assert h.get("/healthz") == (200, b"ok\n")
    assert h.get("/readyz") == (200, b"ok\n")
    status, text = h.get("/metrics")
    assert status == 200 and b"tessera_" in text
    assert h.get("/debug/nodes")[0] == 404
    status, _ = Http(service.health_server.port).post_raw("/filter", json.dumps(_filter()).encode())
    assert status == 404


def test_debug_needs_a_bearer_token_that_rbac_allows() -> None:
    with FakeApiServer() as fake:
        populate(fake, ["n"], gpus=1)
        fake.tokens["good"] = {"username": "alice", "groups": ["ops"]}
        fake.tokens["other"] = {"username": "bob"}
        fake.grants.add(("group:ops", "get", "/debug/*"))
        svc = start(fake, open_debug=False)
        try:
            assert svc.wait_ready()
            port = svc.server.port

            def get(path: str, token: str | None) -> int:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                try:
                    conn.request("GET", path, headers=headers)
                    resp = conn.getresponse()
                    resp.read()
                    return resp.status
                finally:
                    conn.close()

            assert get("/debug/nodes", None) == 401
            assert get("/debug/nodes", "forged") == 403
            assert get("/debug/nodes", "other") == 403
            assert get("/debug/nodes", "good") == 200
            reviews = len(fake.writes("POST", "/apis/authentication.k8s.io/v1/tokenreviews"))
            assert get("/debug/nodes", "good") == 200  # answered from the cache
            assert (
                len(fake.writes("POST", "/apis/authentication.k8s.io/v1/tokenreviews")) == reviews
            )
            # the verbs on a loopback port without TLS need no token (nothing else reaches it)
            assert Http(port).post("/filter", {"Pod": pod("p"), "NodeNames": ["n"]})[0] == 200
        finally:
            svc.stop()


# --- hypothesis: kube-scheduler's requests, each with one subtree made hostile ------------------

_SEEDS = seed_bodies()
_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def hostile_requests(draw: st.DrawFn) -> tuple[str, bytes]:
    verb, body = draw(st.sampled_from(_SEEDS))
    doc = json.loads(body)
    paths: list[tuple[str | int, ...]] = []
    stack: list[tuple[object, tuple[str | int, ...]]] = [(doc, ())]
    while stack:
        node, path = stack.pop()
        paths.append(path)
        if isinstance(node, dict):
            stack += [(v, (*path, k)) for k, v in node.items()]
        elif isinstance(node, list):
            stack += [(v, (*path, i)) for i, v in enumerate(node)]
    path = draw(st.sampled_from(sorted(paths, key=repr)))
    value = draw(st.sampled_from(HOSTILE) | _json_values)
    return verb, json.dumps(replace_at(doc, path, value)).encode()


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(request=hostile_requests())
def test_hostile_extender_bodies_get_a_well_formed_answer_over_http(
    service: Service, request: tuple[str, bytes]
) -> None:
    verb, body = request
    status, data = Http(service.server.port).post_raw(f"/tessera/{verb}", body)
    assert status < 500 and well_formed(verb, status, data), (status, data[:300])


@pytest.fixture(scope="module")
def tls_service(pki: Path) -> Iterator[Service]:
    with FakeApiServer() as fake:
        populate(fake, NODES, gpus=2)
        tls = tls_context(str(pki / "server.crt"), str(pki / "server.key"), str(pki / "ca.crt"))
        with running(fake, tls, open_debug=False) as svc:
            yield svc


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(request=hostile_requests())
def test_hostile_extender_bodies_get_a_well_formed_answer_over_mutual_tls(
    tls_service: Service, pki: Path, request: tuple[str, bytes]
) -> None:
    verb, body = request
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    conn = http.client.HTTPSConnection(
        "127.0.0.1", tls_service.server.port, context=ctx, timeout=20
    )
    conn.request("POST", f"/tessera/{verb}", body=body)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    assert resp.status < 500 and well_formed(verb, resp.status, data), (resp.status, data[:300])


def test_body_budget_makes_bodies_wait_for_room_and_gives_up_at_the_deadline() -> None:
    from scheduler_plugin.serving.app import ByteBudget

    async def scenario() -> list[str]:
        budget = ByteBudget(10)
        seen: list[str] = []
        await budget.acquire(6, 1.0)

        async def second() -> None:
            await budget.acquire(6, 5.0)
            seen.append("second in")

        task = asyncio.create_task(second())
        await asyncio.sleep(0.05)
        seen.append(f"waiting, free {budget.free}")
        budget.release(6)
        await task
        with pytest.raises(TimeoutError):
            await budget.acquire(6, 0.05)
        seen.append(f"timed out, free {budget.free}")
        budget.release(6)
        seen.append(f"free {budget.free}")
        return seen

    assert asyncio.run(scenario()) == [
        "waiting, free 4",
        "second in",
        "timed out, free 4",
        "free 10",
    ]
