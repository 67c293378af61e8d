"""What the cluster holds and what still fits, per GPU model: the allocation page's
overview (`scheduler_plugin.views.overview`).

Figures come from the columnar index the decisions use (`ClusterIndex`), a few array
operations per model, so the overview of 5,000 nodes costs about a millisecond. "Fits
now" follows placement's own rules: only healthy GPUs of nodes that take new tessera pods
count (the caller names the others), a whole GPU needs all of its compute and memory free,
and a share needs its compute and its memory free on one GPU.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from tessera.cluster_index import BoolArray, ClusterIndex, IntArray
from tessera.resources import UNITS_PER_DEVICE


@dataclass(frozen=True, slots=True)
class ModelCapacity:
    """One GPU model across the cluster."""

    model: str
    nodes: int
    """Nodes with at least one GPU of this model."""
    gpus: int
    unhealthy: int
    core_used: int
    """Compute allocated, in percent of one GPU, summed (`gpus * 100` is all of it)."""
    memory_used_mib: int
    memory_total_mib: int
    whole_free: int
    """GPUs with nothing allocated (healthy or not, on any node)."""
    whole_placeable: int
    """Of those, the healthy ones on nodes that take new pods: whole GPUs placeable now."""
    most_whole_on_one_node: int
    """The most whole GPUs one pod could get on one node now."""
    shares: tuple[tuple[int, int], ...]
    """The largest shares that fit now on one GPU, as (compute %, memory MiB), compute
    descending: every share that fits is at most one of these in both (a share of c% and m
    MiB fits iff some point has core >= c and memory >= m). Empty when none fits."""

    @property
    def largest_share(self) -> tuple[int, int] | None:
        """The share with the most compute that fits now (and the most memory with it)."""
        return self.shares[0] if self.shares else None


def by_model(index: ClusterIndex, unusable: Collection[str] = ()) -> tuple[ModelCapacity, ...]:
    """Every GPU model the index holds, by name; `unusable` names the nodes that take no
    new tessera pods (their GPUs count as held and free, never as placeable)."""
    rows = index.all_rows()
    if not rows.size:
        return ()
    model = index.model[rows]
    free_core = index.free_core[rows]
    free_mem = index.free_mem[rows]
    total_mem = index.total_mem[rows]
    healthy = index.healthy[rows]
    usable_row = np.ones(rows.size, dtype=np.bool_)
    if unusable:
        where = {int(row): i for i, row in enumerate(rows.tolist())}
        for name in unusable:
            row = index.row_of.get(name)
            if row is not None and row in where:
                usable_row[where[row]] = False
    whole = (free_core == UNITS_PER_DEVICE) & (free_mem == total_mem) & (total_mem > 0)
    open_gpu = healthy & usable_row[:, None]
    out = []
    for mid in np.unique(model[model >= 0]).tolist():
        mine: BoolArray = model == mid
        placeable = mine & whole & open_gpu
        fits = mine & open_gpu
        out.append(
            ModelCapacity(
                model=index.models[mid],
                nodes=int(mine.any(axis=1).sum()),
                gpus=int(mine.sum()),
                unhealthy=int((mine & ~healthy).sum()),
                core_used=int((UNITS_PER_DEVICE - free_core)[mine].sum()),
                memory_used_mib=int((total_mem - free_mem)[mine].sum()),
                memory_total_mib=int(total_mem[mine].sum()),
                whole_free=int((mine & whole).sum()),
                whole_placeable=int(placeable.sum()),
                most_whole_on_one_node=int(placeable.sum(axis=1).max()),
                shares=frontier(free_core[fits], free_mem[fits]),
            )
        )
    return tuple(sorted(out, key=lambda m: m.model))


def frontier(core: IntArray, mem: IntArray) -> tuple[tuple[int, int], ...]:
    """The (compute, memory) pairs no other pair beats in both, compute descending; pairs
    with nothing free are left out."""
    some = (core > 0) | (mem > 0)
    core, mem = core[some], mem[some]
    if not core.size:
        return ()
    # the most memory free at each distinct compute figure (at most 101 of them)
    cores, slot = np.unique(core, return_inverse=True)
    most = np.full(cores.size, -1, dtype=np.int64)
    np.maximum.at(most, slot, mem)
    points: list[tuple[int, int]] = []
    best = -1
    for c, m in zip(cores[::-1].tolist(), most[::-1].tolist(), strict=True):
        if m > best:
            points.append((c, m))
            best = m
    return tuple(points)
