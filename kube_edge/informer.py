"""List and watch one resource, as client-go's reflector does, feeding a Handler.

- List in pages (a big cluster's pods never sit in memory as one answer); the handler
  consumes the items as they come and *replaces* what it knew (objects missing from the list
  count as deleted).
- Watch from the list's resourceVersion with bookmarks; a watch that ends is resumed from the
  last resourceVersion seen (bookmarks included).
- A 410 Gone (history compacted), an ERROR event or any failure leads to a fresh list, after
  a backoff with jitter (doubling, capped) so that many replicas do not relist in step.
- Each object is decoded and handled on its own: an event line that does not decode, a list
  item that is not an object or a handler that raises is logged and skipped; it never stops
  the list, the watch or the informer. (A list page is one JSON document: one that does not
  decode fails that list, which is retried.)

`synced` is set once the first list has been handed over (readiness waits on it).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, Final

from kube_edge.client import KubeClient, decode_event, page_items
from kube_edge.errors import ApiError

log = logging.getLogger(__name__)

WATCH_TIMEOUT: Final = 290
"""Seconds a watch asks the server to keep the stream open (the server may end it sooner;
kube-apiserver picks 5-10 minutes itself): short enough that a silently dead connection is
noticed within minutes (the read timeout is this plus READ_SLACK)."""
READ_SLACK: Final = 30
"""Seconds of silence past the watch timeout before the stream counts as dead."""
BACKOFF_START: Final = 0.2
"""First wait before a relist after a failure (seconds); doubles per failure in a row."""
BACKOFF_CAP: Final = 10.0
"""Longest wait between relists (seconds): client-go's reflector caps at about 30 s; a
scheduler that cannot see its cluster cannot decide, so it retries sooner."""


class Handler:
    """Receives an informer's changes."""

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        """A full list: `items` (streamed page by page) is everything that exists."""
        raise NotImplementedError

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        """One ADDED, MODIFIED or DELETED object."""
        raise NotImplementedError


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


@dataclass(eq=False)
class Informer:
    """List and watch one resource path, feeding a Handler (see the module doc)."""

    client: KubeClient
    path: str
    handler: Handler
    _: KW_ONLY
    name: str
    on_relist: Callable[[str], None] | None = None
    watch_timeout: int = WATCH_TIMEOUT
    page_size: int = 500
    field_selector: str = ""
    """Only the objects it selects, in the list and the watch (the server sends an object
    that starts matching as ADDED and one that stops as DELETED)."""
    label_selector: str = ""
    """Likewise, by label (e.g. `key` for every object carrying that label)."""

    def __post_init__(self) -> None:
        self.synced = threading.Event()
        self.resource_version = ""
        self.relists = 0
        self.skipped = 0
        """Objects (event lines, list items) that could not be decoded and were skipped."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch-{self.name}")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        backoff = BACKOFF_START
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self.list_once()
                    need_list = False
                    backoff = BACKOFF_START
                need_list = self.watch_once()
            except ApiError as exc:
                if self._stop.is_set():
                    return
                log.warning("watch of %s failed (%s); relisting", self.name, exc)
                need_list = True
            except Exception:
                log.exception("informer %s crashed; relisting", self.name)
                need_list = True
            else:
                continue
            self.pause(backoff * (1 + random.random()))  # jitter: replicas spread out
            backoff = min(backoff * 2, BACKOFF_CAP)

    def pause(self, seconds: float) -> None:
        """Wait before relisting after a failure (stop() ends the wait)."""
        self._stop.wait(seconds)

    def list_once(self) -> None:
        """A full list, in pages of `page_size`; the handler consumes the pages as they come."""
        self.handler.replace(self._items())
        self.relists += 1
        if self.on_relist is not None:
            self.on_relist(self.name)
        self.synced.set()

    def _items(self) -> Iterator[dict[str, Any]]:
        first = True
        for page in self.client.pages(
            self.path, self.page_size, self.field_selector, self.label_selector
        ):
            if first:
                # a paged list is one snapshot, at the first page's resourceVersion
                self.resource_version = str(_metadata(page).get("resourceVersion") or "")
                first = False
            items = page.get("items")
            total = len(items) if isinstance(items, list) else 0
            kept = 0
            # no per-item depth walk: at 150,000 pods it costs a third more CPU, and the
            # handlers read every object within their own bounds
            for item in page_items(page, None, self.name):
                kept += 1
                yield item
            self.skipped += total - kept

    def watch_once(self) -> bool:
        """Follow the watch until it ends. Returns True when a relist is needed."""
        query = {
            "watch": "true",
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": self.watch_timeout,
        }
        if self.field_selector:
            query["fieldSelector"] = self.field_selector
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        lines = self.client.stream(self.path, query, read_timeout=self.watch_timeout + READ_SLACK)
        for line in lines:
            if self._stop.is_set():
                return False
            event = decode_event(line, self.name)
            obj = event.get("object") if event is not None else None
            if event is None or not isinstance(obj, dict):
                self.skipped += 1
                continue
            kind = event.get("type")
            if kind == "ERROR":  # 410 Gone (Expired) and the like: the version is too old
                log.info(
                    "watch of %s: %s (%s); relisting",
                    self.name,
                    obj.get("message"),
                    obj.get("code"),
                )
                return True
            rv = _metadata(obj).get("resourceVersion")
            if rv:
                self.resource_version = str(rv)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                try:
                    self.handler.event(str(kind), obj)
                except Exception:
                    log.exception("handling a %s event of %s failed", kind, self.name)
        return False


def wait_synced(items: Iterable[Informer], timeout: float | None = None) -> bool:
    """Whether every informer listed once within `timeout` seconds (None: waits for ever)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for informer in items:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not informer.synced.wait(left):
            return False
    return True
