"""What this branch added to the decision layer: rank(), host-only pods on the vector path,
NaN rows scored exactly, and the policy hooks (observe, generation, placement_score)."""

from __future__ import annotations

import numpy as np

from tessera.cluster_decision import Decider
from tessera.cluster_index import ClusterIndex
from tessera.cluster_state import ClusterState
from tessera.node_placement import NoFit, Placement, place_pod
from tessera.node_state import GpuCapacity, HostCapacity, NodeState
from tessera.request import PodRequest
from tessera.scoring_policy import (
    BinpackPolicy,
    FloatArray,
    IntArray,
    Option,
    Policy,
    VectorCase,
)
from tests.core.test_fragmentation_policy import inventory, pod


def small_state() -> ClusterState:
    state = ClusterState()
    state.set_node(inventory("a", 2), HostCapacity(cpu_milli=8000, memory_mib=4096))
    state.set_node(inventory("b", 4), HostCapacity(cpu_milli=2000, memory_mib=65536))
    state.set_node(inventory("c", 1))  # host resources not tracked
    return state


def test_host_only_pods_take_the_vector_path_with_the_exact_reasons() -> None:
    state = small_state()
    policy = BinpackPolicy()
    decider = Decider(state, {policy.name: policy}, policy.name)
    request = pod("cpu", cpu=4000, mem=8192)
    evaluation = decider.evaluate(request)
    assert set(evaluation.scores) == {"c"}
    for name, nofit in evaluation.failures.items():
        exact = place_pod(state.nodes[name], request, policy)
        assert isinstance(exact, NoFit) and exact.reason == nofit.reason


def test_rank_matches_evaluate() -> None:
    state = small_state()
    policy = BinpackPolicy()
    decider = Decider(state, {policy.name: policy}, policy.name)
    for request in (pod("s", 50, cpu=1000), pod("w", 200), pod("h", cpu=100)):
        ranking = decider.rank(request)
        evaluation = decider.evaluate(request)
        got = {decider.index.names[r]: s for r, s in zip(ranking.rows, ranking.scores, strict=True)}
        assert got == evaluation.scores


class Learning(Policy):
    """Scores every node with a number it changes when it observes a pod; NaN on node b
    (which the Decider must then score exactly)."""

    name = "learning"

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.level = 0.5

    def observe(self, request: PodRequest) -> None:
        self.seen.append(request.uid)
        self.level = 0.25 if len(self.seen) > 1 else 0.5
        self.generation = len(self.seen)

    def option_score(self, node: NodeState, free: GpuCapacity, option: Option) -> float:
        return 0.0

    def node_score(self, node: NodeState, before: GpuCapacity, after: GpuCapacity) -> float:
        return self.level

    def vector_node_scores(
        self, index: ClusterIndex, rows: IntArray, case: VectorCase
    ) -> FloatArray | None:
        names = [index.names[r] for r in rows.tolist()]
        return np.asarray([np.nan if n == "b" else self.level for n in names])


def test_observe_generation_and_nan_rows() -> None:
    state = small_state()
    policy = Learning()
    decider = Decider(state, {policy.name: policy}, policy.name)
    first = decider.evaluate(pod("p1", 100))
    assert policy.seen == ["p1"] and first.scores == {"a": 0.5, "b": 0.5, "c": 0.5}
    second = decider.evaluate(pod("p2", 100))
    # node b comes from the exact path; its cached score must not survive the generation
    assert second.scores == {"a": 0.25, "b": 0.25, "c": 0.25}


def test_placement_score_sees_the_pod() -> None:
    class HostAware(BinpackPolicy):
        def placement_score(
            self, node: NodeState, request: PodRequest, before: GpuCapacity, after: GpuCapacity
        ) -> float:
            return request.cpu_milli / 10_000

    state = small_state()
    placed = place_pod(state.nodes["a"], pod("p", 100, cpu=3000), HostAware())
    assert isinstance(placed, Placement) and placed.score == 0.3
