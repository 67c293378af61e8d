"""The HTTP surface: bad input, limits, readiness, URL prefixes, TLS with client certs."""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler_plugin.serving.server import tls_context
from tessera import resources as rn
from tessera_testbed.apiserver import FakeApiServer
from tests.scheduler.helpers import Http, pod, populate, serving, share, start


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        populate(server, ["n"], gpus=1)
        yield server


def good_filter() -> dict[str, Any]:
    return {"Pod": pod("p", share(10, 10), uid="u"), "Nodes": None, "NodeNames": ["n"]}


def test_malformed_bodies_get_clear_errors_and_the_service_keeps_serving(
    fake: FakeApiServer,
) -> None:
    with serving(fake, max_body=64 * 1024) as served:
        status, data = served.http.post_raw("/filter", b"{not json")
        assert status == 400 and "not valid JSON" in json.loads(data)["Error"]
        for body, needle in (
            ([], "JSON object"),
            ({"Pod": "x"}, "Pod is missing"),
            ({"Pod": {}, "NodeNames": [1]}, "NodeNames"),
        ):
            status, reply = served.http.post("/filter", body)
            assert status == 400 and needle in reply["Error"], reply
        status, reply = served.http.post("/preempt", {"Pod": pod("p", {rn.GPU_CORE: 10})})
        assert status == 400 and "compute share needs a memory bound" in reply["Error"]
        status, reply = served.http.post("/bind", {"PodName": "p"})
        assert status == 200 and "PodNamespace is missing" in reply["Error"]
        status, reply = served.http.post("/nonsense", {})
        assert status == 404
        status, reply = served.http.post("/filter", good_filter())
        assert status == 200 and reply["NodeNames"] == ["n"]


def test_oversized_bodies_are_refused_and_chunked_ones_are_counted(fake: FakeApiServer) -> None:
    with serving(fake, max_body=1024) as served:
        status, data = served.http.post_raw("/filter", b"x" * 4096)
        assert status == 413 and "over 1024" in json.loads(data)["Error"]
        conn = http.client.HTTPConnection("127.0.0.1", served.service.server.port, timeout=5)
        with contextlib.closing(conn):
            conn.request("POST", "/filter", body=iter([b"x" * 600, b"x" * 600]))  # chunked
            assert conn.getresponse().status == 413
        conn = http.client.HTTPConnection("127.0.0.1", served.service.server.port, timeout=5)
        with contextlib.closing(conn):
            conn.request("POST", "/filter", body=iter([json.dumps(good_filter()).encode()]))
            assert conn.getresponse().status == 200
        fresh = served.reconnect()  # the first connection met the 413s
        assert fresh.http.post("/filter", good_filter())[0] == 200


def test_unknown_resource_combinations_are_explained(fake: FakeApiServer) -> None:
    with serving(fake) as served:
        for resources, needle in (
            ({rn.GPU: 50, rn.GPU_CORE: 50}, "do not combine"),
            ({rn.GPU: 150}, "not a multiple of 100"),
            ({"tessera.dev/tpu": 1}, "unknown tessera resource"),
            ({rn.GPU_MEMORY_RATIO: 10, rn.GPU_MEMORY: 4}, "give the memory bound once"),
        ):
            body = {"Pod": pod("p", resources), "NodeNames": ["n"]}
            status, reply = served.http.post("/filter", body)
            assert status == 200 and reply["NodeNames"] == []
            assert needle in reply["FailedAndUnresolvableNodes"]["n"], reply


def test_any_url_prefix_reaches_the_verbs_and_health_endpoints_answer(fake: FakeApiServer) -> None:
    with serving(fake) as served:
        assert served.http.post("/tessera/v1/filter", good_filter())[1]["NodeNames"] == ["n"]
        assert served.http.get("/healthz") == (200, b"ok\n")
        assert served.http.get("/readyz") == (200, b"ok\n")


def test_not_ready_until_synced(fake: FakeApiServer) -> None:
    fake.fail("/pods", method="GET", status=500, times=10**6)
    service = start(fake)
    try:
        h = Http(service.server.port)
        status, body = h.get("/readyz")
        assert status == 503 and b"pods" in body
        assert h.post("/filter", good_filter())[0] == 503
        assert h.get("/healthz")[0] == 200
        fake.clear_faults()
        assert service.wait_ready(15)
        assert h.post("/filter", good_filter())[0] == 200
    finally:
        service.stop()


# --- TLS ---------------------------------------------------------------------------------------


def test_https_with_required_client_certificates(fake: FakeApiServer, pki: Path) -> None:
    tls = tls_context(str(pki / "server.crt"), str(pki / "server.key"), str(pki / "ca.crt"))
    service = start(fake, tls, open_debug=False)
    opened = contextlib.ExitStack()
    try:
        assert service.wait_ready()
        port = service.server.port
        trusted = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        trusted.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
        conn = opened.enter_context(
            contextlib.closing(
                http.client.HTTPSConnection("127.0.0.1", port, context=trusted, timeout=10)
            )
        )
        conn.request("POST", "/filter", body=json.dumps(good_filter()))
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["NodeNames"] == ["n"]
        # keep-alive over TLS: a second request on the same connection
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b"ok\n"
        # no session ticket is issued (no client of the verbs resumes a session)
        assert isinstance(conn.sock, ssl.SSLSocket) and conn.sock.version() == "TLSv1.3"
        assert conn.sock.session is not None and not conn.sock.session.has_ticket

        # without a certificate: health answers, the verbs and /debug do not
        anonymous = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        c = opened.enter_context(
            contextlib.closing(
                http.client.HTTPSConnection("127.0.0.1", port, context=anonymous, timeout=10)
            )
        )
        c.request("GET", "/healthz")
        assert c.getresponse().read() == b"ok\n"
        c.request("GET", "/debug/nodes")
        resp = c.getresponse()
        assert resp.status == 401 and resp.read()
        c.request("POST", "/filter", body=json.dumps(good_filter()))
        resp = c.getresponse()
        assert resp.status == 403 and "client certificate" in json.loads(resp.read())["Error"]
        # with a certificate: /debug answers
        conn.request("GET", "/debug/nodes")
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["nodes"]
        # plain HTTP to the TLS port fails too, and the server keeps serving
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            plain = opened.enter_context(
                contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=10))
            )
            plain.request("GET", "/healthz")
            plain.getresponse().read()
        conn2 = opened.enter_context(
            contextlib.closing(
                http.client.HTTPSConnection("127.0.0.1", port, context=trusted, timeout=10)
            )
        )
        conn2.request("GET", "/readyz")
        assert conn2.getresponse().status == 200
    finally:
        opened.close()
        service.stop()
