"""ClusterState invariants, checked on random operation sequences with hypothesis."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera import resources as rn
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.cluster_index import UNTRACKED, ClusterIndex
from tessera.cluster_state import ClusterState
from tessera.errors import StateError
from tessera.isolation import NodeIsolation, share_refusal
from tessera.node_placement import Placement, place_pod
from tessera.node_state import HostCapacity
from tessera.request import parse_pod
from tessera.scoring_policy import BinpackPolicy, SpreadPolicy
from tessera_edge.topology_file import load_topology

from .builders import SAMPLE_LIMITS, gpu, mixed_cluster, node, pod

LIMITS = st.sampled_from(SAMPLE_LIMITS)
OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "remove", "layer"]), LIMITS, st.integers(0, 5), st.booleans()
    ),
    min_size=1,
    max_size=60,
)


def check_capacity(state: ClusterState) -> None:
    for n in state.nodes.values():
        for slot, g in enumerate(n.inventory.gpus):
            assert 0 <= n.free_core[slot] <= rn.UNITS_PER_DEVICE
            assert 0 <= n.free_mem[slot] <= g.memory_mib
        for slot, _ in enumerate(n.inventory.nics):
            assert 0 <= n.nic_free[slot] <= rn.UNITS_PER_DEVICE
        # independent recount from the allocations themselves
        used: dict[str, int] = {}
        for alloc in state.pods_on(n.name):
            for grant in alloc.counted_gpu_grants():
                used[grant.uuid] = used.get(grant.uuid, 0) + grant.core
        for slot, g in enumerate(n.inventory.gpus):
            assert n.free_core[slot] == rn.UNITS_PER_DEVICE - used.get(g.uuid, 0)


def check_index(state: ClusterState, index: ClusterIndex) -> None:
    assert set(index.row_of) == set(state.nodes)
    for name, n in state.nodes.items():
        row = index.row_of[name]
        g = len(n.inventory.gpus)
        assert tuple(index.free_core[row, :g].tolist()) == n.free_core
        assert tuple(index.free_mem[row, :g].tolist()) == n.free_mem
        assert (index.free_core[row, g:] == -1).all()
        assert index.version[row] == n.version
        assert index.used_core[row] == rn.UNITS_PER_DEVICE * g - sum(n.free_core)
        assert index.takes_shares[row] == (share_refusal(n.inventory.isolation) is None)
    rows = list(index.row_of.values())
    assert index.refusing_shares == int((~index.takes_shares[rows]).sum())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_random_operations_keep_every_invariant(
    ops: list[tuple[str, dict[str, str], int, bool]],
) -> None:
    state = mixed_cluster(6, "node-")
    index = ClusterIndex(state, rows=2)  # starts small so rows are reallocated on the way
    empty = state.snapshot()
    names = sorted(state.nodes)
    live: list[str] = []
    for k, (op, limits, which, spread) in enumerate(ops):
        if op == "add":
            request = parse_pod(pod(f"p{k}", containers={"main": limits}))
            policy = SpreadPolicy() if spread else BinpackPolicy()
            result = place_pod(state.nodes[names[which]], request, policy)
            if isinstance(result, Placement):
                before = state.snapshot()
                state.add(result.allocation)
                live.append(request.uid)
                if k % 3 == 0:
                    # removing what was just added restores the state exactly
                    state.remove(request.uid)
                    assert state.snapshot() == before
                    state.add(result.allocation)
        elif op == "layer":  # the node's layer reported down (spread) or up; its pods stay
            inventory = state.nodes[names[which]].inventory
            layer = NodeIsolation("mps", not spread, reason="" if not spread else "no daemon")
            state.set_node(replace(inventory, isolation=layer))
        elif live:
            uid = live.pop(which % len(live))
            state.remove(uid)
        check_capacity(state)
    check_index(state, index)

    rebuilt = ClusterState.rebuild(
        [n.inventory for n in state.nodes.values()], list(state.pods.values())
    )
    assert rebuilt.snapshot() == state.snapshot()

    for uid in list(state.pods):
        state.remove(uid)
    assert state.snapshot() == empty
    check_index(state, index)


def manual_alloc(uid: str, node_name: str, uuid: str, core: int, mem: int = 1024) -> PodAllocation:
    grant = GpuGrant(uuid=uuid, index=0, minor=0, core=core, memory_mib=mem)
    return PodAllocation(uid, "default", uid, node_name, (ContainerAllocation("main", (grant,)),))


def small_cluster() -> ClusterState:
    state = ClusterState()
    state.set_node(node("n1", [gpu(0)]))
    return state


def test_overcommit_is_refused_and_changes_nothing() -> None:
    state = small_cluster()
    state.add(manual_alloc("a", "n1", "GPU-00000000", 70))
    before = state.snapshot()
    with pytest.raises(StateError, match="has 30% compute"):
        state.add(manual_alloc("b", "n1", "GPU-00000000", 40))
    assert state.snapshot() == before


def test_two_grants_on_one_gpu_in_one_pod_are_summed() -> None:
    state = small_cluster()
    g = GpuGrant("GPU-00000000", 0, 0, 60, 10)
    alloc = PodAllocation(
        "x", "default", "x", "n1", (ContainerAllocation("a", (g,)), ContainerAllocation("b", (g,)))
    )
    with pytest.raises(StateError):
        state.add(alloc)


def test_unknown_device_is_refused() -> None:
    state = small_cluster()
    with pytest.raises(StateError, match="not a GPU of node n1"):
        state.add(manual_alloc("a", "n1", "GPU-nope", 10))


def test_same_pod_twice() -> None:
    state = small_cluster()
    alloc = manual_alloc("a", "n1", "GPU-00000000", 10)
    state.add(alloc, assumed=True)
    assert "a" in state.assumed
    state.add(alloc)  # the watch confirms the same allocation: idempotent
    assert "a" not in state.assumed
    with pytest.raises(StateError, match="already holds"):
        state.add(manual_alloc("a", "n1", "GPU-00000000", 20))


def test_allocations_for_unknown_nodes_wait_until_the_node_arrives() -> None:
    state = ClusterState()
    alloc = manual_alloc("a", "late", "GPU-00000000", 40)
    state.add(alloc)
    assert "a" in state.pending and "a" not in state.pods
    state.set_node(node("late", [gpu(0)]))
    assert "a" in state.pods and state.nodes["late"].free_core == (60,)
    state.remove_node("late")
    assert "a" in state.pending
    assert state.remove("a") == alloc and not state.pending


def test_removing_is_idempotent_and_inventory_updates_keep_usage() -> None:
    state = small_cluster()
    state.add(manual_alloc("a", "n1", "GPU-00000000", 40))
    state.set_node(state.nodes["n1"].inventory.with_gpu_health("GPU-00000000", False))
    assert state.nodes["n1"].free_core == (60,)
    assert state.remove("a") is not None
    assert state.remove("a") is None
    assert state.nodes["n1"].free_core == (100,)


def test_usage_of_a_vanished_gpu_survives_rediscovery() -> None:
    state = ClusterState()
    state.set_node(node("n", [gpu(0), gpu(1)]))
    state.add(manual_alloc("a", "n", "GPU-00000001", 50))
    state.set_node(node("n", [gpu(0)]))  # GPU 1 fell off the bus
    state.set_node(node("n", [gpu(0), gpu(1)]))  # and came back
    assert state.nodes["n"].free_core == (100, 50)


def test_index_tracks_host_capacity_and_node_removal() -> None:
    state = ClusterState()
    index = ClusterIndex(state)
    state.set_node(node("a", [gpu(0)]), HostCapacity(cpu_milli=4000, memory_mib=8192))
    state.set_node(node("b", [gpu(0)]))
    assert index.cpu_free[index.row_of["a"]] == 4000
    assert index.cpu_free[index.row_of["b"]] == UNTRACKED
    state.remove_node("a")
    assert "a" not in index.row_of
    state.set_node(node("c", [gpu(i) for i in range(12)]))  # more slots than the index had
    row = index.row_of["c"]
    assert index.slots >= 12 and np.count_nonzero(index.free_core[row] == 100) == 12
    check_index(state, index)


NAME_OPS = st.lists(
    st.tuples(st.sampled_from(["add", "remove", "look"]), st.integers(0, 40)),
    min_size=1,
    max_size=120,
)


@settings(max_examples=60, deadline=None)
@given(NAME_OPS)
def test_rows_for_answers_from_the_names_however_they_were_laid_out(
    ops: list[tuple[str, int]],
) -> None:
    # nodes come and go while rows are looked up, so row_of is laid out again (rows_for
    # packs it) at random points: every answer still names the rows of those nodes
    state = ClusterState()
    index = ClusterIndex(state, rows=2)
    for op, k in ops:
        name = f"node-{k:02d}"
        if op == "add":
            state.set_node(node(name, [gpu(0)]))
        elif op == "remove" and name in state.nodes:
            state.remove_node(name)
        asked = [f"node-{j:02d}" for j in range(k % 7, 41, 3)] + [name, name]
        rows, unknown = index.rows_for(asked)
        assert unknown == [n for n in asked if n not in state.nodes]
        assert [index.names[r] for r in rows.tolist()] == [n for n in asked if n in state.nodes]
        check_index(state, index)
        assert all(index.names[index.row_of[n]] == n for n in state.nodes)


def test_names_are_laid_out_again_a_logarithmic_number_of_times() -> None:
    state = ClusterState()
    index = ClusterIndex(state)
    packs = 0
    pack = index._pack

    def counted() -> None:
        nonlocal packs
        packs += 1
        pack()

    index._pack = counted  # type: ignore[method-assign]
    for k in range(1000):
        state.set_node(node(f"node-{k:04d}", [gpu(0)]))
        rows, _ = index.rows_for([f"node-{k:04d}"])  # a filter after every new node
        assert index.names[int(rows[0])] == f"node-{k:04d}"
    assert 10 < packs <= 60  # once per growth by an eighth: about log(1000) / log(8/7)


def test_the_index_counts_the_nodes_that_refuse_shares_as_they_come_and_go() -> None:
    state = mixed_cluster(3, "node-")
    index = ClusterIndex(state, rows=1)
    down = NodeIsolation("hami-core", False, reason="the HAMi-core library is missing")
    for name in ("node-0", "node-2"):
        state.set_node(replace(state.nodes[name].inventory, isolation=down))
    assert index.refusing_shares == 2
    check_index(state, index)
    state.remove_node("node-0")  # its row is freed, and counts no more
    assert index.refusing_shares == 1
    state.set_node(replace(load_topology("t4-4x", "node-9"), isolation=None))  # reuses the row
    check_index(state, index)
    assert index.refusing_shares == 1
    state.set_node(replace(state.nodes["node-2"].inventory, isolation=None))  # unknown: takes
    assert index.refusing_shares == 0
    check_index(state, index)
