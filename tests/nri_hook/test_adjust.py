"""The pure decision: record + container + host view -> adjustment (or a reasoned refusal)."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_hook.adjust import (
    CODE_FAILED_PRECONDITION,
    CODE_INVALID_ARGUMENT,
    CODE_PERMISSION_DENIED,
    ContainerUser,
    DeviceNode,
    Mount,
    Settings,
    decode_record,
    mps_user_problem,
    plan_container,
)
from nri_hook.errors import RejectError
from tessera.allocation import (
    ContainerAllocation,
    GpuGrant,
    PodAllocation,
    RdmaGrant,
    VfGrant,
)
from tessera.record import Keyring, encode

SIGNER = Keyring.generate("k1")
KEY = SIGNER.verifier()
OTHER_KEY = Keyring.generate("k1")
UID = "6a1f0c2e-0000-4000-8000-00000000abcd"
NODE = "gpu-node-1"
GPU_A = GpuGrant("GPU-aaaaaaaa-0000-0000-0000-000000000000", 0, 0, 30, 8192)
GPU_B = GpuGrant("GPU-bbbbbbbb-0000-0000-0000-000000000000", 3, 3, 100, 81920)
GPU_C = GpuGrant("GPU-cccccccc-0000-0000-0000-000000000000", 5, 5, 100, 81920)


class FakeHost:
    def __init__(
        self,
        paths: Mapping[str, tuple[int, int]],
        minors: Mapping[str, int] | None = None,
        files: frozenset[str] = frozenset(
            {
                "/run/mps/nvidia-cuda-mps-control.pid",
                "/tmp/nvidia-mps/nvidia-cuda-mps-control.pid",
                "/usr/local/vgpu/libvgpu.so",
            }
        ),
    ) -> None:
        self.nodes = {
            p: DeviceNode(p, "c", major, minor, 0o666) for p, (major, minor) in paths.items()
        }
        self.minors = minors
        self.files = files

    def device(self, path: str) -> DeviceNode | None:
        return self.nodes.get(path)

    def gpu_minors(self) -> Mapping[str, int] | None:
        return self.minors

    def exists(self, path: str) -> bool:
        return path in self.files or path in self.nodes


FULL_HOST = FakeHost(
    {
        "/dev/nvidiactl": (195, 255),
        "/dev/nvidia-uvm": (510, 0),
        "/dev/nvidia-uvm-tools": (510, 1),
        "/dev/nvidia-modeset": (195, 254),
        "/dev/nvidia0": (195, 0),
        "/dev/nvidia3": (195, 3),
        "/dev/nvidia5": (195, 5),
        "/dev/infiniband/rdma_cm": (10, 122),
        "/dev/infiniband/uverbs0": (231, 192),
        "/dev/infiniband/uverbs1": (231, 193),
        "/dev/infiniband/uverbs7": (231, 199),
    },
    {GPU_A.uuid: 0, GPU_B.uuid: 3, GPU_C.uuid: 5},
)


def _alloc(*containers: ContainerAllocation, uid: str = UID, node: str = NODE) -> PodAllocation:
    return PodAllocation(uid, "team-a", "train", node, containers)


def _decode(text: str, keyring: Keyring | None = KEY, require: bool = True) -> PodAllocation:
    return decode_record(text, keyring, require_integrity=require, pod_uid=UID, node=NODE)


def _env(plan_env: tuple[tuple[str, str], ...]) -> dict[str, str]:
    return dict(plan_env)


# --- the record --------------------------------------------------------------------------------


def test_a_signed_record_for_this_pod_and_node_decodes() -> None:
    alloc = _alloc(ContainerAllocation("main", gpus=(GPU_A,)))
    assert _decode(encode(alloc, SIGNER)) == alloc


@pytest.mark.parametrize(
    ("text", "code", "words"),
    [
        (encode(_alloc(ContainerAllocation("main")), OTHER_KEY), CODE_PERMISSION_DENIED, "proof"),
        (encode(_alloc(ContainerAllocation("main"))), CODE_PERMISSION_DENIED, "no integrity"),
        (
            encode(_alloc(ContainerAllocation("main"), node="other-node"), SIGNER),
            CODE_PERMISSION_DENIED,
            "other-node",
        ),
        (
            encode(_alloc(ContainerAllocation("main"), uid="someone-else"), SIGNER),
            CODE_PERMISSION_DENIED,
            "someone-else",
        ),
        ("{not json", CODE_INVALID_ARGUMENT, "JSON"),
        ('{"v": 99}', CODE_INVALID_ARGUMENT, "schema version"),
    ],
    ids=["forged", "unsigned", "other-node", "other-pod", "not-json", "future-schema"],
)
def test_bad_records_are_refused_with_a_reason(text: str, code: int, words: str) -> None:
    with pytest.raises(RejectError) as refused:
        _decode(text)
    assert refused.value.code == code
    assert words in refused.value.message


def test_a_record_altered_after_signing_is_refused() -> None:
    doc = json.loads(encode(_alloc(ContainerAllocation("main", gpus=(GPU_A,))), SIGNER))
    doc["containers"][0]["gpus"][0]["core"] = 100  # ask for more than the scheduler gave
    with pytest.raises(RejectError) as refused:
        _decode(json.dumps(doc))
    assert refused.value.code == CODE_PERMISSION_DENIED


def test_integrity_is_required_even_without_a_key() -> None:
    text = encode(_alloc(ContainerAllocation("main")))
    with pytest.raises(RejectError) as refused:
        _decode(text, keyring=None)
    assert refused.value.code == CODE_PERMISSION_DENIED
    assert _decode(text, keyring=None, require=False).containers[0].name == "main"


@given(st.text(max_size=200))
def test_arbitrary_annotation_text_is_refused_not_crashed(text: str) -> None:
    try:
        _decode(text)
    except RejectError as exc:
        assert exc.code in (CODE_INVALID_ARGUMENT, CODE_PERMISSION_DENIED)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@given(
    st.fixed_dictionaries(
        {"v": st.just(1), "podUID": st.just(UID), "node": st.just(NODE)},
        optional={"namespace": json_values, "pod": json_values, "containers": json_values},
    )
)
def test_arbitrary_record_shapes_are_refused_not_crashed(doc: dict[str, object]) -> None:
    try:
        _decode(json.dumps(doc), require=False)
    except RejectError as exc:
        assert exc.code == CODE_INVALID_ARGUMENT


# --- the adjustment ----------------------------------------------------------------------------


def test_a_container_not_in_the_record_is_untouched() -> None:
    alloc = _alloc(ContainerAllocation("main", gpus=(GPU_A,)))
    assert plan_container(alloc, "sidecar", Settings(), FULL_HOST) is None


def test_gpu_devices_and_visible_devices() -> None:
    alloc = _alloc(ContainerAllocation("main", gpus=(GPU_B, GPU_C)))
    plan = plan_container(alloc, "main", Settings(), FULL_HOST)
    assert plan is not None
    assert [d.path for d in plan.devices] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
        "/dev/nvidia3",
        "/dev/nvidia5",
    ]
    assert plan.devices[4] == FULL_HOST.nodes["/dev/nvidia3"]  # as the host has it
    assert plan.env == (("NVIDIA_VISIBLE_DEVICES", f"{GPU_B.uuid},{GPU_C.uuid}"),)
    assert plan.mounts == ()
    assert plan.gpus == (GPU_B.uuid, GPU_C.uuid)


def test_only_the_control_devices_the_host_has() -> None:
    host = FakeHost({"/dev/nvidiactl": (195, 255), "/dev/nvidia0": (195, 0)})
    plan = plan_container(_alloc(ContainerAllocation("m", gpus=(GPU_A,))), "m", Settings(), host)
    assert plan is not None
    assert [d.path for d in plan.devices] == ["/dev/nvidiactl", "/dev/nvidia0"]


def test_a_gpu_the_node_lacks_is_refused_naming_the_field() -> None:
    host = FakeHost({"/dev/nvidiactl": (195, 255), "/dev/nvidia0": (195, 0)})
    alloc = _alloc(ContainerAllocation("main", gpus=(GPU_A, GPU_B)))
    with pytest.raises(RejectError) as refused:
        plan_container(alloc, "main", Settings(), host)
    assert refused.value.code == CODE_FAILED_PRECONDITION
    message = refused.value.message
    assert "record.containers[0].gpus[1]" in message
    assert GPU_B.uuid in message and "/dev/nvidia3" in message


def test_the_driver_uuid_to_minor_map_is_checked_when_available() -> None:
    alloc = _alloc(ContainerAllocation("main", gpus=(GPU_B,)))
    swapped = FakeHost({"/dev/nvidia3": (195, 3)}, {GPU_B.uuid: 5})
    with pytest.raises(RejectError) as wrong_minor:
        plan_container(alloc, "main", Settings(), swapped)
    assert "minor 5" in wrong_minor.value.message
    unknown = FakeHost({"/dev/nvidia3": (195, 3)}, {GPU_A.uuid: 3})
    with pytest.raises(RejectError) as no_such_gpu:
        plan_container(alloc, "main", Settings(), unknown)
    assert "no GPU with that UUID" in no_such_gpu.value.message
    no_driver_info = FakeHost({"/dev/nvidia3": (195, 3)}, None)
    assert plan_container(alloc, "main", Settings(), no_driver_info) is not None


def test_mps_limits_and_pipe_directory() -> None:
    alloc = _alloc(ContainerAllocation("main", gpus=(GPU_A,)))
    plan = plan_container(
        alloc, "main", Settings(isolation="mps", mps_pipe_dir="/run/mps"), FULL_HOST
    )
    assert plan is not None
    assert _env(plan.env) == {
        "NVIDIA_VISIBLE_DEVICES": GPU_A.uuid,
        "CUDA_MPS_PIPE_DIRECTORY": "/run/mps",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{GPU_A.uuid}=8192M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
    }
    assert plan.mounts == (Mount("/run/mps", "/run/mps", "bind", ("rbind", "rw")),)


def test_mps_whole_gpus_get_memory_limits_but_no_thread_limit() -> None:
    alloc = _alloc(ContainerAllocation("main", gpus=(GPU_B, GPU_C)))
    plan = plan_container(alloc, "main", Settings(isolation="mps"), FULL_HOST)
    assert plan is not None
    env = _env(plan.env)
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{GPU_B.uuid}=81920M,{GPU_C.uuid}=81920M"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


HAMI_REGION = (("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/run/tessera-vgpu/cudevshr.cache"),)
HAMI_REGION_MOUNT = Mount(
    "/run/tessera-vgpu",
    "tmpfs",
    "tmpfs",
    ("nosuid", "nodev", "noexec", "mode=1777", "size=8m"),
)


def test_hami_core_limits_by_the_number_cuda_gives_each_gpu_in_the_container() -> None:
    """CUDA numbers a container's GPUs by PCI bus ID (the order the plan asks for), which is
    the host's index order, whatever order the record lists them in."""
    small = GpuGrant(GPU_B.uuid, 3, 3, 100, 40960)
    alloc = _alloc(ContainerAllocation("main", gpus=(GPU_C, small)))
    plan = plan_container(alloc, "main", Settings(isolation="hami-core"), FULL_HOST)
    assert plan is not None
    assert plan.env == (
        ("NVIDIA_VISIBLE_DEVICES", f"{GPU_C.uuid},{GPU_B.uuid}"),
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "40960m"),  # GPU_B, index 3
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "81920m"),  # GPU_C, index 5
        *HAMI_REGION,
    )
    assert plan.mounts == (HAMI_REGION_MOUNT,)
    share = _alloc(ContainerAllocation("main", gpus=(GPU_A,)))
    plan = plan_container(share, "main", Settings(isolation="hami-core"), FULL_HOST)
    assert plan is not None
    assert _env(plan.env)["CUDA_DEVICE_SM_LIMIT_0"] == "30"
    assert _env(plan.env)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8192m"


def test_hami_core_compute_limits_are_per_gpu() -> None:
    """A whole GPU beside a share keeps all of its compute: each GPU gets its own limit,
    not the smallest of them."""
    half = GpuGrant(GPU_C.uuid, 5, 5, 50, 40960)
    alloc = _alloc(ContainerAllocation("main", gpus=(half, GPU_A, GPU_B)))
    plan = plan_container(alloc, "main", Settings(isolation="hami-core"), FULL_HOST)
    assert plan is not None
    env = _env(plan.env)
    assert {k: v for k, v in env.items() if k.startswith("CUDA_DEVICE_SM_LIMIT")} == {
        "CUDA_DEVICE_SM_LIMIT_0": "30",  # GPU_A, index 0
        "CUDA_DEVICE_SM_LIMIT_2": "50",  # GPU_C, index 5; GPU_B (index 3) is whole
    }


def test_hami_core_memory_only_share_and_library() -> None:
    memory_only = GpuGrant(GPU_A.uuid, 0, 0, 0, 4096)
    hami = Settings(isolation="hami-core", hami_core_library="/usr/local/vgpu/libvgpu.so")
    plan = plan_container(
        _alloc(ContainerAllocation("m", gpus=(memory_only,))), "m", hami, FULL_HOST
    )
    assert plan is not None
    env = _env(plan.env)
    assert not [k for k in env if k.startswith("CUDA_DEVICE_SM_LIMIT")]
    assert env["LD_PRELOAD"] == "/usr/local/vgpu/libvgpu.so"
    assert plan.mounts == (
        HAMI_REGION_MOUNT,
        Mount("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", "bind", ("rbind", "ro")),
    )


def test_a_node_without_the_isolation_layer_refuses_the_container_saying_so() -> None:
    """The layer's mount source must exist on the host: otherwise the runtime would fail
    with a bare "no such file or directory", or (without a check) a share would run
    unlimited."""
    alloc = _alloc(ContainerAllocation("main", gpus=(GPU_A,)))
    bare = FakeHost({"/dev/nvidia0": (195, 0)}, files=frozenset())
    with pytest.raises(RejectError) as no_mps:
        plan_container(alloc, "main", Settings(isolation="mps"), bare)
    assert no_mps.value.code == CODE_FAILED_PRECONDITION
    assert no_mps.value.message == (
        "record.containers[0].gpus: isolation layer mps: the MPS control daemon is not "
        "running on this node (no /tmp/nvidia-mps/nvidia-cuda-mps-control.pid; --mps-pipe-dir)"
    )
    # the pipe directory alone (it outlives the daemon) is not enough
    stopped = FakeHost({"/dev/nvidia0": (195, 0)}, files=frozenset({"/tmp/nvidia-mps"}))
    with pytest.raises(RejectError):
        plan_container(alloc, "main", Settings(isolation="mps"), stopped)
    lib = Settings(isolation="hami-core", hami_core_library="/opt/vgpu/libvgpu.so")
    with pytest.raises(RejectError) as no_hami:
        plan_container(alloc, "main", lib, FULL_HOST)
    assert no_hami.value.message == (
        "record.containers[0].gpus: isolation layer hami-core: the HAMi-core library "
        "/opt/vgpu/libvgpu.so (--hami-core-library) is missing on this node"
    )
    # without a library to mount (the image brings it) there is nothing to check
    plan = plan_container(alloc, "main", Settings(isolation="hami-core"), bare)
    assert plan is not None and plan.shares == 1


def test_whole_gpus_are_given_without_a_layer_the_node_lacks() -> None:
    """A down layer must not cost whole-GPU pods their GPUs: they need no limit. They get
    their devices and none of the layer's environment or mounts (a missing library mounted
    would fail the container); the plan says why, for the hook's log."""
    whole = _alloc(ContainerAllocation("main", gpus=(GPU_B,)))
    bare = FakeHost({"/dev/nvidia3": (195, 3)}, files=frozenset())
    lib = Settings(isolation="hami-core", hami_core_library="/usr/local/vgpu/libvgpu.so")
    for layer, why in (
        (lib, "the HAMi-core library /usr/local/vgpu/libvgpu.so (--hami-core-library) is missing"),
        (Settings(isolation="mps"), "the MPS control daemon is not running on this node"),
    ):
        plan = plan_container(whole, "main", layer, bare)
        assert plan is not None and plan.shares == 0
        assert [d.path for d in plan.devices] == ["/dev/nvidia3"]
        assert _env(plan.env) == {"NVIDIA_VISIBLE_DEVICES": GPU_B.uuid}
        assert plan.mounts == ()
        assert plan.without_layer.startswith(why), plan.without_layer
    # with the layer there, whole GPUs get it as before
    plan = plan_container(whole, "main", lib, FULL_HOST)
    assert plan is not None and plan.without_layer == ""
    assert _env(plan.env)["LD_PRELOAD"] == "/usr/local/vgpu/libvgpu.so"


def test_mps_refuses_a_share_for_a_user_it_does_not_serve() -> None:
    share = _alloc(ContainerAllocation("main", gpus=(GPU_A,)))
    mps = Settings(isolation="mps")  # serves uid 0
    assert plan_container(share, "main", mps, FULL_HOST, ContainerUser(0)) is not None
    with pytest.raises(RejectError) as other:
        plan_container(share, "main", mps, FULL_HOST, ContainerUser(1000))
    assert other.value.code == CODE_FAILED_PRECONDITION
    assert other.value.message.startswith(
        "record.containers[0].gpus: isolation layer mps: the container runs as uid 1000, but "
        "MPS on this node serves uid 0 (--mps-client-user)"
    )
    assert "securityContext.runAsUser" in other.value.message
    with pytest.raises(RejectError, match="user namespace of its own"):
        plan_container(share, "main", mps, FULL_HOST, ContainerUser(0, own_user_namespace=True))
    # a runtime that does not tell the user: not checked
    assert plan_container(share, "main", mps, FULL_HOST, None) is not None
    # a daemon serving every user takes everyone
    anyone = Settings(isolation="mps", mps_client_uid=None)
    assert plan_container(share, "main", anyone, FULL_HOST, ContainerUser(1000)) is not None
    served = Settings(isolation="mps", mps_client_uid=1000)
    assert plan_container(share, "main", served, FULL_HOST, ContainerUser(1000)) is not None
    # whole GPUs of another user run without MPS instead of waiting for it
    whole = _alloc(ContainerAllocation("main", gpus=(GPU_B,)))
    plan = plan_container(whole, "main", mps, FULL_HOST, ContainerUser(1000))
    assert plan is not None and "CUDA_MPS_PIPE_DIRECTORY" not in _env(plan.env)
    assert "runs as uid 1000" in plan.without_layer
    # HAMi-core has no such rule
    hami = Settings(isolation="hami-core")
    assert plan_container(share, "main", hami, FULL_HOST, ContainerUser(1000)) is not None


@settings(max_examples=200, deadline=None)
@given(
    st.none() | st.integers(0, 2**32 - 2),
    st.integers(0, 2**32 - 2),
    st.booleans(),
)
def test_the_mps_user_rule(served: int | None, uid: int, own: bool) -> None:
    problem = mps_user_problem(served, ContainerUser(uid, own))
    assert (problem is None) == (served is None or (uid == served and not own))


def test_shares_counts_the_gpus_given_in_part() -> None:
    alloc = _alloc(
        ContainerAllocation("main", gpus=(GPU_A, GPU_B, GpuGrant(GPU_C.uuid, 5, 5, 0, 4096)))
    )
    plan = plan_container(alloc, "main", Settings(), FULL_HOST)
    assert plan is not None and plan.shares == 2  # 30 % and memory-only; GPU_B is whole


def test_rdma_pf_and_vf_devices() -> None:
    pf = RdmaGrant("0000:3b:00.0", "mlx5_0", 0, 100)
    vf = VfGrant("0000:3b:00.7", "mlx5_7", 7, "ens1f0v5")
    shared = RdmaGrant("0000:5e:00.0", "mlx5_1", 1, 25, vfs=(vf,))
    plan = plan_container(
        _alloc(ContainerAllocation("m", rdma=(pf, shared))), "m", Settings(), FULL_HOST
    )
    assert plan is not None
    assert [d.path for d in plan.devices] == [
        "/dev/infiniband/rdma_cm",
        "/dev/infiniband/uverbs0",
        "/dev/infiniband/uverbs7",  # the VF's, not the PF's uverbs1
    ]
    assert plan.rdma == ("mlx5_0", "mlx5_1/mlx5_7")
    assert plan.env == ()


def test_rdma_devices_the_node_lacks_are_refused() -> None:
    vf = VfGrant("0000:3b:00.7", "mlx5_9", 9, "ens1f0v5")
    alloc = _alloc(
        ContainerAllocation("m", rdma=(RdmaGrant("0000:5e:00.0", "mlx5_1", 1, 25, (vf,)),))
    )
    with pytest.raises(RejectError) as refused:
        plan_container(alloc, "m", Settings(), FULL_HOST)
    assert "record.containers[0].rdma[0].vfs[0]" in refused.value.message
    assert "/dev/infiniband/uverbs9" in refused.value.message
    no_cm = FakeHost({"/dev/infiniband/uverbs1": (231, 193)})
    alloc = _alloc(ContainerAllocation("m", rdma=(RdmaGrant("0000:5e:00.0", "mlx5_1", 1, 100),)))
    with pytest.raises(RejectError) as refused:
        plan_container(alloc, "m", Settings(), no_cm)
    assert "rdma_cm" in refused.value.message


def test_an_init_container_that_reuses_devices_gets_them_too() -> None:
    alloc = _alloc(
        ContainerAllocation("main", gpus=(GPU_A,)),
        ContainerAllocation("warmup", gpus=(GPU_A,), init=True, reuses="main"),
    )
    plan = plan_container(alloc, "warmup", Settings(), FULL_HOST)
    assert plan is not None
    assert plan.gpus == (GPU_A.uuid,)


def test_unknown_isolation_layer_is_refused() -> None:
    with pytest.raises(ValueError):
        Settings(isolation="magic")
