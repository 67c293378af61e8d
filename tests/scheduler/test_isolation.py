"""One bad pod, NodeDevices or Node never stops the scheduler; untrusted records fence
their node (docs/scheduler.md, "Fencing")."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from fuzz import surface_reconciler
from scheduler_plugin.decisions.extender import Extender
from scheduler_plugin.state.cache import Cache
from scheduler_plugin.state.values import Holds, Invalid, Verdict
from scheduler_plugin.watches.handlers import InventoryHandler, LeaseHandler, NodeHandler
from scheduler_plugin.watches.reconciler import Reconciler
from scheduler_plugin.watches.recovery import judge, rebuild
from tessera import resources as rn
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.model import NodeInventory
from tessera.record import SCHEMA_VERSION, KeySource, encode
from tessera_testbed.inventory import inventory_spec, nodedevices
from tests.scheduler.helpers import (
    KEYRING,
    pod,
    share,
)

POISON_DEEP = "[" * 1000
"""Nested past the JSON parser's recursion limit (RecursionError in json.loads)."""
POISON_MAC = json.dumps(
    {
        "v": SCHEMA_VERSION,
        "integrity": {"alg": "HMAC-SHA256", "keyId": "default", "mac": "\u00e9" * 64},
    }
)
"""A non-ASCII mac: hmac.compare_digest raises TypeError on it."""
POISONS = [POISON_DEEP, POISON_MAC, "{", "null", "\x00", json.dumps({"v": 10**400})]


def running_pod(name: str, node: str, record: str | None, uid: str | None = None) -> dict[str, Any]:
    obj = pod(name, share(10, 10), uid=uid or f"uid-{name}")
    if record is not None:
        obj["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION] = record
    obj["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    obj["spec"]["nodeName"] = node
    obj["status"]["phase"] = "Running"
    return obj


def signed(name: str, node: str, core: int = 50, slot: int = 0, uid: str | None = None) -> str:
    alloc = PodAllocation(
        pod_uid=uid or f"uid-{name}",
        namespace="default",
        name=name,
        node=node,
        containers=(
            ContainerAllocation(
                "main", (GpuGrant(f"GPU-{node}-{slot}", slot, slot, core, 8192 * core // 10),)
            ),
        ),
    )
    return encode(alloc, KEYRING)


def cache_with(nodes: list[str], gpus: int = 1) -> tuple[Cache, Reconciler]:
    cache = Cache("binpack", require_heartbeat=False)
    InventoryHandler(cache).replace([nodedevices(n, gpus=gpus) for n in nodes])
    return cache, Reconciler(cache, KEYRING)


@pytest.mark.parametrize("record", POISONS)
def test_judge_turns_any_poison_record_into_invalid(record: str) -> None:
    verdict = judge(running_pod("p", "n", record), KEYRING)
    assert isinstance(verdict, Invalid) and verdict.problem


def test_judge_reads_hostile_pod_shapes() -> None:
    for bad in (
        {"metadata": "x"},
        {"metadata": {"annotations": "x"}, "spec": []},
        {"metadata": {"annotations": {rn.ALLOCATION_ANNOTATION: POISON_DEEP}}, "spec": "n"},
        {
            "metadata": {"uid": "u", "annotations": {rn.ALLOCATION_ANNOTATION: POISON_MAC}},
            "spec": {"nodeName": "n"},
            "status": 7,
        },
    ):
        judge(bad, KEYRING)  # never raises


@pytest.mark.parametrize("record", POISONS)
def test_a_poison_pod_does_not_stop_a_relist_and_fences_only_its_node(record: str) -> None:
    cache, reconciler = cache_with(["n", "m"])
    good = running_pod("good", "m", signed("good", "m"))
    reconciler.replace([running_pod("poison", "n", record), good])
    assert cache.pods.allocation("uid-good") is not None
    assert "default/poison" in cache.problems.invalid_records()
    assert cache.snapshot().record_fenced_nodes == {"n"} and "m" not in cache.problems.by_node()
    assert "untrusted allocation record" in cache.problems.by_node()["n"]
    reconciler.event("DELETED", running_pod("poison", "n", record))
    assert not cache.snapshot().record_fenced_nodes and "n" not in cache.problems.by_node()


def test_a_rebuild_survives_poison_pods_and_names_the_nodes_to_fence() -> None:
    inv = [
        NodeInventory.from_dict(inventory_spec(n, gpus=1), source="t", node_name=n)
        for n in ("n", "m")
    ]
    pods = [running_pod(f"p{i}", "n", r) for i, r in enumerate(POISONS)]
    pods.append(running_pod("good", "m", signed("good", "m")))
    rebuilt = rebuild(inv, pods, KEYRING)
    assert rebuilt.state.allocation("uid-good") is not None
    assert len(rebuilt.invalid) == len(POISONS)
    assert set(rebuilt.fenced) == {"n"}


def test_an_overflowing_nodedevices_is_fenced_and_other_nodes_keep_scheduling() -> None:
    cache, _ = cache_with([])
    huge = nodedevices("big", gpus=1)
    huge["spec"]["gpus"][0]["memoryMiB"] = 2**64
    InventoryHandler(cache).replace([huge, nodedevices("ok", gpus=1)])
    assert "big" in cache.problems.by_node() and "ok" not in cache.problems.by_node()
    assert "ok" in cache.snapshot().nodes and "big" not in cache.snapshot().nodes
    reply = Extender(cache).filter(
        {"Pod": pod("x", share(10, 10), uid="x"), "NodeNames": ["big", "ok"]}
    )
    assert reply["NodeNames"] == ["ok"]
    assert "nodedevices/big" in reply["FailedNodes"]["big"]
    # an overflowing update of a node that was fine fences it and keeps what it held
    huge["metadata"]["name"] = "ok"
    huge["spec"]["nodeName"] = "ok"
    InventoryHandler(cache).event("MODIFIED", huge)
    assert "ok" in cache.problems.by_node()


HOSTILE_OBJECTS: list[Any] = [
    {},
    {"metadata": "x"},
    {"metadata": {"name": ["x"]}, "spec": "y"},
    {"metadata": {"name": "h"}, "spec": {"gpus": "x"}},
    {"metadata": {"name": "h"}, "spec": {"gpus": [{"memoryMiB": 2**70}]}},
    {"metadata": None, "spec": None, "status": None},
]


def test_hostile_objects_never_escape_a_handler() -> None:
    cache, reconciler = cache_with(["n"])
    handlers = [InventoryHandler(cache), NodeHandler(cache), LeaseHandler(cache), reconciler]
    for handler in handlers:
        handler.replace([*HOSTILE_OBJECTS, nodedevices("n", gpus=1)])
        for obj in HOSTILE_OBJECTS:
            for kind in ("ADDED", "MODIFIED", "DELETED"):
                handler.event(kind, obj)


def test_a_pending_pod_with_garbage_fences_nothing_and_is_not_trusted() -> None:
    cache, reconciler = cache_with(["n"])
    waiting = running_pod("waiting", "", POISON_DEEP)
    waiting["status"]["phase"] = "Pending"
    reconciler.replace([waiting])
    snapshot = cache.snapshot()
    assert not snapshot.fences and not snapshot.problems and not snapshot.allocations


def test_copied_and_conflicting_records_fence_and_unfence_when_fixed() -> None:
    cache, reconciler = cache_with(["n"])
    a = running_pod("a", "n", signed("a", "n", core=60))
    reconciler.replace([a])
    # a valid record of another pod copied onto b: b's real use is unknown
    reconciler.event("ADDED", running_pod("b", "n", signed("a", "n", core=60)))
    assert (
        "copied" not in cache.problems.by_node()["n"]
        and "default/b" in cache.problems.by_node()["n"]
    )
    # b gets a record of its own that overcommits the GPU with a: a conflict, still fenced
    reconciler.event("MODIFIED", running_pod("b", "n", signed("b", "n", core=60)))
    (fence,) = cache.problems.fences()
    assert (fence.node, fence.uid) == ("n", "uid-b") and "conflicts" in fence.problem
    # fixed: b's record fits
    reconciler.event("MODIFIED", running_pod("b", "n", signed("b", "n", core=40)))
    assert isinstance(judge(running_pod("b", "n", signed("b", "n", core=40)), KEYRING), Holds)
    assert not cache.snapshot().record_fenced_nodes and "n" not in cache.problems.by_node()


def test_a_short_run_of_the_reconciler_attack_finds_no_crash_or_double_allocation() -> None:
    tally = surface_reconciler.run(300, seed=5)
    assert tally.inputs == 300
    assert (tally.crashes, tally.forgeries) == (0, 0), tally.examples


def test_a_running_pod_whose_record_was_removed_fences_its_node() -> None:
    """Removing the annotation from a running pod must not free devices it still uses."""
    cache, reconciler = cache_with(["n"])
    reconciler.replace([running_pod("a", "n", signed("a", "n"))])
    assert cache.pods.allocation("uid-a") is not None
    reconciler.event("MODIFIED", running_pod("a", "n", None))
    assert "default/a" in cache.problems.by_node()["n"]
    reconciler.event("MODIFIED", running_pod("a", "n", signed("a", "n")))
    assert not cache.problems.by_node() and cache.pods.allocation("uid-a") is not None
    # pods that ask for no tessera device, or finished ones, hold nothing and fence nothing
    plain = running_pod("plain", "n", None)
    plain["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    done = running_pod("done", "n", None)
    done["status"]["phase"] = "Succeeded"
    reconciler.replace([running_pod("a", "n", signed("a", "n")), plain, done])
    assert not cache.problems.by_node()


def test_a_bug_while_handling_one_object_is_contained(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Defence in depth: an unexpected exception for one object is logged as a bug with
    its name; the pod's node is fenced (its record cannot be trusted), the others go on."""
    from scheduler_plugin.watches import reconciler as reconciler_module

    real_judge = judge  # the function reconciler.py imported from recovery.py

    def judge_with_a_bug(pod: Mapping[str, Any], keyring: KeySource | None) -> Verdict:
        if pod["metadata"]["name"] == "buggy":
            raise ZeroDivisionError("a bug")
        return real_judge(pod, keyring)

    monkeypatch.setattr(reconciler_module, "judge", judge_with_a_bug)
    cache, reconciler = cache_with(["n", "m"])
    good = running_pod("good", "m", signed("good", "m"))
    reconciler.replace([running_pod("buggy", "n", signed("buggy", "n")), good])
    assert cache.pods.allocation("uid-good") is not None
    assert cache.snapshot().record_fenced_nodes == {"n"}
    assert any("bug: handling pod default/buggy" in r.getMessage() for r in caplog.records)
    reconciler.event("MODIFIED", running_pod("buggy", "n", signed("buggy", "n")))
    reconciler.event("DELETED", running_pod("buggy", "n", None))
    assert not cache.snapshot().record_fenced_nodes

    def from_dict_with_a_bug(*args: object, **kwargs: object) -> NodeInventory:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(NodeInventory, "from_dict", from_dict_with_a_bug)
    InventoryHandler(cache).replace([nodedevices("n"), nodedevices("m")])
    assert {"n", "m"} <= set(cache.problems.by_node())
