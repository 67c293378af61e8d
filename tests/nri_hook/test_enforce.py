"""tessera's enforcement end to end: the plugin on a real socket, driven by the runtime
simulator with realistic (and captured) PodSandbox/Container messages."""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nri_hook import enforce as enforce_module
from nri_hook.adjust import Settings
from nri_hook.devices import HostDevices
from nri_hook.enforce import Enforcer, EnforcerConfig, Metrics, OnInvalid
from nri_hook.netdev import NetdevMover
from nri_hook.plugin import Backoff, NriPlugin
from protos.nri import api_pb2 as api
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation, RdmaGrant, VfGrant
from tessera.record import Keyring, encode
from tessera.resources import ALLOCATION_ANNOTATION
from tessera_edge.host_paths import NRI_GATE_DESTINATION
from tessera_edge.keyfiles import KeyringSource
from tessera_testbed.containerd import (
    CONTAINERD_1_7,
    CONTAINERD_2_3,
    PluginConnection,
    RuncRefusedError,
    RuntimeSimulator,
    RuntimeVersion,
    make_container,
    make_pod,
    runc_create,
)
from tessera_testbed.devnodes import device_numbers, make_device_nodes
from tessera_ttrpc import Code, RpcError
from tests.keyfiles import write_public
from tests.nri_hook.gate_helpers import agent_answer
from tests.nri_hook.netns_helpers import NetLab, links, netlab
from tests.nri_hook.vectors import Session

NODE = "gpu-node-1"
UID = "0c5e3a52-7d0f-4a53-9a54-0d7f2b7b1c11"
KEY = Keyring.generate("k1")
GPU0 = GpuGrant("GPU-00000000-1111-2222-3333-444444444444", 0, 0, 50, 40960)
GPU1 = GpuGrant("GPU-11111111-1111-2222-3333-444444444444", 1, 1, 100, 81920)
DEVICE_PATHS = device_numbers(gpus=(0, 1), uverbs=(0, 4))


@pytest.fixture
def device_root(tmp_path: Path) -> Path:
    """Device nodes under a scratch root: real nodes where mknod is allowed, else links to
    /dev/null (the assertions read whatever the host root holds)."""
    return make_device_nodes(tmp_path / "host", DEVICE_PATHS)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    return write_public(KEY, tmp_path / "record-keys")


def _host_device(root: Path, path: str) -> tuple[str, str, int, int, int]:
    st = os.stat(root / path.lstrip("/"))
    return (path, "c", os.major(st.st_rdev), os.minor(st.st_rdev), st.st_mode & 0o777)


def _devices(response: api.CreateContainerResponse) -> list[tuple[str, str, int, int, int]]:
    return [
        (d.path, d.type, d.major, d.minor, d.file_mode.value) for d in response.adjust.linux.devices
    ]


def _env(response: api.CreateContainerResponse) -> dict[str, str]:
    return {kv.key: kv.value for kv in response.adjust.env}


def record(*containers: ContainerAllocation, uid: str = UID, node: str = NODE) -> str:
    return encode(PodAllocation(uid, "team-a", "train", node, containers), KEY)


@dataclass
class Harness:
    sim: RuntimeSimulator
    conn: PluginConnection
    enforcer: Enforcer
    task: asyncio.Task[None]
    stop: asyncio.Event

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 5)
        await self.sim.stop()


async def start(
    sock_dir: Path,
    device_root: Path,
    key_file: Path,
    *,
    version: RuntimeVersion = CONTAINERD_2_3,
    on_invalid: OnInvalid = "fail",
    settings: Settings | None = None,
    sync_pods: list[api.PodSandbox] | None = None,
    rename_prefix: str = "",
) -> Harness:
    enforcer = Enforcer(
        EnforcerConfig(
            node_name=NODE,
            settings=settings or Settings(),
            on_invalid=on_invalid,
            vf_rename_prefix=rename_prefix,
        ),
        KeyringSource(key_file),
        HostDevices(device_root),
        NetdevMover(),
    )
    path = str(sock_dir / "nri.sock")
    sim = RuntimeSimulator(path, version=version, sync_pods=sync_pods or [])
    await sim.start()
    stop = asyncio.Event()
    plugin = NriPlugin(enforcer, name="tessera", index="50", socket_path=path)
    task = asyncio.create_task(plugin.run(stop))
    return Harness(sim, await sim.next_plugin(), enforcer, task, stop)


def _train_pod(record_text: str, netns: str | None = None) -> api.PodSandbox:
    """Pod team-a/train (UID) with `record_text` as its allocation annotation."""
    annotations = {ALLOCATION_ANNOTATION: record_text}
    return make_pod("train", namespace="team-a", uid=UID, annotations=annotations, netns=netns)


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


Hook = Callable[..., Awaitable[Harness]]
"""`start` on this test's socket folder, device root and key file; keywords as `start`'s."""


@pytest.fixture
def hook(sock_dir: Path, device_root: Path, key_file: Path) -> Hook:
    return functools.partial(start, sock_dir, device_root, key_file)


@pytest.fixture
def lab() -> Iterator[NetLab]:
    with netlab() as lab:
        yield lab


@pytest.mark.parametrize("version", [CONTAINERD_2_3, CONTAINERD_1_7], ids=["2.3", "1.7"])
def test_named_containers_get_their_devices_others_are_untouched(
    hook: Hook, device_root: Path, version: RuntimeVersion
) -> None:
    async def body() -> None:
        h = await hook(version=version)
        assert h.conn.events == 0x60F  # run/stop/remove sandbox, create/stop/remove container
        vf = VfGrant("0000:3b:00.4", "mlx5_4", 4, "")
        text = record(
            ContainerAllocation(
                "main", gpus=(GPU0,), rdma=(RdmaGrant("0000:3b:00.0", "mlx5_0", 0, 50, (vf,)),)
            )
        )
        pod = _train_pod(text)
        await h.conn.event(api.RUN_POD_SANDBOX, pod)
        main = make_container(pod, "main")
        response = await h.conn.create_container(pod, main)
        assert _devices(response) == [
            _host_device(device_root, p)
            for p in (
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia0",
                "/dev/infiniband/rdma_cm",
                "/dev/infiniband/uverbs4",
            )
        ]
        assert _env(response) == {"NVIDIA_VISIBLE_DEVICES": GPU0.uuid}
        assert main.id in h.enforcer.injected
        sidecar = await h.conn.create_container(pod, make_container(pod, "sidecar"))
        assert sidecar == api.CreateContainerResponse()
        plain_pod = make_pod("plain", uid="0c5e3a52-7d0f-4a53-9a54-0d7f2b7b1c12")
        plain = await h.conn.create_container(plain_pod, make_container(plain_pod, "main"))
        assert plain == api.CreateContainerResponse()
        await h.conn.stop_container(pod, main)
        assert main.id not in h.enforcer.injected
        await h.close()

    _run(body)


def test_isolation_layer_settings_reach_the_container(hook: Hook, device_root: Path) -> None:
    (device_root / "run" / "mps").mkdir(parents=True)  # the MPS control daemon's pipes
    (device_root / "run" / "mps" / "nvidia-cuda-mps-control.pid").write_text("4242\n")

    async def body() -> None:
        h = await hook(
            settings=Settings(isolation="mps", mps_pipe_dir="/run/mps"),
        )
        pod = _train_pod(record(ContainerAllocation("main", gpus=(GPU0,))))
        response = await h.conn.create_container(pod, make_container(pod, "main"))
        env = _env(response)
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{GPU0.uuid}=40960M"
        assert [(m.source, m.destination, m.type) for m in response.adjust.mounts] == [
            ("/run/mps", "/run/mps", "bind")
        ]
        await h.close()

    _run(body)


def test_mps_users_and_a_missing_layer_reach_the_runtime(hook: Hook, device_root: Path) -> None:
    """Through containerd's own protocol: a share for a container of another user than MPS
    serves fails its creation saying why; a whole GPU without the layer runs without it."""
    (device_root / "run" / "mps").mkdir(parents=True)
    pid_file = device_root / "run" / "mps" / "nvidia-cuda-mps-control.pid"
    pid_file.write_text("4242\n")

    async def body() -> None:
        h = await hook(settings=Settings(isolation="mps", mps_pipe_dir="/run/mps"))
        pod = _train_pod(
            record(
                ContainerAllocation("main", gpus=(GPU0,)), ContainerAllocation("w", gpus=(GPU1,))
            )
        )
        main = make_container(pod, "main")
        main.user.uid = 1000
        with pytest.raises(RpcError) as refused:
            await h.conn.create_container(pod, main)
        assert refused.value.code == Code.FAILED_PRECONDITION
        assert "the container runs as uid 1000, but MPS on this node serves uid 0" in str(
            refused.value
        )
        main.user.uid = 0
        served = await h.conn.create_container(pod, main)
        assert _env(served)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        pid_file.unlink()  # the daemon went away: the whole GPU still runs, without MPS
        whole = await h.conn.create_container(pod, make_container(pod, "w"))
        assert _env(whole) == {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid}
        assert [d.path for d in whole.adjust.linux.devices][-1] == "/dev/nvidia1"
        await h.close()

    _run(body)


@pytest.mark.parametrize(
    ("annotation", "code", "words"),
    [
        (
            record(ContainerAllocation("main", gpus=(GPU0,))).replace('"core":50', '"core":90'),
            Code.PERMISSION_DENIED,
            "integrity",
        ),
        (
            record(ContainerAllocation("main", gpus=(GPU0,)), node="elsewhere"),
            Code.PERMISSION_DENIED,
            "elsewhere",
        ),
        (
            record(ContainerAllocation("main", gpus=(GpuGrant("GPU-9", 9, 9, 100, 1),))),
            Code.FAILED_PRECONDITION,
            "/dev/nvidia9",
        ),
        ("{garbage", Code.INVALID_ARGUMENT, "JSON"),
    ],
    ids=["forged", "other-node", "missing-gpu", "malformed"],
)
def test_bad_records_fail_the_creation_saying_why(
    hook: Hook, annotation: str, code: int, words: str
) -> None:
    async def body() -> None:
        h = await hook()
        pod = _train_pod(annotation)
        with pytest.raises(RpcError) as refused:
            await h.conn.create_container(pod, make_container(pod, "main"))
        assert refused.value.code == code
        assert words in refused.value.message
        assert "pod team-a/train" in refused.value.message and '"main"' in refused.value.message
        await h.close()
        # downgraded to a warning: the container is created untouched
        h = await hook(on_invalid="warn")
        response = await h.conn.create_container(pod, make_container(pod, "main"))
        assert response == api.CreateContainerResponse()
        await h.close()

    _run(body)


def test_a_rotated_key_is_picked_up(sock_dir: Path, device_root: Path, tmp_path: Path) -> None:
    async def body() -> None:
        keys = write_public(Keyring.generate("old"), tmp_path / "keys")
        source = KeyringSource(keys, interval=0.0)
        enforcer = Enforcer(EnforcerConfig(node_name=NODE), source, HostDevices(device_root))
        new = Keyring.generate("new")
        text = encode(
            PodAllocation(UID, "a", "b", NODE, (ContainerAllocation("main", gpus=(GPU1,)),)), new
        )
        pod = make_pod("b", namespace="a", uid=UID, annotations={ALLOCATION_ANNOTATION: text})
        with pytest.raises(RpcError):
            await enforcer.create_container(pod, make_container(pod, "main"))
        write_public(new, keys)
        response = await enforcer.create_container(pod, make_container(pod, "main"))
        assert _env(response)["NVIDIA_VISIBLE_DEVICES"] == GPU1.uuid

    _run(body)


def test_captured_containerd_requests_with_a_record(sessions: list[Session], hook: Hook) -> None:
    """The CreateContainer requests real containerd sent (2.3.4 and 1.7.34), with our
    record added to the pod: the named container gets its devices."""

    async def body() -> None:
        checked = 0
        for session in sessions:
            for m in session.messages("r2p"):
                if m["method"] != "CreateContainer" or m["ttrpc_type"] != "request":
                    continue
                request = api.CreateContainerRequest.FromString(session.nri_payload(m))
                pod, container = request.pod, request.container
                text = encode(
                    PodAllocation(
                        pod.uid,
                        pod.namespace,
                        pod.name,
                        NODE,
                        (ContainerAllocation(container.name, gpus=(GPU1,)),),
                    ),
                    KEY,
                )
                pod.annotations[ALLOCATION_ANNOTATION] = text
                version = CONTAINERD_2_3 if session.version.startswith("v2") else CONTAINERD_1_7
                h = await hook(version=version)
                response = await h.conn.create_container(pod, container)
                assert [d[0] for d in _devices(response)] == [
                    "/dev/nvidiactl",
                    "/dev/nvidia-uvm",
                    "/dev/nvidia1",
                ]
                assert _env(response) == {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid}
                await h.close()
                checked += 1
        assert checked >= 4

    _run(body)


# --- VF netdevs through the sandbox lifecycle ---------------------------------------------------


def _vf_record(vf_name: str) -> str:
    vf = VfGrant("0000:3b:00.4", "mlx5_4", 4, vf_name)
    return record(
        ContainerAllocation("main", rdma=(RdmaGrant("0000:3b:00.0", "mlx5_0", 0, 50, (vf,)),))
    )


def _vf_pod(netns: str, vf: str) -> api.PodSandbox:
    """The pod whose record grants the RDMA VF `vf`, its sandbox in `netns`."""
    return _train_pod(_vf_record(vf), netns)


@pytest.mark.netns
@pytest.mark.parametrize("version", [CONTAINERD_2_3, CONTAINERD_1_7], ids=["2.3", "1.7"])
def test_vf_follows_the_sandbox(lab: NetLab, hook: Hook, version: RuntimeVersion) -> None:
    ns = lab.namespace()
    vf = lab.vf()

    async def body() -> None:
        h = await hook(version=version, rename_prefix="rdma")
        pod = _vf_pod(lab.path(ns), vf)
        await h.conn.event(api.RUN_POD_SANDBOX, pod)
        assert vf not in links() and "rdma0" in links(ns)
        await h.conn.event(api.STOP_POD_SANDBOX, pod)
        assert vf in links() and "rdma0" not in links(ns)
        await h.conn.event(api.REMOVE_POD_SANDBOX, pod)
        assert pod.id not in h.enforcer.pod_netdevs
        await h.close()

    _run(body)


@pytest.mark.netns
def test_a_missing_vf_fails_the_sandbox_unless_downgraded(lab: NetLab, hook: Hook) -> None:
    ns = lab.namespace()

    async def body() -> None:
        pod = _vf_pod(lab.path(ns), "tsr-novf")
        h = await hook()
        with pytest.raises(RpcError) as failed:
            await h.conn.event(api.RUN_POD_SANDBOX, pod)
        assert failed.value.code == Code.FAILED_PRECONDITION
        assert "tsr-novf" in failed.value.message
        await h.close()
        h = await hook(on_invalid="warn")
        assert await h.conn.event(api.RUN_POD_SANDBOX, pod)
        await h.close()

    _run(body)


@pytest.mark.netns
def test_a_copied_record_moves_no_vf_and_its_containers_are_refused(
    lab: NetLab, hook: Hook
) -> None:
    """Another pod's genuine record: its sandbox starts (the pause container gets nothing),
    the VF it names stays in the host, and the container creation says why."""
    ns = lab.namespace()
    vf = lab.vf()

    async def body() -> None:
        h = await hook()
        pod = make_pod(
            "copy",
            namespace="team-a",
            uid=UID.replace("c11", "c12"),
            annotations={ALLOCATION_ANNOTATION: _vf_record(vf)},
            netns=lab.path(ns),
        )
        assert await h.conn.event(api.RUN_POD_SANDBOX, pod)
        assert vf in links() and vf not in links(ns)
        assert pod.id not in h.enforcer.pod_netdevs
        with pytest.raises(RpcError) as refused:
            await h.conn.create_container(pod, make_container(pod, "main"))
        assert refused.value.code in (Code.INVALID_ARGUMENT, Code.PERMISSION_DENIED)
        assert "record is for pod UID" in refused.value.message
        assert await h.conn.event(api.STOP_POD_SANDBOX, pod)
        assert vf in links()
        await h.close()

    _run(body)


@pytest.mark.netns
def test_a_sandbox_gone_without_a_stop_event_still_gives_its_vf_back(
    lab: NetLab, hook: Hook
) -> None:
    """containerd sends no StopPodSandbox nor RemovePodSandbox for a sandbox that started
    before it restarted (it rebuilds its NRI state for containers only). The hook holds the
    namespace it moved the VF into, so the VF outlives the runtime's deletion of it and
    comes back, even a virtual one that would otherwise be destroyed with the namespace."""
    ns = lab.namespace()
    vf = lab.vf()

    async def body() -> None:
        h = await hook(rename_prefix="rdma")
        pod = _vf_pod(lab.path(ns), vf)
        await h.conn.event(api.RUN_POD_SANDBOX, pod)
        assert "rdma0" in links(ns)
        await h.enforcer.reconcile()
        assert "rdma0" in links(ns)  # still its sandbox's: left alone
        lab.remove_namespace(ns)  # the runtime deletes it and tells no plugin
        await h.enforcer.reconcile()
        assert vf in links()
        assert pod.id not in h.enforcer.pod_netdevs
        await h.close()

    _run(body)


@pytest.mark.netns
def test_a_restarted_plugin_still_brings_vfs_back(lab: NetLab, hook: Hook) -> None:
    """State is rebuilt from Synchronize: a plugin that did not move the VF itself (it
    restarted) returns it when the sandbox stops, even when the runtime's stop event
    carries a reduced PodSandbox without annotations (as containerd 1.7 sends)."""
    ns = lab.namespace()
    vf = lab.vf()

    async def body() -> None:
        pod = _vf_pod(lab.path(ns), vf)
        first = await hook()
        await first.conn.event(api.RUN_POD_SANDBOX, pod)
        await first.close()
        assert vf in links(ns)
        second = await hook(sync_pods=[pod], version=CONTAINERD_1_7)
        assert pod.id in second.enforcer.pod_netdevs
        reduced = api.PodSandbox(id=pod.id, name=pod.name, namespace=pod.namespace, uid=pod.uid)
        await second.conn.event(api.STOP_POD_SANDBOX, reduced)
        assert vf in links() and vf not in links(ns)
        await second.close()

    _run(body)


# --- poison records: one bad pod never fails a batch call or another pod ------------------------


def _non_ascii_proof(text: str) -> str:
    """The record with its integrity proof replaced by non-ASCII text of the same length."""
    doc = json.loads(text)
    proof = doc["integrity"]
    for key, value in proof.items():
        if key not in ("alg", "keyId") and isinstance(value, str):
            proof[key] = "\u00e9" * len(value)
    return json.dumps(doc, ensure_ascii=False)


def _poison_pods() -> list[api.PodSandbox]:
    good = record(ContainerAllocation("main", gpus=(GPU0,)))
    texts = {
        "deep-array": "[" * 1000,
        "nonascii-proof": _non_ascii_proof(good),
        "deep-object": '{"a":' * 5000,
        "huge": "[" * 70000,
    }
    return [
        make_pod(
            name,
            namespace="team-a",
            uid=f"0c5e3a52-7d0f-4a53-9a54-0d7f2b7b1d{i:02d}",
            annotations={ALLOCATION_ANNOTATION: text},
            netns="/var/run/netns/poison",
        )
        for i, (name, text) in enumerate(texts.items())
    ]


@pytest.mark.parametrize("version", [CONTAINERD_2_3, CONTAINERD_1_7], ids=["2.3", "1.7"])
def test_poison_records_do_not_fail_synchronize_or_the_other_pods(
    hook: Hook,
    version: RuntimeVersion,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        good = _vf_pod("/var/run/netns/train", "tsr-vf0")
        poison = _poison_pods()
        h = await hook(version=version, sync_pods=[*poison, good])
        assert h.sim.dropped == []
        assert list(h.enforcer.pod_netdevs) == [good.id]
        for pod in poison:
            warned = [r for r in caplog.records if f"team-a/{pod.name}" in r.getMessage()]
            assert len(warned) == 1, pod.name
            assert "record" in warned[0].getMessage()
        await h.close()

    _run(body)


@pytest.mark.parametrize("version", [CONTAINERD_2_3, CONTAINERD_1_7], ids=["2.3", "1.7"])
def test_poison_records_never_fail_sandbox_stop_or_removal(
    hook: Hook, version: RuntimeVersion
) -> None:
    async def body() -> None:
        h = await hook(version=version)
        for pod in _poison_pods():
            assert await h.conn.event(api.STOP_POD_SANDBOX, pod)
            assert await h.conn.event(api.REMOVE_POD_SANDBOX, pod)
            assert await h.conn.event(api.REMOVE_CONTAINER, pod, make_container(pod, "main"))
        await h.close()

    _run(body)


@pytest.mark.parametrize("on_invalid", ["fail", "warn"])
def test_poison_records_refuse_creation_saying_why_and_leave_the_sandbox_be(
    hook: Hook, on_invalid: OnInvalid
) -> None:
    """The refusal belongs to CreateContainer, which the kubelet shows in the pod's status
    (CreateContainerError); a refused sandbox would show only as an event while the pod
    reads ContainerCreating, and every retry would set the pod network up again."""

    async def body() -> None:
        h = await hook(on_invalid=on_invalid)
        for pod in _poison_pods():
            container = make_container(pod, "main")
            assert await h.conn.event(api.RUN_POD_SANDBOX, pod)
            assert pod.id not in h.enforcer.pod_netdevs
            if on_invalid == "warn":
                assert await h.conn.create_container(pod, container) == (
                    api.CreateContainerResponse()
                )
                continue
            with pytest.raises(RpcError) as refused:
                await h.conn.create_container(pod, container)
            assert refused.value.code in (Code.INVALID_ARGUMENT, Code.PERMISSION_DENIED)
            assert f"pod team-a/{pod.name}" in refused.value.message
            assert "record" in refused.value.message
        # the session is intact: a good pod still gets its devices
        pod = _train_pod(record(ContainerAllocation("main", gpus=(GPU0,))))
        response = await h.conn.create_container(pod, make_container(pod, "main"))
        assert _env(response) == {"NVIDIA_VISIBLE_DEVICES": GPU0.uuid}
        await h.close()

    _run(body)


def test_synchronize_forgets_pods_and_containers_the_runtime_no_longer_has(
    device_root: Path, key_file: Path
) -> None:
    enforcer = Enforcer(
        EnforcerConfig(node_name=NODE), KeyringSource(key_file), HostDevices(device_root)
    )
    kept, gone = make_pod("kept", uid=UID), make_pod("gone", uid=UID.replace("11", "12"))
    enforcer.injected = {"c-kept": (kept.id, "-"), "c-gone": (gone.id, "-")}
    enforcer.pod_netdevs = {
        kept.id: enforce_module._PodNetdevs("x/kept", "/ns", ()),
        gone.id: enforce_module._PodNetdevs("x/gone", "/ns", ()),
    }
    kept_container = make_container(kept, "main", container_id="c-kept")
    asyncio.run(enforcer.synchronize([kept], [kept_container]))
    assert list(enforcer.injected) == ["c-kept"]
    assert list(enforcer.pod_netdevs) == [kept.id]


def test_an_unisolated_share_is_warned_and_counted(
    device_root: Path, key_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With --isolation=none (accepted by the operator) every container given part of a GPU
    is logged as a warning and counted; a whole GPU is neither."""
    metrics = Metrics(NODE)
    enforcer = Enforcer(
        EnforcerConfig(node_name=NODE, settings=Settings(isolation="none")),
        KeyringSource(key_file),
        HostDevices(device_root),
        metrics=metrics,
    )

    def unisolated() -> float | None:
        return metrics.registry.get_sample_value("tessera_nri_unisolated_gpu_shares_total")

    whole = _train_pod(record(ContainerAllocation("main", gpus=(GPU1,))))
    asyncio.run(enforcer.create_container(whole, make_container(whole, "main")))
    assert unisolated() == 0 and not [r for r in caplog.records if "WITHOUT" in r.getMessage()]
    share = _train_pod(record(ContainerAllocation("main", gpus=(GPU0, GPU1))))
    asyncio.run(enforcer.create_container(share, make_container(share, "main")))
    assert unisolated() == 1
    (warning,) = [r for r in caplog.records if "WITHOUT isolation" in r.getMessage()]
    assert warning.levelname == "WARNING" and "team-a/train" in warning.getMessage()


def test_the_connected_gauge_follows_the_runtime_connection(
    sock_dir: Path, device_root: Path, key_file: Path
) -> None:
    """tessera_nri_connected{node} is 0 until containerd accepts the registration, 1 while
    the connection lasts, 0 once containerd goes away, and 1 again after the reconnect."""
    metrics = Metrics(NODE)
    enforcer = Enforcer(
        EnforcerConfig(node_name=NODE),
        KeyringSource(key_file),
        HostDevices(device_root),
        metrics=metrics,
    )
    path = str(sock_dir / "nri.sock")

    def connected() -> float | None:
        return metrics.registry.get_sample_value("tessera_nri_connected", {"node": NODE})

    async def reaches(value: float) -> None:
        async def poll() -> None:
            while connected() != value:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(poll(), 10)

    async def body() -> None:
        plugin = NriPlugin(
            enforcer, name="tessera", index="50", socket_path=path, backoff=Backoff(0.02, 0.1)
        )
        stop = asyncio.Event()
        task = asyncio.create_task(plugin.run(stop))  # no runtime yet: retrying
        await asyncio.sleep(0.1)
        assert connected() == 0
        for _ in range(2):
            sim = RuntimeSimulator(path)
            await sim.start()
            conn = await sim.next_plugin()
            await reaches(1)
            conn.close()  # containerd restarts
            await sim.stop()
            await reaches(0)
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(asyncio.wait_for(body(), 30))


def test_containers_whose_own_rules_open_gpus_are_warned_and_counted(
    hook: Hook, device_root: Path, key_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A privileged container reaches every GPU whatever the record says: the hook says
    which GPUs it was not given, over the real socket as containerd asks; a container
    with containerd's usual deny-all rule is not mentioned."""
    if os.major(os.stat(device_root / "dev" / "nvidia0").st_rdev) != 195:
        pytest.skip("device nodes cannot be made here (no mknod): the given GPU is not known")
    for minor, uuid in ((0, GPU0.uuid), (1, GPU1.uuid)):
        info = device_root / "proc" / "driver" / "nvidia" / "gpus" / f"0000:0{minor}:00.0"
        info.mkdir(parents=True)
        (info / "information").write_text(f"GPU UUID:\t{uuid}\nDevice Minor:\t{minor}\n")
    metrics = Metrics(NODE)

    def counted() -> float | None:
        return metrics.registry.get_sample_value("tessera_nri_unmanaged_gpu_access_total")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "own device rules" in r.getMessage()]

    async def body() -> None:
        h = await hook()
        h.enforcer.metrics = metrics
        pod = _train_pod(record(ContainerAllocation("main", gpus=(GPU0,))))
        await h.conn.event(api.RUN_POD_SANDBOX, pod)
        await h.conn.create_container(pod, make_container(pod, "main"))
        plain = make_pod("plain", uid="0c5e3a52-7d0f-4a53-9a54-0d7f2b7b1c12")
        await h.conn.create_container(plain, make_container(plain, "main"))
        assert counted() == 0 and warnings() == []
        given = make_container(pod, "main", container_id="c-given", privileged=True)
        response = await h.conn.create_container(pod, given)
        assert ("/dev/nvidia0", "c", 195, 0) in [t[:4] for t in _devices(response)]
        privileged = make_container(plain, "tools", privileged=True)
        await h.conn.create_container(plain, privileged)
        await h.close()

    _run(body)
    assert counted() == 2
    given_warning, plain_warning = warnings()
    assert "team-a/train" in given_warning and "/dev/nvidia1" in given_warning
    assert "/dev/nvidia0" not in given_warning  # the one the record gives it
    assert "/dev/nvidia0, /dev/nvidia1" in plain_warning and "container=tools" in plain_warning


def test_without_the_drivers_gpu_list_a_privileged_container_is_reported_only_with_a_driver(
    tmp_path: Path, key_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No NVIDIA driver on the node: nothing to open, nothing said. The driver without its
    /proc list of GPUs: the warning speaks of the node's GPUs as a whole."""
    root = tmp_path / "host"
    (root / "dev").mkdir(parents=True)
    metrics = Metrics(NODE)
    enforcer = Enforcer(
        EnforcerConfig(node_name=NODE, settings=Settings()),
        KeyringSource(key_file),
        HostDevices(root),
        metrics=metrics,
    )
    pod = make_pod("tools", uid="0c5e3a52-7d0f-4a53-9a54-0d7f2b7b1c13")
    asyncio.run(enforcer.create_container(pod, make_container(pod, "main", privileged=True)))
    count = "tessera_nri_unmanaged_gpu_access_total"
    assert metrics.registry.get_sample_value(count) == 0
    (root / "dev" / "nvidiactl").touch()
    asyncio.run(enforcer.create_container(pod, make_container(pod, "main", privileged=True)))
    assert metrics.registry.get_sample_value(count) == 1
    (warning,) = [r.getMessage() for r in caplog.records if "own device rules" in r.getMessage()]
    assert "open every GPU of this node" in warning and "/dev/nvidia" not in warning


# --- the fail-closed gate ---------------------------------------------------------------------


def _given_devices(pod: api.PodSandbox, name: str) -> api.Container:
    """A container of `pod` the kubelet gave tessera devices: it carries the agent's mounts."""
    return make_container(pod, name, allocated=[agent_answer(f"{GPU0.uuid}::0")])


def test_without_the_hook_a_container_given_devices_cannot_start() -> None:
    pod = _train_pod(record(ContainerAllocation("main", gpus=(GPU0,))))
    with pytest.raises(RuncRefusedError, match=NRI_GATE_DESTINATION):
        runc_create(_given_devices(pod, "main"), None)  # created while no plugin was there
    runc_create(make_container(pod, "plain"), None)  # nothing of tessera's: starts


@pytest.mark.parametrize("version", [CONTAINERD_2_3, CONTAINERD_1_7], ids=["2.3", "1.7"])
def test_the_hook_removes_the_gate_of_the_containers_it_adjusts(
    hook: Hook, version: RuntimeVersion
) -> None:
    async def body() -> None:
        h = await hook(version=version)
        pod = _train_pod(record(ContainerAllocation("main", gpus=(GPU0,))))
        main = _given_devices(pod, "main")
        response = await h.conn.create_container(pod, main)
        assert _env(response) == {"NVIDIA_VISIBLE_DEVICES": GPU0.uuid}
        assert [m.destination for m in response.adjust.mounts] == ["-" + NRI_GATE_DESTINATION]
        runc_create(main, response.adjust)
        # a container without the gate (no tessera devices from the kubelet) gets no removal
        ungated = await h.conn.create_container(pod, make_container(pod, "main"))
        assert not ungated.adjust.mounts and _env(ungated) == _env(response)
        await h.close()

    _run(body)


@pytest.mark.parametrize(
    ("annotation", "why"),
    [
        (None, "the pod has no allocation record"),
        (record(ContainerAllocation("other", gpus=(GPU0,))), "record does not name it"),
        ("{garbage", "invalid allocation record"),
    ],
    ids=["no-record", "not-named", "bad-record"],
)
def test_a_container_given_devices_that_its_record_does_not_cover_is_refused(
    hook: Hook, annotation: str | None, why: str
) -> None:
    """Placed by another scheduler, or a record that does not cover it: refused saying
    why; under `warn` it runs, with no device (its gate removed, nothing added)."""

    async def body() -> None:
        annotations = {ALLOCATION_ANNOTATION: annotation} if annotation is not None else {}
        pod = make_pod("train", namespace="team-a", uid=UID, annotations=annotations)
        main = _given_devices(pod, "main")
        h = await hook()
        with pytest.raises(RpcError) as refused:
            await h.conn.create_container(pod, main)
        assert why in refused.value.message and '"main"' in refused.value.message
        if annotation is None or "other" in annotation:
            assert refused.value.code == Code.FAILED_PRECONDITION
            assert "tessera devices" in refused.value.message
        await h.close()
        h = await hook(on_invalid="warn")
        response = await h.conn.create_container(pod, main)
        assert not response.adjust.linux.devices and not response.adjust.env
        runc_create(main, response.adjust)
        await h.close()

    _run(body)


def test_synchronize_names_the_containers_created_while_the_hook_was_away(
    device_root: Path, key_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    enforcer = Enforcer(
        EnforcerConfig(node_name=NODE), KeyringSource(key_file), HostDevices(device_root)
    )
    pod = _train_pod(record(ContainerAllocation("main", gpus=(GPU0,))))
    waiting = _given_devices(pod, "main")
    asyncio.run(enforcer.synchronize([pod], [waiting, make_container(pod, "plain")]))
    (line,) = [r.getMessage() for r in caplog.records if "fail-closed gate" in r.getMessage()]
    assert line.startswith("1 container(s)") and "team-a/train/main" in line


@pytest.mark.netns
@pytest.mark.parametrize("synchronized", [False, True], ids=["never-seen", "synchronized"])
def test_a_sandbox_started_while_the_hook_was_away_gets_its_vf_before_its_container(
    lab: NetLab, hook: Hook, synchronized: bool
) -> None:
    """No RunPodSandbox reached the hook (it was down, or restarted since and only
    learnt of the pod from Synchronize): the container the record names is created only
    with the pod's VF in its namespace, else it would run without it."""
    ns = lab.namespace()
    vf = lab.vf()

    async def body() -> None:
        pod = _vf_pod(lab.path(ns), vf)
        h = await hook(sync_pods=[pod] if synchronized else [])
        assert vf in links() and vf not in links(ns)
        await h.conn.create_container(pod, _given_devices(pod, "main"))
        assert vf not in links() and vf in links(ns)
        assert pod.id in h.enforcer.pod_netdevs  # brought back when the sandbox stops
        await h.conn.create_container(pod, _given_devices(pod, "main"))  # a restart: no-op
        await h.conn.event(api.STOP_POD_SANDBOX, pod)
        assert vf in links() and vf not in links(ns)
        await h.close()

    _run(body)
