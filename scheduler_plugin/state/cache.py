"""The scheduler's state: one object, one lock inside it, a small API.

`Cache` holds the cluster state (every node's free devices and every pod's allocation),
the decider, node usability and the pod bookkeeping of binds. Nothing outside reads or
writes its fields: the watches tell it what they saw (`upsert_inventory`, `node_seen`,
`lease_seen`, `pod_observed`, `pod_deleted`, the `replace_*` of a relist), a bind goes
through `assume` -> `bind` (or `forget` when it fails), and readers get immutable values
(`assess`, `preemption_view`, `snapshot`, `stats`, `node_summary`, ...). Each call takes
the lock for a short, CPU-only section; no API call is ever made while holding it.

A node takes new tessera pods only if its inventory parsed, it is not fenced, and its node
agent's heartbeat Lease is fresh; `problems()` holds the reason for every node that does
not, kept up to date on every inventory, fence or Lease event and re-checked for expiry by
`check_heartbeats`, which the service calls about once a second for the heartbeats that
just ran out (so a heartbeat is noticed stale within a second) and the nodes that have a
problem, and once a minute for every node.

A node is *fenced* while a pod bound to it and not finished carries an allocation record
that does not count (malformed, forged, copied, conflicting): that pod may be using
devices nobody can account for, so placing more pods there could double-allocate them.
The fence lifts by itself when the pod goes or its record counts again.

Pods are accounted by the rebuild rule (recovery.judge, applied by the caller outside the
lock: it verifies signatures), with two guards for binds of our own that the watch has not
caught up with:
- while a bind is in flight, what the watch shows of that pod is ignored (the bind
  settles it);
- an *assumed* allocation (bind done, watch not yet seen the binding) is not dropped
  because an older event or list shows the pod unbound; only a deletion, a finished
  phase, an authoritative read, or `assumption_gone` does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from sys import intern
from types import MappingProxyType
from typing import Any, TypeVar

from scheduler_plugin.state.heartbeats import HeartbeatTracker
from scheduler_plugin.state.usage import UsageTexts, with_usage
from scheduler_plugin.state.values import (
    AlreadyHeld,
    Assessment,
    Assumed,
    Assumption,
    Fence,
    GpuUsage,
    Holds,
    Invalid,
    NicUsage,
    Nothing,
    PodSeen,
    PreemptionView,
    Refused,
    Snapshot,
    StateReading,
    Stats,
    Verdict,
)
from tessera.allocation import PodAllocation
from tessera.cluster_decision import Decider, RowVerdicts
from tessera.cluster_state import ClusterState
from tessera.errors import StateError, TesseraError
from tessera.gang.book import Reservation, ReservationBook, Standing
from tessera.gang.plan import GangAsk, GangPlan, GangShortfall, LabelOf, plan_gang
from tessera.gang.spec import GangKey
from tessera.model import NodeInventory
from tessera.node_placement import NoFit
from tessera.node_state import NodeState
from tessera.policy_registry import make_policies
from tessera.request import PodRequest
from tessera.resources import DEFAULT_HEARTBEAT_NAMESPACE, UNITS_PER_DEVICE
from tessera.scoring_policy import Policy
from tessera.sharing import SharedValues
from tessera.stranded import StrandedGrant, stranded

log = logging.getLogger(__name__)
_T = TypeVar("_T")

DEFAULT_HEARTBEAT_GRACE = 5.0
FENCE_REASON_PODS = 3
"""Pods named in a fenced node's reason; more are counted (filter answers stay short)."""
INTERNAL_ERROR = "could not be processed (internal error)"

FenceListener = Callable[[str, str, str, str | None], None]
"""(node, pod key, pod UID, problem, or None when that pod no longer fences the node)."""
NodeListener = Callable[[str], None]


def _gpu_usage(name: str, node: NodeState) -> Iterator[GpuUsage]:
    """Each GPU of node `name` with its free compute and memory, in inventory order."""
    for slot, g in enumerate(node.inventory.gpus):
        yield GpuUsage(
            name, g.index, g.uuid, g.model, g.memory_mib, node.free_core[slot], node.free_mem[slot]
        )


_SHARED_DEVICES = SharedValues()
"""NICs and NVLink peer lists seen in NodeDevices, each kept once for every node that
has an equal one."""


def parse_inventory(name: str, spec: Any) -> NodeInventory | str:
    """A NodeDevices spec as the state takes it: the inventory, or why it cannot be used.
    Its strings are interned: 5,000 nodes repeat one GPU model, PCIe roots and bus IDs,
    and every allocation record of a GPU names its UUID again (records are decoded with
    the same `share`); interned strings go when their last holder goes. Its NICs and each
    GPU's NVLink peers are shared with equal ones of other nodes (`_SHARED_DEVICES`): at
    5,000 nodes of 8 NVLinked GPUs and 4 NICs of 8 virtual functions that saves some
    7 KB a node."""
    try:
        if not isinstance(spec, Mapping):
            raise ValueError("spec is missing or not an object")
        source = f"nodedevices/{name}"
        return NodeInventory.from_dict(
            spec, source=source, node_name=name, share=intern, shared=_SHARED_DEVICES
        )
    except (TesseraError, ValueError, TypeError, AttributeError, KeyError) as exc:
        return str(exc)
    except Exception as exc:
        log.exception("bug: parsing nodedevices/%s raised", name[:253])
        return f"cannot be read ({type(exc).__name__})"


@dataclass(slots=True)
class _AssessMemo:
    """One assessment, kept for the same pod's next question (prioritize after filter)."""

    key: object
    generation: int
    names: Sequence[str]
    """The names asked about (not copied: callers do not change a request's names)."""
    judgement: RowVerdicts
    _asked: frozenset[str] | None = None

    def covers(self, names: Sequence[str]) -> bool:
        """Whether every one of `names` was asked about. The set is made on the first
        question only: most filters are never followed by one (the best-node answer names
        one node, so kube-scheduler skips prioritize), and making it costs ~30 µs at 500
        names."""
        if self._asked is None:
            self._asked = frozenset(self.names)
        return self._asked.issuperset(names)


class Cache:
    """The scheduler's state behind one lock (see the module doc). Thread-safe."""

    __slots__ = (
        "_assess_memo",
        "_book",
        "_bound_at",
        "_clock",
        "_conflicting",
        "_decider",
        "_fence_listeners",
        "_fenced_by",
        "_fences",
        "_generation",
        "_heartbeats",
        "_inflight",
        "_invalid_records",
        "_inventories",
        "_inventory_errors",
        "_listeners",
        "_lock",
        "_monotonic",
        "_node_objects",
        "_pods",
        "_problems",
        "_problems_view",
        "_require_heartbeat",
        "_state",
        "_use_listeners",
        "_use_texts",
    )

    def __init__(
        self,
        policy: str,
        *,
        heartbeat_namespace: str = DEFAULT_HEARTBEAT_NAMESPACE,
        heartbeat_grace: float = DEFAULT_HEARTBEAT_GRACE,
        require_heartbeat: bool = True,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        policies = make_policies()
        if policy not in policies:
            raise ValueError(f"unknown policy {policy!r} (have {sorted(policies)})")
        self._lock = threading.RLock()
        self._clock = clock
        """Wall clock, for heartbeat Leases (their renewTime is wall-clock time)."""
        self._monotonic = monotonic
        """For the age of assumed allocations."""
        self._require_heartbeat = require_heartbeat
        self._state = ClusterState()
        self._decider = Decider(self._state, policies, policy)
        self._heartbeats = HeartbeatTracker(heartbeat_namespace, heartbeat_grace)
        self._inventories: dict[str, NodeInventory] = {}
        self._inventory_errors: dict[str, str] = {}
        self._node_objects: set[str] | None = None
        """Names of existing Node objects; None until the Node watch has synced (or when
        Nodes are not watched): then every inventory counts."""
        self._problems: dict[str, str] = {}
        """Nodes that take no new tessera pods, with the reason (resolvable)."""
        self._problems_view: Mapping[str, str] | None = None
        """A read-only copy of `_problems`, made on demand, dropped on every change."""
        self._invalid_records: dict[str, tuple[str, str]] = {}
        """Pod key -> (uid, problem) for records that do not count."""
        self._fences: dict[str, dict[str, tuple[str, str]]] = {}
        """Node -> {pod UID: (pod key, problem)}: bound, unfinished pods on that node whose
        record does not count (see the module doc)."""
        self._fenced_by: dict[str, str] = {}
        """Pod UID -> the node it fences."""
        self._conflicting: dict[str, tuple[str, PodAllocation]] = {}
        """UID -> (pod key, allocation) of valid records that conflict with another pod's:
        retried whenever a pod on that node releases its devices."""
        self._pods: dict[str, int] = {}
        """Every pod's priority by UID (all pods, tessera or not), for preempt: the rest of
        what the watch shows of a pod is not kept (there may be 100,000 pods)."""
        self._inflight: set[str] = set()
        """UIDs whose bind is between `assume` and `bind`/`forget`."""
        self._bound_at: dict[str, float] = {}
        """UID -> when our bind finished, for assumed allocations awaiting the watch."""
        self._generation = 0
        """Grows on every change to any node's devices or pods (the assessment memo's key)."""
        self._assess_memo: _AssessMemo | None = None
        """The last assessment: prioritize usually asks what filter just asked."""
        self._listeners: list[NodeListener] = []
        self._fence_listeners: list[FenceListener] = []
        self._use_texts = UsageTexts()
        """Each node's usage annotation as its Lease carries it, decoded only by a view
        (`node_view`): the Lease watch stays O(1) a renewal."""
        self._use_listeners: list[NodeListener] = []
        self._book = ReservationBook()
        """Gangs planned whole: each member's devices held (as assumed allocations in the
        state) until it binds, the reservation times out, or the gang changes."""
        self._state.subscribe(self._bump)

    # --- listeners ------------------------------------------------------------------------

    def subscribe(self, listener: NodeListener) -> None:
        """Call `listener(node)` after any change to a node's devices, pods or usability
        (inside the lock: listeners must only take note, e.g. mark the node dirty)."""
        with self._lock:
            self._listeners.append(listener)

    def subscribe_fences(self, listener: FenceListener) -> None:
        """Call `listener(node, key, uid, problem)` when a pod starts fencing a node or its
        reason changes, and with problem None when it stops (inside the lock: listeners
        only take note)."""
        with self._lock:
            self._fence_listeners.append(listener)

    def subscribe_usage(self, listener: NodeListener) -> None:
        """Call `listener(node)` when a node's usage annotation changes (inside the lock:
        listeners only take note). Apart from `subscribe`: usage changes on every renewal
        and is no part of the NodeDevices status the `subscribe` listeners write."""
        with self._lock:
            self._use_listeners.append(listener)

    def _use_seen(self, node: str, lease: Mapping[str, Any]) -> None:
        if self._use_texts.keep(node, lease):
            self._use_changed(node)

    def _use_gone(self, node: str) -> None:
        if self._use_texts.drop(node):
            self._use_changed(node)

    def _use_changed(self, node: str) -> None:
        for listener in self._use_listeners:
            listener(node)

    def _notify(self, node: str) -> None:
        for listener in self._listeners:
            listener(node)

    def _bump(self, node: str) -> None:
        self._generation += 1
        self._notify(node)

    # --- NodeDevices ----------------------------------------------------------------------

    def upsert_inventory(self, name: str, spec: Any) -> None:
        """A node's NodeDevices spec was seen. One that does not parse, or cannot be
        indexed, makes that node unusable (with the reason) and keeps what it had: nothing
        else changes. (Parsed before the lock is taken: decisions do not wait on it.)"""
        parsed = parse_inventory(name, spec)
        with self._lock:
            self._apply_inventory(name, parsed)

    def remove_inventory(self, name: str) -> None:
        """A node's NodeDevices was deleted: its devices leave the state."""
        with self._lock:
            self._inventories.pop(name, None)
            self._inventory_errors.pop(name, None)
            self._sync_node(name)

    def replace_inventories(self, specs: Iterable[tuple[str, Any]]) -> None:
        """A full list of NodeDevices as (name, spec): every node not in it is removed.
        Each spec is parsed as it comes (outside the lock; only the typed inventories are
        kept until the list ends), then the state takes them under the lock in one go."""
        parsed = [(name, parse_inventory(name, spec)) for name, spec in specs]
        with self._lock:
            seen = set()
            for name, inventory in parsed:
                seen.add(name)
                self._apply_inventory(name, inventory)
            for name in (set(self._inventories) | set(self._inventory_errors)) - seen:
                self.remove_inventory(name)

    def _apply_inventory(self, name: str, parsed: NodeInventory | str) -> None:
        try:
            if isinstance(parsed, str):
                self._inventory_failed(name, parsed)
            else:
                self._upsert_inventory(name, parsed)
        except Exception:
            log.exception("bug: handling nodedevices %r failed", name[:253])
            self._inventory_failed(name, INTERNAL_ERROR)

    def _upsert_inventory(self, name: str, inventory: NodeInventory) -> None:
        previous = self._inventories.get(name)
        if (
            previous == inventory
            and name not in self._inventory_errors
            and (name in self._state.nodes or not self._node_present(name))
        ):
            return  # the same devices (e.g. only the status changed): nothing to redo
        self._inventory_errors.pop(name, None)
        self._inventories[name] = inventory
        if not self._node_present(name):
            self._sync_node(name)
            return
        try:
            self._state.set_node(inventory)
        except Exception as exc:
            # e.g. a value past what the decision index holds (OverflowError): the node
            # keeps its last good inventory, or leaves the state, and is unusable
            self._restore_inventory(name, previous)
            self._inventory_failed(name, f"cannot be indexed: {type(exc).__name__}: {exc}")
            return
        self._update_problem(name)

    def _node_present(self, name: str) -> bool:
        return self._node_objects is None or name in self._node_objects

    def _sync_node(self, name: str) -> None:
        """Put the node into the state iff its inventory is known and its Node exists."""
        inventory = self._inventories.get(name)
        if inventory is not None and self._node_present(name):
            try:
                self._state.set_node(inventory)
            except Exception as exc:
                # Only an inventory that _upsert_inventory could not index gets here, and
                # it never stays in `_inventories`; still, one node must not stop the others.
                log.exception("bug: node %s cannot enter the cluster state", name)
                self._inventories.pop(name, None)
                self._drop_from_state(name)
                self._inventory_failed(name, f"cannot be indexed ({type(exc).__name__})")
                return
        elif name in self._state.nodes:
            self._state.remove_node(name)
        self._update_problem(name)

    def _drop_from_state(self, name: str) -> None:
        try:
            self._state.remove_node(name)
        except Exception:
            log.exception("bug: removing node %s from the cluster state failed", name)

    def _restore_inventory(self, name: str, previous: NodeInventory | None) -> None:
        if previous is None:
            self._inventories.pop(name, None)
            self._drop_from_state(name)
            return
        self._inventories[name] = previous
        try:
            self._state.set_node(previous)
        except Exception:
            log.exception("bug: restoring the inventory of node %s failed", name)
            self._inventories.pop(name, None)
            self._drop_from_state(name)

    def _inventory_failed(self, name: str, problem: str) -> None:
        log.warning("node inventory nodedevices/%s does not parse: %s", name, problem)
        self._inventory_errors[name] = f"device inventory nodedevices/{name} is invalid: {problem}"
        self._update_problem(name)

    # --- Node objects -------------------------------------------------------------------------

    def replace_nodes(self, names: Iterable[str] | None) -> None:
        """A full list of Node objects (None: Nodes are not watched, every inventory
        counts). A node's devices count only while its Node exists."""
        with self._lock:
            before = self._node_objects
            self._node_objects = None if names is None else set(names)
            touched = set(self._inventories) | set(before or ()) | set(self._node_objects or ())
            for name in touched:
                self._sync_node(name)

    def node_seen(self, name: str) -> None:
        self._node_object(name, True)

    def node_gone(self, name: str) -> None:
        self._node_object(name, False)

    def _node_object(self, name: str, exists: bool) -> None:
        with self._lock:
            if self._node_objects is None:
                return
            if exists:
                self._node_objects.add(name)
            else:
                self._node_objects.discard(name)
            self._sync_node(name)

    # --- heartbeat Leases -------------------------------------------------------------------

    def lease_seen(self, lease: Mapping[str, Any]) -> None:
        """A Lease was added or renewed (not a heartbeat Lease: ignored)."""
        with self._lock:
            now = self._clock()
            node = self._heartbeats.observe(lease, now)
            if node is not None:
                self._update_problem(node, now)
                self._use_seen(node, lease)

    def lease_gone(self, lease: Mapping[str, Any]) -> None:
        with self._lock:
            node = self._heartbeats.forget(lease)
            if node is not None:
                self._update_problem(node)
                self._use_gone(node)

    def replace_leases(self, leases: Iterable[Mapping[str, Any]]) -> None:
        """A full list of Leases: heartbeats missing from it are gone."""
        with self._lock:
            now = self._clock()
            seen = set()
            for lease in leases:
                try:
                    node = self._heartbeats.observe(lease, now)
                except Exception:
                    log.exception("bug: handling a lease failed; skipped it")
                    continue
                if node is not None:
                    seen.add(node)
                    self._update_problem(node, now)
                    self._use_seen(node, lease)
            for node in [n for n in self._heartbeats.nodes() if n not in seen]:
                self._heartbeats.forget_node(node)
                self._update_problem(node, now)
            for node in [n for n in self._use_texts.nodes() if n not in seen]:
                self._use_gone(node)

    def check_heartbeats(self, *, every_node: bool = False) -> None:
        """Re-check the nodes whose heartbeat ran out (heartbeats expire with time, not with
        events); `every_node`: all of them (the service does so now and then, a safety net
        that costs about 5 ms at 5,000 nodes, under the lock)."""
        with self._lock:
            now = self._clock()
            if every_node:
                names = (
                    set(self._inventories)
                    | set(self._inventory_errors)
                    | set(self._problems)
                    | set(self._fences)
                )
            else:
                # the nodes with a problem too: a silent node's reason gives its silence in
                # seconds, and kube-scheduler retries a refused pod whenever the reason it
                # records changes (its own status update requeues the pod), so a pod that
                # waits for a silent node keeps being retried and goes once it is back
                names = set(self._heartbeats.expired(now)) | set(self._problems)
            for name in names:
                self._update_problem(name, now)

    # --- pods (the watch) -------------------------------------------------------------------

    def pod_observed(self, pod: PodSeen, verdict: Verdict, *, authoritative: bool = False) -> None:
        """Account one pod as the rebuild rule judged it. `authoritative`: the object was
        just read (not a possibly stale event), so it may drop an assumed allocation."""
        with self._lock:
            uid, key = pod.uid, pod.key
            self._pods[uid] = pod.priority
            current = self._state.allocation(uid)
            if uid in self._inflight:
                # The bind settles this pod; only note that the watch has seen it bound.
                if isinstance(verdict, Holds) and verdict.allocation == current:
                    self._state.confirm(uid)
                return
            if isinstance(verdict, Holds):
                alloc = verdict.allocation
                self._bound_at.pop(uid, None)
                if current == alloc:
                    self._state.confirm(uid)
                    self._trusted(key, uid)
                    return
                if current is not None:
                    self._state.remove(uid)
                try:
                    self._state.add(alloc)
                except StateError as exc:
                    # a valid record that overcommits a device with another: the devices
                    # this pod really uses are unknown, so its node is fenced
                    self._conflicting[uid] = (key, alloc)
                    self._untrusted(key, uid, pod.node, f"conflicts with another pod: {exc}")
                else:
                    self._trusted(key, uid)
                if current is not None:
                    self._retry_conflicts(current.node)
                return
            if isinstance(verdict, Invalid):
                self._untrusted(key, uid, verdict.node or pod.node, verdict.problem)
            else:
                self._trusted(key, uid)
            if current is None:
                return
            protected = (
                uid in self._state.assumed
                and not authoritative
                and not pod.finished
                and isinstance(verdict, Nothing)
            )
            if not protected:
                self._release(uid)
                self._bound_at.pop(uid, None)

    def pod_deleted(self, uid: str, key: str) -> None:
        """The pod is gone: its devices are free (unless its bind is in flight: the bind
        fails on its own and undoes itself)."""
        with self._lock:
            self._pods.pop(uid, None)
            self._bound_at.pop(uid, None)
            self._invalid_records.pop(key, None)
            self._conflicting.pop(uid, None)
            self._unfence(uid)
            if uid not in self._inflight:
                self._release(uid)

    def pods_relisted(self, seen: Collection[str]) -> None:
        """A full list of pods has been observed: every pod not among the `seen` UIDs is
        gone, except binds in flight or assumed (the watch may not show them yet)."""
        with self._lock:
            assumed = self._state.assumed
            gone = [
                uid
                for uid in [*self._state.pods, *self._state.pending]
                if uid not in seen and uid not in self._inflight and uid not in assumed
            ]
            for uid in gone:
                self._release(uid)
            for uid in [u for u in self._pods if u not in seen and u not in self._inflight]:
                del self._pods[uid]
            for key, (uid, _) in list(self._invalid_records.items()):
                if uid not in seen:
                    del self._invalid_records[key]
            for uid in [u for u in self._fenced_by if u not in seen]:
                self._conflicting.pop(uid, None)
                self._unfence(uid)

    def fence(self, uid: str, node: str, key: str, problem: str) -> None:
        """Pod `uid` carries a record that does not count: it is listed as invalid and, when
        bound to `node` (not ""), fences that node."""
        with self._lock:
            self._untrusted(key, uid, node, problem)

    def unfence(self, uid: str, key: str) -> None:
        """Pod `uid`'s record counts again (or it has none, or it finished): no fence."""
        with self._lock:
            self._trusted(key, uid)

    def _release(self, uid: str) -> None:
        """Remove a pod's allocation; a record that conflicted with it may count now."""
        alloc = self._state.remove(uid)
        if alloc is not None:
            self._retry_conflicts(alloc.node)

    def _retry_conflicts(self, node: str) -> None:
        for uid, (key, alloc) in sorted(self._conflicting.items()):
            if alloc.node != node or uid in self._inflight:
                continue
            try:
                self._state.add(alloc)
            except StateError:
                continue
            del self._conflicting[uid]
            self._invalid_records.pop(key, None)
            self._unfence(uid)

    def _trusted(self, key: str, uid: str) -> None:
        self._invalid_records.pop(key, None)
        self._conflicting.pop(uid, None)
        self._unfence(uid)

    def _untrusted(self, key: str, uid: str, node: str, problem: str) -> None:
        if self._invalid_records.get(key) != (uid, problem):
            log.warning("allocation record of pod %s does not count: %s", key, problem)
        self._invalid_records[key] = (uid, problem)
        if not problem.startswith("conflicts"):
            self._conflicting.pop(uid, None)
        if node:
            self._fence(uid, node, key, problem)

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
        for listener in self._fence_listeners:
            listener(node, key, uid, problem)
        self._update_problem(node)

    def _unfence(self, uid: str) -> None:
        node = self._fenced_by.pop(uid, None)
        if node is None:
            return
        pods = self._fences.get(node, {})
        key, _ = pods.pop(uid, (uid, ""))
        if not pods:
            self._fences.pop(node, None)
            log.info("node %s unfenced: pod %s no longer carries an untrusted record", node, key)
        for listener in self._fence_listeners:
            listener(node, key, uid, None)
        self._update_problem(node)

    # --- binds ------------------------------------------------------------------------------

    def assume(self, request: PodRequest, node: str, *, gang: GangKey | None = None) -> Assumption:
        """Choose the pod's devices on `node` and hold them for the bind now starting (the
        one serialized step of a bind: concurrent binds see them taken). The caller
        finishes with `bind` (the Binding exists) or `forget` (it failed). A member of
        `gang` binds only to its reserved node, with the reserved devices."""
        with self._lock:
            uid = request.uid
            if uid in self._inflight:
                return Refused(f"a bind of {request.key} is already running")
            if gang is not None or self._book.reserved(uid):
                return self._assume_reserved(request, node, gang)
            held = self._state.allocation(uid)
            if held is not None:
                return AlreadyHeld(held)
            problem = self._problems.get(node)
            if problem is not None:
                return Refused(problem)
            # the node is chosen: only its devices are wanted, not its score
            placed = self._decider.place(request, node, scored=False)
            if isinstance(placed, NoFit):
                return Refused(placed.reason)
            alloc = placed.allocation
            try:
                self._state.add(alloc, assumed=True)
            except StateError as exc:  # cannot happen: place() saw the same state
                return Refused(f"internal conflict: {exc}")
            self._inflight.add(uid)
            return Assumed(alloc)

    def _assume_reserved(self, request: PodRequest, node: str, gang: GangKey | None) -> Assumption:
        uid = request.uid
        reserved = self._book.allocation(uid)
        if reserved is None:
            held = self._state.allocation(uid)
            if held is not None:
                return AlreadyHeld(held)
            return Refused(
                f"gang {gang}: {request.key} has no reservation (the gang is not placed)"
            )
        if reserved.node != node:
            return Refused(f"gang {gang}: {request.key} is reserved on node {reserved.node}")
        self._book.taken(uid)
        self._inflight.add(uid)
        return Assumed(reserved)

    def bind(self, uid: str) -> None:
        """The bind of an assumed pod is done: the allocation stays assumed until the watch
        shows the pod bound (or `expired_assumptions` names it)."""
        with self._lock:
            self._inflight.discard(uid)
            self._bound_at[uid] = self._monotonic()

    def forget(self, uid: str, alloc: PodAllocation) -> None:
        """The bind of an assumed pod failed: its devices are free again."""
        with self._lock:
            if self._state.allocation(uid) == alloc:
                self._state.remove(uid)
            self._inflight.discard(uid)

    def expired_assumptions(
        self, ttl: float, now: float | None = None
    ) -> list[tuple[str, str, str]]:
        """(uid, namespace, name) of assumed allocations the watch has not confirmed in
        `ttl` seconds after their bind finished (the caller reads each pod back)."""
        with self._lock:
            if now is None:
                now = self._monotonic()
            result = []
            for uid, finished in list(self._bound_at.items()):
                if uid not in self._state.assumed:
                    del self._bound_at[uid]
                    continue
                if now - finished >= ttl:
                    alloc = self._state.allocation(uid)
                    if alloc is not None:
                        result.append((uid, alloc.namespace, alloc.name))
            return result

    def assumption_gone(self, uid: str) -> None:
        """A read-back found no such pod (deleted, or another pod took the name): drop the
        assumed allocation unless a new bind of it is in flight."""
        with self._lock:
            if uid not in self._inflight:
                self._release(uid)
                self._bound_at.pop(uid, None)

    # --- gangs ----------------------------------------------------------------------------

    def reserve_gang(
        self,
        ask: GangAsk,
        timeout: float,
        *,
        names: Collection[str] | None = None,
        label_of: LabelOf,
    ) -> GangPlan | GangShortfall:
        """Plan `ask` on the usable nodes (of `names`, when given) and hold the plan's
        devices for its members, all at once, or say what is missing. Nothing is held
        unless every member fits."""
        with self._lock:
            if self._book.get(ask.key) is not None:
                return GangShortfall(ask.key, f"gang {ask.key} is already reserved")
            nodes = self._state.nodes
            problems = self._problems
            usable = {
                n: s
                for n, s in nodes.items()
                if n not in problems and (names is None or n in names)
            }
            result = plan_gang(
                ask,
                usable,
                label_of=label_of,
                policy_for=self._decider.policy_for,
                evaluate=self._evaluate,
            )
            if isinstance(result, GangShortfall):
                return result
            added: list[str] = []
            try:
                for alloc in result.allocations:
                    self._state.add(alloc, assumed=True)
                    added.append(alloc.pod_uid)
            except StateError as exc:  # a member already holds devices: plan void
                for uid in added:
                    self._state.remove(uid)
                return GangShortfall(ask.key, f"gang {ask.key}: {exc}")
            self._book.reserve(result, self._monotonic(), timeout)
            return result

    def gang_preemption_plan(
        self, ask: GangAsk, priority: int, spare: Collection[str], *, label_of: LabelOf
    ) -> GangPlan | None:
        """The plan of `ask` on the usable nodes with every pod of lower `priority` gone
        (but those in `spare`: the gang's own members, reservations, binds in flight), or
        None when the gang would not fit even then. Changes nothing."""
        with self._lock:
            spared = set(spare) | self._inflight | set(self._state.assumed)
            nodes: dict[str, NodeState] = {}
            for name, node in self._state.nodes.items():
                if name in self._problems:
                    continue
                trial = None
                for alloc in self._state.pods_on(name):
                    uid = alloc.pod_uid
                    if uid not in spared and self._pods.get(uid, 0) < priority:
                        trial = trial or node.copy()
                        trial.release(alloc)
                nodes[name] = trial or node
            result = plan_gang(ask, nodes, label_of=label_of, policy_for=self._decider.policy_for)
            return result if isinstance(result, GangPlan) else None

    def _evaluate(
        self, request: PodRequest, names: Sequence[str]
    ) -> tuple[Mapping[str, float], Mapping[str, NoFit]]:
        evaluation = self._decider.evaluate(request, names)
        return evaluation.scores, evaluation.failures

    def gang_reserved_node(self, uid: str) -> str | None:
        """The node a gang member's reservation keeps for it, or None."""
        with self._lock:
            alloc = self._book.allocation(uid)
            return None if alloc is None else alloc.node

    def gang_reservation(self, key: GangKey) -> Reservation | None:
        with self._lock:
            return self._book.get(key)

    def gang_standing(self, key: GangKey) -> Standing:
        with self._lock:
            return self._book.standing(key, self._monotonic())

    def gang_may_plan(self, key: GangKey, now: float | None = None) -> bool:
        """Not reserved, and not released too recently (ReservationBook.may_plan)."""
        with self._lock:
            return self._book.may_plan(key, self._monotonic() if now is None else now)

    def release_gang(self, key: GangKey, now: float | None = None) -> list[PodAllocation]:
        """End a gang's reservation: its members' held devices are free again."""
        with self._lock:
            freed = self._book.release(key, self._monotonic() if now is None else now)
            for alloc in freed:
                if self._state.allocation(alloc.pod_uid) == alloc:
                    self._release(alloc.pod_uid)
            return freed

    def expired_gangs(self, now: float | None = None) -> list[GangKey]:
        with self._lock:
            return self._book.expired(self._monotonic() if now is None else now)

    def gang_reservations(self) -> list[Reservation]:
        with self._lock:
            return self._book.gangs()

    @property
    def generation(self) -> int:
        """Grows on every change to any node's devices or pods."""
        return self._generation

    # --- node usability --------------------------------------------------------------------

    def _fence_reason(self, node: str) -> str | None:
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

    def _update_problem(self, node: str, now: float | None = None) -> None:
        problem = self._inventory_errors.get(node)
        if problem is None:
            problem = self._fence_reason(node)
        if problem is None and self._require_heartbeat and node in self._inventories:
            problem = self._heartbeats.problem(node, self._clock() if now is None else now)
        if self._problems.get(node) == problem:
            return
        if problem is None:
            del self._problems[node]
        else:
            self._problems[node] = problem
        self._problems_view = None
        self._notify(node)

    def _problems_now(self) -> Mapping[str, str]:
        view = self._problems_view
        if view is None:
            view = self._problems_view = MappingProxyType(dict(self._problems))
        return view

    # --- readers ----------------------------------------------------------------------------

    def assess(self, request: PodRequest, names: Sequence[str]) -> Assessment:
        """Fit and score of `request` on each of `names`, with the unusable nodes; while
        nothing changed, the same pod asked about the same nodes (or fewer) gets the same
        evaluation back (prioritize follows filter)."""
        with self._lock:
            key = (request.uid, request.shape())
            memo = self._assess_memo
            if (
                memo is not None
                and memo.key == key
                and memo.generation == self._generation
                and memo.covers(names)
            ):
                judgement = memo.judgement
            else:
                judgement = self._decider.judge(request, names)
                self._assess_memo = _AssessMemo(key, self._generation, names, judgement)
            return Assessment(judgement, self._problems_now())

    def catch_up(self, request: PodRequest) -> int:
        """Judge the nodes that changed since `request`'s shape was last judged on them
        (Decider.catch_up), so that the next filter of the shape need not; the rows judged."""
        with self._lock:
            return self._decider.catch_up(request)

    def problems(self) -> Mapping[str, str]:
        """Node -> why it takes no new tessera pods (read-only, as of now)."""
        with self._lock:
            return self._problems_now()

    def preemption_view(
        self, node: str, request: PodRequest, victims: Iterable[str]
    ) -> PreemptionView | None:
        """`node` as preempt needs it; None when its devices are unknown or it is unusable."""
        with self._lock:
            state = self._state.nodes.get(node)
            if state is None or node in self._problems:
                return None
            pods = self._pods
            return PreemptionView(
                inventory=state.inventory,
                held=MappingProxyType({a.pod_uid: a for a in self._state.pods_on(node)}),
                priorities=MappingProxyType({uid: pods.get(uid, 0) for uid in victims}),
                policy=self.policy_for(request),
            )

    def policy_for(self, request: PodRequest) -> Policy:
        return self._decider.policy_for(request)

    def allocation(self, uid: str) -> PodAllocation | None:
        """The devices the pod holds (applied, or waiting for its node), or None."""
        with self._lock:
            return self._state.allocation(uid)

    def invalid_records(self) -> Mapping[str, tuple[str, str]]:
        """Pod key -> (UID, problem) of records that do not count."""
        with self._lock:
            return MappingProxyType(dict(self._invalid_records))

    def fences(self) -> tuple[Fence, ...]:
        with self._lock:
            return self._fence_list()

    def _fence_list(self) -> tuple[Fence, ...]:
        return tuple(
            Fence(node, key, uid, problem)
            for node, pods in sorted(self._fences.items())
            for uid, (key, problem) in sorted(pods.items())
        )

    def fenced_nodes(self) -> frozenset[str]:
        """Nodes fenced for an untrusted record or an unusable inventory."""
        with self._lock:
            return frozenset(self._fences) | frozenset(self._inventory_errors)

    def assumed(self) -> frozenset[str]:
        """UIDs of allocations made by a bind that the pod watch has not confirmed yet."""
        with self._lock:
            return frozenset(self._state.assumed)

    def node_names(self) -> list[str]:
        """Every node the state can say something about (accounted or unusable)."""
        with self._lock:
            return sorted(set(self._state.nodes) | set(self._inventory_errors))

    def snapshot(self) -> Snapshot:
        """Everything, as of now (O(nodes + pods): tests and debugging, not hot paths)."""
        with self._lock:
            gpus, nics = self._usage()
            state = self._state
            return Snapshot(
                nodes=frozenset(state.nodes),
                gpus=gpus,
                nics=nics,
                allocations=MappingProxyType(dict(state.pods)),
                pending=MappingProxyType(dict(state.pending)),
                assumed=frozenset(state.assumed),
                inflight=frozenset(self._inflight),
                fences=self._fence_list(),
                problems=self._problems_now(),
                invalid_records=MappingProxyType(dict(self._invalid_records)),
                accounts=state.snapshot(),
            )

    def stats(self) -> Stats:
        with self._lock:
            state = self._state
            assumed = len(state.assumed)
            return Stats(
                unusable=len(self._problems),
                invalid_records=len(self._invalid_records),
                fenced_untrusted=len(self._fences),
                fenced_inventory=len(self._inventory_errors),
                assumed=assumed,
                confirmed=len(state.pods) - assumed,
                pending_node=len(state.pending),
                pods_known=len(self._pods),
            )

    def gpu_usage(self, names: Iterable[str]) -> tuple[GpuUsage, ...]:
        """Every GPU of the nodes `names` (those the state holds), in that order: /metrics
        reads 40,000 GPUs a few hundred nodes at a time, never all under the lock at once."""
        with self._lock:
            nodes = self._state.nodes
            return tuple(
                usage
                for name in names
                if (node := nodes.get(name)) is not None
                for usage in _gpu_usage(name, node)
            )

    def _usage(self) -> tuple[tuple[GpuUsage, ...], tuple[NicUsage, ...]]:
        gpus: list[GpuUsage] = []
        nics = []
        for name, node in sorted(self._state.nodes.items()):
            gpus.extend(_gpu_usage(name, node))
            for slot, n in enumerate(node.inventory.nics):
                nics.append(
                    NicUsage(
                        name,
                        n.ibdev,
                        n.pci_bus_id,
                        node.nic_free[slot],
                        len(n.vfs),
                        sum(node.vf_free[slot]),
                    )
                )
        return tuple(gpus), tuple(nics)

    def reading(self, read: Callable[[StateReading], _T]) -> _T:
        """`read(reading)` under the state's lock: one moment for every node it looks at.
        For the allocation page's overview and search (a few ms at 5,000 nodes)."""
        with self._lock:
            fenced = frozenset(self._fences) | frozenset(self._inventory_errors)
            return read(
                StateReading(
                    self._state,
                    self._decider,
                    self._problems_now(),
                    fenced,
                    frozenset(self._state.assumed),
                )
            )

    def bound(self, uids: Iterable[str]) -> set[str]:
        """Of `uids`, the pods that hold devices or that the (bound-pod) watch has shown."""
        with self._lock:
            state, pods = self._state, self._pods
            return {u for u in uids if u in pods or state.allocation(u) is not None}

    def pods_summary(self) -> dict[str, Any]:
        """Invalid records, assumed and in-flight binds, pods waiting for their node (the
        debug API; a fresh value the caller owns)."""
        with self._lock:
            state = self._state
            return {
                "invalidRecords": [
                    {"pod": key, "uid": uid, "problem": problem}
                    for key, (uid, problem) in sorted(self._invalid_records.items())
                ],
                "assumed": sorted(state.assumed),
                "inflight": sorted(self._inflight),
                "waitingForNode": sorted(
                    f"{a.namespace}/{a.name} -> {a.node}" for a in state.pending.values()
                ),
                "allocated": len(state.pods),
            }

    def node_view(self, name: str) -> dict[str, Any] | None:
        """`node_summary` with what the node agent reads its containers use set beside
        their grants (usage_view.with_usage): the debug API and page. Not the NodeDevices
        status, which would be rewritten on every reading. The annotation is decoded
        outside the lock, at most once per text."""
        with self._lock:  # reentrant: one moment for both
            summary = self.node_summary(name)
            reading = self._use_texts.reading(name)
        if summary is None:
            return None
        decoded = reading.decoded()
        with self._lock:
            self._use_texts.note(name, decoded)
        return with_usage(summary, decoded)

    def node_summary(self, name: str) -> dict[str, Any] | None:
        """Each device's total/free/used and who holds what (debug API and CR status; a
        fresh value the caller owns)."""
        with self._lock:
            node = self._state.nodes.get(name)
            problem = self._problems.get(name)
            fenced = [
                {"pod": key, "uid": uid, "problem": why}
                for uid, (key, why) in sorted(self._fences.get(name, {}).items())
            ]
            if node is None:
                if name not in self._inventory_errors:
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
            for alloc in self._state.pods_on(name):
                for c in alloc.containers:
                    if not c.counted:
                        continue
                    who: dict[str, Any] = {
                        "namespace": alloc.namespace,
                        "name": alloc.name,
                        "uid": alloc.pod_uid,
                        "container": c.name,
                    }
                    if alloc.pod_uid in self._state.assumed:
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
                "stranded": [
                    {
                        "namespace": s.namespace,
                        "name": s.name,
                        "uid": s.pod_uid,
                        "container": s.container,
                        "device": s.device,
                        "state": s.state,
                        "reason": s.reason,
                    }
                    for s in stranded(node.inventory, self._state.pods_on(name))
                ],
            }

    def stranded_on(self, name: str) -> list[StrandedGrant]:
        """The grants of the node's pods on a device its inventory marks unhealthy or no
        longer lists (tessera.stranded)."""
        with self._lock:
            node = self._state.nodes.get(name)
            if node is None:
                return []
            return stranded(node.inventory, self._state.pods_on(name))
