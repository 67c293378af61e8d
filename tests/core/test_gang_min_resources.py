"""A PodGroup's `minResources`: read within bounds from what any tenant writes, and judged
against what the nodes have free, as scheduler-plugins' coscheduling judges it."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera import resources as rn
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation, RdmaGrant
from tessera.cluster_state import ClusterState
from tessera.errors import GangError, InputError
from tessera.gang.min_resources import FreeTotals, free_units, min_resources_gap
from tessera.gang.spec import (
    MAX_MIN_RESOURCES,
    NO_MIN_RESOURCES,
    GangKey,
    GangSpec,
    MinResources,
    PodGroupSource,
    parse_min_resources,
)
from tessera.node_placement import Placement, place_pod
from tessera.node_state import NodeState
from tessera.request import parse_pod
from tessera.scoring_policy import BinpackPolicy
from tessera_edge.topology_file import load_topology
from tests.core.builders import SAMPLE_LIMITS, mixed_cluster
from tests.core.builders import pod as pod_of

SOURCE = PodGroupSource()
WHERE = "PodGroup ml/llama: spec.minResources"


def group(min_resources: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "llama", "namespace": "ml"},
        "spec": {"minMember": 8, "minResources": min_resources},
    }


# --- reading it ----------------------------------------------------------------------------


def test_min_resources_read_as_quantities_by_name() -> None:
    spec = SOURCE.parse(
        group({rn.GPU: "800", "cpu": "16", "memory": "64Gi", rn.RDMA: 200, "pods": "8"})
    )
    assert spec == GangSpec(
        GangKey("ml", "llama"),
        8,
        rn.DEFAULT_GANG_TIMEOUT_SECONDS,
        MinResources(
            (
                ("cpu", Decimal(16)),
                ("memory", Decimal(64 * 2**30)),
                ("pods", Decimal(8)),
                (rn.GPU, Decimal(800)),
                (rn.RDMA, Decimal(200)),
            )
        ),
    )


@pytest.mark.parametrize("absent", [{}, {"minResources": None}])
def test_no_min_resources_asks_nothing(absent: dict[str, Any]) -> None:
    obj = {"metadata": {"name": "llama", "namespace": "ml"}, "spec": {"minMember": 2, **absent}}
    spec = SOURCE.parse(obj)
    assert spec.min_resources == NO_MIN_RESOURCES and not spec.min_resources
    assert min_resources_gap(spec.min_resources, {rn.GPU: 0}) is None


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ([rn.GPU], "must be a map"),
        ("tessera.dev/gpu=800", "must be a map"),
        ({f"example.com/r{i}": 1 for i in range(MAX_MIN_RESOURCES + 1)}, "more than 32"),
        ({"": "1"}, "is not a resource name"),
        ({"a b": "1"}, "is not a resource name"),
        ({"x" * 64: "1"}, "is not a resource name"),
        ({"UPPER.example/x": "1"}, "is not a resource name"),
        ({rn.GPU: "-100"}, "must not be negative"),
        ({rn.GPU: "1e999999"}, f"{rn.GPU}: quantity"),
        ({rn.GPU: "9" * 65}, f"{rn.GPU}: quantity of 65 characters"),
        ({rn.GPU: True}, f"{rn.GPU}: not a quantity"),
        ({rn.GPU: {"nested": 1}}, f"{rn.GPU}: not a quantity"),
        ({rn.GPU: 2**64}, f"{rn.GPU}: quantity"),
        ({rn.GPU: "eight"}, f"{rn.GPU}: not a quantity"),
    ],
)
def test_bad_min_resources_are_a_gang_error_naming_the_field(value: Any, error: str) -> None:
    with pytest.raises(GangError, match=error) as caught:
        SOURCE.parse(group(value))
    assert isinstance(caught.value, InputError)
    assert WHERE in str(caught.value)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=70),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
_NAMES = st.sampled_from([rn.GPU, rn.RDMA, "cpu", "memory", "pods", "nvidia.com/gpu"]) | st.text(
    max_size=330
)


@given(
    st.dictionaries(_NAMES, _JSON | st.text(alphabet="0123456789.eEkMGiTm+-", max_size=70)) | _JSON
)
def test_any_min_resources_parse_within_bounds_or_are_a_gang_error(value: Any) -> None:
    try:
        parsed = parse_min_resources(value, WHERE)
    except GangError as exc:
        assert WHERE in str(exc)
        return
    assert len(parsed.amounts) <= MAX_MIN_RESOURCES
    assert all(amount >= 0 and amount <= 2**63 - 1 for _, amount in parsed.amounts)
    assert [name for name, _ in parsed.amounts] == sorted(name for name, _ in parsed.amounts)


# --- what is free --------------------------------------------------------------------------


def _h100() -> NodeState:
    return NodeState(load_topology("h100-sxm-8x", "h100"))


def test_free_units_of_an_empty_node_are_its_devices() -> None:
    node = _h100()
    gpus, nics = node.inventory.gpus, node.inventory.nics
    unit = node.inventory.memory_unit_mib
    assert free_units([node], nvidia_gpu=True) == {
        rn.GPU: 100 * len(gpus),
        rn.GPU_CORE: 100 * len(gpus),
        rn.GPU_MEMORY_RATIO: 100 * len(gpus),
        rn.GPU_MEMORY: sum(g.memory_mib // unit for g in gpus),
        rn.RDMA: 100 * len(nics),
        rn.NVIDIA_GPU: len(gpus),
    }
    assert rn.NVIDIA_GPU not in free_units([node])


def test_free_units_leave_out_what_pods_hold_and_unhealthy_devices() -> None:
    state = ClusterState()
    inventory = load_topology("h100-sxm-8x", "h100")
    g0, g1, g2 = inventory.gpus[:3]
    nic = inventory.nics[0]
    inventory = inventory.with_gpu_health(g2.uuid, False).with_nic_health(nic.ibdev, False)
    state.set_node(inventory)
    half_memory = g1.memory_mib // 2
    state.add(
        PodAllocation(
            "uid-a",
            "ml",
            "a",
            "h100",
            (
                ContainerAllocation(
                    "main",
                    gpus=(
                        GpuGrant(g0.uuid, g0.index, g0.minor, 100, g0.memory_mib),
                        GpuGrant(g1.uuid, g1.index, g1.minor, 30, half_memory),
                    ),
                    rdma=(RdmaGrant(inventory.nics[1].pci_bus_id, inventory.nics[1].ibdev, 0, 25),),
                ),
            ),
        )
    )
    free = free_units(state.nodes.values(), nvidia_gpu=True)
    healthy = len(inventory.gpus) - 1
    unit = inventory.memory_unit_mib
    # GPU 0 is taken, GPU 1 has 70 % of its compute and half its memory, GPU 2 is unhealthy
    assert free[rn.GPU_CORE] == 100 * (healthy - 2) + 70
    assert free[rn.GPU] == 100 * (healthy - 2) + 50
    assert free[rn.GPU_MEMORY_RATIO] == 100 * (healthy - 2) + 50
    assert free[rn.NVIDIA_GPU] == healthy - 2
    assert (
        free[rn.GPU_MEMORY]
        == sum(g.memory_mib // unit for g in inventory.gpus[3:])
        + (g1.memory_mib - half_memory) // unit
    )
    # NIC 0 is unhealthy, a quarter of NIC 1 is held
    assert free[rn.RDMA] == 100 * (len(inventory.nics) - 2) + 75


# --- the totals kept as the state changes ----------------------------------------------------

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "remove", "health", "drop", "back"]),
        st.sampled_from(SAMPLE_LIMITS),
        st.integers(0, 5),
        st.booleans(),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_OPS, st.sets(st.integers(0, 5)), st.integers(0, 5), st.booleans())
def test_kept_totals_are_the_sums_over_the_nodes_asked_about(
    ops: list[tuple[str, dict[str, str], int, bool]],
    closed: set[int],
    swap: int,
    nvidia_gpu: bool,
) -> None:
    """After any pods placed and removed, devices turning unhealthy, nodes gone and back,
    with totals asked for now and then: the kept totals, less the nodes left out and with a
    node replaced by a trial copy, are `free_units` over exactly those nodes."""
    state = mixed_cluster(6, "n")
    inventories = {name: node.inventory for name, node in state.nodes.items()}
    names = sorted(inventories)
    kept = FreeTotals(state)
    live: list[str] = []
    for k, (op, limits, which, ask) in enumerate(ops):
        name = names[which]
        if op == "add" and name in state.nodes:
            request = parse_pod(pod_of(f"p{k}", containers={"main": limits}))
            result = place_pod(state.nodes[name], request, BinpackPolicy())
            if isinstance(result, Placement):
                state.add(result.allocation)
                live.append(request.uid)
        elif op == "remove" and live:
            state.remove(live.pop(which % len(live)))
        elif op == "health" and name in state.nodes:
            inventory = state.nodes[name].inventory
            state.set_node(inventory.with_gpu_health(inventory.gpus[0].uuid, ask))
        elif op == "drop":
            state.remove_node(name)
        elif op == "back" and name not in state.nodes:
            state.set_node(inventories[name])
        if ask:
            assert kept.totals() == free_units(state.nodes.values())
    leave_out = {names[i] for i in closed}
    trial = None
    if names[swap] in state.nodes and names[swap] not in leave_out:
        trial = state.nodes[names[swap]].copy()
        for alloc in list(state.pods_on(names[swap]))[:1]:
            trial.release(alloc)
    replaced = {} if trial is None else {names[swap]: trial}
    counted = [
        replaced.get(n, node) for n, node in sorted(state.nodes.items()) if n not in leave_out
    ]
    assert kept.totals(leave_out=leave_out, replaced=replaced, nvidia_gpu=nvidia_gpu) == free_units(
        counted, nvidia_gpu=nvidia_gpu
    )


def test_a_node_left_out_and_replaced_counts_nothing() -> None:
    state = mixed_cluster(2, "n")
    kept = FreeTotals(state)
    alone = free_units([state.nodes["n1"]])
    assert kept.totals(leave_out={"n0"}, replaced={"n0": state.nodes["n0"].copy()}) == alone


# --- the gap ---------------------------------------------------------------------------------


def test_a_gang_asking_more_than_is_free_waits_naming_what_is_short() -> None:
    wanted = parse_min_resources({rn.GPU: "800", rn.RDMA: "200", "cpu": "64"}, WHERE)
    free = free_units([_h100()])
    assert min_resources_gap(wanted, free) is None  # 8 GPUs and 4 NICs free; cpu not ours
    busy = {**free, rn.GPU: 300, rn.RDMA: 100}
    assert min_resources_gap(wanted, busy) == (
        f"minResources not free: {rn.GPU} 800 wanted, 300 free; {rn.RDMA} 200 wanted, 100 free"
    )
    assert min_resources_gap(wanted, {**busy, rn.RDMA: 200}) == (
        f"minResources not free: {rn.GPU} 800 wanted, 300 free"
    )


def test_resources_tessera_does_not_hold_are_left_to_kube_scheduler() -> None:
    wanted = parse_min_resources({"cpu": "1000", "memory": "1Ei", "example.com/fpga": 9}, WHERE)
    assert min_resources_gap(wanted, free_units([_h100()])) is None


def test_a_fraction_is_shown_as_written() -> None:
    wanted = parse_min_resources({rn.GPU_CORE: "250.5"}, WHERE)
    assert min_resources_gap(wanted, {rn.GPU_CORE: 250}) == (
        f"minResources not free: {rn.GPU_CORE} 250.5 wanted, 250 free"
    )


_COUNTED = st.sampled_from([rn.GPU, rn.GPU_CORE, rn.GPU_MEMORY, rn.RDMA, "cpu"])


@given(
    st.dictionaries(_COUNTED, st.integers(0, 10**6), max_size=5),
    st.dictionaries(_COUNTED, st.integers(0, 10**6), max_size=5),
)
def test_a_gang_waits_exactly_when_a_counted_resource_is_short(
    asked: dict[str, int], free: dict[str, int]
) -> None:
    wanted = parse_min_resources(asked, WHERE)
    reason = min_resources_gap(wanted, free)
    short = sorted(name for name, amount in asked.items() if name in free and amount > free[name])
    if not short:
        assert reason is None
        return
    assert reason is not None and reason.startswith("minResources not free: ")
    named = [
        part.split(" ")[0] for part in reason.removeprefix("minResources not free: ").split("; ")
    ]
    assert named == short
