"""Host paths that more than one node program must agree on: the NRI hook uses them, and
`tessera-node-check` checks that they are there."""

from __future__ import annotations

from typing import Final

NRI_SOCKET: Final = "/var/run/nri/nri.sock"
"""containerd's NRI socket (its `socket_path` default)."""
MPS_PIPE_DIR: Final = "/tmp/nvidia-mps"
"""nvidia-cuda-mps-control's default pipe directory (CUDA_MPS_PIPE_DIRECTORY)."""
