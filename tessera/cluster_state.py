"""Cluster state: every node's free capacity and every pod's allocation, kept in step.

Changes are incremental (add or remove one pod, set one node); the same state can be
rebuilt from the inventories and the allocation records alone, and the two are equal.
A pod whose node is not known yet (records can be seen before inventories after a
restart) waits in `pending` and is applied when its node arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from tessera.allocation import PodAllocation
from tessera.errors import StateError
from tessera.model import NodeInventory
from tessera.node_state import UNTRACKED_HOST, HostCapacity, NodeState

NodeListener = Callable[[str], None]


class ClusterState:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeState] = {}
        self.pods: dict[str, PodAllocation] = {}
        """Applied allocations by pod UID."""
        self.pending: dict[str, PodAllocation] = {}
        """Allocations whose node has no inventory yet, by pod UID."""
        self.assumed: set[str] = set()
        """UIDs of allocations made by a bind that the pod watch has not confirmed yet."""
        self._pods_by_node: dict[str, dict[str, None]] = {}
        """Node -> the UIDs of its applied pods (as dict keys: half the size of a set)."""
        self._listeners: list[NodeListener] = []

    # --- change notification (indexes keep themselves up to date) ---------------------------

    def subscribe(self, listener: NodeListener) -> None:
        """Call `listener(node_name)` after every change to that node's state."""
        self._listeners.append(listener)

    def _changed(self, node: str) -> None:
        for listener in self._listeners:
            listener(node)

    # --- nodes ------------------------------------------------------------------------------

    def set_node(self, inventory: NodeInventory, host: HostCapacity = UNTRACKED_HOST) -> None:
        """Add a node or replace its inventory; its allocations stay accounted."""
        name = inventory.node_name
        node = self.nodes.get(name)
        if node is None:
            node = NodeState(inventory, host)
            self.nodes[name] = node
            for uid in [u for u, a in self.pending.items() if a.node == name]:
                alloc = self.pending.pop(uid)
                try:
                    node.apply(alloc)
                except StateError:
                    self.pending[uid] = alloc  # still does not fit; keep it visible as pending
                    continue
                self.pods[uid] = alloc
                self._pods_by_node.setdefault(name, {})[uid] = None
        else:
            node.update_inventory(inventory, host)
        self._changed(name)

    def remove_node(self, name: str) -> None:
        """Forget a node; its pods' allocations go back to pending until they are removed."""
        if self.nodes.pop(name, None) is None:
            return
        for uid in self._pods_by_node.pop(name, {}):
            self.pending[uid] = self.pods.pop(uid)
        self._changed(name)

    # --- pods ---------------------------------------------------------------------------------

    def add(self, alloc: PodAllocation, *, assumed: bool = False) -> None:
        """Account a pod's allocation. Raises StateError (changing nothing) on a conflict:
        the pod already holds a different allocation, or a device would be overcommitted."""
        uid = alloc.pod_uid
        existing = self.pods.get(uid) or self.pending.get(uid)
        if existing is not None:
            if existing == alloc:
                if not assumed:
                    self.assumed.discard(uid)
                return
            raise StateError(
                f"pod {alloc.key} ({uid}) already holds an allocation on {existing.node}"
            )
        node = self.nodes.get(alloc.node)
        if node is None:
            self.pending[uid] = alloc
        else:
            node.apply(alloc)
            self.pods[uid] = alloc
            self._pods_by_node.setdefault(alloc.node, {})[uid] = None
        if assumed:
            self.assumed.add(uid)
        if node is not None:
            self._changed(alloc.node)

    def confirm(self, uid: str) -> None:
        """The pod watch saw the bind: the allocation is no longer only assumed."""
        self.assumed.discard(uid)

    def remove(self, uid: str) -> PodAllocation | None:
        """Release a pod's devices (deleted, finished, or a failed bind). Idempotent."""
        self.assumed.discard(uid)
        pending = self.pending.pop(uid, None)
        if pending is not None:
            return pending
        alloc = self.pods.pop(uid, None)
        if alloc is None:
            return None
        node = self.nodes.get(alloc.node)
        if node is not None:
            node.release(alloc)
        self._pods_by_node.get(alloc.node, {}).pop(uid, None)
        self._changed(alloc.node)
        return alloc

    def pods_on(self, node: str) -> Iterator[PodAllocation]:
        for uid in sorted(self._pods_by_node.get(node, ())):
            yield self.pods[uid]

    def allocation(self, uid: str) -> PodAllocation | None:
        return self.pods.get(uid) or self.pending.get(uid)

    # --- rebuild and comparison ---------------------------------------------------------------

    @classmethod
    def rebuild(
        cls,
        inventories: Iterable[NodeInventory],
        allocations: Iterable[PodAllocation],
    ) -> ClusterState:
        """Build state from scratch. Allocations that conflict raise StateError."""
        state = cls()
        for inventory in inventories:
            state.set_node(inventory)
        for alloc in allocations:
            state.add(alloc)
        return state

    def snapshot(self) -> tuple[object, ...]:
        """A value that two states share exactly when they hold the same capacity and pods."""
        return (
            tuple(sorted((name, node.snapshot()) for name, node in self.nodes.items())),
            tuple(sorted(self.pods.items())),
            tuple(sorted(self.pending.items())),
        )
