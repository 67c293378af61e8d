"""A GPU backend (and NIC source) driven by a topology file, with health controls for tests
and demos: inject an XID, make a GPU stop (or resume) answering queries, change port states.

Loading is lenient: a GPU or NIC entry with a bad field is dropped with an InventoryError that
names the file and the field path (`gpus[3].memoryMiB`), and the rest of the file is served.
Only a file that cannot be used at all (unreadable, not YAML, a bad top-level field) fails.
"""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import MutableMapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from deviceplugin.backend import GpuDiscovery, GpuProcess, GpuProcesses, TopologyError, XidEvent
from tessera.errors import InventoryError
from tessera.model import Gpu, NodeInventory, RdmaNic
from tessera_edge.topology_file import BUILTIN_TOPOLOGIES, builtin_topology_text, load_document

FAILED_XID = 79
"""The XID a GPU marked `healthy: false` in the topology file reports once (fallen off the
bus), so that the agent's health machine marks it unhealthy as it would on a real node."""
_ENTRY = re.compile(r"^(gpus|rdma)\[(\d+)\]")


def _read_topology(name_or_path: str) -> tuple[str, str]:
    if name_or_path in BUILTIN_TOPOLOGIES:
        return builtin_topology_text(name_or_path), f"builtin:{name_or_path}"
    path = Path(name_or_path)
    try:
        return path.read_text(), str(path)
    except OSError as exc:
        raise InventoryError(str(path), "$", f"cannot read topology file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InventoryError(str(path), "$", "not a text file") from None


def _drop_gpu(doc: MutableMapping[str, Any], position: int) -> None:
    gpus = doc["gpus"]
    dropped = gpus.pop(position)
    gone: set[Any] = set()
    if isinstance(dropped, dict):
        gone = {dropped.get("index", position), str(dropped.get("index", position))}
        if isinstance(dropped.get("uuid"), str):
            gone.add(dropped["uuid"])
    for gpu in gpus:
        links = gpu.get("nvlinks") if isinstance(gpu, dict) else None
        if isinstance(links, dict):
            for key in [k for k in links if k in gone]:
                del links[key]
        elif isinstance(links, list):
            links[:] = [
                item for item in links if not (isinstance(item, dict) and item.get("peer") in gone)
            ]


def load_topology_lenient(
    name_or_path: str, node_name: str = ""
) -> tuple[NodeInventory, list[InventoryError]]:
    """Load a topology, dropping broken GPU/NIC entries; returns what was read and the errors.

    Raises InventoryError when nothing usable can be read.
    """
    text, source = _read_topology(name_or_path)
    doc: Any = load_document(text, source)
    if not isinstance(doc, dict):
        raise InventoryError(source, "$", "expected a mapping with gpus and rdma lists")
    doc = copy.deepcopy(doc)
    # pin every GPU's index to its position, so dropping an entry keeps the others' indexes
    gpus = doc.get("gpus")
    if isinstance(gpus, list):
        for i, gpu in enumerate(gpus):
            if isinstance(gpu, dict) and "index" not in gpu:
                gpu["index"] = i
    errors: list[InventoryError] = []
    entries = sum(len(v) for k in ("gpus", "rdma") if isinstance(v := doc.get(k), list))
    for _ in range(entries + 1):
        try:
            inventory = NodeInventory.from_dict(doc, source=source, node_name=node_name)
        except InventoryError as exc:
            m = _ENTRY.match(exc.field)
            if m is None or not isinstance(doc.get(m.group(1)), list):
                raise
            errors.append(exc)
            kind, position = m.group(1), int(m.group(2))
            if kind == "gpus":
                _drop_gpu(doc, position)
            else:
                doc["rdma"].pop(position)
            continue
        return inventory, errors
    raise InventoryError(source, "$", "could not salvage any entry")  # pragma: no cover


class FakeBackend:
    """GPUs and NICs from a topology; events and query answers under the caller's control."""

    name = "fake"

    def __init__(
        self, inventory: NodeInventory, source: str = "", errors: list[InventoryError] | None = None
    ) -> None:
        self.source = source
        self._gpus = tuple(replace(g, healthy=True, health_reason="") for g in inventory.gpus)
        self._nics = {n.ibdev: n for n in inventory.nics}
        self._port_states = {n.ibdev: n.port_states for n in inventory.nics}
        self._load_errors = list(errors or [])
        self._silent: dict[str, str] = {}
        # a GPU the file marks unhealthy failed before the agent started: NVML would report
        # its XID (79, fallen off the bus) at the agent's first wait
        self._events: list[XidEvent] = [
            XidEvent(g.uuid, FAILED_XID, g.health_reason or "marked unhealthy in the topology")
            for g in inventory.gpus
            if not g.healthy
        ]
        self._processes: dict[str, tuple[GpuProcess, ...]] = {}
        self._process_errors: dict[str, str] = {}
        self._cond = threading.Condition()
        self._closed = False

    @classmethod
    def from_topology(cls, name_or_path: str) -> FakeBackend:
        try:
            inventory, errors = load_topology_lenient(name_or_path)
        except InventoryError as exc:
            raise TopologyError(str(exc)) from None
        return cls(inventory, name_or_path, errors)

    # --- GpuBackend -------------------------------------------------------------------------

    def discover(self) -> GpuDiscovery:
        gpu_errors = [e for e in self._load_errors if e.field.startswith("gpus")]
        return GpuDiscovery(list(self._gpus), gpu_errors)

    def wait_events(self, timeout_s: float) -> list[XidEvent]:
        with self._cond:
            if not self._events and not self._closed:
                self._cond.wait(timeout_s)
            events, self._events = self._events, []
            return events

    def query(self, uuid: str) -> str | None:
        with self._cond:
            return self._silent.get(uuid)

    def processes(self) -> list[GpuProcesses]:
        with self._cond:
            return [
                GpuProcesses(
                    g.uuid,
                    () if g.uuid in self._process_errors else self._processes.get(g.uuid, ()),
                    self._process_errors.get(g.uuid, ""),
                )
                for g in self._gpus
            ]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # --- NicSource --------------------------------------------------------------------------

    def discover_nics(self) -> tuple[list[RdmaNic], list[InventoryError]]:
        nic_errors = [e for e in self._load_errors if e.field.startswith("rdma")]
        return list(self._nics.values()), nic_errors

    def port_states(self, ibdev: str) -> tuple[str, ...]:
        with self._cond:
            if ibdev not in self._port_states:
                raise InventoryError(f"fake:{self.source}", f"rdma[{ibdev}]", "no such NIC")
            return self._port_states[ibdev]

    # --- controls ---------------------------------------------------------------------------

    def gpu(self, index: int) -> Gpu:
        return next(g for g in self._gpus if g.index == index)

    def inject_xid(self, uuid: str | None, xid: int, detail: str = "") -> None:
        """Deliver an XID event as NVML would (`uuid` None: the device is unknown)."""
        with self._cond:
            self._events.append(XidEvent(uuid, xid, detail or f"injected XID {xid}"))
            self._cond.notify_all()

    def set_answers(self, uuid: str, answers: bool, reason: str = "GPU is lost") -> None:
        """Make a GPU answer queries normally, or fail them with `reason`."""
        with self._cond:
            if answers:
                self._silent.pop(uuid, None)
            else:
                self._silent[uuid] = reason

    def set_processes(
        self, uuid: str, processes: tuple[GpuProcess, ...] = (), error: str = ""
    ) -> None:
        """What the GPU runs from now on, as NVML would list it (host PIDs); with `error`,
        the list cannot be read."""
        with self._cond:
            self._processes[uuid] = tuple(processes)
            if error:
                self._process_errors[uuid] = error
            else:
                self._process_errors.pop(uuid, None)

    def set_port_states(self, ibdev: str, states: tuple[str, ...]) -> None:
        with self._cond:
            self._port_states[ibdev] = tuple(states)
