"""GpuPacking and GpuClustering: each rule of the paper's plugins on hand-made nodes, and
their vector scores against the per-node (exact) ones."""

from __future__ import annotations

from tessera.node_placement import Placement, place_pod
from tessera_sim.reference_gpu import GpuClusteringPolicy, GpuPackingPolicy
from tessera_sim.synthetic import synthetic_trace
from tessera_sim.trace import TraceNode, TracePod
from tests.sim.test_reference import cluster, occupy, scores


def test_packing_prefers_a_used_gpu_then_a_used_node_then_an_untouched_one() -> None:
    state = cluster(
        TraceNode("fresh", 96000, 1 << 20, 8, "G2"),
        TraceNode("used", 96000, 1 << 20, 8, "G2"),
        TraceNode("shared", 96000, 1 << 20, 4, "G2"),
    )
    occupy(state, "used", TracePod("w", 8000, 1, 1, 1000), GpuPackingPolicy())
    occupy(state, "shared", TracePod("s", 8000, 1, 1, 540), GpuPackingPolicy())
    share = scores(GpuPackingPolicy(), state, TracePod("p", 4000, 1, 1, 400))
    # untouched 8-GPU node: max(33 - 8, 8); used node, fresh GPU: 50 - 1; the GPU with
    # 46% left: 100 - 46 // 10
    assert share == {"fresh": 0.25, "used": 0.49, "shared": 0.96}
    whole = scores(GpuPackingPolicy(), state, TracePod("q", 4000, 1, 4, 1000))
    assert whole["used"] == 0.46 and whole["fresh"] == 0.25
    assert scores(GpuPackingPolicy(), state, TracePod("c", 4000, 1, 0, 0)) == dict.fromkeys(
        ("fresh", "used", "shared"), 0.0
    )


def test_clustering_groups_pods_of_one_kind() -> None:
    policy = GpuClusteringPolicy()
    state = cluster(
        TraceNode("empty", 96000, 1 << 20, 8, "G2"),
        TraceNode("shares", 96000, 1 << 20, 8, "G2"),
        TraceNode("mixed", 96000, 1 << 20, 8, "G2"),
        TraceNode("whole", 96000, 1 << 20, 8, "G2"),
    )
    for node, pod in (
        ("shares", TracePod("a", 1000, 1, 1, 500)),
        ("mixed", TracePod("b", 1000, 1, 1, 500)),
        ("mixed", TracePod("c", 1000, 1, 2, 1000)),
        ("whole", TracePod("d", 1000, 1, 2, 1000)),
    ):
        request = pod.request(f"{node}-{pod.name}")
        placed = place_pod(state.nodes[node], request, policy)
        assert isinstance(placed, Placement)
        state.add(placed.allocation)
        policy.bound(node, request)
    s = scores(policy, state, TracePod("p", 1000, 1, 1, 500))
    # 25 * (8000 - free milli) // 8000 plus 75 (only shares), 50 (shares among others),
    # 25 (no GPU pod), 0 (other kinds only)
    assert s == {"empty": 0.25, "shares": 0.76, "mixed": 0.57, "whole": 0.06}


def test_vector_scores_equal_the_exact_ones() -> None:
    trace = synthetic_trace(nodes=16, seed=3)
    for policy in (GpuPackingPolicy(), GpuClusteringPolicy()):
        state = cluster(*trace.nodes)
        probes = [p for p in trace.pods[:40]]
        for i, pod in enumerate(trace.pods[40:400]):
            ranked = scores(policy, state, pod)
            request = pod.request(f"u{i}")
            for name, value in ranked.items():
                placed = place_pod(state.nodes[name], request, policy)
                assert isinstance(placed, Placement)
                assert placed.score == value, (policy.name, pod, name)
            if ranked:
                best = max(sorted(ranked), key=lambda n: ranked[n])
                placed = place_pod(state.nodes[best], request, policy)
                assert isinstance(placed, Placement)
                state.add(placed.allocation)
                if isinstance(policy, GpuClusteringPolicy):
                    policy.bound(best, request)
        assert any(scores(policy, state, p) for p in probes)
