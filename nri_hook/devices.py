"""The host's device nodes, read under a configurable root (the HostView of nri_hook.adjust).

In a DaemonSet the host's /dev (and /proc/driver/nvidia) are mounted under a root such
as /host; tests point the root at a scratch directory.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path

from nri_hook.adjust import DeviceNode

log = logging.getLogger(__name__)

NVIDIA_GPU_INFO_DIR = "proc/driver/nvidia/gpus"
"""Per-GPU directories (named by PCI bus ID) with an `information` file that lists
"GPU UUID:" and "Device Minor:"."""
GPU_INFO_TTL = 30.0


def parse_gpu_information(text: str) -> tuple[str, int] | None:
    """(UUID, minor) from a /proc/driver/nvidia/gpus/<bus>/information file."""
    uuid: str | None = None
    minor: int | None = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        value = value.strip()
        if key == "GPU UUID":
            uuid = value
        elif key == "Device Minor":
            try:
                minor = int(value)
            except ValueError:
                return None
    if uuid is None or minor is None:
        return None
    return uuid, minor


class HostDevices:
    """Looks up device nodes as `<root>/<path>` and the NVIDIA driver's GPU list."""

    def __init__(self, root: str | Path = "/") -> None:
        self.root = Path(root)
        self._prefix = str(self.root).rstrip("/")
        self._gpu_minors: dict[str, int] | None = None
        self._gpu_minors_at = float("-inf")

    def host_path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def device(self, path: str) -> DeviceNode | None:
        try:
            st = os.stat(self._prefix + "/" + path.lstrip("/"))
        except OSError:
            return None
        if stat.S_ISCHR(st.st_mode):
            kind = "c"
        elif stat.S_ISBLK(st.st_mode):
            kind = "b"
        else:
            return None
        return DeviceNode(
            path=path,
            type=kind,
            major=os.major(st.st_rdev),
            minor=os.minor(st.st_rdev),
            file_mode=st.st_mode & 0o777,
        )

    def exists(self, path: str) -> bool:
        return os.path.exists(self._prefix + "/" + path.lstrip("/"))

    def gpu_minors(self) -> Mapping[str, int] | None:
        """UUID -> minor from the driver, cached for GPU_INFO_TTL seconds; None when the
        driver's /proc files are not visible under the root."""
        now = time.monotonic()
        if now - self._gpu_minors_at > GPU_INFO_TTL:
            self._gpu_minors = self._read_gpu_minors()
            self._gpu_minors_at = now
        return self._gpu_minors

    def _read_gpu_minors(self) -> dict[str, int] | None:
        base = self.root / NVIDIA_GPU_INFO_DIR
        try:
            entries = sorted(base.iterdir())
        except OSError:
            return None
        found: dict[str, int] = {}
        for entry in entries:
            try:
                parsed = parse_gpu_information((entry / "information").read_text())
            except OSError:
                continue
            if parsed is None:
                log.warning("cannot read GPU UUID and minor from %s/information", entry)
                continue
            found[parsed[0]] = parsed[1]
        return found
