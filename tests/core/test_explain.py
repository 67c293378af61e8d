"""tessera.explain: a verdict per node from an evaluation, and the nodes nearest to fitting."""

from __future__ import annotations

from dataclasses import replace

from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.cluster_decision import Decider
from tessera.cluster_state import ClusterState
from tessera.explain import asks, nearest, verdicts
from tessera.isolation import NodeIsolation
from tessera.scoring_policy import BinpackPolicy
from tests.core.test_fragmentation_policy import MODELS, inventory, pod


def _take(state: ClusterState, node: str, slot: int, core: int, ratio: int) -> None:
    g = state.nodes[node].inventory.gpus[slot]
    grant = GpuGrant(g.uuid, g.index, g.minor, core, g.memory_mib * ratio // 100)
    uid = f"{node}-{slot}"
    state.add(PodAllocation(uid, "d", uid, node, (ContainerAllocation("c", (grant,)),)))


def _state() -> tuple[ClusterState, Decider]:
    state = ClusterState()
    for name, gpus, model in (("a", 2, 0), ("b", 2, 0), ("c", 2, 0), ("t4", 4, 1), ("z", 2, 0)):
        state.set_node(inventory(name, gpus, model))
    for slot in (0, 1):
        _take(state, "a", slot, 80, 80)  # roomiest: 20% compute, 20% memory
        _take(state, "b", slot, 40, 40)  # 60%, 60%
        _take(state, "c", slot, 70, 10)  # 30% compute, 90% memory
        _take(state, "z", slot, 40, 40)  # as b, but closed
    policy = BinpackPolicy()
    return state, Decider(state, {policy.name: policy}, policy.name)


def test_the_nearest_nodes_have_the_most_of_the_ask_free() -> None:
    state, decider = _state()
    units = MODELS[0][1] * 75 // 100 // state.nodes["a"].inventory.memory_unit_mib
    request = pod("p", core=75, units=units, models="A10")
    names = sorted(state.nodes)
    found = verdicts(decider.evaluate(request, names), names, {"z": "fenced by default/x"})
    by_node = {v.node: v for v in found}
    assert not any(v.fits for v in found)
    assert by_node["z"].closed and by_node["z"].text == "takes no tessera pods: fenced by default/x"
    assert by_node["t4"].hopeless and "(waiting will not help)" in by_node["t4"].text
    near = nearest(found, decider.index, request)
    # b has 60% of both free (0.8 of the ask), c 30% compute (0.4), a 20% (about 0.27)
    assert [v.node for v, _ in near] == ["b", "c", "a"]
    assert [round(s, 2) for _, s in near] == [0.8, 0.4, 0.27]
    assert nearest(found, decider.index, request, limit=1)[0][0].node == "b"


def test_whole_gpus_count_against_the_whole_gpus_wanted_and_fits_come_first() -> None:
    state, decider = _state()
    request = pod("w", gpu=200)
    names = sorted(state.nodes)
    found = verdicts(decider.evaluate(request, names), names, {})
    assert [v.node for v in found if v.fits] == ["t4"]
    assert found[names.index("t4")].text == "fits now"
    near = nearest(found, decider.index, request)
    assert all(score == 0.0 for _, score in near)  # no whole GPU free on a, b, c or z
    _take(state, "t4", 0, 10, 10)
    _take(state, "t4", 1, 10, 10)
    _take(state, "t4", 2, 10, 10)
    request = pod("w2", gpu=400)
    found = verdicts(decider.evaluate(request, names), names, {})
    (first, score), *_ = nearest(found, decider.index, request)
    assert (first.node, score) == ("t4", 0.25)  # one whole GPU free of the four wanted


def test_asks_names_containers_and_hints() -> None:
    assert asks(pod("p", core=30, units=4, models="T4")) == [
        "c: GPU share: 30% compute, 4 memory units",
        "GPU model one of T4",
    ]


def test_a_node_whose_layer_is_down_is_named_with_its_layer_and_is_never_nearest() -> None:
    state, decider = _state()
    down = NodeIsolation("hami-core", False, reason="the HAMi-core library is missing")
    state.set_node(replace(state.nodes["b"].inventory, isolation=down))
    names = sorted(state.nodes)
    share = pod("s", core=50, units=1, models="A10")
    found = {v.node: v for v in verdicts(decider.evaluate(share, names), names, {})}
    assert (
        found["b"].reason == "isolation layer hami-core is down: the HAMi-core library is missing"
    )
    assert found["b"].hopeless and not found["b"].fits
    assert "b" not in [v.node for v, _ in nearest(found.values(), decider.index, share)]
    # whole GPUs need no layer: a node whose layer is down takes them
    state.set_node(replace(state.nodes["t4"].inventory, isolation=down))
    whole = pod("w", gpu=100)
    found = {v.node: v for v in verdicts(decider.evaluate(whole, names), names, {})}
    assert found["t4"].fits and found["t4"].text == "fits now"
    assert found["b"].reason == "needs 1 whole GPUs, 0 free"
