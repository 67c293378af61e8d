from typing import Any

import pytest

from tessera import resources as rn
from tessera.allocation import PodAllocation
from tessera.node_placement import NoFit, Placement, place_pod
from tessera.node_state import HostCapacity, NodeState
from tessera.request import parse_pod
from tessera.scoring_policy import BinpackPolicy, Policy, SpreadPolicy
from tessera_edge.topology_file import load_topology

from .builders import gpu, nic, node, placed, pod, refused

BINPACK = BinpackPolicy()
SPREAD = SpreadPolicy()


def place(
    state: NodeState,
    limits: dict[str, str] | None = None,
    policy: Policy = BINPACK,
    **kw: Any,
) -> Placement | NoFit:
    return place_pod(state, parse_pod(pod(containers={"main": limits or {}}, **kw)), policy)


def commit(state: NodeState, result: Placement | NoFit) -> PodAllocation:
    alloc = placed(result).allocation
    state.apply(alloc)
    return alloc


def test_share_lands_on_one_gpu_with_memory_from_the_ratio() -> None:
    s = NodeState(node("n", [gpu(0), gpu(1)]))
    alloc = commit(s, place(s, {rn.GPU: "25"}))
    (g,) = alloc.containers[0].gpus
    assert (g.core, g.memory_mib) == (25, 81920 // 4)
    assert s.free_core == (75, 100)


def test_binpack_fills_the_fullest_gpu_and_spread_the_emptiest() -> None:
    s = NodeState(node("n", [gpu(0), gpu(1), gpu(2)]))
    commit(s, place(s, {rn.GPU: "50"}))  # GPU 0 now half used
    packed = placed(place(s, {rn.GPU: "20"}))
    spread = placed(place(s, {rn.GPU: "20"}, policy=SPREAD))
    assert packed.allocation.containers[0].gpus[0].index == 0
    assert spread.allocation.containers[0].gpus[0].index == 1


def test_memory_units_use_the_node_unit() -> None:
    inv = node("n", [gpu(0)])
    inv = inv.__class__(inv.node_name, inv.gpus, inv.nics, memory_unit_mib=512)
    s = NodeState(inv)
    alloc = commit(s, place(s, {rn.GPU_CORE: "10", rn.GPU_MEMORY: "3"}))
    assert alloc.containers[0].gpus[0].memory_mib == 1536


def test_share_shortfall_says_what_is_free() -> None:
    s = NodeState(node("n", [gpu(0)]))
    commit(s, place(s, {rn.GPU: "80"}))
    result = refused(place(s, {rn.GPU: "30"}))
    assert not result.unresolvable
    assert "no GPU has 30% compute" in result.reason and "20%" in result.reason


def test_memory_larger_than_any_gpu_is_unresolvable() -> None:
    s = NodeState(node("n", [gpu(0, memory=16384)]))
    result = refused(place(s, {rn.GPU_CORE: "10", rn.GPU_MEMORY: "40"}))
    assert result.unresolvable
    assert "largest GPU here has 16.0 GiB" in result.reason


def test_whole_gpus_need_entirely_free_gpus() -> None:
    s = NodeState(node("n", [gpu(0), gpu(1)]))
    commit(s, place(s, {rn.GPU_MEMORY: "1"}))
    assert refused(place(s, {rn.GPU: "200"})).reason == "needs 2 whole GPUs, 1 free"
    too_many = refused(place(s, {rn.GPU: "300"}))
    assert too_many.unresolvable and "the node has 2" in too_many.reason


def test_whole_gpus_prefer_the_best_interconnect() -> None:
    s = NodeState(load_topology("a100-pcie-8x", "n"))
    alloc = commit(s, place(s, {rn.GPU: "200"}))
    slots = [g.index for g in alloc.containers[0].gpus]
    inv = s.inventory
    assert inv.gpus[slots[0]].pcie_switch == inv.gpus[slots[1]].pcie_switch
    four = commit(s, place(s, {rn.GPU: "400"}))
    assert len({inv.gpus[g.index].numa_node for g in four.containers[0].gpus}) == 1


def test_required_scope_is_enforced() -> None:
    s = NodeState(load_topology("a100-pcie-8x", "n"))
    ann = {rn.TOPOLOGY_ANNOTATION: "pcie"}
    ok = commit(s, place(s, {rn.GPU: "200"}, annotations=ann))
    assert len(ok.containers[0].gpus) == 2
    impossible = refused(place(s, {rn.GPU: "400"}, annotations=ann))
    assert impossible.unresolvable and "no 4 GPUs of this node share pcie" in impossible.reason
    nvlink = refused(place(s, {rn.GPU: "200"}, annotations={rn.TOPOLOGY_ANNOTATION: "nvlink"}))
    assert nvlink.unresolvable


def test_required_scope_blocked_by_usage_is_resolvable() -> None:
    s = NodeState(load_topology("a100-pcie-8x", "n"))
    # one share on each switch: no switch keeps both GPUs free
    for g in s.inventory.gpus[::2]:
        commit(s, place(s, {rn.GPU: "10"}, annotations={rn.GPU_UUID_ANNOTATION: g.uuid}))
    result = refused(place(s, {rn.GPU: "200"}, annotations={rn.TOPOLOGY_ANNOTATION: "pcie"}))
    assert not result.unresolvable
    assert "share pcie" in result.reason


def test_model_and_uuid_hints() -> None:
    s = NodeState(node("n", [gpu(0, model="Tesla T4"), gpu(1, model="NVIDIA A100 80GB PCIe")]))
    alloc = commit(s, place(s, {rn.GPU: "10"}, annotations={rn.GPU_MODEL_ANNOTATION: "A100"}))
    assert alloc.containers[0].gpus[0].index == 1
    wrong = refused(place(s, {rn.GPU: "10"}, annotations={rn.GPU_MODEL_ANNOTATION: "H100"}))
    assert wrong.unresolvable and "no GPU of model H100" in wrong.reason
    only0 = placed(place(s, {rn.GPU: "10"}, annotations={rn.GPU_UUID_ANNOTATION: "GPU-00000000"}))
    assert only0.allocation.containers[0].gpus[0].index == 0
    none = refused(
        place(
            s,
            {rn.GPU: "10"},
            annotations={rn.GPU_UUID_EXCLUDE_ANNOTATION: "GPU-00000000,GPU-00000001"},
        )
    )
    assert none.unresolvable and "UUID" in none.reason


def test_unhealthy_gpus_are_skipped_and_all_unhealthy_is_resolvable() -> None:
    inv = node("n", [gpu(0), gpu(1)])
    s = NodeState(inv.with_gpu_health("GPU-00000000", False, "XID 79"))
    alloc = commit(s, place(s, {rn.GPU: "10"}))
    assert alloc.containers[0].gpus[0].index == 1
    s.update_inventory(s.inventory.with_gpu_health("GPU-00000001", False))
    result = refused(place(s, {rn.GPU: "10"}))
    assert not result.unresolvable and "unhealthy" in result.reason
    # the allocation on the now-unhealthy GPU stays accounted
    assert s.free_core == (100, 90)


def test_node_without_gpus() -> None:
    s = NodeState(node("n", []))
    assert refused(place(s, {rn.GPU: "10"})).unresolvable
    assert placed(place(s, {"cpu": "1"})).allocation.containers == ()


def test_multi_container_pods_are_placed_together_or_not_at_all() -> None:
    s = NodeState(node("n", [gpu(0), gpu(1)]))
    p = pod(containers={"a": {rn.GPU: "60"}, "b": {rn.GPU: "60"}, "c": {rn.GPU: "60"}})
    result = place_pod(s, parse_pod(p), BINPACK)
    assert isinstance(result, NoFit) and result.reason.startswith('container "')
    assert s.free_core == (100, 100)
    p = pod(containers={"a": {rn.GPU: "60"}, "b": {rn.GPU: "60"}})
    alloc = commit(s, place_pod(s, parse_pod(p), BINPACK))
    assert {c.gpus[0].index for c in alloc.containers} == {0, 1}
    assert [c.name for c in alloc.containers] == ["a", "b"]


def test_init_container_reuses_app_devices_when_it_fits() -> None:
    s = NodeState(node("n", [gpu(0), gpu(1)]))
    p = pod(containers={"app": {rn.GPU: "50"}}, init={"warmup": {rn.GPU: "30"}})
    alloc = commit(s, place_pod(s, parse_pod(p), BINPACK))
    init, app = alloc.container("warmup"), alloc.container("app")
    assert init is not None and app is not None
    assert init.reuses == "app" and init.gpus == app.gpus[:1]
    assert s.free_core == (50, 100)  # not counted twice


def test_init_container_bigger_than_app_gets_its_own() -> None:
    s = NodeState(node("n", [gpu(0), gpu(1)]))
    p = pod(containers={"app": {rn.GPU: "20"}}, init={"big": {rn.GPU: "100"}})
    alloc = commit(s, place_pod(s, parse_pod(p), BINPACK))
    big = alloc.container("big")
    assert big is not None and big.reuses == ""
    assert sorted(s.free_core) == [0, 80]


def test_rdma_share_gets_a_vf_next_to_the_gpus() -> None:
    s = NodeState(load_topology("h100-sxm-8x", "n"))
    ann = {rn.RDMA_AFFINITY_ANNOTATION: "pcie"}
    alloc = commit(s, place(s, {rn.GPU: "200", rn.RDMA: "50"}, annotations=ann))
    c = alloc.containers[0]
    (r,) = c.rdma
    gpu_roots = {s.inventory.gpus[g.index].pcie_root for g in c.gpus}
    nic_obj = next(n for n in s.inventory.nics if n.pci_bus_id == r.pci_bus_id)
    assert nic_obj.pcie_root in gpu_roots
    assert r.share == 50 and len(r.vfs) == 1
    slot = s.inventory.nic_slot(r.pci_bus_id)
    assert slot is not None and s.nic_free[slot] == 50


def test_rdma_vfs_bound_the_number_of_sharers() -> None:
    s = NodeState(node("n", [], [nic(0, vfs=2)]))
    commit(s, place(s, {rn.RDMA: "10"}))
    commit(s, place(s, {rn.RDMA: "10"}))
    assert "RDMA" in refused(place(s, {rn.RDMA: "10"})).reason


def test_whole_rdma_nics() -> None:
    s = NodeState(node("n", [], [nic(0), nic(1)]))
    alloc = commit(s, place(s, {rn.RDMA: "200"}))
    assert [r.share for r in alloc.containers[0].rdma] == [100, 100]
    assert refused(place(s, {rn.RDMA: "10"})).reason.startswith("needs 10% of an RDMA NIC")


def test_rdma_without_nics_is_unresolvable_and_affinity_can_block() -> None:
    assert refused(place(NodeState(node("n", [gpu(0)])), {rn.RDMA: "10"})).unresolvable
    far = nic(0, pcie_root="r9", numa_node=1)
    s = NodeState(node("n", [gpu(0, numa_node=0)], [far]))
    result = refused(
        place(s, {rn.GPU: "10", rn.RDMA: "10"}, annotations={rn.RDMA_AFFINITY_ANNOTATION: "numa"})
    )
    assert "NUMA" in result.reason
    assert isinstance(place(s, {rn.GPU: "10", rn.RDMA: "10"}), Placement)


def test_host_cpu_and_memory_are_fitted_when_tracked() -> None:
    s = NodeState(node("n", [gpu(0)]), HostCapacity(cpu_milli=1000, memory_mib=1024))
    assert "insufficient cpu" in refused(place(s, {rn.GPU: "10", "cpu": "2"})).reason
    assert "insufficient memory" in refused(place(s, {rn.GPU: "10", "memory": "2Gi"})).reason
    alloc = commit(s, place(s, {rn.GPU: "10", "cpu": "600m"}))
    assert alloc.cpu_milli == 600 and s.cpu_free == 400


@pytest.mark.parametrize("policy", [BINPACK, SPREAD])
def test_node_scores_are_in_unit_range(policy: Policy) -> None:
    s = NodeState(load_topology("h100-sxm-8x", "n"))
    for limits in ({rn.GPU: "10"}, {rn.GPU: "800"}, {rn.GPU_MEMORY: "79"}):
        result = placed(place(s, limits, policy=policy))
        assert 0.0 <= result.score <= 1.0


def test_a_copy_starts_equal_and_then_changes_on_its_own() -> None:
    """What gang trials rely on: placing on a copy leaves the node as it was."""
    s = NodeState(load_topology("h100-sxm-8x", "n"), HostCapacity(64_000, 512_000))
    first = commit(s, place(s, {rn.GPU: "50", rn.RDMA: "25", "cpu": "4", "memory": "8Gi"}))
    c = s.copy()
    facts = ("free_core", "free_mem", "nic_free", "vf_free", "cpu_free", "mem_free")
    assert all(getattr(c, f) == getattr(s, f) for f in facts)
    assert (c.inventory, c.host, c.name, c.tiers) == (s.inventory, s.host, s.name, s.tiers)
    assert c.version > s.version  # scores cached for the node are not the copy's
    before = {f: getattr(s, f) for f in facts}
    commit(c, place(c, {rn.GPU: "200", rn.RDMA: "100", "cpu": "8", "memory": "16Gi"}))
    assert {f: getattr(s, f) for f in facts} == before
    assert c.free_core != s.free_core and c.cpu_free != s.cpu_free
    c.release(first)
    s.release(first)
    assert s.free_core == (100,) * 8 and sum(c.free_core) == 600
