"""Freshness of node agents' heartbeat Leases (a node whose agent is silent takes no new
tessera pods: the state's problems ask `problem` on every Lease event, and once a second
for the nodes whose heartbeat has just run out, `expired`)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tessera.pod_fields import section
from tessera.resources import HEARTBEAT_LEASE_PREFIX

DEFAULT_LEASE_DURATION = 40
"""Seconds a Lease counts when it names no valid duration (the node agent's default)."""


def parse_time(text: Any) -> float | None:
    """RFC 3339 (with or without fractional seconds) to a Unix timestamp."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(slots=True)
class _Beat:
    renew_text: str
    observed: float
    """Our wall-clock time when we saw this renewal (see HeartbeatTracker)."""
    duration: float


class HeartbeatTracker:
    """Freshness of node agents' Leases.

    A renewal counts from the moment we observe it change, not from the renewTime the agent
    wrote, so clock skew between a node and the scheduler does not matter once the Lease
    has been renewed while we watch. The first sighting (e.g. right after a restart) uses
    the written renewTime, capped at now.
    """

    __slots__ = ("_beats", "_deadlines", "grace", "namespace")

    def __init__(self, namespace: str, grace: float) -> None:
        self.namespace = namespace
        self.grace = grace
        self._beats: dict[str, _Beat] = {}
        # (when a beat runs out, node): one entry per renewal seen within about a lease
        # duration; entries of renewed or forgotten beats are dropped when they come up
        self._deadlines: list[tuple[float, str]] = []

    def _deadline(self, beat: _Beat) -> float:
        return beat.observed + beat.duration + self.grace

    def expired(self, now: float) -> list[str]:
        """Nodes whose heartbeat ran out since the last call (`problem` now says so): the
        only change to a node's freshness that no event brings."""
        due: list[str] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] < now:
            deadline, node = heapq.heappop(deadlines)
            beat = self._beats.get(node)
            if beat is not None and self._deadline(beat) == deadline:
                due.append(node)
        return due

    def observe(self, lease: Mapping[str, Any], now: float) -> str | None:
        """Record a Lease; returns the node it belongs to (None if not a heartbeat)."""
        name = section(lease, "metadata").get("name")
        if not isinstance(name, str) or not name.startswith(HEARTBEAT_LEASE_PREFIX):
            return None
        node = name[len(HEARTBEAT_LEASE_PREFIX) :]
        spec = section(lease, "spec")
        renew = str(spec.get("renewTime") or spec.get("acquireTime") or "")
        duration = spec.get("leaseDurationSeconds")
        if not isinstance(duration, int) or isinstance(duration, bool) or duration <= 0:
            duration = DEFAULT_LEASE_DURATION
        previous = self._beats.get(node)
        if previous is not None and previous.renew_text == renew:
            if previous.duration != duration:
                previous.duration = duration
                heapq.heappush(self._deadlines, (self._deadline(previous), node))
            return node
        if previous is None:
            written = parse_time(renew)
            observed = min(now, written) if written is not None else float("-inf")
        else:
            observed = now
        beat = self._beats[node] = _Beat(renew, observed, float(duration))
        heapq.heappush(self._deadlines, (self._deadline(beat), node))
        return node

    def forget(self, lease: Mapping[str, Any]) -> str | None:
        name = section(lease, "metadata").get("name")
        if not isinstance(name, str) or not name.startswith(HEARTBEAT_LEASE_PREFIX):
            return None
        node = name[len(HEARTBEAT_LEASE_PREFIX) :]
        self.forget_node(node)
        return node

    def forget_node(self, node: str) -> None:
        self._beats.pop(node, None)

    def problem(self, node: str, now: float) -> str | None:
        beat = self._beats.get(node)
        lease = f"{self.namespace}/{HEARTBEAT_LEASE_PREFIX}{node}"
        if beat is None:
            return f"node agent heartbeat Lease {lease} is missing"
        age = now - beat.observed
        if age > beat.duration + self.grace:
            silent = "ever" if age == float("inf") else f"{age:.0f}s"
            return (
                f"node agent is silent: heartbeat Lease {lease} not renewed for {silent} "
                f"(lease duration {beat.duration:.0f}s)"
            )
        return None

    def nodes(self) -> Iterable[str]:
        return self._beats.keys()
