"""JSON requests against one API server, on the official client's REST layer.

Objects stay plain JSON dicts (the shape every tessera component reads and the core
parses); the typed API classes and their generated models are not used: they cost about
20 MB of memory to import and a model object per item to decode (docs/architecture.md,
"Kubernetes"). `kubernetes.client.rest.RESTClientObject` holds the connection pool, TLS,
proxies and keep-alive as the client configures them; `Configuration.auth_settings()`
gives the credentials, running the loaders' refresh hook (rotated service-account tokens,
exec plugins); their headers are kept for CREDENTIALS_SECONDS (the hook costs about 70 µs
a call, most of it the official client re-reading the proxy environment) and dropped when
the API server answers 401.

Every answer is read within `max_response_bytes` and parsed with tessera.boundedjson; a
non-2xx answer, no answer or an unreadable one is an ApiError.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final
from urllib.parse import quote, urlencode

import urllib3

from kube_edge import config, lean
from kube_edge.errors import NO_ANSWER, ApiError
from tessera.boundedjson import JsonLimitError, loads

log = logging.getLogger(__name__)

JSON: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"

MAX_RESPONSE_BYTES: Final = 256 * 1024 * 1024
"""Largest answer read by default: a list page of PAGE_SIZE objects of at most about 1.5 MiB
each (etcd's default request limit) fits with room; anything longer is refused without being
read to the end. Clients that read single objects ask for less."""
MAX_RESPONSE_DEPTH: Final = 64
"""Deepest nesting parsed in an answer to a single-object request: Kubernetes objects nest
about 12 levels deep, custom resources a few more."""
MAX_WATCH_LINE_BYTES: Final = 16 * 1024 * 1024
"""Longest watch event line: one object (at most about 1.5 MiB) in its event envelope, with
room; a stream that sends more without a newline is broken off."""
PAGE_SIZE: Final = 500
"""Objects per list page: kubectl's and client-go's default chunk size."""
MAX_PAGES: Final = 10_000
"""Pages per list (5 million objects): a server that never ends its `continue` chain cannot
keep a caller listing forever."""
_CHUNK: Final = 64 * 1024
CREDENTIALS_SECONDS: Final = 1.0
"""How long the credential headers are reused before the refresh hook runs again. Tokens
rotate on a scale of minutes (the in-cluster loader itself re-reads its token file once a
minute); a 401 answer drops them at once."""


def _one_line(text: object, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def no_answer(method: str, path: str, why: object) -> ApiError:
    """No HTTP answer (refused, timeout, TLS, a broken or cut answer): status 0, transient."""
    return ApiError(NO_ANSWER, f"cannot reach the API server: {method} {path}: {_one_line(why)}")


def too_large(status: int, method: str, path: str, limit: int) -> ApiError:
    """An answer longer than the caller reads; it keeps the answer's HTTP status."""
    return ApiError(status, f"{method} {path}: answer too large (over {limit} bytes)")


def answer_error(status: int, http_reason: str, raw: bytes, method: str, path: str) -> ApiError:
    """An ApiError from a non-2xx answer, with the Status object's message and reason."""
    try:
        doc = loads(raw, what=f"{method} {path}", max_bytes=1024 * 1024, max_depth=16)
    except JsonLimitError:
        doc = None
    if isinstance(doc, dict):
        message = doc.get("message")
        text = message if isinstance(message, str) and message else http_reason
        return ApiError(status, _one_line(text), doc)
    return ApiError(status, _one_line(raw.decode("utf-8", "replace") or http_reason))


def decode_answer(raw: bytes, method: str, path: str, max_bytes: int, max_depth: int | None) -> Any:
    """The JSON document of a 2xx answer; ApiError(0, reason UnreadableAnswer) when it is not
    one within the bounds."""
    try:
        return loads(raw, what=f"{method} {path}", max_bytes=max_bytes, max_depth=max_depth)
    except JsonLimitError as exc:
        raise ApiError(NO_ANSWER, f"unreadable answer: {exc}", reason="UnreadableAnswer") from None


class KubeClient:
    """JSON requests against one API server. Thread-safe (the urllib3 pool is)."""

    def __init__(
        self,
        cluster: config.Cluster,
        *,
        timeout: float = 10.0,
        pool_size: int = 16,
        user_agent: str = "tessera",
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        max_depth: int = MAX_RESPONSE_DEPTH,
    ) -> None:
        self.cluster = cluster
        self.configuration = cluster.configuration
        self.namespace = cluster.namespace
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        self.max_depth = max_depth
        self.host = str(self.configuration.host).rstrip("/")
        # a failed bind or write is judged by the caller (it may have happened): no retries
        self.configuration.retries = False
        self.configuration.connection_pool_maxsize = pool_size
        self.rest = lean.load().RESTClientObject(self.configuration)
        self._user_agent = user_agent
        self._credentials: tuple[float, dict[str, str]] | None = None
        """(when read, the credential headers): one tuple, so threads never see half."""

    @classmethod
    def connect(
        cls, kubeconfig: str | None = None, context: str | None = None, **kwargs: Any
    ) -> KubeClient:
        """Configured as kubectl would be (kube_edge.config); ApiError when it cannot be."""
        return cls(config.load(kubeconfig, context), **kwargs)

    @classmethod
    def for_host(cls, host: str, **kwargs: Any) -> KubeClient:
        """An unauthenticated client for a plain-HTTP server (tests, `kubectl proxy`)."""
        return cls(config.for_host(host), **kwargs)

    # --- plumbing ---------------------------------------------------------------------------

    def headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": JSON, "User-Agent": self._user_agent}
        if content_type:
            headers["Content-Type"] = content_type
        headers.update(self.credentials())
        return headers

    def credentials(self) -> dict[str, str]:
        """The credential headers (e.g. Authorization), from the refresh hook at most once
        per CREDENTIALS_SECONDS."""
        now = time.monotonic()
        kept = self._credentials
        if kept is not None and now - kept[0] < CREDENTIALS_SECONDS:
            return kept[1]
        fresh = {
            auth["key"]: auth["value"]
            for auth in self.configuration.auth_settings().values()
            if auth.get("in") == "header" and auth.get("value")
        }
        self._credentials = (now, fresh)
        return fresh

    def answered(self, status: int) -> None:
        """Called with each answer's status: a 401 (credentials refused, perhaps rotated)
        makes the next request run the refresh hook."""
        if status == 401:
            self._credentials = None

    def url(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        url = self.host + path
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        return url

    def _send(
        self,
        method: str,
        path: str,
        body: Any,
        content_type: str,
        query: Mapping[str, Any] | None,
        timeout: float | tuple[float, float],
    ) -> Any:
        """The urllib3 response, not yet read; ApiError(0) when none came.

        Sent on the pool the official REST client built from the Configuration (TLS, client
        certificate, proxy, keep-alive), not through `RESTClientObject.request`, whose
        per-call content-type dispatch costs the bind path about 0.1 ms of CPU per bind
        (docs/architecture.md, "Kubernetes")."""
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        if isinstance(timeout, tuple):
            limit = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        else:
            limit = urllib3.Timeout(total=timeout)
        try:
            return self.rest.pool_manager.request(
                method,
                self.url(path, query),
                body=data,
                headers=self.headers(content_type if data is not None else None),
                timeout=limit,
                preload_content=False,
                redirect=False,
            )
        except Exception as exc:  # refused, timeout, TLS, DNS, a broken proxy: no status
            raise no_answer(method, path, exc) from None

    def _read(self, response: Any, method: str, path: str) -> bytes:
        """The whole answer, at most max_response_bytes (ApiError beyond)."""
        length = response.headers.get("Content-Length", "")
        # a stated length within the bound is read in one go (urllib3's sized reads go
        # through its chunk buffer, a measurable cost on the bind path)
        amount = None if length.isdigit() and int(length) <= self.max_response_bytes else -1
        try:
            data: bytes = response.read(
                amount if amount is None else self.max_response_bytes + 1, decode_content=True
            )
        except Exception as exc:
            raise ApiError(NO_ANSWER, f"{method} {path}: {_one_line(exc)}") from None
        finally:
            response.release_conn()
        if len(data) > self.max_response_bytes:
            raise too_large(int(response.status), method, path, self.max_response_bytes)
        return data

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = JSON,
        *,
        query: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        max_depth: int | None = -1,
        decode: bool = True,
    ) -> Any:
        """One request; the decoded JSON answer (None when it is empty). Raises ApiError.
        `max_depth`: the nesting allowed (-1: the client's; None: only the parser's own
        limit, for list pages whose items are checked one by one). `decode=False`: a
        success is read to the end but not parsed (None), for writers that do not use the
        answer (a NodeDevices status patch is answered with the whole object)."""
        response = self._send(method, path, body, content_type, query, timeout or self.timeout)
        raw = self._read(response, method, path)
        status = int(response.status)
        if not 200 <= status < 300:
            self.answered(status)
            raise answer_error(status, str(response.reason or ""), raw, method, path)
        if not raw or not decode:
            return None
        depth = self.max_depth if max_depth == -1 else max_depth
        return decode_answer(raw, method, path, self.max_response_bytes, depth)

    def stream(
        self, path: str, query: Mapping[str, Any], *, read_timeout: float
    ) -> Iterator[bytes]:
        """A watch: yields each event line (undecoded: the caller decodes each on its own);
        ends when the server closes the stream. Raises ApiError."""
        response = self._send("GET", path, None, JSON, query, (self.timeout, read_timeout))
        try:
            if response.status >= 300:
                self.answered(int(response.status))
                raw = response.read(1024 * 1024, decode_content=True)
                raise answer_error(
                    int(response.status), str(response.reason or ""), raw, "watch", path
                )
            buffer = b""
            try:
                for chunk in response.stream(_CHUNK, decode_content=True):
                    buffer += chunk
                    if b"\n" not in chunk:
                        if len(buffer) > MAX_WATCH_LINE_BYTES:
                            raise ApiError(NO_ANSWER, f"watch {path}: event line too long")
                        continue
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield line
            except ApiError:
                raise
            except Exception as exc:
                raise ApiError(NO_ANSWER, f"watch {path}: {_one_line(exc)}") from None
            if buffer.strip():
                yield buffer
        finally:
            response.release_conn()

    # --- verbs ------------------------------------------------------------------------------

    def get(self, path: str, query: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return as_object(self.request("GET", path, query=query))

    def list(self, path: str, **query: Any) -> dict[str, Any]:
        """One list page; items are checked for depth by the caller (list_items does)."""
        return as_object(self.request("GET", path, query=query, max_depth=None))

    def list_items(self, path: str, page_size: int = PAGE_SIZE) -> Iterator[dict[str, Any]]:
        """Every item of a list, page by page; items that are not objects, or nest deeper
        than the client allows, are skipped (logged) without stopping the list."""
        for page in self.pages(path, page_size):
            yield from page_items(page, self.max_depth, path)

    def pages(
        self,
        path: str,
        page_size: int = PAGE_SIZE,
        field_selector: str = "",
        label_selector: str = "",
    ) -> Iterator[dict[str, Any]]:
        """The pages of one list (one snapshot: every page is at the first's version)."""
        token = ""
        for _ in range(MAX_PAGES):
            query: dict[str, Any] = {"limit": page_size}
            if field_selector:
                query["fieldSelector"] = field_selector
            if label_selector:
                query["labelSelector"] = label_selector
            if token:
                query["continue"] = token
            page = self.list(path, **query)
            yield page
            meta = page.get("metadata")
            token = str(meta.get("continue") or "") if isinstance(meta, dict) else ""
            if not token:
                return
        raise ApiError(NO_ANSWER, f"GET {path}: more than {MAX_PAGES} pages")

    def merge_patch(
        self, path: str, patch: Mapping[str, Any], *, answer: bool = True
    ) -> dict[str, Any]:
        """The patched object (`answer=False`: {} without parsing it)."""
        return as_object(
            self.request("PATCH", path, patch, content_type=MERGE_PATCH, decode=answer)
        )

    def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        return as_object(self.request("POST", path, obj))

    def replace(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        return as_object(self.request("PUT", path, obj))

    def close(self) -> None:
        self.rest.pool_manager.clear()


def as_object(doc: Any) -> dict[str, Any]:
    """An answer as a JSON object ({} for anything else: an empty answer, a list)."""
    return doc if isinstance(doc, dict) else {}


def page_items(
    page: Mapping[str, Any], max_depth: int | None, what: str
) -> Iterator[dict[str, Any]]:
    """The object items of one list page; one that nests too deeply is logged and skipped
    (it cannot stop the list)."""
    from tessera.boundedjson import check_depth

    items = page.get("items")
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        if max_depth is not None:
            try:
                check_depth(item, max_depth + 1, what)  # +1: the item itself
            except JsonLimitError as exc:
                log.warning("skipped an item of %s: %s", what, exc)
                continue
        yield item


def decode_event(line: bytes, what: str) -> dict[str, Any] | None:
    """One watch event line; None (logged) when it is not an event object."""
    try:
        event = loads(line, what=what, max_bytes=MAX_WATCH_LINE_BYTES)
    except JsonLimitError as exc:
        log.warning("skipped an undecodable event of %s: %s", what, exc)
        return None
    return event if isinstance(event, dict) else None


# --- API paths -----------------------------------------------------------------------------


def _path(base: str, name: str) -> str:
    return f"{base}/{quote(name, safe='')}" if name else base


def pod_path(namespace: str, name: str = "") -> str:
    return _path(f"/api/v1/namespaces/{quote(namespace, safe='')}/pods", name)


def node_path(name: str = "") -> str:
    return _path("/api/v1/nodes", name)


def lease_path(namespace: str, name: str = "") -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"
    return _path(base, name)


def json_body(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
