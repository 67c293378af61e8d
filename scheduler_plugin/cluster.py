"""Watches that keep the Cache equal to the cluster: NodeDevices, Leases, Nodes, Pods.

Each resource has an Informer: list, then watch from the list's resourceVersion; a watch
that ends is resumed from the last resourceVersion seen (bookmarks included); a 410 Gone
(history compacted) or any error leads to a fresh list, whose items *replace* what the
handler knew (objects missing from the list count as deleted). The service is ready only
after every informer has listed once.

Every handler processes each object on its own: whatever one object holds (a poison
record, a NodeDevices past every bound, a wrong shape), its failure is recorded against
that object (an unusable or fenced node, an invalid record) and logged; it never aborts a
list, the watch, the initial sync (readiness) or any other object. An unexpected exception
is logged as a bug with the object's name, and handled as the safe case: a pod that cannot
be judged, bound and not finished, fences its node.

Pods are judged by the same rule as a rebuild (recovery.judge), with two guards for binds
of our own that the watch has not caught up with:
- while a bind is in flight, events for that pod are ignored (the bind settles it);
- an *assumed* allocation (bind done, watch not yet seen the binding) is not dropped
  because an older event or list shows the pod unbound; only a deletion, a finished
  phase, or the assumed-expiry check (a fresh GET, see `Reconciler.expire_assumed`) does.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from scheduler_plugin.cache import Cache, PodInfo
from scheduler_plugin.kube import ApiError, KubeClient, lease_path, pod_path
from scheduler_plugin.metrics import Metrics
from scheduler_plugin.recovery import (
    Holds,
    Invalid,
    Nothing,
    Verdict,
    apply_order,
    is_finished,
    judge,
    pod_identity,
    pod_node,
    record_text,
    section,
)
from tessera.allocation import PodAllocation
from tessera.errors import StateError
from tessera.record import KeySource
from tessera.resources import (
    ALLOCATION_ANNOTATION,
    HEARTBEAT_LEASE_PREFIX,
    INVENTORY_GROUP,
    INVENTORY_PLURAL,
    INVENTORY_VERSION,
)

log = logging.getLogger(__name__)

INVENTORY_PATH = f"/apis/{INVENTORY_GROUP}/{INVENTORY_VERSION}/{INVENTORY_PLURAL}"
WATCH_TIMEOUT = 290
"""Seconds a watch asks the server to keep the stream open (the server may end it sooner)."""


class Handler:
    """Receives an informer's changes."""

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        """A full list: `items` (streamed page by page) is everything that exists."""
        raise NotImplementedError

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        raise NotImplementedError


class Informer:
    """List and watch one resource path, feeding a Handler (see the module doc)."""

    def __init__(
        self,
        client: KubeClient,
        path: str,
        handler: Handler,
        *,
        name: str,
        metrics: Metrics | None = None,
        watch_timeout: int = WATCH_TIMEOUT,
        page_size: int = 500,
    ) -> None:
        self.client = client
        self.path = path
        self.handler = handler
        self.name = name
        self.metrics = metrics
        self.watch_timeout = watch_timeout
        self.page_size = page_size
        self.synced = threading.Event()
        self.resource_version = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.relists = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch-{self.name}")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        backoff = 0.2
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self.list_once()
                    need_list = False
                    backoff = 0.2
                need_list = self.watch_once()
            except ApiError as exc:
                if self._stop.is_set():
                    return
                log.warning("watch of %s failed (%s); relisting", self.name, exc)
                need_list = True
                self._stop.wait(backoff * (1 + random.random()))
                backoff = min(backoff * 2, 10.0)
            except Exception:
                log.exception("informer %s crashed; relisting", self.name)
                need_list = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def list_once(self) -> None:
        """A full list, in pages of `page_size` (a big cluster's pods never sit in memory
        as one response); the handler consumes the pages as they come."""
        self.handler.replace(self._pages())
        self.relists += 1
        if self.metrics is not None:
            self.metrics.watch_relists.labels(self.name).inc()
        self.synced.set()

    def _pages(self) -> Iterator[dict[str, Any]]:
        token = ""
        while True:
            query: dict[str, Any] = {"limit": self.page_size}
            if token:
                query["continue"] = token
            result = self.client.list(self.path, **query)
            meta = result.get("metadata") or {}
            if not token:
                # a paged list is one snapshot, at the first page's resourceVersion
                self.resource_version = str(meta.get("resourceVersion") or "")
            for item in result.get("items") or []:
                if isinstance(item, dict):
                    yield item
            token = str(meta.get("continue") or "")
            if not token:
                return

    def watch_once(self) -> bool:
        """Follow the watch until it ends. Returns True when a relist is needed."""
        query = {
            "watch": "true",
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": self.watch_timeout,
        }
        for event in self.client.stream(self.path, query, read_timeout=self.watch_timeout + 30):
            if self._stop.is_set():
                return False
            kind = event.get("type")
            obj = event.get("object")
            if not isinstance(obj, dict):
                continue
            if kind == "ERROR":
                code = obj.get("code")
                log.info("watch of %s: %s (%s); relisting", self.name, obj.get("message"), code)
                return True
            rv = section(obj, "metadata").get("resourceVersion")
            if rv:
                self.resource_version = str(rv)
            if kind == "BOOKMARK":
                continue
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                try:
                    self.handler.event(str(kind), obj)
                except Exception:
                    log.exception("handling a %s event of %s failed", kind, self.name)
        return False


def _name(obj: Mapping[str, Any]) -> str:
    name = section(obj, "metadata").get("name")
    return name if isinstance(name, str) else ""


def _bug(what: str, obj: Mapping[str, Any]) -> None:
    """Log an exception that escaped the handling of one object (a bug: handlers turn bad
    input into recorded problems), naming the object; the caller goes on."""
    log.exception("bug: handling %s %r failed; skipped it", what, _name(obj)[:253])


class InventoryHandler(Handler):
    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        objects = list(items)  # pages are fetched before the lock is taken
        with self.cache.lock:
            seen = set()
            for obj in objects:
                name = _name(obj)
                if not name:
                    continue
                seen.add(name)
                self._set(name, obj)
            for name in set(self.cache.inventories) | set(self.cache.inventory_errors):
                if name not in seen:
                    self._drop(name)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        name = _name(obj)
        if not name:
            return
        if kind == "DELETED":
            self._drop(name)
        else:
            self._set(name, obj)

    def _set(self, name: str, obj: Mapping[str, Any]) -> None:
        try:
            self.cache.set_inventory(name, obj.get("spec"))
        except Exception:
            _bug("nodedevices", obj)
            self.cache.mark_inventory_bad(name, "could not be processed (internal error)")

    def _drop(self, name: str) -> None:
        try:
            self.cache.drop_inventory(name)
        except Exception:
            _bug("nodedevices", {"metadata": {"name": name}})


class NodeHandler(Handler):
    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        self.cache.set_node_objects([n for n in map(_name, items) if n])

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        name = _name(obj)
        if name:
            self.cache.node_object(name, kind != "DELETED")


class LeaseHandler(Handler):
    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        objects = list(items)
        with self.cache.lock:
            seen = set()
            for obj in objects:
                seen.add(_name(obj))
                self.event("ADDED", obj)
            for node in list(self.cache.heartbeats.nodes()):
                if HEARTBEAT_LEASE_PREFIX + node not in seen:
                    self.event("DELETED", {"metadata": {"name": HEARTBEAT_LEASE_PREFIX + node}})

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        try:
            self.cache.lease_event(kind, obj)
        except Exception:
            _bug("lease", obj)


def _slim(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the rebuild rule reads of a pod (a full list keeps only this until sorted)."""
    meta = section(pod, "metadata")
    spec = section(pod, "spec")
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "creationTimestamp": meta.get("creationTimestamp"),
            "annotations": {ALLOCATION_ANNOTATION: record_text(pod)},
        },
        "spec": {"nodeName": spec.get("nodeName"), "priority": spec.get("priority")},
        "status": {"phase": section(pod, "status").get("phase")},
    }


def _priority(pod: Mapping[str, Any]) -> int:
    value = section(pod, "spec").get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class Reconciler(Handler):
    """Pods -> allocations (the rebuild rule, applied one pod at a time)."""

    def __init__(
        self,
        cache: Cache,
        keyring: KeySource | None,
        *,
        assume_ttl: float = 30.0,
        on_invalid: Callable[[str, str], None] | None = None,
    ) -> None:
        self.cache = cache
        self.keyring = keyring
        self.assume_ttl = assume_ttl
        self.on_invalid = on_invalid
        self._verdicts: dict[str, tuple[tuple[object, ...], Verdict]] = {}
        self._conflicting: dict[str, tuple[str, PodAllocation]] = {}
        """UID -> (pod key, allocation) of valid records that conflict with another pod's:
        retried whenever a pod on that node releases its devices."""

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        cache = self.cache
        seen: set[str] = set()
        with_records: list[dict[str, Any]] = []
        for pod in items:
            try:
                seen.add(pod_identity(pod)[0])
                if record_text(pod) is None:
                    self.apply(pod)
                else:
                    with_records.append(_slim(pod))
            except Exception:
                self._crashed(pod)
        # records are accounted oldest first, as a rebuild does (recovery.apply_order)
        for pod in sorted(with_records, key=apply_order):
            try:
                self.apply(pod)
            except Exception:
                self._crashed(pod)
        with cache.lock:
            gone = [
                uid
                for uid in list(cache.state.pods) + list(cache.state.pending)
                if uid not in seen and uid not in cache.inflight and uid not in cache.state.assumed
            ]
            for uid in gone:
                self._release(uid)
            for uid in [u for u in cache.pods if u not in seen and u not in cache.inflight]:
                del cache.pods[uid]
            for uid in [u for u in self._verdicts if u not in seen]:
                del self._verdicts[uid]
            for key, (uid, _) in list(cache.invalid_records.items()):
                if uid not in seen:
                    del cache.invalid_records[key]
            for uid in [u for u in cache.fenced_by() if u not in seen]:
                self._conflicting.pop(uid, None)
                cache.unfence(uid)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        try:
            if kind == "DELETED":
                self.deleted(obj)
            else:
                self.apply(obj)
        except Exception:
            self._crashed(obj)

    def _crashed(self, pod: Mapping[str, Any]) -> None:
        """An exception escaped the handling of one pod (a bug). The pod's record cannot
        be trusted: when bound and not finished, its node is fenced (fail closed)."""
        uid, namespace, name = pod_identity(pod)
        log.exception("bug: handling pod %s/%s failed; its record does not count", namespace, name)
        node = pod_node(pod)
        if not uid or not node or is_finished(pod):
            return
        key = f"{namespace}/{name}"
        try:
            with self.cache.lock:
                self._verdicts.pop(uid, None)
                self._invalid(key, uid, node, "could not be processed (internal error)")
        except Exception:
            log.exception("bug: fencing node %s for pod %s failed", node, key)

    def _judge(self, uid: str, pod: Mapping[str, Any]) -> Verdict:
        """judge(), remembered per pod while what it reads is unchanged: running pods get
        many status updates, and each would otherwise verify the record's signature again.
        (str hashes are keyed per process, so nobody can make two records collide.)"""
        text = record_text(pod)
        if text is None:
            self._verdicts.pop(uid, None)
            return judge(pod, self.keyring)
        _, namespace, name = pod_identity(pod)
        seen = (hash(text), pod_node(pod), is_finished(pod), namespace, name)
        hit = self._verdicts.get(uid)
        if hit is not None and hit[0] == seen:
            return hit[1]
        verdict = judge(pod, self.keyring)
        self._verdicts[uid] = (seen, verdict)
        return verdict

    def deleted(self, pod: Mapping[str, Any]) -> None:
        uid, namespace, name = pod_identity(pod)
        self._verdicts.pop(uid, None)
        cache = self.cache
        with cache.lock:
            cache.pods.pop(uid, None)
            cache.bound_at.pop(uid, None)
            cache.invalid_records.pop(f"{namespace}/{name}", None)
            self._conflicting.pop(uid, None)
            cache.unfence(uid)
            if uid in cache.inflight:
                return  # the bind fails on its own and undoes itself
            self._release(uid)

    def _release(self, uid: str) -> None:
        """Remove a pod's allocation; a record that conflicted with it may count now."""
        alloc = self.cache.state.remove(uid)
        if alloc is not None:
            self._retry_conflicts(alloc.node)

    def _retry_conflicts(self, node: str) -> None:
        cache = self.cache
        for uid, (key, alloc) in sorted(self._conflicting.items()):
            if alloc.node != node or uid in cache.inflight:
                continue
            try:
                cache.state.add(alloc)
            except StateError:
                continue
            del self._conflicting[uid]
            cache.invalid_records.pop(key, None)
            cache.unfence(uid)

    def apply(self, pod: Mapping[str, Any], *, authoritative: bool = False) -> None:
        """Account one pod as the rebuild rule says. `authoritative`: the object was just
        read (not a possibly stale event), so it may drop an assumed allocation."""
        uid, namespace, name = pod_identity(pod)
        if not uid:
            return
        key = f"{namespace}/{name}"
        cache = self.cache
        verdict = self._judge(uid, pod)
        with cache.lock:
            node = pod_node(pod)
            cache.pods[uid] = PodInfo(namespace, name, node, _priority(pod))
            current = cache.state.allocation(uid)
            if uid in cache.inflight:
                # The bind settles this pod; only note that the watch has seen it bound.
                if isinstance(verdict, Holds) and verdict.allocation == current:
                    cache.state.confirm(uid)
                return
            if isinstance(verdict, Holds):
                alloc = verdict.allocation
                cache.bound_at.pop(uid, None)
                if current == alloc:
                    cache.state.confirm(uid)
                    self._trusted(key, uid)
                    return
                if current is not None:
                    cache.state.remove(uid)
                try:
                    cache.state.add(alloc)
                except StateError as exc:
                    # a valid record that overcommits a device with another: the devices
                    # this pod really uses are unknown, so its node is fenced
                    self._conflicting[uid] = (key, alloc)
                    self._invalid(key, uid, node, f"conflicts with another pod: {exc}")
                else:
                    self._trusted(key, uid)
                if current is not None:
                    self._retry_conflicts(current.node)
                return
            if isinstance(verdict, Invalid):
                self._invalid(key, uid, verdict.node or node, verdict.problem)
            else:
                self._trusted(key, uid)
            if current is None:
                return
            protected = (
                uid in cache.state.assumed
                and not authoritative
                and not is_finished(pod)
                and isinstance(verdict, Nothing)
            )
            if not protected:
                self._release(uid)
                cache.bound_at.pop(uid, None)

    def _trusted(self, key: str, uid: str) -> None:
        """The pod's record counts (or it has none, or it is finished): no fence."""
        self.cache.invalid_records.pop(key, None)
        self._conflicting.pop(uid, None)
        self.cache.unfence(uid)

    def _invalid(self, key: str, uid: str, node: str, problem: str) -> None:
        cache = self.cache
        if cache.invalid_records.get(key) != (uid, problem):
            log.warning("allocation record of pod %s does not count: %s", key, problem)
            if self.on_invalid is not None:
                self.on_invalid(key, problem)
        cache.invalid_records[key] = (uid, problem)
        if not problem.startswith("conflicts"):
            self._conflicting.pop(uid, None)
        if node:
            cache.fence(uid, node, key, problem)

    def expired_assumed(self, now: float) -> list[tuple[str, str, str]]:
        """(uid, namespace, name) of assumed allocations the watch has not confirmed in
        `assume_ttl` seconds after their bind finished."""
        cache = self.cache
        with cache.lock:
            result = []
            for uid, finished in list(cache.bound_at.items()):
                if uid not in cache.state.assumed:
                    del cache.bound_at[uid]
                    continue
                if now - finished >= self.assume_ttl:
                    alloc = cache.state.allocation(uid)
                    if alloc is not None:
                        result.append((uid, alloc.namespace, alloc.name))
            return result

    def expire_assumed(self, client: KubeClient, now: float | None = None) -> None:
        """Read back each stale assumed pod and judge it authoritatively."""
        for uid, namespace, name in self.expired_assumed(time.monotonic() if now is None else now):
            try:
                pod = client.get(pod_path(namespace, name))
            except ApiError as exc:
                if exc.status == 404:
                    with self.cache.lock:
                        if uid not in self.cache.inflight:
                            self._release(uid)
                            self.cache.bound_at.pop(uid, None)
                continue
            if pod_identity(pod)[0] != uid:
                with self.cache.lock:
                    if uid not in self.cache.inflight:
                        self._release(uid)
                        self.cache.bound_at.pop(uid, None)
                continue
            self.apply(pod, authoritative=True)


def informers(
    client: KubeClient,
    cache: Cache,
    reconciler: Reconciler,
    *,
    heartbeat_namespace: str,
    watch_nodes: bool = True,
    metrics: Metrics | None = None,
) -> list[Informer]:
    """The informers in sync order: nodes and inventories first, then leases, then pods."""
    result = []
    if watch_nodes:
        result.append(
            Informer(client, "/api/v1/nodes", NodeHandler(cache), name="nodes", metrics=metrics)
        )
    result += [
        Informer(
            client, INVENTORY_PATH, InventoryHandler(cache), name="nodedevices", metrics=metrics
        ),
        Informer(
            client,
            lease_path(heartbeat_namespace),
            LeaseHandler(cache),
            name="leases",
            metrics=metrics,
        ),
        Informer(client, "/api/v1/pods", reconciler, name="pods", metrics=metrics),
    ]
    return result


def wait_synced(items: Iterable[Informer], timeout: float | None = None) -> bool:
    deadline = None if timeout is None else time.monotonic() + timeout
    for informer in items:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not informer.synced.wait(left):
            return False
    return True
