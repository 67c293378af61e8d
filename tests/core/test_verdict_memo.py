"""The Decider's per-shape verdict memo never changes an answer: after any sequence of
binds, releases, nodes coming and going, GPUs changing health, isolation layers going down
and up and catch-ups between the questions, a Decider with the memo says exactly (same
scores to the bit, same reasons, same order) what one without it says."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tessera import resources as rn
from tessera.cluster_decision import Decider
from tessera.cluster_index import ClusterIndex
from tessera.cluster_state import ClusterState
from tessera.isolation import NodeIsolation
from tessera.node_placement import Placement, place_pod
from tessera.node_state import HostCapacity
from tessera.policy_registry import make_policies
from tessera.request import PodRequest, parse_pod
from tessera.resources import PLACEMENT_POLICIES
from tessera.row_verdicts import VerdictMemo
from tessera.scoring_policy import BinpackPolicy, FloatArray, IntArray, VectorCase
from tests.core import builders
from tests.core.builders import nic
from tests.core.test_cluster_decision_paths import Learning
from tests.core.test_fragmentation_policy import inventory, pod

SHAPES: tuple[dict[str, Any], ...] = (
    {"gpu": 100},
    {"gpu": 200},
    {"core": 30, "units": 4},
    {"core": 50, "units": 20},
    {"core": 20, "units": 2, "cpu": 2000, "mem": 4096},
    {"gpu": 100, "models": "T4"},
    {"cpu": 1000, "mem": 2048},
    {"gpu": 200, "rdma": 100},
    {"gpu": 50, "rdma": 25},
)
"""The last two ask for RDMA beside GPUs: the exact path, with its verdicts in the memo too."""
NODES = [f"n{i}" for i in range(7)]
KINDS: tuple[tuple[int, int, tuple[int, ...]], ...] = (
    (4, 0, ()),
    (2, 1, ()),
    (8, 2, ()),
    (4, 0, (1,)),
    (1, 1, ()),
    (8, 2, (0, 3)),
)
"""(GPUs, model, unhealthy slots) of the node kinds; the odd kinds also have two RDMA NICs."""
LAYERS = (
    None,
    NodeIsolation("mps", True),
    NodeIsolation("mps", False, reason="the MPS control daemon is not running"),
    NodeIsolation("hami-core", False, reason="the HAMi-core library is missing"),
)
"""A node's isolation layer: unknown, up, down (the down ones refuse shares)."""

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("ask"),
            st.integers(0, len(SHAPES) - 1),
            st.lists(st.sampled_from([*NODES, "ghost"]), max_size=9),
        ),
        st.tuples(st.just("place"), st.integers(0, len(SHAPES) - 1), st.sampled_from(NODES)),
        st.tuples(st.just("release"), st.integers(0, 50), st.just("")),
        st.tuples(st.just("node"), st.integers(0, 5), st.sampled_from(NODES)),
        st.tuples(st.just("gone"), st.just(0), st.sampled_from(NODES)),
        st.tuples(st.just("layer"), st.integers(0, len(LAYERS) - 1), st.sampled_from(NODES)),
        st.tuples(st.just("catch"), st.integers(0, len(SHAPES) - 1), st.sampled_from([1, 64])),
    ),
    min_size=4,
    max_size=40,
)


def _node(state: ClusterState, name: str, kind: int) -> None:
    gpus, model, unhealthy = KINDS[kind]
    node = inventory(name, gpus, model, unhealthy)
    if kind % 2:
        node = replace(node, nics=(nic(0, vfs=2), nic(1)))
        state.set_node(node, HostCapacity(16000, 65536))
    else:
        state.set_node(node)  # host not tracked


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PLACEMENT_POLICIES), ops)
@example("binpack", [("ask", 0, []), ("place", 0, "n0"), ("ask", 0, [])])
@example("fragmentation", [("ask", 2, []), ("gone", 0, "n1"), ("ask", 2, ["n0", "n1", "n0"])])
@example("spread", [("ask", 5, []), ("node", 2, "n0"), ("ask", 5, ["ghost", "n0"])])
@example("fragmentation", [("ask", 2, []), ("place", 2, "n1"), ("catch", 2, 64), ("ask", 2, [])])
@example("binpack", [("ask", 2, []), ("layer", 2, "n0"), ("ask", 2, []), ("layer", 1, "n0")])
@example("spread", [("ask", 8, []), ("layer", 3, "n1"), ("catch", 8, 1), ("ask", 8, [])])
def test_memo_answers_as_a_fresh_judgement(policy: str, steps: list[tuple[str, int, Any]]) -> None:
    state = ClusterState()
    for i, name in enumerate(NODES[:5]):
        _node(state, name, i % 6)
    memo = Decider(state, make_policies(), policy)
    fresh = Decider(state, make_policies(), policy)
    fresh._verdicts = VerdictMemo(max_shapes=0)  # every row judged afresh
    placed: list[str] = []
    for n, (op, a, b) in enumerate(steps):
        if op == "ask":
            # a new pod each time (the learning policy counts each once), same for both
            request = _request(f"ask-{n}", a)
            names = b or NODES
            got = memo.judge(request, names).evaluation()
            want = fresh.judge(_request(f"ask-{n}", a), names).evaluation()
            assert list(got.scores.items()) == list(want.scores.items())
            assert list(got.failures.items()) == list(want.failures.items())
            assert got == memo.evaluate(_request(f"ask-{n}", a), names)
            if "rdma" in SHAPES[a]:  # the exact path: what place_pod says on each node now
                for name in set(names) & set(state.nodes):
                    placed_now = place_pod(state.nodes[name], request, memo.policy_for(request))
                    if isinstance(placed_now, Placement):
                        assert got.scores[name] == placed_now.score
                    else:
                        assert got.failures[name] == placed_now
            fresh.evaluate(_request(f"ask-{n}", a), names)  # keep the two learning alike
        elif op == "place":
            placement = memo.place(_request(f"p-{n}", a), b)
            if isinstance(placement, Placement):
                state.add(placement.allocation)
                placed.append(placement.allocation.pod_uid)
        elif op == "release" and placed:
            state.remove(placed.pop(a % len(placed)))
        elif op == "node" and _empty(state, b):
            _node(state, b, a)
        elif op == "gone" and _empty(state, b):
            state.remove_node(b)
        elif op == "layer" and b in state.nodes:  # its pods stay
            node = state.nodes[b]
            state.set_node(replace(node.inventory, isolation=LAYERS[a]), node.host)
        elif op == "catch":  # what the extender does once an answer is sent
            memo.catch_up(_request(f"catch-{n}", a), most=b)


def _empty(state: ClusterState, node: str) -> bool:
    return next(iter(state.pods_on(node)), None) is None


def _request(uid: str, shape: int) -> PodRequest:
    fields = dict(SHAPES[shape])
    rdma = fields.pop("rdma", None)
    if rdma is None:
        return pod(uid, **fields)
    limits = {rn.GPU: str(fields["gpu"]), rn.RDMA: str(rdma)}
    return parse_pod(builders.pod(uid, {"c": limits}, uid=uid))


@pytest.mark.parametrize("shape", [0, 2, 7])  # whole GPUs, a share (vector path); RDMA (exact)
def test_catch_up_judges_the_changed_rows_so_the_next_question_need_not(shape: int) -> None:
    state = ClusterState()
    for i, name in enumerate(NODES[:5]):
        _node(state, name, i % 6)
    decider = Decider(state, make_policies(), "binpack")
    assert decider.catch_up(_request("first", shape)) == 0  # nothing judged yet: nothing to do
    decider.judge(_request("a", shape), NODES)
    assert decider.catch_up(_request("a", shape)) == 0  # nothing changed since
    placement = decider.place(_request("b", 0), "n2")
    assert isinstance(placement, Placement)
    state.add(placement.allocation)
    assert decider.catch_up(_request("c", shape)) == 1  # n2's row alone
    assert decider.catch_up(_request("c", shape)) == 0
    judged: list[int] = []
    judging = decider._judging

    def counted(request: PodRequest, policy: Any) -> Any:
        key, judge = judging(request, policy)

        def counting(stale: IntArray) -> Any:
            judged.append(stale.size)
            return judge(stale)

        return key, counting

    decider._judging = counted  # type: ignore[method-assign]
    decider.judge(_request("d", shape), NODES)
    assert judged == []  # the answer is a gather: every verdict was current
    state.remove(placement.allocation.pod_uid)
    for name in ("n0", "n1"):
        placed = decider.place(_request(f"e-{name}", 0), name)
        assert isinstance(placed, Placement)
        state.add(placed.allocation)
    assert decider.catch_up(_request("f", shape), most=2) == 0  # three changed: left alone
    decider.judge(_request("g", shape), NODES)
    assert judged == [3]


def test_the_memo_is_bounded() -> None:
    state = ClusterState()
    _node(state, "n0", 0)
    decider = Decider(state, make_policies(), "binpack")
    for k in range(1, 80):
        decider.judge(pod(f"u{k}", core=k, units=1), ["n0"])
    assert len(decider._verdicts) == VerdictMemo().max_shapes


class Crowded(BinpackPolicy):
    """Scores every node by how many nodes the index holds (an index-wide fact, as the
    fragmentation policy's model scarcity is), without a generation of its own."""

    name = "crowded"

    def vector_node_scores(
        self, index: ClusterIndex, rows: IntArray, case: VectorCase
    ) -> FloatArray | None:
        return np.full(rows.size, 1.0 / len(index.row_of))


def test_a_node_coming_or_going_starts_every_shape_afresh() -> None:
    state = ClusterState()
    for name in NODES[:3]:
        _node(state, name, 0)
    policy = Crowded()
    decider = Decider(state, {policy.name: policy}, policy.name)
    assert decider.evaluate(pod("a", 100), ["n0"]).scores == {"n0": 1 / 3}
    _node(state, "n5", 0)
    assert decider.evaluate(pod("b", 100), ["n0"]).scores == {"n0": 1 / 4}
    state.remove_node("n5")
    state.remove_node("n1")
    assert decider.evaluate(pod("c", 100), ["n0"]).scores == {"n0": 1 / 2}


def test_the_memo_follows_the_policy_generation() -> None:
    state = ClusterState()
    _node(state, "a", 0)
    policy = Learning()
    decider = Decider(state, {policy.name: policy}, policy.name)
    assert decider.evaluate(pod("p1", 100), ["a"]).scores == {"a": 0.5}
    assert decider.evaluate(pod("p2", 100), ["a"]).scores == {"a": 0.25}


@pytest.mark.parametrize("shape", [2, 8])  # a share on the vector path, and on the exact path
def test_a_layer_change_restamps_its_row_only(shape: int) -> None:
    state = ClusterState()
    for i, name in enumerate(NODES[:5]):
        _node(state, name, i % 6)
    decider = Decider(state, make_policies(), "binpack")
    first = decider.judge(_request("a", shape), NODES).evaluation()
    fits = sorted(first.scores)
    assert fits
    node = state.nodes[fits[0]]
    state.set_node(replace(node.inventory, isolation=LAYERS[2]), node.host)
    assert decider.catch_up(_request("b", shape)) == 1  # that node's row alone
    down = decider.judge(_request("c", shape), NODES).evaluation()
    assert down.failures[fits[0]].reason.startswith("isolation layer mps is down: ")
    assert down.scores == {n: s for n, s in first.scores.items() if n != fits[0]}
    state.set_node(replace(node.inventory, isolation=LAYERS[1]), node.host)
    assert decider.judge(_request("d", shape), NODES).evaluation() == first
