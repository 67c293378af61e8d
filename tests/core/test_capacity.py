"""The per-model overview (tessera.capacity): its figures equal a plain walk over the
per-node states, and "fits now" agrees with placement itself (no share fits on a node
whose isolation layer is down; whole GPUs do)."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.capacity import ModelCapacity, by_model, frontier
from tessera.cluster_index import ClusterIndex
from tessera.cluster_state import ClusterState
from tessera.isolation import NodeIsolation
from tessera.node_placement import Placement, place_pod
from tessera.resources import UNITS_PER_DEVICE
from tessera.scoring_policy import BinpackPolicy
from tests.core.test_fragmentation_policy import MODELS, inventory, pod

# per node: model, GPU count, unhealthy slots, and per GPU (core, memory ratio) taken
_GPU_USE = st.tuples(st.sampled_from([0, 10, 30, 50, 100]), st.sampled_from([0, 25, 50, 100]))
_NODE = st.tuples(
    st.integers(0, len(MODELS) - 1),
    st.integers(1, 8),
    st.sets(st.integers(0, 7), max_size=2),
    st.lists(_GPU_USE, min_size=8, max_size=8),
    st.booleans(),  # usable
    st.booleans(),  # the isolation layer is down (no share fits)
)
LAYER_DOWN = NodeIsolation("mps", False, reason="the MPS control daemon is not running")


def _cluster(
    nodes: list[tuple[int, int, set[int], list[tuple[int, int]], bool, bool]],
) -> tuple[ClusterState, ClusterIndex, set[str]]:
    state = ClusterState()
    index = ClusterIndex(state, rows=2, gpu_slots=2)  # grows as nodes come
    unusable = set()
    for n, (model, count, unhealthy, uses, usable, down) in enumerate(nodes):
        name = f"n{n}"
        inv = inventory(name, count, model, tuple(s for s in unhealthy if s < count))
        if down:
            inv = replace(inv, isolation=LAYER_DOWN)
        state.set_node(inv)
        if not usable:
            unusable.add(name)
        for slot, (core, ratio) in enumerate(uses[:count]):
            if not core and not ratio:
                continue
            g = inv.gpus[slot]
            grant = GpuGrant(g.uuid, g.index, g.minor, core, g.memory_mib * ratio // 100)
            uid = f"{name}-{slot}"
            state.add(PodAllocation(uid, "d", uid, name, (ContainerAllocation("c", (grant,)),)))
    return state, index, unusable


def _naive(state: ClusterState, unusable: set[str]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name, node in state.nodes.items():
        counted: set[str] = set()
        placeable_here: dict[str, int] = {}
        for slot, g in enumerate(node.inventory.gpus):
            m = out.setdefault(
                g.model,
                {
                    "nodes": 0,
                    "gpus": 0,
                    "unhealthy": 0,
                    "core": 0,
                    "mem": 0,
                    "total": 0,
                    "free": 0,
                    "placeable": 0,
                    "most": 0,
                    "open": [],
                },
            )
            if g.model not in counted:
                counted.add(g.model)
                m["nodes"] += 1  # type: ignore[operator]
            free_core, free_mem = node.free_core[slot], node.free_mem[slot]
            m["gpus"] += 1  # type: ignore[operator]
            m["unhealthy"] += 0 if g.healthy else 1  # type: ignore[operator]
            m["core"] += UNITS_PER_DEVICE - free_core  # type: ignore[operator]
            m["mem"] += g.memory_mib - free_mem  # type: ignore[operator]
            m["total"] += g.memory_mib  # type: ignore[operator]
            whole = free_core == UNITS_PER_DEVICE and free_mem == g.memory_mib
            m["free"] += whole  # type: ignore[operator]
            if g.healthy and name not in unusable:
                if node.inventory.isolation is None:  # its layer is not down: shares fit
                    m["open"].append((free_core, free_mem))  # type: ignore[attr-defined]
                if whole:
                    m["placeable"] += 1  # type: ignore[operator]
                    placeable_here[g.model] = placeable_here.get(g.model, 0) + 1
        for model, k in placeable_here.items():
            out[model]["most"] = max(out[model]["most"], k)  # type: ignore[call-overload]
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(_NODE, min_size=1, max_size=12))
def test_the_figures_equal_a_walk_over_the_nodes(nodes: list[tuple]) -> None:  # type: ignore[type-arg]
    state, index, unusable = _cluster(nodes)
    got = {m.model: m for m in by_model(index, unusable)}
    want = _naive(state, unusable)
    assert set(got) == set(want)
    for model, w in want.items():
        g = got[model]
        assert (g.nodes, g.gpus, g.unhealthy) == (w["nodes"], w["gpus"], w["unhealthy"])
        assert (g.core_used, g.memory_used_mib, g.memory_total_mib) == (
            w["core"],
            w["mem"],
            w["total"],
        )
        assert (g.whole_free, g.whole_placeable, g.most_whole_on_one_node) == (
            w["free"],
            w["placeable"],
            w["most"],
        )
        # a share fits iff one open GPU has both: the frontier says the same for every
        # figure an open GPU shows, and for one more than each frontier point
        opened: list[tuple[int, int]] = w["open"]  # type: ignore[assignment]
        for c, m in (
            opened + [(c + 1, mem) for c, mem in g.shares] + [(c, mem + 1) for c, mem in g.shares]
        ):
            if not c and not m:
                continue
            fits = any(fc >= c and fm >= m for fc, fm in opened)
            assert fits == any(pc >= c and pm >= m for pc, pm in g.shares), (c, m)
        # compute descending, memory ascending: no point beats another in both
        assert all(a[0] > b[0] and a[1] < b[1] for a, b in pairwise(g.shares))


def test_the_largest_share_is_one_placement_takes() -> None:
    """The frontier's points are shares the scheduler's own placement puts on a GPU, and
    a share bigger than every point fits nowhere."""
    state, index, unusable = _cluster(
        [
            (0, 2, set(), [(30, 25), (100, 100)] + [(0, 0)] * 6, True, False),
            (0, 2, set(), [(0, 0), (0, 0)] + [(0, 0)] * 6, False, False),  # unusable: never
            (0, 1, {0}, [(0, 0)] * 8, True, False),  # unhealthy: never counts
            (0, 1, set(), [(0, 0)] * 8, True, True),  # layer down: a whole GPU, no share
        ]
    )
    (a10,) = by_model(index, unusable)
    assert a10.model == MODELS[0][0] and a10.whole_free == 4 and a10.whole_placeable == 1
    assert a10.shares == ((70, MODELS[0][1] * 3 // 4),)
    unit = state.nodes["n0"].inventory.memory_unit_mib
    usable_nodes = [n for n in state.nodes if n not in unusable]
    policy = BinpackPolicy()
    core, mem = a10.shares[0]

    def placed(c: int, mib: int) -> bool:
        request = pod(f"p{c}-{mib}", core=c, units=mib // unit)
        return any(
            isinstance(place_pod(state.nodes[n], request, policy), Placement) for n in usable_nodes
        )

    assert placed(core, mem)
    assert not placed(core + 10, mem)
    assert not placed(core, mem + unit)


def test_frontier_keeps_only_the_shares_nothing_beats() -> None:
    core = np.array([0, 50, 50, 20, 100, 0], dtype=np.int64)
    mem = np.array([0, 10, 30, 40, 5, 90], dtype=np.int64)
    assert frontier(core, mem) == ((100, 5), (50, 30), (20, 40), (0, 90))
    assert frontier(core[:1], mem[:1]) == ()
    empty: tuple[ModelCapacity, ...] = by_model(ClusterIndex(ClusterState()))
    assert empty == ()
