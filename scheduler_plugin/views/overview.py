"""The allocation page's cluster overview: a compact row per node, the per-model figures
and the search, read from the scheduler's state (`Cache.reading`).

A node's row is what one canvas cell per GPU needs, and no more (about 100 bytes a node,
so 5,000 nodes go in one answer of about half a megabyte):

    {"n": name, "m": model (a list when the node's GPUs differ), "c": [compute granted,
     % per GPU], "g": [memory granted, % per GPU, rounded up], "h": bit i set when GPU i
     is unhealthy, "k": pods holding devices, "p": why the node takes no new tessera pods
     (null when it does), "f": 1 when that is a fence (an untrusted record, an invalid
     inventory)}

The figures per model are tessera.capacity's; nothing here computes what fits.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from scheduler_plugin.state.values import StateReading
from tessera.capacity import ModelCapacity, by_model
from tessera.resources import UNITS_PER_DEVICE

MAX_QUERY = 256
"""Characters of a search; longer ones are refused (400)."""
MAX_MATCHES = 200
"""Matches a search lists (every matching node is still marked)."""


def node_row(reading: StateReading, name: str) -> dict[str, Any] | None:
    """One node's row; None when the state knows nothing of it (gone)."""
    problem = reading.problems.get(name)
    node = reading.state.nodes.get(name)
    if node is None:
        if problem is None:
            return None
        return {"n": name, "m": "", "c": [], "g": [], "h": 0, "k": 0, "p": problem, "f": 1}
    gpus = node.inventory.gpus
    models = [g.model for g in gpus]
    unhealthy = 0
    for i, g in enumerate(gpus):
        if not g.healthy:
            unhealthy |= 1 << i
    core = [UNITS_PER_DEVICE - free for free in node.free_core]
    memory = [
        -((free - total) * 100 // total) if total > 0 else 0  # granted %, rounded up
        for free, total in zip(node.free_mem, node.total_mem, strict=True)
    ]
    return {
        "n": name,
        "m": models[0] if len(set(models)) == 1 else models,
        "c": core,
        "g": memory,
        "h": unhealthy,
        "k": sum(1 for _ in reading.state.pods_on(name)),
        "p": problem,
        "f": 1 if problem is not None and name in reading.fenced else 0,
    }


def node_names(reading: StateReading) -> list[str]:
    """Every node the state can say something about, sorted."""
    return sorted(reading.state.nodes.keys() | reading.problems.keys())


def rows(reading: StateReading, names: Iterable[str]) -> list[dict[str, Any]]:
    return [row for name in names if (row := node_row(reading, name)) is not None]


def models(reading: StateReading) -> list[dict[str, Any]]:
    return [model_json(m) for m in by_model(reading.decider.index, reading.problems.keys())]


def model_json(m: ModelCapacity) -> dict[str, Any]:
    return {
        "model": m.model,
        "nodes": m.nodes,
        "gpus": m.gpus,
        "unhealthy": m.unhealthy,
        "coreUsed": m.core_used,
        "memoryUsedMiB": m.memory_used_mib,
        "memoryTotalMiB": m.memory_total_mib,
        "wholeFree": m.whole_free,
        "wholePlaceable": m.whole_placeable,
        "mostWholeOnOneNode": m.most_whole_on_one_node,
        "shares": [{"core": c, "memoryMiB": mib} for c, mib in m.shares],
    }


def overview(reading: StateReading) -> dict[str, Any]:
    """Everything the page opens on: the figures per model and every node's row."""
    return {
        "models": models(reading),
        "nodes": rows(reading, node_names(reading)),
        "unusable": len(reading.problems),
        "pods": len(reading.state.pods),
    }


def search(reading: StateReading, query: str) -> dict[str, Any]:
    """Nodes, GPUs and pods whose name, namespace, model or GPU UUID contains `query`
    (case-insensitive). `nodes` maps every matching node to the GPU indices that matched
    (empty: the node itself); `matches` lists up to MAX_MATCHES, pods first."""
    q = query.strip().casefold()
    hits: dict[str, set[int]] = {}
    matches: list[dict[str, Any]] = []
    total = 0

    def hit(node: str, gpus: Iterable[int], match: dict[str, Any]) -> None:
        nonlocal total
        hits.setdefault(node, set()).update(gpus)
        total += 1
        if len(matches) < MAX_MATCHES:
            matches.append(match)

    if not q:
        return {"query": query, "nodes": {}, "matches": [], "total": 0}
    state = reading.state
    for alloc in state.pods.values():
        key = f"{alloc.namespace}/{alloc.name}"
        if q in key.casefold():
            node = state.nodes.get(alloc.node)
            index = {} if node is None else {g.uuid: g.index for g in node.inventory.gpus}
            gpus = sorted(
                {
                    index[g.uuid]
                    for c in alloc.containers
                    if c.counted
                    for g in c.gpus
                    if g.uuid in index
                }
            )
            hit(alloc.node, gpus, {"kind": "pod", "pod": key, "node": alloc.node, "gpus": gpus})
    for name in node_names(reading):
        if q in name.casefold():
            hit(name, (), {"kind": "node", "node": name})
    for name, node in sorted(state.nodes.items()):
        for g in node.inventory.gpus:
            if q in g.uuid.casefold():
                hit(name, (g.index,), {"kind": "gpu", "node": name, "gpu": g.index, "uuid": g.uuid})
            elif q in g.model.casefold():
                hits.setdefault(name, set()).add(g.index)
    for m in {g.model for node in state.nodes.values() for g in node.inventory.gpus}:
        if q in m.casefold():
            count = sum(
                1 for n in state.nodes.values() if any(g.model == m for g in n.inventory.gpus)
            )
            total += 1
            matches.append({"kind": "model", "model": m, "nodes": count})
    return {
        "query": query,
        "nodes": {node: sorted(gpus) for node, gpus in sorted(hits.items())},
        "matches": matches,
        "total": total,
    }


def changes(reading: StateReading, names: Iterable[str], sent: dict[str, Any]) -> dict[str, Any]:
    """One line of the overview stream for the nodes `names` that changed: the rows that
    differ from `sent` (what this stream sent before, updated here), the nodes gone, and
    the figures per model when any row changed. `touched` names every changed node, for
    a page that shows a node's details (a usage reading changes no row)."""
    touched = list(names)
    changed, gone = [], []
    for name in touched:
        row = node_row(reading, name)
        if row is None:
            if sent.pop(name, None) is not None:
                gone.append(name)
        elif sent.get(name) != row:
            sent[name] = row
            changed.append(row)
    line: dict[str, Any] = {"type": "ROWS", "rows": changed, "gone": gone, "touched": touched}
    if changed or gone:
        line["models"] = models(reading)
        line["unusable"] = len(reading.problems)
        line["pods"] = len(reading.state.pods)
    return line
