"""A node that comes back different: a GPU unhealthy, another gone. The pods on them are
named (tessera.stranded); new pods avoid them; nothing is handed out twice when they
return."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera import resources as rn
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation, RdmaGrant
from tessera.cluster_state import ClusterState
from tessera.errors import StateError
from tessera.node_placement import Placement, place_pod
from tessera.request import parse_pod
from tessera.scoring_policy import BinpackPolicy
from tessera.stranded import MISSING, UNHEALTHY, StrandedGrant, stranded

from .builders import gpu, nic, node, pod

GPUS = [gpu(i) for i in range(4)]
NICS = [nic(0)]


def _alloc(uid: str, *grants: tuple[int, int], rdma: bool = False) -> PodAllocation:
    gpus = tuple(GpuGrant(f"GPU-{i:08d}", i, i, core, 1024) for i, core in grants)
    nics = (RdmaGrant(NICS[0].pci_bus_id, NICS[0].ibdev, 0, 50, ()),) if rdma else ()
    return PodAllocation(uid, "ml", uid, "n", (ContainerAllocation("main", gpus, nics),))


def test_pods_on_an_unhealthy_or_missing_device_are_named_with_why() -> None:
    after = node(
        "n",
        [replace(GPUS[0], healthy=False, health_reason="XID 79"), GPUS[2], GPUS[3]],
        [replace(NICS[0], healthy=False, health_reason="port 1 DOWN")],
    )
    allocs = [_alloc("a", (0, 50)), _alloc("b", (1, 100), rdma=True), _alloc("c", (2, 30))]
    found = stranded(after, allocs)
    assert found == [
        StrandedGrant("ml", "a", "main", "GPU GPU-00000000", UNHEALTHY, "XID 79", "a"),
        StrandedGrant("ml", "b", "main", "GPU GPU-00000001", MISSING, "", "b"),
        StrandedGrant(
            "ml", "b", "main", f"RDMA NIC {NICS[0].pci_bus_id}", UNHEALTHY, "port 1 DOWN", "b"
        ),
    ]
    assert "unhealthy (XID 79)" in found[0].message and "'main'" in found[0].message
    assert "no longer lists" in found[1].message
    assert stranded(node("n", GPUS, NICS), allocs) == []


def test_a_node_back_with_a_gpu_unhealthy_and_one_gone_gets_new_pods_elsewhere_only() -> None:
    state = ClusterState()
    state.set_node(node("n", GPUS))
    state.add(_alloc("a", (0, 50)))
    state.add(_alloc("b", (1, 60)))
    state.set_node(node("n", [replace(GPUS[0], healthy=False), *GPUS[2:]]))
    request = parse_pod(pod("new", {"main": {rn.GPU: "50"}}))
    used: set[str] = set()
    for i in range(4):  # the two good GPUs take two pods each, then nothing fits
        result = place_pod(state.nodes["n"], request, BinpackPolicy())
        if isinstance(result, Placement):
            used |= {g.uuid for c in result.allocation.containers for g in c.gpus}
            state.add(replace(result.allocation, pod_uid=f"new-{i}", name=f"new-{i}"))
    assert used == {"GPU-00000002", "GPU-00000003"}
    # GPU 1 comes back: b's 60 % still counts, so a 50 % pod fits there only once freed
    state.set_node(node("n", GPUS))
    assert state.nodes["n"].free_core == (50, 40, 0, 0)
    with pytest.raises(StateError):
        state.add(_alloc("x", (1, 50)))


@settings(max_examples=150, deadline=None)
@given(
    shares=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 50)), min_size=1, max_size=8),
    bad=st.lists(st.sampled_from(["ok", "unhealthy", "missing"]), min_size=4, max_size=4),
)
def test_stranded_pods_new_pods_and_returning_devices(
    shares: list[tuple[int, int]], bad: list[str]
) -> None:
    state = ClusterState()
    state.set_node(node("n", GPUS))
    allocs = []
    for n, (i, core) in enumerate(shares):
        alloc = _alloc(f"p{n}", (i, core))
        try:
            state.add(alloc)
        except StateError:
            continue
        allocs.append(alloc)
    changed = [
        replace(g, healthy=False) if bad[g.index] == "unhealthy" else g
        for g in GPUS
        if bad[g.index] != "missing"
    ]
    state.set_node(node("n", changed))
    found = stranded(state.nodes["n"].inventory, state.pods_on("n"))
    want = {
        (a.name, f"GPU {g.uuid}", bad[g.index])
        for a in allocs
        for c in a.containers
        for g in c.gpus
        if bad[g.index] != "ok"
    }
    assert {(s.name, s.device, s.state) for s in found} == want
    request = parse_pod(pod("new", {"main": {rn.GPU: "10"}}))
    result = place_pod(state.nodes["n"], request, BinpackPolicy())
    if isinstance(result, Placement):
        (given,) = result.allocation.containers[0].gpus
        assert bad[given.index] == "ok"
    else:  # refused: no good GPU has 10 % left
        left = state.nodes["n"].free_core
        assert all(f < 10 for d, f in zip(changed, left, strict=True) if d.healthy)
    state.set_node(node("n", GPUS))  # everything comes back, its use still counted
    for d, free in zip(GPUS, state.nodes["n"].free_core, strict=True):
        held = sum(x.core for a in allocs for c in a.containers for x in c.gpus if x.uuid == d.uuid)
        assert free == 100 - held
