"""tessera-node-check against scratch /proc, /dev and /sys trees."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.preflight import main


class FakeNvml:
    def __init__(self, count: int = 8, fail: Exception | None = None) -> None:
        self.count, self.fail, self.shutdown = count, fail, False

    def nvmlInit(self) -> None:
        if self.fail is not None:
            raise self.fail

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

    def nvmlShutdown(self) -> None:
        self.shutdown = True


def touch(root: Path, path: str, text: str = "") -> Path:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def char_device(root: Path, path: str) -> None:
    """A character device without mknod: a link to /dev/null."""
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.symlink_to("/dev/null")


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for s in held:
        s.close()


def listen(root: Path, path: str, held: list[socket.socket]) -> None:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(p))
    held.append(s)


@pytest.fixture
def good_node(sockets: list[socket.socket]) -> Iterator[Path]:
    """A GPU node with everything tessera needs, RDMA and HAMi-core included (under a short
    /tmp path: unix socket paths hold at most 107 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="tnc-", dir="/tmp"))
    try:
        yield _populate(root, sockets)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _populate(root: Path, sockets: list[socket.socket]) -> Path:
    touch(
        root,
        "/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 2024\nGCC\n",
    )
    char_device(root, "/dev/nvidiactl")
    char_device(root, "/dev/nvidia-uvm")
    listen(root, "/var/lib/kubelet/device-plugins/kubelet.sock", sockets)
    listen(root, "/var/run/nri/nri.sock", sockets)
    (root / "sys/class/infiniband/mlx5_0").mkdir(parents=True)
    char_device(root, "/dev/infiniband/uverbs0")
    touch(root, "/usr/local/vgpu/libvgpu.so")
    return root


def check(
    capsys: pytest.CaptureFixture[str], *argv: str, nvml: FakeNvml | None = None
) -> tuple[int, dict[str, dict[str, Any]]]:
    code = main([*argv, "-o", "json"], nvml=(lambda: nvml) if nvml else None)
    out = capsys.readouterr().out
    return code, {c["name"]: c for c in json.loads(out)}


def test_a_good_node_passes(good_node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nvml = FakeNvml()
    code, checks = check(capsys, "--root", str(good_node), nvml=nvml)
    assert code == 0, checks
    assert {c["status"] for c in checks.values()} == {"ok"}
    assert "550.54.15" in checks["nvidia-driver"]["reason"]
    assert checks["nvml"]["reason"] == "8 GPU(s), driver 550.54.15" and nvml.shutdown
    assert "1 RDMA device(s) (mlx5_0), 1 uverbs" in checks["rdma"]["reason"]
    assert "hami-core" in checks["isolation"]["reason"]
    code = main(["--root", str(good_node)], nvml=lambda: nvml)
    out = capsys.readouterr().out
    assert code == 0 and out.splitlines()[-1] == "0 failed, 0 warning(s)"


def test_no_driver_fails_with_what_to_do(
    good_node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (good_node / "proc/driver/nvidia/version").unlink()
    (good_node / "dev/nvidia-uvm").unlink()
    code, checks = check(
        capsys,
        "--root",
        str(good_node),
        nvml=FakeNvml(fail=OSError("NVML Shared Library Not Found")),
    )
    assert code == 1
    assert (
        checks["nvidia-driver"]["status"] == "fail" and "modprobe" in checks["nvidia-driver"]["fix"]
    )
    assert checks["/dev/nvidia-uvm"]["status"] == "fail"
    assert checks["/dev/nvidiactl"]["status"] == "ok"
    assert checks["nvml"]["status"] == "fail" and "Not Found" in checks["nvml"]["reason"]
    code = main(["--root", str(good_node)], nvml=lambda: FakeNvml(fail=OSError("x")))
    out = capsys.readouterr().out
    assert "FAIL  nvidia-driver" in out and "-> install the NVIDIA driver" in out


def test_a_regular_file_is_not_a_device(
    good_node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (good_node / "dev/nvidiactl").unlink()
    touch(good_node, "/dev/nvidiactl")
    code, checks = check(capsys, "--root", str(good_node), nvml=FakeNvml())
    assert code == 0 and checks["/dev/nvidiactl"]["status"] == "warn"


def test_nvml_with_no_gpus_fails(good_node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, checks = check(capsys, "--root", str(good_node), nvml=FakeNvml(count=0))
    assert code == 1 and "no GPUs" in checks["nvml"]["reason"]


def test_fake_backend_checks_the_topology_instead(
    tmp_path: Path, good_node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (good_node / "proc/driver/nvidia/version").unlink()
    code, checks = check(
        capsys, "--root", str(good_node), "--backend", "fake", "--topology", "h100-sxm-8x"
    )
    assert code == 0 and checks["nvml"]["reason"].startswith("topology: 8 GPU(s)")
    assert "nvidiactl" not in " ".join(checks)
    broken = touch(tmp_path, "topo.yaml", "gpus:\n- index: x\n")
    code, checks = check(
        capsys, "--root", str(good_node), "--backend", "fake", "--topology", str(broken)
    )
    assert code == 1 and "topo.yaml" in checks["nvml"]["reason"]


def test_plugin_dir_and_nri_socket(good_node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (good_node / "var/run/nri/nri.sock").unlink()
    os.chmod(good_node / "var/lib/kubelet/device-plugins", 0o500)
    try:
        code, checks = check(capsys, "--root", str(good_node), nvml=FakeNvml())
    finally:
        os.chmod(good_node / "var/lib/kubelet/device-plugins", 0o700)
    assert code == 1
    assert checks["nri"]["status"] == "fail" and "containerd" in checks["nri"]["fix"]
    if os.geteuid() != 0:  # root writes anywhere
        assert checks["device-plugin-dir"]["status"] == "fail"
    code, checks = check(
        capsys,
        "--root",
        str(good_node),
        "--nri-socket",
        "/run/nri.sock",
        "--device-plugin-dir",
        "/nowhere",
        nvml=FakeNvml(),
    )
    assert "/run/nri.sock" in checks["nri"]["reason"]
    assert checks["device-plugin-dir"]["status"] == "fail"
    assert "does not exist" in checks["device-plugin-dir"]["reason"]


def test_rdma_devices_without_verbs_fail_and_required_rdma(
    good_node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (good_node / "dev/infiniband/uverbs0").unlink()
    code, checks = check(capsys, "--root", str(good_node), nvml=FakeNvml())
    assert code == 1 and "ib_uverbs" in checks["rdma"]["fix"]
    (good_node / "sys/class/infiniband/mlx5_0").rmdir()
    code, checks = check(capsys, "--root", str(good_node), nvml=FakeNvml())
    assert code == 0 and "no RDMA NICs" in checks["rdma"]["reason"]
    code, checks = check(capsys, "--root", str(good_node), "--rdma", "required", nvml=FakeNvml())
    assert code == 1 and checks["rdma"]["status"] == "fail"


def test_missing_isolation_warns_loudly_and_explicit_layers_must_exist(
    good_node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (good_node / "usr/local/vgpu/libvgpu.so").unlink()
    code, checks = check(capsys, "--root", str(good_node), nvml=FakeNvml())
    assert code == 0 and checks["isolation"]["status"] == "warn"
    assert "NO GPU ISOLATION" in checks["isolation"]["reason"]
    code, checks = check(capsys, "--root", str(good_node), "--whole-gpus-only", nvml=FakeNvml())
    assert checks["isolation"]["status"] == "ok"
    code, checks = check(capsys, "--root", str(good_node), "--isolation", "mps", nvml=FakeNvml())
    assert code == 1 and "MPS control daemon is not running" in checks["isolation"]["reason"]
    assert "tessera-mps DaemonSet starts it" in checks["isolation"]["fix"]
    (good_node / "tmp/nvidia-mps").mkdir(parents=True)  # a directory the daemon left behind
    code, checks = check(capsys, "--root", str(good_node), "--isolation", "mps", nvml=FakeNvml())
    assert code == 1 and checks["isolation"]["status"] == "fail"
    touch(good_node, "/tmp/nvidia-mps/nvidia-cuda-mps-control.pid", "4242\n")
    code, checks = check(capsys, "--root", str(good_node), "--isolation", "mps", nvml=FakeNvml())
    assert code == 0 and checks["isolation"]["status"] == "ok"
    # tessera's installer left why it could not install the library: the check says so
    touch(good_node, "/usr/local/vgpu/libvgpu.install-error", "built for aarch64\n")
    code, checks = check(
        capsys, "--root", str(good_node), "--isolation", "hami-core", nvml=FakeNvml()
    )
    assert code == 1 and checks["isolation"]["reason"].endswith(
        "is missing (the last install failed: built for aarch64)"
    )


def test_toolkit_and_cdi_are_information(
    good_node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, checks = check(capsys, "--root", str(good_node), nvml=FakeNvml())
    assert "driver libraries" in checks["container-toolkit"]["reason"]
    touch(good_node, "/etc/cdi/nvidia.yaml")
    touch(good_node, "/usr/bin/nvidia-ctk")
    _, checks = check(capsys, "--root", str(good_node), nvml=FakeNvml())
    reason = checks["container-toolkit"]["reason"]
    assert checks["container-toolkit"]["status"] == "ok"
    assert "nvidia-ctk" in reason and "nvidia.yaml" in reason


def test_usage_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--root", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["--backend", "magic"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_nvidia_device_plugin_on_the_node_fails(
    good_node: Path, capsys: pytest.CaptureFixture[str], sockets: list[socket.socket]
) -> None:
    code, checks = check(capsys, "--root", str(good_node), nvml=FakeNvml())
    assert code == 0 and checks["nvidia-device-plugin"]["status"] == "ok"
    listen(good_node, "/var/lib/kubelet/device-plugins/nvidia-gpu.sock", sockets)
    code, checks = check(capsys, "--root", str(good_node), nvml=FakeNvml())
    assert code == 1 and checks["nvidia-device-plugin"]["status"] == "fail"
    assert "nvidia-gpu.sock" in checks["nvidia-device-plugin"]["reason"]
    assert "tessera.dev/node-agent" in checks["nvidia-device-plugin"]["fix"]


RUNTIME = '\n[plugins."{}".containerd]\ndefault_runtime_name = "{{}}"\n'
V2 = "version = 2" + RUNTIME.format("io.containerd.grpc.v1.cri")
V3 = "version = 3" + RUNTIME.format("io.containerd.cri.v1.runtime")


def test_the_nvidia_runtime_as_containerds_default_fails(
    good_node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def default_runtime() -> dict[str, str]:
        _, checks = check(capsys, "--root", str(good_node), nvml=FakeNvml())
        result: dict[str, str] = checks["default-runtime"]
        return result

    assert default_runtime()["status"] == "ok"  # no configuration: runc
    config = touch(good_node, "/etc/containerd/config.toml", V2.format("runc"))
    assert default_runtime()["status"] == "ok"
    config.write_text(V2.format("nvidia"))
    got = default_runtime()
    assert got["status"] == "fail" and "'nvidia'" in got["reason"]
    assert "NVIDIA_VISIBLE_DEVICES=all" in got["reason"]
    # 2.x layout, and a drop-in (as nvidia-ctk writes) overriding the main file
    config.write_text('imports = ["conf.d/*.toml"]\n' + V3.format("runc"))
    assert default_runtime()["status"] == "ok"
    touch(good_node, "/etc/containerd/conf.d/99-nvidia.toml", V3.format("nvidia"))
    got = default_runtime()
    assert got["status"] == "fail" and "99-nvidia.toml" in got["reason"]
    config.write_text("version = [")
    assert default_runtime()["status"] == "warn"


def test_the_documented_report_is_what_the_command_prints(
    good_node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/operations.md's example: the same checks in the same order, with the same
    verdicts for a node without NRI and without an isolation layer, and the same layout."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    example = doc.split("$ tessera-node-check --root /host\n", 1)[1].split("```", 1)[0]
    (good_node / "var/run/nri/nri.sock").unlink()
    (good_node / "usr/local/vgpu/libvgpu.so").unlink()
    touch(good_node, "/usr/bin/nvidia-ctk")
    touch(good_node, "/etc/cdi/nvidia.yaml")
    assert main(["--root", str(good_node)], nvml=FakeNvml) == 1
    printed = capsys.readouterr().out

    def shape(report: str) -> list[tuple[str, ...]]:
        """Each line's verdict and check name, or that it is a fix line; the summary."""
        rows: list[tuple[str, ...]] = []
        for line in report.strip().splitlines():
            if line.startswith(" "):
                rows.append(("fix", str(line.index("->"))))
            elif line[0].isdigit():
                rows.append((line,))
            else:
                rows.append((line[:6], line.split()[1], str(line.index(line.split()[2]))))
        return rows

    assert shape(example) == shape(printed)
