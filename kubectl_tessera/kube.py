"""Read-only JSON GETs against the Kubernetes API, configured like kubectl.

The `kubernetes` client does what matters: the kubeconfig (`--kubeconfig`, `KUBECONFIG`,
`~/.kube/config`), its contexts and default namespace, TLS, credentials and exec plugins.
Requests go through its ApiClient rather than the typed API classes so that objects stay
plain JSON (the same shape every tessera component reads), parsed within bounds.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

from tessera.boundedjson import JsonLimitError, loads

MAX_RESPONSE_BYTES: Final = 256 * 1024 * 1024
"""One response (a page of at most PAGE_SIZE objects): a pod object is at most about 1.5 MiB
(the API server's request limit), so 500 of them fit with room; anything larger is refused
rather than read into memory."""
MAX_RESPONSE_DEPTH: Final = 64
"""Nesting of a response: Kubernetes objects are about 12 levels deep, CRDs a few more."""
PAGE_SIZE: Final = 500
"""Objects per list page: kubectl's own default chunk size."""
MAX_PAGES: Final = 10_000
"""Pages per list (5 million objects): a server that never ends its `continue` chain
cannot keep the command running forever."""


SERVICE_ACCOUNT_NAMESPACE: Final = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
"""In a pod, the namespace kubectl would use by default."""


class ApiError(Exception):
    """The API server could not be reached or answered with an error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Target:
    """Where to connect, and the namespace the current context names."""

    api_client: Any
    namespace: str


def _one_line(text: object, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def connect(kubeconfig: str | None, context: str | None) -> Target:
    """Configuration as kubectl finds it; in a pod without a kubeconfig, the service account.
    Raises ApiError (status 0) when no usable configuration exists."""
    from kubernetes import client
    from kubernetes import config as kube_config
    from kubernetes.config.config_exception import ConfigException

    config: Any = kube_config  # untyped package

    configuration = client.Configuration()
    namespace = "default"
    try:
        default_path = os.path.expanduser(os.environ.get("KUBECONFIG", "~/.kube/config"))
        in_cluster = (
            kubeconfig is None
            and "KUBERNETES_SERVICE_HOST" in os.environ
            and not os.path.exists(default_path.split(os.pathsep)[0])
        )
        if in_cluster:
            config.load_incluster_config(client_configuration=configuration)
            with contextlib.suppress(OSError, UnicodeDecodeError):
                namespace = Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip() or namespace
        else:
            config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
            contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
            chosen = next((c for c in contexts if c.get("name") == context), None) or active
            ns = ((chosen or {}).get("context") or {}).get("namespace")
            if isinstance(ns, str) and ns:
                namespace = ns
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        raise ApiError(0, f"cannot load the Kubernetes configuration: {_one_line(exc)}") from None
    return Target(client.ApiClient(configuration), namespace)


class Kube:
    """GET and paged LIST over one ApiClient."""

    def __init__(self, api_client: Any, timeout_s: float = 30.0) -> None:
        self.api_client = api_client
        self.timeout_s = timeout_s

    def get(self, path: str, query: dict[str, Any] | None = None) -> Any:
        full = f"{path}?{urlencode(query)}" if query else path
        status, raw = self._send(full)
        if not 200 <= status < 300:
            raise ApiError(status, f"GET {path}: {status} {_status_message(raw)}")
        try:
            return loads(
                raw, what=f"GET {path}", max_bytes=MAX_RESPONSE_BYTES, max_depth=MAX_RESPONSE_DEPTH
            )
        except JsonLimitError as exc:
            raise ApiError(status, str(exc)) from None

    def list(self, path: str) -> Iterator[dict[str, Any]]:
        """Every item of a list, page by page; items that are not objects are skipped."""
        token = ""
        for _ in range(MAX_PAGES):
            query: dict[str, Any] = {"limit": PAGE_SIZE}
            if token:
                query["continue"] = token
            page = self.get(path, query)
            if not isinstance(page, dict):
                raise ApiError(200, f"GET {path}: the answer is not a list object")
            items = page.get("items")
            for item in items if isinstance(items, list) else []:
                if isinstance(item, dict):
                    yield item
            meta = page.get("metadata")
            token = str(meta.get("continue") or "") if isinstance(meta, dict) else ""
            if not token:
                return
        raise ApiError(200, f"GET {path}: more than {MAX_PAGES} pages")

    def _send(self, path: str) -> tuple[int, bytes]:
        api = self.api_client
        headers = {"Accept": "application/json"}
        try:
            if hasattr(api, "param_serialize"):  # kubernetes >= 34 (pydantic generation)
                serialized = api.param_serialize(
                    method="GET",
                    resource_path=path,
                    header_params=headers,
                    auth_settings=["BearerToken"],
                )
                response = api.call_api(*serialized, _request_timeout=self.timeout_s)
                return int(response.status), bytes(response.read() or b"")
            return self._send_legacy(path, headers)
        except ApiError:
            raise
        except Exception as exc:  # refused, timeout, TLS, DNS: no status at all
            raise ApiError(0, f"cannot reach the API server: {_one_line(exc)}") from None

    def _send_legacy(self, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.api_client.call_api(
                path,
                "GET",
                header_params=headers,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=self.timeout_s,
            )
        except ApiException as exc:
            body = exc.body if isinstance(exc.body, bytes) else str(exc.body or "").encode()
            return int(exc.status or 0), body
        return int(response.status), bytes(response.data or b"")


def _status_message(raw: bytes) -> str:
    """The `message` of a Status answer, else the start of the body."""
    try:
        doc = loads(raw, what="status", max_bytes=1024 * 1024, max_depth=16)
    except JsonLimitError:
        return _one_line(raw.decode("utf-8", "replace"))
    if isinstance(doc, dict) and isinstance(doc.get("message"), str):
        return _one_line(doc["message"])
    return _one_line(raw.decode("utf-8", "replace"))
