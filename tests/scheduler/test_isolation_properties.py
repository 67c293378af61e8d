"""Random sequences of cluster changes against the scheduler's state, through its public
API as the service drives it (Cache, Reconciler, the Node / NodeDevices / Lease handlers
and the real Binder over an in-memory API): binds (assume, bind), deferred watch events,
failed binds (forget), watch events while a bind is in flight, poison / copied / restored
records, finished and deleted pods, bad, overflowing, deleted and re-created NodeDevices,
deleted and re-created Nodes, heartbeat renewals, deletions and expiry (a fake clock),
assumed binds read back, relists and restarts (a rebuild from the lists), and gangs: their
reservations made by a member's filter, members binding to their reserved node (or refused
elsewhere), deleted, or timed out.

The model keeps the *truth*: what each live pod really uses (the devices its containers
were started with, whatever its record says later). After every step:
- no device is over-committed, neither by the truth (a fenced node takes nothing new)
  nor in the state;
- nothing leaks: on every device the state accounts, free + what the counted
  allocations on it use == its capacity; once all pods are gone and every event is
  delivered, nothing is left allocated;
- the fenced nodes are exactly the nodes with a live bound pod whose record is not its
  original one (or is gone), plus the nodes whose NodeDevices is bad; the unusable
  nodes are those plus the nodes whose heartbeat is missing or stale.
"""

from __future__ import annotations

import copy
import itertools
from datetime import UTC, datetime
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fuzz.surface_reconciler import MemoryApi
from scheduler_plugin.decisions.binder import BindArgs, Binder
from scheduler_plugin.decisions.extender import Extender
from scheduler_plugin.decisions.gangs import Gangs
from scheduler_plugin.state.cache import Cache
from scheduler_plugin.state.values import Assumed
from scheduler_plugin.watches.handlers import (
    GangGroupHandler,
    GangMemberHandler,
    InventoryHandler,
    LeaseHandler,
    NodeHandler,
)
from scheduler_plugin.watches.reconciler import Reconciler
from tessera import resources as rn
from tessera.record import decode
from tessera.resources import UNITS_PER_DEVICE
from tessera_testbed.inventory import nodedevices
from tests.scheduler.helpers import (
    KEYRING,
    pod,
    share,
)
from tests.scheduler.test_isolation import POISONS

NODES = ["n0", "n1"]
GPUS = 2
MEM = 81920
LEASE = 40
GRACE = 5.0
ASSUME_TTL = 30.0
T0 = 1_800_000_000.0
"""The fake clock's start (wall-clock seconds; also the cache's monotonic clock)."""


def lease(node: str, renewed: float) -> dict[str, Any]:
    text = datetime.fromtimestamp(renewed, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "metadata": {"name": rn.HEARTBEAT_LEASE_PREFIX + node},
        "spec": {"leaseDurationSeconds": LEASE, "renewTime": text},
    }


def bad_inventory(node: str, overflow: bool) -> dict[str, Any]:
    obj = nodedevices(node, gpus=GPUS, mem=MEM)
    obj["spec"]["gpus"][1]["memoryMiB"] = 2**64 if overflow else "lots"
    return obj


class Cluster(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.api = MemoryApi()
        self.inventories = {n: nodedevices(n, gpus=GPUS, mem=MEM) for n in NODES}
        self.bad: set[str] = set()
        self.truth: dict[str, tuple[str, list[tuple[str, int, int]]]] = {}
        """uid -> (node, [(gpu uuid, core, memory MiB)]) of pods whose devices run."""
        self.original: dict[str, str] = {}
        """uid -> the record our bind wrote."""
        self.undelivered: list[dict[str, Any]] = []
        self.names = itertools.count()
        self.now = T0
        self.nodes = set(NODES)
        """Node objects that exist."""
        self.renewed = dict.fromkeys(NODES, T0)
        """Node -> when its heartbeat Lease was last renewed (no entry: no Lease)."""
        self.groups: dict[str, dict[str, Any]] = {}
        """PodGroups by name."""
        self._start()

    def _start(self) -> None:
        """Start (or restart) the scheduler: a fresh state rebuilt from full lists."""
        self.cache = Cache(
            "binpack",
            heartbeat_grace=GRACE,
            clock=lambda: self.now,
            monotonic=lambda: self.now,
        )
        self.reconciler = Reconciler(self.cache, KEYRING, assume_ttl=ASSUME_TTL)
        self.extender = Extender(self.cache)
        self.gangs = Gangs(self.cache, self.extender.parse)
        self.extender.gangs = self.gangs
        self.binder = Binder(self.cache, self.extender, self.api, KEYRING)  # type: ignore[arg-type]
        GangGroupHandler(self.gangs).replace(copy.deepcopy(list(self.groups.values())))
        GangMemberHandler(self.gangs).replace(
            copy.deepcopy([p for p in self.api.pods.values() if _gang_of(p)])
        )
        NodeHandler(self.cache).replace({"metadata": {"name": n}} for n in sorted(self.nodes))
        InventoryHandler(self.cache).replace(copy.deepcopy(list(self.inventories.values())))
        LeaseHandler(self.cache).replace(lease(n, t) for n, t in self.renewed.items())
        self.reconciler.replace(copy.deepcopy(list(self.api.pods.values())))
        self.undelivered.clear()

    # --- helpers ------------------------------------------------------------------------

    def _uid(self, name: str) -> str:
        return str(self.api.pods[name]["metadata"]["uid"])

    def _deliver(self, name: str | None = None) -> None:
        """Deliver waiting watch events (all, or those of one pod), in order."""
        keep = []
        for obj in self.undelivered:
            if name is None or obj["metadata"]["name"] == name:
                self.reconciler.event("MODIFIED", obj)
            else:
                keep.append(obj)
        self.undelivered = keep

    def _gang_event(self, kind: str, name: str, obj: dict[str, Any] | None = None) -> None:
        obj = obj if obj is not None else self.api.pods[name]
        if _gang_of(obj):
            GangMemberHandler(self.gangs).event(kind, copy.deepcopy(obj))

    def _reserved(self) -> dict[str, str]:
        """Member UID -> reserved node, of every reservation."""
        return {u: a.node for r in self.cache.reservations.all() for u, a in r.members.items()}

    def _live(self, bound: bool = True) -> list[str]:
        return sorted(
            n
            for n, p in self.api.pods.items()
            if not bound or (p["spec"].get("nodeName") and p["status"]["phase"] == "Running")
        )

    # --- rules ----------------------------------------------------------------------------

    @rule(core=st.sampled_from([10, 30, 50, 100]), node=st.sampled_from(NODES), defer=st.booleans())
    def bind(self, core: int, node: str, defer: bool) -> None:
        name = f"p{next(self.names)}"
        uid = f"uid-{name}"
        obj = pod(name, share(core, core) if core < 100 else {rn.GPU: 100}, uid=uid)
        obj["status"]["phase"] = "Running"
        self.api.pods[name] = obj
        result = self.binder.bind(BindArgs(name, "default", uid, node).to_json())
        if result["Error"]:
            assert self.cache.pods.allocation(uid) is None
            return
        text = obj["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION]
        alloc = decode(text, KEYRING)
        grants = [(g.uuid, g.core, g.memory_mib) for c in alloc.containers for g in c.gpus]
        self.truth[uid] = (node, grants)
        self.original[uid] = text
        self.undelivered.append(copy.deepcopy(obj))
        if not defer:
            self._deliver(name)

    @rule(node=st.sampled_from(NODES))
    def failed_bind(self, node: str) -> None:
        name = f"p{next(self.names)}"
        uid = f"uid-{name}"
        self.api.pods[name] = pod(name, share(20, 20), uid=uid)
        self.api.fail_binding = True
        try:
            result = self.binder.bind(BindArgs(name, "default", uid, node).to_json())
        finally:
            self.api.fail_binding = False
        assert result["Error"] and self.cache.pods.allocation(uid) is None
        del self.api.pods[name]
        self.reconciler.event("DELETED", pod(name, uid=uid))

    @rule(data=st.data(), record=st.sampled_from(POISONS))
    def poison_a_running_pod(self, data: st.DataObject, record: str) -> None:
        live = self._live()
        if not live:
            return
        name = data.draw(st.sampled_from(live))
        self._deliver(name)
        self.api.pods[name]["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION] = record
        self.reconciler.event("MODIFIED", copy.deepcopy(self.api.pods[name]))

    @rule(data=st.data())
    def copy_a_record(self, data: st.DataObject) -> None:
        live = self._live()
        if len(live) < 2:
            return
        source, target = data.draw(
            st.lists(st.sampled_from(live), min_size=2, max_size=2, unique=True)
        )
        self._deliver(target)
        text = self.api.pods[source]["metadata"]["annotations"].get(rn.ALLOCATION_ANNOTATION)
        self.api.pods[target]["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION] = text or "{}"
        self.reconciler.event("MODIFIED", copy.deepcopy(self.api.pods[target]))

    @rule(data=st.data())
    def remove_a_record(self, data: st.DataObject) -> None:
        live = self._live()
        if not live:
            return
        name = data.draw(st.sampled_from(live))
        self._deliver(name)
        self.api.pods[name]["metadata"]["annotations"].pop(rn.ALLOCATION_ANNOTATION, None)
        self.reconciler.event("MODIFIED", copy.deepcopy(self.api.pods[name]))

    @rule(data=st.data())
    def restore_a_record(self, data: st.DataObject) -> None:
        live = [n for n in self._live() if self._uid(n) in self.original]
        if not live:
            return
        name = data.draw(st.sampled_from(live))
        self._deliver(name)
        text = self.original[self._uid(name)]
        self.api.pods[name]["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION] = text
        self.reconciler.event("MODIFIED", copy.deepcopy(self.api.pods[name]))

    @rule(node=st.sampled_from(NODES), record=st.sampled_from(POISONS), bound=st.booleans())
    def user_pod_with_garbage(self, node: str, record: str, bound: bool) -> None:
        """A pod a user created with a record of their own, bound directly or pending."""
        name = f"u{next(self.names)}"
        obj = pod(name, share(10, 10), uid=f"uid-{name}")
        obj["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION] = record
        if bound:
            obj["spec"]["nodeName"] = node
            obj["status"]["phase"] = "Running"
        self.api.pods[name] = obj
        self.reconciler.event("ADDED", copy.deepcopy(obj))

    @rule(data=st.data(), finish=st.booleans())
    def pod_goes(self, data: st.DataObject, finish: bool) -> None:
        live = self._live(bound=False)
        if not live:
            return
        name = data.draw(st.sampled_from(live))
        self._deliver(name)
        uid = self._uid(name)
        self.truth.pop(uid, None)
        if finish:
            self.api.pods[name]["status"]["phase"] = "Succeeded"
            self.reconciler.event("MODIFIED", copy.deepcopy(self.api.pods[name]))
            self._gang_event("MODIFIED", name)
        else:
            obj = self.api.pods.pop(name)
            self.original.pop(uid, None)
            self.reconciler.event("DELETED", obj)
            self._gang_event("DELETED", name, obj)

    @rule(node=st.sampled_from(NODES), overflow=st.booleans())
    def nodedevices_breaks(self, node: str, overflow: bool) -> None:
        self.inventories[node] = bad_inventory(node, overflow)
        self.bad.add(node)
        InventoryHandler(self.cache).event("MODIFIED", copy.deepcopy(self.inventories[node]))

    @rule(node=st.sampled_from(NODES))
    def nodedevices_fixed(self, node: str) -> None:
        self.inventories[node] = nodedevices(node, gpus=GPUS, mem=MEM)
        self.bad.discard(node)
        InventoryHandler(self.cache).event("MODIFIED", copy.deepcopy(self.inventories[node]))

    @rule(node=st.sampled_from(NODES))
    def nodedevices_deleted(self, node: str) -> None:
        self.inventories.pop(node, None)
        self.bad.discard(node)
        InventoryHandler(self.cache).event("DELETED", {"metadata": {"name": node}})

    @rule(node=st.sampled_from(NODES), exists=st.booleans())
    def node_object(self, node: str, exists: bool) -> None:
        """The Node object is deleted or (re-)created: its devices count only while it
        exists."""
        (self.nodes.add if exists else self.nodes.discard)(node)
        NodeHandler(self.cache).event(
            "ADDED" if exists else "DELETED", {"metadata": {"name": node}}
        )

    @rule(node=st.sampled_from(NODES))
    def heartbeat_renewed(self, node: str) -> None:
        self.renewed[node] = self.now
        LeaseHandler(self.cache).event("MODIFIED", lease(node, self.now))

    @rule(node=st.sampled_from(NODES))
    def heartbeat_lease_deleted(self, node: str) -> None:
        self.renewed.pop(node, None)
        LeaseHandler(self.cache).event("DELETED", lease(node, self.now))

    @rule(seconds=st.sampled_from([5, 20, 45, 50]))
    def time_passes(self, seconds: int) -> None:
        """Heartbeats go stale; binds the watch never confirmed are read back."""
        self.now += seconds
        self.cache.problems.check()
        # only the heartbeats that just ran out were looked at: a look at every node
        # finds nothing more
        seen = dict(self.cache.problems.by_node())
        self.cache.problems.check(every_node=True)
        assert dict(self.cache.problems.by_node()) == seen
        self.reconciler.expire_assumed(self.api)  # type: ignore[arg-type]
        self.gangs.tick()  # reservations past their timeout are released

    @rule(node=st.sampled_from(NODES), deleted=st.booleans())
    def watch_event_during_a_bind(self, node: str, deleted: bool) -> None:
        """The watch shows a pod (unbound, or deleted) while its bind is between assume
        and its API calls: the bind settles it; when it fails, forget frees the devices."""
        name = f"p{next(self.names)}"
        uid = f"uid-{name}"
        obj = pod(name, share(20, 20), uid=uid)
        self.api.pods[name] = obj
        outcome = self.cache.pods.assume(self.extender.parse(obj), node)
        if isinstance(outcome, Assumed):
            if deleted:
                del self.api.pods[name]
            self.reconciler.event("DELETED" if deleted else "MODIFIED", copy.deepcopy(obj))
            assert self.cache.pods.allocation(uid) == outcome.allocation
            self.cache.pods.forget(uid, outcome.allocation)
        assert self.cache.pods.allocation(uid) is None
        if not deleted:
            del self.api.pods[name]
            self.reconciler.event("DELETED", obj)

    @rule()
    def deliver_events(self) -> None:
        self._deliver()

    @rule()
    def relist(self) -> None:
        self._deliver()
        self.reconciler.replace(copy.deepcopy(list(self.api.pods.values())))
        InventoryHandler(self.cache).replace(copy.deepcopy(list(self.inventories.values())))
        NodeHandler(self.cache).replace({"metadata": {"name": n}} for n in sorted(self.nodes))
        LeaseHandler(self.cache).replace(lease(n, t) for n, t in self.renewed.items())
        GangGroupHandler(self.gangs).replace(copy.deepcopy(list(self.groups.values())))
        GangMemberHandler(self.gangs).replace(
            copy.deepcopy([p for p in self.api.pods.values() if _gang_of(p)])
        )

    # --- gangs ------------------------------------------------------------------------------

    @rule(
        size=st.integers(1, 3), core=st.sampled_from([30, 100]), timeout=st.sampled_from([10, 60])
    )
    def gang_arrives(self, size: int, core: int, timeout: int) -> None:
        """A PodGroup and its members; the first member's filter plans and reserves the
        gang when it fits whole."""
        gang = f"g{next(self.names)}"
        self.groups[gang] = {
            "metadata": {"name": gang, "namespace": "default"},
            "spec": {"minMember": size, "scheduleTimeoutSeconds": timeout},
        }
        GangGroupHandler(self.gangs).event("ADDED", copy.deepcopy(self.groups[gang]))
        names = []
        for i in range(size):
            name = f"{gang}-{i}"
            obj = pod(name, share(core, core) if core < 100 else {rn.GPU: 100}, uid=f"uid-{name}")
            obj["metadata"]["labels"] = {rn.POD_GROUP_LABEL: gang}
            self.api.pods[name] = obj
            self._gang_event("ADDED", name)
            names.append(name)
        reply = self.extender.filter(
            {"Pod": copy.deepcopy(self.api.pods[names[0]]), "NodeNames": NODES}
        )
        reserved = self._reserved()
        if reply["NodeNames"]:
            # reserved whole: one node per member, the filtered one answered with its own
            assert all(f"uid-{n}" in reserved for n in names)
            assert reply["NodeNames"] == [reserved[f"uid-{names[0]}"]]
        else:
            assert not any(f"uid-{n}" in reserved for n in names)

    @rule(data=st.data(), elsewhere=st.booleans())
    def gang_member_binds(self, data: st.DataObject, elsewhere: bool) -> None:
        """A reserved member binds: on its reserved node it gets exactly the reserved
        devices; anywhere else it is refused."""
        reserved = self._reserved()
        if not reserved:
            return
        uid = data.draw(st.sampled_from(sorted(reserved)))
        name = uid.removeprefix("uid-")
        node = reserved[uid]
        if elsewhere:
            other = next(n for n in NODES if n != node)
            result = self.binder.bind(BindArgs(name, "default", uid, other).to_json())
            assert "reserved on node" in result["Error"]
            assert self._reserved()[uid] == node
            return
        expected = self.cache.pods.allocation(uid)
        result = self.binder.bind(BindArgs(name, "default", uid, node).to_json())
        if result["Error"]:
            return  # e.g. the node became unusable: the reservation stays until it times out
        obj = self.api.pods[name]
        obj["status"]["phase"] = "Running"
        text = obj["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION]
        alloc = decode(text, KEYRING)
        assert alloc == expected
        grants = [(g.uuid, g.core, g.memory_mib) for c in alloc.containers for g in c.gpus]
        self.truth[uid] = (node, grants)
        self.original[uid] = text
        self.undelivered.append(copy.deepcopy(obj))
        self._gang_event("MODIFIED", name)

    @precondition(lambda self: not self.undelivered)
    @rule()
    def restart(self) -> None:
        """A restart rebuilds from full lists what the watch built step by step (except
        that a bad NodeDevices no longer has the last good one to keep)."""
        before = self.cache.snapshot()
        reserved = self._reserved()
        self._start()
        after = self.cache.snapshot()
        # reservations are in memory only: the rebuilt state holds everything else
        kept = {
            u: a for u, a in {**before.allocations, **before.pending}.items() if u not in reserved
        }
        assert {**after.allocations, **after.pending} == kept
        assert self._reserved() == {}
        good = [[g for g in snap.gpus if g.node not in self.bad] for snap in (before, after)]
        if not reserved:  # (reserved devices are free again after a restart)
            assert good[0] == good[1]
        assert after.fences == before.fences and after.problems == before.problems
        assert after.invalid_records == before.invalid_records

    # --- invariants -------------------------------------------------------------------------

    @invariant()
    def no_device_is_overcommitted(self) -> None:
        core: dict[str, int] = {}
        mem: dict[str, int] = {}
        for _node, grants in self.truth.values():
            for uuid, c, m in grants:
                core[uuid] = core.get(uuid, 0) + c
                mem[uuid] = mem.get(uuid, 0) + m
        assert all(v <= 100 for v in core.values()), core
        assert all(v <= MEM for v in mem.values()), mem

    @invariant()
    def the_state_overcommits_nothing_and_leaks_nothing(self) -> None:
        snapshot = self.cache.snapshot()
        core: dict[str, int] = {}
        mem: dict[str, int] = {}
        for alloc in snapshot.allocations.values():
            assert alloc.node in snapshot.nodes, alloc
            for g in alloc.counted_gpu_grants():
                core[g.uuid] = core.get(g.uuid, 0) + g.core
                mem[g.uuid] = mem.get(g.uuid, 0) + g.memory_mib
        for gpu in snapshot.gpus:
            assert gpu.free_core >= 0 and gpu.free_memory_mib >= 0, gpu
            assert gpu.free_core + core.get(gpu.uuid, 0) == UNITS_PER_DEVICE, gpu
            assert gpu.free_memory_mib + mem.get(gpu.uuid, 0) == gpu.memory_mib, gpu
        reserved = self._reserved()
        for uid, node in reserved.items():
            # a reservation holds devices only for a pending member that still exists
            held = snapshot.allocations.get(uid) or snapshot.pending[uid]  # node gone: pending
            assert held.node == node
            obj = self.api.pods.get(uid.removeprefix("uid-"))
            assert obj is not None and not obj["spec"].get("nodeName"), uid
        if self.truth or self.undelivered:
            return
        assert set(snapshot.allocations) | set(snapshot.pending) <= set(reserved)
        if not reserved:
            assert all(
                g.free_core == UNITS_PER_DEVICE and g.free_memory_mib == MEM for g in snapshot.gpus
            )

    @invariant()
    def fenced_nodes_are_exactly_the_untrusted_ones(self) -> None:
        expected = set(self.bad)
        for obj in self.api.pods.values():
            node = obj["spec"].get("nodeName")
            if not node or obj["status"]["phase"] != "Running":
                continue
            text = obj["metadata"]["annotations"].get(rn.ALLOCATION_ANNOTATION)
            # every pod here asks for devices: bound and running, it needs its own record
            if text is None or text != self.original.get(obj["metadata"]["uid"]):
                expected.add(node)
        assert self.cache.problems.fenced() == expected
        silent = {
            n
            for n in self.inventories
            if n not in self.renewed or self.now - self.renewed[n] > LEASE + GRACE
        }
        assert set(self.cache.problems.by_node()) == expected | silent


def _gang_of(obj: dict[str, Any]) -> str | None:
    labels = obj["metadata"].get("labels") or {}
    return labels.get(rn.POD_GROUP_LABEL)


Cluster.TestCase.settings = settings(max_examples=100, stateful_step_count=25, deadline=None)
TestCluster = Cluster.TestCase


def test_the_shortest_double_allocation_is_fenced_off() -> None:
    """The shortest sequence that double-allocates without fencing (found by the machine
    above with fencing switched off): a running pod's record is poisoned, then a whole GPU
    is asked for on its node."""
    machine = Cluster()
    machine.bind(core=10, node="n0", defer=False)
    machine.api.pods["p0"]["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION] = POISONS[0]
    machine.reconciler.event("MODIFIED", copy.deepcopy(machine.api.pods["p0"]))
    machine.bind(core=100, node="n0", defer=False)
    machine.no_device_is_overcommitted()
    machine.fenced_nodes_are_exactly_the_untrusted_ones()
    machine.teardown()
