"""Device health as a state machine: a critical XID or a failed query makes a device
unhealthy; a quiet period of normal answers makes it healthy again.

Pure (no clock, no I/O): callers pass the time in, so transitions are tested without waiting.
Unlike NVIDIA's device plugin, which never takes a GPU back once an XID marked it, a device
returns to Healthy once it has answered queries normally for `quiet_period_s` since the last
bad sign. A quiet period of 0 disables recovery (NVIDIA's behaviour).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_QUERY_INTERVAL_S = 5.0
"""How often every GPU is queried and every NIC's ports re-read (0: never)."""
DEFAULT_QUIET_PERIOD_S = 300.0
"""A GPU marked unhealthy comes back after answering normally for this long (0: never)."""
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""Application-level XIDs (the GPU itself is fine): graphics engine exception, memory page
fault, GPU stopped processing, preemptive cleanup, video processor exception, context switch
timeout. NVIDIA's device plugin ignores the same set."""


def parse_xid_list(text: str) -> frozenset[int]:
    """ "13,31, 43" -> {13, 31, 43}; "" or "none" -> {}; raises ValueError on anything else."""
    value = text.strip().lower()
    if value in ("", "none"):
        return frozenset()
    xids: set[int] = set()
    for part in value.split(","):
        item = part.strip()
        if not item.isdigit():
            raise ValueError(f"not an XID number: {item!r} (want a comma-separated list)")
        xids.add(int(item))
    return frozenset(xids)


@dataclass(frozen=True)
class XidPolicy:
    """Which XIDs mark a GPU unhealthy."""

    ignored: frozenset[int] = DEFAULT_IGNORED_XIDS
    enabled: bool = True

    def is_critical(self, xid: int) -> bool:
        return self.enabled and xid not in self.ignored


@dataclass
class _State:
    healthy: bool = True
    reason: str = ""
    last_bad: float = 0.0


class HealthTracker:
    """Health of a set of devices, keyed by any string (GPU UUID, NIC ibdev)."""

    def __init__(self, quiet_period_s: float) -> None:
        if quiet_period_s < 0:
            raise ValueError("the quiet period cannot be negative")
        self.quiet_period_s = quiet_period_s
        self._states: dict[str, _State] = {}

    def track(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._states.setdefault(key, _State())

    def mark_unhealthy(self, key: str, reason: str, now: float) -> bool:
        """A bad sign; returns True if the device was healthy until now."""
        state = self._states.setdefault(key, _State())
        changed = state.healthy
        state.healthy = False
        state.last_bad = now
        if changed or not state.reason:
            state.reason = reason
        return changed

    def observe_ok(self, key: str, now: float) -> bool:
        """A normal answer; returns True if this ends the device's unhealthy spell."""
        state = self._states.setdefault(key, _State())
        if state.healthy or self.quiet_period_s == 0:
            return False
        if now - state.last_bad < self.quiet_period_s:
            return False
        state.healthy = True
        state.reason = ""
        return True

    def status(self, key: str) -> tuple[bool, str]:
        state = self._states.get(key)
        return (True, "") if state is None else (state.healthy, state.reason)

    def unhealthy(self) -> dict[str, str]:
        return {k: s.reason for k, s in self._states.items() if not s.healthy}
