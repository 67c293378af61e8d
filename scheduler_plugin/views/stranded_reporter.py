"""Tells the owners of pods whose devices the node no longer offers (tessera.stranded): a
GPU or NIC the node agent now reports unhealthy, or no longer lists (a node back from a
reboot without it). Each such pod gets a Warning Event once per device and state, the
gauge `tessera_scheduler_stranded_grants{state}` counts the grants, and the NodeDevices
status lists them (`status.allocation.stranded`, what `kubectl tessera nodes` shows).

Node changes only mark the node (inside the cache's lock); the ticker looks at marked
nodes once a second, off the extender's hot path. The devices' use stays accounted
whatever their state, so nothing is handed out twice when they come back."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from prometheus_client import Gauge

from scheduler_plugin.state.cache import Cache
from scheduler_plugin.views.events import DEVICE_MISSING, DEVICE_UNHEALTHY, PodEvent
from tessera.stranded import MISSING, StrandedGrant

log = logging.getLogger(__name__)


class StrandedReporter:
    def __init__(self, cache: Cache, warn: Callable[[PodEvent], None], gauge: Gauge) -> None:
        self._cache = cache
        self._warn = warn
        self._gauge = gauge
        self._lock = threading.Lock()
        self._marked: set[str] = set()
        self._known: dict[str, frozenset[StrandedGrant]] = {}
        for state in ("unhealthy", "missing"):
            gauge.labels(state).set(0)

    def mark(self, node: str) -> None:
        """A node listener: its devices, pods or usability changed."""
        with self._lock:
            self._marked.add(node)

    def flush(self) -> None:
        with self._lock:
            marked, self._marked = self._marked, set()
        for node in marked:
            now = frozenset(self._cache.stranded_on(node))
            before = self._known.get(node, frozenset())
            for grant in sorted(now - before):
                self._report(node, grant)
            if now:
                self._known[node] = now
            else:
                self._known.pop(node, None)
        if marked:
            counts = {"unhealthy": 0, "missing": 0}
            for grants in self._known.values():
                for grant in grants:
                    counts[grant.state] += 1
            for state, n in counts.items():
                self._gauge.labels(state).set(n)

    def replay(self) -> None:
        """A new leader: report again (the Event recorder's rate limit keeps it quiet)."""
        for node, grants in list(self._known.items()):
            for grant in sorted(grants):
                self._report(node, grant, quiet=True)

    def _report(self, node: str, grant: StrandedGrant, quiet: bool = False) -> None:
        message = f"on node {node}: {grant.message}"
        if not quiet:
            log.warning("pod %s/%s %s", grant.namespace, grant.name, message)
        reason = DEVICE_MISSING if grant.state == MISSING else DEVICE_UNHEALTHY
        self._warn(PodEvent(grant.namespace, grant.name, grant.pod_uid, reason, message))
