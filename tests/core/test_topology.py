from dataclasses import replace

from tessera.model import Gpu
from tessera.topology import Scope, Tier, TierMatrix, gpu_pair_tier, pci_tier
from tessera_edge.topology_file import load_topology

from .builders import gpu, nic


def test_pair_tiers_from_tightest_to_loosest() -> None:
    a = gpu(0, pcie_switch="sw0", numa_node=0, pcie_root="r0", nvlinks=((1, 2),))
    b = gpu(1, pcie_switch="sw1", numa_node=0, pcie_root="r0")
    c = gpu(2, pcie_switch="sw0", numa_node=0, pcie_root="r0")
    d = gpu(3, pcie_switch="sw9", numa_node=0, pcie_root="r1")
    e = gpu(4, pcie_switch="sw8", numa_node=1, pcie_root="r2")
    f = gpu(5, numa_node=-1, pcie_root="r3")
    assert gpu_pair_tier(a, b) is Tier.NVLINK  # one-sided link info is enough
    assert gpu_pair_tier(a, c) is Tier.PCIE_SWITCH
    assert gpu_pair_tier(b, d) is Tier.NUMA
    assert gpu_pair_tier(b, c) is Tier.PCIE_ROOT
    assert gpu_pair_tier(d, e) is Tier.NODE
    assert gpu_pair_tier(f, replace(f, uuid="x", pcie_root="r4")) is Tier.NODE


def test_nic_tiers() -> None:
    g = gpu(0, pcie_switch="sw0", pcie_root="r0", numa_node=1)
    assert pci_tier(nic(0, pcie_switch="sw0", pcie_root="r0"), g) is Tier.PCIE_SWITCH
    assert pci_tier(nic(0, pcie_switch="sw1", pcie_root="r0"), g) is Tier.PCIE_ROOT
    assert pci_tier(nic(0, pcie_switch="", pcie_root="r5", numa_node=1), g) is Tier.NUMA
    assert pci_tier(nic(0, pcie_root="r5", numa_node=0), g) is Tier.NODE


def test_set_rank_prefers_one_switch_then_one_numa_node() -> None:
    inv = load_topology("a100-pcie-8x")
    m = TierMatrix(inv.gpus)
    same_switch = m.set_rank([0, 1])
    same_root = m.set_rank([0, 2])
    cross_numa = m.set_rank([0, 4])
    assert same_switch < same_root < cross_numa
    assert m.set_tier([0, 1, 2, 3]) is Tier.PCIE_ROOT


def test_nvswitch_sets_prefer_one_socket() -> None:
    inv = load_topology("h100-sxm-8x")
    m = TierMatrix(inv.gpus)
    assert m.set_rank([0, 1, 2, 3]) < m.set_rank([0, 1, 2, 4])
    assert m.set_tier([0, 5]) is Tier.NVLINK


def test_scope_parse() -> None:
    assert Scope.parse(" NVLink ") is Scope.NVLINK
    assert int(Scope.PCIE) == int(Tier.PCIE_SWITCH)


def _mesh(prefix: str, links: int, root_of: int = 2) -> list[Gpu]:
    """Four GPUs named by `prefix`, 0-1 and 2-3 NVLinked with `links` links."""
    uuid = [f"GPU-{prefix}-{i}" for i in range(4)]
    peer = {0: 1, 1: 0, 2: 3, 3: 2}
    return [
        gpu(
            i,
            uuid=uuid[i],
            numa_node=i // 2,
            pcie_root=f"r{i // root_of}",
            nvlinks=((peer[i], links),),
        )
        for i in range(4)
    ]


def test_nodes_of_one_topology_share_a_matrix_equal_to_their_own() -> None:
    a, b = _mesh("a", 4), _mesh("b", 4)  # other UUIDs, same topology
    shared = TierMatrix.of(a)
    assert TierMatrix.of(b) is shared
    fresh = TierMatrix(b)
    assert (shared.tier, shared.links, shared.numa, shared.root) == (
        fresh.tier,
        fresh.links,
        fresh.numa,
        fresh.root,
    )
    for other in (_mesh("c", 2), _mesh("d", 4, root_of=4)):
        matrix = TierMatrix.of(other)
        assert matrix is not shared
        assert (matrix.tier, matrix.links, matrix.root) == (
            TierMatrix(other).tier,
            TierMatrix(other).links,
            TierMatrix(other).root,
        )
