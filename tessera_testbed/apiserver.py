"""An in-process fake Kubernetes API server for tests.

A threaded HTTP server on 127.0.0.1 with an in-memory object store. It speaks the part of
the API that tessera uses, with the semantics that matter for correctness:

- resources: pods (with the `binding` and `status` subresources), nodes, events, leases
  (coordination.k8s.io/v1), the `NodeDevices` custom resource (tessera.dev/v1alpha1,
  cluster-scoped, with a `status` subresource) and PodGroups (scheduling.x-k8s.io/v1alpha1);
- get, list (all namespaces or one; `fieldSelector` with `path=value` and `path!=value`
  terms, e.g. `spec.nodeName=node-a`; `labelSelector` with `key`, `!key`, `key=value` and
  `key!=value` terms), create, update (PUT with resourceVersion: a stale one
  gets 409 Conflict), patch (merge, strategic merge treated as merge, JSON patch), delete;
- one global resourceVersion counter; watch as a chunked stream of JSON lines
  (`{"type": ..., "object": ...}`), from a given resourceVersion, with optional bookmarks
  and the list's field selectors (an object that starts matching arrives as ADDED, one that
  stops as DELETED, as the real server sends them);
  a resourceVersion older than the kept history gets an ERROR event with a 410 status,
  as the real server does;
- binding: sets spec.nodeName once (a second binding is 409), checks metadata.uid when
  given, and applies the Binding's metadata.annotations and labels to the pod in the same
  update, as the real server does; a patch whose metadata.uid differs from the stored one
  is 409;
- faults for recovery tests: `fail(...)` makes matching requests answer an error status
  (optionally after the change was applied, to imitate a lost answer), `latency`,
  `drop_watches()` ends every open watch, `compact()` forgets history (watchers then get
  410), `stop()`/`start()` on the same port imitate an API server restart.

Tests change objects directly through `create/update/patch/delete/get` (Python calls that
behave like the HTTP ones and notify watchers; `find` is `get` that answers None for a
missing object) or over HTTP with any client. `requests` logs every (method, path) that came
over HTTP (`writes(...)` picks the writes out of it; `parse_path` takes a path apart, e.g. to
derive RBAC rules from the log), and `before`, when set, is called with (method, path)
before each HTTP request is handled: a test plays a concurrent writer there to provoke a
real 409 Conflict.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import json
import re
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tessera.errors import TesseraError

Obj = dict[str, Any]
Term = tuple[list[str], bool, str | None]
"""A selector term: (field path, equal?, value); a value of None tests that the field is
there (equal) or not."""

# resource key -> (group/version prefix, namespaced, kind)
RESOURCES: dict[str, tuple[str, bool, str]] = {
    "pods": ("/api/v1", True, "Pod"),
    "nodes": ("/api/v1", False, "Node"),
    "events": ("/api/v1", True, "Event"),
    "leases": ("/apis/coordination.k8s.io/v1", True, "Lease"),
    "nodedevices": ("/apis/tessera.dev/v1alpha1", False, "NodeDevices"),
    "podgroups": ("/apis/scheduling.x-k8s.io/v1alpha1", True, "PodGroup"),
}
_API_VERSION = {
    "/api/v1": "v1",
    "/apis/coordination.k8s.io/v1": "coordination.k8s.io/v1",
    "/apis/tessera.dev/v1alpha1": "tessera.dev/v1alpha1",
    "/apis/scheduling.x-k8s.io/v1alpha1": "scheduling.x-k8s.io/v1alpha1",
}
_STATUS_SUBRESOURCE = {"pods", "nodedevices", "nodes"}

_PATH = re.compile(
    r"^(?P<prefix>/api/v1|/apis/[^/]+/[^/]+)"
    r"(?:/namespaces/(?P<ns>[^/]+))?"
    r"/(?P<resource>[a-z]+)"
    r"(?:/(?P<name>[^/]+))?"
    r"(?:/(?P<sub>[a-z]+))?$"
)

_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class ApiProblemError(TesseraError):
    """The simulated API server refuses a request: answered as a Status with this code."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ApiPath:
    """A request path taken apart (any resource name, served here or not)."""

    prefix: str
    """`/api/v1` or `/apis/<group>/<version>`."""
    namespace: str | None
    resource: str
    name: str | None
    """None for a collection."""
    subresource: str | None

    @property
    def group(self) -> str:
        """The API group, "" for the core group (as RBAC rules write it)."""
        return "" if self.prefix == "/api/v1" else self.prefix.split("/")[2]


def parse_path(path: str) -> ApiPath:
    """`/api/v1[/namespaces/<ns>]/<resource>[/<name>[/<sub>]]` or the same under
    `/apis/<group>/<version>`; a query string is ignored. ApiProblemError 404 otherwise."""
    match = _PATH.match(urlsplit(path).path)
    if match is None:
        raise ApiProblemError(404, "NotFound", f"no route for {path}")
    return ApiPath(match["prefix"], match["ns"], match["resource"], match["name"], match["sub"])


def status_body(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def json_patch(doc: Any, ops: list[Obj]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, test)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = _pointer(op["path"])
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        if not parts:
            raise ApiProblemError(422, "Invalid", "cannot patch the whole document")
        last = parts[-1]
        kind = op["op"]
        if kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op.get("value"):
                raise ApiProblemError(422, "Invalid", f"test failed at {op['path']}")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                elif kind == "add":
                    parent.insert(int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            else:
                if kind == "replace" and last not in parent:
                    raise ApiProblemError(422, "Invalid", f"no value at {op['path']}")
                parent[last] = op["value"]
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                if last not in parent:
                    raise ApiProblemError(422, "Invalid", f"no value at {op['path']}")
                del parent[last]
        else:
            raise ApiProblemError(422, "Invalid", f"unsupported op {kind}")
    return doc


@dataclass
class Fault:
    """Requests matching method and path substring answer `status` (`times` of them)."""

    method: str | None
    path_contains: str
    status: int
    times: int
    after_apply: bool = False
    """Apply the change, then answer the error (a lost answer)."""
    hits: int = 0


@dataclass
class _Watcher:
    resource: str
    namespace: str | None
    terms: list[Term] = field(default_factory=list)
    events: list[Obj] = field(default_factory=list)
    closed: bool = False

    def offer(self, kind: str, obj: Obj, old: Obj | None) -> None:
        """Queue the event as this watch sees it. With a field selector, as the real
        server does: a change that makes an object match arrives as ADDED, one that makes
        it stop matching as DELETED (with the new object), one outside it not at all."""
        if self.terms:
            now = _selected(obj, self.terms)
            before = now if old is None or kind != "MODIFIED" else _selected(old, self.terms)
            if not now and not before:
                return
            if kind == "MODIFIED" and now != before:
                kind = "ADDED" if now else "DELETED"
        self.events.append({"type": kind, "object": copy.deepcopy(obj)})


_FIELD_TERM = re.compile(r"^([A-Za-z.]+)(!=|==|=)(.*)$")
_LABEL_TERM = re.compile(r"^(!?)([A-Za-z0-9][-A-Za-z0-9_./]*)(?:(!=|==|=)(.*))?$")


def _field_terms(selector: str) -> list[Term]:
    """(field path, equal?, value) per term of a field selector; 400 for other syntax."""
    terms = []
    for term in filter(None, selector.split(",")):
        match = _FIELD_TERM.match(term)
        if match is None:
            raise ApiProblemError(400, "BadRequest", f"unsupported field selector {term!r}")
        path, op, value = match.groups()
        terms.append((path.split("."), op != "!=", value))
    return terms


def _label_terms(selector: str) -> list[Term]:
    """The terms of a label selector, as field terms on metadata.labels (a value of None:
    the label exists, or with `!`, does not); 400 for set-based syntax."""
    terms: list[Term] = []
    for term in filter(None, selector.split(",")):
        match = _LABEL_TERM.match(term.strip())
        if match is None or (match[1] and match[3]):
            raise ApiProblemError(400, "BadRequest", f"unsupported label selector {term!r}")
        negated, key, op, value = match.groups()
        path = ["metadata", "labels", key]
        terms.append((path, op != "!=", value) if op else (path, not negated, None))
    return terms


def _selected(obj: Obj, terms: list[Term]) -> bool:
    for path, equal, value in terms:
        field: Any = obj
        for part in path:
            field = field.get(part) if isinstance(field, dict) else None
        if value is None:
            if (field is not None) != equal:
                return False
        elif (str(field if field is not None else "") == value) != equal:
            return False
    return True


def write_kubeconfig(path: str | Path, server: str, token: str = "fake-token") -> str:
    """Write a kubeconfig whose one context reaches `server` with a bearer `token`; its path."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake",
    }
    Path(path).write_text(json.dumps(doc))
    return str(path)


class FakeApiServer:
    """See the module doc. Use as a context manager or call start()/stop()."""

    def __init__(self, history: int = 100_000, tls: ssl.SSLContext | None = None) -> None:
        self._lock = threading.Condition()
        self.tls = tls
        """Serve HTTPS with this server context (its certificate chain loaded)."""
        self._store: dict[tuple[str, str, str], Obj] = {}
        self._rv = 0
        self._log: list[tuple[int, str, str, str | None, Obj, Obj | None]] = []
        """(resourceVersion, type, resource, namespace, object, the object before a
        MODIFIED change)"""
        """(rv, type, resource, namespace, object) for watch replay."""
        self._history = history
        self._compacted = 0
        self._watchers: list[_Watcher] = []
        self._faults: list[Fault] = []
        self.latency = 0.0
        self.requests: list[tuple[str, str]] = []
        """(method, path) of every request, in arrival order."""
        self.before: Callable[[str, str], None] | None = None
        """Called with (method, path) before each request is handled (after it is logged,
        before latency and faults): play a concurrent writer to provoke a real conflict."""
        self.port = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.bookmark_interval: float | None = None
        self.list_calls = 0
        self.tokens: dict[str, Obj] = {}
        """Bearer token -> TokenReview status.user (username, uid, groups) it belongs to."""
        self.grants: set[tuple[str, str, str]] = set()
        """(user or "group:<name>", verb, non-resource path glob) a SubjectAccessReview
        allows; nothing else is allowed."""

    # --- delegated authentication ------------------------------------------------------------

    def token_review(self, body: Any) -> Obj:
        token = ((body or {}).get("spec") or {}).get("token")
        user = self.tokens.get(token) if isinstance(token, str) else None
        status: Obj = {"authenticated": user is not None}
        if user is not None:
            status["user"] = copy.deepcopy(user)
        return {**(body or {}), "status": status}

    def access_review(self, body: Any) -> Obj:
        spec = (body or {}).get("spec") or {}
        attrs = spec.get("nonResourceAttributes") or {}
        subjects = {spec.get("user")} | {f"group:{g}" for g in spec.get("groups") or ()}
        allowed = any(
            who in subjects
            and verb == attrs.get("verb")
            and fnmatch.fnmatchcase(str(attrs.get("path")), glob)
            for who, verb, glob in self.grants
        )
        return {**(body or {}), "status": {"allowed": allowed}}

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        server = _Server(("127.0.0.1", self.port), _Handler)
        if self.tls is not None:
            # the handshake happens in the connection's own thread, on its first read
            server.socket = self.tls.wrap_socket(
                server.socket, server_side=True, do_handshake_on_connect=False
            )
        server.fake = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True, name="fakeapi")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (connections are closed, watches end). start() serves the same store
        on the same port again: an API server restart."""
        server = self._server
        if server is None:
            return
        self._server = None
        self.drop_watches()
        server.shutdown()
        server.server_close()
        # a client may have connected between the first drop and the shutdown: end it too
        self.drop_watches()
        server.close_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def kubeconfig(self, path: str) -> str:
        """Write a kubeconfig pointing at this server (no authentication) and return it."""
        return write_kubeconfig(path, self.url)

    # --- faults ---------------------------------------------------------------------------

    def fail(
        self,
        path_contains: str,
        *,
        method: str | None = None,
        status: int = 500,
        times: int = 1,
        after_apply: bool = False,
    ) -> Fault:
        fault = Fault(method, path_contains, status, times, after_apply)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _fault_for(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.hits >= fault.times:
                    continue
                if fault.method and fault.method != method:
                    continue
                if fault.path_contains in path:
                    fault.hits += 1
                    return fault
        return None

    def writes(self, method: str | None = None, path: str = "") -> list[tuple[str, str]]:
        """The logged writes (POST, PUT, PATCH, DELETE; or only `method`) whose path starts
        with `path`, in arrival order."""
        methods = _WRITES if method is None else {method.upper()}
        return [(m, p) for m, p in list(self.requests) if m in methods and p.startswith(path)]

    def drop_watches(self) -> None:
        with self._lock:
            for w in self._watchers:
                w.closed = True
            self._lock.notify_all()

    def compact(self) -> None:
        """Forget the event history: a watch from an older resourceVersion gets 410."""
        with self._lock:
            self._compacted = self._rv
            self._log.clear()

    # --- the store (direct use by tests) ----------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def _key(self, resource: str, namespace: str | None, name: str) -> tuple[str, str, str]:
        return (resource, namespace or "", name)

    def _emit(self, kind: str, resource: str, obj: Obj, old: Obj | None = None) -> None:
        ns = obj["metadata"].get("namespace")
        self._log.append((self._rv, kind, resource, ns, copy.deepcopy(obj), old))
        if len(self._log) > self._history:
            drop = len(self._log) - self._history
            self._compacted = self._log[drop - 1][0]
            del self._log[:drop]
        for w in self._watchers:
            if w.resource == resource and (w.namespace is None or w.namespace == ns):
                w.offer(kind, obj, old)
        self._lock.notify_all()

    def _bump(self, obj: Obj) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)

    def create(self, resource: str, obj: Obj) -> Obj:
        with self._lock:
            obj = copy.deepcopy(obj)
            prefix, namespaced, kind = RESOURCES[resource]
            meta = obj.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            if not meta.get("name"):
                raise ApiProblemError(422, "Invalid", "metadata.name is required")
            ns = (meta.get("namespace") or "default") if namespaced else None
            if namespaced:
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
            key = self._key(resource, ns, meta["name"])
            if key in self._store:
                raise ApiProblemError(
                    409, "AlreadyExists", f'{resource} "{meta["name"]}" already exists'
                )
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            meta["generation"] = 1
            obj["apiVersion"] = _API_VERSION[prefix]
            obj["kind"] = kind
            if resource == "pods":
                obj.setdefault("spec", {})
                obj.setdefault("status", {"phase": "Pending"})
            self._bump(obj)
            self._store[key] = obj
            self._emit("ADDED", resource, obj)
            return copy.deepcopy(obj)

    def get(self, resource: str, name: str, namespace: str | None = None) -> Obj:
        obj = self.find(resource, name, namespace)
        if obj is None:
            raise ApiProblemError(404, "NotFound", f'{resource} "{name}" not found')
        return obj

    def find(self, resource: str, name: str, namespace: str | None = None) -> Obj | None:
        """A copy of the object, or None where there is none (get raises 404)."""
        with self._lock:
            obj = self._store.get(self._key(resource, self._ns(resource, namespace), name))
            return copy.deepcopy(obj) if obj is not None else None

    def items(self, resource: str, namespace: str | None = None) -> list[Obj]:
        with self._lock:
            return [
                copy.deepcopy(o)
                for (r, ns, _), o in sorted(self._store.items())
                if r == resource and (namespace is None or ns == namespace)
            ]

    def _ns(self, resource: str, namespace: str | None) -> str | None:
        return (namespace or "default") if RESOURCES[resource][1] else None

    def _write(
        self, resource: str, namespace: str | None, name: str, new: Obj, sub: str | None
    ) -> Obj:
        """Store `new` as the object (status or main part per subresource rules)."""
        key = self._key(resource, self._ns(resource, namespace), name)
        old = self._store.get(key)
        if old is None:
            raise ApiProblemError(404, "NotFound", f'{resource} "{name}" not found')
        new_meta = new.get("metadata") or {}
        rv = new_meta.get("resourceVersion")
        if rv not in (None, "") and str(rv) != old["metadata"]["resourceVersion"]:
            raise ApiProblemError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
            )
        if new_meta.get("uid") not in (None, "", old["metadata"]["uid"]):
            raise ApiProblemError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {new_meta.get('uid')}, UID in "
                f"object meta: {old['metadata']['uid']}",
            )
        result = copy.deepcopy(old)
        if sub == "status":
            result["status"] = copy.deepcopy(new.get("status"))
        else:
            for k, v in new.items():
                if k in ("metadata", "status") and resource in _STATUS_SUBRESOURCE:
                    continue
                result[k] = copy.deepcopy(v)
            meta = copy.deepcopy(new_meta)
            for fixed in (
                "uid",
                "name",
                "namespace",
                "creationTimestamp",
                "resourceVersion",
                "generation",
            ):
                meta[fixed] = old["metadata"].get(fixed)
                if meta[fixed] is None:
                    meta.pop(fixed)
            result["metadata"] = meta
            if resource not in _STATUS_SUBRESOURCE and "status" in new:
                result["status"] = copy.deepcopy(new["status"])
            if resource == "pods":
                old_node = (old.get("spec") or {}).get("nodeName")
                if old_node and (result.get("spec") or {}).get("nodeName") != old_node:
                    raise ApiProblemError(422, "Invalid", "spec.nodeName: field is immutable")
        if result == old:
            return copy.deepcopy(old)  # no-op writes do not bump the resourceVersion
        if _spec_part(result, resource) != _spec_part(old, resource):
            # as the API server does: the generation counts changes of what the object
            # asks for, not of its metadata or (with a status subresource) its status
            result["metadata"]["generation"] = int(old["metadata"].get("generation") or 0) + 1
        self._bump(result)
        self._store[key] = result
        self._emit("MODIFIED", resource, result, old)
        return copy.deepcopy(result)

    def update(self, resource: str, obj: Obj, sub: str | None = None) -> Obj:
        with self._lock:
            meta = obj.get("metadata") or {}
            return self._write(resource, meta.get("namespace"), meta["name"], obj, sub)

    def patch(
        self,
        resource: str,
        name: str,
        patch: Any,
        namespace: str | None = None,
        sub: str | None = None,
        kind: str = "merge",
    ) -> Obj:
        with self._lock:
            current = self.get(resource, name, namespace)
            if kind == "json":
                new = json_patch(current, patch)
                uid = None
            else:
                new = merge_patch(current, patch)
                uid = ((patch or {}).get("metadata") or {}).get("uid")
            if uid is not None and uid != current["metadata"]["uid"]:
                raise ApiProblemError(
                    409, "Conflict", f"Precondition failed: UID in precondition: {uid}"
                )
            new_meta = new.setdefault("metadata", {})
            # a merge patch may carry a resourceVersion precondition; a JSON patch has its own
            # `test` operations instead (and is a list, not an object)
            new_meta["resourceVersion"] = (
                None
                if kind == "json"
                else ((patch or {}).get("metadata") or {}).get("resourceVersion")
            )
            if sub == "status":
                return self._write(resource, namespace, name, new, "status")
            if resource in _STATUS_SUBRESOURCE:
                new["status"] = current.get("status")
            return self._write(resource, namespace, name, new, None)

    def delete(self, resource: str, name: str, namespace: str | None = None) -> Obj:
        with self._lock:
            key = self._key(resource, self._ns(resource, namespace), name)
            obj = self._store.pop(key, None)
            if obj is None:
                raise ApiProblemError(404, "NotFound", f'{resource} "{name}" not found')
            self._bump(obj)
            self._emit("DELETED", resource, obj)
            return copy.deepcopy(obj)

    def bind(self, namespace: str, name: str, binding: Obj) -> Obj:
        with self._lock:
            pod = self.get("pods", name, namespace)
            want_uid = (binding.get("metadata") or {}).get("uid")
            if want_uid and want_uid != pod["metadata"]["uid"]:
                raise ApiProblemError(
                    409, "Conflict", f"Precondition failed: UID in precondition: {want_uid}"
                )
            target = (binding.get("target") or {}).get("name")
            if not target:
                raise ApiProblemError(422, "Invalid", "target.name is required")
            if pod["spec"].get("nodeName"):
                raise ApiProblemError(
                    409,
                    "Conflict",
                    f"pod {name} is already assigned to node {pod['spec']['nodeName']!r}",
                )
            if pod["metadata"].get("deletionTimestamp"):
                raise ApiProblemError(409, "Conflict", f"pod {name} is being deleted")
            pod["spec"]["nodeName"] = target
            # the real server applies the Binding's annotations and labels to the pod in
            # this same update
            meta = binding.get("metadata") or {}
            for field in ("annotations", "labels"):
                extra = meta.get(field)
                if isinstance(extra, dict) and extra:
                    pod["metadata"].setdefault(field, {}).update(extra)
            conditions = pod.setdefault("status", {}).setdefault("conditions", [])
            conditions.append({"type": "PodScheduled", "status": "True"})
            key = self._key("pods", namespace, name)
            self._bump(pod)
            old = self._store[key]
            self._store[key] = pod
            self._emit("MODIFIED", "pods", pod, old)
            return status_body(201, "", "") | {"status": "Success", "code": 201}

    # --- list and watch -----------------------------------------------------------------------

    def list(
        self,
        resource: str,
        namespace: str | None,
        limit: int = 0,
        continue_token: str = "",
        field_selector: str = "",
        label_selector: str = "",
    ) -> Obj:
        """A list; with `limit`, one page and a `continue` token (an offset: unlike the
        real server, later pages show the store as it is then, not a snapshot)."""
        terms = _field_terms(field_selector) + _label_terms(label_selector)
        with self._lock:
            prefix, _, kind = RESOURCES[resource]
            items = [o for o in self.items(resource, namespace) if _selected(o, terms)]
            meta: Obj = {"resourceVersion": str(self._rv)}
            if limit > 0:
                start = int(continue_token or 0)
                if start + limit < len(items):
                    meta["continue"] = str(start + limit)
                items = items[start : start + limit]
            self.list_calls += 1
            return {
                "kind": f"{kind}List",
                "apiVersion": _API_VERSION[prefix],
                "metadata": meta,
                "items": items,
            }

    def watch(
        self,
        resource: str,
        namespace: str | None,
        since: int,
        timeout: float,
        bookmarks: bool,
        alive: Callable[[], bool],
        field_selector: str = "",
        label_selector: str = "",
    ) -> Iterable[Obj]:
        """Events after `since`, then live ones until `timeout` or the watch is dropped."""
        deadline = time.monotonic() + timeout
        terms = _field_terms(field_selector) + _label_terms(label_selector)
        with self._lock:
            if since < self._compacted:
                yield {
                    "type": "ERROR",
                    "object": status_body(
                        410,
                        "Expired",
                        f"too old resource version: {since} ({self._compacted})",
                    ),
                }
                return
            watcher = _Watcher(resource, namespace, terms)
            for rv, kind, res, ns, obj, old in self._log:
                if rv > since and res == resource and (namespace is None or ns == namespace):
                    watcher.offer(kind, obj, old)
            self._watchers.append(watcher)
        last_bookmark = time.monotonic()
        try:
            while True:
                with self._lock:
                    if not alive():
                        return
                    while not watcher.events and not watcher.closed:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        if self.bookmark_interval and bookmarks:
                            left = min(
                                left, self.bookmark_interval - (time.monotonic() - last_bookmark)
                            )
                            if left <= 0:
                                break
                        self._lock.wait(min(left, 0.5))
                        if not alive():
                            return
                    events, watcher.events = watcher.events, []
                    closed = watcher.closed
                    rv_now = self._rv
                yield from events
                if closed or time.monotonic() >= deadline:
                    return
                if (
                    bookmarks
                    and self.bookmark_interval
                    and time.monotonic() - last_bookmark >= self.bookmark_interval
                ):
                    last_bookmark = time.monotonic()
                    prefix, _, kind = RESOURCES[resource]
                    yield {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": kind,
                            "apiVersion": _API_VERSION[prefix],
                            "metadata": {"resourceVersion": str(rv_now)},
                        },
                    }
        finally:
            with self._lock:
                if watcher in self._watchers:
                    self._watchers.remove(watcher)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeApiServer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._conns: set[socket.socket] = set()
        self._conn_lock = threading.Lock()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with contextlib.suppress(OSError):
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._conn_lock:
            self._conns.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._conn_lock:
                self._conns.discard(request)

    def close_all(self) -> None:
        with self._conn_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


def _spec_part(obj: Obj, resource: str) -> Obj:
    """What counts for the generation: all but metadata (and status, for resources with a
    status subresource)."""
    skip = ("metadata", "status") if resource in _STATUS_SUBRESOURCE else ("metadata",)
    return {k: v for k, v in obj.items() if k not in skip}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        phrase = self.responses.get(code, ("",))[0]
        head = (
            f"{self.protocol_version} {code} {phrase}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        # status, headers and body in one write: small writes meet the client's delayed ACK
        self.wfile.write(head.encode() + data)

    def _problem(self, p: ApiProblemError) -> None:
        self._send(p.code, status_body(p.code, p.reason, p.message))

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiProblemError(400, "BadRequest", "request body is not JSON") from None

    def _drain(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        fake = self.server.fake
        split = urlsplit(self.path)
        fake.requests.append((method, split.path))
        before = fake.before
        if before is not None:
            before(method, split.path)
        try:
            # every body is read, used or not (a DELETE may carry DeleteOptions): one left
            # unread would be taken for the next request on this connection
            body = None
            if method in ("POST", "PUT", "PATCH"):
                body = self._body()
            else:
                self._drain()
            if fake.latency:
                time.sleep(fake.latency)
            fault = fake._fault_for(method, split.path)
            if fault is not None and not fault.after_apply:
                raise ApiProblemError(fault.status, "InternalError", "injected fault")
            query = {k: v[-1] for k, v in parse_qs(split.query).items()}
            target = parse_path(split.path)
            if method == "POST" and target.resource in ("tokenreviews", "subjectaccessreviews"):
                review = fake.token_review if target.resource == "tokenreviews" else None
                self._send(201, (review or fake.access_review)(body))
                return
            if target.resource == "bindings" and method == "POST":
                # the namespace-level form the python client's create_namespaced_binding uses
                name = ((body or {}).get("metadata") or {}).get("name") or ""
                self._send(201, fake.bind(target.namespace or "default", name, body or {}))
                return
            resource, ns, name, sub = (
                target.resource,
                target.namespace,
                target.name,
                target.subresource,
            )
            if resource not in RESOURCES or RESOURCES[resource][0] != target.prefix:
                raise ApiProblemError(404, "NotFound", f"no route for {split.path}")
            if method == "GET" and name is None and query.get("watch") in ("1", "true"):
                self._watch(resource, ns, query)
                return
            result, code = self._handle(method, resource, ns, name, sub, body, query)
            if fault is not None:
                raise ApiProblemError(fault.status, "InternalError", "injected fault (after apply)")
            self._send(code, result)
        except ApiProblemError as p:
            self._problem(p)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            self._problem(ApiProblemError(400, "BadRequest", f"bad request: {exc!r}"))

    def _handle(
        self,
        method: str,
        resource: str,
        ns: str | None,
        name: str | None,
        sub: str | None,
        body: Any,
        query: dict[str, str],
    ) -> tuple[Obj, int]:
        fake = self.server.fake
        if name is None:
            if method == "GET":
                limit = int(query.get("limit") or 0)
                selector = query.get("fieldSelector", "")
                labels = query.get("labelSelector", "")
                token = query.get("continue", "")
                return fake.list(resource, ns, limit, token, selector, labels), 200
            if method == "POST":
                obj = dict(body or {})
                meta = dict(obj.get("metadata") or {})
                if ns:
                    meta["namespace"] = ns
                obj["metadata"] = meta
                return fake.create(resource, obj), 201
            raise ApiProblemError(405, "MethodNotAllowed", f"{method} on a collection")
        if sub == "binding":
            if method != "POST" or resource != "pods":
                raise ApiProblemError(405, "MethodNotAllowed", "binding takes POST")
            return fake.bind(ns or "default", name, body or {}), 201
        if sub not in (None, "status"):
            raise ApiProblemError(404, "NotFound", f"no subresource {sub}")
        if method == "GET":
            return fake.get(resource, name, ns), 200
        if method == "PUT":
            obj = dict(body or {})
            meta = dict(obj.get("metadata") or {})
            meta["name"] = name
            if ns:
                meta["namespace"] = ns
            obj["metadata"] = meta
            return fake.update(resource, obj, sub), 200
        if method == "PATCH":
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            kind = {
                "application/json-patch+json": "json",
                "application/merge-patch+json": "merge",
                "application/strategic-merge-patch+json": "merge",
            }.get(ctype)
            if kind is None:
                raise ApiProblemError(
                    415, "UnsupportedMediaType", f"unsupported patch type {ctype}"
                )
            return fake.patch(resource, name, body, ns, sub, kind), 200
        if method == "DELETE":
            return fake.delete(resource, name, ns), 200
        raise ApiProblemError(405, "MethodNotAllowed", method)

    def _watch(self, resource: str, ns: str | None, query: dict[str, str]) -> None:
        fake = self.server.fake
        since = int(query.get("resourceVersion") or fake.resource_version)
        timeout = float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        try:
            server = self.server

            def alive() -> bool:  # a stopped (restarted) server ends its watches
                return fake._server is server

            selector = query.get("fieldSelector", "")
            labels = query.get("labelSelector", "")
            events = fake.watch(resource, ns, since, timeout, bookmarks, alive, selector, labels)
            for event in events:
                if not alive():
                    break
                data = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True
            return
        self.close_connection = True


def main() -> None:
    """Serve a fake API server in its own process (benchmarks): prints the port, then
    serves until killed."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--history", type=int, default=100_000)
    args = parser.parse_args()
    server = FakeApiServer(history=args.history)
    server.port = args.port
    server.start()
    sys.stdout.write(f"{server.port}\n")
    sys.stdout.flush()
    threading.Event().wait()


if __name__ == "__main__":
    main()
