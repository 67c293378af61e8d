"""The device model every component shares: a node's GPUs and RDMA NICs.

An inventory is immutable; a health change or a rediscovery produces a new one. The same
dict schema (camelCase keys) is used by topology files, the node inventory custom resource
and the simulator, so one parser validates all of them (see docs/inventory.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Self, TypedDict

from tessera.errors import InventoryError
from tessera.isolation import NodeIsolation, parse_isolation
from tessera.resources import DEFAULT_MEMORY_UNIT_MIB
from tessera.sharing import Share, as_is

# Bounds on inventories. Node agents write them (the NodeDevices object), so a broken or
# hostile agent must not be able to make the scheduler build huge lists or numbers that do
# not fit its int64 columns. Each bound is far above any real machine.
MAX_GPUS_PER_NODE: Final = 64
"""GPUs on one node. The densest servers hold 16; 64 leaves room for what comes next."""
MAX_NICS_PER_NODE: Final = 64
"""RDMA NICs (physical functions) on one node; servers carry at most one or two per GPU."""
MAX_VFS_PER_NIC: Final = 1024
"""SR-IOV virtual functions of one NIC: the most a ConnectX NIC can enable is 1K."""
MAX_PORTS_PER_NIC: Final = 16
"""Ports of one NIC: real NICs have one or two."""
MAX_GPU_MEMORY_MIB: Final = 2**24
"""Memory of one GPU, and the largest memory unit: 16 TiB, some 50 times today's largest GPU,
and small enough that sums over every GPU of a cluster stay far inside int64."""
MAX_DEVICE_NUMBER: Final = 2**20 - 1
"""GPU indexes, device minors and uverbs numbers: Linux minor numbers have 20 bits."""
MAX_NUMA_NODE: Final = 1023
"""NUMA node ids: Linux allows at most 1024 nodes (NODES_SHIFT 10)."""
MAX_NVLINKS: Final = 64
"""Active NVLinks between two GPUs: an NVLink-5 GPU has 18 in all."""
MAX_NAME_CHARS: Final = 256
"""UUIDs, models, bus IDs, device and node names: Kubernetes names stop at 253 characters and
NVML strings at 96 bytes."""
MAX_REASON_CHARS: Final = 1024
"""A health reason is a sentence for an operator; a kilobyte is plenty."""

_PCI_BUS_ID = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def normalize_bus_id(bus_id: str) -> str:
    """Lower-case PCI bus ID with a 4-digit domain ("00000000:18:00.0" -> "0000:18:00.0").

    NVML reports an 8-digit domain and sysfs a 4-digit one; comparing them needs one form.
    """
    value = bus_id.strip().lower()
    if not _PCI_BUS_ID.match(value):
        raise ValueError(f"not a PCI bus ID (want DDDD:BB:DD.F): {bus_id!r}")
    domain, rest = value.split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PciDevice:
    """A device on the host's PCI tree: its address, and where it sits (what placement's
    topology tiers compare between GPUs and NICs)."""

    pci_bus_id: str
    numa_node: int = -1
    """NUMA node, -1 when the platform does not report one."""
    pcie_root: str = ""
    """The PCIe root complex (host bridge), e.g. "pci0000:15"."""
    pcie_switch: str = ""
    """Bus ID of the nearest upstream PCIe switch port; empty when attached to the root."""

    def placed(self, where: PciDevice) -> Self:
        """This device where `where` (sysfs's reading of its bus ID) says it sits: its
        NUMA node, PCIe root and switch."""
        return replace(
            self,
            numa_node=where.numa_node,
            pcie_root=where.pcie_root,
            pcie_switch=where.pcie_switch,
        )


@dataclass(frozen=True, slots=True)
class Gpu(PciDevice):
    """One physical GPU as discovered on a node."""

    uuid: str
    index: int
    minor: int
    model: str
    memory_mib: int
    nvlinks: tuple[tuple[int, int], ...] = ()
    """(peer GPU's index, active NVLink count), sorted by peer. Peers are named by index
    rather than UUID so that nodes of one make hold equal tuples, which the scheduler keeps
    once for all of them (the inventory's dict form names peers by UUID)."""
    healthy: bool = True
    health_reason: str = ""
    mig_enabled: bool = False

    def nvlink_count(self, peer_index: int) -> int:
        for peer, links in self.nvlinks:
            if peer == peer_index:
                return links
        return 0


@dataclass(frozen=True, slots=True)
class RdmaVf:
    """An SR-IOV virtual function of an RDMA NIC."""

    pci_bus_id: str
    ibdev: str
    uverbs_minor: int
    """N of the verbs device /dev/infiniband/uverbsN (not the character device's minor)."""
    netdev: str = ""


@dataclass(frozen=True, slots=True)
class RdmaNic(PciDevice):
    """An RDMA-capable NIC (physical function) and its virtual functions."""

    ibdev: str
    uverbs_minor: int
    """N of the verbs device /dev/infiniband/uverbsN (not the character device's minor)."""
    netdev: str = ""
    port_states: tuple[str, ...] = ()
    """State of each port ("ACTIVE", "DOWN", ...), in port order."""
    vfs: tuple[RdmaVf, ...] = ()
    healthy: bool = True
    health_reason: str = ""


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """Every tessera-managed device of one node."""

    node_name: str
    gpus: tuple[Gpu, ...] = ()
    nics: tuple[RdmaNic, ...] = ()
    memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB
    """Size of one `tessera.dev/gpu-memory` unit on this node."""
    isolation: NodeIsolation | None = None
    """The node's GPU isolation layer as its agent last probed it; None when the agent
    does not report one (unknown: see tessera.isolation)."""
    _gpu_by_uuid: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_gpu_by_uuid", {g.uuid: i for i, g in enumerate(self.gpus)})

    def gpu_slot(self, uuid: str) -> int | None:
        """Position of the GPU with this UUID in `gpus`, or None."""
        return self._gpu_by_uuid.get(uuid)

    def nic_slot(self, pci_bus_id: str) -> int | None:
        for i, nic in enumerate(self.nics):
            if nic.pci_bus_id == pci_bus_id:
                return i
        return None

    def with_node_name(self, node_name: str) -> NodeInventory:
        return replace(self, node_name=node_name)

    def with_gpu_health(self, uuid: str, healthy: bool, reason: str = "") -> NodeInventory:
        gpus = tuple(
            replace(g, healthy=healthy, health_reason=reason) if g.uuid == uuid else g
            for g in self.gpus
        )
        return replace(self, gpus=gpus)

    def with_nic_health(self, ibdev: str, healthy: bool, reason: str = "") -> NodeInventory:
        nics = tuple(
            replace(n, healthy=healthy, health_reason=reason) if n.ibdev == ibdev else n
            for n in self.nics
        )
        return replace(self, nics=nics)

    # --- the shared dict schema -------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        uuids = {g.index: g.uuid for g in self.gpus}
        doc: dict[str, Any] = {
            "nodeName": self.node_name,
            "memoryUnitMiB": self.memory_unit_mib,
            "gpus": [_gpu_to_dict(g, uuids) for g in self.gpus],
            "rdma": [_nic_to_dict(n) for n in self.nics],
        }
        if self.isolation is not None:  # absent, not null: older readers never see the key
            doc["isolation"] = self.isolation.to_dict()
        return doc

    @classmethod
    def from_dict(
        cls,
        doc: Mapping[str, Any],
        source: str = "inventory",
        node_name: str | None = None,
        share: Callable[[str], str] | None = None,
        shared: Share = as_is,
    ) -> NodeInventory:
        """Parse and validate the shared schema; errors name `source` and the field path.
        `share` maps every string kept to the one copy the caller keeps (e.g. sys.intern:
        thousands of nodes repeat one GPU model, PCIe roots and bus IDs); `shared` does the
        same for each NIC and each GPU's NVLink peers (e.g. a `SharedValues`)."""
        return _parse_inventory(doc, source, node_name, share or as_is, shared)


# --- serialization ---------------------------------------------------------------------------


def _pci_to_dict(d: PciDevice) -> dict[str, Any]:
    return {
        "pciBusId": d.pci_bus_id,
        "numaNode": d.numa_node,
        "pcieRoot": d.pcie_root,
        "pcieSwitch": d.pcie_switch,
    }


def _gpu_to_dict(g: Gpu, uuids: Mapping[int, str]) -> dict[str, Any]:
    return {
        "uuid": g.uuid,
        "index": g.index,
        "minor": g.minor,
        "model": g.model,
        "memoryMiB": g.memory_mib,
        **_pci_to_dict(g),
        # a peer that is not a GPU of the inventory keeps its index (the parser refuses it)
        "nvlinks": [{"peer": uuids.get(peer, peer), "links": links} for peer, links in g.nvlinks],
        "healthy": g.healthy,
        "healthReason": g.health_reason,
        "migEnabled": g.mig_enabled,
    }


def _nic_to_dict(n: RdmaNic) -> dict[str, Any]:
    return {
        "ibdev": n.ibdev,
        **_pci_to_dict(n),
        "uverbsMinor": n.uverbs_minor,
        "netdev": n.netdev,
        "portStates": list(n.port_states),
        "healthy": n.healthy,
        "healthReason": n.health_reason,
        "vfs": [
            {
                "pciBusId": vf.pci_bus_id,
                "ibdev": vf.ibdev,
                "uverbsMinor": vf.uverbs_minor,
                "netdev": vf.netdev,
            }
            for vf in n.vfs
        ],
    }


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Reader:
    """Typed field access that turns every problem into an InventoryError with a path."""

    def __init__(self, source: str, share: Callable[[str], str]) -> None:
        self.source = source
        self.share = share

    def fail(self, path: str, problem: str) -> InventoryError:
        return InventoryError(self.source, path, problem)

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(path, f"expected a mapping, got {type(value).__name__}")
        return value

    def sequence(self, value: Any, path: str, limit: int) -> Sequence[Any]:
        if value is None:
            return ()
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise self.fail(path, f"expected a list, got {type(value).__name__}")
        if len(value) > limit:
            raise self.fail(path, f"{len(value)} entries, more than the limit of {limit}")
        return value

    def string(
        self,
        doc: Mapping[str, Any],
        key: str,
        path: str,
        default: str | None = None,
        limit: int = MAX_NAME_CHARS,
    ) -> str:
        value = doc.get(key, default)
        if value is None:
            raise self.fail(f"{path}.{key}", "required field is missing")
        if not isinstance(value, str):
            raise self.fail(f"{path}.{key}", f"expected a string, got {type(value).__name__}")
        if len(value) > limit:
            raise self.fail(
                f"{path}.{key}", f"{len(value)} characters, more than the limit of {limit}"
            )
        return self.share(value)

    def integer(
        self,
        doc: Mapping[str, Any],
        key: str,
        path: str,
        *,
        maximum: int,
        default: int | None = None,
        minimum: int | None = None,
    ) -> int:
        value = doc.get(key, default)
        if value is None:
            raise self.fail(f"{path}.{key}", "required field is missing")
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"{path}.{key}", f"expected an integer, got {_short(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(f"{path}.{key}", f"must be >= {minimum}, got {_short(value)}")
        if value > maximum:
            raise self.fail(f"{path}.{key}", f"must be <= {maximum}, got {_short(value)}")
        return value

    def boolean(self, doc: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
        value = doc.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(f"{path}.{key}", f"expected true or false, got {_short(value)}")
        return value

    def bus_id(self, doc: Mapping[str, Any], key: str, path: str, required: bool = True) -> str:
        raw = self.string(doc, key, path, default=None if required else "")
        if not raw and not required:
            return ""
        try:
            return self.share(normalize_bus_id(raw))
        except ValueError as exc:
            raise self.fail(f"{path}.{key}", str(exc)) from None


def _parse_inventory(
    doc: Mapping[str, Any],
    source: str,
    node_name: str | None,
    share: Callable[[str], str],
    shared: Share,
) -> NodeInventory:
    r = _Reader(source, share)
    doc = r.mapping(doc, "$")
    name = share(node_name) if node_name is not None else r.string(doc, "nodeName", "$", default="")
    unit = r.integer(
        doc,
        "memoryUnitMiB",
        "$",
        default=DEFAULT_MEMORY_UNIT_MIB,
        minimum=1,
        maximum=MAX_GPU_MEMORY_MIB,
    )
    raw_gpus = [
        r.mapping(g, f"gpus[{i}]")
        for i, g in enumerate(r.sequence(doc.get("gpus"), "gpus", MAX_GPUS_PER_NODE))
    ]

    uuid_by_index: dict[int, str] = {}
    for i, g in enumerate(raw_gpus):
        uuid_by_index[
            r.integer(g, "index", f"gpus[{i}]", default=i, minimum=0, maximum=MAX_DEVICE_NUMBER)
        ] = r.string(g, "uuid", f"gpus[{i}]")

    gpus: list[Gpu] = []
    for i, g in enumerate(raw_gpus):
        path = f"gpus[{i}]"
        gpus.append(
            Gpu(
                uuid=r.string(g, "uuid", path),
                index=r.integer(g, "index", path, default=i, minimum=0, maximum=MAX_DEVICE_NUMBER),
                minor=r.integer(
                    g,
                    "minor",
                    path,
                    default=r.integer(g, "index", path, default=i, maximum=MAX_DEVICE_NUMBER),
                    minimum=0,
                    maximum=MAX_DEVICE_NUMBER,
                ),
                model=r.string(g, "model", path),
                memory_mib=r.integer(g, "memoryMiB", path, minimum=1, maximum=MAX_GPU_MEMORY_MIB),
                **_parse_pci(r, g, path),
                nvlinks=shared(
                    _parse_nvlinks(r, g.get("nvlinks"), f"{path}.nvlinks", uuid_by_index)
                ),
                healthy=r.boolean(g, "healthy", path, True),
                health_reason=r.string(g, "healthReason", path, default="", limit=MAX_REASON_CHARS),
                mig_enabled=r.boolean(g, "migEnabled", path, False),
            )
        )
    _check_unique(r, "gpus", [g.uuid for g in gpus], "uuid")
    _check_unique(r, "gpus", [g.index for g in gpus], "index")
    _check_unique(r, "gpus", [g.minor for g in gpus], "minor")
    _check_unique(r, "gpus", [g.pci_bus_id for g in gpus], "pciBusId")
    for i, gpu in enumerate(gpus):
        if any(peer == gpu.index for peer, _ in gpu.nvlinks):
            raise r.fail(f"gpus[{i}].nvlinks", "a GPU cannot link to itself")

    nics = [
        shared(_parse_nic(r, r.mapping(n, f"rdma[{i}]"), f"rdma[{i}]"))
        for i, n in enumerate(r.sequence(doc.get("rdma"), "rdma", MAX_NICS_PER_NODE))
    ]
    _check_unique(r, "rdma", [n.ibdev for n in nics], "ibdev")
    _check_unique(r, "rdma", [n.pci_bus_id for n in nics], "pciBusId")
    vf_minors = [vf.uverbs_minor for n in nics for vf in n.vfs]
    _check_unique(r, "rdma", [n.uverbs_minor for n in nics] + vf_minors, "uverbsMinor")
    isolation = parse_isolation(doc.get("isolation"), source, share=share)
    return NodeInventory(name, tuple(gpus), tuple(nics), unit, isolation)


def _parse_nvlinks(
    r: _Reader, value: Any, path: str, uuid_by_index: Mapping[int, str]
) -> tuple[tuple[int, int], ...]:
    """Accept [{peer, links}] (peer = UUID or index) or {peer: links}; peers come back as
    indexes."""
    if value is None:
        return ()
    pairs: list[tuple[Any, Any]]
    if isinstance(value, Mapping):
        if len(value) > MAX_GPUS_PER_NODE:
            raise r.fail(path, f"{len(value)} peers, more than the limit of {MAX_GPUS_PER_NODE}")
        pairs = list(value.items())
    else:
        pairs = []
        for i, raw in enumerate(r.sequence(value, path, MAX_GPUS_PER_NODE)):
            item = r.mapping(raw, f"{path}[{i}]")
            pairs.append((item.get("peer"), item.get("links")))
    index_by_uuid = {uuid: index for index, uuid in uuid_by_index.items()}
    links: dict[int, int] = {}
    for peer, count in pairs:
        if isinstance(peer, str) and len(peer) > MAX_NAME_CHARS:
            raise r.fail(path, f"peer of {len(peer)} characters, more than {MAX_NAME_CHARS}")
        index: int | None
        if (isinstance(peer, int) and not isinstance(peer, bool)) or (
            isinstance(peer, str) and peer.isascii() and peer.isdigit()
        ):
            index = int(peer)
            if index not in uuid_by_index:
                raise r.fail(path, f"peer index {_short(index)} is not a GPU of this node")
            label = uuid_by_index[index]
        elif isinstance(peer, str) and peer:
            index, label = index_by_uuid.get(peer), peer
        else:
            raise r.fail(path, f"peer must be a GPU UUID or index, got {_short(peer)}")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_NVLINKS:
            raise r.fail(
                f"{path}.{label}",
                f"link count must be an integer in 0..{MAX_NVLINKS}, got {_short(count)}",
            )
        if index is None:
            raise r.fail(path, f"peer {_short(peer)} is not a GPU of this node")
        if count:
            links[index] = count
    return tuple(sorted(links.items()))


class _PciFields(TypedDict):
    pci_bus_id: str
    numa_node: int
    pcie_root: str
    pcie_switch: str


def _parse_pci(r: _Reader, d: Mapping[str, Any], path: str) -> _PciFields:
    """A GPU's or NIC's PciDevice fields (the same keys and rules for both)."""
    return {
        "pci_bus_id": r.bus_id(d, "pciBusId", path),
        "numa_node": r.integer(d, "numaNode", path, default=-1, minimum=-1, maximum=MAX_NUMA_NODE),
        "pcie_root": r.string(d, "pcieRoot", path, default=""),
        "pcie_switch": r.string(d, "pcieSwitch", path, default="") or "",
    }


def _parse_nic(r: _Reader, n: Mapping[str, Any], path: str) -> RdmaNic:
    vfs = []
    for j, raw in enumerate(r.sequence(n.get("vfs"), f"{path}.vfs", MAX_VFS_PER_NIC)):
        vf = r.mapping(raw, f"{path}.vfs[{j}]")
        vpath = f"{path}.vfs[{j}]"
        vfs.append(
            RdmaVf(
                pci_bus_id=r.bus_id(vf, "pciBusId", vpath),
                ibdev=r.string(vf, "ibdev", vpath),
                uverbs_minor=r.integer(
                    vf, "uverbsMinor", vpath, minimum=0, maximum=MAX_DEVICE_NUMBER
                ),
                netdev=r.string(vf, "netdev", vpath, default=""),
            )
        )
    states = r.sequence(n.get("portStates"), f"{path}.portStates", MAX_PORTS_PER_NIC)
    for j, s in enumerate(states):
        if not isinstance(s, str) or len(s) > MAX_NAME_CHARS:
            raise r.fail(f"{path}.portStates[{j}]", f"expected a short string, got {_short(s)}")
    return RdmaNic(
        ibdev=r.string(n, "ibdev", path),
        **_parse_pci(r, n, path),
        uverbs_minor=r.integer(n, "uverbsMinor", path, minimum=0, maximum=MAX_DEVICE_NUMBER),
        netdev=r.string(n, "netdev", path, default=""),
        port_states=tuple(str(s) for s in states),
        vfs=tuple(vfs),
        healthy=r.boolean(n, "healthy", path, True),
        health_reason=r.string(n, "healthReason", path, default="", limit=MAX_REASON_CHARS),
    )


def _check_unique(r: _Reader, path: str, values: Iterable[object], key: str) -> None:
    seen: set[object] = set()
    for i, value in enumerate(values):
        if value in seen:
            raise r.fail(f"{path}[{i}].{key}", f"duplicate value {_short(value)}")
        seen.add(value)


def models_allow(models: Collection[str], model: str) -> bool:
    """Whether a pod limited to the GPU `models` (hints; empty: any) may use a GPU of
    `model`."""
    return not models or any(model_matches(model, m) for m in models)


def model_matches(model: str, wanted: str) -> bool:
    """Whether a GPU model name matches a user's model hint.

    Case-insensitive; the hint may be the full NVML name ("NVIDIA H100 80GB HBM3") or a
    whole word of it ("H100"), but not an arbitrary fragment ("H10").
    """
    m, w = model.casefold(), wanted.strip().casefold()
    if not w:
        return False
    if m == w:
        return True
    return re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", m) is not None
