"""Containers as the NRI plugin plans them, stood in for by processes on the real host.

A "container" here is `cuda_probe.py` in a mount namespace of its own with exactly what
the plan gives: a read-only /dev holding the runtime's default nodes and the plan's, the
plan's environment (the isolation layer's variables, NVIDIA_VISIBLE_DEVICES, LD_PRELOAD)
and its tmpfs mounts. Bind mounts of a host path to the same path (the HAMi-core library,
the MPS pipe directory) are in place already. What it lacks is the device cgroup, which the
read-only /dev stands in for. Its /tmp is the host's: so every container here shares one
/tmp, as containers of a pod that share an emptyDir there do, and a layer whose state
lives in /tmp would mix their limits.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from nri_hook.adjust import Adjustment, Settings, plan_container
from nri_hook.devices import HostDevices
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.model import Gpu

PROBE = Path(__file__).with_name("cuda_probe.py")


@dataclass(frozen=True)
class Share:
    """What a container is given of one GPU."""

    gpu: Gpu
    core: int
    memory_mib: int


@functools.cache
def torch_python() -> str:
    """An interpreter with PyTorch for the probe: $TESSERA_CUDA_PYTHON, else the test
    interpreter, else python3 on the PATH (the project's virtual environment has none)."""
    import sys

    choices = [os.environ.get("TESSERA_CUDA_PYTHON", ""), sys.executable, "python3"]
    for python in filter(None, choices):
        probe = [python, "-c", "import torch"]
        if shutil.which(python) and subprocess.run(probe, check=False).returncode == 0:
            return python
    pytest.skip("no interpreter with PyTorch ($TESSERA_CUDA_PYTHON)")


def plan(
    shares: Sequence[Share], settings: Settings, container: str = "main", host: Any = None
) -> Adjustment:
    """The NRI plugin's adjustment for a container given `shares`, on this host (or on
    `host`, a stand-in for its device nodes: tests/gpu/dry_run.py)."""
    grants = tuple(
        GpuGrant(s.gpu.uuid, s.gpu.index, s.gpu.minor, s.core, s.memory_mib) for s in shares
    )
    pod = PodAllocation(
        "uid-1", "team-a", "train", "gpu-check", (ContainerAllocation(container, grants),)
    )
    adjustment = plan_container(pod, container, settings, host or HostDevices("/"))
    assert adjustment is not None
    return adjustment


def device_nodes(adjustment: Adjustment, leave_out: str = "") -> list[dict[str, Any]]:
    return [
        {"path": d.path, "major": d.major, "minor": d.minor, "file_mode": d.file_mode}
        for d in adjustment.devices
        if d.path != leave_out
    ]


def argv(adjustment: Adjustment | None, *probe_args: str, leave_out: str = "") -> list[str]:
    """The command that runs the probe as a container given `adjustment` (None: a plain
    process on the host)."""
    command = [torch_python(), str(PROBE), *probe_args]
    if adjustment is None:
        return command
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    return [
        *("unshare", "--mount", "--propagation", "private", "--"),
        *command,
        *("--dev-nodes", json.dumps(device_nodes(adjustment, leave_out))),
        *("--mounts", json.dumps([asdict(m) for m in adjustment.mounts])),
        *("--env", json.dumps(dict(adjustment.env))),
    ]


def start(command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, **(env or {})),
    )


def finish(proc: subprocess.Popen[str], timeout_s: float = 120) -> dict[str, Any]:
    """The probe's answer; a probe that fails or hangs answers with "error" (then killed),
    so that the check records it among its rows instead of stopping at the first."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return {"error": f"no answer within {timeout_s:g} s", "stderr-tail": err[-1500:]}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {
            "error": f"exit status {proc.returncode}: {out[-500:]}",
            "stderr-tail": err[-1500:],
        }
    answer = dict(json.loads(lines[-1]))
    answer["stderr-tail"] = err[-1500:]
    return answer


def run(
    command: list[str], env: dict[str, str] | None = None, timeout_s: float = 120
) -> dict[str, Any]:
    return finish(start(command, env), timeout_s)
