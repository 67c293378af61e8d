"""Gangs: time from the last member's creation to the whole gang bound.

In one process, as the testbed does: the real Cache, Extender, Gangs and Binder of
tessera-scheduler over 500 nodes of 8 GPUs (a quarter of them busy with single pods, the
default policy), an in-memory API for the Bindings, and a stand-in for kube-scheduler that
does what it does for a gang: every member but the last is created and filtered (each
waits: "n of N members pending"); then the last is created (the gang watch sees it) and
filtered, which plans and reserves the whole gang; each other member is then filtered
again (the nudge's update brings it back) and every member is bound. The clock runs from
the last member's creation to the last Binding. kube-scheduler's own queueing and the
API server's round trips are not in it (the e2e suite measures the whole path: a gang of
4 binds within 10 s of its last member, docs/gangs.md).
"""

from __future__ import annotations

import copy
import random
import time
from typing import Any

from bench.common import BenchContext, Result, percentile
from scheduler_plugin.decisions.binder import BindArgs, Binder
from scheduler_plugin.decisions.extender import Extender
from scheduler_plugin.decisions.gangs import Gangs
from scheduler_plugin.state.cache import Cache
from scheduler_plugin.watches.handlers import (
    GangGroupHandler,
    GangMemberHandler,
    InventoryHandler,
    NodeHandler,
)
from tessera import resources as rn
from tessera.record import Keyring
from tessera_testbed.inventory import nodedevices

KEYRING = Keyring.generate("bench")


class _Api:
    """The two pod calls the Binder makes, on a dict of pods."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}

    def get(self, path: str) -> dict[str, Any]:
        return copy.deepcopy(self.pods[path.rsplit("/", 1)[1]])

    def create(self, path: str, binding: dict[str, Any]) -> dict[str, Any]:
        obj = self.pods[path.split("/pods/", 1)[1].split("/", 1)[0]]
        obj["spec"]["nodeName"] = binding["target"]["name"]
        return {}


def _pod(name: str, gpus: int, gang: str | None = None) -> dict[str, Any]:
    limits = {rn.GPU: str(gpus * 100)}
    meta: dict[str, Any] = {"name": name, "namespace": "bench", "uid": f"uid-{name}"}
    if gang is not None:
        meta["labels"] = {rn.POD_GROUP_LABEL: gang}
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


class _Cluster:
    def __init__(self, nodes: int) -> None:
        self.names = [f"node-{i:04d}" for i in range(nodes)]
        self.cache = Cache(rn.DEFAULT_POLICY, require_heartbeat=False)
        self.extender = Extender(self.cache, answer="best")
        self.gangs = Gangs(self.cache, self.extender.parse, on_reserved=lambda pokes: None)
        self.extender.gangs = self.gangs
        self.api = _Api()
        self.binder = Binder(self.cache, self.extender, self.api, KEYRING)  # type: ignore[arg-type]
        labels = ({"metadata": {"name": n, "labels": {"rack": n[:-1]}}} for n in self.names)
        NodeHandler(self.cache, self.gangs.node_labels).replace(labels)
        InventoryHandler(self.cache).replace(nodedevices(n, gpus=8) for n in self.names)
        self.groups = GangGroupHandler(self.gangs)
        self.members = GangMemberHandler(self.gangs)
        self.groups.replace([])
        self.members.replace([])

    def filter(self, name: str) -> list[str]:
        args = {"Pod": self.api.pods[name], "NodeNames": self.names, "Nodes": None}
        passed: list[str] = self.extender.filter(args)["NodeNames"]
        return passed

    def bind(self, name: str, node: str) -> None:
        obj = self.api.pods[name]
        args = BindArgs(name, "bench", obj["metadata"]["uid"], node).to_json()
        result = self.binder.bind(args)
        assert result == {"Error": ""}, result
        self.cache.pods.deleted(obj["metadata"]["uid"], f"bench/{name}")  # keep the load steady

    def create(self, obj: dict[str, Any]) -> None:
        self.api.pods[obj["metadata"]["name"]] = obj
        if obj["metadata"].get("labels"):
            self.members.event("ADDED", obj)

    def fill(self, fraction: float, rng: random.Random) -> None:
        """Single pods of 1-4 GPUs until about `fraction` of the GPUs are taken."""
        target = int(len(self.names) * 8 * fraction)
        used = i = 0
        while used < target:
            gpus = rng.choice((1, 2, 4))
            name = f"load-{i}"
            i += 1
            self.create(_pod(name, gpus))
            passed = self.filter(name)
            if not passed:
                break
            obj = self.api.pods[name]
            self.binder.bind(BindArgs(name, "bench", obj["metadata"]["uid"], passed[0]).to_json())
            used += gpus

    def one_gang(self, tag: str, size: int, gpus: int) -> float:
        gang = f"g-{tag}"
        self.groups.event(
            "ADDED", {"metadata": {"name": gang, "namespace": "bench"}, "spec": {"minMember": size}}
        )
        names = [f"{gang}-{i}" for i in range(size)]
        for name in names[:-1]:
            self.create(_pod(name, gpus, gang))
            assert self.filter(name) == []
        started = time.perf_counter()
        self.create(_pod(names[-1], gpus, gang))
        order = [names[-1], *names[:-1]]  # the last first, then the nudged others
        for name in order:
            passed = self.filter(name)
            assert len(passed) == 1, (name, passed)
            self.bind(name, passed[0])
        took = time.perf_counter() - started
        for name in names:
            obj = self.api.pods.pop(name)
            self.members.event("DELETED", obj)
        self.groups.event("DELETED", {"metadata": {"name": gang, "namespace": "bench"}})
        return took


def measure(nodes: int, size: int, gpus: int, gangs: int) -> list[float]:
    rng = random.Random(28)
    cluster = _Cluster(nodes)
    cluster.fill(0.25, rng)
    cluster.one_gang("warm", size, gpus)
    return [cluster.one_gang(str(i), size, gpus) for i in range(gangs)]


def run(ctx: BenchContext) -> list[Result]:
    results = []
    for size, target_ms in ((8, 50.0), (64, 500.0)):
        samples = measure(500, size, 8, ctx.sized(quick=3, full=20))
        ms = [s * 1000 for s in samples]
        results.append(
            Result(
                f"gang of {size} x 8 GPUs, 500 nodes: last member created -> all bound, p99",
                percentile(ms, 99),
                "ms",
                target_ms,
                note=(
                    f"p50 {percentile(ms, 50):.1f} ms over {len(ms)} gangs; tessera's side "
                    "(plan, reserve, every member's filter and bind), in one process"
                ),
            )
        )
    return results
