"""The debug API's views: what /debug answers (nodes, pods, the page's overview, search and
"why pending"), and the change feeds behind /debug/watch, as JSON-ready values."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from scheduler_plugin.state.cache import Cache
from scheduler_plugin.views import overview
from scheduler_plugin.views.pending import EXPLAINED, Refusals, explanation, refusal_json
from tessera.gang.spec import GangKey


class GangViews(Protocol):
    """What the views read of the gangs (decisions/gangs.py)."""

    def key_of(self, uid: str) -> GangKey | None: ...

    def waiting(self) -> tuple[list[dict[str, Any]], int]: ...

    def summary(self) -> dict[str, Any]: ...


class ChangeFeed:
    """Node names changed since the last `take`, for one debug watcher."""

    def __init__(self, on_close: Callable[[ChangeFeed], None]) -> None:
        self._dirty: set[str] = set()
        self._cond = threading.Condition()
        self._on_close = on_close

    def add(self, node: str) -> None:
        with self._cond:
            self._dirty.add(node)
            self._cond.notify()

    def take(self, timeout: float) -> set[str]:
        with self._cond:
            if not self._dirty:
                self._cond.wait(timeout)
            dirty, self._dirty = self._dirty, set()
            return dirty

    def close(self) -> None:
        self._on_close(self)


class DebugViews:
    """The /debug views over the state, the gangs and the refusals. Thread-safe. `feed`
    is a node listener of the state (and of its usage readings): every change feed hears
    of each changed node."""

    def __init__(
        self, cache: Cache, gangs: GangViews | None, refusals: Refusals, *, max_watchers: int
    ) -> None:
        self.cache = cache
        self.gangs = gangs
        self.refusals = refusals
        self.max_watchers = max_watchers
        """Change feeds open at once (/debug/watch streams)."""
        self._feeds: set[ChangeFeed] = set()
        self._feeds_lock = threading.Lock()

    # --- views ------------------------------------------------------------------------------

    def overview(self) -> dict[str, Any]:
        return self.cache.reading(overview.overview)

    def search(self, query: str) -> dict[str, Any]:
        return self.cache.reading(lambda reading: overview.search(reading, query))

    def changes(self, names: list[str], sent: dict[str, Any]) -> dict[str, Any]:
        """The overview stream's line for the nodes `names` that changed (overview.changes)."""
        return self.cache.reading(partial(overview.changes, names=names, sent=sent))

    def pending(self, only: str | None = None) -> dict[str, Any]:
        """The pods tessera refused lately, newest first; the first EXPLAINED (or the pod
        `only`, namespace/name) with their explanation from the state as it is now."""
        now = time.time()
        refused = self.refusals.current(self.cache.pods.bound)
        if only is not None:
            refused = [r for r in refused if r.pod == only]
        out = []
        explained = 0
        for r in refused:
            entry = refusal_json(r, now)
            gang = None if self.gangs is None else self.gangs.key_of(r.uid)
            request = r.request
            if gang is not None:
                # placed whole or not at all: one pod's nearest fit would mislead
                entry["gang"] = str(gang)
            elif request is not None and explained < EXPLAINED:
                entry["explain"] = self.cache.reading(partial(explanation, request=request))
                explained += 1
            out.append(entry)
        gangs, total = ([], 0) if self.gangs is None else self.gangs.waiting()
        if only is not None:
            mine = {e["gang"] for e in out if "gang" in e}
            gangs = [g for g in gangs if g["gang"] in mine]
        return {
            "pods": out,
            "gangs": gangs,
            "gangsWaiting": total,
            "ttlS": self.refusals.ttl,
            "explained": EXPLAINED,
        }

    def node(self, name: str) -> dict[str, Any] | None:
        """One node's devices, holders and use (Cache.node_view), or None."""
        return self.cache.node_view(name)

    def node_names(self) -> list[str]:
        return self.cache.node_names()

    def nodes(self) -> dict[str, Any]:
        views = [self.cache.node_view(n) for n in self.cache.node_names()]
        nodes = [n for n in views if n is not None]
        # countable: nodes whose agent wrote a usage annotation that does not read
        invalid = sum(1 for n in nodes if n["usage"]["invalid"])
        return {"nodes": nodes, "usageInvalid": invalid}

    def pods(self) -> dict[str, Any]:
        summary = self.cache.pods_summary()
        if self.gangs is not None:
            summary |= self.gangs.summary()
        return summary

    # --- change feeds -----------------------------------------------------------------------

    def feed(self, node: str) -> None:
        with self._feeds_lock:
            feeds = list(self._feeds)
        for feed in feeds:
            feed.add(node)

    def watchers_full(self) -> bool:
        with self._feeds_lock:
            return len(self._feeds) >= self.max_watchers

    def watch_changes(self) -> ChangeFeed:
        feed = ChangeFeed(self._drop_feed)
        with self._feeds_lock:
            self._feeds.add(feed)
        return feed

    def _drop_feed(self, feed: ChangeFeed) -> None:
        with self._feeds_lock:
            self._feeds.discard(feed)
