"""A small JSON-over-HTTP view of the Kubernetes API, on top of the `kubernetes` client.

The client does what matters: configuration from a kubeconfig or the pod's service account
(token refresh included), TLS, authentication headers and the connection pool. This module
sends raw requests through its ApiClient rather than through the typed API classes because
those are expensive to hold: with kubernetes 37 (pydantic models), CoreV1Api alone adds about
21 MB of resident memory, a third of the agent's budget, to read one Node and patch its labels.

Both generations of the client are supported: the pydantic one (`ApiClient.param_serialize`,
v34+) and the older swagger one (`ApiClient.call_api(resource_path, ...)`).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

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
    """KubeApi through a `kubernetes.client.ApiClient`."""

    def __init__(self, api_client: Any, timeout_s: float = 10.0) -> None:
        self.api_client = api_client
        self.timeout_s = timeout_s

    @classmethod
    def connect(
        cls, kubeconfig: str | None = None, context: str | None = None, timeout_s: float = 10.0
    ) -> KubernetesClientApi:
        """From a kubeconfig file when given, else from the pod's service account."""
        from kubernetes import client, config

        configuration = client.Configuration()
        loader: Any
        if kubeconfig:
            loader = config.load_kube_config
            loader(config_file=kubeconfig, context=context, client_configuration=configuration)
        else:
            loader = config.load_incluster_config
            loader(client_configuration=configuration)
        return cls(client.ApiClient(configuration), timeout_s)

    @classmethod
    def for_host(cls, host: str, timeout_s: float = 10.0) -> KubernetesClientApi:
        """An unauthenticated client for a plain-HTTP server (tests, kubectl proxy)."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = host
        return cls(client.ApiClient(configuration), timeout_s)

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        api = self.api_client
        if hasattr(api, "param_serialize"):
            return self._request_v34(method, path, body, headers)
        return self._request_legacy(method, path, body, headers)

    def _request_v34(self, method: str, path: str, body: Any, headers: dict[str, str]) -> Any:
        api = self.api_client
        try:
            serialized = api.param_serialize(
                method=method,
                resource_path=path,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = api.call_api(*serialized, _request_timeout=self.timeout_s)
            raw = response.read()
        except KubeError:
            raise
        except Exception as exc:  # connection refused, timeout, TLS: no status at all
            raise KubeError(0, type(exc).__name__, str(exc)) from None
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw or "")
        if not 200 <= int(response.status) < 300:
            raise KubeError(int(response.status), str(response.reason or ""), text)
        return json.loads(text) if text else None

    def _request_legacy(self, method: str, path: str, body: Any, headers: dict[str, str]) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.api_client.call_api(
                path,
                method,
                header_params=headers,
                body=body,
                response_type="object",
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=True,
                _request_timeout=self.timeout_s,
            )
        except ApiException as exc:
            status = int(exc.status or 0)
            raise KubeError(status, str(exc.reason or ""), str(exc.body or "")) from None
        except Exception as exc:
            raise KubeError(0, type(exc).__name__, str(exc)) from None

    def close(self) -> None:
        close = getattr(self.api_client, "close", None)
        if callable(close):
            close()
