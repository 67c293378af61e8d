"""Small builders for pods and nodes used across the core tests."""

from __future__ import annotations

from typing import Any

from tessera import resources as rn
from tessera.cluster_state import ClusterState
from tessera.model import Gpu, NodeInventory, RdmaNic, RdmaVf
from tessera.node_placement import NoFit, Placement
from tessera_edge.topology_file import load_topology

MIXED_TOPOLOGIES = ("h100-sxm-8x", "a100-pcie-8x", "t4-4x")
"""Three built-in nodes unlike in GPU model, count, memory and NICs."""

SAMPLE_LIMITS: tuple[dict[str, str], ...] = (
    {rn.GPU: "5"},
    {rn.GPU: "10"},
    {rn.GPU: "30"},
    {rn.GPU: "35"},
    {rn.GPU: "50"},
    {rn.GPU: "75"},
    {rn.GPU: "100"},
    {rn.GPU: "200"},
    {rn.GPU: "400"},
    {rn.GPU: "800"},
    {rn.GPU_CORE: "10", rn.GPU_MEMORY: "12"},
    {rn.GPU_CORE: "20", rn.GPU_MEMORY: "6"},
    {rn.GPU_MEMORY: "16"},
    {rn.GPU_MEMORY_RATIO: "40", rn.GPU_CORE: "5"},
    {rn.GPU_MEMORY_RATIO: "70"},
    {rn.GPU: "50", rn.RDMA: "25"},
    {rn.RDMA: "100"},
    {rn.GPU: "100", rn.RDMA: "10"},
)
"""One container's limits of every kind a pod asks for: shares, whole GPUs, memory by size
and by ratio, RDMA alone and beside GPUs (the first is a small share)."""


def pod(
    name: str = "p",
    containers: dict[str, dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    init: dict[str, dict[str, Any]] | None = None,
    namespace: str = "default",
    uid: str | None = None,
) -> dict[str, Any]:
    """A pod dict; `containers` maps container name -> limits."""

    def spec_of(items: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"name": n, "resources": {"limits": lim}} for n, lim in items.items()]

    spec: dict[str, Any] = {"containers": spec_of(containers or {"main": {}})}
    if init:
        spec["initContainers"] = spec_of(init)
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "annotations": annotations or {},
        },
        "spec": spec,
    }


def gpu(i: int, model: str = "NVIDIA A100-SXM4-80GB", memory: int = 81920, **kw: Any) -> Gpu:
    fields: dict[str, Any] = {
        "uuid": f"GPU-{i:08d}",
        "index": i,
        "minor": i,
        "model": model,
        "memory_mib": memory,
        "pci_bus_id": f"0000:{0x10 + i:02x}:00.0",
        "numa_node": 0,
        "pcie_root": "pci0000:00",
    }
    fields.update(kw)
    return Gpu(**fields)


def node(name: str, gpus: list[Gpu], nics: list[RdmaNic] | None = None) -> NodeInventory:
    return NodeInventory(name, tuple(gpus), tuple(nics or ()))


def nic(i: int, vfs: int = 0, **kw: Any) -> RdmaNic:
    fields: dict[str, Any] = {
        "ibdev": f"mlx5_{i}",
        "pci_bus_id": f"0000:{0x80 + i:02x}:00.0",
        "uverbs_minor": i,
        "numa_node": 0,
        "pcie_root": "pci0000:00",
        "vfs": tuple(
            RdmaVf(f"0000:{0x80 + i:02x}:00.{v + 1}", f"mlx5_{10 + i * 8 + v}", 10 + i * 8 + v)
            for v in range(vfs)
        ),
    }
    fields.update(kw)
    return RdmaNic(**fields)


def gpu_entry(**fields: object) -> dict[str, object]:
    """A GPU of an inventory document (a NodeDevices spec) with only the required fields,
    then `fields`."""
    return {
        "uuid": "GPU-a",
        "model": "T4",
        "memoryMiB": 15360,
        "pciBusId": "0000:3b:00.0",
        **fields,
    }


def mixed_cluster(nodes: int, prefix: str = "n") -> ClusterState:
    """`nodes` nodes named `prefix`0, `prefix`1, ..., of the `MIXED_TOPOLOGIES` in turn."""
    state = ClusterState()
    for i in range(nodes):
        state.set_node(load_topology(MIXED_TOPOLOGIES[i % len(MIXED_TOPOLOGIES)], f"{prefix}{i}"))
    return state


def placed(result: Placement | NoFit) -> Placement:
    """`result`, which must be a placement (the test fails showing the refusal otherwise)."""
    assert isinstance(result, Placement), result
    return result


def refused(result: Placement | NoFit) -> NoFit:
    """`result`, which must be a refusal (the test fails showing the placement otherwise)."""
    assert isinstance(result, NoFit), result
    return result
