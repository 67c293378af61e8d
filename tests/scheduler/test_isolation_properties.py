"""Random sequences of cluster changes against the scheduler's state (Cache, Reconciler,
InventoryHandler and the real Binder over an in-memory API): binds, deferred watch events,
failed binds, poison / copied / restored records, finished and deleted pods, bad and
overflowing NodeDevices, relists and restarts.

The model keeps the *truth*: what each live pod really uses (the devices its containers
were started with, whatever its record says later). After every step:
- no device is over-committed by the truth (a fenced node takes nothing new);
- once all pods are gone and every event is delivered, nothing is left allocated;
- the fenced nodes are exactly the nodes with a live bound pod whose record is not its
  original one (or is gone), plus the nodes whose NodeDevices is bad.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fuzz.surface_reconciler import MemoryApi
from scheduler_plugin.binder import Binder
from scheduler_plugin.cache import Cache
from scheduler_plugin.cluster import InventoryHandler, NodeHandler, Reconciler
from scheduler_plugin.extender import Extender
from tessera import resources as rn
from tessera.record import decode
from tests.scheduler.helpers import KEYRING, nodedevices, pod, share
from tests.scheduler.test_isolation import POISONS

NODES = ["n0", "n1"]
GPUS = 2
MEM = 81920


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
        self._start()

    def _start(self) -> None:
        self.cache = Cache("binpack", require_heartbeat=False)
        self.reconciler = Reconciler(self.cache, KEYRING)
        self.extender = Extender(self.cache)
        self.binder = Binder(self.cache, self.extender, self.api, KEYRING)  # type: ignore[arg-type]
        NodeHandler(self.cache).replace({"metadata": {"name": n}} for n in NODES)
        InventoryHandler(self.cache).replace(copy.deepcopy(list(self.inventories.values())))
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
        result = self.binder.bind(
            {"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": node}
        )
        if result["Error"]:
            assert self.cache.state.allocation(uid) is None
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
            result = self.binder.bind(
                {"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": node}
            )
        finally:
            self.api.fail_binding = False
        assert result["Error"] and self.cache.state.allocation(uid) is None
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
        else:
            obj = self.api.pods.pop(name)
            self.original.pop(uid, None)
            self.reconciler.event("DELETED", obj)

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

    @rule()
    def deliver_events(self) -> None:
        self._deliver()

    @rule()
    def relist(self) -> None:
        self._deliver()
        self.reconciler.replace(copy.deepcopy(list(self.api.pods.values())))
        InventoryHandler(self.cache).replace(copy.deepcopy(list(self.inventories.values())))

    @precondition(lambda self: not self.undelivered)
    @rule()
    def restart(self) -> None:
        self._start()

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
    def nothing_leaks(self) -> None:
        if self.truth or self.undelivered:
            return
        assert not self.cache.state.pods and not self.cache.state.pending
        for node in self.cache.state.nodes.values():
            assert node.free_core == [100] * GPUS and node.free_mem == node.total_mem

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
        assert self.cache.fenced_nodes() == expected
        assert set(self.cache.problems) == expected


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
