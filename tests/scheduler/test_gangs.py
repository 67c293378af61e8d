"""Gangs through the extender's verbs: ExtenderArgs shaped as kube-scheduler sends them
(the captured filter vector with the pod swapped), the real Binder over an in-memory API,
the roster fed as the gang watches feed it."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from fuzz.surface_reconciler import MemoryApi
from scheduler_plugin.decisions.binder import BindArgs, Binder
from scheduler_plugin.decisions.extender import Extender
from scheduler_plugin.decisions.gangs import Gangs
from scheduler_plugin.state.cache import Cache
from scheduler_plugin.views.metrics import Metrics, sample
from scheduler_plugin.watches.handlers import (
    GangGroupHandler,
    GangMemberHandler,
    InventoryHandler,
    NodeHandler,
)
from scheduler_plugin.watches.reconciler import Reconciler
from tessera import resources as rn
from tessera.gang.spec import GangKey
from tessera.record import decode
from tessera_testbed.apiserver import FakeApiServer
from tessera_testbed.inventory import nodedevices
from tests.scheduler.helpers import (
    KEYRING,
    ROOT,
    gang_member,
    pod,
    populate,
    serving,
    wait_for,
)

VECTOR = json.loads((ROOT / "tests/vectors/extender/filter-001.json").read_text())
RACK = "example.com/rack"
NODES = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}


def group(
    name: str,
    min_member: int,
    timeout: int | None = None,
    min_resources: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": min_member}
    if timeout is not None:
        spec["scheduleTimeoutSeconds"] = timeout
    if min_resources is not None:
        spec["minResources"] = min_resources
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": spec}


def member(
    name: str, gang: str, gpus: int = 8, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    obj = pod(
        name, {rn.GPU: gpus * 100}, namespace="ml", uid=f"uid-{name}", annotations=annotations
    )
    obj["metadata"]["labels"] = {rn.POD_GROUP_LABEL: gang}
    obj["metadata"]["resourceVersion"] = "1"
    return obj


class Cluster:
    """One scheduler's state over four 8-GPU nodes in racks A and B, as the service wires
    it, with kube-scheduler played by `schedule`."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.cache = Cache("binpack", require_heartbeat=False, monotonic=lambda: self.now)
        self.extender = Extender(self.cache, answer="best")
        self.nudged: list[tuple[str, str, str, str]] = []
        self.gangs = Gangs(self.cache, self.extender.parse, on_reserved=self.nudged.extend)
        self.extender.gangs = self.gangs
        self.api = MemoryApi()
        self.binder = Binder(self.cache, self.extender, self.api, KEYRING)  # type: ignore[arg-type]
        NodeHandler(self.cache, self.gangs.node_labels).replace(
            {"metadata": {"name": n, "labels": {RACK: r}}} for n, r in NODES.items()
        )
        InventoryHandler(self.cache).replace(nodedevices(n, gpus=8) for n in NODES)
        self.reconciler = Reconciler(self.cache, KEYRING)
        self.binder.signed = self.reconciler.signed
        self.groups = GangGroupHandler(self.gangs)
        self.members = GangMemberHandler(self.gangs)
        self.groups.replace([])
        self.members.replace([])

    def create(self, obj: dict[str, Any]) -> None:
        self.api.pods[obj["metadata"]["name"]] = obj
        self.members.event("ADDED", copy.deepcopy(obj))

    def filter(self, name: str) -> dict[str, Any]:
        args = copy.deepcopy(VECTOR)
        args["Pod"] = copy.deepcopy(self.api.pods[name])
        args["NodeNames"] = sorted(NODES)
        args["Nodes"] = None
        return self.extender.filter(args)

    def schedule(self, name: str) -> str | None:
        """filter, then bind the lone survivor, as kube-scheduler does; the node or None."""
        reply = self.filter(name)
        if not reply["NodeNames"]:
            return None
        node: str = reply["NodeNames"][0]
        obj = self.api.pods[name]
        args = BindArgs(name, "ml", obj["metadata"]["uid"], node).to_json()
        assert self.binder.bind(args) == {"Error": ""}
        self.reconciler.event("MODIFIED", copy.deepcopy(obj))
        if rn.POD_GROUP_LABEL in (obj["metadata"].get("labels") or {}):
            self.members.event("MODIFIED", copy.deepcopy(obj))
        return node

    def preempt(self, name: str, victims: dict[str, list[str]]) -> dict[str, list[str]]:
        """kube-scheduler's preempt call offering `victims` (node -> UIDs); the answer as
        node -> UIDs."""
        args = {
            "Pod": copy.deepcopy(self.api.pods[name]),
            "NodeNameToMetaVictims": {
                node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0}
                for node, uids in victims.items()
            },
        }
        reply = self.extender.preempt(args)["NodeNameToMetaVictims"]
        return {n: [p["UID"] for p in v["Pods"]] for n, v in reply.items()}

    def bound(self) -> dict[str, str]:
        return {
            n: p["spec"]["nodeName"] for n, p in self.api.pods.items() if p["spec"].get("nodeName")
        }


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def reasons(reply: dict[str, Any]) -> set[str]:
    assert not reply["NodeNames"]
    assert not reply["FailedAndUnresolvableNodes"]
    return set(reply["FailedNodes"].values())


def test_no_member_binds_until_the_gang_is_complete(cluster: Cluster) -> None:
    cluster.groups.event("ADDED", group("llama", 3))
    for i in range(2):
        cluster.create(member(f"w{i}", "llama"))
    assert reasons(cluster.filter("w0")) == {"tessera: gang ml/llama: 2 of 3 members pending"}
    assert cluster.bound() == {}
    # the third arrives: its own filter plans the gang and passes its reserved node; the
    # other two are nudged and then answered with theirs
    cluster.create(member("w2", "llama"))
    assert cluster.schedule("w2") is not None
    assert {(ns, name) for ns, name, _, _ in cluster.nudged} == {("ml", "w0"), ("ml", "w1")}
    for name in ("w0", "w1"):
        assert cluster.schedule(name) is not None
    bound = cluster.bound()
    assert len(bound) == 3 and len(set(bound.values())) == 3
    for name, node in bound.items():
        obj = cluster.api.pods[name]
        text = obj["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION]
        alloc = decode(text, KEYRING, pod_uid=obj["metadata"]["uid"], node=node)
        assert len(alloc.containers[0].gpus) == 8
    assert cluster.cache.reservations.all() == []


def test_a_member_filter_answers_only_its_reserved_node(cluster: Cluster) -> None:
    cluster.groups.event("ADDED", group("llama", 2))
    cluster.create(member("w0", "llama"))
    cluster.create(member("w1", "llama"))
    first = cluster.filter("w0")["NodeNames"]
    again = cluster.filter("w0")["NodeNames"]
    other = cluster.filter("w1")["NodeNames"]
    assert len(first) == 1 and first == again and other != first
    # a plain pod cannot take the reserved devices: two nodes left
    for i in range(2):
        plain = pod(f"p{i}", {rn.GPU: 800}, uid=f"uid-p{i}")
        cluster.api.pods[f"p{i}"] = plain
        assert cluster.schedule(f"p{i}") not in (first[0], other[0], None)
    plain = pod("p3", {rn.GPU: 100}, uid="uid-p3")
    cluster.api.pods["p3"] = plain
    assert cluster.schedule("p3") is None


def test_bind_of_a_member_without_a_reservation_is_refused(cluster: Cluster) -> None:
    cluster.groups.event("ADDED", group("llama", 2))
    cluster.create(member("w0", "llama"))
    cluster.create(member("w1", "llama"))
    (node,) = cluster.filter("w0")["NodeNames"]
    (elsewhere,) = [n for n in NODES if n != node][:1]
    args = BindArgs("w0", "ml", "uid-w0", elsewhere).to_json()
    assert f"reserved on node {node}" in cluster.binder.bind(args)["Error"]
    cluster.cache.release_gang(GangKey("ml", "llama"))
    args = BindArgs("w0", "ml", "uid-w0", node).to_json()
    assert "has no reservation" in cluster.binder.bind(args)["Error"]
    assert cluster.bound() == {}


def test_two_gangs_that_cannot_both_fit_one_whole_and_one_waiting_whole(cluster: Cluster) -> None:
    for gang in ("a", "b"):
        cluster.groups.event("ADDED", group(gang, 3))
        for i in range(3):
            cluster.create(member(f"{gang}{i}", gang))
    # interleaved as kube-scheduler may try them
    for name in ("a0", "b0", "a1", "b1", "a2", "b2"):
        cluster.schedule(name)
    for name in ("a0", "b0", "a1", "b1", "a2", "b2"):
        cluster.schedule(name)
    bound = cluster.bound()
    by_gang = {g: sorted(n for n in bound if n.startswith(g)) for g in "ab"}
    assert sorted(len(v) for v in by_gang.values()) == [0, 3], by_gang
    waiting = "b" if by_gang["a"] else "a"
    assert reasons(cluster.filter(f"{waiting}0")) == {
        f"tessera: gang ml/{waiting}: 3 members need 24 GPUs, 8 free"
    }
    # the first finishes: its pods go; the tick plans the second and nudges its members
    placed = "a" if waiting == "b" else "b"
    for i in range(3):
        name = f"{placed}{i}"
        obj = cluster.api.pods.pop(name)
        cluster.cache.pods.deleted(obj["metadata"]["uid"], f"ml/{name}")
        cluster.members.event("DELETED", obj)
    cluster.nudged.clear()
    cluster.gangs.tick()
    assert len(cluster.nudged) == 3
    for i in range(3):
        assert cluster.schedule(f"{waiting}{i}") is not None


def test_a_required_rack_keeps_the_gang_in_one_rack_or_places_none(cluster: Cluster) -> None:
    ann = {rn.GANG_REQUIRED_TOPOLOGY_ANNOTATION: RACK}
    cluster.groups.event("ADDED", group("racked", 2))
    for i in range(2):
        cluster.create(member(f"r{i}", "racked", annotations=ann))
    for name in ("r0", "r1"):
        cluster.schedule(name)
    assert len({NODES[n] for n in cluster.bound().values()}) == 1
    cluster.groups.event("ADDED", group("toobig", 3))
    for i in range(3):
        cluster.create(member(f"t{i}", "toobig", annotations=ann))
    for name in ("t0", "t1", "t2"):
        cluster.schedule(name)
    assert not [n for n in cluster.bound() if n.startswith("t")]
    (reason,) = reasons(cluster.filter("t0"))
    assert f"free in any one {RACK} domain" in reason


def test_an_unused_reservation_times_out_and_frees_its_devices(cluster: Cluster) -> None:
    cluster.groups.event("ADDED", group("slow", 2, timeout=30))
    cluster.create(member("s0", "slow"))
    cluster.create(member("s1", "slow"))
    (node,) = cluster.filter("s0")["NodeNames"]
    assert cluster.cache.reservations.reserved_node("uid-s0") == node
    cluster.now += 29
    cluster.gangs.tick()
    assert cluster.cache.reservations.reserved_node("uid-s0") == node
    cluster.now += 1
    cluster.gangs.tick()
    assert cluster.cache.reservations.reserved_node("uid-s0") is None
    assert cluster.cache.snapshot().allocations == {}
    # released: not planned again before the retry delay
    assert reasons(cluster.filter("s0")) == {"tessera: gang ml/slow: released, retrying soon"}
    cluster.now += 10
    assert cluster.filter("s0")["NodeNames"] == [node]


def test_a_bad_podgroup_or_label_holds_only_its_own_gang(cluster: Cluster) -> None:
    cluster.groups.event("ADDED", group("bad", 2) | {"spec": {"minMember": "two"}})
    cluster.groups.event("ADDED", group("good", 1))
    cluster.create(member("x0", "bad"))
    cluster.create(member("g0", "good"))
    weird = member("w0", "good")
    weird["metadata"]["labels"][rn.POD_GROUP_LABEL] = "Not A Name"
    cluster.create(weird)
    (reason,) = reasons(cluster.filter("x0"))
    assert "minMember must be an integer" in reason
    assert rn.POD_GROUP_LABEL in next(iter(reasons(cluster.filter("w0"))))
    assert cluster.schedule("g0") is not None


def test_a_member_with_a_bad_request_holds_its_gang(cluster: Cluster) -> None:
    cluster.groups.event("ADDED", group("llama", 2))
    cluster.create(member("w0", "llama"))
    broken = member("w1", "llama")
    broken["spec"]["containers"][0]["resources"]["limits"][rn.GPU] = "150"
    broken["spec"]["containers"][0]["resources"]["requests"][rn.GPU] = "150"
    cluster.create(broken)
    (reason,) = reasons(cluster.filter("w0"))
    assert reason.startswith("tessera: gang ml/llama: member ml/w1: invalid device request")


def test_a_restart_finishes_a_half_bound_gang_and_allocates_nothing_twice(cluster: Cluster) -> None:
    cluster.groups.event("ADDED", group("llama", 3))
    for i in range(3):
        cluster.create(member(f"w{i}", "llama"))
    cluster.schedule("w0")  # plans, reserves, binds w0
    first = cluster.bound()
    # killed here: a new scheduler rebuilds from the lists (w0 bound with its record)
    fresh = Cluster()
    fresh.api = cluster.api
    fresh.binder.client = cluster.api  # type: ignore[assignment]
    Reconciler(fresh.cache, KEYRING).replace(copy.deepcopy(list(cluster.api.pods.values())))
    fresh.groups.replace([group("llama", 3)])
    fresh.members.replace(copy.deepcopy(list(cluster.api.pods.values())))
    for name in ("w1", "w2"):
        assert fresh.schedule(name) is not None
    bound = fresh.bound()
    assert bound["w0"] == first["w0"] and len(set(bound.values())) == 3
    assert len(fresh.cache.snapshot().allocations) == 3  # StateError on any overlap


def fill(cluster: Cluster, priority: int = 0) -> dict[str, list[str]]:
    """An 8-GPU pod of `priority` on every node; node -> its pod's UID."""
    taken: dict[str, list[str]] = {}
    for i in range(len(NODES)):
        obj = pod(f"low{i}", {rn.GPU: 800}, uid=f"uid-low{i}", priority=priority)
        cluster.api.pods[f"low{i}"] = obj
        node = cluster.schedule(f"low{i}")
        assert node is not None
        taken[node] = [f"uid-low{i}"]
    return taken


def urgent(name: str, gang: str) -> dict[str, Any]:
    obj = member(name, gang)
    obj["spec"]["priority"] = 100
    return obj


def test_a_gang_preempts_for_its_whole_plan_one_node_per_member(cluster: Cluster) -> None:
    offered = fill(cluster)
    cluster.groups.event("ADDED", group("hp", 2))
    cluster.create(urgent("h0", "hp"))
    cluster.create(urgent("h1", "hp"))
    assert reasons(cluster.filter("h0")) == {"tessera: gang ml/hp: 2 members need 16 GPUs, 0 free"}
    first = cluster.preempt("h0", offered)
    second = cluster.preempt("h1", offered)
    assert len(first) == 1 and len(second) == 1 and first.keys() != second.keys()
    for answer in (first, second):
        ((node, uids),) = answer.items()
        assert uids == offered[node]


def test_a_gang_that_would_not_fit_even_after_preemption_takes_no_victim(
    cluster: Cluster,
) -> None:
    offered = fill(cluster)
    cluster.groups.event("ADDED", group("huge", 5))
    for i in range(5):
        cluster.create(urgent(f"u{i}", "huge"))
    assert cluster.preempt("u0", offered) == {}
    # nor does an incomplete gang
    cluster.groups.event("ADDED", group("short", 3))
    cluster.create(urgent("s0", "short"))
    assert cluster.preempt("s0", offered) == {}


def test_members_never_preempt_their_own_gang(cluster: Cluster) -> None:
    cluster.groups.event("ADDED", group("mine", 1))
    cluster.create(member("m0", "mine"))
    node = cluster.schedule("m0")
    assert node is not None
    others = [n for n in NODES if n != node]
    offered = {n: ["uid-x"] for n in others}
    for i, n in enumerate(others):
        obj = pod(f"x{i}", {rn.GPU: 800}, uid=f"uid-x{i}")
        cluster.api.pods[f"x{i}"] = obj
        assert cluster.schedule(f"x{i}") is not None
        offered[n] = [f"uid-x{i}"]
    offered[node] = ["uid-m0"]  # a lower-priority member of the same gang, offered
    cluster.groups.event("ADDED", group("mine", 2))
    cluster.create(urgent("m1", "mine"))
    answer = cluster.preempt("m1", offered)
    assert answer != {} and node not in answer
    assert all("uid-m0" not in uids for uids in answer.values())


def test_the_ticker_plans_over_every_node_not_a_stale_offer(cluster: Cluster) -> None:
    cluster.groups.event("ADDED", group("pair", 2))
    cluster.create(member("q0", "pair"))
    cluster.create(member("q1", "pair"))
    args = {"Pod": copy.deepcopy(cluster.api.pods["q0"]), "NodeNames": ["a1"], "Nodes": None}
    reply = cluster.extender.filter(args)  # kube-scheduler offered one node (others full)
    assert set(reply["FailedNodes"].values()) == {
        "tessera: gang ml/pair: 2 members need 16 GPUs, 8 free"
    }
    cluster.gangs.tick()
    assert cluster.cache.reservations.reserved_node("uid-q0") is not None
    assert len(cluster.nudged) == 2


def test_members_refused_before_the_gang_watches_listed_are_asked_about_again() -> None:
    """kube-scheduler records "waiting for the scheduler to list" and would not ask again
    for minutes: once both watches have listed, the next tick nudges each such member."""
    cluster = Cluster()
    cluster.gangs.groups_synced.clear()
    cluster.create(member("e0", "early"))
    (reason,) = reasons(cluster.filter("e0"))
    assert reason.endswith("waiting for the scheduler to list gangs and their pods")
    cluster.gangs.tick()
    assert cluster.nudged == []  # not listed yet: nothing would change for it
    cluster.groups.replace([group("early", 2)])
    cluster.gangs.tick()
    assert cluster.nudged == [("ml", "e0", "uid-e0", "")]
    cluster.gangs.tick()
    assert cluster.nudged == [("ml", "e0", "uid-e0", "")]  # once
    assert reasons(cluster.filter("e0")) == {"tessera: gang ml/early: 1 of 2 members pending"}


# --- minResources ----------------------------------------------------------------------------


def test_a_gang_whose_min_resources_are_not_free_waits_naming_them_until_lowered(
    cluster: Cluster,
) -> None:
    """Its members would fit (2 x 8 GPUs, 24 free), but the PodGroup asks for 30 GPUs free
    first: every member waits with that reason and nothing is held; a node that takes no
    pods is not counted; lowered to what is free, the next tick reserves the gang."""
    cluster.api.pods["filler"] = pod("filler", {rn.GPU: 800}, uid="uid-filler")
    assert cluster.schedule("filler") is not None
    wanted = {rn.GPU: "3000", "cpu": "500"}  # cpu is kube-scheduler's: not judged here
    cluster.groups.event("ADDED", group("mr", 2, min_resources=wanted))
    cluster.create(member("m0", "mr"))
    cluster.create(member("m1", "mr"))
    short = f"tessera: gang ml/mr: minResources not free: {rn.GPU} 3000 wanted, 2400 free"
    assert reasons(cluster.filter("m0")) == {short}
    assert cluster.cache.reservations.all() == []
    assert cluster.gangs.reason(GangKey("ml", "mr")) == short.removeprefix("tessera: ")
    # a node whose NodeDevices no longer parses takes no pods: its 8 free GPUs are not free
    bad = nodedevices("b2", gpus=8)
    bad["spec"]["gpus"] = "garbage"
    InventoryHandler(cluster.cache).event("MODIFIED", bad)
    assert "b2" in cluster.cache.problems.by_node()
    cluster.groups.event("MODIFIED", group("mr", 2, min_resources={rn.GPU: "2400"}))
    (reason,) = reasons(cluster.filter("m0"))
    assert reason == f"tessera: gang ml/mr: minResources not free: {rn.GPU} 2400 wanted, 1600 free"
    cluster.groups.event("MODIFIED", group("mr", 2, min_resources={rn.GPU: "1600"}))
    cluster.gangs.tick()
    assert {(name, node != "") for _, name, _, node in cluster.nudged} == {
        ("m0", True),
        ("m1", True),
    }
    for name in ("m0", "m1"):
        assert cluster.schedule(name) not in (None, "b2")


def test_a_node_that_takes_pods_again_is_counted_at_the_next_tick(cluster: Cluster) -> None:
    """A fence lifted changes no device (the state's generation stays): the gang is judged
    again all the same."""
    cluster.cache.problems.distrust("ml/forged", "uid-forged", "b2", "signature does not verify")
    cluster.groups.event("ADDED", group("all", 2, min_resources={rn.GPU: "3200"}))
    cluster.create(member("z0", "all"))
    cluster.create(member("z1", "all"))
    (reason,) = reasons(cluster.filter("z0"))
    assert reason.endswith(f"minResources not free: {rn.GPU} 3200 wanted, 2400 free")
    cluster.gangs.tick()
    assert cluster.cache.reservations.all() == []
    cluster.cache.problems.trust("ml/forged", "uid-forged")
    cluster.gangs.tick()
    assert cluster.cache.reservations.reservation(GangKey("ml", "all")) is not None


def test_what_the_gang_s_own_bound_members_hold_counts_as_free_to_it(cluster: Cluster) -> None:
    """One member bound, the other's reservation timed out (kube-scheduler did not bind
    it): 8 GPUs are free and 8 held by the bound member; minResources of 16 is met."""
    for i in range(2):
        cluster.api.pods[f"f{i}"] = pod(f"f{i}", {rn.GPU: 800}, uid=f"uid-f{i}")
        assert cluster.schedule(f"f{i}") is not None
    cluster.groups.event("ADDED", group("own", 2, timeout=30, min_resources={rn.GPU: "1600"}))
    cluster.create(member("o0", "own"))
    cluster.create(member("o1", "own"))
    assert cluster.schedule("o0") is not None
    cluster.now += 31
    cluster.gangs.tick()  # o1's reservation released
    assert cluster.cache.reservations.reserved_node("uid-o1") is None
    cluster.now += 10
    assert cluster.filter("o1")["NodeNames"] != []
    assert len(cluster.bound()) == 3


def test_a_gang_whose_min_resources_would_not_be_free_even_after_preemption_takes_no_victim(
    cluster: Cluster,
) -> None:
    offered = fill(cluster)
    cluster.groups.event("ADDED", group("hp", 2, min_resources={rn.GPU: "3300"}))
    cluster.create(urgent("h0", "hp"))
    cluster.create(urgent("h1", "hp"))
    assert cluster.preempt("h0", offered) == {}  # 3,200 in the whole cluster
    cluster.groups.event("MODIFIED", group("hp", 2, min_resources={rn.GPU: "3200"}))
    ((node, uids),) = cluster.preempt("h0", offered).items()
    assert uids == offered[node]


@pytest.mark.parametrize("managed", [False, True])
def test_nvidia_gpu_in_min_resources_is_judged_only_where_tessera_manages_it(
    managed: bool,
) -> None:
    cluster = Cluster()
    cluster.gangs.nvidia_gpu = managed
    cluster.groups.event("ADDED", group("nv", 1, min_resources={rn.NVIDIA_GPU: "33"}))
    cluster.create(member("n0", "nv"))
    reply = cluster.filter("n0")
    if managed:
        assert reasons(reply) == {
            f"tessera: gang ml/nv: minResources not free: {rn.NVIDIA_GPU} 33 wanted, 32 free"
        }
    else:
        assert len(reply["NodeNames"]) == 1


# --- gangs waiting past their timeout --------------------------------------------------------

PAST = "tessera_scheduler_gangs_waiting_past_timeout"


def test_a_gang_that_cannot_be_placed_counts_once_past_its_timeout_until_placed(
    cluster: Cluster,
) -> None:
    metrics = Metrics()
    metrics.attach(cluster.cache, cluster.gangs)
    cluster.groups.event("ADDED", group("big", 2, timeout=30, min_resources={rn.GPU: "9999"}))
    cluster.create(member("b0", "big"))
    cluster.now += 10
    cluster.create(member("b1", "big"))
    assert cluster.filter("b0")["NodeNames"] == []
    cluster.now += 20
    cluster.gangs.tick()
    assert sample(metrics, PAST) == 0.0  # b0 has waited 30 s: not past yet
    cluster.now += 1
    assert sample(metrics, PAST) == 1.0
    # placed: reserved but not bound, the members still wait; bound, the gang is done
    cluster.groups.event("MODIFIED", group("big", 2, timeout=30))
    cluster.gangs.tick()
    assert cluster.cache.reservations.reservation(GangKey("ml", "big")) is not None
    assert sample(metrics, PAST) == 1.0
    assert cluster.schedule("b0") is not None
    assert sample(metrics, PAST) == 0.0  # b1 came 10 s later: it has waited 21 s
    cluster.now += 10
    assert sample(metrics, PAST) == 1.0  # 31 s
    assert cluster.schedule("b1") is not None
    assert sample(metrics, PAST) == 0.0
    cluster.now += 1000
    assert sample(metrics, PAST) == 0.0


def test_a_deleted_gang_stops_counting_and_each_gang_counts_once(cluster: Cluster) -> None:
    metrics = Metrics()
    metrics.attach(cluster.cache, cluster.gangs)
    cluster.groups.event("ADDED", group("short", 3, timeout=5))  # waits for a third member
    cluster.create(member("s0", "short"))
    cluster.create(member("s1", "short"))
    cluster.create(member("x0", "nogroup"))  # no PodGroup: the default timeout, 60 s
    cluster.now += 6
    assert sample(metrics, PAST) == 1.0
    cluster.now += 55
    assert sample(metrics, PAST) == 2.0
    for name in ("s0", "s1"):
        cluster.members.event("DELETED", cluster.api.pods.pop(name))
    assert sample(metrics, PAST) == 1.0
    cluster.members.event("DELETED", cluster.api.pods.pop("x0"))
    assert sample(metrics, PAST) == 0.0


def test_the_running_scheduler_exports_the_gangs_past_their_timeout(fake: FakeApiServer) -> None:
    """Through the service's own watches and /metrics: a gang short of a member counts once
    its member has waited past the PodGroup's 1 s, and stops counting once it is gone."""
    populate(fake, ["a"], gpus=2)
    fake.create("podgroups", group("late", 2, timeout=1))
    with serving(fake) as served:
        gangs = served.service.gangs
        assert gangs is not None
        wait_for(lambda: gangs.groups_synced.is_set() and gangs.members_synced.is_set())

        def exported() -> float:
            status, text = served.http.get("/metrics")
            assert status == 200
            (line,) = [x for x in text.decode().splitlines() if x.startswith(PAST + " ")]
            return float(line.split()[1])

        assert exported() == 0.0
        fake.create("pods", gang_member("late-0", "late", 1))
        wait_for(lambda: exported() == 1.0, timeout=10, interval=0.1)
        fake.delete("pods", "late-0", "ml")
        wait_for(lambda: exported() == 0.0, timeout=10, interval=0.1)
