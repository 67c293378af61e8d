"""Shared strings for what the scheduler keeps of each node.

5,000 nodes repeat the same GPU model, PCIe roots and bus IDs, and every allocation record
of a GPU names its UUID again: interned, each such string is held once (interned strings
go when the last holder goes, so nodes that leave take theirs along).
"""

from __future__ import annotations

from dataclasses import replace
from sys import intern

from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation, RdmaGrant, VfGrant
from tessera.model import Gpu, NodeInventory, RdmaNic, RdmaVf


def _gpu(g: Gpu) -> Gpu:
    return replace(
        g,
        uuid=intern(g.uuid),
        model=intern(g.model),
        pci_bus_id=intern(g.pci_bus_id),
        pcie_root=intern(g.pcie_root),
        pcie_switch=intern(g.pcie_switch),
        nvlinks=tuple((intern(peer), links) for peer, links in g.nvlinks),
    )


def _vf(v: RdmaVf) -> RdmaVf:
    return replace(v, pci_bus_id=intern(v.pci_bus_id), ibdev=intern(v.ibdev))


def _nic(n: RdmaNic) -> RdmaNic:
    return replace(
        n,
        ibdev=intern(n.ibdev),
        pci_bus_id=intern(n.pci_bus_id),
        pcie_root=intern(n.pcie_root),
        pcie_switch=intern(n.pcie_switch),
        netdev=intern(n.netdev),
        port_states=tuple(intern(s) for s in n.port_states),
        vfs=tuple(_vf(v) for v in n.vfs),
    )


def interned(inventory: NodeInventory) -> NodeInventory:
    """`inventory` with its repeated strings interned (an equal value)."""
    return replace(
        inventory,
        node_name=intern(inventory.node_name),
        gpus=tuple(_gpu(g) for g in inventory.gpus),
        nics=tuple(_nic(n) for n in inventory.nics),
    )


def _grant(g: GpuGrant) -> GpuGrant:
    return replace(g, uuid=intern(g.uuid))


def _vf_grant(v: VfGrant) -> VfGrant:
    return replace(v, pci_bus_id=intern(v.pci_bus_id), ibdev=intern(v.ibdev))


def _rdma_grant(r: RdmaGrant) -> RdmaGrant:
    return replace(
        r,
        pci_bus_id=intern(r.pci_bus_id),
        ibdev=intern(r.ibdev),
        vfs=tuple(_vf_grant(v) for v in r.vfs),
    )


def _container(c: ContainerAllocation) -> ContainerAllocation:
    return replace(
        c,
        name=intern(c.name),
        gpus=tuple(_grant(g) for g in c.gpus),
        rdma=tuple(_rdma_grant(r) for r in c.rdma),
        reuses=intern(c.reuses),
    )


def interned_allocation(alloc: PodAllocation) -> PodAllocation:
    """`alloc` with the strings other pods repeat interned (an equal value): device IDs,
    container names, namespace, node, policy."""
    return replace(
        alloc,
        namespace=intern(alloc.namespace),
        node=intern(alloc.node),
        policy=intern(alloc.policy),
        containers=tuple(_container(c) for c in alloc.containers),
    )
