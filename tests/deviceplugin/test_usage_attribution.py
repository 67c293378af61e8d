"""Attribution of GPU use: the driver's per-GPU process lists joined with each process's
owner and the pods the agent knows, into one row per tessera container and GPU (beside its
grant) and one per GPU and owner for everything else; and the watch that reports, once, a
container using more than it was granted."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.backend import GpuProcess, GpuProcesses
from deviceplugin.usage import (
    COMPUTE_READINGS,
    COMPUTE_SLACK_PERCENT,
    MEMORY_SLACK_MIB,
    MIB,
    OWNER_CONTAINER,
    Breach,
    GpuUse,
    OtherUse,
    OverGrantWatch,
    Owner,
    PodView,
    UsageSnapshot,
    attribute,
)
from tessera.allocation import GpuGrant
from tessera.usage import (
    OWNER_HOST,
    OWNER_MPS_SERVER,
    OWNER_OTHER_POD,
    OWNERS,
    ContainerUsage,
    NodeUsage,
    UnattributedUsage,
    decode_usage,
    encode_usage,
)

AT = "2026-11-26T19:00:00Z"
GPU0 = "GPU-1b2c3d4e-0000-4000-8000-000000000000"
GPU1 = "GPU-1b2c3d4e-0000-4000-8000-000000000001"
GPU2 = "GPU-1b2c3d4e-0000-4000-8000-000000000002"
INDEX = {GPU0: 0, GPU1: 1, GPU2: 2}
UID_A = "2cde702b-a0cf-438d-a228-fb164e54434b"
UID_B = "43156c7c-e1b4-4833-a9d4-b70899e5ca0d"
MAIN, SIDE = "a" * 64, "b" * 64


def proc(pid: int, mib: int | None, sm: int | None = None, *, mps: bool = False) -> GpuProcess:
    return GpuProcess(pid, None if mib is None else mib * MIB, sm, mps)


def gpu(uuid: str, *procs: GpuProcess, error: str = "") -> GpuProcesses:
    return GpuProcesses(uuid, procs, error)


def grant(uuid: str, core: int, memory_mib: int) -> GpuGrant:
    return GpuGrant(uuid, INDEX[uuid], INDEX[uuid], core, memory_mib)


def in_container(uid: str, cid: str) -> Owner:
    return Owner(OWNER_CONTAINER, uid, cid)


def trainer(
    grants: Mapping[str, Mapping[str, GpuGrant]] | None = None,
    containers: Mapping[str, str] | None = None,
) -> PodView:
    """Pod A: containers `main` (ID MAIN) and `side` (ID SIDE); by default a record that
    grants `main` 30% and 4 GiB of GPU 0."""
    return PodView(
        UID_A,
        "ml",
        "trainer-0",
        {MAIN: "main", SIDE: "side"} if containers is None else containers,
        {"main": {GPU0: grant(GPU0, 30, 4096)}} if grants is None else grants,
    )


def other(uuid: str, owner: str, mib: int, processes: int) -> OtherUse:
    return OtherUse(uuid, INDEX.get(uuid, -1), owner, mib * MIB, processes)


# -- attribute -----------------------------------------------------------------------------


def test_a_containers_processes_are_summed_per_gpu_beside_its_grant() -> None:
    pods = {UID_A: trainer({"main": {GPU0: grant(GPU0, 30, 4096), GPU1: grant(GPU1, 50, 8192)}})}
    owners = {10: in_container(UID_A, MAIN), 11: in_container(UID_A, MAIN)}
    readings = [
        gpu(GPU0, proc(10, 1000, 20), proc(11, 500, 15)),
        gpu(GPU1, proc(10, 300, None), proc(11, 200, None)),
    ]
    snap = attribute(readings, owners, pods, INDEX)
    assert snap.containers == (
        GpuUse(UID_A, "ml", "trainer-0", "main", GPU0, 0, 1500 * MIB, 35, 2, 30, 4096),
        GpuUse(UID_A, "ml", "trainer-0", "main", GPU1, 1, 500 * MIB, None, 2, 50, 8192),
    )
    assert snap.other == ()
    assert snap.errors == ()


def test_sm_is_the_sum_of_the_sampled_processes_only() -> None:
    owners = {pid: in_container(UID_A, MAIN) for pid in (1, 2, 3)}
    readings = [gpu(GPU0, proc(1, 10, None), proc(2, 10, 40), proc(3, 10, 0))]
    (use,) = attribute(readings, owners, {UID_A: trainer()}, INDEX).containers
    assert use.sm_percent == 40
    assert use.processes == 3


def test_a_sampled_zero_is_not_an_unsampled_share() -> None:
    owners = {1: in_container(UID_A, MAIN)}
    (use,) = attribute([gpu(GPU0, proc(1, 10, 0))], owners, {UID_A: trainer()}, INDEX).containers
    assert use.sm_percent == 0


def test_memory_the_driver_does_not_report_counts_as_none_but_the_process_counts() -> None:
    owners = {1: in_container(UID_A, MAIN), 2: in_container(UID_A, MAIN), 3: Owner(OWNER_HOST)}
    readings = [gpu(GPU0, proc(1, None), proc(2, 64), proc(3, None))]
    snap = attribute(readings, owners, {UID_A: trainer()}, INDEX)
    (use,) = snap.containers
    assert (use.used_bytes, use.processes) == (64 * MIB, 2)
    assert snap.other == (other(GPU0, OWNER_HOST, 0, 1),)


def test_mps_clients_count_toward_their_own_container() -> None:
    owners = {1: in_container(UID_A, MAIN), 2: Owner(OWNER_MPS_SERVER)}
    readings = [gpu(GPU0, proc(1, 700, None, mps=True), proc(2, 30, 55))]
    snap = attribute(readings, owners, {UID_A: trainer()}, INDEX)
    (use,) = snap.containers
    assert (use.used_bytes, use.sm_percent, use.processes) == (700 * MIB, None, 1)
    assert snap.other == (other(GPU0, OWNER_MPS_SERVER, 30, 1),)


def test_a_gpu_not_granted_to_a_container_in_the_record_shows_a_zero_grant() -> None:
    owners = {7: in_container(UID_A, MAIN), 8: in_container(UID_A, MAIN)}
    readings = [gpu(GPU0, proc(7, 100, 10)), gpu(GPU2, proc(8, 2048, 90))]
    snap = attribute(readings, owners, {UID_A: trainer()}, INDEX)
    assert snap.containers == (
        GpuUse(UID_A, "ml", "trainer-0", "main", GPU0, 0, 100 * MIB, 10, 1, 30, 4096),
        GpuUse(UID_A, "ml", "trainer-0", "main", GPU2, 2, 2048 * MIB, 90, 1, 0, 0),
    )
    assert snap.other == ()


def test_a_container_the_record_names_with_no_gpus_is_a_container_row() -> None:
    pods = {UID_A: trainer({"main": {GPU0: grant(GPU0, 30, 4096)}, "side": {}})}
    owners = {5: in_container(UID_A, SIDE)}
    (use,) = attribute([gpu(GPU1, proc(5, 10))], owners, pods, INDEX).containers
    assert (use.container, use.granted_core, use.granted_memory_mib) == ("side", 0, 0)


def test_a_pod_without_a_record_is_another_pods_use_never_a_container_row() -> None:
    unrecorded = PodView(UID_B, "default", "other-plugin", {MAIN: "cuda"}, None)
    owners = {1: in_container(UID_B, MAIN), 2: in_container(UID_B, MAIN)}
    readings = [gpu(GPU0, proc(1, 100, 50), proc(2, 28, 5)), gpu(GPU1, proc(1, 4, 1))]
    snap = attribute(readings, owners, {UID_B: unrecorded}, INDEX)
    assert snap.containers == ()
    assert snap.other == (
        other(GPU0, OWNER_OTHER_POD, 128, 2),
        other(GPU1, OWNER_OTHER_POD, 4, 1),
    )


def test_an_empty_record_is_still_a_record_but_names_no_container() -> None:
    pods = {UID_A: trainer(grants={})}
    owners = {1: in_container(UID_A, MAIN)}
    snap = attribute([gpu(GPU0, proc(1, 64))], owners, pods, INDEX)
    assert snap.containers == ()
    assert snap.other == (other(GPU0, OWNER_OTHER_POD, 64, 1),)


def test_a_container_id_the_pod_does_not_list_is_another_pods_use() -> None:
    owners = {1: in_container(UID_A, "c" * 64)}
    snap = attribute([gpu(GPU0, proc(1, 64))], owners, {UID_A: trainer()}, INDEX)
    assert snap.containers == ()
    assert snap.other == (other(GPU0, OWNER_OTHER_POD, 64, 1),)


def test_a_container_the_record_does_not_name_is_another_pods_use() -> None:
    owners = {1: in_container(UID_A, SIDE)}  # "side" is in the pod, not in its record
    snap = attribute([gpu(GPU0, proc(1, 64, 3))], owners, {UID_A: trainer()}, INDEX)
    assert snap.containers == ()
    assert snap.other == (other(GPU0, OWNER_OTHER_POD, 64, 1),)


def test_a_pod_the_agent_does_not_know_is_another_pods_use() -> None:
    owners = {1: in_container(UID_B, MAIN)}
    snap = attribute([gpu(GPU0, proc(1, 64))], owners, {UID_A: trainer()}, INDEX)
    assert snap.containers == ()
    assert snap.other == (other(GPU0, OWNER_OTHER_POD, 64, 1),)


def test_host_and_mps_server_processes_are_grouped_per_gpu_and_owner() -> None:
    owners = {1: Owner(OWNER_HOST), 2: Owner(OWNER_HOST), 3: Owner(OWNER_MPS_SERVER)}
    readings = [
        gpu(GPU1, proc(1, 100), proc(2, 50), proc(3, 25, 80)),
        gpu(GPU0, proc(3, 25, 80), proc(2, 8)),
    ]
    snap = attribute(readings, owners, {}, INDEX)
    assert snap.containers == ()
    assert snap.other == (
        other(GPU0, OWNER_HOST, 8, 1),
        other(GPU0, OWNER_MPS_SERVER, 25, 1),
        other(GPU1, OWNER_HOST, 150, 2),
        other(GPU1, OWNER_MPS_SERVER, 25, 1),
    )


def test_a_pid_without_an_owner_is_a_host_process() -> None:
    snap = attribute([gpu(GPU0, proc(99, 12, 7))], {}, {UID_A: trainer()}, INDEX)
    assert snap.other == (other(GPU0, OWNER_HOST, 12, 1),)


def test_a_gpu_whose_list_could_not_be_read_is_an_error_and_nothing_else() -> None:
    owners = {1: in_container(UID_A, MAIN), 2: Owner(OWNER_HOST)}
    readings = [
        gpu(GPU0, proc(1, 512, 40), proc(2, 64), error="NVML_ERROR_GPU_IS_LOST"),
        gpu(GPU1, proc(1, 16)),
        gpu(GPU2, error="timeout"),
    ]
    snap = attribute(readings, owners, {UID_A: trainer()}, INDEX)
    assert snap.errors == (f"{GPU0}: NVML_ERROR_GPU_IS_LOST", f"{GPU2}: timeout")
    assert [u.gpu for u in snap.containers] == [GPU1]
    assert snap.other == ()


def test_a_gpu_missing_from_the_index_is_minus_one() -> None:
    unknown = "GPU-ffffffff-0000-4000-8000-000000000000"
    owners = {1: in_container(UID_A, MAIN), 2: Owner(OWNER_HOST)}
    snap = attribute([gpu(unknown, proc(1, 1), proc(2, 1))], owners, {UID_A: trainer()}, {})
    assert [u.gpu_index for u in snap.containers] == [-1]
    assert [o.gpu_index for o in snap.other] == [-1]


def test_containers_of_several_pods_each_get_their_row() -> None:
    pod_b = PodView(UID_B, "ml", "eval-0", {SIDE: "eval"}, {"eval": {GPU0: grant(GPU0, 20, 2048)}})
    pods = {UID_A: trainer(), UID_B: pod_b}
    owners = {1: in_container(UID_A, MAIN), 2: in_container(UID_B, SIDE)}
    readings = [gpu(GPU0, proc(2, 300, 12), proc(1, 200, 25))]
    snap = attribute(readings, pods=pods, owners=owners, gpu_index=INDEX)
    assert [(u.pod, u.container, u.used_bytes // MIB, u.granted_core) for u in snap.containers] == [
        ("trainer-0", "main", 200, 30),
        ("eval-0", "eval", 300, 20),
    ]


def test_the_report_is_the_snapshot_in_whole_mib() -> None:
    owners = {1: in_container(UID_A, MAIN), 2: Owner(OWNER_HOST), 3: Owner(OWNER_MPS_SERVER)}
    readings = [
        GpuProcesses(GPU0, (GpuProcess(1, 3 * MIB + MIB - 1, 250), GpuProcess(2, MIB - 1))),
        GpuProcesses(GPU1, (GpuProcess(3, 5 * MIB, 9), GpuProcess(1, None))),
    ]
    snap = attribute(readings, owners, {UID_A: trainer()}, INDEX)
    report = snap.report(AT)
    assert report == NodeUsage(
        AT,
        (
            ContainerUsage(UID_A, "ml", "trainer-0", "main", GPU0, 3, 250),
            ContainerUsage(UID_A, "ml", "trainer-0", "main", GPU1, 0, None),
        ),
        (
            UnattributedUsage(GPU0, OWNER_HOST, 0, 1),
            UnattributedUsage(GPU1, OWNER_MPS_SERVER, 5, 1),
        ),
    )
    assert decode_usage(encode_usage(report)).containers[0].sm_percent == 100


def test_an_empty_reading_is_an_empty_snapshot() -> None:
    assert attribute([], {}, {}, {}) == UsageSnapshot()
    assert attribute([gpu(GPU0)], {}, {}, INDEX) == UsageSnapshot()
    assert UsageSnapshot().report(AT) == NodeUsage(AT)


# -- OverGrantWatch ------------------------------------------------------------------------


def use(
    used_mib: int = 0,
    sm: int | None = None,
    *,
    core: int = 30,
    memory_mib: int = 4096,
    container: str = "main",
    gpu_uuid: str = GPU0,
    extra_bytes: int = 0,
) -> GpuUse:
    return GpuUse(
        UID_A,
        "ml",
        "trainer-0",
        container,
        gpu_uuid,
        INDEX[gpu_uuid],
        used_mib * MIB + extra_bytes,
        sm,
        1,
        core,
        memory_mib,
    )


def snap(*uses: GpuUse) -> UsageSnapshot:
    return UsageSnapshot(uses)


def kinds(breaches: list[Breach]) -> list[tuple[str, str, str]]:
    return [(b.use.container, b.use.gpu, b.kind) for b in breaches]


OVER_MEMORY = use(4096 + MEMORY_SLACK_MIB + 1)
OVER_COMPUTE = use(10, 30 + COMPUTE_SLACK_PERCENT + 1)


def test_memory_over_the_grant_is_reported_once_while_it_lasts() -> None:
    watch = OverGrantWatch()
    assert watch.observe(snap(OVER_MEMORY)) == [Breach(OVER_MEMORY, "memory")]
    assert watch.observe(snap(OVER_MEMORY)) == []
    assert watch.observe(snap(use(100))) == []  # under again, still the same container
    assert watch.observe(snap(OVER_MEMORY)) == []
    assert watch.counts == {"memory": 1, "compute": 0}


def test_memory_at_the_grant_plus_slack_is_not_over_and_a_byte_more_is() -> None:
    watch = OverGrantWatch()
    at_limit = use(4096 + MEMORY_SLACK_MIB)
    assert watch.observe(snap(at_limit)) == []
    one_more = use(4096 + MEMORY_SLACK_MIB, extra_bytes=1)
    assert kinds(watch.observe(snap(one_more))) == [("main", GPU0, "memory")]


def test_a_container_that_disappears_and_comes_back_is_reported_again() -> None:
    watch = OverGrantWatch()
    assert len(watch.observe(snap(OVER_MEMORY))) == 1
    assert watch.observe(snap()) == []
    assert watch.observe(snap(OVER_MEMORY)) == [Breach(OVER_MEMORY, "memory")]
    assert watch.counts["memory"] == 2


def test_another_container_vanishing_does_not_forget_this_one() -> None:
    watch = OverGrantWatch()
    side = use(10, container="side")
    watch.observe(snap(OVER_MEMORY, side))
    assert watch.observe(snap(OVER_MEMORY)) == []


def test_each_gpu_of_a_container_is_its_own_breach() -> None:
    watch = OverGrantWatch()
    on_gpu1 = use(4096 + MEMORY_SLACK_MIB + 1, gpu_uuid=GPU1)
    assert kinds(watch.observe(snap(OVER_MEMORY))) == [("main", GPU0, "memory")]
    assert kinds(watch.observe(snap(OVER_MEMORY, on_gpu1))) == [("main", GPU1, "memory")]


def test_a_zero_grant_is_over_past_the_slack() -> None:
    watch = OverGrantWatch()
    assert watch.observe(snap(use(MEMORY_SLACK_MIB, memory_mib=0, core=0))) == []
    over = use(MEMORY_SLACK_MIB + 1, memory_mib=0, core=0)
    assert kinds(watch.observe(snap(over))) == [("main", GPU0, "memory")]


def test_compute_is_over_after_consecutive_readings_over_the_share() -> None:
    watch = OverGrantWatch()
    for _ in range(COMPUTE_READINGS - 1):
        assert watch.observe(snap(OVER_COMPUTE)) == []
    assert watch.observe(snap(OVER_COMPUTE)) == [Breach(OVER_COMPUTE, "compute")]
    for _ in range(COMPUTE_READINGS + 1):
        assert watch.observe(snap(OVER_COMPUTE)) == []
    assert watch.counts == {"memory": 0, "compute": 1}


def test_a_reading_within_the_share_resets_the_streak() -> None:
    watch = OverGrantWatch()
    within = use(10, 30 + COMPUTE_SLACK_PERCENT)  # at core + slack: not over
    for _ in range(3):
        for _ in range(COMPUTE_READINGS - 1):
            assert watch.observe(snap(OVER_COMPUTE)) == []
        assert watch.observe(snap(within)) == []
    for _ in range(COMPUTE_READINGS - 1):
        assert watch.observe(snap(OVER_COMPUTE)) == []
    assert kinds(watch.observe(snap(OVER_COMPUTE))) == [("main", GPU0, "compute")]


def test_an_unsampled_reading_resets_the_streak() -> None:
    watch = OverGrantWatch()
    for _ in range(COMPUTE_READINGS - 1):
        watch.observe(snap(OVER_COMPUTE))
    assert watch.observe(snap(use(10, None))) == []
    assert watch.observe(snap(OVER_COMPUTE)) == []


def test_a_reading_without_the_container_resets_the_streak() -> None:
    watch = OverGrantWatch()
    for _ in range(COMPUTE_READINGS - 1):
        watch.observe(snap(OVER_COMPUTE))
    assert watch.observe(snap()) == []
    for _ in range(COMPUTE_READINGS - 1):
        assert watch.observe(snap(OVER_COMPUTE)) == []
    assert len(watch.observe(snap(OVER_COMPUTE))) == 1


def test_streaks_are_kept_per_container() -> None:
    watch = OverGrantWatch()
    side_over = use(10, 100, container="side")
    side_within = use(10, 0, container="side")
    for i in range(COMPUTE_READINGS):
        side = side_over if i % 2 else side_within
        found = watch.observe(snap(OVER_COMPUTE, side))
    assert kinds(found) == [("main", GPU0, "compute")]


def test_an_unsampled_share_never_breaches() -> None:
    watch = OverGrantWatch()
    for _ in range(10 * COMPUTE_READINGS):
        assert watch.observe(snap(use(10, None, core=0))) == []
    assert watch.counts == {"memory": 0, "compute": 0}


def test_memory_and_compute_are_counted_apart() -> None:
    watch = OverGrantWatch()
    both = use(4096 + MEMORY_SLACK_MIB + 1, 100)
    found: list[Breach] = []
    for _ in range(COMPUTE_READINGS):
        found += watch.observe(snap(both, use(1, container="side")))
    assert [b.kind for b in found] == ["memory", "compute"]
    assert watch.counts == {"memory": 1, "compute": 1}


def test_the_slacks_and_the_readings_can_be_set() -> None:
    watch = OverGrantWatch(memory_slack_mib=0, compute_slack=0, compute_readings=1)
    assert watch.observe(snap(use(4096, 30))) == []
    found = watch.observe(snap(use(4096, 31, container="side", extra_bytes=1)))
    assert sorted(b.kind for b in found) == ["compute", "memory"]


def test_the_watch_remembers_at_most_max_tracked_breaches() -> None:
    watch = OverGrantWatch(max_tracked=2)
    over = [use(4096 + MEMORY_SLACK_MIB + 1, container=f"c{i}") for i in range(3)]
    assert kinds(watch.observe(snap(*over))) == [("c0", GPU0, "memory"), ("c1", GPU0, "memory")]
    assert watch.observe(snap(*over)) == []
    assert watch.counts["memory"] == 2
    # one is gone: room for the third
    assert kinds(watch.observe(snap(over[1], over[2]))) == [("c2", GPU0, "memory")]
    assert watch.counts["memory"] == 3


def test_a_breach_describes_itself() -> None:
    memory = Breach(use(5000, core=30, memory_mib=4096), "memory").describe()
    assert memory == (
        f"pod=ml/trainer-0 container=main GPU {GPU0} (index 0): "
        "uses 5,000 MiB of GPU memory, granted 4,096 MiB"
    )
    compute = Breach(use(10, 75, core=30), "compute").describe()
    assert compute.endswith("uses 75% of the GPU's time, granted 30%")


def test_attribute_and_the_watch_together() -> None:
    """A container given 4 GiB of GPU 0 that fills 5 GiB of it, and runs on GPU 1 too."""
    owners = {1: in_container(UID_A, MAIN)}
    readings = [gpu(GPU0, proc(1, 5120, 10)), gpu(GPU1, proc(1, 100, 5))]
    watch = OverGrantWatch()
    found = watch.observe(attribute(readings, owners, {UID_A: trainer()}, INDEX))
    assert kinds(found) == [("main", GPU0, "memory")]
    for _ in range(COMPUTE_READINGS - 1):
        found = watch.observe(attribute(readings, owners, {UID_A: trainer()}, INDEX))
    assert kinds(found) == []  # GPU 1: 5% over a zero grant is within the slack


# -- properties ----------------------------------------------------------------------------

GPUS = [GPU0, GPU1, GPU2, "GPU-unindexed"]
UIDS = [UID_A, UID_B, "0b7c1f2e-5a6d-4e8f-9a0b-1c2d3e4f5a6b"]
CIDS = ["a" * 64, "b" * 64, "c" * 64, "d" * 64]
NAMES = ["main", "side", "init"]

gpu_grants = st.builds(
    GpuGrant,
    st.sampled_from(GPUS),
    st.integers(0, 7),
    st.integers(0, 7),
    st.integers(0, 100),
    st.integers(0, 1 << 17),
)
records = st.none() | st.dictionaries(
    st.sampled_from(NAMES),
    st.dictionaries(st.sampled_from(GPUS), gpu_grants, max_size=3),
    max_size=3,
)
owner_entries = st.one_of(
    st.just(Owner(OWNER_HOST)),
    st.just(Owner(OWNER_MPS_SERVER)),
    st.builds(
        Owner,
        st.just(OWNER_CONTAINER),
        st.sampled_from([*UIDS, "gone"]),
        st.sampled_from([*CIDS, "e" * 64]),
    ),
)
gpu_processes = st.builds(
    GpuProcess,
    st.integers(1, 30),
    st.none() | st.integers(0, 1 << 40),
    st.none() | st.integers(0, 100),
    st.booleans(),
)

Scene = tuple[list[GpuProcesses], dict[int, Owner], dict[str, PodView], dict[str, int]]


@st.composite
def scenes(draw: st.DrawFn) -> Scene:
    """Some GPUs (a few unreadable, one not in the index), some PIDs with owners, and the
    pods those owners may name: with a record, without one, or unknown to the agent."""
    pods = {
        uid: PodView(
            uid,
            draw(st.sampled_from(["ml", "default"])),
            draw(st.sampled_from(["p0", "p1"])),
            draw(st.dictionaries(st.sampled_from(CIDS), st.sampled_from(NAMES), max_size=4)),
            draw(records),
        )
        for uid in draw(st.lists(st.sampled_from(UIDS), unique=True))
    }
    owners = draw(st.dictionaries(st.integers(1, 30), owner_entries))
    readings = [
        GpuProcesses(
            uuid,
            tuple(draw(st.lists(gpu_processes, max_size=6))),
            draw(st.sampled_from(["", "", "", "Unknown Error"])),
        )
        for uuid in draw(st.lists(st.sampled_from(GPUS), unique=True))
    ]
    return readings, owners, pods, {g: i for i, g in enumerate(GPUS[:3])}


def expected_row(
    process: GpuProcess, owners: Mapping[int, Owner], pods: Mapping[str, PodView]
) -> tuple[str, ...]:
    """Where a process's use belongs, as the module says: ("container", pod UID, name) or
    ("other", owner)."""
    owner = owners.get(process.pid)
    if owner is None:
        return ("other", OWNER_HOST)
    if owner.kind != OWNER_CONTAINER:
        return ("other", owner.kind)
    pod = pods.get(owner.pod_uid)
    if pod is None or pod.grants is None:
        return ("other", OWNER_OTHER_POD)
    name = pod.containers.get(owner.container_id)
    if name is None or name not in pod.grants:
        return ("other", OWNER_OTHER_POD)
    return ("container", pod.uid, name)


def capped(c: ContainerUsage) -> ContainerUsage:
    sm = None if c.sm_percent is None else min(100, c.sm_percent)
    return ContainerUsage(c.pod_uid, c.namespace, c.pod, c.container, c.gpu, c.memory_mib, sm)


@settings(max_examples=400, deadline=None)
@given(scenes(), st.randoms(use_true_random=False))
def test_every_process_lands_in_exactly_one_row(scene: Scene, rng: random.Random) -> None:
    readings, owners, pods, index = scene
    got = attribute(readings, owners, pods, index)
    good = [r for r in readings if not r.error]

    rows: list[GpuUse | OtherUse] = [*got.containers, *got.other]
    assert sum(r.used_bytes for r in rows) == sum(
        p.used_bytes or 0 for r in good for p in r.processes
    )
    assert sum(r.processes for r in rows) == sum(len(r.processes) for r in good)

    want_bytes: Counter[tuple[str, ...]] = Counter()
    want_count: Counter[tuple[str, ...]] = Counter()
    for r in good:
        for p in r.processes:
            key = (r.uuid, *expected_row(p, owners, pods))
            want_bytes[key] += p.used_bytes or 0
            want_count[key] += 1
    got_bytes: Counter[tuple[str, ...]] = Counter()
    got_count: Counter[tuple[str, ...]] = Counter()
    for u in got.containers:
        got_bytes[(u.gpu, "container", u.pod_uid, u.container)] += u.used_bytes
        got_count[(u.gpu, "container", u.pod_uid, u.container)] += u.processes
    for o in got.other:
        got_bytes[(o.gpu, "other", o.owner)] += o.used_bytes
        got_count[(o.gpu, "other", o.owner)] += o.processes
    assert dict(got_count) == dict(want_count)
    assert dict(got_bytes) == dict(want_bytes)

    for u in got.containers:
        pod = pods[u.pod_uid]
        assert pod.grants is not None, "a container row for a pod without a record"
        assert u.container in pod.grants
        g = pod.grants[u.container].get(u.gpu)
        assert (u.granted_core, u.granted_memory_mib) == ((g.core, g.memory_mib) if g else (0, 0))
        assert (u.namespace, u.pod) == (pod.namespace, pod.name)
        assert u.gpu_index == index.get(u.gpu, -1)
    assert all(o.owner in OWNERS for o in got.other)
    assert all(o.gpu_index == index.get(o.gpu, -1) for o in got.other)
    assert len({u.key for u in got.containers}) == len(got.containers)
    assert len({(o.gpu, o.owner) for o in got.other}) == len(got.other)

    failed = {r.uuid for r in readings if r.error}
    assert len(got.errors) == len(failed)
    assert not failed & {r.gpu for r in rows}

    # the order the driver lists GPUs and processes in changes nothing
    shuffled = [
        GpuProcesses(r.uuid, tuple(rng.sample(r.processes, len(r.processes))), r.error)
        for r in rng.sample(readings, len(readings))
    ]
    again = attribute(shuffled, owners, pods, index)
    assert (again.containers, again.other) == (got.containers, got.other)

    # and the heartbeat carries it: every row decodes back (SM capped at 100)
    report = got.report(AT)
    back = decode_usage(encode_usage(report))
    assert Counter(back.containers) == Counter(map(capped, report.containers))
    assert Counter(back.unattributed) == Counter(report.unattributed)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(
                st.sampled_from(NAMES),
                st.sampled_from(GPUS[:3]),
                st.integers(4096, 4096 + 2 * MEMORY_SLACK_MIB),
                st.none() | st.integers(0, 100),
            ),
            max_size=5,
            unique_by=lambda t: (t[0], t[1]),
        ),
        max_size=12,
    ),
    st.integers(1, 6),
)
def test_the_watch_reports_each_breach_once_per_presence(
    readings: list[list[tuple[str, str, int, int | None]]], max_tracked: int
) -> None:
    watch = OverGrantWatch(max_tracked=max_tracked)
    reported: set[tuple[str, str, str]] = set()
    total = 0
    for reading in readings:
        uses = [use(m, sm, container=n, gpu_uuid=g) for n, g, m, sm in reading]
        found = watch.observe(snap(*uses))
        total += len(found)
        seen = {(n, g) for n, g, _, _ in reading}
        reported = {k for k in reported if (k[0], k[1]) in seen}
        for b in found:
            key = (b.use.container, b.use.gpu, b.kind)
            assert key not in reported, "reported twice while the container stayed"
            assert b.use in uses
            reported.add(key)
        assert len(reported) <= max_tracked
        for u in uses:
            if u.used_bytes > (4096 + MEMORY_SLACK_MIB) * MIB:
                # an unreported memory breach only when the watch is full
                assert (u.container, u.gpu, "memory") in reported or len(reported) == max_tracked
    assert sum(watch.counts.values()) == total


@pytest.mark.parametrize("owner", [OWNER_HOST, OWNER_MPS_SERVER])
def test_non_container_owners_never_reach_a_pod(owner: str) -> None:
    """Even when the owner names a pod UID and container ID (it should not), only a
    container owner is looked up."""
    owners = {1: Owner(owner, UID_A, MAIN)}
    snap_ = attribute([gpu(GPU0, proc(1, 64))], owners, {UID_A: trainer()}, INDEX)
    assert snap_.containers == ()
    assert snap_.other == (other(GPU0, owner, 64, 1),)
