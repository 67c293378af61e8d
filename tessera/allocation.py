"""What a pod was given: the decision that the record carries and the state accounts."""

from __future__ import annotations

from dataclasses import dataclass

from tessera.model import RdmaVf
from tessera.resources import UNITS_PER_DEVICE


@dataclass(frozen=True, slots=True)
class GpuGrant:
    """Part or all of one GPU."""

    uuid: str
    index: int
    minor: int
    core: int
    """Compute share in percent (100 for a whole GPU; 0 for a memory-only share)."""
    memory_mib: int

    @property
    def is_share(self) -> bool:
        """Part of a GPU (compute below 100, memory-only shares included): what only an
        isolation layer limits. The one definition of a share that the NRI hook (which
        refuses a share at creation where the layer is missing) and placement (which puts no
        new share on a node whose layer is down) both use; whole GPUs need no layer."""
        return self.core < UNITS_PER_DEVICE


VfGrant = RdmaVf
"""A VF is granted whole: its grant is the VF as the node's inventory describes it."""


@dataclass(frozen=True, slots=True)
class RdmaGrant:
    """Part or all of one RDMA NIC; with SR-IOV, a share comes with one dedicated VF."""

    pci_bus_id: str
    ibdev: str
    uverbs_minor: int
    share: int
    """Percent of the NIC (100 for a whole NIC)."""
    vfs: tuple[VfGrant, ...] = ()
    netdev: str = ""


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    name: str
    gpus: tuple[GpuGrant, ...] = ()
    rdma: tuple[RdmaGrant, ...] = ()
    init: bool = False
    reuses: str = ""
    """For an init container that runs on devices of an app container: that container's
    name. Its grants repeat the app container's and are not counted a second time."""

    @property
    def counted(self) -> bool:
        return not self.reuses

    @property
    def shares(self) -> int:
        """The GPUs given only in part (`GpuGrant.is_share`)."""
        return sum(1 for g in self.gpus if g.is_share)


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """The devices given to every device-using container of one pod on one node."""

    pod_uid: str
    namespace: str
    name: str
    node: str
    containers: tuple[ContainerAllocation, ...]
    policy: str = ""
    """The policy that chose the placement (informational)."""
    cpu_milli: int = 0
    """The pod's host CPU request, accounted where the node's CPU is tracked (simulator)."""
    memory_mib: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def container(self, name: str) -> ContainerAllocation | None:
        for c in self.containers:
            if c.name == name:
                return c
        return None

    def counted_gpu_grants(self) -> list[GpuGrant]:
        return [g for c in self.containers if c.counted for g in c.gpus]

    def counted_rdma_grants(self) -> list[RdmaGrant]:
        return [r for c in self.containers if c.counted for r in c.rdma]
