"""--gfd-labels: NVIDIA GPU Feature Discovery's node labels, beside tessera's own."""

from __future__ import annotations

import pytest

from deviceplugin.cli import _driver_versions, build_parser
from deviceplugin.inventory import (
    GFD_LABELS,
    DriverVersions,
    InventoryConfig,
    InventoryPublisher,
    gfd_labels,
    node_labels,
)
from deviceplugin.nvml_backend import NvmlBackend
from kube_edge.client import KubeClient
from tessera.model import NodeInventory
from tessera_edge.topology_file import load_topology
from tessera_testbed.apiserver import FakeApiServer
from tests.deviceplugin.fake_pynvml import NVML_ERROR_NOT_SUPPORTED, FakeGpu, FakeNvml, NVMLError

NODE = "gpu-1"
VERSIONS = DriverVersions("550.54.15", "12.4")


def test_labels_in_gfds_formats() -> None:
    t4 = load_topology("t4-4x", NODE)
    assert gfd_labels(t4, VERSIONS) == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "Tesla-T4",
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.memory": str(t4.gpus[0].memory_mib),
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "54",
        "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "4",
    }
    h100 = gfd_labels(load_topology("h100-sxm-8x", NODE), DriverVersions("535.104", ""))
    assert h100["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    # a two-part driver version has an empty rev, as GFD writes it; unknown CUDA: removed
    assert h100["nvidia.com/cuda.driver.rev"] == ""
    assert h100["nvidia.com/cuda.runtime.major"] is None


@pytest.mark.parametrize("driver", ["", "550", "550.54.15.1", "550.x.1", "5500000000000.1"])
def test_unusable_versions_remove_the_version_labels(driver: str) -> None:
    labels = gfd_labels(load_topology("t4-4x", NODE), DriverVersions(driver, "12.x"))
    assert all(labels[k] is None for k in GFD_LABELS if "cuda" in k)
    assert labels["nvidia.com/gpu.count"] == "4"


def test_no_gpus_removes_every_gfd_label_and_off_writes_none() -> None:
    assert gfd_labels(NodeInventory(NODE), VERSIONS) == dict.fromkeys(GFD_LABELS)
    t4 = load_topology("t4-4x", NODE)
    assert not any(k.startswith("nvidia.com/") for k in node_labels(t4))
    both = node_labels(t4, VERSIONS)
    assert set(both) == set(node_labels(t4)) | set(GFD_LABELS)


def test_the_publisher_writes_them_only_when_asked() -> None:
    t4 = load_topology("t4-4x", NODE)
    with FakeApiServer() as server:
        server.create("nodes", {"metadata": {"name": NODE, "labels": {"zone": "a"}}})
        api = KubeClient.for_host(server.url, timeout=5)
        InventoryPublisher(api, InventoryConfig(NODE)).update_labels(t4)
        labels = server.get("nodes", NODE)["metadata"]["labels"]
        assert not any(k.startswith("nvidia.com/") for k in labels)
        gfd = InventoryPublisher(api, InventoryConfig(NODE, gfd_labels=VERSIONS))
        assert gfd.update_labels(t4)
        labels = server.get("nodes", NODE)["metadata"]["labels"]
        assert labels["nvidia.com/gpu.product"] == "Tesla-T4" and labels["zone"] == "a"
        assert not gfd.update_labels(t4)  # unchanged: no second patch
        assert gfd.update_labels(NodeInventory(NODE))
        labels = server.get("nodes", NODE)["metadata"]["labels"]
        assert labels == {"zone": "a"}


def test_nvml_reports_the_versions() -> None:
    nvml = FakeNvml([FakeGpu("GPU-a", "Tesla T4", "00000000:18:00.0", 15360)])
    backend = NvmlBackend(nvml)
    assert backend.versions() == VERSIONS
    assert _driver_versions(backend) == VERSIONS
    legacy = FakeNvml([FakeGpu("GPU-a", "Tesla T4", "00000000:18:00.0", 15360)], legacy=True)
    assert NvmlBackend(legacy).versions().driver == "550.54.15"

    def unsupported() -> int:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    # a driver without the call, as old ones are (same zero-argument signature as pynvml's)
    nvml.nvmlSystemGetCudaDriverVersion = unsupported  # type: ignore[method-assign]
    assert backend.versions() == DriverVersions("550.54.15", "")
    assert _driver_versions(object()) == DriverVersions()


def test_the_flag_is_off_by_default() -> None:
    assert build_parser().parse_args([]).gfd_labels is False
    assert build_parser().parse_args(["--gfd-labels"]).gfd_labels is True
