"""What the node agent advertises to the kubelet: unit IDs per resource (pure, no I/O).

The device plugin API only counts device IDs, so a fraction of a device is advertised as
many "unit" IDs of that device (100 `gpu-core` units per GPU, ...). A unit ID names its
physical device in the shape NVIDIA's device plugin gives shared-GPU replicas,
`<device>::<n>`, where a GPU's device is its UUID (`GPU-8f4c3a0e-...::41`) and a NIC's is
`rdma-<ibdev>` (`rdma-mlx5_0::7`); a whole device is just `<device>` (`nvidia.com/gpu`). So
the device of any ID the kubelet sends back can be read from the ID itself, even an ID from
an older snapshot, and tools that read the kubelet's pod-resources API (dcgm-exporter cuts
an ID at its first `::`) find the GPU of every unit.

Also here: the kubelet's resource-name rules, the size limits that keep every message far
below the kubelet's 4 MiB gRPC cap, the preferred-allocation choice and the informational
summary `Allocate` returns.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tessera.errors import InputError
from tessera.model import NodeInventory
from tessera.resources import (
    DEFAULT_MEMORY_UNIT_MIB,
    DOMAIN,
    GPU_MEMORY,
    NVIDIA_GPU,
    RDMA,
    TESSERA_GPU_RESOURCES,
    UNITS_PER_DEVICE,
)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

MAX_UNITS_PER_RESOURCE = 32768
"""The most unit IDs one resource may advertise: the kubelet keeps every ID of every resource
in memory and in its checkpoint, so a node stays well under ~32k IDs per resource."""
KUBELET_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""gRPC's default receive limit, which the kubelet does not raise."""
MESSAGE_BUDGET_BYTES = 3 * 1024 * 1024
"""Refuse a configuration whose ListAndWatch snapshot would exceed this (75% of the cap)."""
MAX_UNIT_ID_LENGTH = 63
"""The API's documented maximum for Device.ID."""

UNIT_SEPARATOR = "::"
"""Between a unit's device and its number, as in NVIDIA's replica IDs (`<UUID>::<n>`)."""
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.]*$")
_SAFE_UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_DEVICE_KEY_LENGTH = MAX_UNIT_ID_LENGTH - len(UNIT_SEPARATOR) - 5
"""A device key leaves room for the separator and a five-digit unit number."""


class LimitError(InputError, ValueError):
    """A configuration would advertise more than the kubelet can take; says how to fix it."""


@dataclass(frozen=True)
class UnitConfig:
    """What to advertise: the memory unit and which resources."""

    memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB
    nvidia_gpu: bool = False
    """Also advertise whole GPUs as `nvidia.com/gpu` (off by default)."""
    rdma: bool = True
    """Advertise `tessera.dev/rdma` (only when the node has RDMA NICs)."""

    def resources(self, inventory: NodeInventory) -> tuple[str, ...]:
        names = list(TESSERA_GPU_RESOURCES)
        if self.rdma and inventory.nics:
            names.append(RDMA)
        if self.nvidia_gpu:
            names.append(NVIDIA_GPU)
        return tuple(names)


@dataclass(frozen=True, slots=True)  # thousands per node: no __dict__ each
class Unit:
    id: str
    device: str
    """The device key encoded in the ID (a GPU's UUID, "rdma-mlx5_0")."""
    healthy: bool
    numa_node: int
    """-1 when the device reports no NUMA node (then no TopologyInfo is sent)."""

    @property
    def health(self) -> str:
        return HEALTHY if self.healthy else UNHEALTHY


@dataclass(frozen=True)
class ResourceUnits:
    """Every unit of one resource, in a stable order (device order, then unit number)."""

    resource: str
    units: tuple[Unit, ...]
    devices: tuple[str, ...] = field(default=())
    """Device keys in inventory order."""

    @property
    def healthy_count(self) -> int:
        return sum(1 for u in self.units if u.healthy)

    def key(self) -> tuple[Unit, ...]:
        """Everything a ListAndWatch message carries (each unit's ID, health and NUMA node;
        its device is part of the ID); equal keys mean equal snapshots. The units
        themselves, not a copy: the agent keeps them anyway."""
        return self.units


# --- names -----------------------------------------------------------------------------------


def gpu_device_key(uuid: str, index: int) -> str:
    """The GPU's UUID (what NVML, nvidia-smi and dcgm-exporter call it); `gpu<index>` only
    for a UUID that could not stand in an ID (odd characters, `::`, too long), which NVML
    never reports."""
    if _SAFE_UUID.match(uuid) and len(uuid) <= MAX_DEVICE_KEY_LENGTH:
        return uuid
    return f"gpu{index}"


def nic_device_key(ibdev: str, slot: int) -> str:
    """`rdma-<ibdev>` when the name is short and plain, else `rdma<slot>`."""
    if _SAFE_NAME.match(ibdev) and len(ibdev) <= 40:
        return f"rdma-{ibdev}"
    return f"rdma{slot}"


def unit_id(device: str, resource: str, n: int) -> str:
    """`<device>::<n>`; a whole GPU (`nvidia.com/gpu`) is its device key alone."""
    if resource == NVIDIA_GPU:
        return device
    return f"{device}{UNIT_SEPARATOR}{n}"


MAX_UNIT_NUMBER_DIGITS = 5
"""Unit numbers stay below MAX_UNITS_PER_RESOURCE (32768): five digits. A longer number in a
request is never one of ours and is not converted (no int() of a huge digit string)."""


def _number(text: str) -> int | None:
    """A unit number: 1-5 ASCII digits, no leading zero (IDs are written without one)."""
    if not text or len(text) > MAX_UNIT_NUMBER_DIGITS or not text.isascii():
        return None
    if not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        return None
    return int(text)


def _split(unit: str) -> tuple[str, int] | None:
    """(device, n) of an ID shaped `<device>::<n>`, else None.

    The device ends at the first `::`, where dcgm-exporter cuts it, so `a::b::1` is not a
    unit of `a::b`. Plain string operations: Allocate and GetPreferredAllocation parse every
    ID they are given.
    """
    device, sep, number = unit.partition(UNIT_SEPARATOR)
    if not sep or not device:
        return None
    n = _number(number)
    if n is None:
        return None
    return device, n


def device_of(unit: str) -> str:
    """The device key a unit ID encodes (the ID itself for whole-device IDs)."""
    parts = _split(unit)
    return parts[0] if parts else unit


def unit_number(unit: str) -> int:
    parts = _split(unit)
    return parts[1] if parts else 0


def socket_name(resource: str) -> str:
    """The plugin's socket file name: `tessera.dev_gpu-core.sock`, `nvidia.com_gpu.sock`."""
    return resource.replace("/", "_") + ".sock"


def annotation_key(resource: str) -> str:
    """The informational container annotation Allocate sets (tessera.dev/dp-units-gpu-core)."""
    name = resource.removeprefix(f"{DOMAIN}/").replace("/", "-")
    return f"{DOMAIN}/dp-units-{name}"


# --- kubelet's resource-name rules (IsExtendedResourceName) -----------------------------------

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def resource_name_problem(name: str) -> str | None:
    """Why the kubelet would refuse `name` as an extended resource name, or None if it accepts.

    The rules: a `/` is required; `kubernetes.io/` may not appear anywhere; no `requests.`
    prefix; and `requests.<name>` must be a qualified name (one `/`, a DNS-1123 subdomain
    prefix of at most 253 characters, a name part of at most 63 characters).
    """
    if "/" not in name:
        return "it has no domain prefix (want <domain>/<name>)"
    if "kubernetes.io/" in name:
        return "the kubernetes.io domain is reserved"
    if name.startswith("requests."):
        return "it may not start with 'requests.'"
    parts = ("requests." + name).split("/")
    if len(parts) != 2:
        return "it has more than one '/'"
    prefix, short = parts
    if len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix):
        return f"the prefix {prefix.removeprefix('requests.')!r} is not a DNS-1123 subdomain"
    if not short or len(short) > 63 or not _QUALIFIED_NAME.match(short):
        return (
            f"the name part {short!r} must be 1-63 characters of [A-Za-z0-9-_.], starting and "
            "ending with an alphanumeric"
        )
    return None


def validate_resource_name(name: str) -> None:
    problem = resource_name_problem(name)
    if problem is not None:
        raise ValueError(f'the ResourceName "{name}" is invalid: {problem}')


# --- building the units ------------------------------------------------------------------------


def memory_units(memory_mib: int, unit_mib: int) -> int:
    return memory_mib // unit_mib


def build_units(inventory: NodeInventory, config: UnitConfig) -> dict[str, ResourceUnits]:
    """Every advertised resource's units for this inventory, health and NUMA included."""
    out: dict[str, ResourceUnits] = {}
    for resource in config.resources(inventory):
        units: list[Unit] = []
        devices: list[str] = []
        if resource == RDMA:
            for slot, nic in enumerate(inventory.nics):
                key = nic_device_key(nic.ibdev, slot)
                devices.append(key)
                units.extend(
                    Unit(unit_id(key, resource, n), key, nic.healthy, nic.numa_node)
                    for n in range(UNITS_PER_DEVICE)
                )
        else:
            for gpu in inventory.gpus:
                key = gpu_device_key(gpu.uuid, gpu.index)
                devices.append(key)
                if resource == NVIDIA_GPU:
                    count = 1
                elif resource == GPU_MEMORY:
                    count = memory_units(gpu.memory_mib, config.memory_unit_mib)
                else:
                    count = UNITS_PER_DEVICE
                units.extend(
                    Unit(unit_id(key, resource, n), key, gpu.healthy, gpu.numa_node)
                    for n in range(count)
                )
        out[resource] = ResourceUnits(resource, tuple(units), tuple(devices))
    return out


# --- limits ----------------------------------------------------------------------------------


def _varint_len(value: int) -> int:
    if value < 0:
        return 10  # protobuf encodes negative int64 in ten bytes
    n = 1
    while value >= 0x80:
        value >>= 7
        n += 1
    return n


def _field_len(payload: int) -> int:
    """Bytes of one length-delimited field with a one-byte tag."""
    return 1 + _varint_len(payload) + payload


def device_message_size(unit: Unit) -> int:
    """Exact encoded size of one Device inside a ListAndWatchResponse."""
    size = _field_len(len(unit.id.encode())) + _field_len(len(unit.health))
    if unit.numa_node >= 0:
        numa = 0 if unit.numa_node == 0 else 1 + _varint_len(unit.numa_node)
        size += _field_len(_field_len(numa))
    return _field_len(size)


def snapshot_size(units: ResourceUnits) -> int:
    """Exact encoded size of the resource's ListAndWatchResponse."""
    return sum(device_message_size(u) for u in units.units)


def check_limits(
    units_by_resource: Mapping[str, ResourceUnits],
    memory_unit_mib: int,
    budget_bytes: int = MESSAGE_BUDGET_BYTES,
) -> None:
    """Refuse what the kubelet could not take; the message says how to fix it.

    With IDs of at most 63 characters, 32768 of them make a snapshot of at most ~2.9 MB, so
    the ID count binds first; the byte budget guards that invariant should ID shapes change.
    """
    for resource, units in units_by_resource.items():
        for u in units.units:
            if len(u.id) > MAX_UNIT_ID_LENGTH:
                raise LimitError(
                    f"{resource}: unit ID {u.id!r} is longer than {MAX_UNIT_ID_LENGTH} characters"
                )
        count = len(units.units)
        size = snapshot_size(units)
        if count <= MAX_UNITS_PER_RESOURCE and size <= budget_bytes:
            continue
        hint = ""
        if resource == GPU_MEMORY:
            total_mib = count * memory_unit_mib
            least = max(memory_unit_mib + 1, math.ceil(total_mib / MAX_UNITS_PER_RESOURCE))
            hint = f"; raise --memory-unit-mib to at least {least}"
        raise LimitError(
            f"{resource} would advertise {count} unit IDs in a {size}-byte ListAndWatch "
            f"message; the limits are {MAX_UNITS_PER_RESOURCE} IDs per resource and "
            f"{budget_bytes} bytes (the kubelet refuses messages over "
            f"{KUBELET_MAX_MESSAGE_BYTES} bytes){hint}"
        )


# --- preferred allocation ----------------------------------------------------------------------


def _dedupe(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def preferred_allocation(
    available: Sequence[str], must_include: Sequence[str], size: int
) -> list[str]:
    """Pick `size` units from `available`, keeping them on as few devices as possible.

    Every unit of `must_include` is kept. Devices already holding a must-include unit are
    filled first; then, if one more device can hold the rest, the fullest such device that
    still fits is used (best fit, which leaves whole devices whole); otherwise the devices
    with the most free units are taken, largest first, which needs the fewest devices.
    Within a device, units go in their numeric order. Returns fewer than `size` IDs only
    when `available` holds fewer.
    """
    chosen = _dedupe(must_include)
    taken = set(chosen)
    need = size - len(chosen)
    if need <= 0:
        return chosen
    order: dict[str, int] = {}
    free: dict[str, list[str]] = {}
    for unit in _dedupe(available):
        if unit in taken:
            continue
        device = device_of(unit)
        order.setdefault(device, len(order))
        free.setdefault(device, []).append(unit)
    for units in free.values():
        units.sort(key=unit_number)

    def take(device: str, count: int) -> None:
        nonlocal need
        units = free.pop(device)
        chosen.extend(units[:count])
        need -= min(count, len(units))

    touched = {device_of(u) for u in chosen}
    for device in sorted(
        (d for d in free if d in touched), key=lambda d: (-len(free[d]), order[d])
    ):
        if need <= 0:
            return chosen
        take(device, need)
    # The rest, in O(D log D) for D devices (a request may name thousands): devices sorted by
    # (free units, -order), so the largest, first-listed one is last and the best fit is
    # found by bisection. Largest-first until one device can hold the remainder, then the
    # fullest device that still fits (ties: the first listed).
    ranked = sorted(free, key=lambda d: (len(free[d]), -order[d]))
    sizes = [len(free[d]) for d in ranked]
    while need > 0 and ranked:
        at = bisect_left(sizes, need)
        if at < len(ranked):
            run_end = bisect_right(sizes, sizes[at]) - 1  # same size: the last has least order
            take(ranked[run_end], need)
            break
        sizes.pop()
        take(ranked.pop(), need)
    return chosen


# --- what Allocate reports -------------------------------------------------------------------


def allocation_summary(unit_ids: Iterable[str]) -> str:
    """How many units of each device the kubelet counted, e.g. "GPU-8f4c...:30,rdma-mlx5_0:50".

    Each ID is split on its own (a few string operations): an ID whose number is malformed
    is its own device, whatever IDs of the same prefix came before it.
    """
    counts: dict[str, int] = {}
    for unit in unit_ids:
        device = device_of(unit)
        counts[device] = counts.get(device, 0) + 1
    return ",".join(f"{device}:{n}" for device, n in counts.items())
