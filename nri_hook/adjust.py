"""From the allocation record to a container adjustment. Pure: no I/O.

The host is consulted only through a `HostView` (device-node lookup and, where the
NVIDIA driver exposes it, the UUID -> minor map), so every decision here is a function of
its inputs and is unit-tested without a GPU.

What a container named in the record gets (docs/nri_hook.md has the full story):
- GPUs: /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools, /dev/nvidia-modeset (those
  the host has) and /dev/nvidia<minor> per GPU; NVIDIA_VISIBLE_DEVICES=<uuid,...> in
  record order; the sharing limits for the isolation layer (see `isolation_env`).
- RDMA: /dev/infiniband/rdma_cm and the uverbs device of each NIC, or of its VFs when the
  grant has VFs.
Device type, major, minor and permission bits come from the host's device nodes; a
device the record names but the host lacks is an error, never silently skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final, Protocol

from nri_hook.errors import RejectError, status_of
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.errors import IntegrityError, RecordError, RecordMismatchError
from tessera.isolation import LAYER_HAMI_CORE, LAYER_MPS, LAYER_NONE, LAYERS
from tessera.record import Keyring, decode
from tessera_edge.host_paths import MPS_PIPE_DIR, NRI_GATE_DESTINATION, mps_pid_file
from tessera_ttrpc import Code

ISOLATION_NONE: Final = LAYER_NONE
ISOLATION_MPS: Final = LAYER_MPS
ISOLATION_HAMI_CORE: Final = LAYER_HAMI_CORE
ISOLATION_LAYERS: Final = LAYERS

NVIDIA_CONTROL_DEVICE: Final = "/dev/nvidiactl"
"""Present wherever the NVIDIA driver is loaded."""
NVIDIA_CONTROL_DEVICES: Final = (
    NVIDIA_CONTROL_DEVICE,
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
RDMA_CM_DEVICE: Final = "/dev/infiniband/rdma_cm"
DEFAULT_MPS_PIPE_DIR: Final = MPS_PIPE_DIR

VISIBLE_DEVICES_ENV: Final = "NVIDIA_VISIBLE_DEVICES"
MPS_PIPE_ENV: Final = "CUDA_MPS_PIPE_DIRECTORY"
MPS_THREADS_ENV: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_MEMORY_ENV: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
HAMI_MEMORY_ENV_PREFIX: Final = "CUDA_DEVICE_MEMORY_LIMIT_"
HAMI_SM_ENV_PREFIX: Final = "CUDA_DEVICE_SM_LIMIT_"
HAMI_CACHE_ENV: Final = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
HAMI_CACHE_DIR: Final = "/run/tessera-vgpu"
"""Where the container's own HAMi-core region lives: a tmpfs the hook mounts per container.
HAMi-core's default, /tmp/cudevshr.cache, is shared by every container that shares /tmp (an
emptyDir), which then share one set of limits and one usage count, and cannot be created at
all under readOnlyRootFilesystem (the library then exits the process)."""
HAMI_CACHE_FILE: Final = f"{HAMI_CACHE_DIR}/cudevshr.cache"
HAMI_CACHE_TMPFS_OPTIONS: Final = ("nosuid", "nodev", "noexec", "mode=1777", "size=8m")
"""The region is about 2 MiB (1,024 process slots); mode 1777 lets any user of the
container create it, as /tmp would."""
CUDA_ORDER_ENV: Final = "CUDA_DEVICE_ORDER"
PRELOAD_ENV: Final = "LD_PRELOAD"

# gRPC status codes the runtime gets back (tessera_ttrpc.Code, repeated here so that this
# module stays free of the transport).
CODE_INVALID_ARGUMENT: Final = Code.INVALID_ARGUMENT
CODE_PERMISSION_DENIED: Final = Code.PERMISSION_DENIED
CODE_FAILED_PRECONDITION: Final = Code.FAILED_PRECONDITION


def gpu_device_path(minor: int) -> str:
    return f"/dev/nvidia{minor}"


def uverbs_device_path(minor: int) -> str:
    """The uverbs character device of an RDMA device; `minor` is N in uverbsN."""
    return f"/dev/infiniband/uverbs{minor}"


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device node as the host has it."""

    path: str
    """Path in the container, which is also the path on the host (under the device root)."""
    type: str
    """"c" (character) or "b" (block)."""
    major: int
    minor: int
    file_mode: int
    """Permission bits only (e.g. 0o666), never the file-type bits."""


@dataclass(frozen=True, slots=True)
class Mount:
    destination: str
    source: str
    type: str = "bind"
    options: tuple[str, ...] = ("rbind", "rw")


@dataclass(frozen=True, slots=True)
class Adjustment:
    """What to add to one container."""

    devices: tuple[DeviceNode, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[Mount, ...] = ()
    gpus: tuple[str, ...] = ()
    """UUIDs of the GPUs given (for logs)."""
    rdma: tuple[str, ...] = ()
    """RDMA devices given, as "ibdev" or "ibdev/vf-ibdev" (for logs)."""
    shares: int = 0
    """GPUs given only in part (compute share below 100): what an isolation layer limits."""
    without_layer: str = ""
    """Why a container given only whole GPUs runs without the isolation layer (the layer
    is not on the node, or cannot serve it); empty when the layer applies. Whole GPUs need
    no limit, so they are given anyway; a container with a share is refused instead."""
    ungate: bool = False
    """Remove the fail-closed gate mount (`NRI_GATE_DESTINATION`) the node agent put in."""

    @property
    def empty(self) -> bool:
        return not (self.devices or self.env or self.mounts or self.ungate)


UNGATE_ONLY: Final = Adjustment(ungate=True)
"""Only the gate removed: a container that runs without devices by the operator's choice
(--on-invalid-record=warn)."""
REMOVAL_PREFIX: Final = "-"
"""NRI's marker for removing, rather than adding, a mount (by its destination)."""


def gated(mount_destinations: Iterable[str]) -> bool:
    """Whether a container carries the fail-closed gate: the kubelet gave it tessera
    devices (the node agent's Allocate answer mounts the gate in each such container)."""
    return NRI_GATE_DESTINATION in mount_destinations


def open_gate(plan: Adjustment | None, is_gated: bool) -> Adjustment | None:
    """The plan of a container the record names, with the gate removed when it has one.
    A container the record does not name (None) keeps its gate: only a container whose
    record was applied may start."""
    if plan is None or not is_gated:
        return plan
    return replace(plan, ungate=True)


@dataclass(frozen=True, slots=True)
class Settings:
    isolation: str = ISOLATION_NONE
    mps_pipe_dir: str = DEFAULT_MPS_PIPE_DIR
    hami_core_library: str = ""
    """Host path of HAMi-core's libvgpu.so to mount and preload; empty: the image or the
    node provides it."""
    mps_client_uid: int | None = 0
    """The Linux user MPS serves (--mps-client-user); None: every user (the daemon runs in
    multi-user mode)."""

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATION_LAYERS:
            raise ValueError(
                f"unknown isolation layer {self.isolation!r} (one of {', '.join(ISOLATION_LAYERS)})"
            )


@dataclass(frozen=True, slots=True)
class ContainerUser:
    """Who a container's processes run as, as the runtime tells the hook (NRI's
    Container.user, API 0.11 and later; older runtimes do not say)."""

    uid: int
    own_user_namespace: bool = False
    """The pod has a user namespace of its own (hostUsers: false): outside it, where MPS
    looks, the container's uid is another one."""


class HostView(Protocol):
    def device(self, path: str) -> DeviceNode | None:
        """The device node at `path` on the host, None when missing or not a device."""
        ...

    def gpu_minors(self) -> Mapping[str, int] | None:
        """GPU UUID -> device minor as the driver reports it; None when the host does not
        expose the information (then the minor in the record is taken as given)."""
        ...

    def exists(self, path: str) -> bool:
        """Whether the host has a file or directory at `path` (a mount source, or the file
        that shows a daemon runs)."""
        ...


def decode_record(
    text: str,
    keyring: Keyring | None,
    *,
    require_integrity: bool,
    pod_uid: str,
    node: str,
    namespace: str | None = None,
    name: str | None = None,
) -> PodAllocation:
    """Decode and verify the record. Raises RejectError saying what is wrong."""
    try:
        return decode(
            text,
            keyring,
            require_integrity=require_integrity,
            pod_uid=pod_uid,
            node=node,
            namespace=namespace,
            name=name,
        )
    except IntegrityError as exc:
        raise RejectError(
            status_of(exc), f"allocation record integrity check failed: {exc}"
        ) from None
    except RecordMismatchError as exc:
        raise RejectError(status_of(exc), f"allocation record belongs elsewhere: {exc}") from None
    except RecordError as exc:
        raise RejectError(status_of(exc), f"invalid allocation record: {exc}") from None
    except Exception as exc:
        # The annotation is anyone's text: whatever the decoder trips over (deep nesting,
        # a proof that is not ASCII, ...) is a bad record of that pod, never our failure.
        raise RejectError(
            status_of(RecordError),
            f"invalid allocation record: {type(exc).__name__}: {_clip(str(exc))}",
        ) from None


MAX_REASON_CHARS: Final = 300
"""Longest decoder message quoted in a status or log line; the record is hostile text."""


def _clip(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS] + "..."


def plan_container(
    alloc: PodAllocation,
    container: str,
    settings: Settings,
    host: HostView,
    user: ContainerUser | None = None,
) -> Adjustment | None:
    """The adjustment for `container`; None when the record does not name it. `user` is
    who its processes run as, when the runtime said.

    Raises RejectError when the record names a device this host does not have, or gives
    the container part of a GPU that the isolation layer cannot limit for it.
    """
    for i, entry in enumerate(alloc.containers):
        if entry.name == container:
            return _plan(entry, f"record.containers[{i}]", settings, host, user)
    return None


def _plan(
    entry: ContainerAllocation,
    where: str,
    settings: Settings,
    host: HostView,
    user: ContainerUser | None,
) -> Adjustment:
    devices: dict[str, DeviceNode] = {}
    env: list[tuple[str, str]] = []
    mounts: list[Mount] = []
    shares = sum(1 for g in entry.gpus if g.core < 100)
    without_layer = ""

    def need(path: str, what: str) -> None:
        node = host.device(path)
        if node is None:
            raise RejectError(
                CODE_FAILED_PRECONDITION,
                f"{what}: device node {path} is missing on this node (or is not a device)",
            )
        devices.setdefault(path, node)

    if entry.gpus:
        for path in NVIDIA_CONTROL_DEVICES:
            node = host.device(path)
            if node is not None:
                devices[path] = node
        minors = host.gpu_minors()
        for i, gpu in enumerate(entry.gpus):
            what = f"{where}.gpus[{i}] (GPU {gpu.uuid}, minor {gpu.minor})"
            if minors is not None:
                actual = minors.get(gpu.uuid)
                if actual is None:
                    raise RejectError(
                        CODE_FAILED_PRECONDITION, f"{what}: this node has no GPU with that UUID"
                    )
                if actual != gpu.minor:
                    raise RejectError(
                        CODE_FAILED_PRECONDITION,
                        f"{what}: on this node that GPU has minor {actual}",
                    )
            need(gpu_device_path(gpu.minor), what)
        env.append((VISIBLE_DEVICES_ENV, ",".join(g.uuid for g in entry.gpus)))
        problem = _layer_problem(settings, host, user)
        if problem is None:
            iso_env, iso_mounts = isolation_env(entry.gpus, settings)
            env.extend(iso_env)
            mounts.extend(iso_mounts)
        elif shares:
            # Refused here, saying why, rather than with the runtime's bare "no such file
            # or directory", or with the share unlimited (an MPS client that finds no
            # daemon runs without MPS), or waiting for another user's MPS clients to end.
            raise RejectError(
                CODE_FAILED_PRECONDITION,
                f"{where}.gpus: isolation layer {settings.isolation}: {problem}",
            )
        else:
            without_layer = problem  # whole GPUs need no limit: given without the layer

    rdma_given: list[str] = []
    if entry.rdma:
        need(RDMA_CM_DEVICE, f"{where}.rdma")
        for i, grant in enumerate(entry.rdma):
            if grant.vfs:
                for j, vf in enumerate(grant.vfs):
                    need(
                        uverbs_device_path(vf.uverbs_minor),
                        f"{where}.rdma[{i}].vfs[{j}] (VF {vf.ibdev} {vf.pci_bus_id})",
                    )
                    rdma_given.append(f"{grant.ibdev}/{vf.ibdev}")
            else:
                need(
                    uverbs_device_path(grant.uverbs_minor),
                    f"{where}.rdma[{i}] (NIC {grant.ibdev} {grant.pci_bus_id})",
                )
                rdma_given.append(grant.ibdev)

    return Adjustment(
        devices=tuple(devices.values()),
        env=tuple(env),
        mounts=tuple(mounts),
        gpus=tuple(g.uuid for g in entry.gpus),
        rdma=tuple(rdma_given),
        shares=shares,
        without_layer=without_layer,
    )


def _layer_problem(settings: Settings, host: HostView, user: ContainerUser | None) -> str | None:
    """Why the layer cannot limit this container's GPUs: its files are not on the node,
    or (MPS) the container runs as a user the daemon does not serve. None when it can."""
    for path, what in _layer_evidence(settings):
        if not host.exists(path):
            return what
    if settings.isolation == ISOLATION_MPS:
        return mps_user_problem(settings.mps_client_uid, user)
    return None


def mps_user_problem(served: int | None, user: ContainerUser | None) -> str | None:
    """Why MPS cannot serve a container of `user` when it serves uid `served` (None:
    every user). NVIDIA's control daemon runs one server per Linux user at a time: a
    client of another user waits, without a word, until every client of the running
    server has exited. A container whose user the runtime did not tell is let through."""
    if served is None or user is None:
        return None
    fix = (
        f"run it as uid {served} (securityContext.runAsUser), or let MPS serve every user "
        "(--mps-client-user=any with the daemon in multi-user mode)"
    )
    if user.own_user_namespace:
        return (
            "the container has a user namespace of its own (hostUsers: false), so MPS would "
            f"see it as another user than uid {served}, the one it serves "
            f"(--mps-client-user); {fix}"
        )
    if user.uid != served:
        return (
            f"the container runs as uid {user.uid}, but MPS on this node serves uid "
            f"{served} (--mps-client-user), one user at a time: a client of another user "
            f"waits until the running clients end; {fix}"
        )
    return None


def _layer_evidence(settings: Settings) -> list[tuple[str, str]]:
    """(host path, what its absence means) for each file the layer needs on the node."""
    if settings.isolation == ISOLATION_MPS:
        pid = mps_pid_file(settings.mps_pipe_dir)
        return [
            (pid, f"the MPS control daemon is not running on this node (no {pid}; --mps-pipe-dir)")
        ]
    if settings.isolation == ISOLATION_HAMI_CORE and settings.hami_core_library:
        lib = settings.hami_core_library
        return [(lib, f"the HAMi-core library {lib} (--hami-core-library) is missing on this node")]
    return []


def container_gpu_order(gpus: tuple[GpuGrant, ...]) -> tuple[GpuGrant, ...]:
    """The container's GPUs in the order CUDA numbers them there: by PCI bus ID, which is
    the host's NVML index order, given CUDA_DEVICE_ORDER=PCI_BUS_ID (the layer's per-device
    limits are keyed by that number)."""
    return tuple(sorted(gpus, key=lambda g: g.index))


def isolation_env(
    gpus: tuple[GpuGrant, ...], settings: Settings
) -> tuple[list[tuple[str, str]], list[Mount]]:
    """Environment (and mounts) that make the isolation layer enforce the grants.

    - mps: CUDA_MPS_PIPE_DIRECTORY plus a bind mount of that host directory, so the
      container reaches the node's MPS control daemon; CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
      with `<uuid>=<MiB>M` per GPU; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE from the compute
      share when it is a real limit (1..99; the smallest if the GPUs differ: MPS has one
      percentage per client).
    - hami-core: CUDA_DEVICE_ORDER=PCI_BUS_ID, then per GPU, numbered as CUDA numbers them
      in the container (`container_gpu_order`), CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m and,
      when the share limits compute (1..99), CUDA_DEVICE_SM_LIMIT_<i>; the library's region
      in a tmpfs of the container's own (CUDA_DEVICE_MEMORY_SHARED_CACHE); with a library
      configured, LD_PRELOAD and a read-only mount of it.
    - none: nothing.
    """
    env: list[tuple[str, str]] = []
    mounts: list[Mount] = []
    if settings.isolation == ISOLATION_MPS:
        shares = [g.core for g in gpus if 0 < g.core < 100]
        env.append((MPS_PIPE_ENV, settings.mps_pipe_dir))
        env.append((MPS_MEMORY_ENV, ",".join(f"{g.uuid}={g.memory_mib}M" for g in gpus)))
        if shares:
            env.append((MPS_THREADS_ENV, str(min(shares))))
        mounts.append(Mount(destination=settings.mps_pipe_dir, source=settings.mps_pipe_dir))
    elif settings.isolation == ISOLATION_HAMI_CORE:
        ordered = container_gpu_order(gpus)
        env.append((CUDA_ORDER_ENV, "PCI_BUS_ID"))
        for i, g in enumerate(ordered):
            env.append((f"{HAMI_MEMORY_ENV_PREFIX}{i}", f"{g.memory_mib}m"))
        for i, g in enumerate(ordered):
            if 0 < g.core < 100:
                env.append((f"{HAMI_SM_ENV_PREFIX}{i}", str(g.core)))
        env.append((HAMI_CACHE_ENV, HAMI_CACHE_FILE))
        mounts.append(
            Mount(HAMI_CACHE_DIR, "tmpfs", type="tmpfs", options=HAMI_CACHE_TMPFS_OPTIONS)
        )
        if settings.hami_core_library:
            lib = settings.hami_core_library
            env.append((PRELOAD_ENV, lib))
            mounts.append(Mount(destination=lib, source=lib, options=("rbind", "ro")))
    return env, mounts
