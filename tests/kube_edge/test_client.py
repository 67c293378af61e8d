"""The Kubernetes client: configuration and auth from the official client, only the modules
it needs loaded, and answers read within bounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kube_edge.client import MAX_RESPONSE_DEPTH
from kube_edge.client import KubeClient as Api
from kube_edge.errors import ApiError
from tessera_testbed.apiserver import write_kubeconfig
from tests.kube_edge.helpers import StubServer, run_probe

SMALL = 4 * 1024 * 1024  # the node agent's bound


def _kubeconfig(tmp_path: Path, url: str) -> str:
    return write_kubeconfig(tmp_path / "kubeconfig", url, token="s3cret")


def test_kubeconfig_token_and_json_body_are_sent(server: StubServer, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    api = Api.connect(_kubeconfig(tmp_path, url), timeout=5)
    server.answers["/api/v1/nodes/n"] = (200, b'{"metadata": {"name": "n"}}')
    assert api.request("GET", "/api/v1/nodes/n") == {"metadata": {"name": "n"}}
    patch = {"metadata": {"labels": {"a": "b"}}}
    server.answers["/api/v1/nodes/n2"] = (200, b"")
    assert api.request("PATCH", "/api/v1/nodes/n2", patch, "application/merge-patch+json") is None
    (_, _, get_headers, _), (method, _, headers, body) = server.seen
    assert get_headers["authorization"] == "Bearer s3cret"
    assert method == "PATCH" and headers["content-type"] == "application/merge-patch+json"
    assert json.loads(body) == patch
    with pytest.raises(ApiError) as missing:
        api.request("GET", "/api/v1/nodes/gone")
    assert missing.value.status == 404


def test_answers_are_read_within_bounds(server: StubServer) -> None:
    api = Api.for_host(
        f"http://127.0.0.1:{server.server_address[1]}", timeout=5, max_response_bytes=SMALL
    )
    server.answers["/big"] = (200, b'"' + b"x" * SMALL + b'"')
    with pytest.raises(ApiError, match="too large"):
        api.request("GET", "/big")
    server.answers["/deep"] = (
        200,
        b"[" * (MAX_RESPONSE_DEPTH + 1) + b"]" * (MAX_RESPONSE_DEPTH + 1),
    )
    with pytest.raises(ApiError, match="unreadable answer"):
        api.request("GET", "/deep")
    server.answers["/junk"] = (200, b"{not json")
    with pytest.raises(ApiError, match="unreadable answer"):
        api.request("GET", "/junk")
    server.answers["/ok"] = (200, b'{"a": 1}')
    assert api.request("GET", "/ok") == {"a": 1}  # the connection pool survived


def test_an_unused_answer_is_read_within_bounds_but_not_parsed(server: StubServer) -> None:
    api = Api.for_host(
        f"http://127.0.0.1:{server.server_address[1]}", timeout=5, max_response_bytes=SMALL
    )
    server.answers["/status"] = (200, b"{not json: the writer never looks")
    assert api.merge_patch("/status", {"status": {}}, answer=False) == {}
    server.answers["/status"] = (200, b'{"metadata": {"name": "n"}}')
    assert api.merge_patch("/status", {"status": {}}) == {"metadata": {"name": "n"}}
    # the size bound and the status still hold for an answer that is not parsed
    server.answers["/big"] = (200, b'"' + b"x" * SMALL + b'"')
    with pytest.raises(ApiError, match="too large"):
        api.merge_patch("/big", {}, answer=False)
    server.answers["/gone"] = (404, b'{"kind": "Status", "message": "not found"}')
    with pytest.raises(ApiError) as gone:
        api.merge_patch("/gone", {}, answer=False)
    assert gone.value.status == 404


def test_no_answer_is_a_kube_error_with_status_0() -> None:
    api = Api.for_host("http://127.0.0.1:1", timeout=2)
    with pytest.raises(ApiError) as down:
        api.request("GET", "/api/v1/nodes/n")
    assert down.value.status == 0


_PROBE = """
import json, sys
from kube_edge import lean
from kube_edge.client import KubeClient
api = KubeClient.connect(sys.argv[1])
lean.config_module("incluster_config")
loaded = sorted(sys.modules)
# the stand-ins still give the whole package on demand
from kubernetes.client import ApiClient, CoreV1Api
import kubernetes
from kubernetes.client.api_client import ApiClient as Real
print(json.dumps({
    "loaded": loaded,
    "complete": [ApiClient is Real, callable(CoreV1Api), hasattr(kubernetes.watch, "Watch"),
                 hasattr(kubernetes.client.models, "V1Pod")],
}))
"""


def test_only_the_needed_parts_of_the_client_are_imported(tmp_path: Path) -> None:
    """Importing kubernetes.client ran the package's __init__: every API class and the
    pydantic models (about 20 MB of the agent's memory)."""
    kubeconfig = _kubeconfig(tmp_path, "http://127.0.0.1:1")
    report = run_probe(_PROBE, kubeconfig)
    loaded = report["loaded"]
    heavy = [
        m
        for m in loaded
        if m.startswith(("kubernetes.client.models.", "kubernetes.client.api.", "pydantic"))
        or m in ("kubernetes.client.api_client", "dateutil", "kubernetes.watch")
    ]
    assert heavy == []
    assert "kubernetes.config.kube_config" in loaded and "kubernetes.client.rest" in loaded
    assert report["complete"] == [True, True, True, True]


_IN_CLUSTER = """
import json, sys
from kube_edge import lean
from kube_edge.client import KubeClient
incluster = lean.config_module("incluster_config")
incluster.SERVICE_TOKEN_FILENAME, incluster.SERVICE_CERT_FILENAME = sys.argv[1], sys.argv[2]
api = KubeClient.connect()
print(json.dumps({
    "host": api.configuration.host,
    "headers": api.headers(),
    "namespace": api.namespace,
    "kubeconfig loader": "kubernetes.config.kube_config" in sys.modules,
    "requests": "requests" in sys.modules,
}))
"""


def test_in_cluster_auth_without_the_kubeconfig_loader(tmp_path: Path) -> None:
    """The DaemonSet's path: service account token and CA, the API server from the env."""
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("sa-token")
    ca.write_text("not read until a TLS connection is made")
    report = run_probe(
        _IN_CLUSTER,
        str(token),
        str(ca),
        KUBERNETES_SERVICE_HOST="10.0.0.1",
        KUBERNETES_SERVICE_PORT="443",
        KUBECONFIG=str(tmp_path / "absent"),
    )
    assert report["host"] == "https://10.0.0.1:443"
    assert report["headers"]["authorization"] == "bearer sa-token"
    assert report["kubeconfig loader"] is False and report["requests"] is False


def _counting_hook(api: Api) -> list[int]:
    """Replace the loader's refresh hook with one that hands out a new token each call."""
    calls: list[int] = []

    def hook(configuration: object) -> None:
        calls.append(1)
        api.configuration.api_key["BearerToken"] = f"Bearer t{len(calls)}"

    api.configuration.refresh_api_key_hook = hook
    return calls


def _tokens(server: StubServer) -> list[str]:
    return [headers["authorization"] for _, _, headers, _ in server.seen]


def test_credentials_are_refreshed_at_most_once_a_second(
    server: StubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kube_edge.client import CREDENTIALS_SECONDS

    url = f"http://127.0.0.1:{server.server_address[1]}"
    api = Api.connect(_kubeconfig(tmp_path, url), timeout=5)
    calls = _counting_hook(api)
    now = [1000.0]
    monkeypatch.setattr("kube_edge.client.time.monotonic", lambda: now[0])
    server.answers["/api/v1/nodes/n"] = (200, b"{}")
    for _ in range(5):
        api.request("GET", "/api/v1/nodes/n")
    assert len(calls) == 1 and set(_tokens(server)) == {"Bearer t1"}
    now[0] += CREDENTIALS_SECONDS  # a rotated token is picked up
    api.request("GET", "/api/v1/nodes/n")
    assert len(calls) == 2 and _tokens(server)[-1] == "Bearer t2"


def test_a_401_makes_the_next_request_refresh_the_credentials(
    server: StubServer, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    api = Api.connect(_kubeconfig(tmp_path, url), timeout=5)
    calls = _counting_hook(api)
    server.answers["/api/v1/nodes/n"] = (200, b"{}")
    server.answers["/api/v1/nodes/denied"] = (401, b'{"kind": "Status", "code": 401}')
    api.request("GET", "/api/v1/nodes/n")
    with pytest.raises(ApiError) as denied:
        api.request("GET", "/api/v1/nodes/denied")
    assert denied.value.status == 401 and len(calls) == 1
    api.request("GET", "/api/v1/nodes/n")
    assert len(calls) == 2 and _tokens(server) == ["Bearer t1", "Bearer t1", "Bearer t2"]
    # other refusals keep them (a 403 is about the request, not the token)
    server.answers["/api/v1/nodes/forbidden"] = (403, b'{"kind": "Status", "code": 403}')
    with pytest.raises(ApiError):
        api.request("GET", "/api/v1/nodes/forbidden")
    api.request("GET", "/api/v1/nodes/n")
    assert len(calls) == 2
