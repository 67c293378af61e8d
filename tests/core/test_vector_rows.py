"""What every vector form reads of index rows the same way: which slots hold a healthy GPU
and the free compute on them; and the shape cache keyed by a case's request shape."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.cluster_index import ClusterIndex
from tessera.cluster_state import ClusterState
from tessera.fragmentation import ShapeCache
from tessera.resources import UNITS_PER_DEVICE
from tessera.scoring_policy import HostCase, IntArray, ShareCase, WholeCase, gpu_slots, idle_core
from tests.core.test_fragmentation_policy import inventory

_NODE = st.tuples(
    st.integers(1, 8),  # GPUs
    st.sets(st.integers(0, 7), max_size=3),  # unhealthy slots
    st.lists(st.sampled_from([0, 10, 50, 100]), min_size=8, max_size=8),  # core taken
)


@settings(max_examples=40, deadline=None)
@given(st.lists(_NODE, min_size=1, max_size=6))
def test_gpu_slots_and_idle_core_are_each_nodes_healthy_gpus(
    nodes: list[tuple[int, set[int], list[int]]],
) -> None:
    state = ClusterState()
    index = ClusterIndex(state, rows=2, gpu_slots=2)
    for n, (count, unhealthy, taken) in enumerate(nodes):
        inv = inventory(f"n{n}", count, 0, tuple(s for s in unhealthy if s < count))
        state.set_node(inv)
        for slot, core in enumerate(taken[:count]):
            if core:
                g = inv.gpus[slot]
                grant = GpuGrant(g.uuid, g.index, g.minor, core, g.memory_mib * core // 100)
                uid = f"n{n}-{slot}"
                alloc = PodAllocation(
                    uid, "d", uid, inv.node_name, (ContainerAllocation("c", (grant,)),)
                )
                state.add(alloc)
    rows = index.all_rows()
    slots, idle = gpu_slots(index, rows), idle_core(index, rows)
    for i, row in enumerate(rows.tolist()):
        node = state.nodes[index.names[row] or ""]
        healthy = [g.healthy for g in node.inventory.gpus]
        assert slots[i].tolist() == healthy + [False] * (index.slots - len(healthy))
        assert idle[i] == sum(f for f, h in zip(node.free_core, healthy, strict=True) if h)


def test_the_shape_cache_keys_a_case_by_its_kind_and_shape() -> None:
    state = ClusterState()
    index = ClusterIndex(state)
    for n in range(3):
        state.set_node(inventory(f"n{n}", 2))
    rows = index.all_rows()
    cache = ShapeCache()
    computed: list[list[int]] = []

    def compute(stale: IntArray) -> np.ndarray:
        computed.append(stale.tolist())
        return stale.astype(np.float64)

    whole = WholeCase(1, np.ones((3, 2), dtype=np.bool_), shape=("one",))
    host = HostCase(shape=("one",))
    for _ in range(2):
        assert cache.for_case(index, rows, whole, 0, compute).tolist() == [0.0, 1.0, 2.0]
    assert computed == [[0, 1, 2]]  # the second call found every row cached
    cache.for_case(index, rows, host, 0, compute)  # same shape, another kind of case
    unknown = WholeCase(1, np.ones((3, 2), dtype=np.bool_))
    cache.for_case(index, rows, unknown, 0, compute)
    cache.for_case(index, rows, unknown, 0, compute)  # no shape: never cached
    assert computed == [[0, 1, 2]] * 4


def test_a_case_says_the_gpu_compute_it_asks() -> None:
    need = np.zeros((1, 2), dtype=np.int64)
    fits = np.ones((1, 2), dtype=np.bool_)
    assert ShareCase(30, need, fits).core_asked == 30
    assert WholeCase(2, fits).core_asked == 2 * UNITS_PER_DEVICE
    assert HostCase(cpu_milli=500).core_asked == 0
