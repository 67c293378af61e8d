"""HTTP/2 on the extender's TLS port: what kube-scheduler's client negotiates by ALPN.

A real HTTP/2 client (the h2 library on a TLS socket, and curl's nghttp2 where installed)
against the started extender: the verbs answer as over HTTP/1.1, calls share one
connection, bodies larger than a flow-control window arrive, the client certificate still
gates the verbs, and hostile clients (protocol garbage, reset floods, oversized headers,
clients that never send a request) lose their connection only.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import hpack
import hyperframe.frame
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from uvicorn.server import ServerState

from scheduler_plugin.service import Service
from scheduler_plugin.serving import http2, limits
from scheduler_plugin.serving.server import tls_context
from scheduler_plugin.views.metrics import sample
from tessera_testbed.apiserver import FakeApiServer
from tests.scheduler.helpers import pod, populate, running, share, start


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        populate(server, ["n"], gpus=1)
        yield server


@pytest.fixture
def served(fake: FakeApiServer, pki: Path) -> Iterator[Service]:
    tls = tls_context(
        str(pki / "server.crt"), str(pki / "server.key"), str(pki / "ca.crt"), http2=True
    )
    with running(fake, tls, open_debug=False) as service:
        yield service


def client_context(
    pki: Path, *, cert: bool = True, alpn: list[str] | None = None
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    ctx.set_alpn_protocols(alpn or ["h2", "http/1.1"])
    return ctx


class H2Client:
    """A blocking HTTP/2 client on one TLS connection."""

    def __init__(self, port: int, ctx: ssl.SSLContext) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock = ctx.wrap_socket(raw, server_hostname="localhost")
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.answers: dict[int, dict[str, Any]] = {}
        self.closed_by_server: int | None = None

    @property
    def alpn(self) -> str | None:
        return self.sock.selected_alpn_protocol()

    def start(
        self, method: str, path: str, body: bytes = b"", *, end: bool = True, length: int = -1
    ) -> int:
        sid = self.conn.get_next_available_stream_id()
        headers = [
            (":method", method),
            (":path", path),
            (":scheme", "https"),
            (":authority", "localhost"),
            ("content-type", "application/json"),
        ]
        if method == "POST":
            headers.append(("content-length", str(len(body) if length < 0 else length)))
        self.conn.send_headers(sid, headers, end_stream=method != "POST" and end)
        self.answers[sid] = {"status": None, "body": b"", "done": False, "headers": {}}
        if method == "POST":
            self.send_body(sid, body, end=end)
        self.flush()
        return sid

    def send_body(self, sid: int, body: bytes, *, end: bool) -> None:
        """Send `body`, waiting for window like a real client."""
        if end and not body:
            self.conn.end_stream(sid)
        while body:
            window = min(
                self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size
            )
            if window <= 0:
                self.flush()
                self.pump()
                continue
            chunk, body = body[:window], body[window:]
            self.conn.send_data(sid, chunk, end_stream=end and not body)
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self) -> bool:
        """Read once and handle what came; False when the server closed the connection."""
        data = self.sock.recv(65536)
        if not data:
            return False
        for ev in self.conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                headers = {bytes(k): bytes(v) for k, v in ev.headers or ()}
                answer = self.answers[ev.stream_id]
                answer["status"] = int(headers[b":status"])
                answer["headers"] = headers
            elif isinstance(ev, h2.events.DataReceived):
                self.answers[ev.stream_id]["body"] += ev.data
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded | h2.events.StreamReset):
                self.answers[ev.stream_id]["done"] = True
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.closed_by_server = int(ev.error_code or 0)
        self.flush()
        return True

    def wait(self, *sids: int, timeout: float = 10) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while not all(self.answers[s]["done"] for s in sids):
            assert time.monotonic() < deadline, "no answer in time"
            if not self.pump():
                break
        return [self.answers[s] for s in sids]

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = b"" if body is None else json.dumps(body).encode()
        (answer,) = self.wait(self.start(method, path, data))
        return answer["status"], answer["body"]

    def until_closed(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if not self.pump():
                    return
            except (ConnectionError, ssl.SSLError, h2.exceptions.ProtocolError):
                return
        raise AssertionError("the server kept the connection open")

    def close(self) -> None:
        self.sock.close()


def filter_body(names: list[str]) -> dict[str, Any]:
    return {"Pod": pod("p", share(10, 10), uid="u"), "Nodes": None, "NodeNames": names}


def test_the_verbs_answer_over_http2_as_over_http11(served: Service, pki: Path) -> None:
    client = H2Client(served.server.port, client_context(pki))
    try:
        assert client.alpn == "h2"
        status, body = client.request("POST", "/filter", filter_body(["n"]))
        assert status == 200 and json.loads(body)["NodeNames"] == ["n"]
        assert client.request("GET", "/healthz") == (200, b"ok\n")
        status, body = client.request("POST", "/filter", ["not", "ExtenderArgs"])
        assert status == 400 and "JSON object" in json.loads(body)["Error"]
        assert client.request("POST", "/nonsense", {})[0] == 404
        # the same answers over HTTP/1.1 to a client that offers only it
        h1 = client_context(pki, alpn=["http/1.1"])
        with (
            socket.create_connection(("127.0.0.1", served.server.port)) as raw,
            h1.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            assert tls.selected_alpn_protocol() == "http/1.1"
    finally:
        client.close()


def test_many_calls_share_one_connection_at_once(served: Service, pki: Path) -> None:
    client = H2Client(served.server.port, client_context(pki))
    try:
        sids = [
            client.start("POST", "/filter", json.dumps(filter_body(["n"])).encode())
            for _ in range(20)
        ]
        sids += [client.start("GET", "/readyz") for _ in range(5)]
        answers = client.wait(*sids)
        assert [a["status"] for a in answers] == [200] * 25
        assert all(json.loads(a["body"])["NodeNames"] == ["n"] for a in answers[:20])
        assert len(served.server._server.server_state.connections) == 1
        assert served.metrics is not None
        assert (
            sample(served.metrics, "tessera_scheduler_connections_total", {"protocol": "h2"}) == 1
        )
    finally:
        client.close()


def test_a_body_larger_than_the_window_arrives_in_pieces(served: Service, pki: Path) -> None:
    # 5,000 names: about 80 KB, more than the 64 KiB stream and connection windows
    names = ["n"] + [f"node-{i:05d}.example.internal" for i in range(5_000)]
    body = json.dumps(filter_body(names)).encode()
    assert len(body) > 2 * 65_535
    client = H2Client(served.server.port, client_context(pki))
    try:
        (answer,) = client.wait(client.start("POST", "/filter", body))
        assert answer["status"] == 200
        assert json.loads(answer["body"])["NodeNames"] == ["n"]
        # the connection is still good for the next call
        assert client.request("GET", "/healthz") == (200, b"ok\n")
    finally:
        client.close()


def test_padding_does_not_use_up_the_windows(served: Service, pki: Path) -> None:
    # padding counts against the flow-control windows but is never read: a body sent in
    # padded frames, with more padding than a whole window, still arrives
    body = json.dumps(filter_body(["n"])).encode()
    client = H2Client(served.server.port, client_context(pki))
    try:
        sid = client.start("POST", "/filter", b"", end=False, length=len(body))
        for at in range(len(body)):
            while client.conn.local_flow_control_window(sid) < 257:  # 1 + 255 + length byte
                client.flush()
                client.pump()
            end = at == len(body) - 1
            client.conn.send_data(sid, body[at : at + 1], end_stream=end, pad_length=255)
        client.flush()
        assert len(body) * 255 > 65_535  # more padding than the whole connection window
        (answer,) = client.wait(sid)
        assert answer["status"] == 200 and json.loads(answer["body"])["NodeNames"] == ["n"]
    finally:
        client.close()


def test_the_verbs_still_need_the_client_certificate(served: Service, pki: Path) -> None:
    client = H2Client(served.server.port, client_context(pki, cert=False))
    try:
        assert client.alpn == "h2"
        status, body = client.request("POST", "/filter", filter_body(["n"]))
        assert status == 403 and "client certificate" in json.loads(body)["Error"]
        assert client.request("GET", "/debug/nodes")[0] == 401
        assert client.request("GET", "/healthz")[0] == 200
    finally:
        client.close()


def test_an_oversized_body_is_refused_and_the_connection_survives(
    fake: FakeApiServer, pki: Path
) -> None:
    tls = tls_context(
        str(pki / "server.crt"), str(pki / "server.key"), str(pki / "ca.crt"), http2=True
    )
    with running(fake, tls, open_debug=False, max_body=2048) as service:
        client = H2Client(service.server.port, client_context(pki))
        try:
            status, body = client.request("POST", "/filter", {"x": "y" * 4096})
            assert status == 413 and "over 2048" in json.loads(body)["Error"]
            status, body = client.request("POST", "/filter", filter_body(["n"]))
            assert status == 200
        finally:
            client.close()


def test_a_debug_watch_stream_ends_when_its_reader_resets_it(served: Service, pki: Path) -> None:
    client = H2Client(served.server.port, client_context(pki))
    try:
        sid = client.start("GET", "/debug/watch")
        while not client.answers[sid]["body"].count(b"\n"):
            client.pump()
        first = json.loads(client.answers[sid]["body"].splitlines()[0])
        assert client.answers[sid]["status"] == 200 and first["type"] == "SYNC"
        client.conn.reset_stream(sid)
        client.flush()
        deadline = time.monotonic() + 10
        while served.views._feeds:  # the stream gave its slot back
            assert time.monotonic() < deadline, "the stream kept its slot"
            time.sleep(0.05)
        assert client.request("GET", "/healthz") == (200, b"ok\n")
    finally:
        client.close()


def test_curl_speaks_http2_to_the_extender(served: Service, pki: Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    body = json.dumps(filter_body(["n"]))
    out = subprocess.run(
        [
            "curl",
            "-sS",
            "--http2",
            "--cacert",
            str(pki / "ca.crt"),
            "--cert",
            str(pki / "client.crt"),
            "--key",
            str(pki / "client.key"),
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            body,
            "-w",
            "\\n%{http_version} %{http_code}",
            f"https://localhost:{served.server.port}/filter",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    answer, _, meta = out.rpartition("\n")
    assert meta == "2 200" and json.loads(answer)["NodeNames"] == ["n"]


def test_a_replica_that_does_not_answer_sends_its_client_elsewhere(
    fake: FakeApiServer, pki: Path
) -> None:
    # kube-scheduler keeps one HTTP/2 connection: a replica that is not (or no longer) the
    # leader must end it, so the next connection reaches the leader through the Service
    fake.fail("/pods", method="GET", status=500, times=10**6)
    tls = tls_context(
        str(pki / "server.crt"), str(pki / "server.key"), str(pki / "ca.crt"), http2=True
    )
    service = start(fake, tls, open_debug=False)
    try:
        client = H2Client(service.server.port, client_context(pki))
        try:
            body = json.dumps(filter_body(["n"])).encode()
            slow = client.start("POST", "/filter", body[:10], end=False, length=len(body))
            status, reply = client.request("POST", "/filter", filter_body(["n"]))
            assert status == 503 and "not the leader" in json.loads(reply)["Error"]
            (refused,) = client.wait(client.start("GET", "/healthz"))
            assert refused["done"] and refused["status"] is None  # REFUSED_STREAM: retry elsewhere
            client.send_body(slow, body[10:], end=True)
            assert client.wait(slow)[0]["status"] == 503  # the open stream is answered, then
            client.until_closed()
            assert client.closed_by_server == h2.errors.ErrorCodes.NO_ERROR
        finally:
            client.close()
        fake.clear_faults()
        assert service.wait_ready(15)
        again = H2Client(service.server.port, client_context(pki))
        try:
            assert again.request("POST", "/filter", filter_body(["n"]))[0] == 200
        finally:
            again.close()
    finally:
        service.stop()


def test_http2_is_offered_only_when_asked(fake: FakeApiServer, pki: Path) -> None:
    tls = tls_context(str(pki / "server.crt"), str(pki / "server.key"), str(pki / "ca.crt"))
    with running(fake, tls, open_debug=False) as service:
        ctx = client_context(pki)
        with (
            socket.create_connection(("127.0.0.1", service.server.port)) as raw,
            ctx.wrap_socket(raw, server_hostname="localhost") as sock,
        ):
            assert sock.selected_alpn_protocol() is None


# --- hostile clients ---------------------------------------------------------------------------


def test_protocol_garbage_ends_that_connection_only(served: Service, pki: Path) -> None:
    good = H2Client(served.server.port, client_context(pki))
    bad = H2Client(served.server.port, client_context(pki))
    try:
        bad.sock.sendall(b"\x00\x00\x04\x09\x00\x00\x00\x00\x07GARBAGE-FRAME" * 4)
        bad.until_closed()
        assert good.request("POST", "/filter", filter_body(["n"]))[0] == 200
    finally:
        good.close()
        bad.close()


def test_a_reset_flood_loses_its_connection(served: Service, pki: Path) -> None:
    client = H2Client(served.server.port, client_context(pki))
    try:
        for _ in range(limits.H2_MAX_RESETS + 50):
            sid = client.start("POST", "/filter", b"{", end=False)
            client.conn.reset_stream(sid)
        client.flush()
        client.until_closed()
        assert client.closed_by_server == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        other = H2Client(served.server.port, client_context(pki))
        try:
            assert other.request("GET", "/healthz")[0] == 200
        finally:
            other.close()
    finally:
        client.close()


def test_oversized_headers_lose_the_connection(served: Service, pki: Path) -> None:
    client = H2Client(served.server.port, client_context(pki))
    try:
        client.pump()  # the server's settings
        sid = client.conn.get_next_available_stream_id()
        headers = [
            (":method", "GET"),
            (":path", "/healthz"),
            (":scheme", "https"),
            (":authority", "localhost"),
        ]
        headers += [(f"x-pad-{i}", "v" * 1000) for i in range(limits.MAX_HEADER_BYTES // 1000 + 8)]
        client.conn.send_headers(sid, headers, end_stream=True)
        client.answers[sid] = {"status": None, "body": b"", "done": False, "headers": {}}
        client.flush()
        client.until_closed()
    finally:
        client.close()


def test_a_client_that_never_asks_is_dropped(
    served: Service, pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "HEADER_TIMEOUT", 0.3)
    ctx = client_context(pki)
    with (
        socket.create_connection(("127.0.0.1", served.server.port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        assert sock.selected_alpn_protocol() == "h2"
        started = time.monotonic()
        while sock.recv(4096):  # the server's settings, then its close
            pass
        assert time.monotonic() - started < 5


def test_connections_count_against_the_ports_limit(
    served: Service, pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "MAX_CONNECTIONS", 2)
    clients = [H2Client(served.server.port, client_context(pki)) for _ in range(2)]
    try:
        for c in clients:
            assert c.request("GET", "/healthz")[0] == 200
        extra = H2Client(served.server.port, client_context(pki))
        extra.until_closed()
        extra.close()
    finally:
        for c in clients:
            c.close()


def test_http11_clients_are_unchanged(served: Service, pki: Path) -> None:
    ctx = client_context(pki, alpn=["http/1.1"])
    conn = http.client.HTTPSConnection("127.0.0.1", served.server.port, context=ctx, timeout=10)
    try:
        conn.request("POST", "/filter", body=json.dumps(filter_body(["n"])))
        resp = conn.getresponse()
        assert resp.status == 200 and resp.version == 11
        assert json.loads(resp.read())["NodeNames"] == ["n"]
    finally:
        conn.close()


# --- the protocol on its own: any frame sequence --------------------------------------------

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class _Transport:
    """Enough of a transport for H2Protocol: it records writes and closing."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 4000), "sockname": ("127.0.0.1", 8443)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def _frames() -> st.SearchStrategy[bytes]:
    sids = st.sampled_from([1, 3, 5, 2, 7])  # 2: a server-side id, wrong from a client
    header_lists = st.lists(
        st.tuples(
            st.sampled_from(
                [
                    ":method",
                    ":path",
                    ":scheme",
                    ":authority",
                    "content-length",
                    "x-a",
                    "Bad Name",
                    "connection",
                ]
            ),
            st.sampled_from(
                ["GET", "POST", "/filter", "/healthz", "https", "h", "5", "-1", "", "a\x00b"]
            ),
        ),
        max_size=6,
    )

    def headers(sid: int, hs: list[tuple[str, str]], end: bool) -> bytes:
        f = hyperframe.frame.HeadersFrame(sid)
        f.data = hpack.Encoder().encode(hs)
        f.flags.add("END_HEADERS")
        if end:
            f.flags.add("END_STREAM")
        return bytes(f.serialize())

    def data(sid: int, body: bytes, end: bool) -> bytes:
        f = hyperframe.frame.DataFrame(sid)
        f.data = body
        if end:
            f.flags.add("END_STREAM")
        return bytes(f.serialize())

    def reset(sid: int) -> bytes:
        f = hyperframe.frame.RstStreamFrame(sid)
        f.error_code = 8
        return bytes(f.serialize())

    def window(sid: int, n: int) -> bytes:
        f = hyperframe.frame.WindowUpdateFrame(sid)
        f.window_increment = n
        return bytes(f.serialize())

    def ping(opaque: bytes) -> bytes:
        f = hyperframe.frame.PingFrame(0)
        f.opaque_data = opaque
        return bytes(f.serialize())

    return st.one_of(
        st.builds(headers, sids, header_lists, st.booleans()),
        st.builds(
            headers,
            sids,
            st.just(
                [
                    (":method", "POST"),
                    (":path", "/filter"),
                    (":scheme", "https"),
                    (":authority", "h"),
                ]
            ),
            st.booleans(),
        ),
        st.builds(data, sids, st.binary(max_size=300), st.booleans()),
        st.builds(reset, sids),
        st.builds(
            window, st.sampled_from([0, 1, 3]), st.integers(min_value=1, max_value=2**31 - 1)
        ),
        st.builds(ping, st.binary(min_size=8, max_size=8)),
        st.binary(max_size=40),
    )


@given(frames=st.lists(_frames(), max_size=12), split=st.integers(min_value=1, max_value=64))
@settings(max_examples=300, deadline=None)
def test_any_frames_end_in_answers_or_a_closed_connection(frames: list[bytes], split: int) -> None:
    scopes: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scopes.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x", b"y")]})
        await send({"type": "http.response.body", "body": b"ok"})

    loop = asyncio.new_event_loop()
    try:
        config = SimpleNamespace(loaded=True, loaded_app=app, app=app)
        state = ServerState()
        proto = http2.H2Protocol(config, state, loop)  # type: ignore[arg-type]
        transport = _Transport()
        proto.connection_made(transport)  # type: ignore[arg-type]
        wire = _PREFACE + b"".join(frames)
        for at in range(0, len(wire), split):
            if transport.closed:
                break
            proto.data_received(wire[at : at + split])  # never raises
            loop.run_until_complete(asyncio.sleep(0))
        loop.run_until_complete(asyncio.sleep(0))
        event(f"requests served: {min(len(scopes), 2)}, closed: {transport.closed}")
        for scope in scopes:
            assert scope["method"] and scope["path"].startswith("/")
        held = sum(len(chunk) for s in proto.streams.values() for chunk in s.body)
        assert proto.unread == held
        proto.connection_lost(None)
        assert not state.connections and not proto.streams
        loop.run_until_complete(asyncio.sleep(0))
        assert not state.tasks
    finally:
        loop.close()
