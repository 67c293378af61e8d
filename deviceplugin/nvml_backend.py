"""The real GPU backend: NVML through the `pynvml` module of nvidia-ml-py.

Discovery, per GPU: UUID, index, minor number, name, total memory, PCI bus ID, MIG mode and
active NVLinks through NVML; NUMA node, PCIe root complex and nearest switch through sysfs
for the bus ID (NVML reports an 8-digit PCI domain, sysfs a 4-digit one; both are
normalised). NVLink peers: a link whose far end is another GPU counts toward that pair; a
link into an NVSwitch counts toward every pair of switch-attached GPUs (two GPUs with 18
switch links each get 18 links between them, as `nvidia-smi topo -m` shows NV18).

Health: an NVML event set registered for critical XID events, waited on with a timeout, and
a periodic query per GPU (handle by UUID, then memory info); any error other than "not
supported" is an unhealthy sign.

The module object is injectable so tests drive this code with a stand-in that mimics
pynvml's return types and exceptions, including older releases that return bytes.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from deviceplugin.backend import (
    BackendError,
    GpuDiscovery,
    GpuProcess,
    GpuProcesses,
    XidEvent,
)
from deviceplugin.inventory import DriverVersions
from deviceplugin.sysfs import Sysfs
from tessera.errors import InventoryError
from tessera.model import Gpu, PciDevice, normalize_bus_id

log = logging.getLogger(__name__)

_MIB = 1024 * 1024


def _text(value: Any) -> str:
    """pynvml returns str in current releases and bytes in older ones."""
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode("utf-8", "replace").strip()
    return str(value).strip()


class _CallError(Exception):
    """Private control flow: one failed NVML call, caught in this module and recorded as
    a device's health or discovery problem; never leaves it, so outside the tree."""

    def __init__(self, call: str, error: Exception) -> None:
        super().__init__(f"{call}: {error}")
        self.call = call
        self.error = error


class NvmlBackend:
    name = "nvml"

    def __init__(self, nvml: Any = None, sysfs_root: str | Path = "/sys") -> None:
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError:
                raise BackendError("the pynvml module (nvidia-ml-py) is not installed") from None
        self._nvml = nvml
        self._error: type[Exception] = nvml.NVMLError
        try:
            nvml.nvmlInit()
        except self._error as exc:
            raise BackendError(f"NVML did not initialise: {exc}") from None
        except OSError as exc:  # some releases let the loader's error through
            raise BackendError(f"NVML library could not be loaded: {exc}") from None
        self._sysfs = Sysfs(sysfs_root)
        self._handles: dict[str, Any] = {}
        self._event_set: Any = None
        self._sm_seen: dict[str, int] = {}
        """Per GPU, the driver's timestamp (µs) of the newest SM sample read."""
        self._closed = False

    # --- helpers ------------------------------------------------------------------------------

    def _code(self, exc: Exception) -> int | None:
        value = getattr(exc, "value", None)
        return value if isinstance(value, int) else None

    def _is(self, exc: Exception, constant: str) -> bool:
        return self._code(exc) == getattr(self._nvml, constant, object())

    def _call(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, fn)(*args)
        except self._error as exc:
            raise _CallError(fn, exc) from None

    # --- discovery ----------------------------------------------------------------------------

    def _minor(self, handle: Any, index: int) -> int:
        try:
            return int(self._nvml.nvmlDeviceGetMinorNumber(handle))
        except self._error as exc:
            if not self._is(exc, "NVML_ERROR_NOT_SUPPORTED"):
                raise _CallError("nvmlDeviceGetMinorNumber", exc) from None
            log.warning("GPU %d reports no minor number; using its index", index)
            return index

    def _mig_enabled(self, handle: Any) -> bool:
        try:
            current = self._nvml.nvmlDeviceGetMigMode(handle)[0]
        except self._error:
            return False  # NOT_SUPPORTED on GPUs without MIG
        return bool(current == getattr(self._nvml, "NVML_DEVICE_MIG_ENABLE", 1))

    def _bus_id(self, handle: Any) -> str:
        pci = self._call("nvmlDeviceGetPciInfo", handle)
        raw = _text(getattr(pci, "busId", "")) or _text(getattr(pci, "busIdLegacy", ""))
        return normalize_bus_id(raw)

    def _read_gpu(self, index: int) -> tuple[Any, Gpu]:
        handle = self._call("nvmlDeviceGetHandleByIndex", index)
        uuid = _text(self._call("nvmlDeviceGetUUID", handle))
        model = _text(self._call("nvmlDeviceGetName", handle))
        memory = int(self._call("nvmlDeviceGetMemoryInfo", handle).total) // _MIB
        try:
            bus = self._bus_id(handle)
        except ValueError as exc:
            raise _CallError("nvmlDeviceGetPciInfo", exc) from None
        gpu = Gpu(
            uuid=uuid,
            index=index,
            minor=self._minor(handle, index),
            model=model,
            memory_mib=memory,
            pci_bus_id=bus,
            mig_enabled=self._mig_enabled(handle),
        )
        return handle, gpu

    def _nvlink_ends(self, handle: Any, gpu_by_bus: dict[str, str]) -> tuple[dict[str, int], int]:
        """Active links of one GPU: (direct links per peer UUID, links into NVSwitches)."""
        direct: dict[str, int] = {}
        switch = 0
        gpu_type = getattr(self._nvml, "NVML_NVLINK_DEVICE_TYPE_GPU", 0)
        switch_type = getattr(self._nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
        enabled = getattr(self._nvml, "NVML_FEATURE_ENABLED", 1)
        for link in range(int(getattr(self._nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = self._nvml.nvmlDeviceGetNvLinkState(handle, link)
            except self._error as exc:
                if self._is(exc, "NVML_ERROR_NOT_SUPPORTED"):
                    break  # no NVLink on this GPU
                continue  # a link index past the last one, or a link that cannot be read
            if state != enabled:
                continue
            try:
                remote = self._nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
                far = normalize_bus_id(_text(getattr(remote, "busId", "")))
            except (ValueError, self._error):
                continue
            far_type: int | None
            try:
                far_type = int(self._nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
            except (AttributeError, self._error):
                far_type = None  # older drivers: decide by bus ID alone
            if far in gpu_by_bus and far_type in (None, gpu_type):
                peer = gpu_by_bus[far]
                direct[peer] = direct.get(peer, 0) + 1
            elif far_type == switch_type or (far_type is None and far not in gpu_by_bus):
                switch += 1
        return direct, switch

    def discover(self) -> GpuDiscovery:
        result = GpuDiscovery()
        try:
            count = int(self._call("nvmlDeviceGetCount"))
        except _CallError as exc:
            result.errors.append(InventoryError("nvml", exc.call, str(exc.error)))
            return result
        read: list[tuple[Any, Gpu]] = []
        for index in range(count):
            try:
                read.append(self._read_gpu(index))
            except _CallError as exc:
                result.errors.append(InventoryError(f"nvml:gpu{index}", exc.call, str(exc.error)))
        gpu_by_bus = {gpu.pci_bus_id: gpu.uuid for _, gpu in read}
        index_of = {gpu.uuid: gpu.index for _, gpu in read}
        ends = {gpu.uuid: self._nvlink_ends(handle, gpu_by_bus) for handle, gpu in read}
        for handle, gpu in read:
            links = dict(ends[gpu.uuid][0])
            mine = ends[gpu.uuid][1]
            for other, (_, theirs) in ends.items():
                if other != gpu.uuid and mine and theirs:
                    links[other] = links.get(other, 0) + min(mine, theirs)
            try:
                location = self._sysfs.pci_location(gpu.pci_bus_id)
            except InventoryError as exc:
                result.errors.append(exc)
                location = PciDevice(pci_bus_id=gpu.pci_bus_id)
            self._handles[gpu.uuid] = handle
            nvlinks = tuple(sorted((index_of[peer], n) for peer, n in links.items()))
            result.gpus.append(replace(gpu.placed(location), nvlinks=nvlinks))
        return result

    # --- health -------------------------------------------------------------------------------

    def _ensure_event_set(self) -> Any:
        if self._event_set is not None:
            return self._event_set
        event_set = self._call("nvmlEventSetCreate")
        xid_type = int(self._nvml.nvmlEventTypeXidCriticalError)
        for uuid, handle in self._handles.items():
            try:
                supported = int(self._nvml.nvmlDeviceGetSupportedEventTypes(handle))
                if not supported & xid_type:
                    log.warning("GPU %s reports no XID events; only queries watch it", uuid)
                    continue
                self._nvml.nvmlDeviceRegisterEvents(handle, xid_type, event_set)
            except self._error as exc:
                log.warning("GPU %s: no XID events (%s); only queries watch it", uuid, exc)
        self._event_set = event_set
        return event_set

    def wait_events(self, timeout_s: float) -> list[XidEvent]:
        try:
            event_set = self._ensure_event_set()
            data = self._nvml.nvmlEventSetWait(event_set, max(1, int(timeout_s * 1000)))
        except _CallError as exc:
            return [XidEvent(None, 0, f"NVML event set: {exc}")]
        except self._error as exc:
            if self._is(exc, "NVML_ERROR_TIMEOUT"):
                return []
            return [XidEvent(None, 0, f"NVML event wait failed: {exc}")]
        if int(data.eventType) != int(self._nvml.nvmlEventTypeXidCriticalError):
            return []
        try:
            uuid: str | None = _text(self._nvml.nvmlDeviceGetUUID(data.device))
        except self._error:
            uuid = None
        xid = int(data.eventData)
        return [XidEvent(uuid, xid, f"XID {xid}")]

    def query(self, uuid: str) -> str | None:
        try:
            try:
                handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
            except TypeError:  # releases before 11.515 take bytes here
                handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid.encode())
            self._nvml.nvmlDeviceGetMemoryInfo(handle)
        except self._error as exc:
            if self._is(exc, "NVML_ERROR_NOT_SUPPORTED"):
                return None
            return f"NVML query failed: {exc}"
        return None

    # --- usage --------------------------------------------------------------------------------

    def _listed(self, fn: str, handle: Any) -> list[Any]:
        """An optional process list: [] where the driver or the library lacks it."""
        call = getattr(self._nvml, fn, None)
        if call is None:
            return []
        try:
            return list(call(handle) or [])
        except self._error:
            return []

    def _sm_shares(self, uuid: str, handle: Any) -> dict[int, int]:
        """pid -> mean SM share (%) of the samples newer than the last read. The driver
        answers NOT_FOUND when there is no new sample, which is not an error."""
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(handle, self._sm_seen.get(uuid, 0))
        except (self._error, AttributeError):
            return {}
        sums: dict[int, list[int]] = {}
        newest = self._sm_seen.get(uuid, 0)
        for sample in samples or []:
            pid, stamp, share = int(sample.pid), int(sample.timeStamp), int(sample.smUtil)
            newest = max(newest, stamp)
            if 0 <= share <= 100:
                total = sums.setdefault(pid, [0, 0])
                total[0] += share
                total[1] += 1
        self._sm_seen[uuid] = newest
        return {pid: round(total / n) for pid, (total, n) in sums.items()}

    def processes(self) -> list[GpuProcesses]:
        out: list[GpuProcesses] = []
        for uuid, handle in self._handles.items():
            try:
                compute = list(self._call("nvmlDeviceGetComputeRunningProcesses", handle) or [])
            except _CallError as exc:
                out.append(GpuProcesses(uuid, error=str(exc)))
                continue
            shares = self._sm_shares(uuid, handle)
            seen: dict[int, GpuProcess] = {}
            lists = (
                (compute, False),
                (self._listed("nvmlDeviceGetGraphicsRunningProcesses", handle), False),
                (self._listed("nvmlDeviceGetMPSComputeRunningProcesses", handle), True),
            )
            for entries, listed_as_client in lists:
                for entry in entries:
                    client = listed_as_client
                    pid = int(entry.pid)
                    raw = getattr(entry, "usedGpuMemory", None)
                    used = int(raw) if isinstance(raw, int) and 0 <= raw < 1 << 63 else None
                    before = seen.get(pid)
                    if before is not None:  # the same process in two lists: one context
                        known = [u for u in (used, before.used_bytes) if u is not None]
                        used = max(known) if known else None
                        client = client or before.mps_client
                    seen[pid] = GpuProcess(pid, used, shares.get(pid), client)
            out.append(GpuProcesses(uuid, tuple(seen[p] for p in sorted(seen))))
        return out

    def versions(self) -> DriverVersions:
        """Driver and supported CUDA versions (for the GFD labels); "" where NVML fails."""
        nvml = self._nvml
        driver = cuda = ""
        with contextlib.suppress(self._error, AttributeError):
            driver = _text(nvml.nvmlSystemGetDriverVersion())
        try:
            number = int(nvml.nvmlSystemGetCudaDriverVersion())  # e.g. 12040 for 12.4
            cuda = f"{number // 1000}.{number % 1000 // 10}" if number > 0 else ""
        except (self._error, AttributeError, TypeError, ValueError):
            pass
        return DriverVersions(driver, cuda)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._event_set is not None:
                self._nvml.nvmlEventSetFree(self._event_set)
            self._nvml.nvmlShutdown()
        except self._error as exc:
            log.debug("NVML shutdown: %s", exc)
