"""A node whose isolation layer its agent reports down takes no new GPU share, on every
path a decision takes (filter, with either answer; preempt; bind; a gang's plan and its
members' binds), and says so where an operator looks (the filter reason and its metric
label, the node's summary, the page's rows, why pending). Whole GPUs are placed there as
before, the pods already there are not touched, and a layer the agent does not report
changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.decisions.binder import BindArgs
from scheduler_plugin.decisions.extender import Extender
from scheduler_plugin.state.cache import Cache
from scheduler_plugin.state.values import Assumed, Refused
from scheduler_plugin.views import overview
from scheduler_plugin.views.metrics import Metrics, sample
from scheduler_plugin.views.pending import explanation
from scheduler_plugin.watches.handlers import InventoryHandler
from tessera import resources as rn
from tessera.request import parse_pod
from tessera_testbed.inventory import nodedevices
from tests.scheduler.helpers import pod, share
from tests.scheduler.test_extender import occupy
from tests.scheduler.test_gangs import Cluster, group

MISSING = "the HAMi-core library /usr/local/vgpu/libvgpu.so is missing"
REFUSAL = f"isolation layer hami-core is down: {MISSING}"
FAILURES = "tessera_scheduler_node_failures_total"


def layer(up: bool | None) -> dict[str, Any] | None:
    """spec.isolation as the agent writes it: up, down, or not reported (None)."""
    if up is None:
        return None
    return {
        "layer": "hami-core",
        "up": up,
        "version": "8f3a89c+tessera.2",
        "commit": "8f3a89c",
        "reason": "" if up else MISSING,
    }


def inventory(node: str, up: bool | None, gpus: int = 2) -> dict[str, Any]:
    obj = nodedevices(node, gpus=gpus)
    if up is not None:
        obj["spec"]["isolation"] = layer(up)
    return obj


NODES = {"up": True, "unknown": None, "down": False}


def cluster(nodes: dict[str, bool | None] = NODES) -> tuple[Cache, InventoryHandler]:
    cache = Cache("binpack", require_heartbeat=False)
    handler = InventoryHandler(cache)
    handler.replace([inventory(n, up) for n, up in nodes.items()])
    return cache, handler


def ask(obj: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": obj, "Nodes": None, "NodeNames": names}


@pytest.mark.parametrize("answer", ["best", "all"])
def test_filter_refuses_a_share_there_naming_the_layer_and_counts_it(answer: str) -> None:
    cache, _ = cluster()
    metrics = Metrics()
    ext = Extender(cache, metrics, answer=answer)
    for limits in (share(30, 30), {rn.GPU_CORE: 20, rn.GPU_MEMORY: 4}, {rn.GPU_MEMORY: 4}):
        reply = ext.filter(ask(pod("s", limits, uid="s"), ["down"]))
        ext.catch_up()  # the best answer's failures are counted once it is out
        assert reply["NodeNames"] == [] and reply["FailedNodes"] == {}
        assert reply["FailedAndUnresolvableNodes"] == {"down": f"tessera: {REFUSAL}"}
    assert sample(metrics, FAILURES, {"reason": "isolation_down"}) == 3
    # elsewhere the share fits: up, or not reported
    everywhere = ext.filter(ask(pod("s2", share(30, 30), uid="s2"), list(NODES)))
    assert everywhere["NodeNames"] and "down" not in everywhere["NodeNames"]
    if answer == "all":
        assert set(everywhere["NodeNames"]) == {"up", "unknown"}
    # whole GPUs need no layer
    for limits in ({rn.GPU: 100}, {rn.GPU: 200}):
        whole = ext.filter(ask(pod("w", limits, uid=f"w{limits[rn.GPU]}"), ["down"]))
        assert whole["NodeNames"] == ["down"]


def test_the_layer_going_down_and_up_reaches_the_next_answer_of_a_shape_seen_before() -> None:
    """The watch's update (only spec.isolation changes) reaches the decisions' memo."""
    cache, handler = cluster({"n": True})
    ext = Extender(cache, answer="all")
    occupy(cache, "running", "n", share(30, 30))

    def answer(k: int) -> dict[str, Any]:
        reply = ext.filter(ask(pod(f"p{k}", share(20, 20), uid=f"p{k}"), ["n"]))
        ext.catch_up()
        return reply

    assert answer(0)["NodeNames"] == ["n"]
    handler.event("MODIFIED", inventory("n", False))
    assert answer(1)["FailedAndUnresolvableNodes"] == {"n": f"tessera: {REFUSAL}"}
    assert cache.pods.allocation("uid-running") is not None  # pods already there stay
    assert "n" not in cache.problems.by_node()  # it still takes whole GPUs
    handler.event("MODIFIED", inventory("n", True))
    assert answer(2)["NodeNames"] == ["n"]
    handler.event("MODIFIED", inventory("n", None))  # an agent that stops reporting
    assert answer(3)["NodeNames"] == ["n"]


def test_preempt_offers_no_victims_on_a_layer_down_node_for_a_share() -> None:
    cache, handler = cluster({"down": True, "up": True})
    for node in ("down", "up"):
        for slot in range(2):
            occupy(cache, f"{node}{slot}", node, {rn.GPU: 100})
    handler.event("MODIFIED", inventory("down", False))
    ext = Extender(cache)
    offered = {
        node: {"Pods": [{"UID": f"uid-{node}{s}"} for s in range(2)], "NumPDBViolations": 0}
        for node in ("down", "up")
    }

    def victims(obj: dict[str, Any]) -> dict[str, list[str]]:
        reply = ext.preempt({"Pod": obj, "NodeNameToMetaVictims": offered})
        return {n: [p["UID"] for p in v["Pods"]] for n, v in reply["NodeNameToMetaVictims"].items()}

    assert victims(pod("s", share(50, 50), uid="s")) == {"up": ["uid-up0"]}
    # a whole GPU may preempt on either node
    assert victims(pod("w", {rn.GPU: 100}, uid="w")) == {"down": ["uid-down0"], "up": ["uid-up0"]}


def test_bind_places_again_and_refuses_a_share_there_but_not_a_whole_gpu() -> None:
    cache, _ = cluster()
    refused = cache.pods.assume(parse_pod(pod("s", share(30, 30), uid="s")), "down")
    assert refused == Refused(REFUSAL)
    assert cache.pods.allocation("s") is None
    whole = cache.pods.assume(parse_pod(pod("w", {rn.GPU: 100}, uid="w")), "down")
    assert isinstance(whole, Assumed)
    assert isinstance(cache.pods.assume(parse_pod(pod("u", share(30, 30), uid="u")), "up"), Assumed)


def share_member(name: str, gang: str) -> dict[str, Any]:
    obj = pod(name, share(40, 40), namespace="ml", uid=f"uid-{name}")
    obj["metadata"]["labels"] = {rn.POD_GROUP_LABEL: gang}
    obj["metadata"]["resourceVersion"] = "1"
    return obj


def test_a_gang_of_shares_is_planned_off_layer_down_nodes_and_waits_naming_the_layer() -> None:
    gangs = Cluster()  # four 8-GPU nodes, a1 a2 b1 b2
    handler = InventoryHandler(gangs.cache)
    for node in ("a1", "a2", "b1"):
        handler.event("MODIFIED", inventory(node, False, gpus=8))
    gangs.groups.event("ADDED", group("tuning", 3))
    for i in range(3):
        gangs.create(share_member(f"t{i}", "tuning"))
    for name in ("t0", "t1", "t2"):
        gangs.schedule(name)
    for name in ("t0", "t1", "t2"):
        gangs.schedule(name)
    assert set(gangs.bound().values()) == {"b2"}
    # with every node's layer down, a gang of shares waits, and says why
    handler.event("MODIFIED", inventory("b2", False, gpus=8))
    gangs.groups.event("ADDED", group("late", 2))
    for i in range(2):
        gangs.create(share_member(f"l{i}", "late"))
    reply = gangs.filter("l0")
    assert reply["NodeNames"] == []
    (reason,) = set(reply["FailedNodes"].values())
    assert reason.startswith("tessera: gang ml/late") and "isolation layer hami-core is down" in (
        reason
    ), reason


def test_a_member_whose_reserved_share_lost_its_layer_is_refused_at_bind() -> None:
    gangs = Cluster()
    handler = InventoryHandler(gangs.cache)
    gangs.groups.event("ADDED", group("pair", 2))
    for i in range(2):
        gangs.create(share_member(f"m{i}", "pair"))
    (node,) = gangs.filter("m0")["NodeNames"]  # reserved, not bound yet
    handler.event("MODIFIED", inventory(node, False, gpus=8))
    error = gangs.binder.bind(BindArgs("m0", "ml", "uid-m0", node).to_json())["Error"]
    assert REFUSAL in error and "ml/m0" in error
    assert gangs.bound() == {}


def test_what_operators_see_of_a_node_that_takes_no_shares() -> None:
    cache, _ = cluster()
    summary = cache.node_summary("down")
    assert summary is not None
    assert summary["usable"] is True and summary["problem"] is None  # it takes whole GPUs
    assert summary["shareProblem"] == REFUSAL
    assert summary["isolation"] == layer(False)
    up = cache.node_summary("up")
    assert up is not None and up["shareProblem"] is None and up["isolation"] == layer(True)
    unknown = cache.node_summary("unknown")
    assert unknown is not None and unknown["isolation"] is None
    rows = cache.reading(overview.overview)["nodes"]
    by_name = {r["n"]: r for r in rows}
    assert by_name["down"]["s"] == REFUSAL and by_name["down"]["p"] is None
    assert "s" not in by_name["up"] and "s" not in by_name["unknown"]
    # the overview's largest share counts the GPUs of nodes that take shares only
    (model,) = cache.reading(overview.models)
    assert model["wholePlaceable"] == 6 and model["shares"][0]["core"] == 100
    # why pending: a share that only the layer-down node could take
    request = parse_pod(pod("p", share(30, 30), uid="p"))
    for node in ("up", "unknown"):
        occupy(cache, f"full-{node}", node, {rn.GPU: 200})
    explained = cache.reading(lambda reading: explanation(reading, request))
    assert explained["fitsNowCount"] == 0
    assert [n["node"] for n in explained["nearest"]] == ["unknown", "up"]  # when pods go
    assert explained["hopeless"] == 1 and explained["noShares"] == 1


def test_copies_of_summaries_do_not_share_the_layer() -> None:
    cache, _ = cluster()
    first = cache.node_summary("down")
    assert first is not None
    first["isolation"]["up"] = True  # a caller's change
    again = cache.node_summary("down")
    assert again is not None and again["isolation"]["up"] is False
