"""The plugin against the kubelet simulator, over real unix sockets."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from deviceplugin.server import PluginManager, PluginServer
from deviceplugin.units import UnitConfig
from protos.kubelet.deviceplugin.v1beta1 import api_pb2 as pb
from tessera.resources import GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, NVIDIA_GPU, RDMA
from tessera_edge.host_paths import NRI_GATE_DESTINATION
from tessera_testbed.kubelet import CHECKPOINT, KubeletSimulator
from tests.deviceplugin.helpers import make_agent, running

TESSERA = [GPU_CORE, GPU_MEMORY_RATIO, GPU_MEMORY, GPU, RDMA]


def test_registers_every_resource_and_sends_full_snapshots(sock_dir: Path) -> None:
    agent, _ = make_agent(sock_dir)
    with KubeletSimulator(sock_dir) as kubelet, running(agent):
        kubelet.wait_registered(TESSERA)
        for request in kubelet.requests:
            assert request.version == "v1beta1"
            assert "/" not in request.endpoint and (sock_dir / request.endpoint).is_socket()
            assert request.options.get_preferred_allocation_available
        for resource in TESSERA:
            endpoint = kubelet.endpoint(resource)
            assert endpoint.options is not None
            assert endpoint.options.get_preferred_allocation_available
            assert not endpoint.options.pre_start_required
        core = kubelet.endpoint(GPU_CORE).wait_for(lambda m: len(m.devices) > 0)
        assert len(core.devices) == 800
        assert {d.health for d in core.devices} == {"Healthy"}
        numa = {g.uuid: g.numa_node for g in agent.inventory.gpus}
        for device in core.devices:
            uuid, _, number = device.ID.partition("::")
            assert number.isdigit()
            assert [n.ID for n in device.topology.nodes] == [numa[uuid]]
        memory = kubelet.endpoint(GPU_MEMORY).wait_for(lambda m: len(m.devices) > 0)
        assert len(memory.devices) == 8 * (81559 // 1024)
        rdma = kubelet.endpoint(RDMA).wait_for(lambda m: len(m.devices) > 0)
        assert len(rdma.devices) == 400


def test_preferred_allocation_allocate_and_prestart_through_the_kubelet(sock_dir: Path) -> None:
    agent, backend = make_agent(sock_dir)
    gpu2, gpu5, gpu6 = (backend.gpu(i).uuid for i in (2, 5, 6))
    with KubeletSimulator(sock_dir) as kubelet, running(agent):
        kubelet.wait_registered([GPU_CORE])
        snapshot = kubelet.endpoint(GPU_CORE).wait_for(lambda m: len(m.devices) > 0)
        # the kubelet offers what is free: say 40 units left on gpu2, all of gpu5 and gpu6
        available = [d.ID for d in snapshot.devices if d.ID.startswith((gpu5, gpu6))]
        available += [f"{gpu2}::{n}" for n in range(60, 100)]
        chosen = kubelet.get_preferred_allocation(GPU_CORE, available, [], 140)
        per_device = Counter(c.split("::")[0] for c in chosen)
        assert sum(per_device.values()) == 140 and len(per_device) == 2
        assert per_device[gpu2] == 40
        response = kubelet.allocate(GPU_CORE, chosen)
        # no env var: the kubelet's units may be on other GPUs than the allocation record
        assert not any(name.startswith("TESSERA_DP") for name in response.envs)
        summary = response.annotations["tessera.dev/dp-units-gpu-core"]
        assert dict(item.rsplit(":", 1) for item in summary.split(",")) == {
            k: str(v) for k, v in per_device.items()
        }
        assert not response.devices  # the NRI hook injects them
        # ...and only the hook opens the fail-closed gate: a mount runc refuses
        (gate,) = response.mounts
        assert gate.container_path == NRI_GATE_DESTINATION
        assert gate.container_path.startswith("/proc/") and gate.read_only
        kubelet.pre_start_container(GPU_CORE, chosen)


def test_allocate_answers_every_container_and_refuses_unknown_ids(sock_dir: Path) -> None:
    agent, backend = make_agent(sock_dir, "t4-4x")
    gpu0, gpu1, gpu3 = (backend.gpu(i).uuid for i in (0, 1, 3))
    with KubeletSimulator(sock_dir) as kubelet, running(agent):
        kubelet.wait_registered([GPU_MEMORY])
        request = pb.AllocateRequest()
        request.container_requests.add(devices_ids=[f"{gpu0}::1", f"{gpu0}::2"])
        request.container_requests.add(devices_ids=[f"{gpu3}::0", f"{gpu1}::7"])
        request.container_requests.add(devices_ids=[])
        stub = kubelet.endpoint(GPU_MEMORY).stub
        response = stub.Allocate(request, timeout=5)
        assert [dict(c.envs) for c in response.container_responses] == [{}, {}, {}]
        summaries = [
            dict(c.annotations).get("tessera.dev/dp-units-gpu-memory")
            for c in response.container_responses
        ]
        assert summaries == [f"{gpu0}:2", f"{gpu3}:1,{gpu1}:1", ""]
        request.container_requests.add(devices_ids=["GPU-not-here::0", "gpu0-mem-0"])
        with pytest.raises(grpc.RpcError) as refused:
            stub.Allocate(request, timeout=5)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown device ID 'GPU-not-here::0'" in (refused.value.details() or "")


def test_nvidia_gpu_resource_when_enabled(sock_dir: Path) -> None:
    agent, backend = make_agent(sock_dir, "t4-4x", units=UnitConfig(nvidia_gpu=True))
    uuids = [backend.gpu(i).uuid for i in range(4)]
    with KubeletSimulator(sock_dir) as kubelet, running(agent):
        kubelet.wait_registered([NVIDIA_GPU, GPU_CORE])
        whole = kubelet.endpoint(NVIDIA_GPU).wait_for(lambda m: len(m.devices) > 0)
        assert [d.ID for d in whole.devices] == uuids  # as NVIDIA's plugin names whole GPUs
        assert RDMA not in kubelet.endpoints  # the T4 node has no RDMA NICs
        assert (
            kubelet.allocate(NVIDIA_GPU, [uuids[2]]).annotations[
                "tessera.dev/dp-units-nvidia.com-gpu"
            ]
            == f"{uuids[2]}:1"
        )


def test_registering_before_serving_fails_in_the_simulator(sock_dir: Path) -> None:
    """The simulator dials back like the kubelet: a plugin not yet serving cannot register."""
    with KubeletSimulator(sock_dir, dial_timeout_s=0.5):
        server = PluginServer("example.com/thing", sock_dir)
        with pytest.raises(grpc.RpcError) as err:
            server.register(sock_dir / "kubelet.sock", timeout_s=5)
        assert "cannot dial" in str(err.value)
        server.start()
        server.register(sock_dir / "kubelet.sock", timeout_s=5)
        server.stop()


def test_kubelet_rejects_bad_names_and_the_plugin_keeps_retrying(sock_dir: Path) -> None:
    with KubeletSimulator(sock_dir) as kubelet:
        manager = PluginManager(
            ["kubernetes.io/forbidden", GPU_CORE], sock_dir, poll_interval_s=0.05
        )
        manager.start()
        try:
            kubelet.wait_registered([GPU_CORE])
            bad = manager.servers["kubernetes.io/forbidden"]
            deadline = time.monotonic() + 5
            while bad.backoff < 0.4 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert bad.needs_registration and bad.backoff >= 0.4  # refused, backing off
            assert "kubernetes.io/forbidden" not in kubelet.endpoints
        finally:
            manager.stop()


def test_kubelet_restart_is_survived(sock_dir: Path) -> None:
    agent, backend = make_agent(sock_dir)
    gpu1 = backend.gpu(1).uuid
    with KubeletSimulator(sock_dir) as kubelet, running(agent):
        kubelet.wait_registered(TESSERA)
        (sock_dir / "some-other-file").write_text("kept")
        for _ in range(2):  # twice: recovery must not be a one-off
            restarted = kubelet.restart()
            kubelet.wait_registered(TESSERA, since=restarted, timeout_s=10)
            for resource in TESSERA:
                snapshot = kubelet.endpoint(resource).wait_for(lambda m: len(m.devices) > 0)
                assert {d.health for d in snapshot.devices} == {"Healthy"}
        assert (sock_dir / CHECKPOINT).exists()
        assert (sock_dir / "some-other-file").read_text() == "kept"
        chosen = kubelet.get_preferred_allocation(GPU, [f"{gpu1}::{n}" for n in range(100)], [], 50)
        assert kubelet.allocate(GPU, chosen).annotations["tessera.dev/dp-units-gpu"] == f"{gpu1}:50"


def test_new_kubelet_socket_alone_triggers_registration(sock_dir: Path) -> None:
    """An older kubelet may leave plugin sockets alone and only re-create kubelet.sock."""
    agent, _ = make_agent(sock_dir, "t4-4x")
    with KubeletSimulator(sock_dir) as kubelet, running(agent):
        kubelet.wait_registered([GPU_CORE])
        kubelet.stop()
        (sock_dir / "kubelet.sock").unlink(missing_ok=True)
        started = time.monotonic()
        kubelet.start()
        kubelet.wait_registered([GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, GPU], since=started)


def test_kubelet_coming_up_after_the_plugin(sock_dir: Path) -> None:
    agent, _ = make_agent(sock_dir, "t4-4x")
    with running(agent):
        kubelet = KubeletSimulator(sock_dir)
        kubelet.start()
        try:
            kubelet.wait_registered([GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, GPU])
        finally:
            kubelet.stop()


def test_a_newer_list_and_watch_ends_the_older_one(sock_dir: Path) -> None:
    agent, _ = make_agent(sock_dir, "t4-4x")
    with KubeletSimulator(sock_dir) as kubelet, running(agent):
        kubelet.wait_registered([GPU_CORE])
        endpoint = kubelet.endpoint(GPU_CORE)
        endpoint.wait_for(lambda m: len(m.devices) == 400)
        second = endpoint.stub.ListAndWatch(pb.Empty())
        assert len(next(second).devices) == 400
        deadline = time.monotonic() + 5
        while endpoint.stream_open and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not endpoint.stream_open
        second.cancel()
