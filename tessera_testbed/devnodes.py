"""Fake host /dev trees for the NRI hook: it reads device types and numbers from them."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path


def device_numbers(
    gpus: Iterable[int], uverbs: Iterable[int] = (), *, uvm_tools: bool = False
) -> dict[str, tuple[int, int]]:
    """Host path -> (major, minor) as NVIDIA's and the RDMA drivers number them: the control
    and UVM devices, /dev/nvidiaN per GPU minor, and with uverbs minors rdma_cm too."""
    nodes = {"/dev/nvidiactl": (195, 255), "/dev/nvidia-uvm": (508, 0)}
    if uvm_tools:
        nodes["/dev/nvidia-uvm-tools"] = (508, 1)
    nodes |= {f"/dev/nvidia{n}": (195, n) for n in gpus}
    verbs = {f"/dev/infiniband/uverbs{n}": (231, 192 + n) for n in uverbs}
    if verbs:
        nodes["/dev/infiniband/rdma_cm"] = (10, 58)
    return nodes | verbs


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
