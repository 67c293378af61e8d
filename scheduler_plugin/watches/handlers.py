"""What each watched resource does to the state: NodeDevices, Nodes, Leases (the pods have
reconciler.py), and the gang objects and pods, which feed the gangs.

Every handler processes each object on its own: whatever one object holds (a poison
record, a NodeDevices past every bound, a wrong shape), its failure is recorded against
that object (an unusable or fenced node, an invalid record) and logged; it never aborts a
list, the watch, the initial sync (readiness) or any other object. An unexpected exception
is logged as a bug with the object's name, and the handler goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from kube_edge.informer import Handler
from scheduler_plugin.state.cache import Cache
from tessera.gang.spec import GangSource
from tessera.pod_fields import section

log = logging.getLogger(__name__)

LabelSink = Callable[[str, Any], None]
"""(node, its labels, or None when the Node is gone)."""


def _name(obj: Mapping[str, Any]) -> str:
    name = section(obj, "metadata").get("name")
    return name if isinstance(name, str) else ""


def _bug(what: str, obj: Mapping[str, Any]) -> None:
    """Log an exception that escaped the handling of one object (a bug: handlers turn bad
    input into recorded problems), naming the object; the caller goes on."""
    log.exception("bug: handling %s %r failed; skipped it", what, _name(obj)[:253])


def _version(obj: Mapping[str, Any]) -> tuple[object, object] | None:
    """(uid, generation) of an object, or None without a generation. The API server
    raises a NodeDevices' generation only when its spec changes (status has its own
    subresource), and a re-created object has another uid."""
    meta = section(obj, "metadata")
    generation = meta.get("generation")
    if not isinstance(generation, int) or isinstance(generation, bool):
        return None
    return (meta.get("uid"), generation)


class Feed(Handler):
    """One kind of object fed to three callables: a full list (`replaced`), an object added
    or changed (`seen`), an object deleted (`gone`). An exception that escapes `seen` or
    `gone` is `failed` (by default logged as a bug with the object's name, `what` naming
    its kind) and the watch goes on; a list's callable handles each of its objects on its
    own."""

    def __init__(
        self,
        what: str,
        replaced: Callable[[Iterable[dict[str, Any]]], None],
        seen: Callable[[dict[str, Any]], None],
        gone: Callable[[dict[str, Any]], None],
    ) -> None:
        self.what = what
        self._replaced = replaced
        self._seen = seen
        self._gone = gone

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        self._replaced(items)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        try:
            if kind == "DELETED":
                self._gone(obj)
            else:
                self._seen(obj)
        except Exception:
            self.failed(obj)

    def failed(self, obj: Mapping[str, Any]) -> None:
        """An exception escaped the handling of `obj` (a bug: handlers turn bad input into
        recorded problems): logged with the object's name; the watch goes on."""
        _bug(self.what, obj)


class InventoryHandler(Handler):
    """NodeDevices -> the cache. An event whose spec generation was already handled (a
    status write, most often the scheduler's own summary) is skipped before parsing."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self._handled: dict[str, tuple[object, object]] = {}
        """Node -> (uid, generation) of the NodeDevices last handed to the cache."""
        self.skipped = 0

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        handled: dict[str, tuple[object, object]] = {}

        def specs() -> Iterator[tuple[str, Any]]:
            for obj in items:
                name = _name(obj)
                if not name:
                    continue
                version = _version(obj)
                if version is not None:
                    handled[name] = version
                yield name, obj.get("spec")

        # the cache parses each spec as the pages come and keeps only the inventories
        self.cache.nodes.replace(specs())
        self._handled = handled

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        name = _name(obj)
        if not name:
            return
        try:
            if kind == "DELETED":
                self._handled.pop(name, None)
                self.cache.nodes.remove(name)
                return
            version = _version(obj)
            if version is not None and self._handled.get(name) == version:
                self.skipped += 1
                return
            self.cache.nodes.upsert(name, obj.get("spec"))
            if version is None:
                self._handled.pop(name, None)
            else:
                self._handled[name] = version
        except Exception:
            _bug("nodedevices", obj)


class NodeHandler(Handler):
    """Nodes -> the cache (which exist); their labels -> `on_labels` (gang topology)."""

    def __init__(self, cache: Cache, on_labels: LabelSink | None = None) -> None:
        self.cache = cache
        self.on_labels = on_labels

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        names = []
        for obj in items:
            name = _name(obj)
            if name:
                names.append(name)
                self._labels(name, obj)
        self.cache.nodes.replace_objects(names)

    def _labels(self, name: str, obj: Mapping[str, Any] | None) -> None:
        if self.on_labels is not None:
            labels = None if obj is None else section(obj, "metadata").get("labels")
            self.on_labels(name, labels if labels is not None or obj is None else {})

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        name = _name(obj)
        if name and kind == "DELETED":
            self.cache.nodes.object_gone(name)
            self._labels(name, None)
        elif name:
            self.cache.nodes.object_seen(name)
            self._labels(name, obj)


class LeaseHandler(Feed):
    """Heartbeat Leases -> the state (a full list replaces what it knew of them)."""

    def __init__(self, cache: Cache) -> None:
        leases = cache.leases
        super().__init__(
            "lease", lambda items: leases.replace(list(items)), leases.seen, leases.gone
        )


class GangFeeds(Protocol):
    """What the gang watches feed (decisions/gangs.py): the gang objects and the pods
    carrying the gang label."""

    source: GangSource

    def groups_replaced(self, items: Iterable[Mapping[str, Any]]) -> None: ...

    def group_seen(self, obj: Mapping[str, Any]) -> None: ...

    def group_gone(self, obj: Mapping[str, Any]) -> None: ...

    def members_replaced(self, items: Iterable[Mapping[str, Any]]) -> None: ...

    def member_seen(self, pod: Mapping[str, Any]) -> None: ...

    def member_gone(self, pod: Mapping[str, Any]) -> None: ...


class GangGroupHandler(Feed):
    """Gang objects (PodGroups) -> the gangs."""

    def __init__(self, gangs: GangFeeds) -> None:
        super().__init__("gang object", gangs.groups_replaced, gangs.group_seen, gangs.group_gone)


class GangMemberHandler(Feed):
    """Pods carrying the gang label, pending or bound -> the gangs."""

    def __init__(self, gangs: GangFeeds) -> None:
        super().__init__("gang pod", gangs.members_replaced, gangs.member_seen, gangs.member_gone)
