"""Hostile pods and NodeDevices through the scheduler's informer handlers and rebuild.

A real Cache with its Reconciler, inventory, Node and Lease handlers and the real Binder
(over an in-memory pod API) takes a seeded stream of objects: pods whose record was
mutated (`mutate`) or replaced by crafted poison (deep nesting, non-ASCII MACs, huge
numbers, wrong types, records copied from other pods or nodes), whole pod objects mutated
(as a user may create them), and NodeDevices mutated or crafted (values past 2^63, wrong
types). Between them, legitimate pods are bound and deleted, and now and then everything
is relisted and rebuilt.

Counted:
- crashes: an exception escaping a handler, a relist, the rebuild or a bind, and one that
  a handler caught only as a last resort (logged as a bug: defence in depth must not hide
  a bug from this count);
- forgeries: a double allocation: what the legitimately bound pods really use (the
  devices they were given, whatever their records say later) over-commits a GPU; or an
  allocation counted that is not exactly one our binds wrote.

Users can change a pod's annotations but not its status or binding, so a legitimate pod
is only ever attacked through its annotations; pods the attacker creates are arbitrary.
"""

from __future__ import annotations

import copy
import json
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

from fuzz.common import Tally, mutate
from kube_edge.errors import ApiError
from scheduler_plugin.decisions.binder import Binder
from scheduler_plugin.decisions.extender import Extender
from scheduler_plugin.state.cache import Cache
from scheduler_plugin.watches.handlers import InventoryHandler, LeaseHandler, NodeHandler
from scheduler_plugin.watches.reconciler import Reconciler
from scheduler_plugin.watches.recovery import rebuild
from tessera import resources as rn
from tessera.allocation import PodAllocation
from tessera.model import NodeInventory
from tessera.record import SCHEMA_VERSION, Keyring, decode
from tessera_testbed.inventory import nodedevices as testbed_nodedevices

NODES = ("n0", "n1", "n2")
GPUS = 4
MEM = 81920
KEYRING = Keyring.generate("fuzz")
RELIST_EVERY = 200
"""Inputs between two full relists and rebuilds (each costs a pass over every object)."""
MAX_HOSTILE_PODS = 8
"""Attacker pods kept at once; older ones are deleted. Few, so that nodes get unfenced
and legitimate binds keep landing between attacks (a cluster fenced throughout would
test nothing about double allocation)."""


class MemoryApi:
    """The pod calls the Binder makes (read a pod, create its Binding), on a dict of pod
    objects by name; a Binding sets the node and its annotations in one step, as the API
    server does."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.fail_binding = False
        """Answer the next Bindings with a conflict (a bind that fails)."""

    @staticmethod
    def _name(path: str) -> str:
        return path.split("/pods/", 1)[1].split("/", 1)[0]

    def get(self, path: str) -> dict[str, Any]:
        obj = self.pods.get(self._name(path))
        if obj is None:
            raise ApiError(404, "not found")
        return copy.deepcopy(obj)

    def create(self, path: str, binding: Mapping[str, Any]) -> dict[str, Any]:
        if self.fail_binding:
            raise ApiError(409, "conflict")
        obj = self.pods[self._name(path)]
        obj["metadata"]["annotations"].update(binding["metadata"].get("annotations") or {})
        obj["spec"]["nodeName"] = binding["target"]["name"]
        return {}


def nodedevices(node: str) -> dict[str, Any]:
    return testbed_nodedevices(node, gpus=GPUS, mem=MEM)


def new_pod(name: str, core: int) -> dict[str, Any]:
    res = {rn.GPU_CORE: str(core), rn.GPU_MEMORY_RATIO: str(core)}
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {},
        },
        "spec": {"containers": [{"name": "main", "resources": {"limits": res, "requests": res}}]},
        "status": {"phase": "Running"},
    }


def crafted_records(rng: random.Random, others: list[str]) -> list[str]:
    """Poison records: each one broke a part of the scheduler once, or could."""
    mac = {"alg": "HMAC-SHA256", "keyId": "default", "mac": "\u00e9" * 64}
    records = [
        "[" * rng.choice([100, 1000, 100_000]),
        "{" * 1000,
        json.dumps({"v": SCHEMA_VERSION, "integrity": mac}),
        json.dumps({"v": 10**400}),
        json.dumps({"v": SCHEMA_VERSION, "pod": {"uid": ["x"]}, "integrity": mac}),
        "\x00" * rng.randrange(1, 5000),
        "1e999999",
        '"\\ud800"',
        "null",
        json.dumps({"v": SCHEMA_VERSION, "containers": [{"gpus": [{"core": 2**70}]}] * 50}),
    ]
    if others:
        records.append(rng.choice(others))  # a valid record copied from another pod
    return records


def crafted_nodedevices(node: str, rng: random.Random) -> dict[str, Any]:
    obj = nodedevices(node)
    gpu = obj["spec"]["gpus"][rng.randrange(GPUS)]
    field, value = rng.choice(
        [
            ("memoryMiB", 2**64),
            ("memoryMiB", 2**63 - 1),
            ("memoryMiB", -1),
            ("memoryMiB", "lots"),
            ("index", 2**70),
            ("uuid", ["x"]),
            ("numaNode", 10**30),
            ("model", {"a": 1}),
        ]
    )
    gpu[field] = value
    if rng.random() < 0.1:
        obj["spec"] = rng.choice(["x", None, [], {"gpus": "x"}])
    return obj


class _Bugs(logging.Handler):
    """Counts the last-resort catches ("bug: ..." at ERROR) as crashes."""

    def __init__(self, tally: Tally) -> None:
        super().__init__(logging.ERROR)
        self.tally = tally

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("bug:"):
            self.tally.fail("crashes", message)


class Target:
    """The scheduler's state and the model of what legitimate pods really use."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.api = MemoryApi()
        self.cache = Cache("binpack", require_heartbeat=False)
        self.reconciler = Reconciler(self.cache, KEYRING)
        self.inventory = InventoryHandler(self.cache)
        self.binder = Binder(self.cache, Extender(self.cache), self.api, KEYRING)  # type: ignore[arg-type]
        self.nodedevices = {n: nodedevices(n) for n in NODES}
        self.original: dict[str, str] = {}
        """uid -> the record our bind wrote (legitimate pods)."""
        self.truth: dict[str, PodAllocation] = {}
        self.hostile: list[dict[str, Any]] = []
        """Attacker pods that exist (they are not in `api`: nobody binds them)."""
        self.serial = 0
        self.guard(
            "node list", lambda: NodeHandler(self.cache).replace(nodedevices(n) for n in NODES)
        )
        self.guard("lease list", lambda: LeaseHandler(self.cache).replace([]))
        self.guard("nodedevices list", lambda: self.inventory.replace(self.nodedevices.values()))

    def guard(self, what: str, call: Callable[[], object]) -> None:
        try:
            call()
        except Exception as exc:  # the count this surface exists for
            self.tally.fail("crashes", f"{what}: {type(exc).__name__}: {exc}")

    def name(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial}"

    # --- legitimate traffic -------------------------------------------------------------

    def bind(self, rng: random.Random) -> None:
        name = self.name("p")
        obj = new_pod(name, rng.choice([10, 25, 50, 100]))
        self.api.pods[name] = obj
        uid = obj["metadata"]["uid"]
        args = {"PodName": name, "PodNamespace": "default", "PodUID": uid}
        result: dict[str, Any] = {}

        def call() -> None:
            result.update(self.binder.bind(args | {"Node": rng.choice(NODES)}))

        self.guard("bind", call)
        if result.get("Error", "x"):
            del self.api.pods[name]
            return
        text = obj["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION]
        self.original[uid] = text
        self.truth[uid] = decode(text, KEYRING)
        self.guard("pod event", lambda: self.reconciler.event("MODIFIED", copy.deepcopy(obj)))

    def delete_legit(self, rng: random.Random) -> None:
        if not self.truth:
            return
        uid = rng.choice(sorted(self.truth))
        name = uid.removeprefix("uid-")
        obj = self.api.pods.pop(name)
        del self.truth[uid], self.original[uid]
        self.guard("pod delete", lambda: self.reconciler.event("DELETED", obj))

    # --- attacks ----------------------------------------------------------------------------

    def attack_legit_record(self, rng: random.Random) -> None:
        """The pod's author rewrites its annotation (all a user can change on it)."""
        if not self.truth:
            return
        uid = rng.choice(sorted(self.truth))
        obj = self.api.pods[uid.removeprefix("uid-")]
        roll = rng.random()
        if roll < 0.3:
            raw = mutate(self.original[uid].encode(), rng)
            record = raw.decode("utf-8", "replace")
        elif roll < 0.6:
            record = rng.choice(crafted_records(rng, list(self.original.values())))
        elif roll < 0.7:
            record = ""  # removed
        else:
            record = self.original[uid]  # restored
        annotations = obj["metadata"]["annotations"]
        annotations[rn.ALLOCATION_ANNOTATION] = record
        if not record:
            del annotations[rn.ALLOCATION_ANNOTATION]
        kind = rng.choice(["ADDED", "MODIFIED"])
        self.guard(
            f"pod event {record[:60]!r}", lambda: self.reconciler.event(kind, copy.deepcopy(obj))
        )
        if rng.random() < 0.6:  # the operator restores it: the node must unfence
            self.check("poisoned")
            obj["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION] = self.original[uid]
            restored = copy.deepcopy(obj)
            self.guard("pod restored", lambda: self.reconciler.event("MODIFIED", restored))

    def hostile_pod(self, rng: random.Random) -> None:
        """A pod the attacker creates: any shape, bound or not, any record."""
        name = self.name("h")
        obj = new_pod(name, 10)
        obj["metadata"]["uid"] = f"h-{name}"
        obj["spec"]["nodeName"] = rng.choice([*NODES, "", "elsewhere"])
        records = crafted_records(rng, list(self.original.values()))
        obj["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION] = rng.choice(records)
        if rng.random() < 0.5:
            try:
                parsed = json.loads(mutate(json.dumps(obj).encode(), rng))
            except (ValueError, RecursionError):
                parsed = None
            if not isinstance(parsed, dict):
                return
            obj = parsed
        meta = obj.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if isinstance(uid, str) and uid in self.truth:
            return  # the API server assigns UIDs: an attacker cannot take another pod's
        self.hostile.append(obj)
        kind = rng.choice(["ADDED", "MODIFIED", "DELETED"])
        self.guard(f"hostile pod {str(obj)[:80]}", lambda: self.reconciler.event(kind, obj))
        if rng.random() < 0.7:  # most are deleted soon: their nodes must unfence
            self.check("hostile pod")
            self._drop_hostile(len(self.hostile) - 1)
        while len(self.hostile) > MAX_HOSTILE_PODS:
            self._drop_hostile(0)

    def _drop_hostile(self, index: int) -> None:
        if self.hostile:
            gone = self.hostile.pop(index)
            self.guard("hostile delete", lambda: self.reconciler.event("DELETED", gone))

    def hostile_nodedevices(self, rng: random.Random) -> None:
        node = rng.choice(NODES)
        if rng.random() < 0.5:
            obj: Any = crafted_nodedevices(node, rng)
        else:
            try:
                obj = json.loads(mutate(json.dumps(nodedevices(node)).encode(), rng))
            except (ValueError, RecursionError):
                return
            if not isinstance(obj, dict):
                return
        self.guard(f"nodedevices {str(obj)[:80]}", lambda: self.inventory.event("MODIFIED", obj))
        if rng.random() < 0.7:  # the node agent publishes a good one again
            good = nodedevices(node)
            self.guard("nodedevices fix", lambda: self.inventory.event("MODIFIED", good))

    def relist(self) -> None:
        pods = [copy.deepcopy(p) for p in [*self.api.pods.values(), *self.hostile]]
        self.guard("pod relist", lambda: self.reconciler.replace(pods))
        self.guard("nodedevices relist", lambda: self.inventory.replace(self.nodedevices.values()))
        inventories = [
            NodeInventory.from_dict(d["spec"], source="fuzz", node_name=n)
            for n, d in self.nodedevices.items()
        ]
        self.guard("rebuild", lambda: rebuild(inventories, pods, KEYRING))

    # --- the checks ------------------------------------------------------------------------

    def check(self, what: str) -> None:
        snapshot = self.cache.snapshot()
        for uid, counted in [*snapshot.allocations.items(), *snapshot.pending.items()]:
            if uid not in self.truth or counted != self.truth[uid]:
                self.tally.fail("forgeries", f"{what}: pod {uid} counted {counted}")
        core: dict[str, int] = {}
        mem: dict[str, int] = {}
        for alloc in self.truth.values():
            for c in alloc.containers:
                for g in c.gpus:
                    core[g.uuid] = core.get(g.uuid, 0) + g.core
                    mem[g.uuid] = mem.get(g.uuid, 0) + g.memory_mib
        for uuid, used in core.items():
            if used > 100 or mem[uuid] > MEM:
                self.tally.fail("forgeries", f"{what}: {uuid} double-allocated ({used}%)")


def run(n: int, seed: int) -> Tally:
    rng = random.Random(seed)
    tally = Tally("reconciler")
    logger = logging.getLogger("scheduler_plugin")
    bugs = _Bugs(tally)
    logger.addHandler(bugs)
    logger.propagate = False  # thousands of expected warnings; bugs are counted instead
    try:
        return _run(n, rng, tally)
    finally:
        logger.removeHandler(bugs)
        logger.propagate = True


def _run(n: int, rng: random.Random, tally: Tally) -> Tally:
    target = Target(tally)
    actions = [
        (0.30, target.bind),
        (0.10, target.delete_legit),
        (0.25, target.attack_legit_record),
        (0.20, target.hostile_pod),
        (0.15, target.hostile_nodedevices),
    ]
    weights = [w for w, _ in actions]
    for i in range(n):
        _, action = rng.choices(actions, weights)[0]
        tally.inputs += 1
        action(rng)
        if (i + 1) % RELIST_EVERY == 0:
            target.relist()
        target.check(f"input {i} ({action.__name__})")
    target.relist()
    target.check("final relist")
    return tally
