"""Pods whose allocation holds a device the node no longer offers: a GPU or RDMA NIC its
inventory now marks unhealthy, or no longer lists at all (after a reboot with a failed
device, a GPU that fell off the bus). Such a pod keeps running on what it was given; its
owner must be told, and the device's use stays accounted so that nothing is handed out
twice if the device comes back."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

from tessera.allocation import PodAllocation
from tessera.model import NodeInventory

UNHEALTHY: Final = "unhealthy"
MISSING: Final = "missing"
State = Literal["unhealthy", "missing"]


@dataclass(frozen=True, slots=True, order=True)
class StrandedGrant:
    """One container's grant on a device the node no longer offers."""

    namespace: str
    name: str
    container: str
    device: str
    """"GPU <uuid>" or "RDMA NIC <PCI bus ID>"."""
    state: State
    reason: str = ""
    """The inventory's health reason (unhealthy), or what is known (missing)."""
    pod_uid: str = ""

    @property
    def message(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        if self.state == MISSING:
            return (
                f"container {self.container!r} was given {self.device}, which the node's device "
                "inventory no longer lists (gone since it was placed: a failed device or a "
                "reboot without it); the container may have lost it"
            )
        return (
            f"container {self.container!r} was given {self.device}, which the node now "
            f"reports unhealthy{why}; the container may fail on it"
        )


def stranded(inventory: NodeInventory, allocs: Iterable[PodAllocation]) -> list[StrandedGrant]:
    """Every grant of `allocs` (pods on the inventory's node) on a GPU or NIC that the
    inventory marks unhealthy or does not list; sorted, each (container, device) once."""
    gpus = {g.uuid: g for g in inventory.gpus}
    nics = {n.pci_bus_id: n for n in inventory.nics}
    found: set[StrandedGrant] = set()
    for alloc in allocs:
        for c in alloc.containers:
            bad: list[tuple[str, State, str]] = []
            for g in c.gpus:
                gpu = gpus.get(g.uuid)
                if gpu is None or not gpu.healthy:
                    bad.append(
                        _verdict(f"GPU {g.uuid}", None if gpu is None else gpu.health_reason)
                    )
            for r in c.rdma:
                nic = nics.get(r.pci_bus_id)
                if nic is None or not nic.healthy:
                    where = f"RDMA NIC {r.pci_bus_id}"
                    bad.append(_verdict(where, None if nic is None else nic.health_reason))
            found.update(
                StrandedGrant(alloc.namespace, alloc.name, c.name, dev, st, why, alloc.pod_uid)
                for dev, st, why in bad
            )
    return sorted(found)


def _verdict(device: str, reason: str | None) -> tuple[str, State, str]:
    """`reason` None: the device is not listed; else its health reason (maybe empty)."""
    return (device, MISSING, "") if reason is None else (device, UNHEALTHY, reason)
