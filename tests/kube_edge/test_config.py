"""The one configuration loader: kubeconfig contexts, credentials, CA, in-cluster."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from kube_edge import config
from kube_edge.client import KubeClient
from kube_edge.errors import ApiError
from tessera_testbed.apiserver import FakeApiServer


def _write(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(doc))
    return str(path)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def two_contexts(tmp_path: Path) -> str:
    return _write(
        tmp_path,
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "plain", "cluster": {"server": "http://127.0.0.1:1"}},
                {
                    "name": "tls",
                    "cluster": {
                        "server": "https://127.0.0.1:2",
                        "certificate-authority-data": _b64("ca pem"),
                        "tls-server-name": "api.example",
                    },
                },
            ],
            "users": [
                {"name": "token", "user": {"token": "s3cret"}},
                {
                    "name": "cert",
                    "user": {
                        "client-certificate-data": _b64("cert pem"),
                        "client-key-data": _b64("key pem"),
                    },
                },
            ],
            "contexts": [
                {"name": "a", "context": {"cluster": "plain", "user": "token"}},
                {"name": "b", "context": {"cluster": "tls", "user": "cert", "namespace": "ml"}},
            ],
            "current-context": "a",
        },
    )


def test_the_current_context_and_its_token(tmp_path: Path) -> None:
    cluster = config.load(two_contexts(tmp_path))
    assert cluster.configuration.host == "http://127.0.0.1:1"
    assert cluster.namespace == "default" and not cluster.in_cluster
    headers = KubeClient(cluster).headers()
    assert headers["authorization"] == "Bearer s3cret"


def test_a_chosen_context_with_client_certificate_ca_and_namespace(tmp_path: Path) -> None:
    cluster = config.load(two_contexts(tmp_path), context="b")
    cfg = cluster.configuration
    assert cfg.host == "https://127.0.0.1:2" and cluster.namespace == "ml"
    assert Path(cfg.ssl_ca_cert).read_text() == "ca pem"
    assert Path(cfg.cert_file).read_text() == "cert pem"
    assert Path(cfg.key_file).read_text() == "key pem"
    assert cfg.tls_server_name == "api.example"
    assert "authorization" not in KubeClient(cluster).headers()


@pytest.mark.parametrize(
    "doc",
    [
        "not: [yaml",
        json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "none"}),
    ],
)
def test_an_unusable_kubeconfig_is_an_api_error_without_status(tmp_path: Path, doc: str) -> None:
    path = tmp_path / "kc"
    path.write_text(doc)
    with pytest.raises(ApiError) as bad:
        config.load(str(path))
    assert bad.value.status == 0 and bad.value.reason == "InvalidConfiguration"
    assert "cannot load the Kubernetes configuration" in str(bad.value)


def test_which_configuration_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    existing = tmp_path / "kubeconfig"
    existing.write_text("{}")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    assert not config.wants_in_cluster(None)  # not in a pod
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert config.wants_in_cluster(None)  # in a pod, no kubeconfig
    assert not config.wants_in_cluster(str(existing))  # an explicit file always wins
    monkeypatch.setenv("KUBECONFIG", str(existing))
    assert not config.wants_in_cluster(None)  # a kubeconfig mounted into the pod


def test_parts_for_https_with_a_token(tmp_path: Path) -> None:
    cluster = config.for_host("https://127.0.0.1:3/", ca_file="/ca", token="t", namespace="x")
    cfg = cluster.configuration
    assert cfg.host == "https://127.0.0.1:3" and cfg.ssl_ca_cert == "/ca"
    assert cluster.namespace == "x"
    assert KubeClient(cluster).headers()["authorization"] == "Bearer t"


def test_errors_carry_status_and_the_status_reason(fake: FakeApiServer) -> None:
    client = KubeClient.for_host(fake.url, timeout=5)
    with pytest.raises(ApiError) as missing:
        client.get("/api/v1/nodes/absent")
    assert missing.value.status == 404 and missing.value.reason == "NotFound"
    assert not missing.value.transient
    fake.create("nodes", {"metadata": {"name": "n"}})
    with pytest.raises(ApiError) as exists:
        client.create("/api/v1/nodes", {"metadata": {"name": "n"}})
    assert exists.value.status == 409 and exists.value.reason == "AlreadyExists"
    from tessera.errors import TesseraError

    assert isinstance(exists.value, TesseraError)
