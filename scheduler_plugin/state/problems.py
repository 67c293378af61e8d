"""Why nodes take no new tessera pods: their inventory, their fences, their heartbeat.

A node takes new tessera pods only if its inventory parsed, it is not fenced, and its node
agent's heartbeat Lease is fresh. The reason for every node that does not is kept up to
date on every inventory, fence or Lease event and re-checked for expiry by `check`, which
the service calls about once a second for the heartbeats that just ran out (so a heartbeat
is noticed stale within a second) and the nodes that have a problem, and once a minute for
every node.

A node is *fenced* while a pod bound to it and not finished carries an allocation record
that does not count (malformed, forged, copied, conflicting): that pod may be using
devices nobody can account for, so placing more pods there could double-allocate them.
The fence lifts by itself when the pod goes or its record counts again. A valid record
that conflicts with another pod's is kept and tried again whenever a pod on its node
releases its devices.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType
from typing import Any

from scheduler_plugin.state.leases import Leases
from scheduler_plugin.state.nodes import Nodes
from scheduler_plugin.state.part import Part, Shared
from scheduler_plugin.state.values import Fence
from tessera.allocation import PodAllocation
from tessera.errors import StateError

log = logging.getLogger(__name__)

FENCE_REASON_PODS = 3
"""Pods named in a fenced node's reason; more are counted (filter answers stay short)."""
CONFLICTS = "conflicts"
"""How the problem of a valid record that conflicts with another pod's begins."""

INVALID_INVENTORY = "invalid_inventory"
UNTRUSTED_RECORD = "untrusted_record"
AGENT_SILENT = "agent_silent"
"""Why a node takes no new tessera pods, in one word (/metrics labels), in the order they
are judged: its NodeDevices does not parse or index, a running pod's record does not count
(a fence), its node agent's heartbeat Lease is missing or stale."""

FenceListener = Callable[[str, str, str, str | None], None]
"""(node, pod key, pod UID, problem, or None when that pod no longer fences the node)."""


class Problems(Part):
    """Each unusable node's reason, and the records that do not count with the fences they
    make (one part of the state: state/cache.py says the lock rule). It reads the
    inventories' and the heartbeats' reasons, and notifies the state's listeners of every
    node whose reason changed."""

    __slots__ = (
        "_closings",
        "_conflicting",
        "_fenced_by",
        "_fences",
        "_invalid",
        "_kinds",
        "_leases",
        "_listeners",
        "_nodes",
        "_problems",
        "_require_heartbeat",
        "_view",
    )

    def __init__(
        self,
        shared: Shared,
        nodes: Nodes,
        leases: Leases,
        *,
        require_heartbeat: bool,
    ) -> None:
        super().__init__(shared)
        self._nodes = nodes
        self._leases = leases
        self._require_heartbeat = require_heartbeat
        self._problems: dict[str, str] = {}
        """Nodes that take no new tessera pods, with the reason (resolvable)."""
        self._kinds: dict[str, str] = {}
        """The same nodes, with the reason's kind (INVALID_INVENTORY, ...)."""
        self._closings = 0
        """Grows whenever a node starts or stops taking pods (not when only its reason's
        text changes, as a silent node's age does every second)."""
        self._view: Mapping[str, str] | None = None
        """A read-only copy of `_problems`, made on demand, dropped on every change."""
        self._invalid: dict[str, tuple[str, str]] = {}
        """Pod key -> (uid, problem) for records that do not count."""
        self._fences: dict[str, dict[str, tuple[str, str]]] = {}
        """Node -> {pod UID: (pod key, problem)}: bound, unfinished pods on that node whose
        record does not count."""
        self._fenced_by: dict[str, str] = {}
        """Pod UID -> the node it fences."""
        self._conflicting: dict[str, tuple[str, PodAllocation]] = {}
        """UID -> (pod key, allocation) of valid records that conflict with another pod's:
        retried whenever a pod on that node releases its devices."""
        self._listeners: list[FenceListener] = []

    def subscribe_fences(self, listener: FenceListener) -> None:
        """Call `listener(node, key, uid, problem)` when a pod starts fencing a node or its
        reason changes, and with problem None when it stops (inside the lock: listeners
        only take note)."""
        with self._lock:
            self._listeners.append(listener)

    # --- usability ----------------------------------------------------------------------------

    def recheck(self, node: str, now: float | None = None) -> None:
        """Judge `node`'s usability again (as of `now`, the wall clock)."""
        with self._lock:
            kind, problem = INVALID_INVENTORY, self._nodes.error(node)
            if problem is None:
                kind, problem = UNTRUSTED_RECORD, self._fence_reason(node)
            if problem is None and self._require_heartbeat and self._nodes.has_inventory(node):
                kind = AGENT_SILENT
                problem = self._leases.problem(node, self._clock() if now is None else now)
            if self._problems.get(node) == problem:
                return
            if problem is None:
                del self._problems[node], self._kinds[node]
                self._closings += 1
            else:
                if node not in self._problems:
                    self._closings += 1
                self._problems[node] = problem
                self._kinds[node] = kind
            self._view = None
            self._notify(node)

    def check(self, *, every_node: bool = False) -> None:
        """Re-check the nodes whose heartbeat ran out (heartbeats expire with time, not with
        events); `every_node`: all of them (the service does so now and then, a safety net
        that costs about 5 ms at 5,000 nodes, under the lock)."""
        with self._lock:
            now = self._clock()
            if every_node:
                names = self._nodes.known() | set(self._problems) | set(self._fences)
            else:
                # the nodes with a problem too: a silent node's reason gives its silence in
                # seconds, and kube-scheduler retries a refused pod whenever the reason it
                # records changes (its own status update requeues the pod), so a pod that
                # waits for a silent node keeps being retried and goes once it is back
                names = set(self._leases.expired(now)) | set(self._problems)
            for name in names:
                self.recheck(name, now)

    def _fence_reason(self, node: str) -> str | None:
        """Why `node` is fenced, naming its first pods, or None."""
        pods = self._fences.get(node)
        if not pods:
            return None
        items = sorted(pods.values())
        named = "; ".join(f"pod {key}: {problem}" for key, problem in items[:FENCE_REASON_PODS])
        more = len(items) - FENCE_REASON_PODS
        if more > 0:
            named += f"; and {more} more pod(s)"
        return (
            "node is fenced: a running pod carries an untrusted allocation record, so its "
            f"device use is unknown ({named}); delete the pod or restore its record"
        )

    # --- records that do not count (the pod ledger judged them) ------------------------------

    def trust(self, key: str, uid: str) -> None:
        """Pod `uid`'s record counts (or it has none, or it finished): no fence."""
        with self._lock:
            self._invalid.pop(key, None)
            self._conflicting.pop(uid, None)
            self._unfence(uid)

    def distrust(self, key: str, uid: str, node: str, problem: str) -> None:
        """Pod `uid` carries a record that does not count: it is listed as invalid and, when
        bound to `node` (not ""), fences that node."""
        with self._lock:
            if self._invalid.get(key) != (uid, problem):
                log.warning("allocation record of pod %s does not count: %s", key, problem)
            self._invalid[key] = (uid, problem)
            if not problem.startswith(CONFLICTS):
                self._conflicting.pop(uid, None)
            if node:
                self._fence(uid, node, key, problem)

    def conflicts(
        self, key: str, uid: str, node: str, alloc: PodAllocation, exc: StateError
    ) -> None:
        """A valid record that overcommits a device with another pod's: the devices this
        pod really uses are unknown, so its node is fenced; it is tried again whenever a
        pod on that node releases its devices (`retry`)."""
        with self._lock:
            self._conflicting[uid] = (key, alloc)
            self.distrust(key, uid, node, f"{CONFLICTS} with another pod: {exc}")

    def retry(self, node: str, skip: Collection[str]) -> None:
        """A pod on `node` released its devices: the conflicting records there that fit
        now count (but those of the pods in `skip`, whose binds are in flight)."""
        with self._lock:
            for uid, (key, alloc) in sorted(self._conflicting.items()):
                if alloc.node != node or uid in skip:
                    continue
                try:
                    self._cluster.add(alloc)
                except StateError:
                    continue
                del self._conflicting[uid]
                self._invalid.pop(key, None)
                self._unfence(uid)

    def relisted(self, seen: Collection[str]) -> None:
        """A full list of pods: what is kept of the pods not among the `seen` UIDs goes."""
        with self._lock:
            for key, (uid, _) in list(self._invalid.items()):
                if uid not in seen:
                    del self._invalid[key]
            for uid in [u for u in self._fenced_by if u not in seen]:
                self._conflicting.pop(uid, None)
                self._unfence(uid)

    def _fence(self, uid: str, node: str, key: str, problem: str) -> None:
        before = self._fenced_by.get(uid)
        if before is not None and before != node:
            self._unfence(uid)
        pods = self._fences.setdefault(node, {})
        if pods.get(uid) == (key, problem):
            return
        if not pods:  # one line when the node becomes fenced; each pod's own problem
            # is logged where it is judged (a relist repeats neither)
            log.warning(
                "node %s fenced: pod %s runs with an untrusted allocation record (%s)",
                node,
                key,
                problem,
            )
        pods[uid] = (key, problem)
        self._fenced_by[uid] = node
        for listener in self._listeners:
            listener(node, key, uid, problem)
        self.recheck(node)

    def _unfence(self, uid: str) -> None:
        node = self._fenced_by.pop(uid, None)
        if node is None:
            return
        pods = self._fences.get(node, {})
        key, _ = pods.pop(uid, (uid, ""))
        if not pods:
            self._fences.pop(node, None)
            log.info("node %s unfenced: pod %s no longer carries an untrusted record", node, key)
        for listener in self._listeners:
            listener(node, key, uid, None)
        self.recheck(node)

    # --- readers ------------------------------------------------------------------------------

    def by_node(self) -> Mapping[str, str]:
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
            return frozenset(self._fences) | self._nodes.invalid()

    def count(self) -> int:
        with self._lock:
            return len(self._problems)

    @property
    def closings(self) -> int:
        """Grows whenever a node starts or stops taking new pods (a key for what was
        judged over the usable nodes, such as a gang's last plan)."""
        return self._closings

    def kinds(self, limit: int) -> list[tuple[str, str]]:
        """(node, kind of its reason) of the first `limit` unusable nodes, by name."""
        with self._lock:
            return sorted(self._kinds.items())[:limit]

    def fences(self) -> tuple[Fence, ...]:
        with self._lock:
            return tuple(
                Fence(node, key, uid, problem)
                for node, pods in sorted(self._fences.items())
                for uid, (key, problem) in sorted(pods.items())
            )

    def fencing(self, node: str) -> list[dict[str, Any]]:
        """The pods fencing `node` (a fresh value the caller owns)."""
        with self._lock:
            return [
                {"pod": key, "uid": uid, "problem": why}
                for uid, (key, why) in sorted(self._fences.get(node, {}).items())
            ]

    def fenced_by_records(self) -> frozenset[str]:
        """Nodes fenced by a pod with an untrusted record."""
        with self._lock:
            return frozenset(self._fences)

    def invalid_records(self) -> Mapping[str, tuple[str, str]]:
        """Pod key -> (UID, problem) of records that do not count (a copy)."""
        with self._lock:
            return MappingProxyType(dict(self._invalid))

    def invalid_count(self) -> int:
        with self._lock:
            return len(self._invalid)
