"""GetPreferredAllocation's choice of the record's units: which units a record needs, and
which pending pod a request is for."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.record_units import (
    Demand,
    PodView,
    choose,
    container_plan,
    next_demand,
)
from deviceplugin.units import device_of
from tessera import resources as rn
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation, RdmaGrant

UUIDS = [f"GPU-8f4c3a0e-0000-4000-8000-00000000000{i}" for i in range(8)]
GPU_KEYS = {u: u for u in UUIDS}
NIC_KEYS = {"mlx5_0": "rdma-mlx5_0", "mlx5_1": "rdma-mlx5_1"}


def _gpu(i: int, core: int = 100) -> GpuGrant:
    return GpuGrant(UUIDS[i], i, i, core, 1024)


def _nic(ibdev: str, share: int) -> RdmaGrant:
    return RdmaGrant("0000:17:00.0", ibdev, 0, share)


def _pod(
    name: str,
    created: str,
    limits: list[tuple[str, int]],
    containers: list[ContainerAllocation],
) -> PodView:
    record = PodAllocation(f"uid-{name}", "ns", name, "node-a", tuple(containers))
    return PodView(f"uid-{name}", "ns", name, created, tuple(limits), record)


def _units(device: str, numbers: range) -> list[str]:
    return [f"{device}::{n}" for n in numbers]


T0, T1 = "2026-11-26T19:00:00Z", "2026-11-26T19:00:01Z"


# --- what a record needs ----------------------------------------------------------------------


def test_one_gpu_takes_the_whole_request_of_every_gpu_resource() -> None:
    entry = ContainerAllocation("main", (_gpu(3, core=30),))
    for resource, limit in [(rn.GPU_CORE, 30), (rn.GPU_MEMORY, 20), (rn.GPU, 25)]:
        plan = container_plan(resource, entry, limit, GPU_KEYS, NIC_KEYS)
        assert plan == ((UUIDS[3], limit),), resource


def test_several_gpus_are_whole_and_split_evenly() -> None:
    entry = ContainerAllocation("main", (_gpu(1), _gpu(2)))
    assert container_plan(rn.GPU, entry, 200, GPU_KEYS, NIC_KEYS) == (
        (UUIDS[1], 100),
        (UUIDS[2], 100),
    )
    assert container_plan(rn.NVIDIA_GPU, entry, 2, GPU_KEYS, NIC_KEYS) == (
        (UUIDS[1], 1),
        (UUIDS[2], 1),
    )
    assert container_plan(rn.GPU, entry, 150, GPU_KEYS, NIC_KEYS) is None  # not even


def test_a_record_the_node_cannot_place_has_no_plan() -> None:
    elsewhere = ContainerAllocation("main", (GpuGrant("GPU-not-here", 0, 0, 100, 1),))
    assert container_plan(rn.GPU, elsewhere, 100, GPU_KEYS, NIC_KEYS) is None
    no_gpus = ContainerAllocation("main", rdma=(_nic("mlx5_0", 50),))
    assert container_plan(rn.GPU_CORE, no_gpus, 30, GPU_KEYS, NIC_KEYS) is None
    assert (
        container_plan(rn.GPU_CORE, ContainerAllocation("m", (_gpu(0),)), 0, GPU_KEYS, {}) is None
    )
    assert container_plan("example.com/other", no_gpus, 50, GPU_KEYS, NIC_KEYS) is None


def test_nics_take_their_record_share() -> None:
    entry = ContainerAllocation("main", rdma=(_nic("mlx5_0", 100), _nic("mlx5_1", 100)))
    assert container_plan(rn.RDMA, entry, 200, GPU_KEYS, NIC_KEYS) == (
        ("rdma-mlx5_0", 100),
        ("rdma-mlx5_1", 100),
    )
    assert container_plan(rn.RDMA, entry, 150, GPU_KEYS, NIC_KEYS) is None  # does not add up
    unknown = ContainerAllocation("main", rdma=(_nic("mlx5_9", 50),))
    assert container_plan(rn.RDMA, unknown, 50, GPU_KEYS, NIC_KEYS) is None


def test_next_demand_follows_the_kubelet_order_and_skips_assigned_containers() -> None:
    pod = _pod(
        "p",
        T0,
        [("setup", 30), ("a", 50), ("b", 100)],
        [
            ContainerAllocation("a", (_gpu(0, 50),)),
            ContainerAllocation("b", (_gpu(1),)),
            ContainerAllocation("setup", (_gpu(0, 30),), init=True, reuses="a"),
        ],
    )
    first = next_demand(rn.GPU, pod, set(), GPU_KEYS, NIC_KEYS)
    assert isinstance(first, Demand) and first.container == "setup"
    assert first.plan == ((UUIDS[0], 30),)
    second = next_demand(rn.GPU, pod, {"setup"}, GPU_KEYS, NIC_KEYS)
    assert isinstance(second, Demand) and (second.container, second.plan) == (
        "a",
        ((UUIDS[0], 50),),
    )
    assert next_demand(rn.GPU, pod, {"setup", "a", "b"}, GPU_KEYS, NIC_KEYS) is None
    # the kubelet's List leaves ordinary init containers out: a later container holding
    # units says the earlier ones were served
    third = next_demand(rn.GPU, pod, {"a"}, GPU_KEYS, NIC_KEYS)
    assert isinstance(third, Demand) and third.container == "b"
    assert next_demand(rn.GPU, pod, {"b"}, GPU_KEYS, NIC_KEYS) is None


def test_next_demand_says_why_a_record_does_not_help() -> None:
    pod = _pod("p", T0, [("main", 30)], [ContainerAllocation("other", (_gpu(0, 30),))])
    reason = next_demand(rn.GPU_CORE, pod, set(), GPU_KEYS, NIC_KEYS)
    assert isinstance(reason, str) and "no container 'main'" in reason
    pod = _pod("q", T0, [("main", 30)], [ContainerAllocation("main", (_gpu(0), _gpu(1)))])
    reason = next_demand(rn.GPU_CORE, pod, set(), GPU_KEYS, NIC_KEYS)
    assert isinstance(reason, str) and "does not place 30" in reason


# --- which pod the request is for ------------------------------------------------------------


def _demand(name: str, created: str, plan: list[tuple[int, int]]) -> Demand:
    pod = _pod(name, created, [("main", sum(n for _, n in plan))], [])
    return Demand(pod, "main", tuple((UUIDS[i], n) for i, n in plan))


def test_the_record_gpu_is_chosen_over_the_tightest_fit() -> None:
    # GPU 1 has 40 free units (the default would fill it); the record says GPU 0
    available = _units(UUIDS[0], range(100)) + _units(UUIDS[1], range(60, 100))
    choice = choose(available, [], 30, [_demand("p", T0, [(0, 30)])])
    assert choice.ids == _units(UUIDS[0], range(30))
    assert choice.demand is not None and choice.demand.pod.name == "p"


def test_only_the_pod_whose_gpus_have_room_fits() -> None:
    available = _units(UUIDS[0], range(100)) + _units(UUIDS[1], range(90, 100))
    demands = [_demand("old", T0, [(1, 30)]), _demand("new", T1, [(0, 30)])]
    choice = choose(available, [], 30, demands)
    assert choice.demand is not None and choice.demand.pod.name == "new"


def test_the_oldest_pod_is_taken_when_strictly_older() -> None:
    available = _units(UUIDS[0], range(100)) + _units(UUIDS[1], range(100))
    demands = [_demand("new", T1, [(0, 30)]), _demand("old", T0, [(1, 30)])]
    choice = choose(available, [], 30, demands)
    assert choice.ids == _units(UUIDS[1], range(30))


def test_pods_created_together_with_different_gpus_are_ambiguous() -> None:
    available = _units(UUIDS[0], range(100)) + _units(UUIDS[1], range(100))
    demands = [_demand("a", T0, [(0, 30)]), _demand("b", T0, [(1, 30)])]
    choice = choose(available, [], 30, demands)
    assert choice.ids is None and "created together" in choice.reason


def test_pods_created_together_on_the_same_gpu_give_one_answer() -> None:
    available = _units(UUIDS[0], range(100))
    demands = [_demand("a", T0, [(0, 30)]), _demand("b", T0, [(0, 30)])]
    assert choose(available, [], 30, demands).ids == _units(UUIDS[0], range(30))


def test_no_fitting_pod_is_no_choice() -> None:
    available = _units(UUIDS[0], range(100))
    assert choose(available, [], 30, []).ids is None
    choice = choose(available, [], 40, [_demand("p", T0, [(0, 30)])])  # another size
    assert choice.ids is None and "1 pending" in choice.reason
    choice = choose(available, [], 30, [_demand("p", T0, [(1, 30)])])  # no units there
    assert choice.ids is None


def test_must_include_units_count_toward_the_record() -> None:
    available = _units(UUIDS[0], range(100)) + _units(UUIDS[1], range(100))
    must = [f"{UUIDS[1]}::7"]
    choice = choose(available, must, 50, [_demand("p", T0, [(1, 50)])])
    assert choice.ids is not None and choice.ids[0] == must[0]
    assert Counter(device_of(u) for u in choice.ids) == {UUIDS[1]: 50}
    # a must-include unit off the record's GPUs: the record cannot be followed
    assert choose(available, must, 50, [_demand("p", T0, [(0, 50)])]).ids is None


def test_a_multi_gpu_record_takes_whole_gpus() -> None:
    available = _units(UUIDS[0], range(50, 100)) + _units(UUIDS[2], range(100))
    available += _units(UUIDS[3], range(100))
    choice = choose(available, [], 200, [_demand("p", T0, [(2, 100), (3, 100)])])
    assert choice.ids is not None
    assert Counter(device_of(u) for u in choice.ids) == {UUIDS[2]: 100, UUIDS[3]: 100}


# --- properties ------------------------------------------------------------------------------


@st.composite
def _cases(draw: st.DrawFn) -> tuple[list[str], list[str], int, list[Demand]]:
    devices = draw(st.integers(1, 5))
    free = [draw(st.integers(0, 12)) for _ in range(devices)]
    available = [u for i, n in enumerate(free) for u in _units(UUIDS[i], range(20 - n, 20))]
    demands = []
    for k in range(draw(st.integers(0, 5))):
        picked = draw(st.lists(st.integers(0, devices - 1), min_size=1, max_size=2, unique=True))
        plan = [(i, draw(st.integers(1, 8))) for i in picked]
        demands.append(_demand(f"p{k}", draw(st.sampled_from([T0, T1])), plan))
    size = draw(st.integers(1, 16))
    must = draw(st.lists(st.sampled_from(available), max_size=3, unique=True)) if available else []
    return available, must, size, demands


def _fits(d: Demand, available: list[str], must: list[str], size: int) -> bool:
    free = Counter(device_of(u) for u in available if u not in must)
    held = Counter(device_of(u) for u in must)
    plan = dict(d.plan)
    return (
        d.size == size
        and all(dev in plan and n <= plan[dev] for dev, n in held.items())
        and all(free[dev] >= n - held[dev] for dev, n in d.plan)
    )


@settings(max_examples=400, deadline=None)
@given(_cases(), st.randoms(use_true_random=False))
def test_choice_properties(
    case: tuple[list[str], list[str], int, list[Demand]], rnd: random.Random
) -> None:
    available, must, size, demands = case
    choice = choose(available, must, size, demands)
    fitting = [d for d in demands if _fits(d, available, must, size)]
    if choice.ids is None:
        # nothing fits, or the fitting pods differ and the oldest is not alone
        oldest = min((d.pod.created for d in fitting), default=None)
        assert not fitting or (
            len({d.plan for d in fitting}) > 1 and sum(d.pod.created == oldest for d in fitting) > 1
        )
    else:
        assert choice.demand in fitting
        assert len(choice.ids) == len(set(choice.ids)) == size
        assert set(choice.ids) <= set(available) and set(must) <= set(choice.ids)
        assert Counter(device_of(u) for u in choice.ids) == dict(choice.demand.plan)
        assert all(choice.demand.pod.created <= d.pod.created for d in fitting)
    # neither the kubelet's ID order nor the order pods were listed in matters
    shuffled_available, shuffled_demands = list(available), list(demands)
    rnd.shuffle(shuffled_available)
    rnd.shuffle(shuffled_demands)
    again = choose(shuffled_available, must, size, shuffled_demands)
    assert (again.ids is None) == (choice.ids is None)
    if choice.ids is not None and again.ids is not None:
        assert set(again.ids) == set(choice.ids)
