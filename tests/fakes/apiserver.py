"""An in-process fake Kubernetes API server for tests: an in-memory object store behind HTTP.

It speaks enough of the real API for clients such as the `kubernetes` Python package:

- paths `/api/v1/...` and `/apis/<group>/<version>/...`, cluster-scoped or under
  `namespaces/<ns>/`, with an optional `/status` subresource;
- GET (one object, or a list with `?watch=true` for a watch stream of JSON lines: ADDED,
  MODIFIED, DELETED, resumable from `resourceVersion`), POST (create; 409 AlreadyExists),
  PUT (replace; 409 Conflict when `metadata.resourceVersion` is stale), PATCH (JSON merge
  patch for both merge and strategic-merge content types, and JSON patch add/replace/remove),
  DELETE;
- every write bumps a global resourceVersion; new objects get a uid and creationTimestamp;
- collections registered with `enable_status()` behave like a status subresource: the main
  resource ignores `status`, `/status` changes only `status`;
- errors come back as `Status` objects with the right code and reason.

Test helpers: `put()` / `get()` bypass HTTP, `requests` logs every (method, path), `fail_next()`
injects error answers, and `before` is a hook called with (method, path) before each request is
handled (use it to play a concurrent writer and provoke real conflicts).

It stores whatever JSON it is given: there is no schema validation, defaulting, admission,
field selectors, or authentication.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Key = tuple[str, str, str]
"""(API prefix such as "/api/v1" or "/apis/g/v", namespace or "", plural)."""


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


@dataclass(frozen=True)
class Target:
    key: Key
    name: str | None
    subresource: str | None


def parse_path(path: str) -> Target:
    segments = [s for s in path.split("/") if s]
    if segments[:2] == ["api", "v1"]:
        prefix, rest = "/api/v1", segments[2:]
    elif segments[:1] == ["apis"] and len(segments) >= 3:
        prefix, rest = "/" + "/".join(segments[:3]), segments[3:]
    else:
        raise ApiError(404, "NotFound", f"the server could not find the requested path {path}")
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        raise ApiError(404, "NotFound", f"the server could not find the requested path {path}")
    return Target(
        (prefix, namespace, rest[0]),
        rest[1] if len(rest) >= 2 else None,
        rest[2] if len(rest) == 3 else None,
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (null deletes a key)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _pointer(doc: Any, pointer: str) -> tuple[Any, str]:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]
    for part in parts[:-1]:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc, parts[-1]


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    doc = copy.deepcopy(doc)
    for op in ops:
        parent, last = _pointer(doc, op["path"])
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, op["value"])
            elif kind == "replace":
                parent[index] = op["value"]
            elif kind == "remove":
                del parent[index]
            else:
                raise ApiError(422, "Invalid", f"unsupported JSON patch op {kind}")
        elif kind in ("add", "replace"):
            parent[last] = op["value"]
        elif kind == "remove":
            del parent[last]
        else:
            raise ApiError(422, "Invalid", f"unsupported JSON patch op {kind}")
    return doc


class FakeApiServer:
    def __init__(self) -> None:
        self._objects: dict[Key, dict[str, dict[str, Any]]] = {}
        self._events: list[tuple[int, Key, str, dict[str, Any]]] = []
        self._status_enabled: set[tuple[str, str]] = set()
        self._rv = itertools.count(1)
        self._last_rv = 0
        self._cond = threading.Condition()
        self._faults: list[tuple[str, str, int, int]] = []
        self.requests: list[tuple[str, str]] = []
        self.before: Callable[[str, str], None] | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self._connections: set[Any] = set()

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-apiserver"
        )
        self._thread.daemon = True
        self._thread.start()
        return self.url

    def stop(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for connection in list(self._connections):  # kept-alive clients lose the server too
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> FakeApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- test helpers -------------------------------------------------------------------------

    def enable_status(self, prefix: str, plural: str) -> None:
        """Treat `status` of this collection as a subresource (as a CRD with it enabled)."""
        self._status_enabled.add((prefix, plural))

    def put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object at `path` (its item path) without HTTP; returns what was stored."""
        target = parse_path(path)
        assert target.name is not None
        with self._cond:
            body = copy.deepcopy(obj)
            body.setdefault("metadata", {})["name"] = target.name
            existing = self._objects.get(target.key, {}).get(target.name)
            return self._store(target.key, body, existing)

    def get(self, path: str) -> dict[str, Any] | None:
        target = parse_path(path)
        with self._cond:
            obj = self._objects.get(target.key, {}).get(target.name or "")
            return copy.deepcopy(obj) if obj is not None else None

    def fail_next(self, method: str, path: str, code: int, count: int = 1) -> None:
        """Answer the next `count` requests with this method on paths starting with `path`."""
        with self._cond:
            self._faults.append((method.upper(), path, code, count))

    def writes(self, method: str | None = None, path: str = "") -> list[tuple[str, str]]:
        kinds = {"POST", "PUT", "PATCH", "DELETE"} if method is None else {method.upper()}
        return [(m, p) for m, p in self.requests if m in kinds and p.startswith(path)]

    # --- the store --------------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._last_rv = next(self._rv)
        return str(self._last_rv)

    def _store(
        self, key: Key, body: dict[str, Any], existing: dict[str, Any] | None
    ) -> dict[str, Any]:
        metadata = body.setdefault("metadata", {})
        if key[1]:
            metadata["namespace"] = key[1]
        if existing is None:
            metadata["uid"] = str(uuid.uuid4())
            metadata["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        else:
            metadata["uid"] = existing["metadata"]["uid"]
            metadata["creationTimestamp"] = existing["metadata"]["creationTimestamp"]
        metadata["resourceVersion"] = self._next_rv()
        self._objects.setdefault(key, {})[metadata["name"]] = body
        self._events.append(
            (self._last_rv, key, "ADDED" if existing is None else "MODIFIED", copy.deepcopy(body))
        )
        self._cond.notify_all()
        return copy.deepcopy(body)

    def _check_rv(self, body: dict[str, Any], current: dict[str, Any], name: str) -> None:
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
            )

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> Any:
        target = parse_path(path)
        status_on = (target.key[0], target.key[2]) in self._status_enabled
        with self._cond:
            items = self._objects.setdefault(target.key, {})
            if target.name is None:
                if method == "GET":
                    return {
                        "kind": "List",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(self._last_rv)},
                        "items": [copy.deepcopy(o) for o in items.values()],
                    }
                if method == "POST":
                    if not isinstance(body, dict):
                        raise ApiError(400, "BadRequest", "the body must be an object")
                    name = (body.get("metadata") or {}).get("name")
                    if not name:
                        raise ApiError(422, "Invalid", "metadata.name: Required value")
                    if name in items:
                        raise ApiError(409, "AlreadyExists", f'"{name}" already exists')
                    body = copy.deepcopy(body)
                    body["metadata"].pop("resourceVersion", None)
                    if status_on:
                        body.pop("status", None)
                    return self._store(target.key, body, None)
                raise ApiError(405, "MethodNotAllowed", f"{method} on a collection")
            current = items.get(target.name)
            if current is None:
                raise ApiError(404, "NotFound", f'"{target.name}" not found')
            if target.subresource not in (None, "status"):
                raise ApiError(404, "NotFound", f"no subresource {target.subresource}")
            if method == "GET":
                return copy.deepcopy(current)
            if method == "DELETE":
                del items[target.name]
                self._next_rv()
                self._events.append((self._last_rv, target.key, "DELETED", copy.deepcopy(current)))
                self._cond.notify_all()
                return copy.deepcopy(current)
            if method == "PUT":
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "the body must be an object")
                self._check_rv(body, current, target.name)
                new = copy.deepcopy(body)
                new.setdefault("metadata", {})["name"] = target.name
            elif method == "PATCH":
                content_type, ops = body
                if content_type == "application/json-patch+json":
                    new = json_patch(current, ops)
                else:
                    if isinstance(ops, dict):
                        self._check_rv(ops, current, target.name)
                    new = merge_patch(current, ops)
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} on an object")
            if target.subresource == "status":
                merged = copy.deepcopy(current)
                merged["status"] = new.get("status")
                new = merged
            elif status_on:
                if "status" in current:
                    new["status"] = copy.deepcopy(current["status"])
                else:
                    new.pop("status", None)
            return self._store(target.key, new, current)

    def watch(
        self, key: Key, since: int | None, timeout_s: float, write: Callable[[bytes], bool]
    ) -> None:
        """Stream events of one collection until the timeout or the client goes away."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if since is None:
                backlog = [
                    (self._last_rv, "ADDED", copy.deepcopy(o))
                    for o in self._objects.get(key, {}).values()
                ]
                position = len(self._events)
            else:
                backlog = []
                position = next(
                    (i for i, e in enumerate(self._events) if e[0] > since), len(self._events)
                )
        for _, kind, obj in backlog:
            if not write(json.dumps({"type": kind, "object": obj}).encode() + b"\n"):
                return
        while True:
            with self._cond:
                while position >= len(self._events) and not self._closing:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self._cond.wait(left)
                if self._closing:
                    return
                events = self._events[position:]
                position = len(self._events)
            for _, event_key, kind, obj in events:
                if event_key != key:
                    continue
                if not write(json.dumps({"type": kind, "object": obj}).encode() + b"\n"):
                    return

    def _fault(self, method: str, path: str) -> int | None:
        with self._cond:
            for i, (m, prefix, code, count) in enumerate(self._faults):
                if m == method and path.startswith(prefix):
                    if count <= 1:
                        del self._faults[i]
                    else:
                        self._faults[i] = (m, prefix, code, count - 1)
                    return code
        return None


def _handler(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def setup(self) -> None:
            super().setup()
            api._connections.add(self.connection)

        def finish(self) -> None:
            api._connections.discard(self.connection)
            super().finish()

        def _send(self, code: int, doc: Any) -> None:
            data = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _serve(self, method: str) -> None:
            parts = urlsplit(self.path)
            query = parse_qs(parts.query)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            api.requests.append((method, parts.path))
            if api.before is not None:
                api.before(method, parts.path)
            code = api._fault(method, parts.path)
            if code is not None:
                reason = HTTPStatus(code).phrase.replace(" ", "")
                self._send(code, ApiError(code, reason, "injected failure").status())
                return
            try:
                body: Any = json.loads(raw) if raw else None
                if method == "PATCH":
                    content_type = (self.headers.get("Content-Type") or "").split(";")[0]
                    body = (content_type, body)
                if method == "GET" and query.get("watch", [""])[0] in ("1", "true"):
                    self._watch(parts.path, query)
                    return
                self._send(
                    200 if method != "POST" else 201, api.handle(method, parts.path, query, body)
                )
            except ApiError as exc:
                self._send(exc.code, exc.status())
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                self._send(400, ApiError(400, "BadRequest", str(exc)).status())

        def _watch(self, path: str, query: dict[str, list[str]]) -> None:
            target = parse_path(path)
            since = query.get("resourceVersion", [""])[0]
            timeout = float(query.get("timeoutSeconds", ["30"])[0])
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def write(data: bytes) -> bool:
                try:
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                    return True
                except OSError:
                    return False

            api.watch(target.key, int(since) if since else None, timeout, write)
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass
            self.close_connection = True

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

    return Handler
