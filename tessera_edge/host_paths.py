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
MPS_LOG_DIR: Final = "/var/log/nvidia-mps"
"""nvidia-cuda-mps-control's default log directory (CUDA_MPS_LOG_DIRECTORY)."""
MPS_ERROR_FILE: Final = "tessera-mps.error"
"""What tessera's MPS supervisor keeps in the pipe directory while it cannot run the daemon:
the one line that says why (the node agent reports it as the layer's reason)."""
DEFAULT_HAMI_CORE_LIBRARY: Final = "/usr/local/vgpu/libvgpu.so"
"""Where HAMi's device plugin installs HAMi-core on the host (and tessera's installer puts
the library the image carries)."""
HAMI_CORE_IMAGE_DIR: Final = "/opt/tessera/hami-core"
"""Where tessera's image carries the library of its own architecture and its stamp."""
HAMI_CORE_LIBRARY_NAME: Final = "libvgpu.so"


def mps_pid_file(pipe_dir: str) -> str:
    return f"{pipe_dir.rstrip('/')}/{MPS_PID_FILE}"


def mps_error_file(pipe_dir: str) -> str:
    return f"{pipe_dir.rstrip('/')}/{MPS_ERROR_FILE}"


def _beside(library: str, suffix: str) -> str:
    base = library[: -len(".so")] if library.endswith(".so") else library
    return base + suffix


def hami_core_stamp(library: str) -> str:
    """The version stamp tessera's installer keeps beside the library:
    /usr/local/vgpu/libvgpu.so -> /usr/local/vgpu/libvgpu.json."""
    return _beside(library, ".json")


def hami_core_install_error(library: str) -> str:
    """What tessera's installer keeps beside the library while its last install failed:
    the one line that says why (libvgpu.install-error)."""
    return _beside(library, ".install-error")


def under(root: str, path: str) -> str:
    """A host path as seen where the host's files are mounted at `root` ("/" or "/host")."""
    return path if root in ("", "/") else root.rstrip("/") + path


NRI_GATE_DESTINATION: Final = "/proc/tessera-nri-hook-did-not-adjust-this-container"
"""The fail-closed gate. The node agent's Allocate answer mounts `NRI_GATE_SOURCE` here
in every container the kubelet gives tessera devices; the NRI hook removes the mount from
each container it adjusts. runc refuses every mount inside /proc but a short list of
files, so a container created while the hook was away (disconnected, restarting, crashed)
fails to start, saying this name, and the kubelet retries it; it never runs without the
devices its allocation record grants."""
NRI_GATE_SOURCE: Final = "/dev/null"
"""What the gate mounts: harmless should any runtime ever take the mount, and present on
every host (containerd would create a missing source as an empty directory)."""
