"""The interface every GPU backend implements (the choice among them at start:
backend_choice.py).

A backend discovers the node's GPUs once, then feeds health: `wait_events` blocks for XID
events (NVML's event set, or injected ones in the fake), and `query` asks one GPU whether it
still answers normally. `processes` says which processes use each GPU, with their memory
and, where the driver samples it, their share of the GPU's time (the usage loop's input).
RDMA NICs come from a `NicSource`: sysfs on a real node, the topology file for the fake
backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from tessera.errors import InputError, InventoryError, TesseraError
from tessera.model import Gpu, RdmaNic

BACKENDS = ("nvml", "fake", "auto")


class BackendError(TesseraError):
    """A backend cannot start (no NVML library, no driver, unreadable topology file)."""


class TopologyError(BackendError, InputError):
    """The topology file cannot be used at all (missing, unreadable, not a topology)."""


@dataclass(frozen=True)
class XidEvent:
    """A critical-error event. `uuid` None means "some GPU, unknown which" (for instance the
    event wait itself failed), which marks every GPU unhealthy, as NVIDIA's plugin does."""

    uuid: str | None
    xid: int
    detail: str = ""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process with a context on a GPU, as the driver reports it (host PID namespace)."""

    pid: int
    used_bytes: int | None
    """GPU memory the driver attributes to it; None where it does not say (MIG, WDDM)."""
    sm_percent: int | None = None
    """Its share of the GPU's time running kernels, in percent, over the last sample
    period; None where the driver took no sample of it."""
    mps_client: bool = False
    """A client of the MPS server (its memory is its own, its kernels run in the server)."""


@dataclass(frozen=True, slots=True)
class GpuProcesses:
    """What one GPU is running."""

    uuid: str
    processes: tuple[GpuProcess, ...] = ()
    error: str = ""
    """Why the list could not be read (then `processes` is empty and says nothing)."""


@dataclass
class GpuDiscovery:
    gpus: list[Gpu] = field(default_factory=list)
    errors: list[InventoryError] = field(default_factory=list)


class GpuBackend(Protocol):
    name: str

    def discover(self) -> GpuDiscovery:
        """Every GPU of the node; a GPU that cannot be read is an error, not a failure."""
        ...

    def wait_events(self, timeout_s: float) -> list[XidEvent]:
        """Block up to `timeout_s` for XID events; [] on timeout."""
        ...

    def query(self, uuid: str) -> str | None:
        """None if the GPU answers normally, else why not."""
        ...

    def processes(self) -> list[GpuProcesses]:
        """Per discovered GPU, the processes using it now; SM shares are those sampled since
        the previous call."""
        ...

    def close(self) -> None: ...


class NicSource(Protocol):
    def discover_nics(self) -> tuple[list[RdmaNic], list[InventoryError]]: ...

    def port_states(self, ibdev: str) -> tuple[str, ...]:
        """Raises InventoryError when the NIC's ports cannot be read."""
        ...
