"""A columnar copy of cluster state, so one decision can look at thousands of nodes at once.

Each node is a row; each GPU slot a column (padded: absent slots are never eligible). The
index follows ClusterState through its change notifications, copying one row per change,
so it is always equal to the per-node states it mirrors (tests check this).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from operator import itemgetter

import numpy as np
import numpy.typing as npt

from tessera.cluster_state import ClusterState
from tessera.isolation import share_refusal
from tessera.node_state import NodeState
from tessera.resources import UNITS_PER_DEVICE

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

UNTRACKED = np.iinfo(np.int64).max // 4
"""Free CPU / memory of a node whose host capacity is not tracked (the live scheduler)."""


def _copy_text(text: str) -> str:
    """A new str object equal to `text` (str() and a whole slice return `text` itself;
    this round trip always builds a new one, lone surrogates included)."""
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


def name_order(name: str) -> float:
    """A fixed number in [0, 1) per node name (a hash: the same in every process and run),
    for policies that break ties in one node order whatever the scheduler's own rule."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


_TWO_D = {"free_core": -1, "free_mem": -1, "total_mem": 0, "healthy": False, "model": -1}
_ONE_D = {
    "present": False,
    "gpu_count": 0,
    "unit_mib": 1024,
    "cpu_free": UNTRACKED,
    "mem_free": UNTRACKED,
    "version": -1,
    "stamp": -1,
    "used_core": 0,
    "used_mem": 0,
    "sum_mem": 0,
    "name_order": 0.0,
    "takes_shares": True,
}


class ClusterIndex:
    # [rows, slots]
    free_core: IntArray
    free_mem: IntArray
    total_mem: IntArray
    healthy: BoolArray
    model: IntArray
    """Interned model id per slot; -1 for absent slots."""
    # [rows]
    present: BoolArray
    gpu_count: IntArray
    unit_mib: IntArray
    cpu_free: IntArray
    mem_free: IntArray
    version: IntArray
    stamp: IntArray
    """A number unique to each (row, content) across the index's life: it changes whenever
    the row is copied, and a reused row never repeats an old stamp (cache key per row)."""
    used_core: IntArray
    used_mem: IntArray
    sum_mem: IntArray
    name_order: FloatArray
    """`name_order(name)` of the row's node: a fixed tie-break order (0 for free rows)."""
    takes_shares: BoolArray
    """False where the node's isolation layer is reported down: it takes no new GPU share
    (tessera.isolation.share_refusal); a layer that goes down or comes back restamps the
    row, as every change to its inventory does."""

    def __init__(self, state: ClusterState, rows: int = 64, gpu_slots: int = 8) -> None:
        self.state = state
        self.models: list[str] = []
        self._model_ids: dict[str, int] = {}
        self.row_of: dict[str, int] = {}
        self._all_rows: IntArray | None = None
        """`all_rows` until a node comes or goes."""
        self.epoch = 0
        """Counts the times a node came or went (caches of index-wide facts key on it)."""
        self.names: list[str | None] = []
        self._free_rows: list[int] = []
        self._unpacked = 0
        """Names added since `row_of` was last laid out in row order (`_pack`)."""
        self._stamps = 0
        self.refusing_shares = 0
        """Rows of known nodes that take no GPU share (the vector path skips the layer's
        mask while there are none)."""
        self._alloc(max(rows, 1), max(gpu_slots, 1))
        for name in state.nodes:
            self.refresh(name)
        state.subscribe(self.refresh)

    # --- storage --------------------------------------------------------------------------

    def _alloc(self, rows: int, slots: int) -> None:
        old = getattr(self, "free_core", None)
        old_rows, old_slots = (0, 0) if old is None else old.shape
        self.capacity_rows = rows
        self.slots = slots

        for name, fill in (*_TWO_D.items(), *_ONE_D.items()):
            two_d = name in _TWO_D
            dtype = (
                np.bool_
                if isinstance(fill, bool)
                else np.float64
                if isinstance(fill, float)
                else np.int64
            )
            fresh: npt.NDArray[np.generic] = np.full(
                (rows, slots) if two_d else (rows,), fill, dtype=dtype
            )
            prev = None if old is None else getattr(self, name)
            if prev is not None:
                if two_d:
                    fresh[:old_rows, :old_slots] = prev
                else:
                    fresh[:old_rows] = prev
            setattr(self, name, fresh)
        self.names.extend([None] * (rows - len(self.names)))

    def model_id(self, model: str) -> int:
        mid = self._model_ids.get(model)
        if mid is None:
            mid = len(self.models)
            self.models.append(model)
            self._model_ids[model] = mid
        return mid

    # --- following the state ---------------------------------------------------------------

    def refresh(self, name: str) -> None:
        """Copy one node's row from the state (called on every change to that node)."""
        node = self.state.nodes.get(name)
        row = self.row_of.get(name)
        if node is None:
            if row is not None:
                self._clear(row)
                del self.row_of[name]
                self._all_rows = None
                self.epoch += 1
                self.names[row] = None
                self._free_rows.append(row)
            return
        if row is None:
            row = self._new_row(name)
        self._copy(row, node)

    def _new_row(self, name: str) -> int:
        if self._free_rows:
            row = self._free_rows.pop()
        else:
            row = len(self.row_of)
            if row >= self.capacity_rows:
                self._alloc(self.capacity_rows * 2, self.slots)
        self.row_of[name] = row
        self._unpacked += 1
        self._all_rows = None
        self.epoch += 1
        self.names[row] = name
        self.name_order[row] = name_order(name)
        return row

    def _clear(self, row: int) -> None:
        self._take_shares(row, True)
        self.free_core[row] = -1
        self.free_mem[row] = -1
        self.total_mem[row] = 0
        self.healthy[row] = False
        self.model[row] = -1
        self.present[row] = False
        self.gpu_count[row] = 0
        self.version[row] = -1
        self.stamp[row] = -1

    def _copy(self, row: int, node: NodeState) -> None:
        gpus = node.inventory.gpus
        n = len(gpus)
        if n > self.slots:
            self._alloc(self.capacity_rows, n)
        self._clear(row)
        self.present[row] = True
        self.gpu_count[row] = n
        self.unit_mib[row] = node.inventory.memory_unit_mib
        self.version[row] = node.version
        self._stamps += 1
        self.stamp[row] = self._stamps
        self.cpu_free[row] = UNTRACKED if node.cpu_free is None else node.cpu_free
        self.mem_free[row] = UNTRACKED if node.mem_free is None else node.mem_free
        if n:
            self.free_core[row, :n] = node.free_core
            self.free_mem[row, :n] = node.free_mem
            self.total_mem[row, :n] = node.total_mem
            self.healthy[row, :n] = [g.healthy for g in gpus]
            self.model[row, :n] = [self.model_id(g.model) for g in gpus]
        self._take_shares(row, share_refusal(node.inventory.isolation) is None)
        self.used_core[row] = UNITS_PER_DEVICE * n - sum(node.free_core)
        self.used_mem[row] = sum(node.total_mem) - sum(node.free_mem)
        self.sum_mem[row] = sum(node.total_mem)

    def _take_shares(self, row: int, takes: bool) -> None:
        if bool(self.takes_shares[row]) != takes:
            self.takes_shares[row] = takes
            self.refusing_shares += -1 if takes else 1

    # --- lookups -------------------------------------------------------------------------------

    def rows_for(self, names: Sequence[str]) -> tuple[IntArray, list[str]]:
        """Rows of the named nodes that the index knows, and the names it does not know."""
        if self._unpacked and self._unpacked * 8 >= len(self.row_of):
            self._pack()
        try:  # one C-level pass: the usual case (a None, an unknown name, stops it)
            return np.fromiter(map(self.row_of.__getitem__, names), np.int64, len(names)), []
        except KeyError:
            pass
        found = list(map(self.row_of.get, names))
        rows = [row for row in found if row is not None]
        unknown = [name for name, row in zip(names, found, strict=True) if row is None]
        return np.asarray(rows, dtype=np.int64), unknown

    def _pack(self) -> None:
        """Lay `row_of` out again in row order: its keys, new copies of the names, and its
        values, new int objects, each allocated one after another.

        Why: a filter looks up hundreds of names, decoded afresh from each call, and every
        lookup reads the stored key (to compare the text) and the stored int (to count a
        reference to it). Created one at a time as nodes arrived, those objects lie far apart
        in memory, and on a filter that follows an idle wait each lookup missed the CPU
        cache twice: 500 names took 170-220 µs. Laid out in row order, the names of a window
        of kube-scheduler's node list (its order is usually the order the nodes arrived in)
        are neighbours in memory, and the same lookups take 70-110 µs. Called from `rows_for`
        once the names added since the last layout are an eighth of all, so a cluster that
        grows a node at a time is laid out again a logarithmic number of times."""
        by_row = sorted(self.row_of.items(), key=itemgetter(1))
        rows = np.fromiter((row for _, row in by_row), np.int64, len(by_row)).tolist()
        names = [_copy_text(name) for name, _ in by_row]
        self.row_of = dict(zip(names, rows, strict=True))
        for name, row in zip(names, rows, strict=True):
            self.names[row] = name
        self._unpacked = 0

    def selector(self, rows: IntArray) -> IntArray | slice:
        """`rows` as a slice where it is `all_rows()` and that is every row 0..n-1 (no node
        removed: the usual case), so per-row arrays are read as views, not gathered;
        otherwise `rows` itself."""
        n = rows.size
        if n and rows is self.all_rows() and int(rows[-1]) == n - 1:
            return slice(0, n)
        return rows

    def all_rows(self) -> IntArray:
        """Every known node's row, ascending (do not modify: it is shared until a node
        comes or goes)."""
        if self._all_rows is None:
            rows = np.asarray(sorted(self.row_of.values()), dtype=np.int64)
            rows.flags.writeable = False
            self._all_rows = rows
        return self._all_rows
