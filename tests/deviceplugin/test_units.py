from __future__ import annotations

import gc
import math
import random
import tracemalloc
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.server import ResourceState, build_snapshot
from deviceplugin.units import (
    MAX_UNITS_PER_RESOURCE,
    LimitError,
    ResourceUnits,
    Unit,
    UnitConfig,
    allocation_summary,
    build_units,
    check_limits,
    device_of,
    preferred_allocation,
    resource_name_problem,
    snapshot_size,
    validate_resource_name,
)
from tessera import resources as rn
from tessera.model import Gpu, NodeInventory
from tessera_edge.topology_file import load_topology
from tessera_testbed.kubelet import kubelet_accepts


@pytest.fixture(scope="module")
def h100() -> NodeInventory:
    return load_topology("h100-sxm-8x", "node-a")


def test_h100_unit_counts_follow_the_resource_table(h100: NodeInventory) -> None:
    units = build_units(h100, UnitConfig())
    counts = {r: len(u.units) for r, u in units.items()}
    per_gpu_memory = 81559 // 1024
    assert counts == {
        rn.GPU_CORE: 800,
        rn.GPU_MEMORY_RATIO: 800,
        rn.GPU_MEMORY: 8 * per_gpu_memory,
        rn.GPU: 800,
        rn.RDMA: 400,
    }


def test_unit_ids_are_unique_short_and_name_their_device(h100: NodeInventory) -> None:
    units = build_units(h100, UnitConfig(nvidia_gpu=True))
    numa_of = {g.uuid: g.numa_node for g in h100.gpus}
    numa_of.update({f"rdma-{n.ibdev}": n.numa_node for n in h100.nics})
    for resource, ru in units.items():
        ids = [u.id for u in ru.units]
        assert len(ids) == len(set(ids)), resource
        for unit in ru.units:
            assert len(unit.id) <= 63
            assert device_of(unit.id) == unit.device
            assert unit.id.split("::")[0] == unit.device  # where dcgm-exporter cuts it
            assert unit.numa_node == numa_of[unit.device]
        per_device = Counter(u.device for u in ru.units)
        assert list(per_device) == list(ru.devices)


def test_memory_units_follow_the_configured_unit(h100: NodeInventory) -> None:
    units = build_units(h100, UnitConfig(memory_unit_mib=4096))
    assert len(units[rn.GPU_MEMORY].units) == 8 * (81559 // 4096)


def test_nvidia_gpu_is_off_by_default_and_one_id_per_gpu(h100: NodeInventory) -> None:
    assert rn.NVIDIA_GPU not in build_units(h100, UnitConfig())
    whole = build_units(h100, UnitConfig(nvidia_gpu=True))[rn.NVIDIA_GPU]
    assert [u.id for u in whole.units] == [g.uuid for g in h100.gpus]


def test_rdma_only_with_nics() -> None:
    t4 = load_topology("t4-4x")
    assert rn.RDMA not in build_units(t4, UnitConfig())


def test_unhealthy_gpu_units_are_unhealthy_in_every_gpu_resource(h100: NodeInventory) -> None:
    uuid = h100.gpus[3].uuid
    sick = h100.with_gpu_health(uuid, False, "XID 79")
    units = build_units(sick, UnitConfig(nvidia_gpu=True))
    for resource, ru in units.items():
        bad = {u.device for u in ru.units if not u.healthy}
        assert bad == (set() if resource == rn.RDMA else {uuid}), resource
        assert all(u.health == ("Unhealthy" if u.device == uuid else "Healthy") for u in ru.units)


@pytest.mark.parametrize("numa", [-1, 0, 1, 7, 300, 2**31])
def test_snapshot_size_is_the_exact_protobuf_size(numa: int) -> None:
    units = ResourceUnits(
        rn.GPU_CORE,
        tuple(
            Unit(f"GPU-{i}::{n}", f"GPU-{i}", i % 2 == 0, numa)
            for i in range(3)
            for n in range(150)
        ),
    )
    assert snapshot_size(units) == build_snapshot(units).ByteSize()


def _one_gpu(memory_mib: int) -> NodeInventory:
    gpu = Gpu("rn.GPU-x", 0, 0, "X", memory_mib, pci_bus_id="0000:01:00.0")
    return NodeInventory("n", (gpu,), memory_unit_mib=1)


def test_limit_is_32768_ids_per_resource() -> None:
    config = UnitConfig(memory_unit_mib=1)
    at_limit = build_units(_one_gpu(MAX_UNITS_PER_RESOURCE), config)
    check_limits(at_limit, 1)
    over = build_units(_one_gpu(MAX_UNITS_PER_RESOURCE + 1), config)
    with pytest.raises(LimitError) as err:
        check_limits(over, 1)
    assert "tessera.dev/gpu-memory" in str(err.value)
    assert "32768" in str(err.value)


def test_a_too_small_memory_unit_is_refused_with_the_fix(h100: NodeInventory) -> None:
    units = build_units(h100, UnitConfig(memory_unit_mib=16))
    with pytest.raises(LimitError) as err:
        check_limits(units, 16)
    least = math.ceil(8 * (81559 // 16) * 16 / MAX_UNITS_PER_RESOURCE)
    assert f"--memory-unit-mib to at least {least}" in str(err.value)
    # and that suggestion is indeed accepted
    check_limits(build_units(h100, UnitConfig(memory_unit_mib=least)), least)


def test_the_message_budget_is_enforced_too() -> None:
    units = {
        rn.GPU_CORE: ResourceUnits(
            rn.GPU_CORE, tuple(Unit(f"GPU-0::{n}", "GPU-0", True, 0) for n in range(100))
        )
    }
    check_limits(units, 1024)
    with pytest.raises(LimitError, match="byte"):
        check_limits(units, 1024, budget_bytes=snapshot_size(units[rn.GPU_CORE]) - 1)


def test_default_configuration_of_every_builtin_is_accepted() -> None:
    for name in ("h100-sxm-8x", "a100-pcie-8x", "t4-4x"):
        check_limits(build_units(load_topology(name), UnitConfig(nvidia_gpu=True)), 1024)


# --- resource names ------------------------------------------------------------------------


@pytest.mark.parametrize("name", rn.ALL_RESOURCES)
def test_every_resource_we_advertise_passes_kubelet_rules(name: str) -> None:
    validate_resource_name(name)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("gpu", "no domain"),
        ("kubernetes.io/gpu", "reserved"),
        ("foo.kubernetes.io/gpu", "reserved"),
        ("requests.example.com/gpu", "requests."),
        ("example.com/a/b", "more than one"),
        ("Example.com/gpu", "DNS-1123"),
        ("example.com/-gpu", "name part"),
        ("example.com/" + "g" * 64, "name part"),
        ("example.com/", "name part"),
    ],
)
def test_names_kubelet_refuses(name: str, why: str) -> None:
    problem = resource_name_problem(name)
    assert problem is not None and why in problem
    with pytest.raises(ValueError, match=r'the ResourceName ".*" is invalid'):
        validate_resource_name(name)


def test_name_part_of_63_characters_is_fine() -> None:
    assert resource_name_problem("example.com/" + "g" * 63) is None


@settings(max_examples=300, deadline=None)
@given(
    st.builds(
        lambda a, mid, b: a + mid + b,
        st.text(alphabet="abAB09-._/", max_size=10),
        st.sampled_from(["", "/", "kubernetes.io/", "requests.", ".", "//", "x" * 64]),
        st.text(alphabet="abAB09-._/", max_size=10),
    )
)
def test_our_rules_agree_with_the_simulated_kubelet(name: str) -> None:
    assert (resource_name_problem(name) is None) == kubelet_accepts(name)


# --- preferred allocation --------------------------------------------------------------------


def _ids(device: str, count: int, start: int = 0) -> list[str]:
    return [f"{device}::{n}" for n in range(start, start + count)]


def test_preferred_allocation_on_the_captured_request() -> None:
    # the captured kubelet request's IDs gpu0-core-<n>, as this plugin names them
    available = [f"GPU-0::{n}" for n in (2, 3, 4, 5, 6, 7, 0, 1)]
    chosen = preferred_allocation(available, [], 3)
    assert chosen == ["GPU-0::0", "GPU-0::1", "GPU-0::2"]


def test_one_device_that_fits_wins_and_the_tightest_fit_is_used() -> None:
    available = _ids("GPU-0", 30) + _ids("GPU-1", 100) + _ids("GPU-2", 50)
    chosen = preferred_allocation(available, [], 40)
    assert {device_of(u) for u in chosen} == {"GPU-2"}
    assert len(chosen) == 40


def test_spanning_devices_uses_as_few_as_possible() -> None:
    available = _ids("GPU-0", 30) + _ids("GPU-1", 100) + _ids("GPU-2", 50)
    chosen = preferred_allocation(available, [], 120)
    assert Counter(device_of(u) for u in chosen) == {"GPU-1": 100, "GPU-0": 20}


def test_must_include_is_kept_and_its_device_filled_first() -> None:
    available = _ids("GPU-0", 80) + _ids("GPU-1", 80)
    chosen = preferred_allocation(available, ["GPU-1::5"], 10)
    assert chosen[0] == "GPU-1::5"
    assert {device_of(u) for u in chosen} == {"GPU-1"}
    assert len(set(chosen)) == 10


def test_asking_for_more_than_available_returns_everything() -> None:
    available = _ids("GPU-0", 5)
    assert sorted(preferred_allocation(available, [], 9)) == sorted(available)


def _min_devices(free: list[int], need: int) -> int:
    used = 0
    for count in sorted(free, reverse=True):
        if need <= 0:
            break
        need -= count
        used += 1
    return used


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=8),
    st.integers(min_value=0, max_value=200),
    st.randoms(use_true_random=False),
)
def test_preferred_allocation_properties(free: list[int], size: int, rnd: random.Random) -> None:
    available = [u for i, n in enumerate(free) for u in _ids(f"GPU-{i}", n)]
    rnd.shuffle(available)
    chosen = preferred_allocation(available, [], size)
    assert len(chosen) == len(set(chosen)) == min(size, len(available))
    assert set(chosen) <= set(available)
    devices = {device_of(u) for u in chosen}
    assert len(devices) == _min_devices(free, min(size, len(available)))


@pytest.mark.parametrize(
    "hostile",
    [
        "GPU-0::01",
        "GPU-0::123456",
        "GPU-0::" + "9" * 5000,
        "GPU-0::\u0661",
        "::1",
        "GPU-0::",
        "GPU-0::1::2",
        "GPU-0::-1",
        "GPU-0:1",
    ],
)
def test_hostile_unit_numbers_name_no_device(hostile: str) -> None:
    # a leading zero, more digits than any advertised unit, non-ASCII digits, no device, a
    # second separator: never ours, so the ID is its own device and no int() of an
    # unbounded digit string happens
    assert device_of(hostile) == hostile
    assert allocation_summary([hostile, "GPU-0::1"]) == f"{hostile}:1,GPU-0:1"


def test_allocation_summary_counts_units_per_device() -> None:
    ids = ["GPU-b::0", "GPU-a::3", "GPU-b::7", "rdma-mlx5_0::1", "GPU-c"]
    assert allocation_summary(ids) == "GPU-b:2,GPU-a:1,rdma-mlx5_0:1,GPU-c:1"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.builds(
                lambda d, k, n: f"GPU-{d}{k}{n}",
                st.integers(0, 3),
                st.sampled_from(["::", ":", ":::", ""]),
                st.integers(0, 120),
            ),
            st.text(alphabet="GPU0-1x:", max_size=8),
        ),
        max_size=40,
    )
)
def test_allocation_summary_agrees_with_device_of(ids: list[str]) -> None:
    expected = Counter(device_of(u) for u in ids)
    summary = allocation_summary(ids)
    got = (
        Counter()
        if not summary
        else Counter(
            {item.rsplit(":", 1)[0]: int(item.rsplit(":", 1)[1]) for item in summary.split(",")}
        )
    )
    assert got == expected


def test_preferred_allocation_over_thousands_of_devices() -> None:
    """The device choice is O(D log D): 30000 one-unit devices (whole-device IDs) used to take
    minutes, one scan of every device per device taken."""
    available = [f"GPU-{n}" for n in range(30_000)]
    chosen = preferred_allocation(available, [], 15_000)
    assert chosen == available[:15_000]  # equal sizes: the first listed first


def test_the_units_of_a_node_and_their_snapshots_stay_small() -> None:
    """An 8x H100 node advertises ~3,400 unit IDs, held for the agent's lifetime: a unit has
    no per-instance dict, and a resource's snapshot keeps the units themselves to compare the
    next one against (not a copy of their fields)."""
    inventory = load_topology("h100-sxm-8x")
    gc.collect()
    tracemalloc.start()
    try:
        units = build_units(inventory, UnitConfig())
        built = tracemalloc.get_traced_memory()[0]
        states = {resource: ResourceState(resource) for resource in units}
        before = tracemalloc.get_traced_memory()[0]
        for resource, advertised in units.items():
            assert states[resource].update(advertised)
        installed = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    count = sum(len(u.units) for u in units.values())
    assert count > 3000
    # besides the serialized snapshots (the test below): the set of known IDs
    sent = sum(len(build_snapshot(u).SerializeToString()) for u in units.values())
    # measured with CPython 3.11: 162 and 48 bytes a unit (203 and 120 before)
    assert built / count < 180
    assert (installed - sent) / count < 80


def test_a_resource_keeps_its_snapshot_as_the_bytes_it_sends() -> None:
    """~200 KB for an 8x H100 node's five resources instead of ~0.7 MB of message objects."""
    units = build_units(load_topology("h100-sxm-8x"), UnitConfig())[rn.GPU_CORE]
    state = ResourceState(rn.GPU_CORE)
    assert state.update(units)
    got = state.wait_newer(0, 0, 0.0)
    assert got is not None
    assert got[1] == build_snapshot(units).SerializeToString()
