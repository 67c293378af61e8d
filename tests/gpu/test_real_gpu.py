"""The node side of tessera on a real NVIDIA GPU: discovery against nvidia-smi and the
driver's own files, health on a healthy GPU (and, opt-in, an XID making it unhealthy),
the node agent serving a kubelet, the node check, and a CUDA program in a /dev built from
the NRI plugin's plan (and, with MPS, held to the memory and compute the plan asks for)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.nvml_backend import NvmlBackend
from nri_hook.adjust import ISOLATION_MPS, Settings, gpu_device_path
from nri_hook.device_access import NVIDIA_GPU_MAJOR
from nri_hook.devices import HostDevices
from protos.kubelet.deviceplugin.v1beta1 import api_pb2 as pb
from tessera.model import Gpu, normalize_bus_id
from tessera.resources import GPU_CORE, GPU_MEMORY
from tessera_testbed.kubelet import KubeletSimulator
from tests.gpu import containers
from tests.gpu.containers import Share

pytestmark = pytest.mark.gpu

CHECKOUT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    path = [str(CHECKOUT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path))


def test_discovery_agrees_with_nvidia_smi(
    gpus: list[Gpu], smi: list[dict[str, str]], report: dict[str, Any]
) -> None:
    rows = smi
    assert report["discovery"]["errors"] == []
    assert len(gpus) == len(rows)
    by_uuid = {row["uuid"]: row for row in rows}
    for gpu in gpus:
        row = by_uuid[gpu.uuid]
        assert gpu.index == int(row["index"])
        assert gpu.model == row["name"]
        assert gpu.memory_mib == int(row["memory.total"])
        assert gpu.pci_bus_id == normalize_bus_id(row["pci.bus_id"])


def test_minors_and_device_nodes_are_the_drivers(gpus: list[Gpu], report: dict[str, Any]) -> None:
    host = HostDevices("/")
    minors = host.gpu_minors()
    report["driver-minors"] = minors
    assert minors is not None, "no /proc/driver/nvidia/gpus on a GPU node"
    for gpu in gpus:
        assert minors[gpu.uuid] == gpu.minor
        node = host.device(gpu_device_path(gpu.minor))
        assert node is not None and node.type == "c"
        assert (node.major, node.minor) == (NVIDIA_GPU_MAJOR, gpu.minor)


def test_numa_node_is_the_one_sysfs_gives(gpus: list[Gpu], report: dict[str, Any]) -> None:
    seen: dict[str, dict[str, object]] = {}
    mismatched = []
    for gpu in gpus:
        path = Path("/sys/bus/pci/devices") / gpu.pci_bus_id / "numa_node"
        raw = int(path.read_text())  # every PCI device has one (-1: no NUMA information)
        seen[gpu.uuid] = {"sysfs": raw, "ours": gpu.numa_node, "root": gpu.pcie_root}
        if gpu.numa_node != raw:
            mismatched.append(gpu.uuid)
    report["numa"] = seen
    assert mismatched == [], seen


def test_driver_versions_match_nvidia_smi(
    nvml: NvmlBackend, smi: list[dict[str, str]], report: dict[str, Any]
) -> None:
    rows = smi
    versions = nvml.versions()
    header = subprocess.run(
        ["nvidia-smi"], check=False, capture_output=True, text=True, timeout=60
    ).stdout
    report["versions"] = asdict(versions)
    assert versions.driver == rows[0]["driver_version"]
    assert f"CUDA Version: {versions.cuda}" in header


def test_a_healthy_gpu_reports_no_problem(nvml: NvmlBackend, gpus: list[Gpu]) -> None:
    for gpu in gpus:
        assert nvml.query(gpu.uuid) is None
    # the XID event set registers on the real driver and waits quietly
    assert nvml.wait_events(2.0) == []
    assert nvml.query("GPU-00000000-0000-0000-0000-000000000000") is not None


def test_the_agent_prints_the_real_inventory(gpus: list[Gpu], report: dict[str, Any]) -> None:
    argv = [
        sys.executable,
        "-m",
        "deviceplugin.cli",
        "--backend",
        "nvml",
        "--rdma",
        "off",
        "--print-inventory",
        "--node-name",
        "gpu-check",
    ]
    done = subprocess.run(
        argv, check=False, capture_output=True, text=True, env=_env(), timeout=120
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    report["print-inventory"] = printed
    assert printed["errors"] == []
    assert [g["uuid"] for g in printed["spec"]["gpus"]] == [g.uuid for g in gpus]
    assert printed["units"][GPU_CORE] == 100 * len(gpus)
    assert printed["units"][GPU_MEMORY] == sum(g.memory_mib // 1024 for g in gpus)


@contextmanager
def _agent(*flags: str) -> Iterator[KubeletSimulator]:
    """The node agent on the real GPUs as its own process, registered with a simulated
    kubelet; it must stop cleanly on SIGTERM."""
    # a short directory: a unix socket path has at most 107 bytes, pytest's tmp_path is long
    plugin_dir = Path(tempfile.mkdtemp(prefix="tessera-gpu-"))
    argv = [
        *(sys.executable, "-m", "deviceplugin.cli", "--backend", "nvml", "--rdma", "off"),
        *("--no-inventory", "--device-plugin-dir", str(plugin_dir), "--node-name", "gpu-check"),
        *flags,
    ]
    with KubeletSimulator(plugin_dir) as kubelet:
        proc = subprocess.Popen(argv, env=_env(), stderr=subprocess.PIPE, text=True)
        try:
            kubelet.wait_registered([GPU_CORE, GPU_MEMORY], timeout_s=60)
            yield kubelet
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
            print(err[-4000:])
            shutil.rmtree(plugin_dir, ignore_errors=True)
        assert proc.returncode == 0, err


def test_the_agent_serves_a_kubelet_on_real_gpus(gpus: list[Gpu]) -> None:
    with _agent() as kubelet:
        core = kubelet.endpoint(GPU_CORE).wait_for(lambda m: len(m.devices) > 0)
        assert len(core.devices) == 100 * len(gpus)
        assert {d.ID.split("::")[0] for d in core.devices} == {g.uuid for g in gpus}
        assert {d.health for d in core.devices} == {"Healthy"}
        ids = [f"{gpus[0].uuid}::{n}" for n in range(4)]
        answer = kubelet.allocate(GPU_CORE, ids)
        assert answer.annotations["tessera.dev/dp-units-gpu-core"] == f"{gpus[0].uuid}:4"


FAULT = """
import cupy
kernel = cupy.RawKernel('extern "C" __global__ void f(int *p) { *(volatile int *)16 = *p; }', "f")
kernel((1,), (1,), (cupy.zeros(1, dtype=cupy.int32),))
cupy.cuda.Device().synchronize()
"""


def _health(uuid: str) -> Callable[[pb.ListAndWatchResponse], set[str]]:
    return lambda m: {d.health for d in m.devices if d.ID.startswith(uuid)}


def test_an_xid_makes_the_gpu_unhealthy_until_it_recovers(
    gpus: list[Gpu], report: dict[str, Any]
) -> None:
    """Opt-in (TESSERA_GPU_FAULT=1): a kernel writes to an unmapped address, the driver
    reports an XID (an MMU fault, 31), and with no XID ignored the GPU's units go Unhealthy,
    then Healthy again after the recovery period."""
    if not os.environ.get("TESSERA_GPU_FAULT"):
        pytest.skip("makes the GPU fault on purpose: set TESSERA_GPU_FAULT=1")
    python = containers.torch_python()
    if subprocess.run([python, "-c", "import cupy"], check=False).returncode != 0:
        pytest.skip("CuPy is not installed")
    gpu = gpus[-1]
    health = _health(gpu.uuid)
    flags = ("--health-ignore-xids", "none", "--health-recovery-seconds", "10")
    with _agent(*flags, "--health-query-interval", "1") as kubelet:
        endpoint = kubelet.endpoint(GPU_CORE)
        healthy = endpoint.wait_for(lambda m: health(m) == {"Healthy"})
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu.uuid)
        fault = subprocess.run(
            [python, "-c", FAULT], check=False, capture_output=True, text=True, env=env
        )
        faulted_at = time.monotonic()
        report["fault"] = {"rc": fault.returncode, "stderr": fault.stderr[-1500:]}
        assert fault.returncode != 0, "the faulting kernel ran without an error"
        sick = endpoint.wait_for(lambda m: health(m) == {"Unhealthy"}, 30, after=healthy)
        report["unhealthy-after-s"] = time.monotonic() - faulted_at
        endpoint.wait_for(lambda m: health(m) == {"Healthy"}, 60, after=sick)
        report["healthy-again-after-s"] = time.monotonic() - faulted_at


def test_the_node_check_passes_the_driver_checks(nvml: NvmlBackend, report: dict[str, Any]) -> None:
    argv = [sys.executable, "-m", "deviceplugin.preflight", "--backend", "nvml", "-o", "json"]
    done = subprocess.run(
        argv, check=False, capture_output=True, text=True, env=_env(), timeout=120
    )
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    report["node-check"] = checks
    for name in ("nvidia-driver", "/dev/nvidiactl", "/dev/nvidia-uvm", "nvml"):
        assert checks[name]["status"] == "ok", checks[name]


# --- a CUDA program in a /dev built from the plan ---------------------------------------------


def test_cuda_runs_with_the_planned_devices(gpus: list[Gpu], report: dict[str, Any]) -> None:
    gpu = gpus[-1]
    plan = containers.plan([Share(gpu, 100, gpu.memory_mib)], Settings())
    report["plan-devices"] = [asdict(d) for d in plan.devices]
    seen = containers.run(containers.argv(plan, "--alloc-mib", "1024"))
    report["container-probe"] = seen
    assert seen.get("available"), seen
    assert len(seen["uuids"]) == 1 and gpu.uuid.endswith(seen["uuids"][0]), seen
    assert seen["alloc"] == {"1024": "ok"}


def test_without_its_device_node_a_container_sees_no_gpu(
    gpus: list[Gpu], report: dict[str, Any]
) -> None:
    gpu = gpus[-1]
    plan = containers.plan([Share(gpu, 100, gpu.memory_mib)], Settings())
    seen = containers.run(containers.argv(plan, leave_out=gpu_device_path(gpu.minor)))
    report["container-probe-without-gpu-node"] = seen
    assert not seen.get("uuids"), seen


def test_mps_holds_a_share_to_the_planned_memory(
    gpus: list[Gpu], mps_daemon: Path, report: dict[str, Any]
) -> None:
    gpu = gpus[-1]
    settings = Settings(isolation=ISOLATION_MPS, mps_pipe_dir=str(mps_daemon))
    plan = containers.plan([Share(gpu, 50, 4096)], settings)
    env = dict(plan.env)
    sizes = ("--alloc-mib", "1024", "--alloc-mib", "8192")
    probe = containers.argv(None, *sizes)
    full = containers.run(probe, {"CUDA_MPS_PIPE_DIRECTORY": str(mps_daemon)})
    planned = containers.run(probe, env)
    by_index = containers.run(probe, dict(env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=4096M"))
    report["mps"] = {"env": env, "no-limit": full, "planned": planned, "by-index": by_index}
    assert full["alloc"] == {"1024": "ok", "8192": "ok"}, full
    assert planned["alloc"]["1024"] == "ok", planned
    assert planned["alloc"]["8192"] != "ok", planned
    assert by_index["alloc"]["1024"] == "ok" and by_index["alloc"]["8192"] != "ok", by_index
    # the compute share: MPS reports the multiprocessors a client may use
    assert planned["sms"][0] < full["sms"][0], (planned, full)
