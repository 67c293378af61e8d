"""Nodes as the state counts them: a node's devices are in the cluster state while its
NodeDevices inventory parsed and its Node object exists.

A NodeDevices spec that does not parse, or cannot be indexed, makes that node unusable with
the reason and keeps what it had (its last good inventory stays, so what its pods hold
stays accounted): nothing else changes. Until the Node watch has listed (or when Nodes are
not watched) every inventory counts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from sys import intern
from typing import Any

from scheduler_plugin.state.part import Part, Shared
from tessera.errors import TesseraError
from tessera.model import NodeInventory
from tessera.sharing import SharedValues

log = logging.getLogger(__name__)

INTERNAL_ERROR = "could not be processed (internal error)"

_SHARED_DEVICES = SharedValues()
"""NICs and NVLink peer lists seen in NodeDevices, each kept once for every node that
has an equal one."""


def parse_inventory(name: str, spec: Any) -> NodeInventory | str:
    """A NodeDevices spec as the state takes it: the inventory, or why it cannot be used.
    Its strings are interned: 5,000 nodes repeat one GPU model, PCIe roots and bus IDs,
    and every allocation record of a GPU names its UUID again (records are decoded with
    the same `share`); interned strings go when their last holder goes. Its NICs and each
    GPU's NVLink peers are shared with equal ones of other nodes (`_SHARED_DEVICES`): at
    5,000 nodes of 8 NVLinked GPUs and 4 NICs of 8 virtual functions that saves some
    7 KB a node."""
    try:
        if not isinstance(spec, Mapping):
            raise ValueError("spec is missing or not an object")
        source = f"nodedevices/{name}"
        return NodeInventory.from_dict(
            spec, source=source, node_name=name, share=intern, shared=_SHARED_DEVICES
        )
    except (TesseraError, ValueError, TypeError, AttributeError, KeyError) as exc:
        return str(exc)
    except Exception as exc:
        log.exception("bug: parsing nodedevices/%s raised", name[:253])
        return f"cannot be read ({type(exc).__name__})"


class Nodes(Part):
    """Inventories and Node objects (one part of the state: state/cache.py says the lock
    rule). A node whose inventory or Node changed has its usability judged again."""

    __slots__ = ("_errors", "_inventories", "_objects")

    def __init__(self, shared: Shared) -> None:
        super().__init__(shared)
        self._inventories: dict[str, NodeInventory] = {}
        self._errors: dict[str, str] = {}
        """Node -> why its NodeDevices cannot be used."""
        self._objects: set[str] | None = None
        """Names of existing Node objects; None until the Node watch has synced (or when
        Nodes are not watched): then every inventory counts."""

    # --- NodeDevices ----------------------------------------------------------------------

    def upsert(self, name: str, spec: Any) -> None:
        """A node's NodeDevices spec was seen. (Parsed before the lock is taken: decisions
        do not wait on it.)"""
        parsed = parse_inventory(name, spec)
        with self._lock:
            self._apply(name, parsed)

    def remove(self, name: str) -> None:
        """A node's NodeDevices was deleted: its devices leave the state."""
        with self._lock:
            self._inventories.pop(name, None)
            self._errors.pop(name, None)
            self._sync(name)

    def replace(self, specs: Iterable[tuple[str, Any]]) -> None:
        """A full list of NodeDevices as (name, spec): every node not in it is removed.
        Each spec is parsed as it comes (outside the lock; only the typed inventories are
        kept until the list ends), then the state takes them under the lock in one go."""
        parsed = [(name, parse_inventory(name, spec)) for name, spec in specs]
        with self._lock:
            seen = set()
            for name, inventory in parsed:
                seen.add(name)
                self._apply(name, inventory)
            for name in (set(self._inventories) | set(self._errors)) - seen:
                self.remove(name)

    def _apply(self, name: str, parsed: NodeInventory | str) -> None:
        try:
            if isinstance(parsed, str):
                self._failed(name, parsed)
            else:
                self._upsert(name, parsed)
        except Exception:
            log.exception("bug: handling nodedevices %r failed", name[:253])
            self._failed(name, INTERNAL_ERROR)

    def _upsert(self, name: str, inventory: NodeInventory) -> None:
        previous = self._inventories.get(name)
        if (
            previous == inventory
            and name not in self._errors
            and (name in self._cluster.nodes or not self._present(name))
        ):
            return  # the same devices (e.g. only the status changed): nothing to redo
        self._errors.pop(name, None)
        self._inventories[name] = inventory
        if not self._present(name):
            self._sync(name)
            return
        try:
            self._cluster.set_node(inventory)
        except Exception as exc:
            # e.g. a value past what the decision index holds (OverflowError): the node
            # keeps its last good inventory, or leaves the state, and is unusable
            self._restore(name, previous)
            self._failed(name, f"cannot be indexed: {type(exc).__name__}: {exc}")
            return
        self._recheck(name, None)

    def _present(self, name: str) -> bool:
        return self._objects is None or name in self._objects

    def _sync(self, name: str) -> None:
        """Put the node into the state iff its inventory is known and its Node exists."""
        inventory = self._inventories.get(name)
        if inventory is not None and self._present(name):
            try:
                self._cluster.set_node(inventory)
            except Exception as exc:
                # Only an inventory that _upsert could not index gets here, and it never
                # stays in `_inventories`; still, one node must not stop the others.
                log.exception("bug: node %s cannot enter the cluster state", name)
                self._inventories.pop(name, None)
                self._drop(name)
                self._failed(name, f"cannot be indexed ({type(exc).__name__})")
                return
        elif name in self._cluster.nodes:
            self._cluster.remove_node(name)
        self._recheck(name, None)

    def _drop(self, name: str) -> None:
        try:
            self._cluster.remove_node(name)
        except Exception:
            log.exception("bug: removing node %s from the cluster state failed", name)

    def _restore(self, name: str, previous: NodeInventory | None) -> None:
        if previous is None:
            self._inventories.pop(name, None)
            self._drop(name)
            return
        self._inventories[name] = previous
        try:
            self._cluster.set_node(previous)
        except Exception:
            log.exception("bug: restoring the inventory of node %s failed", name)
            self._inventories.pop(name, None)
            self._drop(name)

    def _failed(self, name: str, problem: str) -> None:
        log.warning("node inventory nodedevices/%s does not parse: %s", name, problem)
        self._errors[name] = f"device inventory nodedevices/{name} is invalid: {problem}"
        self._recheck(name, None)

    # --- Node objects -------------------------------------------------------------------------

    def replace_objects(self, names: Iterable[str] | None) -> None:
        """A full list of Node objects (None: Nodes are not watched, every inventory
        counts). A node's devices count only while its Node exists."""
        with self._lock:
            before = self._objects
            self._objects = None if names is None else set(names)
            touched = set(self._inventories) | set(before or ()) | set(self._objects or ())
            for name in touched:
                self._sync(name)

    def object_seen(self, name: str) -> None:
        self._object(name, True)

    def object_gone(self, name: str) -> None:
        self._object(name, False)

    def _object(self, name: str, exists: bool) -> None:
        with self._lock:
            if self._objects is None:
                return
            if exists:
                self._objects.add(name)
            else:
                self._objects.discard(name)
            self._sync(name)

    # --- readers ------------------------------------------------------------------------------

    def error(self, name: str) -> str | None:
        """Why the node's NodeDevices cannot be used, or None."""
        with self._lock:
            return self._errors.get(name)

    def has_inventory(self, name: str) -> bool:
        with self._lock:
            return name in self._inventories

    def invalid(self) -> frozenset[str]:
        """Nodes whose NodeDevices does not parse or index."""
        with self._lock:
            return frozenset(self._errors)

    def known(self) -> set[str]:
        """Nodes with an inventory or an invalid NodeDevices (a fresh set)."""
        with self._lock:
            return set(self._inventories) | set(self._errors)
