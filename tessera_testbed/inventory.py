"""What a node agent publishes, synthetic, for tests, benchmarks and attack runs: NodeDevices
objects (8x H100 nodes by default) and heartbeat Leases; one definition, so they all
describe the same kind of node."""

from __future__ import annotations

import functools
import json
import time
from datetime import UTC, datetime
from typing import Any

from tessera import resources as rn

H100 = "NVIDIA H100 80GB HBM3"


def gpu_spec(node: str, index: int, model: str = H100, mem: int = 81920) -> dict[str, Any]:
    """GPU `index` of `node`: four GPUs per NUMA node, two per PCIe root."""
    return {
        "uuid": f"GPU-{node}-{index}",
        "index": index,
        "minor": index,
        "model": model,
        "memoryMiB": mem,
        "pciBusId": f"0000:{0x10 + index:02x}:00.0",
        "numaNode": index // 4,
        "pcieRoot": f"pci0000:{index // 2:02x}",
    }


def inventory_spec(
    node: str, gpus: int = 8, model: str = H100, mem: int = 81920, nics: int = 0
) -> dict[str, Any]:
    """A NodeDevices spec with `gpus` GPUs and `nics` RDMA NICs."""
    return {
        "nodeName": node,
        "memoryUnitMiB": 1024,
        "gpus": [gpu_spec(node, i, model, mem) for i in range(gpus)],
        "rdma": [
            {
                "ibdev": f"mlx5_{i}",
                "pciBusId": f"0000:{0x80 + i:02x}:00.0",
                "uverbsMinor": i,
                "numaNode": i,
            }
            for i in range(nics)
        ],
        "summary": {"gpus": gpus, "model": model},
    }


@functools.cache
def _make_text(topology: str) -> str:
    from tessera_edge.topology_file import load_topology

    return json.dumps(load_topology(topology).to_dict())


def make_spec(node: str, topology: str = "h100-sxm-8x") -> dict[str, Any]:
    """A NodeDevices spec of a built-in make as its node agent publishes it (for the
    default, 8 GPUs all NVLinked and 4 RDMA NICs of 8 virtual functions each), with GPU
    UUIDs of this node ("GPU-<node>-<index>"): nodes of one make differ in their UUIDs
    alone."""
    spec: dict[str, Any] = json.loads(_make_text(topology))
    spec["nodeName"] = node
    uuids = {g["uuid"]: f"GPU-{node}-{g['index']}" for g in spec["gpus"]}
    for g in spec["gpus"]:
        g["uuid"] = uuids[g["uuid"]]
        for link in g["nvlinks"]:
            link["peer"] = uuids[link["peer"]]
    return spec


def nodedevices(node: str, **spec: Any) -> dict[str, Any]:
    """The whole NodeDevices object; `spec` as for `inventory_spec`."""
    return {
        "apiVersion": rn.INVENTORY_API_VERSION,
        "kind": rn.INVENTORY_KIND,
        "metadata": {"name": node},
        "spec": inventory_spec(node, **spec),
    }


def heartbeat_lease(
    node: str, renewed: float | None = None, duration_s: int = 3600
) -> dict[str, Any]:
    """`node`'s heartbeat Lease, last renewed at `renewed` (epoch seconds; default now): by
    default it stays fresh for an hour."""
    renew_time = datetime.fromtimestamp(time.time() if renewed is None else renewed, UTC)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": rn.HEARTBEAT_LEASE_PREFIX + node,
            "namespace": rn.DEFAULT_HEARTBEAT_NAMESPACE,
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": duration_s,
            "renewTime": renew_time.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }
