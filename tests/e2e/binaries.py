"""Where the real Kubernetes and containerd binaries are.

One folder (`TESSERA_E2E_BIN`) holding them under their release names, or one variable
per binary (which wins over the folder). A suite that lacks one skips with a single line
naming what it needs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

FOLDER_VAR = "TESSERA_E2E_BIN"
VARS = {
    "etcd": "TESSERA_E2E_ETCD",
    "kube-apiserver": "TESSERA_E2E_KUBE_APISERVER",
    "kube-scheduler": "TESSERA_E2E_KUBE_SCHEDULER",
    "kubelet": "TESSERA_E2E_KUBELET",
    "runc": "TESSERA_E2E_RUNC",
}
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-scheduler")
CONTAINERD_VAR = "TESSERA_E2E_CONTAINERD_DIRS"
"""Colon-separated folders each holding one containerd release (containerd,
containerd-shim-runc-v2, ctr); default: every `containerd-*` folder under the bin folder."""


def find(name: str) -> Path | None:
    """The executable `name`, or None."""
    explicit = os.environ.get(VARS.get(name, ""), "")
    candidates = [Path(explicit)] if explicit else []
    folder = os.environ.get(FOLDER_VAR, "")
    if folder:
        candidates.append(Path(folder) / name)
    if name == "runc" and shutil.which("runc"):
        candidates.append(Path(str(shutil.which("runc"))))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def missing(*names: str) -> str:
    """'' when every named binary is found, else one line saying what to set."""
    absent = [n for n in names if find(n) is None]
    if not absent:
        return ""
    how = ", ".join(f"{n} (${VARS[n]})" for n in absent)
    return f"e2e needs {how}, or ${FOLDER_VAR} naming a folder with them"


def skip_module_unless(*names: str) -> None:
    """Skip the calling test module, with one line, unless every named binary is found."""
    reason = missing(*names)
    if reason:
        pytest.skip(reason, allow_module_level=True)


def require(*names: str) -> dict[str, Path]:
    """Every named binary, or a skip naming the missing ones and how to give them."""
    reason = missing(*names)
    if reason:
        pytest.skip(reason)
    return {n: p for n in names if (p := find(n)) is not None}


def containerd_releases() -> list[Path]:
    """Folders with containerd, containerd-shim-runc-v2 and ctr, oldest release first."""
    listed = os.environ.get(CONTAINERD_VAR, "")
    if listed:
        folders = [Path(p) for p in listed.split(":") if p]
    else:
        base = os.environ.get(FOLDER_VAR, "")
        folders = sorted(Path(base).glob("containerd-*")) if base else []
    return [
        f
        for f in folders
        if all((f / b).is_file() for b in ("containerd", "containerd-shim-runc-v2", "ctr"))
    ]


CNI_VAR = "TESSERA_E2E_CNI_BIN"
CNI_PLUGINS = ("bridge", "host-local", "loopback")
"""The CNI plugins the node suite's pod network uses: a bridge without an address on the
host (nothing routed, nothing forwarded), host-local addresses, and the loopback that
containerd sets up in every pod."""
CNI_DEFAULT_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
"""Debian's containernetworking-plugins package, and the upstream release's usual place."""


def cni_plugins() -> Path | None:
    """The folder holding every plugin of CNI_PLUGINS ($TESSERA_E2E_CNI_BIN first), or None."""
    explicit = os.environ.get(CNI_VAR, "")
    for folder in [Path(explicit)] if explicit else [Path(d) for d in CNI_DEFAULT_DIRS]:
        if all(os.access(folder / p, os.X_OK) for p in CNI_PLUGINS):
            return folder
    return None
