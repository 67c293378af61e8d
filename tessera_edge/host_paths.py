"""Host paths that more than one node program must agree on: the NRI hook uses them, and
`tessera-node-check` checks that they are there."""

from __future__ import annotations

from typing import Final

NRI_SOCKET: Final = "/var/run/nri/nri.sock"
"""containerd's NRI socket (its `socket_path` default)."""
MPS_PIPE_DIR: Final = "/tmp/nvidia-mps"
"""nvidia-cuda-mps-control's default pipe directory (CUDA_MPS_PIPE_DIRECTORY)."""
MPS_PID_FILE: Final = "nvidia-cuda-mps-control.pid"
"""What the MPS control daemon keeps in its pipe directory while it runs (the directory
and its control socket outlive the daemon)."""
DEFAULT_HAMI_CORE_LIBRARY: Final = "/usr/local/vgpu/libvgpu.so"
"""Where HAMi's device plugin installs HAMi-core on the host (and tessera's manifests
expect it)."""


def mps_pid_file(pipe_dir: str) -> str:
    return f"{pipe_dir.rstrip('/')}/{MPS_PID_FILE}"
