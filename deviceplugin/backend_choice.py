"""The GPU backend chosen at start: NVML, the fake one (a topology file), or NVML when it
answers and the topology file otherwise."""

from __future__ import annotations

import logging

from deviceplugin.backend import BACKENDS, BackendError, GpuBackend
from deviceplugin.fake_backend import FakeBackend
from deviceplugin.nvml_backend import NvmlBackend

log = logging.getLogger(__name__)


def open_backend(kind: str, topology: str | None, sysfs_root: str) -> GpuBackend:
    """The backend for `kind`: `nvml`, `fake` (needs a topology) or `auto` (NVML when its
    library loads and a driver answers, else the topology file when one is given)."""
    if kind == "nvml":
        return NvmlBackend(sysfs_root=sysfs_root)
    if kind == "fake":
        if not topology:
            raise BackendError("the fake backend needs --topology (a file or a built-in name)")
        return FakeBackend.from_topology(topology)
    if kind != "auto":
        raise BackendError(f"unknown backend {kind!r} (one of {', '.join(BACKENDS)})")
    try:
        return NvmlBackend(sysfs_root=sysfs_root)
    except BackendError as exc:
        if not topology:
            raise BackendError(f"{exc}; and no --topology to fall back on") from None
        log.warning("NVML unavailable (%s); using the fake backend with %s", exc, topology)
        return FakeBackend.from_topology(topology)
