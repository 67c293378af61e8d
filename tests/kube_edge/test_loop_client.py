"""kube_edge.loop_client over real sockets: the simulated API server (HTTP and mutual TLS)
for what KubeClient also does, answers the same and errors the same; a raw asyncio server
for the connection pool and for answers no API server should send (cut, malformed, too
large, none at all, arbitrary bytes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube_edge import config
from kube_edge.client import KubeClient, pod_path
from kube_edge.errors import NO_ANSWER, ApiError
from kube_edge.loop_client import MAX_HEADER_BYTES, LoopClient
from tessera_testbed.apiserver import FakeApiServer, write_kubeconfig
from tests.e2e.pki import Authority
from tests.kube_edge.helpers import StubServer

T = TypeVar("T")
OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{"a": 1}'


_loop_factory: list[Callable[[], asyncio.AbstractEventLoop]] = [asyncio.new_event_loop]


@pytest.fixture(autouse=True, params=["asyncio", "uvloop"])
def loop_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test on both loops: asyncio's, and uvloop's, which the scheduler serves on."""
    _loop_factory[0] = (
        uvloop.new_event_loop if request.param == "uvloop" else asyncio.new_event_loop
    )
    yield request.param
    _loop_factory[0] = asyncio.new_event_loop


def _run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    with asyncio.Runner(loop_factory=_loop_factory[0]) as runner:
        return runner.run(main())


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def _loop_client(client: KubeClient, pool_size: int = 16) -> LoopClient:
    loop_client = LoopClient.of(client, pool_size=pool_size)
    assert loop_client is not None
    return loop_client


def _errors_of(error: ApiError) -> tuple[int, str, str, dict[str, Any], str]:
    return error.status, error.reason, error.message, error.body, str(error)


# --- against the simulated API server ---------------------------------------------------------


def test_create_and_get_round_trip(fake: FakeApiServer) -> None:
    api = _loop_client(KubeClient.for_host(fake.url, timeout=5))

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        created = await api.create(pod_path("default"), _pod("p"))
        got = await api.get(pod_path("default", "p"))
        await api.close()
        return created, got

    created, got = _run(main())
    assert created["metadata"]["name"] == "p" and created["metadata"]["uid"]
    assert got == created == fake.get("pods", "p", "default")


def test_the_same_request_and_headers_as_kube_client(server: StubServer, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    client = KubeClient.connect(write_kubeconfig(tmp_path / "kc", url, token="s3cret"), timeout=5)
    server.answers["/api/v1/namespaces/default/pods"] = (201, b'{"metadata": {"name": "p"}}')
    assert client.create(pod_path("default"), _pod("p")) == {"metadata": {"name": "p"}}
    api = _loop_client(client)
    assert _run(api.create(pod_path("default"), _pod("p"))) == {"metadata": {"name": "p"}}
    (method, path, headers, body), (method2, path2, headers2, body2) = server.seen
    assert (
        (method2, path2, json.loads(body2))
        == (method, path, json.loads(body))
        == (
            "POST",
            "/api/v1/namespaces/default/pods",
            _pod("p"),
        )
    )
    assert headers2["authorization"] == "Bearer s3cret"
    assert headers2 == headers


def test_a_401_on_the_loop_makes_the_next_request_refresh_the_credentials(
    server: StubServer, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    client = KubeClient.connect(write_kubeconfig(tmp_path / "kc", url, token="s3cret"), timeout=5)
    calls: list[int] = []

    def hook(configuration: object) -> None:
        calls.append(1)
        client.configuration.api_key["BearerToken"] = f"Bearer t{len(calls)}"

    client.configuration.refresh_api_key_hook = hook
    server.answers["/api/v1/namespaces/default/pods/p"] = (200, b"{}")
    server.answers["/api/v1/namespaces/default/pods/q"] = (401, b'{"kind": "Status"}')
    api = _loop_client(client)

    async def main() -> int:
        await api.get(pod_path("default", "p"))
        with pytest.raises(ApiError) as denied:
            await api.get(pod_path("default", "q"))
        await api.get(pod_path("default", "p"))
        await api.close()
        return denied.value.status

    assert _run(main()) == 401
    tokens = [headers["authorization"] for _, _, headers, _ in server.seen]
    assert tokens == ["Bearer t1", "Bearer t1", "Bearer t2"]


def test_errors_read_as_kube_clients_do(fake: FakeApiServer) -> None:
    client = KubeClient.for_host(fake.url, timeout=5)
    api = _loop_client(client)
    client.create(pod_path("default"), _pod("p"))
    cases: list[tuple[str, str, Any]] = [
        ("GET", pod_path("default", "missing"), None),  # 404 NotFound
        ("POST", pod_path("default"), _pod("p")),  # 409 AlreadyExists
        ("POST", pod_path("default"), {"kind": "Pod"}),  # 4xx: no name
        ("GET", "/no/such/api", None),
        ("GET", pod_path("default", "p"), None),  # 500, the fault below
    ]
    fake.fail("/pods/p", method="GET", status=500, times=2)

    async def main() -> None:
        for method, path, body in cases:
            with pytest.raises(ApiError) as theirs:
                client.request(method, path, body)
            with pytest.raises(ApiError) as ours:
                await api.request(method, path, body)
            assert _errors_of(ours.value) == _errors_of(theirs.value)
            assert ours.value.status >= 400
        await api.close()

    _run(main())


def test_mutual_tls_with_the_ca_verified(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "pki", "ca")
    serving = ca.issue("apiserver", "localhost", server=True)
    user = ca.issue("user", "tessera")
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(serving.cert, serving.key)
    tls.load_verify_locations(ca.path)
    tls.verify_mode = ssl.CERT_REQUIRED  # a client certificate signed by the CA
    other = Authority(tmp_path / "other", "other")

    def client(ca_file: Path, with_cert: bool = True) -> LoopClient:
        cluster = config.for_host(
            fake.url,
            ca_file=str(ca_file),
            cert_file=str(user.cert) if with_cert else None,
            key_file=str(user.key) if with_cert else None,
        )
        return _loop_client(KubeClient(cluster, timeout=5))

    async def fails(api: LoopClient) -> ApiError:
        with pytest.raises(ApiError) as failed:
            await api.get(pod_path("default", "p"))
        return failed.value

    with FakeApiServer(tls=tls) as fake:
        fake.create("pods", _pod("p"))

        async def main() -> None:
            api = client(ca.path)
            for _ in range(3):
                assert (await api.get(pod_path("default", "p")))["metadata"]["name"] == "p"
            await api.close()
            wrong_ca = await fails(client(other.path))
            assert wrong_ca.status == NO_ANSWER and "certificate verify failed" in wrong_ca.message
            no_cert = await fails(client(ca.path, with_cert=False))
            assert no_cert.status == NO_ANSWER and no_cert.transient

        _run(main())
        # the same server name check as urllib3's: 127.0.0.1 is in the certificate, this is not
        cluster = config.for_host(
            fake.url, ca_file=str(ca.path), cert_file=str(user.cert), key_file=str(user.key)
        )
        conf = cluster.configuration
        conf.tls_server_name = "apiserver.example"

        async def name_checks() -> None:
            with pytest.raises(ApiError, match="certificate verify failed"):
                await _loop_client(KubeClient(cluster, timeout=5)).get(pod_path("default", "p"))
            conf.assert_hostname = False
            api = _loop_client(KubeClient(cluster, timeout=5))
            assert await api.get(pod_path("default", "p"))
            await api.close()
            conf.verify_ssl, conf.ssl_ca_cert = False, str(other.path)
            api = _loop_client(KubeClient(cluster, timeout=5))
            assert await api.get(pod_path("default", "p"))
            await api.close()

        _run(name_checks())


def test_no_loop_client_through_a_proxy_or_for_another_scheme() -> None:
    client = KubeClient.for_host("http://127.0.0.1:6443")
    assert LoopClient.of(client) is not None
    client.configuration.proxy = "http://proxy.example:3128"
    assert LoopClient.of(client) is None
    client.configuration.no_proxy = "localhost,127.0.0.0/8"
    assert LoopClient.of(client) is not None  # the proxy is bypassed for this host
    assert LoopClient.of(KubeClient.for_host("unix:///run/apiserver.sock")) is None
    assert LoopClient.of(KubeClient.for_host("https://127.0.0.1:notaport")) is None


def test_an_unreachable_server_is_no_answer() -> None:
    api = _loop_client(KubeClient.for_host("http://127.0.0.1:1", timeout=2))
    with pytest.raises(ApiError) as failed:
        _run(api.create("/api/v1/namespaces/default/pods", _pod("p")))
    assert failed.value.status == NO_ANSWER and failed.value.transient
    assert failed.value.message.startswith("cannot reach the API server: POST /api/v1/")


# --- against a raw server ---------------------------------------------------------------------

Reply = Callable[[bytes], Sequence[bytes]]


class Raw:
    """An HTTP server on the test's event loop that writes, for each request it reads, the
    parts `reply` returns (each in its own write); it counts connections."""

    def __init__(self, reply: Reply, *, close_after: bool = False, delay: float = 0.0) -> None:
        self.reply, self.close_after, self.delay = reply, close_after, delay
        self.accepted = self.open = self.peak = 0
        self.requests: list[bytes] = []
        self.port = 0
        self._clients: list[LoopClient] = []

    async def __aenter__(self) -> Raw:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for api in self._clients:
            await api.close()
        self._server.close()
        await self._server.wait_closed()
        await asyncio.sleep(0.01)  # the handlers see their connections end

    def client(self, timeout: float = 5.0, pool_size: int = 16) -> LoopClient:
        """A client of this server, closed with it."""
        url = f"http://127.0.0.1:{self.port}"
        self._clients.append(_loop_client(KubeClient.for_host(url, timeout=timeout), pool_size))
        return self._clients[-1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open += 1
        self.peak = max(self.peak, self.open)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                if self.delay:
                    await asyncio.sleep(self.delay)
                for part in self.reply(request):
                    writer.write(part)
                    await writer.drain()
                    await asyncio.sleep(0)
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


def _answer(body: bytes, status: str = "200 OK", headers: bytes = b"") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n".encode() + headers
    return head + b"\r\n" + body


def _always(parts: list[bytes]) -> Reply:
    return lambda request: parts


def _chunked(*chunks: bytes) -> list[bytes]:
    parts = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"]
    parts += [b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks]
    return [*parts, b"0\r\n\r\n"]


def test_one_connection_carries_sequential_requests() -> None:
    async def main() -> None:
        async with Raw(lambda request: [OK]) as raw:
            api = raw.client()
            for i in range(20):
                method = "POST" if i % 2 else "GET"
                assert await api.request(method, "/x", {"i": i}) == {"a": 1}
            assert raw.accepted == 1
            # each request one write, body after the headers
            assert raw.requests[1].endswith(b'\r\n\r\n{"i":1}')
            assert b"\r\nContent-Length: 7\r\n" in raw.requests[1]

    _run(main())


def test_concurrent_requests_stay_within_the_pool() -> None:
    async def main() -> None:
        async with Raw(lambda request: [OK], delay=0.01) as raw:
            api = raw.client(pool_size=4)
            answers = await asyncio.gather(*(api.get("/x") for _ in range(50)))
            assert answers == [{"a": 1}] * 50
            assert raw.peak == 4 and raw.accepted == 4  # all 4 reused, none opened twice

    _run(main())


def test_connections_the_server_closed_while_idle_are_not_used() -> None:
    async def main() -> None:
        async with Raw(lambda request: [OK], close_after=True) as raw:
            api = raw.client()
            assert await api.get("/x") == {"a": 1}
            await asyncio.sleep(0.05)  # the loop sees the close
            assert await api.create("/x", {}) == {"a": 1}
            assert raw.accepted == 2

    _run(main())


def test_a_close_the_loop_has_not_yet_seen_is_seen_before_reuse() -> None:
    """The server (in a thread of its own) answers keep-alive, then closes; the loop is
    blocked while the close arrives, so only the socket itself can tell."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                accepted.append(1)
                with conn:
                    data = b""
                    while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                        data += chunk
                    conn.sendall(OK)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    api = _loop_client(KubeClient.for_host(url, timeout=5))

    async def main() -> None:
        assert await api.get("/x") == {"a": 1}
        time.sleep(0.1)  # the close arrives, the loop does not run
        assert await api.create("/x", {}) == {"a": 1}  # a POST: never sent twice
        await api.close()

    try:
        _run(main())
        assert len(accepted) == 2
    finally:
        listener.close()


def test_connections_the_server_asks_to_close_are_not_kept() -> None:
    """The server leaves each connection open: only the client's judgement opens a second."""
    replies = [
        [_answer(b"{}", headers=b"Connection: close\r\n")],
        [b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}"],
        [OK + b"HTTP/1.1 200 OK\r\n"],  # more than was asked for
        [OK, b"HTTP/1.1 200 OK\r\n"],
    ]

    async def main() -> None:
        for reply in replies:
            async with Raw(_always(reply)) as raw:
                api = raw.client()
                assert await api.get("/x") in ({}, {"a": 1})
                await asyncio.sleep(0.01)
                assert await api.get("/x") in ({}, {"a": 1})
                assert raw.accepted == 2, reply
        # a body without a length ends with the connection
        async with Raw(
            lambda request: [b"HTTP/1.1 200 OK\r\n\r\n{", b'"a": 1}'], close_after=True
        ) as raw:
            api = raw.client()
            assert await api.get("/x") == {"a": 1}
            assert await api.get("/x") == {"a": 1}
            assert raw.accepted == 2

    _run(main())


def test_chunked_answers_are_read_across_writes() -> None:
    async def main() -> None:
        async with Raw(lambda request: _chunked(b'{"items": [', b"1, 2", b", 3]}")) as raw:
            api = raw.client()
            assert await api.get("/x") == {"items": [1, 2, 3]}
            assert await api.get("/x") == {"items": [1, 2, 3]}
            assert raw.accepted == 1

    _run(main())


def test_answers_over_max_bytes_are_refused_keeping_the_status() -> None:
    async def main() -> None:
        # stated up front: refused at the headers, without waiting for a body never sent
        stated = [b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n{"]
        async with Raw(lambda request: stated) as raw:
            start = time.monotonic()
            with pytest.raises(ApiError, match="too large") as failed:
                await raw.client(timeout=10).get("/x")
            assert failed.value.status == 200 and time.monotonic() - start < 5
        async with Raw(lambda request: _chunked(b"[" + b"1," * 600, b"1]")) as raw:
            with pytest.raises(ApiError, match=r"too large \(over 1000 bytes\)"):
                await raw.client().request("GET", "/x", max_bytes=1000)
            assert await raw.client().request("GET", "/x", max_bytes=2000) is not None
        async with Raw(lambda request: [_answer(b"x" * 2000, "404 Not Found")]) as raw:
            with pytest.raises(ApiError, match="too large") as failed:
                await raw.client().request("GET", "/x", max_bytes=1000)
            assert failed.value.status == 404

    _run(main())


def test_headers_over_64_kib_are_refused() -> None:
    filler = b"X-Filler: " + b"x" * 1000 + b"\r\n"
    head = b"HTTP/1.1 200 OK\r\n" + filler * (MAX_HEADER_BYTES // len(filler) + 1)

    async def main() -> None:
        async with Raw(lambda request: [head, b"Content-Length: 2\r\n\r\n{}"]) as raw:
            with pytest.raises(ApiError, match="headers over") as failed:
                await raw.client().get("/x")
            assert failed.value.status == NO_ANSWER

    _run(main())


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        ([b"HTTP/1.1 abc OK\r\n\r\n"], "malformed answer"),
        ([b"SSH-2.0-OpenSSH_9.6\r\n"], "malformed answer"),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"], "malformed"),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{", b'"a":'], "closed the connection"),
        ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{}"], "closed the"),
        ([b"HTTP/1.1 200 OK\r\nContent-Le"], "closed the connection"),
        ([], "closed the connection"),
    ],
)
def test_cut_or_malformed_answers_are_no_answer(reply: list[bytes], match: str) -> None:
    async def main() -> None:
        async with Raw(lambda request: reply, close_after=True) as raw:
            with pytest.raises(ApiError, match=match) as failed:
                await raw.client().create("/x", {})
            assert failed.value.status == NO_ANSWER and failed.value.transient
            assert failed.value.message.startswith("cannot reach the API server: POST /x: ")

    _run(main())


def test_unreadable_json_in_a_success_is_an_unreadable_answer() -> None:
    async def main() -> None:
        async with Raw(lambda request: [_answer(b"{not json")]) as raw:
            with pytest.raises(ApiError) as failed:
                await raw.client().get("/x")
            assert (failed.value.status, failed.value.reason) == (NO_ANSWER, "UnreadableAnswer")
        async with Raw(lambda request: [_answer(b"[" * 100 + b"]" * 100)]) as raw:
            with pytest.raises(ApiError, match="unreadable answer"):
                await raw.client().get("/x")  # deeper than the client's max_depth
        async with Raw(lambda request: [_answer(b"")]) as raw:
            assert await raw.client().request("GET", "/x") is None
            assert await raw.client().get("/x") == {}

    _run(main())


def test_a_server_that_never_answers_is_no_answer_after_the_timeout() -> None:
    async def main() -> None:
        async with Raw(lambda request: [b"HTTP/1.1 200 OK\r\n"]) as raw:
            start = time.monotonic()
            with pytest.raises(ApiError, match=r"no answer within 0\.3 s") as failed:
                await raw.client(timeout=0.3).create("/x", {})
            assert failed.value.status == NO_ANSWER
            assert 0.3 <= time.monotonic() - start < 3

    _run(main())


def test_a_cancelled_request_leaves_no_half_read_connection() -> None:
    def reply(request: bytes) -> list[bytes]:
        if b"/slow " in request:
            return [b'HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n{"late"']
        return [OK]

    async def main() -> None:
        async with Raw(reply) as raw:
            api = raw.client()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(api.get("/slow"), 0.2)
            assert await api.get("/x") == {"a": 1}  # not the rest of the slow answer
            assert raw.accepted == 2

    _run(main())


def test_bytes_that_end_a_line_never_reach_the_server() -> None:
    async def main() -> None:
        async with Raw(lambda request: [OK]) as raw:
            api = raw.client()
            for path in ("/x HTTP/1.1\r\nX-Evil: 1", "/x\n", "/a b", "/é"):
                with pytest.raises(ApiError) as failed:
                    await api.get(path)
                assert failed.value.status == NO_ANSWER
            api.client.configuration.api_key["authorization"] = "Bearer t\r\nX-Evil: 1"
            with pytest.raises(ApiError, match="cannot be sent"):
                await api.get("/x")
            assert raw.requests == []

    _run(main())


# --- whatever the server sends ------------------------------------------------------------------

_VALID = st.sampled_from(
    [
        OK,
        _answer(b'{"kind": "Status", "reason": "NotFound"}', "404 Not Found"),
        b"".join(_chunked(b'{"a":', b" [1, 2]}")),
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.0 200 OK\r\n\r\n{}",
    ]
)


@st.composite
def _replies(draw: st.DrawFn) -> tuple[list[bytes], bool]:
    """A server's answer: valid, cut, spliced with arbitrary bytes or only arbitrary bytes;
    split anywhere into writes; the connection closed after it or left open."""
    data = draw(
        st.one_of(
            st.binary(max_size=300),
            _VALID,
            st.tuples(_VALID, st.integers(0, 200), st.binary(max_size=40)).map(
                lambda v: v[0][: v[1]] + v[2] + v[0][v[1] :]
            ),
            st.tuples(_VALID, st.integers(0, 200)).map(lambda v: v[0][: v[1]]),
        )
    )
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
    parts = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    return [part for part in parts if part], draw(st.booleans())


@settings(
    max_examples=60,
    deadline=None,
    # the function-scoped fixture only picks the event loop
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(reply=_replies())
def test_any_answer_is_a_value_or_an_api_error_within_the_timeout(
    reply: tuple[list[bytes], bool],
) -> None:
    parts, close_after = reply
    timeout = 0.2

    async def main() -> None:
        async with Raw(lambda request: parts, close_after=close_after) as raw:
            api = raw.client(timeout=timeout, pool_size=1)
            for _ in range(2):  # the second on whatever the first left in the pool
                start = time.monotonic()
                with contextlib.suppress(ApiError):  # anything else fails the test
                    await api.create("/x", {"a": 1})
                assert time.monotonic() - start < timeout + 1.0
            await api.close()

    _run(main())
