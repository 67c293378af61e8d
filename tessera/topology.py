"""How close devices sit to one another: interconnect tiers and GPU-set ranking.

Tiers, tightest first: NVLink, same PCIe switch, same PCIe root complex, same NUMA node,
anywhere on the node. The user-facing scopes of `tessera.dev/topology` map onto them.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from itertools import combinations

from tessera.model import Gpu, PciDevice


class Tier(IntEnum):
    """Interconnect tier between two devices; lower is tighter."""

    NVLINK = 0
    PCIE_SWITCH = 1
    PCIE_ROOT = 2
    NUMA = 3
    NODE = 4


class Scope(IntEnum):
    """A required scope from the `tessera.dev/topology` annotation (loosest allowed tier)."""

    NVLINK = Tier.NVLINK
    PCIE = Tier.PCIE_SWITCH
    NUMA = Tier.NUMA
    NODE = Tier.NODE

    @classmethod
    def parse(cls, text: str) -> Scope:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            names = ", ".join(s.name.lower() for s in cls)
            raise ValueError(f"unknown topology scope {text!r} (one of {names})") from None


def _pcie_tier(a_root: str, a_switch: str, b_root: str, b_switch: str) -> Tier | None:
    if a_switch and a_switch == b_switch:
        return Tier.PCIE_SWITCH
    if a_root and a_root == b_root:
        return Tier.PCIE_ROOT
    return None


def _numa_tier(a: int, b: int) -> Tier:
    return Tier.NUMA if a >= 0 and a == b else Tier.NODE


def pci_tier(a: PciDevice, b: PciDevice) -> Tier:
    """How close two devices sit on the PCI tree (a NIC and a GPU, or two GPUs)."""
    pcie = _pcie_tier(a.pcie_root, a.pcie_switch, b.pcie_root, b.pcie_switch)
    return pcie if pcie is not None else _numa_tier(a.numa_node, b.numa_node)


def gpu_pair_tier(a: Gpu, b: Gpu) -> Tier:
    if a.nvlink_count(b.index) > 0 or b.nvlink_count(a.index) > 0:
        return Tier.NVLINK
    return pci_tier(a, b)


_SHARED_LIMIT = 64
"""Distinct GPU topologies whose matrix is kept for sharing (a cluster has a handful)."""
_shared: dict[tuple[object, ...], TierMatrix] = {}


def _topology_key(gpus: Sequence[Gpu]) -> tuple[object, ...]:
    """Everything a TierMatrix reads of `gpus`, with NVLink peers as slots, not indexes."""
    slot = {g.index: i for i, g in enumerate(gpus)}
    return tuple(
        (
            g.numa_node,
            g.pcie_root,
            g.pcie_switch,
            tuple((slot.get(peer, -1), links) for peer, links in g.nvlinks),
        )
        for g in gpus
    )


class TierMatrix:
    """Pairwise tiers and NVLink counts of one node's GPUs, computed once per inventory.
    Read-only once built: nodes of the same topology share one (`of`)."""

    @classmethod
    def of(cls, gpus: Sequence[Gpu]) -> TierMatrix:
        """The matrix of `gpus`, shared with every node of the same topology: 5,000 nodes
        of one kind hold one matrix, not 5,000 (2 KiB each)."""
        key = _topology_key(gpus)
        matrix = _shared.get(key)
        if matrix is None:
            if len(_shared) >= _SHARED_LIMIT:
                _shared.clear()
            matrix = _shared[key] = cls(gpus)
        return matrix

    def __init__(self, gpus: Sequence[Gpu]) -> None:
        n = len(gpus)
        self.size = n
        self.numa = [g.numa_node for g in gpus]
        self.root = [g.pcie_root for g in gpus]
        self.tier = [[Tier.NVLINK] * n for _ in range(n)]
        self.links = [[0] * n for _ in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                t = gpu_pair_tier(gpus[i], gpus[j])
                a, b = gpus[i], gpus[j]
                links = max(a.nvlink_count(b.index), b.nvlink_count(a.index))
                self.tier[i][j] = self.tier[j][i] = t
                self.links[i][j] = self.links[j][i] = links

    def set_rank(self, slots: Sequence[int]) -> tuple[int, int, int, int]:
        """Rank of a GPU set; smaller is better.

        First the worst pairwise tier (the slowest link bounds an all-reduce), then the
        total NVLink count negated (a fuller mesh wins), then how many NUMA nodes and PCIe
        roots the set spans (host traffic stays local; on NVSwitch systems, where every
        set ties on NVLink, this keeps a 4-GPU job on one socket).
        """
        worst = Tier.NVLINK
        links = 0
        for a, b in combinations(slots, 2):
            t = self.tier[a][b]
            worst = max(worst, t)
            links += self.links[a][b]
        numa = len({self.numa[s] for s in slots})
        roots = len({self.root[s] for s in slots})
        return int(worst), -links, numa, roots

    def set_tier(self, slots: Sequence[int]) -> Tier:
        return Tier(self.set_rank(slots)[0])
