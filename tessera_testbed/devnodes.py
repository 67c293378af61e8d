"""Fake host /dev trees for the NRI hook: it reads device types and numbers from them."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path


def make_device_nodes(root: Path, nodes: Mapping[str, tuple[int, int]]) -> Path:
    """Character devices `path -> (major, minor)` under `root` (paths as on the host): real
    device nodes where mknod is allowed (root), else links to /dev/null. Returns `root`."""
    for path, (major, minor) in nodes.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mknod(target, stat.S_IFCHR | 0o666, os.makedev(major, minor))
            os.chmod(target, 0o666)  # whatever the umask
        except PermissionError:
            target.symlink_to("/dev/null")
    return root
