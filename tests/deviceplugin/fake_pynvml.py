"""A stand-in for the `pynvml` module (nvidia-ml-py) with the calls the NVML backend makes.

It mimics pynvml where the backend could go wrong: errors are `NVMLError` subclasses created
from the numeric code (`NVMLError(3)` is an `NVMLError_NotSupported` with `.value == 3`, as
pynvml's `__new__` does); structures are objects with attributes; names and bus IDs are `str`
in current releases and `bytes` in older ones (`legacy=True`), where
`nvmlDeviceGetHandleByUUID` also wants bytes. Bus IDs use NVML's 8-digit domain in capitals
("00000000:18:00.0"). Constants have pynvml's names and values, functions pynvml's parameter
names (mixedCase where pynvml's are): test_fake_pynvml_matches.py holds the stand-in to the
installed pynvml.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02

# pynvml's own (mixedCase) names
nvmlEventTypeSingleBitEccError = 0x1  # noqa: N816
nvmlEventTypeDoubleBitEccError = 0x2  # noqa: N816
nvmlEventTypeXidCriticalError = 0x8  # noqa: N816
nvmlEventTypeClock = 0x10  # noqa: N816

_NAMES = {
    NVML_ERROR_UNINITIALIZED: ("Uninitialized", "Uninitialized"),
    NVML_ERROR_INVALID_ARGUMENT: ("InvalidArgument", "Invalid Argument"),
    NVML_ERROR_NOT_SUPPORTED: ("NotSupported", "Not Supported"),
    NVML_ERROR_NO_PERMISSION: ("NoPermission", "Insufficient Permissions"),
    NVML_ERROR_NOT_FOUND: ("NotFound", "Not Found"),
    NVML_ERROR_DRIVER_NOT_LOADED: ("DriverNotLoaded", "Driver Not Loaded"),
    NVML_ERROR_TIMEOUT: ("Timeout", "Timeout"),
    NVML_ERROR_LIBRARY_NOT_FOUND: ("LibraryNotFound", "NVML Shared Library Not Found"),
    NVML_ERROR_GPU_IS_LOST: ("GpuIsLost", "GPU is lost"),
    NVML_ERROR_UNKNOWN: ("Unknown", "Unknown Error"),
}


class NVMLError(Exception):
    _classes: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        klass = NVMLError._classes.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(klass)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return _NAMES.get(self.value, ("", f"NVML Error with code {self.value}"))[1]


for _code, (_name, _) in _NAMES.items():
    _cls = type(f"NVMLError_{_name}", (NVMLError,), {})
    NVMLError._classes[_code] = _cls
    globals()[f"NVMLError_{_name}"] = _cls


@dataclass
class PciInfo:
    busId: Any
    busIdLegacy: Any = ""
    domain: int = 0
    bus: int = 0
    device: int = 0


@dataclass
class Memory:
    total: int
    free: int
    used: int


@dataclass
class EventData:
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class ProcessInfo:
    """pynvml's friendly object for c_nvmlProcessInfo_v3_t (usedGpuMemory None where the
    driver does not say)."""

    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class ProcessUtilizationSample:
    pid: int
    timeStamp: int
    smUtil: int
    memUtil: int = 0
    encUtil: int = 0
    decUtil: int = 0


@dataclass
class FakeGpu:
    uuid: str
    name: str
    bus_id: str
    """NVML form: "00000000:18:00.0"."""
    memory_mib: int
    minor: int | None = None
    mig: int | None = None
    """Current MIG mode; None means the GPU has no MIG (NOT_SUPPORTED)."""
    links: list[tuple[str, int] | None] | None = None
    """Per link: (remote bus ID, remote device type) when active, None when inactive; the
    whole list None means no NVLink at all (every link call raises NOT_SUPPORTED)."""
    supported_events: int = nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError
    fail: dict[str, int] = field(default_factory=dict)
    """Function name -> NVML error code it raises for this GPU."""
    compute: list[ProcessInfo] = field(default_factory=list)
    graphics: list[ProcessInfo] = field(default_factory=list)
    mps: list[ProcessInfo] = field(default_factory=list)
    samples: list[ProcessUtilizationSample] = field(default_factory=list)
    """What the driver sampled; a call returns those newer than its timestamp, and
    NOT_FOUND when there are none, as the driver does."""


@dataclass(frozen=True)
class Handle:
    index: int


class FakeNvml:
    """Use an instance where the `pynvml` module would go (the backend calls attributes)."""

    def __init__(self, gpus: list[FakeGpu], legacy: bool = False) -> None:
        self.gpus = gpus
        self.legacy = legacy
        self.init_error: int | None = None
        self.initialized = False
        self.events: list[EventData | int] = []
        """What the next nvmlEventSetWait calls return (an int: raise that error code)."""
        self.registered: list[tuple[int, int]] = []
        self.calls: list[str] = []
        # pynvml's module attributes
        for key, value in globals().items():
            if key.startswith(("NVML_", "nvmlEventType", "NVMLError")):
                setattr(self, key, value)

    def _text(self, value: str) -> Any:
        return value.encode() if self.legacy else value

    def _gpu(self, handle: Handle, call: str) -> FakeGpu:
        self.calls.append(call)
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        gpu = self.gpus[handle.index]
        if call in gpu.fail:
            raise NVMLError(gpu.fail[call])
        return gpu

    # --- processes ------------------------------------------------------------------------

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[ProcessInfo]:
        return list(self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses").compute)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Handle) -> list[ProcessInfo]:
        return list(self._gpu(handle, "nvmlDeviceGetGraphicsRunningProcesses").graphics)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Handle) -> list[ProcessInfo]:
        return list(self._gpu(handle, "nvmlDeviceGetMPSComputeRunningProcesses").mps)

    def nvmlDeviceGetProcessUtilization(
        self,
        handle: Handle,
        timeStamp: int,  # noqa: N803
    ) -> list[ProcessUtilizationSample]:
        gpu = self._gpu(handle, "nvmlDeviceGetProcessUtilization")
        newer = [s for s in gpu.samples if s.timeStamp > timeStamp]
        if not newer:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return newer

    # --- library --------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    driver_version = "550.54.15"
    cuda_version = 12040

    def nvmlSystemGetDriverVersion(self) -> Any:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return self._text(self.driver_version)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return self.cuda_version

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self._gpu(Handle(index), "nvmlDeviceGetHandleByIndex")
        return Handle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: Any) -> Handle:
        if self.legacy and isinstance(uuid, str):
            raise TypeError("bytes or integer address expected instead of str instance")
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, gpu in enumerate(self.gpus):
            if gpu.uuid == text:
                self._gpu(Handle(i), "nvmlDeviceGetHandleByUUID")
                return Handle(i)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    # --- device ---------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Handle) -> Any:
        return self._text(self._gpu(handle, "nvmlDeviceGetUUID").uuid)

    def nvmlDeviceGetName(self, handle: Handle) -> Any:
        return self._text(self._gpu(handle, "nvmlDeviceGetName").name)

    def nvmlDeviceGetMinorNumber(self, handle: Handle) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetMinorNumber")
        return handle.index if gpu.minor is None else gpu.minor

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> Memory:
        # a version asks for nvmlMemory_v2 (with `reserved`); the backend asks for v1
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        total = gpu.memory_mib * 1024 * 1024
        return Memory(total=total, free=total - 512 * 1024 * 1024, used=512 * 1024 * 1024)

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> PciInfo:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        legacy_form = gpu.bus_id[4:]  # "0000:18:00.0"
        return PciInfo(busId=self._text(gpu.bus_id), busIdLegacy=self._text(legacy_form))

    def nvmlDeviceGetMigMode(self, device: Handle) -> list[int]:
        gpu = self._gpu(device, "nvmlDeviceGetMigMode")
        if gpu.mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig, gpu.mig]

    def _link(self, handle: Handle, link: int, call: str) -> tuple[str, int] | None:
        gpu = self._gpu(handle, call)
        if gpu.links is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(gpu.links):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.links[link]

    def nvmlDeviceGetNvLinkState(self, device: Handle, link: int) -> int:
        far = self._link(device, link, "nvmlDeviceGetNvLinkState")
        return NVML_FEATURE_ENABLED if far is not None else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Handle, link: int) -> PciInfo:
        far = self._link(device, link, "nvmlDeviceGetNvLinkRemotePciInfo")
        if far is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return PciInfo(busId=self._text(far[0]))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Handle, link: int) -> int:
        far = self._link(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType")
        if far is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return far[1]

    # --- events ---------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetSupportedEventTypes").supported_events

    def nvmlDeviceRegisterEvents(self, handle: Handle, eventTypes: int, eventSet: str) -> None:  # noqa: N803
        self._gpu(handle, "nvmlDeviceRegisterEvents")
        self.registered.append((handle.index, eventTypes))

    def nvmlEventSetWait(self, eventSet: str, timeoutms: int) -> EventData:  # noqa: N803
        if not self.events:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        event = self.events.pop(0)
        if isinstance(event, int):
            raise NVMLError(event)
        return event

    def nvmlEventSetFree(self, eventSet: str) -> None:  # noqa: N803
        pass
