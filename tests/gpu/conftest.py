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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.backend import BackendError
from deviceplugin.nvml_backend import NvmlBackend

REPORT: dict[str, Any] = {}


def _no_gpu(reason: str) -> None:
    if os.environ.get("TESSERA_REQUIRE_GPU"):
        pytest.fail(f"a GPU node was required: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def report() -> Iterator[dict[str, Any]]:
    yield REPORT
    path = os.environ.get("TESSERA_GPU_REPORT")
    if path:
        Path(path).write_text(json.dumps(REPORT, indent=2, default=str))


@pytest.fixture(scope="session")
def nvml(report: dict[str, Any]) -> Iterator[NvmlBackend]:
    try:
        backend = NvmlBackend()
    except BackendError as exc:
        _no_gpu(f"NVML is not usable here: {exc}")
    yield backend
    backend.close()
