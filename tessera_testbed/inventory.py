"""What a node agent publishes, synthetic, for tests, benchmarks and attack runs: NodeDevices
objects (8x H100 nodes by default) and heartbeat Leases; one definition, so they all
describe the same kind of node."""

from __future__ import annotations

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
