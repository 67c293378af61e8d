"""The Decider's vector path must agree with exact placement on fit, score and failure kind,
nodes whose isolation layer is down (no new GPU share) among the others."""

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera import resources as rn
from tessera.cluster_decision import UNKNOWN_NODE, Decider
from tessera.cluster_state import ClusterState
from tessera.isolation import NodeIsolation, share_refusal
from tessera.node_placement import Placement, place_pod
from tessera.policy_registry import POLICIES
from tessera.request import PodRequest, parse_pod

from .builders import SAMPLE_LIMITS, gpu, mixed_cluster, node, placed, pod

ANNOTATIONS = [{}, {rn.GPU_MODEL_ANNOTATION: "A100"}, {rn.GPU_MODEL_ANNOTATION: "T4,H100"}]


FILLS = st.lists(st.tuples(st.integers(0, len(SAMPLE_LIMITS) - 1), st.integers(0, 8)), max_size=60)
"""Pods of the sample sizes placed on the nine nodes (`fill`) before the checks."""
LAYERS = (
    None,
    NodeIsolation("hami-core", True, "8f3a89c+tessera.2", "8f3a89c"),
    NodeIsolation("mps", False, reason="the MPS control daemon is not running"),
    NodeIsolation("hami-core", False, reason="the HAMi-core library is missing"),
)
"""Each node's layer: unknown, up, or down (two reasons, so that the reasons differ)."""
NODE_LAYERS = st.lists(st.sampled_from(LAYERS), min_size=9, max_size=9)


def set_layers(decider: Decider, layers: list[NodeIsolation | None]) -> None:
    """Each node's layer as its agent reports it; what its pods hold stays accounted."""
    state = decider.state
    held = len(state.pods)
    for name, layer in zip(sorted(state.nodes), layers, strict=False):
        state.set_node(replace(state.nodes[name].inventory, isolation=layer))
    assert len(state.pods) == held  # pods already there are not touched


def make_decider(nodes: int = 9) -> Decider:
    state = mixed_cluster(nodes)
    policies = {name: cls() for name, cls in POLICIES.items()}
    return Decider(state, policies, "binpack")


def fill(decider: Decider, ops: list[tuple[int, int]]) -> None:
    names = sorted(decider.state.nodes)
    for k, (req, which) in enumerate(ops):
        request = parse_pod(pod(f"f{k}", containers={"main": SAMPLE_LIMITS[req]}))
        result = decider.place(request, names[which % len(names)])
        if isinstance(result, Placement):
            decider.state.add(result.allocation)


def sample_requests(policy_name: str) -> list[PodRequest]:
    """A pod of each sample size under each model annotation, placed by `policy_name`."""
    return [
        parse_pod(
            pod(
                "q",
                containers={"main": limits},
                annotations={**annotations, rn.PLACEMENT_ANNOTATION: policy_name},
            )
        )
        for limits in SAMPLE_LIMITS
        for annotations in ANNOTATIONS
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FILLS, st.sampled_from(sorted(POLICIES)), NODE_LAYERS)
def test_vector_path_agrees_with_exact_placement(
    ops: list[tuple[int, int]], policy_name: str, layers: list[NodeIsolation | None]
) -> None:
    decider = make_decider()
    fill(decider, ops)
    set_layers(decider, layers)
    policy = decider.policies[policy_name]
    for request in sample_requests(policy_name):
        evaluation = decider.evaluate(request)
        assert set(evaluation.scores) | set(evaluation.failures) == set(decider.state.nodes)
        for name, node_state in decider.state.nodes.items():
            exact = place_pod(node_state, request, policy)
            if isinstance(exact, Placement):
                assert evaluation.scores[name] == pytest.approx(exact.score, abs=1e-9)
                refusal = share_refusal(node_state.inventory.isolation)
                assert refusal is None or not any(
                    g.is_share for g in exact.allocation.counted_gpu_grants()
                )
            else:
                got = evaluation.failures[name]
                assert got.unresolvable == exact.unresolvable, (name, got, exact)
                if exact.reason == share_refusal(node_state.inventory.isolation):
                    assert got == exact  # the same words on both paths


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FILLS, st.sampled_from(sorted(POLICIES)), NODE_LAYERS)
def test_unscored_placement_takes_the_same_devices(
    ops: list[tuple[int, int]], policy_name: str, layers: list[NodeIsolation | None]
) -> None:
    """A bind places without the node score (the node is chosen): the devices, or the
    reason it does not fit, must be those of the scored placement."""
    decider = make_decider()
    fill(decider, ops)
    set_layers(decider, layers)
    for request in sample_requests(policy_name):
        for name in decider.state.nodes:
            scored = decider.place(request, name)
            unscored = decider.place(request, name, scored=False)
            if isinstance(scored, Placement):
                assert isinstance(unscored, Placement)
                assert unscored.allocation == scored.allocation
                assert math.isnan(unscored.score) and not math.isnan(scored.score)
            else:
                assert unscored == scored


def test_unknown_nodes_fail_as_unresolvable() -> None:
    decider = make_decider(2)
    request = parse_pod(pod(containers={"main": {rn.GPU: "10"}}))
    evaluation = decider.evaluate(request, ["n0", "ghost"])
    assert evaluation.failures["ghost"] is UNKNOWN_NODE
    assert "n0" in evaluation.scores
    assert decider.place(request, "ghost") is UNKNOWN_NODE


def test_failure_reasons_on_the_vector_path() -> None:
    state = ClusterState()
    state.set_node(node("t4", [gpu(0, model="Tesla T4", memory=15360)]))
    state.set_node(node("empty", []))
    state.set_node(node("a100", [gpu(0)]).with_gpu_health("GPU-00000000", False))
    decider = Decider(state, {"binpack": POLICIES["binpack"]()}, "binpack")
    big = decider.evaluate(
        parse_pod(pod(containers={"main": {rn.GPU_CORE: "5", rn.GPU_MEMORY: "20"}}))
    )
    assert (
        big.failures["t4"].unresolvable
        and "largest GPU here has 15.0 GiB" in big.failures["t4"].reason
    )
    assert big.failures["empty"].reason == "node has no GPUs"
    assert big.failures["a100"].reason == "all allowed GPUs are unhealthy"
    assert not big.failures["a100"].unresolvable
    model = decider.evaluate(
        parse_pod(
            pod(containers={"main": {rn.GPU: "10"}}, annotations={rn.GPU_MODEL_ANNOTATION: "H100"})
        )
    )
    assert (
        model.failures["t4"].reason == "no GPU of model H100" and model.failures["t4"].unresolvable
    )
    whole = decider.evaluate(parse_pod(pod(containers={"main": {rn.GPU: "200"}})))
    assert whole.failures["t4"].unresolvable and "the node has 1" in whole.failures["t4"].reason


def test_exact_path_is_used_for_complex_requests_and_follows_changes() -> None:
    decider = make_decider(3)
    request = parse_pod(pod(containers={"a": {rn.GPU: "50"}, "b": {rn.GPU: "200", rn.RDMA: "10"}}))
    first = decider.evaluate(request)
    assert set(first.scores) == {"n0", "n1"}  # the T4 node has no RDMA
    assert "RDMA" in first.failures["n2"].reason
    # fill n0 completely; the cached verdict for n0 must not survive the change
    fill_request = parse_pod(pod("big", containers={"main": {rn.GPU: "800"}}))
    decider.state.add(placed(decider.place(fill_request, "n0")).allocation)
    second = decider.evaluate(request)
    assert "n0" in second.failures and "n1" in second.scores


def test_policy_override_per_pod() -> None:
    decider = make_decider(3)
    busy = parse_pod(pod("busy", containers={"main": {rn.GPU: "400"}}))
    decider.state.add(placed(decider.place(busy, "n0")).allocation)
    packed = decider.evaluate(parse_pod(pod(containers={"main": {rn.GPU: "10"}})))
    spread = decider.evaluate(
        parse_pod(
            pod(
                containers={"main": {rn.GPU: "10"}}, annotations={rn.PLACEMENT_ANNOTATION: "spread"}
            )
        )
    )
    assert max(packed.scores, key=packed.scores.__getitem__) == "n0"
    assert max(spread.scores, key=spread.scores.__getitem__) != "n0"
    assert spread.policy == "spread"


def test_unknown_default_policy() -> None:
    with pytest.raises(ValueError):
        Decider(ClusterState(), {}, "binpack")


def test_nodes_named_out_of_row_order_keep_their_own_results() -> None:
    # three nodes, rows 0, 1, 2; asked as [n1, n0, n2] the last name is the last row,
    # which once made the vector path read rows 0, 1, 2 for names n1, n0, n2
    decider = make_decider(3)
    names = sorted(decider.state.nodes)
    fill(decider, [(0, 1)] * 8)  # the second node gets busy
    request = parse_pod(pod("probe", containers={"main": SAMPLE_LIMITS[0]}))
    in_order = decider.evaluate(request, names)
    shuffled = decider.evaluate(request, [names[1], names[0], names[2]])
    assert shuffled.scores == in_order.scores
    assert shuffled.failures.keys() == in_order.failures.keys()
    assert len(set(in_order.scores.values())) > 1


def test_a_layer_going_down_and_up_changes_the_answers_of_a_shape_seen_before() -> None:
    """The memo keeps verdicts per row: a layer change must restamp the node's row, on the
    vector path (a share), the exact path (a share with RDMA) and for whole GPUs (which
    the layer never changes)."""
    decider = make_decider(3)
    share = parse_pod(pod("s", containers={"main": {rn.GPU: "30"}}))
    exact_share = parse_pod(pod("x", containers={"main": {rn.GPU: "50", rn.RDMA: "25"}}))
    whole = parse_pod(pod("w", containers={"main": {rn.GPU: "100"}}))
    before = {r.uid: decider.evaluate(r) for r in (share, exact_share, whole)}
    assert "n0" in before["uid-s"].scores and "n0" in before["uid-x"].scores
    down = LAYERS[2]
    set_layers(decider, [down])
    for request in (share, exact_share):
        after = decider.evaluate(request)
        assert after.failures["n0"].reason == share_refusal(down)
        assert after.failures["n0"].unresolvable
        assert {n: s for n, s in after.scores.items() if n != "n0"} == {
            n: s for n, s in before[request.uid].scores.items() if n != "n0"
        }
    assert decider.evaluate(whole) == before["uid-w"]
    assert decider.index.refusing_shares == 1
    set_layers(decider, [LAYERS[1]])  # up again
    assert decider.index.refusing_shares == 0
    for request in (share, exact_share, whole):
        assert decider.evaluate(request) == before[request.uid]
