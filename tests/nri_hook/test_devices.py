"""Reading device nodes and the NVIDIA driver's GPU list under a device root."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nri_hook.devices import HostDevices, parse_gpu_information

INFORMATION = """\
Model: 		 NVIDIA H100 80GB HBM3
IRQ:   		 0
GPU UUID: 	 GPU-3b3a9a6c-6c35-7a8c-7e4b-61e4d7f1a1d2
Video BIOS: 	 96.00.99.00.01
Bus Type: 	 PCIe
DMA Size: 	 52 bits
DMA Mask: 	 0xfffffffffffff
Bus Location: 	 0000:18:00.0
Device Minor: 	 3
GPU Excluded:	 No
"""


def _mknod(path: Path, mode: int, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, mode, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("creating device nodes needs CAP_MKNOD")


def test_character_and_block_nodes_are_read_from_the_root(tmp_path: Path) -> None:
    _mknod(tmp_path / "dev/nvidia3", stat.S_IFCHR | 0o666, 195, 3)
    _mknod(tmp_path / "dev/loop9", stat.S_IFBLK | 0o640, 7, 9)
    os.chmod(tmp_path / "dev/nvidia3", 0o666)  # undo the umask
    os.chmod(tmp_path / "dev/loop9", 0o640)
    host = HostDevices(tmp_path)
    gpu = host.device("/dev/nvidia3")
    assert gpu is not None
    assert (gpu.path, gpu.type, gpu.major, gpu.minor, gpu.file_mode) == (
        "/dev/nvidia3",
        "c",
        195,
        3,
        0o666,
    )
    loop = host.device("/dev/loop9")
    assert loop is not None
    assert (loop.type, loop.major, loop.minor, loop.file_mode) == ("b", 7, 9, 0o640)


def test_missing_paths_and_non_devices_are_none(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvidia0").write_text("not a device")
    host = HostDevices(tmp_path)
    assert host.device("/dev/nvidia0") is None
    assert host.device("/dev/nvidia1") is None
    assert host.device("/dev") is None


def test_symlinked_nodes_are_followed(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvidiactl").symlink_to("/dev/null")
    node = HostDevices(tmp_path).device("/dev/nvidiactl")
    real = os.stat("/dev/null")
    assert node is not None
    assert (node.major, node.minor) == (os.major(real.st_rdev), os.minor(real.st_rdev))
    assert node.file_mode == real.st_mode & 0o777


def test_gpu_information_parsing() -> None:
    assert parse_gpu_information(INFORMATION) == ("GPU-3b3a9a6c-6c35-7a8c-7e4b-61e4d7f1a1d2", 3)
    assert parse_gpu_information("Model: x\n") is None
    assert parse_gpu_information("GPU UUID: GPU-1\nDevice Minor: x\n") is None


def test_gpu_minors_from_the_driver_tree(tmp_path: Path) -> None:
    assert HostDevices(tmp_path).gpu_minors() is None  # no driver files: unknown
    base = tmp_path / "proc/driver/nvidia/gpus"
    for bus, uuid, minor in [("0000:18:00.0", "GPU-a", 3), ("0000:3b:00.0", "GPU-b", 0)]:
        (base / bus).mkdir(parents=True)
        (base / bus / "information").write_text(f"GPU UUID: {uuid}\nDevice Minor: {minor}\n")
    (base / "0000:5e:00.0").mkdir()  # unreadable entry: skipped
    assert HostDevices(tmp_path).gpu_minors() == {"GPU-a": 3, "GPU-b": 0}
