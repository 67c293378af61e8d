"""kube_edge.lean's deferred dependencies: what a process using kube_edge does not import,
and that the deferred code is still reached when it is used (HTTPS through urllib3, an OIDC
token refresh through requests_oauthlib)."""

from __future__ import annotations

import base64
import json
import ssl
import time
from pathlib import Path
from typing import Any

from tessera_testbed.apiserver import write_kubeconfig
from tests.e2e.pki import Authority
from tests.kube_edge.helpers import StubServer, run_probe, serve_stub

_HTTPS = """
import json, sys
from kube_edge import config
from kube_edge.client import KubeClient
api = KubeClient(config.for_host(sys.argv[1], ca_file=sys.argv[2], token="t"), timeout=10)
answer = api.get("/api/v1/nodes/n")
loaded = sorted(sys.modules)
import urllib3.http2
print(json.dumps({
    "answer": answer,
    "loaded": loaded,
    "probe": urllib3.http2.probe.__name__,
    "inject": urllib3.http2.inject_into_urllib3.__module__,
}))
"""


def test_https_without_urllib3_http2_init(tmp_path: Path) -> None:
    """urllib3's http2 package __init__ imports importlib.metadata (zipfile, shutil, csv...)
    for a function urllib3 itself never calls."""
    ca = Authority(tmp_path, "ca")
    pair = ca.issue("apiserver", "localhost", server=True)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pair.cert, pair.key)
    with serve_stub(tls) as srv:
        srv.answers["/api/v1/nodes/n"] = (200, b'{"metadata": {"name": "n"}}')
        url = f"https://127.0.0.1:{srv.server_address[1]}"
        report = run_probe(_HTTPS, url, str(ca.path))
        assert [(m, p) for m, p, _, _ in srv.seen] == [("GET", "/api/v1/nodes/n")]
    assert report["answer"] == {"metadata": {"name": "n"}}
    loaded = report["loaded"]
    assert "urllib3.http2.probe" in loaded
    assert [m for m in loaded if m.startswith(("importlib.metadata", "zipfile"))] == []
    # the package is still whole for whoever asks
    assert report["probe"] == "urllib3.http2.probe"
    assert report["inject"] == "urllib3.http2"


_KUBECONFIG = """
import json, sys
from kube_edge.client import KubeClient
api = KubeClient.connect(sys.argv[1])
loaded = sorted(sys.modules)
from requests_oauthlib import OAuth2Session
from requests_oauthlib.oauth2_session import OAuth2Session as Real
import oauthlib.oauth2
from oauthlib.oauth2.rfc6749.errors import InvalidClientIdError
kube_config = sys.modules["kubernetes.config.kube_config"]
print(json.dumps({
    "headers": api.headers(),
    "loaded": loaded,
    "real": [OAuth2Session is Real, oauthlib.oauth2.InvalidClientIdError is InvalidClientIdError,
             kube_config.oauthlib.oauth2.rfc6749.errors.InvalidClientIdError
             is InvalidClientIdError,
             isinstance(kube_config.OAuth2Session(client_id="c"), Real)],
}))
"""


def _oauth_stack(loaded: list[str]) -> list[str]:
    """The modules of the OAuth stack loaded, less the three empty stand-ins."""
    stand_ins = ("oauthlib", "oauthlib.oauth2", "requests_oauthlib")
    return [
        m
        for m in loaded
        if m.startswith(("requests", "oauthlib", "charset_normalizer", "idna"))
        and m not in stand_ins
    ]


def test_kubeconfig_auth_without_the_oauth_stack(tmp_path: Path) -> None:
    """The kubeconfig loader imports oauthlib and requests_oauthlib (and requests) for OIDC
    token refresh only: about 5 MB of the node agent's memory."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1", token="s3cret")
    report = run_probe(_KUBECONFIG, kubeconfig)
    assert report["headers"]["authorization"] == "Bearer s3cret"
    assert "kubernetes.config.kube_config" in report["loaded"]
    assert _oauth_stack(report["loaded"]) == []
    assert report["real"] == [True, True, True, True]


def _jwt(claims: dict[str, Any]) -> str:
    def part(doc: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part(claims)}.c2ln"


_OIDC = """
import json, sys
from kube_edge.client import KubeClient
api = KubeClient.connect(sys.argv[1])
print(json.dumps({"headers": api.headers(), "loaded": sorted(sys.modules)}))
"""


def test_an_expired_oidc_token_is_refreshed_through_the_real_oauth_session(
    server: StubServer, tmp_path: Path
) -> None:
    issuer = f"http://127.0.0.1:{server.server_address[1]}"
    fresh = _jwt({"sub": "agent", "exp": int(time.time()) + 3600})
    server.answers["/.well-known/openid-configuration"] = (
        200,
        json.dumps({"issuer": issuer, "token_endpoint": f"{issuer}/token"}).encode(),
    )
    token = {
        "access_token": "a",
        "token_type": "Bearer",
        "id_token": fresh,
        "refresh_token": "r2",
        "expires_in": 3600,
    }
    server.answers["/token"] = (200, json.dumps(token).encode())
    oidc = {
        "client-id": "tessera",
        "client-secret": "shh",
        "id-token": _jwt({"sub": "agent", "exp": int(time.time()) - 3600}),
        "refresh-token": "r1",
        "idp-issuer-url": issuer,
    }
    provider = {"name": "oidc", "config": oidc}
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"auth-provider": provider}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    # oauthlib refuses plain HTTP token endpoints unless told otherwise
    report = run_probe(_OIDC, str(kubeconfig), OAUTHLIB_INSECURE_TRANSPORT="1")
    assert report["headers"]["authorization"] == f"Bearer {fresh}"
    token_calls = [body for _, path, _, body in server.seen if path == "/token"]
    assert len(token_calls) == 1 and b"refresh_token=r1" in token_calls[0]
    assert "requests_oauthlib.oauth2_session" in report["loaded"]


_DEFERRED = """
import json, sys
import deviceplugin
import asyncio, grpc, http.server
from cryptography.hazmat.primitives import serialization
before = sorted(sys.modules)

async def round_trip():
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), 20)
    await server.stop(None)
    return port > 0

print(json.dumps({
    "before": before,
    "aio": asyncio.run(round_trip()),
    "ssh": serialization.load_ssh_public_key.__name__,
    "pem": serialization.Encoding.__name__,
    "html": [http.server.html.escape("<a>"), http.server.html.unescape("&lt;")],
}))
"""


def test_packages_the_agent_defers_are_whole_when_used() -> None:
    """deviceplugin defers asyncio, grpc.aio, cryptography's serialization package and html:
    a process that uses them gets them, an asyncio gRPC server included."""
    report = run_probe(_DEFERRED)
    assert "asyncio.base_events" not in report["before"]
    assert "grpc.aio._channel" not in report["before"]
    assert "cryptography.hazmat.primitives.serialization.ssh" not in report["before"]
    assert "html.entities" not in report["before"]
    assert report["aio"] is True
    assert report["ssh"] == "load_ssh_public_key" and report["pem"] == "Encoding"
    assert report["html"] == ["&lt;a&gt;", "<"]


_NAMED_DUNDERS = """
import json, sys
import deviceplugin
from html import *
from kube_edge import lean
lean.load()
import kubernetes
print(json.dumps({"escape": escape("<"), "version": kubernetes.__version__}))
"""


def test_a_star_import_and_a_version_complete_a_stand_in() -> None:
    """`from pkg import *` reads __all__, and __version__ is a name the package defines: both
    are the real package's, not an empty stand-in's."""
    report = run_probe(_NAMED_DUNDERS)
    assert report["escape"] == "&lt;"
    assert report["version"][0].isdigit()
