"""Checks on a real NVIDIA GPU node (`make gpu-check`): NVML, the driver's device nodes,
CUDA itself and, where installed, MPS.

Without a GPU every check skips, unless TESSERA_REQUIRE_GPU is set (as `make gpu-check`
sets it): then the missing GPU is a failure, so a run that proved nothing is not green.
Observations (what nvidia-smi, NVML and CUDA said) are collected into one JSON report at
$TESSERA_GPU_REPORT when that is set, whether the checks pass or not.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.backend import BackendError
from deviceplugin.nvml_backend import NvmlBackend
from tessera.model import Gpu

SMI_FIELDS = "index,uuid,name,memory.total,pci.bus_id,driver_version"
HAMI_CORE_LIBRARY = "/usr/local/vgpu/libvgpu.so"
"""Where HAMi's device plugin installs the library, and the NRI hook looks by default."""

REPORT: dict[str, Any] = {}


def _no_gpu(reason: str) -> None:
    if os.environ.get("TESSERA_REQUIRE_GPU"):
        pytest.fail(f"a GPU node was required: {reason}")
    pytest.skip(reason)


def write_report(report: dict[str, Any]) -> None:
    """Write what was observed so far (also mid-run: a run cut short keeps its rows)."""
    path = os.environ.get("TESSERA_GPU_REPORT")
    if path:
        Path(path).write_text(json.dumps(report, indent=2, default=str))


@pytest.fixture(scope="session")
def report() -> Iterator[dict[str, Any]]:
    yield REPORT
    write_report(REPORT)


@pytest.fixture(scope="session")
def nvml(report: dict[str, Any]) -> Iterator[NvmlBackend]:
    try:
        backend = NvmlBackend()
    except BackendError as exc:
        _no_gpu(f"NVML is not usable here: {exc}")
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def smi(nvml: NvmlBackend, report: dict[str, Any]) -> list[dict[str, str]]:
    """nvidia-smi's answer per GPU (the fields of SMI_FIELDS)."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not installed")
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    rows = [
        dict(zip(SMI_FIELDS.split(","), (c.strip() for c in line.split(",")), strict=True))
        for line in out.splitlines()
        if line.strip()
    ]
    report["nvidia-smi"] = rows
    return rows


@pytest.fixture(scope="session")
def gpus(nvml: NvmlBackend, report: dict[str, Any]) -> list[Gpu]:
    found = nvml.discover()
    report["discovery"] = {
        "gpus": [asdict(g) for g in found.gpus],
        "errors": [str(e) for e in found.errors],
    }
    assert found.gpus, "NVML initialised but discovery found no GPU"
    versions = nvml.versions()
    report["environment"] = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "models": sorted({g.model for g in found.gpus}),
        "gpus": len(found.gpus),
        "driver": versions.driver,
        "cuda": versions.cuda,
    }
    return list(found.gpus)


MPS_SUPERVISOR_ENV = "TESSERA_MPS_SUPERVISOR"
"""HOOK POINT for the node DaemonSet's MPS supervisor: a command line that starts NVIDIA's
control daemon with CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY from its
environment, restarts it when it dies and stops it on SIGTERM, as the DaemonSet runs it.
Unset, the checks start the daemon as that supervisor does (`nvidia-cuda-mps-control -d`
with the two directories set) and stand in for its restarts themselves (MpsDaemon)."""


class MpsDaemon:
    """NVIDIA's MPS control daemon on a pipe directory of the checks' own, outside /tmp
    (each stand-in container has a /tmp of its own; the plan bind-mounts the pipe directory
    at its host path), started by the supervisor command ($TESSERA_MPS_SUPERVISOR) or as
    that supervisor starts it, with a stand-in for its restarts."""

    def __init__(self, control: str) -> None:
        self.control = control
        self.base = Path(tempfile.mkdtemp(prefix="tessera-mps-", dir="/var/tmp"))
        self.pipe, self.logs = self.base / "pipe", self.base / "log"
        self.pipe.mkdir()
        self.logs.mkdir()
        self.env = dict(
            os.environ,
            CUDA_MPS_PIPE_DIRECTORY=str(self.pipe),
            CUDA_MPS_LOG_DIRECTORY=str(self.logs),
        )
        self.supervisor_command = os.environ.get(MPS_SUPERVISOR_ENV, "")
        self.supervisor: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._watch: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def pid_file(self) -> Path:
        return self.pipe / "nvidia-cuda-mps-control.pid"

    def pid(self) -> int:
        """The running control daemon's pid (0: none)."""
        try:
            pid = int(self.pid_file.read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return 0
        return pid

    def wait_up(self, timeout_s: float = 20, other_than: int = 0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid = self.pid()
            if pid and pid != other_than:
                return pid
            time.sleep(0.1)
        return 0

    def start(self) -> None:
        if self.supervisor_command:
            self.supervisor = subprocess.Popen(shlex.split(self.supervisor_command), env=self.env)
        else:
            subprocess.run([self.control, "-d"], env=self.env, check=True, timeout=30)
            self._watch = threading.Thread(target=self._stand_in_supervisor, daemon=True)
            self._watch.start()
        self.wait_up()

    def _stand_in_supervisor(self) -> None:
        while not self._stop.wait(0.5):
            if not self.pid():
                self.pid_file.unlink(missing_ok=True)
                subprocess.run([self.control, "-d"], env=self.env, check=False, timeout=30)
                self.restarts += 1

    def restarted_by(self) -> str:
        return self.supervisor_command or "the checks' stand-in (no $TESSERA_MPS_SUPERVISOR)"

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.join(5)
        if self.supervisor is not None:
            self.supervisor.terminate()
            try:
                self.supervisor.wait(30)
            except subprocess.TimeoutExpired:
                self.supervisor.kill()
                self.supervisor.wait(5)
        if self.pid():
            subprocess.run([self.control], check=False, input=b"quit\n", env=self.env, timeout=30)
        for f in sorted(self.logs.iterdir()):
            print(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}")
        shutil.rmtree(self.base, ignore_errors=True)


def mps_control() -> str:
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        pytest.skip("nvidia-cuda-mps-control is not installed")
    return control


@pytest.fixture(scope="session")
def mps() -> Iterator[MpsDaemon]:
    """The one MPS control daemon of the checks (one per node, as the DaemonSet runs it)."""
    daemon = MpsDaemon(mps_control())
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="session")
def mps_daemon(mps: MpsDaemon) -> Path:
    """The MPS control daemon's pipe directory, for the plans."""
    return mps.pipe


@pytest.fixture(scope="session")
def hami_core_library(report: dict[str, Any]) -> str:
    """HAMi-core's libvgpu.so: $TESSERA_HAMI_CORE_LIBRARY, else the one `make hami-core`
    built for this machine, else where the node installs it.
    Missing, the HAMi-core checks fail under `make gpu-check` (the layer every shipped
    manifest configures must not go unchecked) unless TESSERA_GPU_SKIP_HAMI_CORE is set."""
    built = Path(__file__).resolve().parents[2] / "build/hami-core" / platform.machine()
    path = os.environ.get("TESSERA_HAMI_CORE_LIBRARY") or (
        str(built / "libvgpu.so") if (built / "libvgpu.so").is_file() else HAMI_CORE_LIBRARY
    )
    if not os.path.isfile(path):
        reason = f"no HAMi-core library at {path} ($TESSERA_HAMI_CORE_LIBRARY; docs/isolation.md)"
        if os.environ.get("TESSERA_REQUIRE_GPU") and not os.environ.get(
            "TESSERA_GPU_SKIP_HAMI_CORE"
        ):
            pytest.fail(reason)
        pytest.skip(reason)
    report["hami-core"] = {
        "library": path,
        "version": os.environ.get("TESSERA_HAMI_CORE_VERSION", "") or _stamped_version(path),
    }
    return os.path.abspath(path)


def _stamped_version(library: str) -> str:
    """`HAMi-core <version>` from the stamp `make hami-core` writes beside the library."""
    try:
        stamp = json.loads(Path(library).with_suffix(".json").read_text())
    except (OSError, ValueError):
        return ""
    return f"HAMi-core {stamp.get('version', '?')} ({stamp.get('arch', '?')})"


@pytest.fixture(autouse=True)
def _report_after_each_test(report: dict[str, Any]) -> Iterator[None]:
    """A run cut short (a device lent for minutes) keeps every finished check's figures."""
    yield
    write_report(report)
