"""The scheduler's shared in-memory view: cluster state, node usability, and its lock.

One re-entrant lock guards everything here. Decisions (filter, prioritize, the placement
step of bind) and the watch handlers take it for short, CPU-only sections; no API call is
ever made while holding it.

A node takes new tessera pods only if its inventory parsed, it is not fenced, and its node
agent's heartbeat Lease is fresh; `problems` holds the reason for every node that does
not, kept up to date on every inventory, fence or Lease event and re-checked for expiry by
`refresh_problems`, which the service calls about once a second (so a heartbeat is noticed
stale within a second).

A node is *fenced* while a pod bound to it and not finished carries an allocation record
that does not count (malformed, forged, copied, conflicting): that pod may be using
devices nobody can account for, so placing more pods there could double-allocate them.
The fence lifts by itself when the pod goes or its record counts again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from scheduler_plugin.recovery import section
from tessera.decision import Decider
from tessera.errors import TesseraError
from tessera.model import NodeInventory
from tessera.policies import make_policies
from tessera.resources import (
    DEFAULT_HEARTBEAT_NAMESPACE,
    HEARTBEAT_LEASE_PREFIX,
    UNITS_PER_DEVICE,
)
from tessera.state import ClusterState

log = logging.getLogger(__name__)

DEFAULT_LEASE_DURATION = 40
DEFAULT_HEARTBEAT_GRACE = 5.0
FENCE_REASON_PODS = 3
"""Pods named in a fenced node's reason; more are counted (filter answers stay short)."""

FenceListener = Callable[[str, str, str, str | None], None]
"""(node, pod key, pod UID, problem, or None when that pod no longer fences the node)."""


def parse_time(text: Any) -> float | None:
    """RFC 3339 (with or without fractional seconds) to a Unix timestamp."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass
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

    def __init__(self, namespace: str, grace: float) -> None:
        self.namespace = namespace
        self.grace = grace
        self._beats: dict[str, _Beat] = {}

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
            previous.duration = duration
            return node
        if previous is None:
            written = parse_time(renew)
            observed = min(now, written) if written is not None else float("-inf")
        else:
            observed = now
        self._beats[node] = _Beat(renew, observed, float(duration))
        return node

    def forget(self, lease: Mapping[str, Any]) -> str | None:
        name = section(lease, "metadata").get("name")
        if not isinstance(name, str) or not name.startswith(HEARTBEAT_LEASE_PREFIX):
            return None
        node = name[len(HEARTBEAT_LEASE_PREFIX) :]
        self._beats.pop(node, None)
        return node

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


@dataclass(slots=True)
class PodInfo:
    """What the scheduler keeps of every pod (small: there may be 100k pods)."""

    namespace: str
    name: str
    node: str
    priority: int


@dataclass
class Cache:
    """State, decider and node usability, behind one lock (see the module doc)."""

    policy: str
    heartbeat_namespace: str = DEFAULT_HEARTBEAT_NAMESPACE
    heartbeat_grace: float = DEFAULT_HEARTBEAT_GRACE
    require_heartbeat: bool = True
    clock: Callable[[], float] = time.time
    lock: threading.RLock = field(default_factory=threading.RLock)

    def __post_init__(self) -> None:
        self.state = ClusterState()
        self.policies = make_policies()
        if self.policy not in self.policies:
            raise ValueError(f"unknown policy {self.policy!r} (have {sorted(self.policies)})")
        self.decider = Decider(self.state, self.policies, self.policy)
        self.heartbeats = HeartbeatTracker(self.heartbeat_namespace, self.heartbeat_grace)
        self.inventories: dict[str, NodeInventory] = {}
        self.inventory_errors: dict[str, str] = {}
        self.node_objects: set[str] | None = None
        """Names of existing Node objects; None until the Node watch has synced (or when
        Nodes are not watched): then every inventory counts."""
        self.problems: dict[str, str] = {}
        """Nodes that take no new tessera pods, with the reason (resolvable)."""
        self.invalid_records: dict[str, tuple[str, str]] = {}
        """Pod key -> (uid, problem) for records that do not count."""
        self.fences: dict[str, dict[str, tuple[str, str]]] = {}
        """Node -> {pod UID: (pod key, problem)}: bound, unfinished pods on that node whose
        record does not count (see the module doc)."""
        self._fenced_by: dict[str, str] = {}
        """Pod UID -> the node it fences."""
        self._fence_listeners: list[FenceListener] = []
        self.pods: dict[str, PodInfo] = {}
        """Every pod by UID (all pods, tessera or not), for bind and preempt look-ups."""
        self.inflight: set[str] = set()
        """UIDs whose bind is between its placement and its last API call."""
        self.bound_at: dict[str, float] = {}
        """UID -> when our bind finished, for assumed allocations awaiting the watch."""
        self.generation = 0
        self._listeners: list[Callable[[str], None]] = []
        self.state.subscribe(self._bump)

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """Call `listener(node)` after any change to a node's devices, pods or usability
        (inside the lock: listeners must only take note, e.g. mark the node dirty)."""
        self._listeners.append(listener)

    def _notify(self, node: str) -> None:
        for listener in self._listeners:
            listener(node)

    def subscribe_fences(self, listener: FenceListener) -> None:
        """Call `listener(node, key, uid, problem)` when a pod starts fencing a node or its
        reason changes, and with problem None when it stops (inside the lock: listeners
        only take note)."""
        self._fence_listeners.append(listener)

    def _bump(self, node: str) -> None:
        self.generation += 1
        self._notify(node)

    # --- nodes --------------------------------------------------------------------------

    def _node_present(self, name: str) -> bool:
        return self.node_objects is None or name in self.node_objects

    def _sync_node(self, name: str) -> None:
        """Put the node into the state iff its inventory is known and its Node exists."""
        inventory = self.inventories.get(name)
        if inventory is not None and self._node_present(name):
            try:
                self.state.set_node(inventory)
            except Exception as exc:
                # Only an inventory that set_inventory could not index gets here, and it
                # never stays in `inventories`; still, one node must not stop the others.
                log.exception("bug: node %s cannot enter the cluster state", name)
                self.inventories.pop(name, None)
                self._drop_from_state(name)
                self._inventory_failed(name, f"cannot be indexed ({type(exc).__name__})")
                return
        elif name in self.state.nodes:
            self.state.remove_node(name)
        self.update_problem(name)

    def _drop_from_state(self, name: str) -> None:
        try:
            self.state.remove_node(name)
        except Exception:
            log.exception("bug: removing node %s from the cluster state failed", name)

    def set_inventory(self, name: str, spec: Any) -> None:
        """Take a node's NodeDevices spec. One that does not parse, or cannot be indexed,
        makes that node unusable (with the reason) and keeps what it had: nothing else."""
        with self.lock:
            try:
                if not isinstance(spec, Mapping):
                    raise ValueError("spec is missing or not an object")
                inventory = NodeInventory.from_dict(
                    spec, source=f"nodedevices/{name}", node_name=name
                )
            except (TesseraError, ValueError, TypeError, AttributeError, KeyError) as exc:
                self._inventory_failed(name, str(exc))
                return
            except Exception as exc:
                log.exception("bug: parsing nodedevices/%s raised", name)
                self._inventory_failed(name, f"cannot be read ({type(exc).__name__})")
                return
            previous = self.inventories.get(name)
            self.inventory_errors.pop(name, None)
            self.inventories[name] = inventory
            if not self._node_present(name):
                self._sync_node(name)
                return
            try:
                self.state.set_node(inventory)
            except Exception as exc:
                # e.g. a value past what the decision index holds (OverflowError): the
                # node keeps its last good inventory, or leaves the state, and is unusable
                self._restore_inventory(name, previous)
                self._inventory_failed(name, f"cannot be indexed: {type(exc).__name__}: {exc}")
                return
            self.update_problem(name)

    def _restore_inventory(self, name: str, previous: NodeInventory | None) -> None:
        if previous is None:
            self.inventories.pop(name, None)
            self._drop_from_state(name)
            return
        self.inventories[name] = previous
        try:
            self.state.set_node(previous)
        except Exception:
            log.exception("bug: restoring the inventory of node %s failed", name)
            self.inventories.pop(name, None)
            self._drop_from_state(name)

    def mark_inventory_bad(self, name: str, problem: str) -> None:
        with self.lock:
            self._inventory_failed(name, problem)

    def _inventory_failed(self, name: str, problem: str) -> None:
        log.warning("node inventory nodedevices/%s does not parse: %s", name, problem)
        self.inventory_errors[name] = f"device inventory nodedevices/{name} is invalid: {problem}"
        self.update_problem(name)

    def drop_inventory(self, name: str) -> None:
        with self.lock:
            self.inventories.pop(name, None)
            self.inventory_errors.pop(name, None)
            self._sync_node(name)

    def set_node_objects(self, names: Iterable[str] | None) -> None:
        with self.lock:
            before = self.node_objects
            self.node_objects = None if names is None else set(names)
            touched = set(self.inventories) | set(before or ()) | set(self.node_objects or ())
            for name in touched:
                self._sync_node(name)

    def node_object(self, name: str, exists: bool) -> None:
        with self.lock:
            if self.node_objects is None:
                return
            if exists:
                self.node_objects.add(name)
            else:
                self.node_objects.discard(name)
            self._sync_node(name)

    # --- heartbeats -----------------------------------------------------------------------

    def lease_event(self, kind: str, lease: Mapping[str, Any]) -> None:
        with self.lock:
            now = self.clock()
            if kind == "DELETED":
                node = self.heartbeats.forget(lease)
            else:
                node = self.heartbeats.observe(lease, now)
            if node is not None:
                self.update_problem(node, now)

    # --- fences -----------------------------------------------------------------------------

    def fence(self, uid: str, node: str, key: str, problem: str) -> None:
        """Pod `uid` (bound to `node`, not finished) carries a record that does not count."""
        with self.lock:
            before = self._fenced_by.get(uid)
            if before is not None and before != node:
                self.unfence(uid)
            pods = self.fences.setdefault(node, {})
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
            for listener in self._fence_listeners:
                listener(node, key, uid, problem)
            self.update_problem(node)

    def unfence(self, uid: str) -> None:
        """Pod `uid` no longer fences its node (gone, finished, or its record counts)."""
        with self.lock:
            node = self._fenced_by.pop(uid, None)
            if node is None:
                return
            pods = self.fences.get(node, {})
            key, _ = pods.pop(uid, (uid, ""))
            if not pods:
                self.fences.pop(node, None)
                log.info(
                    "node %s unfenced: pod %s no longer carries an untrusted record", node, key
                )
            for listener in self._fence_listeners:
                listener(node, key, uid, None)
            self.update_problem(node)

    def fenced_by(self) -> dict[str, str]:
        """Pod UID -> the node it fences (a copy)."""
        with self.lock:
            return dict(self._fenced_by)

    def fence_reason(self, node: str) -> str | None:
        pods = self.fences.get(node)
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

    def fenced_nodes(self) -> set[str]:
        """Nodes fenced for an untrusted record or an unusable inventory."""
        with self.lock:
            return set(self.fences) | set(self.inventory_errors)

    # --- problems -------------------------------------------------------------------------

    def update_problem(self, node: str, now: float | None = None) -> None:
        with self.lock:
            problem = self.inventory_errors.get(node)
            if problem is None:
                problem = self.fence_reason(node)
            if problem is None and self.require_heartbeat and node in self.inventories:
                problem = self.heartbeats.problem(node, self.clock() if now is None else now)
            if self.problems.get(node) == problem:
                return
            if problem is None:
                del self.problems[node]
            else:
                self.problems[node] = problem
            self._notify(node)

    def refresh_problems(self) -> None:
        """Re-check every node (heartbeats expire with time, not with events)."""
        with self.lock:
            now = self.clock()
            names = (
                set(self.inventories)
                | set(self.inventory_errors)
                | set(self.problems)
                | set(self.fences)
            )
            for name in names:
                self.update_problem(name, now)

    # --- views ----------------------------------------------------------------------------

    def node_summary(self, name: str) -> dict[str, Any] | None:
        """Each device's total/free/used and who holds what (debug API and CR status)."""
        with self.lock:
            node = self.state.nodes.get(name)
            problem = self.problems.get(name)
            fenced = [
                {"pod": key, "uid": uid, "problem": why}
                for uid, (key, why) in sorted(self.fences.get(name, {}).items())
            ]
            if node is None:
                if name not in self.inventory_errors:
                    return None
                return {
                    "node": name,
                    "usable": False,
                    "problem": problem,
                    "fenced": fenced,
                    "gpus": [],
                    "rdma": [],
                }
            holders_gpu: dict[str, list[dict[str, Any]]] = {}
            holders_nic: dict[str, list[dict[str, Any]]] = {}
            for alloc in self.state.pods_on(name):
                for c in alloc.containers:
                    if not c.counted:
                        continue
                    who: dict[str, Any] = {
                        "namespace": alloc.namespace,
                        "name": alloc.name,
                        "uid": alloc.pod_uid,
                        "container": c.name,
                    }
                    if alloc.pod_uid in self.state.assumed:
                        who["assumed"] = True
                    for g in c.gpus:
                        holders_gpu.setdefault(g.uuid, []).append(
                            who | {"core": g.core, "memoryMiB": g.memory_mib}
                        )
                    for r in c.rdma:
                        holders_nic.setdefault(r.pci_bus_id, []).append(
                            who | {"share": r.share, "vfs": [v.pci_bus_id for v in r.vfs]}
                        )
            gpus = []
            for slot, gpu in enumerate(node.inventory.gpus):
                free_core, free_mem = node.free_core[slot], node.free_mem[slot]
                gpus.append(
                    {
                        "uuid": gpu.uuid,
                        "index": gpu.index,
                        "model": gpu.model,
                        "healthy": gpu.healthy,
                        "core": {
                            "total": UNITS_PER_DEVICE,
                            "used": UNITS_PER_DEVICE - free_core,
                            "free": free_core,
                        },
                        "memoryMiB": {
                            "total": gpu.memory_mib,
                            "used": gpu.memory_mib - free_mem,
                            "free": free_mem,
                        },
                        "pods": holders_gpu.get(gpu.uuid, []),
                    }
                )
            nics = []
            for slot, n in enumerate(node.inventory.nics):
                free = node.nic_free[slot]
                nics.append(
                    {
                        "ibdev": n.ibdev,
                        "pciBusId": n.pci_bus_id,
                        "healthy": n.healthy,
                        "share": {
                            "total": UNITS_PER_DEVICE,
                            "used": UNITS_PER_DEVICE - free,
                            "free": free,
                        },
                        "vfs": {"total": len(n.vfs), "free": sum(node.vf_free[slot])},
                        "pods": holders_nic.get(n.pci_bus_id, []),
                    }
                )
            return {
                "node": name,
                "usable": problem is None,
                "problem": problem,
                "fenced": fenced,
                "gpus": gpus,
                "rdma": nics,
            }

    def node_names(self) -> list[str]:
        with self.lock:
            return sorted(set(self.state.nodes) | set(self.inventory_errors))
