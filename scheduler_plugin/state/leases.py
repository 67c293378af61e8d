"""The node agents' heartbeat Leases as the state keeps them: each node's freshness
(heartbeats.py) and the usage reading its Lease carries (usage.py), kept as text."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from scheduler_plugin.state.heartbeats import HeartbeatTracker
from scheduler_plugin.state.part import Part, Shared
from scheduler_plugin.state.usage import Decoded, Reading, UsageTexts

log = logging.getLogger(__name__)

NodeListener = Callable[[str], None]


class Leases(Part):
    """Heartbeats and usage texts (one part of the state: state/cache.py says the lock
    rule). A node whose heartbeat was seen or went has its usability judged again."""

    __slots__ = ("_beats", "_listeners", "_texts")

    def __init__(self, shared: Shared, beats: HeartbeatTracker) -> None:
        super().__init__(shared)
        self._beats = beats
        self._texts = UsageTexts()
        """Each node's usage annotation as its Lease carries it, decoded only by a view
        (Cache.node_view): the Lease watch stays O(1) a renewal."""
        self._listeners: list[NodeListener] = []

    def subscribe_usage(self, listener: NodeListener) -> None:
        """Call `listener(node)` when a node's usage annotation changes (inside the lock:
        listeners only take note). Apart from Cache.subscribe: usage changes on every
        renewal and is no part of the NodeDevices status those listeners write."""
        with self._lock:
            self._listeners.append(listener)

    # --- the Lease watch ----------------------------------------------------------------------

    def seen(self, lease: Mapping[str, Any]) -> None:
        """A Lease was added or renewed (not a heartbeat Lease: ignored)."""
        with self._lock:
            now = self._clock()
            node = self._beats.observe(lease, now)
            if node is not None:
                self._recheck(node, now)
                self._usage_seen(node, lease)

    def gone(self, lease: Mapping[str, Any]) -> None:
        with self._lock:
            node = self._beats.forget(lease)
            if node is not None:
                self._recheck(node, None)
                self._usage_gone(node)

    def replace(self, leases: Iterable[Mapping[str, Any]]) -> None:
        """A full list of Leases: heartbeats missing from it are gone."""
        with self._lock:
            now = self._clock()
            seen = set()
            for lease in leases:
                try:
                    node = self._beats.observe(lease, now)
                except Exception:
                    log.exception("bug: handling a lease failed; skipped it")
                    continue
                if node is not None:
                    seen.add(node)
                    self._recheck(node, now)
                    self._usage_seen(node, lease)
            for node in [n for n in self._beats.nodes() if n not in seen]:
                self._beats.forget_node(node)
                self._recheck(node, now)
            for node in [n for n in self._texts.nodes() if n not in seen]:
                self._usage_gone(node)

    def _usage_seen(self, node: str, lease: Mapping[str, Any]) -> None:
        if self._texts.keep(node, lease):
            self._usage_changed(node)

    def _usage_gone(self, node: str) -> None:
        if self._texts.drop(node):
            self._usage_changed(node)

    def _usage_changed(self, node: str) -> None:
        for listener in self._listeners:
            listener(node)

    # --- readers ------------------------------------------------------------------------------

    def problem(self, node: str, now: float) -> str | None:
        """Why the node's heartbeat does not count as of `now` (missing, silent), or None."""
        with self._lock:
            return self._beats.problem(node, now)

    def expired(self, now: float) -> list[str]:
        """Nodes whose heartbeat ran out since the last call."""
        with self._lock:
            return self._beats.expired(now)

    def reading(self, node: str) -> Reading:
        """The node's usage reading (decode it outside the lock, then `note` it)."""
        with self._lock:
            return self._texts.reading(node)

    def note(self, node: str, decoded: Decoded) -> None:
        """A view decoded `node`'s reading (UsageTexts.note)."""
        with self._lock:
            self._texts.note(node, decoded)
