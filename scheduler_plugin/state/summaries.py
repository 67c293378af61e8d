"""What the state hands out about its nodes, built from the cluster state (pure; the Cache
calls these under its lock and hands out the fresh values they make)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from scheduler_plugin.state.values import GpuUsage, NicUsage
from tessera.cluster_state import ClusterState
from tessera.node_state import NodeState
from tessera.resources import UNITS_PER_DEVICE
from tessera.stranded import stranded


def gpu_usage(name: str, node: NodeState) -> Iterator[GpuUsage]:
    """Each GPU of node `name` with its free compute and memory, in inventory order."""
    for slot, g in enumerate(node.inventory.gpus):
        yield GpuUsage(
            name, g.index, g.uuid, g.model, g.memory_mib, node.free_core[slot], node.free_mem[slot]
        )


def usage(cluster: ClusterState) -> tuple[tuple[GpuUsage, ...], tuple[NicUsage, ...]]:
    """Every GPU and NIC of every node, by node name."""
    gpus: list[GpuUsage] = []
    nics = []
    for name, node in sorted(cluster.nodes.items()):
        gpus.extend(gpu_usage(name, node))
        for slot, n in enumerate(node.inventory.nics):
            nics.append(
                NicUsage(
                    name,
                    n.ibdev,
                    n.pci_bus_id,
                    node.nic_free[slot],
                    len(n.vfs),
                    sum(node.vf_free[slot]),
                )
            )
    return tuple(gpus), tuple(nics)


def node_summary(
    cluster: ClusterState,
    name: str,
    *,
    problem: str | None,
    fenced: list[dict[str, Any]],
    invalid: bool,
) -> dict[str, Any] | None:
    """Each device's total/free/used and who holds what (debug API and CR status); None
    when the state knows nothing of the node. `problem`: why it takes no new pods;
    `fenced`: the pods fencing it; `invalid`: its NodeDevices does not parse or index."""
    node = cluster.nodes.get(name)
    if node is None:
        if not invalid:
            return None
        return {
            "node": name,
            "usable": False,
            "problem": problem,
            "fenced": fenced,
            "gpus": [],
            "rdma": [],
        }
    holders_gpu: dict[str, list[dict[str, Any]]] = {}
    holders_nic: dict[str, list[dict[str, Any]]] = {}
    for alloc in cluster.pods_on(name):
        for c in alloc.containers:
            if not c.counted:
                continue
            who: dict[str, Any] = {
                "namespace": alloc.namespace,
                "name": alloc.name,
                "uid": alloc.pod_uid,
                "container": c.name,
            }
            if alloc.pod_uid in cluster.assumed:
                who["assumed"] = True
            for g in c.gpus:
                holders_gpu.setdefault(g.uuid, []).append(
                    who | {"core": g.core, "memoryMiB": g.memory_mib}
                )
            for r in c.rdma:
                holders_nic.setdefault(r.pci_bus_id, []).append(
                    who | {"share": r.share, "vfs": [v.pci_bus_id for v in r.vfs]}
                )
    gpus = []
    for slot, gpu in enumerate(node.inventory.gpus):
        free_core, free_mem = node.free_core[slot], node.free_mem[slot]
        gpus.append(
            {
                "uuid": gpu.uuid,
                "index": gpu.index,
                "model": gpu.model,
                "healthy": gpu.healthy,
                "core": {
                    "total": UNITS_PER_DEVICE,
                    "used": UNITS_PER_DEVICE - free_core,
                    "free": free_core,
                },
                "memoryMiB": {
                    "total": gpu.memory_mib,
                    "used": gpu.memory_mib - free_mem,
                    "free": free_mem,
                },
                "pods": holders_gpu.get(gpu.uuid, []),
            }
        )
    nics = []
    for slot, n in enumerate(node.inventory.nics):
        free = node.nic_free[slot]
        nics.append(
            {
                "ibdev": n.ibdev,
                "pciBusId": n.pci_bus_id,
                "healthy": n.healthy,
                "share": {
                    "total": UNITS_PER_DEVICE,
                    "used": UNITS_PER_DEVICE - free,
                    "free": free,
                },
                "vfs": {"total": len(n.vfs), "free": sum(node.vf_free[slot])},
                "pods": holders_nic.get(n.pci_bus_id, []),
            }
        )
    return {
        "node": name,
        "usable": problem is None,
        "problem": problem,
        "fenced": fenced,
        "gpus": gpus,
        "rdma": nics,
        "stranded": [
            {
                "namespace": s.namespace,
                "name": s.name,
                "uid": s.pod_uid,
                "container": s.container,
                "device": s.device,
                "state": s.state,
                "reason": s.reason,
            }
            for s in stranded(node.inventory, cluster.pods_on(name))
        ],
    }
