"""Per-node free capacity: what is left on every GPU, NIC and VF of one node.

A NodeState changes only through `apply` and `release` of whole pod allocations, both
checked before anything changes, so a failed call leaves the state as it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tessera.allocation import GpuGrant, PodAllocation, RdmaGrant
from tessera.errors import StateError
from tessera.model import NodeInventory
from tessera.resources import UNITS_PER_DEVICE
from tessera.topology import TierMatrix


@dataclass(frozen=True, slots=True)
class GpuCapacity:
    """Free GPU capacity of one node, one entry per GPU slot: compute in percent of a GPU
    and memory in MiB. Policies score a placement by the node's capacity before and after
    it; the two vectors travel as one value so that they cannot come apart."""

    core: tuple[int, ...]
    mem: tuple[int, ...]

    def with_slots(
        self, slots: Sequence[int], core: Sequence[int], mem: Sequence[int]
    ) -> GpuCapacity:
        """This capacity with `slots` set to new free amounts (what an option leaves)."""
        new_core, new_mem = list(self.core), list(self.mem)
        for s, c, m in zip(slots, core, mem, strict=True):
            new_core[s] = c
            new_mem[s] = m
        return GpuCapacity(tuple(new_core), tuple(new_mem))


@dataclass(frozen=True, slots=True)
class HostCapacity:
    """A node's allocatable host CPU and memory, as far as placement tracks them (None: not
    tracked, so never a reason to refuse)."""

    cpu_milli: int | None = None
    memory_mib: int | None = None


UNTRACKED_HOST = HostCapacity()


@dataclass
class _Usage:
    """Totals in use per device key, including devices the inventory no longer lists."""

    gpu_core: dict[str, int]
    gpu_mem: dict[str, int]
    nic_share: dict[str, int]
    vfs: dict[str, None]
    """VFs in use (dict keys: an empty dict is a third of an empty set)."""
    cpu_milli: int = 0
    memory_mib: int = 0


class NodeState:
    """Free capacity of one node. `version` grows on every change (cache key for scores)."""

    def __init__(self, inventory: NodeInventory, host: HostCapacity = UNTRACKED_HOST) -> None:
        self._usage = _Usage({}, {}, {}, {})
        self.version = 0
        self.host = host
        self._set_inventory(inventory)

    # --- inventory ------------------------------------------------------------------------

    def _set_inventory(self, inventory: NodeInventory) -> None:
        self.inventory = inventory
        self.name = inventory.node_name
        gpus = inventory.gpus
        self.total_mem = [g.memory_mib for g in gpus]
        self.tiers = TierMatrix.of(gpus)
        # tuples: read-only, and a NIC without VFs shares the one empty tuple
        self.nic_vf_bus = tuple(tuple(vf.pci_bus_id for vf in n.vfs) for n in inventory.nics)
        self._recompute_free()

    def update_inventory(
        self, inventory: NodeInventory, host: HostCapacity = UNTRACKED_HOST
    ) -> None:
        """Take a new inventory (health change, rediscovery); usage carries over by device."""
        self.host = host
        self._set_inventory(inventory)

    def _recompute_free(self) -> None:
        u = self._usage
        gpus = self.inventory.gpus
        # tuples, shared with `gpu_free` (5,000 nodes need not hold each vector twice)
        self.free_core = tuple(UNITS_PER_DEVICE - u.gpu_core.get(g.uuid, 0) for g in gpus)
        self.free_mem = tuple(g.memory_mib - u.gpu_mem.get(g.uuid, 0) for g in gpus)
        self.gpu_free = GpuCapacity(self.free_core, self.free_mem)
        """`free_core` and `free_mem` as one value, for the policies."""
        nics = self.inventory.nics
        self.nic_free = tuple(UNITS_PER_DEVICE - u.nic_share.get(n.pci_bus_id, 0) for n in nics)
        self.vf_free = tuple(tuple(bus not in u.vfs for bus in buses) for buses in self.nic_vf_bus)
        cpu, mem = self.host.cpu_milli, self.host.memory_mib
        self.cpu_free = None if cpu is None else cpu - u.cpu_milli
        self.mem_free = None if mem is None else mem - u.memory_mib
        self.version += 1

    def copy(self) -> NodeState:
        """An independent copy (same inventory, usage copied): trial placements, such as a
        gang's, change the copy and leave this node as it is."""
        clone = NodeState.__new__(NodeState)
        u = self._usage
        clone._usage = _Usage(
            dict(u.gpu_core),
            dict(u.gpu_mem),
            dict(u.nic_share),
            dict(u.vfs),
            u.cpu_milli,
            u.memory_mib,
        )
        clone.version = self.version
        clone.host = self.host
        clone.inventory = self.inventory
        clone.name = self.name
        clone.total_mem = self.total_mem
        clone.tiers = self.tiers
        clone.nic_vf_bus = self.nic_vf_bus
        clone._recompute_free()
        return clone

    # --- accounting -------------------------------------------------------------------------

    def apply(self, alloc: PodAllocation) -> None:
        """Account a pod's allocation. Raises StateError, changing nothing, if it overcommits
        a device or names one this node does not have."""
        gpus, nics = alloc.counted_gpu_grants(), alloc.counted_rdma_grants()
        self._check_fits(alloc, gpus, nics)
        self._add(gpus, nics, 1)
        self._usage.cpu_milli += alloc.cpu_milli
        self._usage.memory_mib += alloc.memory_mib
        self._recompute_free()

    def release(self, alloc: PodAllocation) -> None:
        """Give back what `apply` took. Works even if the devices left the inventory since."""
        self._add(alloc.counted_gpu_grants(), alloc.counted_rdma_grants(), -1)
        self._usage.cpu_milli -= alloc.cpu_milli
        self._usage.memory_mib -= alloc.memory_mib
        self._recompute_free()

    def _add(self, gpus: Iterable[GpuGrant], nics: Iterable[RdmaGrant], sign: int) -> None:
        u = self._usage
        for g in gpus:
            _bump(u.gpu_core, g.uuid, sign * g.core)
            _bump(u.gpu_mem, g.uuid, sign * g.memory_mib)
        for n in nics:
            _bump(u.nic_share, n.pci_bus_id, sign * n.share)
            for vf in n.vfs:
                if sign > 0:
                    u.vfs[vf.pci_bus_id] = None
                else:
                    u.vfs.pop(vf.pci_bus_id, None)

    def _check_fits(
        self, alloc: PodAllocation, gpus: list[GpuGrant], nics: list[RdmaGrant]
    ) -> None:
        inv = self.inventory
        need_core: dict[str, int] = {}
        need_mem: dict[str, int] = {}
        for g in gpus:
            slot = inv.gpu_slot(g.uuid)
            if slot is None:
                raise StateError(f"{alloc.key}: GPU {g.uuid} is not a GPU of node {self.name}")
            if g.core < 0 or g.memory_mib < 0:
                raise StateError(f"{alloc.key}: negative grant on GPU {g.uuid}")
            need_core[g.uuid] = need_core.get(g.uuid, 0) + g.core
            need_mem[g.uuid] = need_mem.get(g.uuid, 0) + g.memory_mib
        for uuid, core in need_core.items():
            slot = inv.gpu_slot(uuid)
            assert slot is not None
            if core > self.free_core[slot] or need_mem[uuid] > self.free_mem[slot]:
                raise StateError(
                    f"{alloc.key}: GPU {uuid} on {self.name} has {self.free_core[slot]}% compute "
                    f"and {self.free_mem[slot]} MiB free; the allocation takes {core}% and "
                    f"{need_mem[uuid]} MiB"
                )
        need_share: dict[str, int] = {}
        taken_vfs: set[str] = set()
        for n in nics:
            slot = inv.nic_slot(n.pci_bus_id)
            if slot is None:
                raise StateError(
                    f"{alloc.key}: NIC {n.pci_bus_id} is not a NIC of node {self.name}"
                )
            need_share[n.pci_bus_id] = need_share.get(n.pci_bus_id, 0) + n.share
            if need_share[n.pci_bus_id] > self.nic_free[slot] or n.share < 0:
                raise StateError(
                    f"{alloc.key}: NIC {n.ibdev} on {self.name} has {self.nic_free[slot]}% free"
                )
            for vf in n.vfs:
                buses = self.nic_vf_bus[slot]
                if vf.pci_bus_id not in buses:
                    raise StateError(f"{alloc.key}: {vf.pci_bus_id} is not a VF of {n.ibdev}")
                if not self.vf_free[slot][buses.index(vf.pci_bus_id)] or vf.pci_bus_id in taken_vfs:
                    raise StateError(f"{alloc.key}: VF {vf.pci_bus_id} is already in use")
                taken_vfs.add(vf.pci_bus_id)

    # --- views --------------------------------------------------------------------------------

    def used_fraction(self) -> float:
        """Share of this node's GPU capacity in use (compute and memory averaged)."""
        if not self.total_mem:
            return 0.0
        n = len(self.total_mem)
        core_used = sum(UNITS_PER_DEVICE - c for c in self.free_core) / (UNITS_PER_DEVICE * n)
        mem_used = sum(t - f for t, f in zip(self.total_mem, self.free_mem, strict=True)) / sum(
            self.total_mem
        )
        return (core_used + mem_used) / 2

    def snapshot(self) -> tuple[object, ...]:
        """Everything that defines this node's free capacity, for equality checks."""
        return (
            self.name,
            tuple(self.free_core),
            tuple(self.free_mem),
            tuple(self.nic_free),
            tuple(tuple(v) for v in self.vf_free),
            self.cpu_free,
            self.mem_free,
            tuple(sorted((k, v) for k, v in self._usage.gpu_core.items() if v)),
            tuple(sorted((k, v) for k, v in self._usage.gpu_mem.items() if v)),
            tuple(sorted((k, v) for k, v in self._usage.nic_share.items() if v)),
            tuple(sorted(self._usage.vfs)),
        )


def _bump(table: dict[str, int], key: str, delta: int) -> None:
    value = table.get(key, 0) + delta
    if value:
        table[key] = value
    else:
        table.pop(key, None)
