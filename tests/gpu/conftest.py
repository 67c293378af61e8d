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
import shutil
import subprocess
import tempfile
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


@pytest.fixture(scope="session")
def mps_daemon() -> Iterator[Path]:
    """An MPS control daemon of the checks' own, on a private pipe directory outside /tmp
    (each stand-in container has a /tmp of its own; the plan bind-mounts the pipe
    directory at its host path)."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        pytest.skip("nvidia-cuda-mps-control is not installed")
    base = Path(tempfile.mkdtemp(prefix="tessera-mps-", dir="/var/tmp"))
    pipe, logs = base / "pipe", base / "log"
    pipe.mkdir()
    logs.mkdir()
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(logs))
    subprocess.run([control, "-d"], env=env, check=True, timeout=30)
    deadline = time.monotonic() + 10
    while not (pipe / "nvidia-cuda-mps-control.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        yield pipe
    finally:
        subprocess.run([control], check=False, input="quit\n", text=True, env=env, timeout=30)
        for f in sorted(logs.iterdir()):
            print(f"--- {f.name}\n{f.read_text()[-3000:]}")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def hami_core_library(report: dict[str, Any]) -> str:
    """HAMi-core's libvgpu.so: $TESSERA_HAMI_CORE_LIBRARY, else where HAMi installs it.
    Missing, the HAMi-core checks fail under `make gpu-check` (the layer every shipped
    manifest configures must not go unchecked) unless TESSERA_GPU_SKIP_HAMI_CORE is set."""
    path = os.environ.get("TESSERA_HAMI_CORE_LIBRARY") or HAMI_CORE_LIBRARY
    if not os.path.isfile(path):
        reason = f"no HAMi-core library at {path} ($TESSERA_HAMI_CORE_LIBRARY; docs/isolation.md)"
        if os.environ.get("TESSERA_REQUIRE_GPU") and not os.environ.get(
            "TESSERA_GPU_SKIP_HAMI_CORE"
        ):
            pytest.fail(reason)
        pytest.skip(reason)
    report["hami-core"] = {
        "library": path,
        "version": os.environ.get("TESSERA_HAMI_CORE_VERSION", ""),
    }
    return os.path.abspath(path)


@pytest.fixture(autouse=True)
def _report_after_each_test(report: dict[str, Any]) -> Iterator[None]:
    """A run cut short (a device lent for minutes) keeps every finished check's figures."""
    yield
    write_report(report)
