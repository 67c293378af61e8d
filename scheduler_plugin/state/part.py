"""What the parts of the state stand on: the one lock, the cluster state and its decider,
the clocks, and the two calls that tie the parts together (state/cache.py says the lock
rule)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from tessera.cluster_decision import Decider
from tessera.cluster_state import ClusterState


@dataclass(frozen=True, slots=True)
class Shared:
    """Built once by the Cache and handed to each of its parts."""

    lock: threading.RLock
    cluster: ClusterState
    decider: Decider
    clock: Callable[[], float]
    """Wall clock: heartbeat Leases carry wall-clock times."""
    monotonic: Callable[[], float]
    """For ages: assumed allocations, gang reservations."""
    recheck: Callable[[str, float | None], None]
    """Judge a node's usability again (as of a wall-clock time, or now): what a part calls
    when something it keeps of the node changed (its inventory, its heartbeat)."""
    notify: Callable[[str], None]
    """Tell the state's listeners that a node changed (its devices, pods or usability)."""


class Part:
    """The base of every part of the state: the shared things as its own fields (a part's
    hot paths read them directly), beside those of its concern."""

    __slots__ = ("_clock", "_cluster", "_decider", "_lock", "_monotonic", "_notify", "_recheck")

    def __init__(self, shared: Shared) -> None:
        self._lock = shared.lock
        self._cluster = shared.cluster
        self._decider = shared.decider
        self._clock = shared.clock
        self._monotonic = shared.monotonic
        self._recheck = shared.recheck
        self._notify = shared.notify
