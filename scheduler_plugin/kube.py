"""A thin Kubernetes API client: JSON dicts over one urllib3 connection pool.

The extender needs raw pod JSON (the core parses Kubernetes dicts), a handful of verbs
(get, list, watch, merge patch, create, update) and a fast bind path (two requests per
bind). The `kubernetes` package is used only to read the kubeconfig or the in-cluster
service account, so authentication behaves exactly as kubectl's; requests themselves go
through urllib3 with keep-alive, which is what reaches the bind rate (docs/scheduler.md).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

log = logging.getLogger(__name__)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    """A non-2xx answer from the API server (status 0: no answer at all)."""

    def __init__(self, status: int, reason: str, body: Mapping[str, Any] | None = None) -> None:
        self.status = status
        self.reason = reason
        self.body = dict(body or {})
        super().__init__(f"{status} {reason}")

    @property
    def transient(self) -> bool:
        """Whether the request may have succeeded or may succeed if retried."""
        return self.status in {0, 429} or self.status >= 500


@dataclass(frozen=True)
class Connection:
    """Where the API server is and how to authenticate to it."""

    host: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    token: str | None = None
    server_name: str | None = None


def load_connection(kubeconfig: str | None, context: str | None = None) -> tuple[Connection, Any]:
    """Read the kubeconfig (or the in-cluster service account when `kubeconfig` is None and
    the pod runs in a cluster). Returns the connection and the client Configuration (whose
    token refresh hook, when it has one, keeps bound service-account tokens fresh)."""
    import os

    from kubernetes import client as kclient
    from kubernetes import config as kconfig

    cfg = kclient.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kconfig.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        kconfig.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=cfg, persist_config=False
        )
    return _connection_from(cfg), cfg


def _connection_from(cfg: Any) -> Connection:
    token = cfg.get_api_key_with_prefix("authorization") or cfg.get_api_key_with_prefix(
        "BearerToken"
    )
    if token and not token.lower().startswith("bearer "):
        token = f"Bearer {token}"
    return Connection(
        host=str(cfg.host).rstrip("/"),
        ca_file=cfg.ssl_ca_cert,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        verify=bool(cfg.verify_ssl),
        token=token or None,
        server_name=getattr(cfg, "tls_server_name", None),
    )


class KubeClient:
    """JSON requests against one API server. Thread-safe (urllib3 pools are)."""

    def __init__(
        self,
        conn: Connection,
        *,
        timeout: float = 10.0,
        pool_size: int = 16,
        user_agent: str = "tessera-scheduler",
        refresh: Any = None,
    ) -> None:
        self.conn = conn
        self.timeout = timeout
        self._refresh_cfg = refresh
        self._refreshed = time.monotonic()
        self._token = conn.token
        self._lock = threading.Lock()
        kwargs: dict[str, Any] = {"maxsize": pool_size, "block": False, "retries": False}
        if conn.host.startswith("https://"):
            kwargs["cert_reqs"] = "CERT_REQUIRED" if conn.verify else "CERT_NONE"
            if conn.ca_file:
                kwargs["ca_certs"] = conn.ca_file
            if conn.cert_file:
                kwargs["cert_file"] = conn.cert_file
                kwargs["key_file"] = conn.key_file
            if conn.server_name:
                kwargs["server_hostname"] = conn.server_name
            if not conn.verify:
                urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self._pool = urllib3.PoolManager(num_pools=2, **kwargs)
        self._base_headers = {"Accept": JSON, "User-Agent": user_agent}

    # --- plumbing -----------------------------------------------------------------------------

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = dict(self._base_headers)
        token = self._current_token()
        if token:
            headers["Authorization"] = token
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _current_token(self) -> str | None:
        cfg = self._refresh_cfg
        if cfg is None or time.monotonic() - self._refreshed < 60:
            return self._token
        with self._lock:
            self._refreshed = time.monotonic()
            hook = getattr(cfg, "refresh_api_key_hook", None)
            if hook is not None:
                try:
                    hook(cfg)
                    self._token = _connection_from(cfg).token
                except Exception as exc:  # keep the old token; the next call retries
                    log.warning("refreshing the API token failed: %s", exc)
        return self._token

    def url(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        url = self.conn.host + path
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        return url

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, Any] | None = None,
        content_type: str = JSON,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One request; returns the decoded JSON object. Raises ApiError."""
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        try:
            resp = self._pool.request(
                method,
                self.url(path, query),
                body=data,
                headers=self._headers(content_type if data is not None else None),
                timeout=urllib3.Timeout(total=timeout or self.timeout),
                preload_content=True,
                redirect=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(0, f"{method} {path}: {exc}") from None
        payload: Any = None
        if resp.data:
            try:
                payload = json.loads(resp.data)
            except ValueError:
                payload = None
        if resp.status >= 300:
            message = payload.get("message") if isinstance(payload, dict) else None
            raise ApiError(resp.status, str(message or resp.reason), payload)
        return payload if isinstance(payload, dict) else {}

    def stream(
        self, path: str, query: Mapping[str, Any], *, read_timeout: float
    ) -> Iterator[dict[str, Any]]:
        """A watch: yields each event object; ends when the server closes the stream."""
        try:
            resp = self._pool.request(
                "GET",
                self.url(path, query),
                headers=self._headers(None),
                timeout=urllib3.Timeout(connect=self.timeout, read=read_timeout),
                preload_content=False,
                redirect=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(0, f"watch {path}: {exc}") from None
        try:
            if resp.status >= 300:
                data = resp.read()
                try:
                    payload = json.loads(data) if data else {}
                except ValueError:
                    payload = {}
                raise ApiError(resp.status, str(payload.get("message") or resp.reason), payload)
            buffer = b""
            try:
                for chunk in resp.stream(64 * 1024, decode_content=True):
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if line.strip():
                            yield json.loads(line)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise ApiError(0, f"watch {path}: {exc}") from None
            if buffer.strip():
                yield json.loads(buffer)
        finally:
            resp.release_conn()

    # --- the calls the scheduler makes ---------------------------------------------------------

    def get(self, path: str) -> dict[str, Any]:
        return self.request("GET", path)

    def list(self, path: str, **query: Any) -> dict[str, Any]:
        return self.request("GET", path, query=query)

    def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", path, patch, content_type=MERGE_PATCH)

    def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, obj)

    def replace(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("PUT", path, obj)

    def close(self) -> None:
        self._pool.clear()


# --- API paths --------------------------------------------------------------------------------


def pod_path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"
    return f"{base}/{quote(name, safe='')}" if name else base


def lease_path(namespace: str, name: str = "") -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"
    return f"{base}/{quote(name, safe='')}" if name else base
