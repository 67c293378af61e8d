"""Which nodes take no new tessera pods, and why.

A node takes new tessera pods only if its inventory parsed, it is not fenced, and its node
agent's heartbeat Lease is fresh. The reason for every node that does not is kept up to
date on every inventory, fence or Lease event and re-checked for expiry by `check`, which
the service calls about once a second for the heartbeats that just ran out (so a heartbeat
is noticed stale within a second) and the nodes that have a problem, and once a minute for
every node.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType

from scheduler_plugin.state.leases import Leases
from scheduler_plugin.state.nodes import Nodes
from scheduler_plugin.state.records import Records


class Usability:
    """Each unusable node's reason, from the inventories, the fences and the heartbeats
    (one part of the state: the state's lock, see state/cache.py). `notify(node)` is told
    of every node whose reason changed."""

    __slots__ = (
        "_clock",
        "_leases",
        "_lock",
        "_nodes",
        "_notify",
        "_problems",
        "_records",
        "_require_heartbeat",
        "_view",
    )

    def __init__(
        self,
        lock: threading.RLock,
        nodes: Nodes,
        records: Records,
        leases: Leases,
        *,
        require_heartbeat: bool,
        clock: Callable[[], float],
        notify: Callable[[str], None],
    ) -> None:
        self._lock = lock
        self._nodes = nodes
        self._records = records
        self._leases = leases
        self._require_heartbeat = require_heartbeat
        self._clock = clock
        self._notify = notify
        self._problems: dict[str, str] = {}
        """Nodes that take no new tessera pods, with the reason (resolvable)."""
        self._view: Mapping[str, str] | None = None
        """A read-only copy of `_problems`, made on demand, dropped on every change."""

    def recheck(self, node: str, now: float | None = None) -> None:
        """Judge `node`'s usability again (as of `now`, the wall clock)."""
        with self._lock:
            problem = self._nodes.error(node)
            if problem is None:
                problem = self._records.fence_reason(node)
            if problem is None and self._require_heartbeat and self._nodes.has_inventory(node):
                problem = self._leases.problem(node, self._clock() if now is None else now)
            if self._problems.get(node) == problem:
                return
            if problem is None:
                del self._problems[node]
            else:
                self._problems[node] = problem
            self._view = None
            self._notify(node)

    def check(self, *, every_node: bool = False) -> None:
        """Re-check the nodes whose heartbeat ran out (heartbeats expire with time, not with
        events); `every_node`: all of them (the service does so now and then, a safety net
        that costs about 5 ms at 5,000 nodes, under the lock)."""
        with self._lock:
            now = self._clock()
            if every_node:
                names = self._nodes.known() | set(self._problems) | self._records.fenced()
            else:
                # the nodes with a problem too: a silent node's reason gives its silence in
                # seconds, and kube-scheduler retries a refused pod whenever the reason it
                # records changes (its own status update requeues the pod), so a pod that
                # waits for a silent node keeps being retried and goes once it is back
                names = set(self._leases.expired(now)) | set(self._problems)
            for name in names:
                self.recheck(name, now)

    # --- readers ------------------------------------------------------------------------------

    def problems(self) -> Mapping[str, str]:
        """Node -> why it takes no new tessera pods (read-only, as of now)."""
        with self._lock:
            view = self._view
            if view is None:
                view = self._view = MappingProxyType(dict(self._problems))
            return view

    def of(self, node: str) -> str | None:
        """Why `node` takes no new tessera pods, or None."""
        with self._lock:
            return self._problems.get(node)

    def fenced(self) -> frozenset[str]:
        """Nodes fenced for an untrusted record or an unusable inventory."""
        with self._lock:
            return self._records.fenced() | self._nodes.invalid()

    def count(self) -> int:
        with self._lock:
            return len(self._problems)
