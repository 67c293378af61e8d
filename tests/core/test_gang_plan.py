"""plan_gang: every member at once, on copies, inside one domain when asked."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tessera import resources as rn
from tessera.cluster_decision import Decider
from tessera.cluster_state import ClusterState
from tessera.gang.plan import GangAsk, GangPlan, GangShortfall, plan_gang
from tessera.gang.spec import NO_TOPOLOGY, GangKey, GangTopology
from tessera.node_placement import Placement, place_pod
from tessera.policy_registry import make_policies
from tessera.request import PodRequest, parse_pod
from tests.core.builders import gpu, nic, node, pod

KEY = GangKey("ml", "llama")
POLICIES = make_policies()
RACK = "example.com/rack"


def request(name: str, limits: dict[str, str]) -> PodRequest:
    return parse_pod(pod(name, {"main": limits}))


def members(count: int, limits: dict[str, str], prefix: str = "m") -> tuple[PodRequest, ...]:
    return tuple(request(f"{prefix}{i}", limits) for i in range(count))


def cluster(names: list[str], gpus: int = 8, nics: int = 0) -> ClusterState:
    state = ClusterState()
    for name in names:
        state.set_node(node(name, [gpu(i) for i in range(gpus)], [nic(i) for i in range(nics)]))
    return state


def occupy(state: ClusterState, node_name: str, limits: dict[str, str], name: str) -> None:
    placed = place_pod(state.nodes[node_name], request(name, limits), POLICIES["binpack"])
    assert isinstance(placed, Placement)
    state.add(placed.allocation)


def labels_of(racks: dict[str, str]) -> Any:
    return lambda n, key: racks.get(n) if key == RACK else None


def plan(
    state: ClusterState,
    ask_members: tuple[PodRequest, ...],
    *,
    racks: dict[str, str] | None = None,
    topology: GangTopology = NO_TOPOLOGY,
    placed: tuple[str, ...] = (),
    policy: str = "binpack",
) -> GangPlan | GangShortfall:
    ask = GangAsk(KEY, ask_members, placed, topology)
    return plan_gang(
        ask,
        state.nodes,
        label_of=labels_of(racks or {}),
        policy_for=lambda r: POLICIES[policy],
    )


def apply_all(state: ClusterState, result: GangPlan) -> None:
    """The plan's allocations all fit the live state together (StateError otherwise)."""
    for alloc in result.allocations:
        state.add(alloc)


def test_a_gang_that_fits_gets_one_allocation_per_member_all_together() -> None:
    state = cluster(["a", "b"])
    gang = members(3, {rn.GPU: "400"})
    result = plan(state, gang)
    assert isinstance(result, GangPlan)
    assert [a.pod_uid for a in result.allocations] == [r.uid for r in gang]
    before = state.snapshot()
    apply_all(state, result)
    assert state.snapshot() != before
    assert sum(len(a.counted_gpu_grants()) for a in result.allocations) == 12


def test_planning_changes_nothing() -> None:
    state = cluster(["a", "b"])
    occupy(state, "a", {rn.GPU: "300"}, "x")
    before = state.snapshot()
    versions = {n: s.version for n, s in state.nodes.items()}
    plan(state, members(2, {rn.GPU: "400"}))
    plan(state, members(9, {rn.GPU: "400"}))
    assert state.snapshot() == before
    assert {n: s.version for n, s in state.nodes.items()} == versions


def test_too_few_gpus_is_a_shortfall_naming_need_and_free() -> None:
    state = cluster(["a", "b"])
    occupy(state, "a", {rn.GPU: "300"}, "x")
    result = plan(state, members(2, {rn.GPU: "800"}))
    assert isinstance(result, GangShortfall)
    assert result.reason == "gang ml/llama: 2 members need 16 GPUs, 13 free"


def test_rdma_members_count_only_gpus_on_nodes_with_nics() -> None:
    state = cluster(["a", "b"], nics=1)
    state.set_node(node("c", [gpu(i) for i in range(8)]))
    result = plan(state, members(3, {rn.GPU: "800", rn.RDMA: "100"}))
    assert isinstance(result, GangShortfall)
    assert result.reason == "gang ml/llama: 3 members need 24 GPUs with RDMA, 16 free"


def test_enough_gpus_but_cut_up_says_they_do_not_fit_together() -> None:
    state = cluster(["a", "b"])
    occupy(state, "a", {rn.GPU: "400"}, "x")
    occupy(state, "b", {rn.GPU: "400"}, "y")
    result = plan(state, members(1, {rn.GPU: "800"}))
    assert isinstance(result, GangShortfall)
    assert "1 members need 8 GPUs, 8 free, but not all fit together" in result.reason
    assert "ml/m0" not in result.reason  # members are named by their pod key
    assert "default/m0" in result.reason


def test_the_largest_members_choose_first() -> None:
    # one 8-GPU and four 2-GPU members on two 8-GPU nodes: fits only if the 8 goes first
    state = cluster(["a", "b"])
    gang = (*members(4, {rn.GPU: "200"}, "s"), request("big", {rn.GPU: "800"}))
    result = plan(state, gang)
    assert isinstance(result, GangPlan)
    apply_all(state, result)


def test_required_topology_keeps_every_member_in_one_rack() -> None:
    names = ["a1", "a2", "b1", "b2"]
    state = cluster(names)
    racks = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}
    occupy(state, "a1", {rn.GPU: "100"}, "x")
    result = plan(state, members(2, {rn.GPU: "800"}), racks=racks, topology=GangTopology(RACK))
    assert isinstance(result, GangPlan)
    assert {a.node for a in result.allocations} == {"b1", "b2"}
    assert result.domain == f"{RACK}=B"


def test_required_topology_with_no_rack_big_enough_places_nothing() -> None:
    names = ["a1", "a2", "b1", "b2"]
    state = cluster(names)
    racks = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}
    result = plan(state, members(3, {rn.GPU: "800"}), racks=racks, topology=GangTopology(RACK))
    assert isinstance(result, GangShortfall)
    assert result.reason == (
        f"gang ml/llama: 3 members need 24 GPUs, 16 free in any one {RACK} domain"
    )
    # without the requirement the same gang fits across racks
    assert isinstance(plan(state, members(3, {rn.GPU: "800"}), racks=racks), GangPlan)


def test_nodes_without_the_label_are_no_domain() -> None:
    state = cluster(["a1", "x"])
    result = plan(
        state, members(2, {rn.GPU: "800"}), racks={"a1": "A"}, topology=GangTopology(RACK)
    )
    assert isinstance(result, GangShortfall)


def test_the_domain_that_wastes_least_is_chosen() -> None:
    # rack A's two nodes each have 4 GPUs taken; rack B is empty. A gang of two 4-GPU
    # members fills A's holes (nothing left cut up) rather than cutting B's nodes in half.
    state = cluster(["a1", "a2", "b1", "b2"])
    racks = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}
    occupy(state, "a1", {rn.GPU: "400"}, "x")
    occupy(state, "a2", {rn.GPU: "400"}, "y")
    for policy in ("binpack", "spread", "fragmentation"):
        result = plan(
            state,
            members(2, {rn.GPU: "400"}),
            racks=racks,
            topology=GangTopology(RACK),
            policy=policy,
        )
        assert isinstance(result, GangPlan), policy
        assert result.domain == f"{RACK}=A", policy


def test_members_already_placed_pin_the_required_domain() -> None:
    state = cluster(["a1", "a2", "b1", "b2"])
    racks = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}
    occupy(state, "b1", {rn.GPU: "800"}, "bound-member")
    topology = GangTopology(RACK)
    result = plan(
        state, members(1, {rn.GPU: "800"}), racks=racks, topology=topology, placed=("b1",)
    )
    assert isinstance(result, GangPlan)
    assert [a.node for a in result.allocations] == ["b2"]
    result = plan(
        state, members(2, {rn.GPU: "800"}), racks=racks, topology=topology, placed=("b1",)
    )
    assert isinstance(result, GangShortfall)
    assert f"free in its {RACK} domain" in result.reason
    split = plan(
        state, members(1, {rn.GPU: "100"}), racks=racks, topology=topology, placed=("a1", "b1")
    )
    assert isinstance(split, GangShortfall)
    assert "not in one" in split.reason


def test_preferred_topology_uses_the_fewest_domains() -> None:
    # three racks of two nodes; 3 x 8 GPUs fit in no rack: two racks, never three
    names = [f"{r}{i}" for r in "abc" for i in (1, 2)]
    state = cluster(names)
    racks = {n: n[0] for n in names}
    occupy(state, "b1", {rn.GPU: "100"}, "x")
    result = plan(
        state, members(3, {rn.GPU: "800"}), racks=racks, topology=GangTopology(None, RACK)
    )
    assert isinstance(result, GangPlan)
    used = Counter(racks[a.node] for a in result.allocations)
    assert len(used) == 2
    assert "b" not in used  # the roomiest racks first
    # when one rack holds it, it stays in one rack
    result = plan(
        state, members(2, {rn.GPU: "800"}), racks=racks, topology=GangTopology(None, RACK)
    )
    assert isinstance(result, GangPlan)
    assert len({racks[a.node] for a in result.allocations}) == 1


def test_an_empty_gang_is_an_empty_plan() -> None:
    result = plan(cluster(["a"]), ())
    assert isinstance(result, GangPlan)
    assert result.allocations == ()


LIMITS = st.sampled_from(
    [
        {rn.GPU: "50"},
        {rn.GPU: "100"},
        {rn.GPU: "200"},
        {rn.GPU: "400"},
        {rn.GPU: "800"},
        {rn.GPU: "100", rn.RDMA: "50"},
        {rn.GPU_CORE: "30", rn.GPU_MEMORY_RATIO: "30"},
    ]
)


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 5),
    used=st.lists(st.tuples(st.integers(0, 4), LIMITS), max_size=6),
    gang=st.lists(LIMITS, min_size=1, max_size=6),
    required=st.booleans(),
    policy=st.sampled_from(["binpack", "spread", "fragmentation"]),
)
def test_a_plan_always_fits_the_live_state_and_respects_its_domain(
    nodes: int,
    used: list[tuple[int, dict[str, str]]],
    gang: list[dict[str, str]],
    required: bool,
    policy: str,
) -> None:
    names = [f"n{i}" for i in range(nodes)]
    state = cluster(names, nics=1)
    for i, (where, limits) in enumerate(used):
        name = names[where % nodes]
        placed = place_pod(state.nodes[name], request(f"u{i}", limits), POLICIES["binpack"])
        if isinstance(placed, Placement):
            state.add(placed.allocation)
    racks = {n: str(i // 2) for i, n in enumerate(names)}
    ask = tuple(request(f"g{i}", limits) for i, limits in enumerate(gang))
    topology = GangTopology(RACK if required else None)
    before = state.snapshot()
    result = plan(state, ask, racks=racks, topology=topology, policy=policy)
    assert state.snapshot() == before
    if isinstance(result, GangShortfall):
        assert result.reason.startswith("gang ml/llama: ")
        if len(ask) == 1 and not required:  # one member: the planner misses no node
            assert not any(
                isinstance(place_pod(s, ask[0], POLICIES[policy]), Placement)
                for s in state.nodes.values()
            )
        return
    assert len(result.allocations) == len(ask)
    if policy != "fragmentation":  # (its workload learns from each evaluation)
        # judging untouched nodes with the Decider's whole-cluster path gives the same plan
        decider = Decider(state, POLICIES, policy)

        def evaluate(r: PodRequest, names: Sequence[str]) -> Any:
            ev = decider.evaluate(r, names)
            return ev.scores, ev.failures

        fast = plan_gang(
            GangAsk(KEY, ask, (), topology),
            state.nodes,
            label_of=labels_of(racks),
            policy_for=lambda r: POLICIES[policy],
            evaluate=evaluate,
        )
        assert fast == result
    apply_all(state, result)  # StateError if two members (or a member and a pod) overlap
    if required:
        assert len({racks[a.node] for a in result.allocations}) == 1
