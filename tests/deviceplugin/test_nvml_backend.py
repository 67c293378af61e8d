"""The NVML backend against a stand-in pynvml (tests/deviceplugin/fake_pynvml.py) and a fake
sysfs tree: an HGX H100 (NVSwitch), A100 PCIe pairs with NVLink bridges, and T4s."""

from __future__ import annotations

from pathlib import Path

import pytest

from deviceplugin.backend import BackendError, XidEvent
from deviceplugin.nvml_backend import NvmlBackend
from tests.deviceplugin import fake_pynvml as nv
from tests.deviceplugin.sysfs_tree import SysfsTree

H100_BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
SWITCHES = ["00000000:C5:00.0", "00000000:C6:00.0", "00000000:C7:00.0", "00000000:C8:00.0"]


def h100_node(tmp_path: Path, legacy: bool = False) -> nv.FakeNvml:
    tree = SysfsTree(tmp_path)
    gpus = []
    for i, bus in enumerate(H100_BUSES):
        numa = 0 if i < 4 else 1
        root = f"pci0000:{0x15 + 0x20 * (i // 2):02x}"
        rp = f"0000:{root[-2:]}:01.0"
        up = f"0000:{int(root[-2:], 16) + 1:02x}:00.0"
        down = f"0000:{int(root[-2:], 16) + 2:02x}:0{i % 2}.0"
        tree.add_pci([rp, up, down, f"0000:{bus}:00.0"], root_complex=root, numa=numa)
        # 18 links, spread over 4 NVSwitches; the switches are not PCI devices we know
        links: list[tuple[str, int] | None] = [
            (SWITCHES[k % 4], nv.NVML_NVLINK_DEVICE_TYPE_SWITCH) for k in range(18)
        ]
        gpus.append(
            nv.FakeGpu(
                uuid=f"GPU-8f4c3a0e-0000-4000-8000-00000000000{i}",
                name="NVIDIA H100 80GB HBM3",
                bus_id=f"00000000:{bus.upper()}:00.0",
                memory_mib=81559,
                minor=i,
                mig=nv.NVML_DEVICE_MIG_ENABLE if i == 7 else nv.NVML_DEVICE_MIG_DISABLE,
                links=links,
            )
        )
    return nv.FakeNvml(gpus, legacy=legacy)


@pytest.mark.parametrize("legacy", [False, True], ids=["str", "bytes"])
def test_h100_discovery(tmp_path: Path, legacy: bool) -> None:
    fake = h100_node(tmp_path, legacy)
    found = NvmlBackend(fake, sysfs_root=tmp_path).discover()
    assert found.errors == []
    assert [g.index for g in found.gpus] == list(range(8))
    g0, g5, g7 = found.gpus[0], found.gpus[5], found.gpus[7]
    assert g0.uuid == "GPU-8f4c3a0e-0000-4000-8000-000000000000"
    assert g0.model == "NVIDIA H100 80GB HBM3"
    assert (g0.memory_mib, g0.minor, g0.pci_bus_id) == (81559, 0, "0000:18:00.0")
    assert (g0.numa_node, g0.pcie_root, g0.pcie_switch) == (0, "pci0000:15", "0000:16:00.0")
    assert (g5.numa_node, g5.pcie_root, g5.pcie_switch) == (1, "pci0000:55", "0000:56:00.0")
    assert (g0.mig_enabled, g7.mig_enabled) == (False, True)
    # through the NVSwitches every pair has 18 links, as `nvidia-smi topo -m` shows NV18
    for gpu in found.gpus:
        peers = dict(gpu.nvlinks)
        assert set(peers) == {g.index for g in found.gpus} - {gpu.index}
        assert set(peers.values()) == {18}


def test_direct_nvlink_bridges_pair_gpus(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    buses = ["00000000:1B:00.0", "00000000:1C:00.0", "00000000:3D:00.0", "00000000:3E:00.0"]
    for bus in buses:
        tree.add_pci(
            ["0000:17:01.0", "0000:1a:00.0", "0000:1a:08.0", bus[4:].lower()],
            root_complex="pci0000:17",
        )
    gpus = []
    for i, bus in enumerate(buses):
        peer = buses[i ^ 1]
        links = [(peer, nv.NVML_NVLINK_DEVICE_TYPE_GPU)] * 4 + [None] * 8
        gpus.append(nv.FakeGpu(f"GPU-a{i}", "NVIDIA A100 80GB PCIe", bus, 81920, links=links))
    found = NvmlBackend(nv.FakeNvml(gpus), sysfs_root=tmp_path).discover()
    peers = {g.index: dict(g.nvlinks) for g in found.gpus}
    assert peers == {0: {1: 4}, 1: {0: 4}, 2: {3: 4}, 3: {2: 4}}


def test_without_nvlink_support_there_are_no_peers(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    gpus = []
    for i in range(4):
        bus = f"00000000:{0x3B + i:02X}:00.0"
        tree.add_pci(["0000:3a:00.0", bus[4:].lower()], root_complex="pci0000:3a")
        gpus.append(nv.FakeGpu(f"GPU-t{i}", "Tesla T4", bus, 15360, links=None))
    fake = nv.FakeNvml(gpus)
    found = NvmlBackend(fake, sysfs_root=tmp_path).discover()
    assert all(g.nvlinks == () for g in found.gpus)
    assert fake.calls.count("nvmlDeviceGetNvLinkState") == 4  # stops at the first NOT_SUPPORTED
    assert {g.pcie_switch for g in found.gpus} == {""}


def test_a_gpu_that_cannot_be_read_is_skipped_with_a_named_error(tmp_path: Path) -> None:
    fake = h100_node(tmp_path)
    fake.gpus[2].fail["nvmlDeviceGetMemoryInfo"] = nv.NVML_ERROR_GPU_IS_LOST
    fake.gpus[4].minor = None
    fake.gpus[4].fail["nvmlDeviceGetMinorNumber"] = nv.NVML_ERROR_NOT_SUPPORTED
    found = NvmlBackend(fake, sysfs_root=tmp_path).discover()
    assert [g.index for g in found.gpus] == [0, 1, 3, 4, 5, 6, 7]
    (error,) = found.errors
    assert (error.source, error.field) == ("nvml:gpu2", "nvmlDeviceGetMemoryInfo")
    assert "GPU is lost" in str(error)
    assert found.gpus[3].minor == 4  # NOT_SUPPORTED minor falls back to the index
    # GPU 2's links no longer count toward anyone
    assert all(2 not in dict(g.nvlinks) for g in found.gpus)


def test_missing_sysfs_entry_keeps_the_gpu_without_topology(tmp_path: Path) -> None:
    fake = h100_node(tmp_path / "sys")
    found = NvmlBackend(fake, sysfs_root=tmp_path / "elsewhere").discover()
    assert len(found.gpus) == 8
    assert {(g.numa_node, g.pcie_root) for g in found.gpus} == {(-1, "")}
    assert len(found.errors) == 8 and found.errors[0].field == "pciBusId"


@pytest.mark.parametrize("code", [nv.NVML_ERROR_LIBRARY_NOT_FOUND, nv.NVML_ERROR_DRIVER_NOT_LOADED])
def test_init_failure_is_a_backend_error(code: int) -> None:
    fake = nv.FakeNvml([])
    fake.init_error = code
    with pytest.raises(BackendError, match="NVML did not initialise"):
        NvmlBackend(fake)


def test_the_real_pynvml_without_a_driver_is_a_backend_error() -> None:
    import pynvml

    try:
        backend = NvmlBackend(pynvml)
    except BackendError as exc:
        assert "NVML" in str(exc)
    else:  # a machine with a GPU: then discovery must work
        assert backend.discover().gpus
        backend.close()


def test_xid_events(tmp_path: Path) -> None:
    fake = h100_node(tmp_path)
    backend = NvmlBackend(fake, sysfs_root=tmp_path)
    backend.discover()
    assert backend.wait_events(0.01) == []  # NVML_ERROR_TIMEOUT
    # every GPU registered for XID events only (DBE is supported but not asked for)
    assert sorted(fake.registered) == [(i, nv.nvmlEventTypeXidCriticalError) for i in range(8)]
    fake.events = [
        nv.EventData(nv.Handle(3), nv.nvmlEventTypeXidCriticalError, 79),
        nv.EventData(nv.Handle(1), nv.nvmlEventTypeClock, 0),
        nv.NVML_ERROR_UNKNOWN,
    ]
    assert backend.wait_events(1) == [XidEvent(fake.gpus[3].uuid, 79, "XID 79")]
    assert backend.wait_events(1) == []  # not an XID event
    (failed,) = backend.wait_events(1)
    assert failed.uuid is None and "Unknown Error" in failed.detail


def test_gpu_without_xid_events_is_still_served(tmp_path: Path) -> None:
    fake = h100_node(tmp_path)
    fake.gpus[0].supported_events = nv.nvmlEventTypeSingleBitEccError
    fake.gpus[1].fail["nvmlDeviceRegisterEvents"] = nv.NVML_ERROR_NOT_SUPPORTED
    backend = NvmlBackend(fake, sysfs_root=tmp_path)
    backend.discover()
    assert backend.wait_events(0.01) == []
    assert sorted(i for i, _ in fake.registered) == [2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("legacy", [False, True], ids=["str", "bytes"])
def test_query(tmp_path: Path, legacy: bool) -> None:
    fake = h100_node(tmp_path, legacy)
    backend = NvmlBackend(fake, sysfs_root=tmp_path)
    backend.discover()
    uuid = fake.gpus[5].uuid
    assert backend.query(uuid) is None
    fake.gpus[5].fail["nvmlDeviceGetMemoryInfo"] = nv.NVML_ERROR_GPU_IS_LOST
    assert backend.query(uuid) == "NVML query failed: GPU is lost"
    fake.gpus[5].fail["nvmlDeviceGetMemoryInfo"] = nv.NVML_ERROR_NOT_SUPPORTED
    assert backend.query(uuid) is None
    assert backend.query("GPU-unknown") == "NVML query failed: Not Found"
    backend.close()
    assert not fake.initialized
