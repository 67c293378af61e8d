"""A small JSON-over-HTTP view of the Kubernetes API, on top of the `kubernetes` client.

The client does what matters: configuration from a kubeconfig or the pod's service account
(token refresh included), TLS, the bearer token and the connection pool. This module sends
raw requests through the client's REST layer (`Configuration`, `rest.RESTClientObject`),
not through `ApiClient` or the typed API classes, because those are expensive to hold: with
kubernetes 37 they import pydantic and python-dateutil (about 8 MB of resident memory), and
the typed API classes with their generated models another 20 MB or so, for a program that
reads one Node, patches its labels and writes two small objects. For the same reason the
client is imported through lean_kubernetes, which loads only those modules and the config
loader in use.

Answers are parsed with tessera.boundedjson within MAX_RESPONSE_BYTES and MAX_RESPONSE_DEPTH.
"""

from __future__ import annotations

from typing import Any, Protocol

from deviceplugin import lean_kubernetes
from tessera.boundedjson import JsonLimitError, loads

MAX_RESPONSE_BYTES = 4 * 1024 * 1024
"""Largest answer read: the API server stores objects of at most 1.5 MiB (etcd's default
request limit), and what the agent reads is one Node, its Lease and its NodeDevices object;
a longer answer is refused (KubeError) without being read to the end."""
MAX_RESPONSE_DEPTH = 64
"""Deepest nesting parsed in an answer; Kubernetes objects nest about 10 deep."""

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class KubeError(Exception):
    """A non-2xx answer (or no answer) from the API server."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}: {body[:300]}" if body else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body


class KubeApi(Protocol):
    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        """Send one request; the decoded JSON answer, or KubeError."""
        ...


class KubernetesClientApi:
    """KubeApi through the `kubernetes` client's Configuration and REST client."""

    def __init__(self, configuration: Any, rest: Any, timeout_s: float = 10.0) -> None:
        self.configuration = configuration
        self.rest = rest
        self.timeout_s = timeout_s

    @classmethod
    def connect(
        cls, kubeconfig: str | None = None, context: str | None = None, timeout_s: float = 10.0
    ) -> KubernetesClientApi:
        """From a kubeconfig file when given, else from the pod's service account."""
        kube = lean_kubernetes.load()
        configuration = kube.Configuration()
        if kubeconfig:
            kube.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
        else:
            kube.load_incluster_config(client_configuration=configuration)
        return cls(configuration, kube.RESTClientObject(configuration), timeout_s)

    @classmethod
    def for_host(cls, host: str, timeout_s: float = 10.0) -> KubernetesClientApi:
        """An unauthenticated client for a plain-HTTP server (tests, kubectl proxy)."""
        kube = lean_kubernetes.load()
        configuration = kube.Configuration()
        configuration.host = host
        return cls(configuration, kube.RESTClientObject(configuration), timeout_s)

    def _headers(self, body: Any, content_type: str) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "tessera-device-plugin"}
        if body is not None:
            headers["Content-Type"] = content_type
        # auth_settings() runs the configuration's token refresh hook (in-cluster token
        # rotation, kubeconfig exec plugins) before handing out the header
        for auth in self.configuration.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        return headers

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        url = self.configuration.host.rstrip("/") + path
        try:
            response = self.rest.request(
                method,
                url,
                headers=self._headers(body, content_type),
                body=body,
                _request_timeout=self.timeout_s,
            )
            status = int(response.status)
            reason = str(response.reason or "")
            raw = _read_bounded(response)
        except KubeError:
            raise
        except Exception as exc:
            # connection refused, timeout, TLS: no status at all; an older client raises
            # ApiException (with a status) for non-2xx answers
            status = int(getattr(exc, "status", 0) or 0)
            if not status:
                raise KubeError(0, type(exc).__name__, str(exc)) from None
            reason = str(getattr(exc, "reason", "") or "")
            raw = getattr(exc, "body", b"") or b""
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        if not 200 <= status < 300:
            raise KubeError(status, reason, text[:1000])
        if not text:
            return None
        try:
            return loads(
                text,
                what=f"{method} {path}",
                max_bytes=MAX_RESPONSE_BYTES,
                max_depth=MAX_RESPONSE_DEPTH,
            )
        except JsonLimitError as exc:
            raise KubeError(status, "unreadable answer", str(exc)) from None

    def close(self) -> None:
        pool = getattr(self.rest, "pool_manager", None)
        if pool is not None:
            pool.clear()


def _read_bounded(response: Any) -> bytes:
    """The answer's body, at most MAX_RESPONSE_BYTES (KubeError beyond)."""
    raw_response = getattr(response, "response", None)  # urllib3's, when not preloaded
    if raw_response is not None and getattr(response, "data", None) is None:
        try:
            data: bytes = raw_response.read(MAX_RESPONSE_BYTES + 1)
        finally:
            raw_response.release_conn()
    else:
        data = response.data if isinstance(response.data, bytes) else str(response.data).encode()
    if len(data) > MAX_RESPONSE_BYTES:
        raise KubeError(
            int(response.status), "answer too large", f"over {MAX_RESPONSE_BYTES} bytes"
        )
    return data
