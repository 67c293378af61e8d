"""Health transitions driven by the fake backend: first step by step with a controlled clock,
then end to end as the kubelet sees them through ListAndWatch."""

from __future__ import annotations

from pathlib import Path

from deviceplugin.agent import Agent
from deviceplugin.backend import XidEvent
from deviceplugin.units import UnitConfig
from tessera.resources import GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, RDMA
from tessera_testbed.kubelet import KubeletSimulator
from tests.deviceplugin.helpers import health_by_device, make_agent, running


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _unhealthy(agent: Agent) -> dict[str, str]:
    return {f"gpu{g.index}": g.health_reason for g in agent.inventory.gpus if not g.healthy}


def test_xid_then_quiet_period_then_healthy(tmp_path: Path) -> None:
    agent, backend = make_agent(tmp_path, quiet_period_s=60)
    clock = Clock()
    agent.clock = clock
    agent.discover()
    uuid = backend.gpu(3).uuid
    agent.apply_events([XidEvent(uuid, 79, "XID 79")])
    assert _unhealthy(agent) == {"gpu3": "XID 79"}
    units = agent.units[GPU_CORE].units
    assert {u.healthy for u in units if u.device == uuid} == {False}
    assert all(u.healthy for u in units if u.device != uuid)
    clock.now += 59
    agent.query_once()
    assert _unhealthy(agent) == {"gpu3": "XID 79"}
    clock.now += 1
    agent.query_once()
    assert _unhealthy(agent) == {}


def test_application_xids_are_ignored_and_unknown_device_marks_all(tmp_path: Path) -> None:
    agent, backend = make_agent(tmp_path, "t4-4x")
    agent.discover()
    agent.apply_events([XidEvent(backend.gpu(0).uuid, xid, f"XID {xid}") for xid in (13, 31, 43)])
    agent.apply_events([XidEvent("GPU-not-ours", 79, "XID 79")])
    assert _unhealthy(agent) == {}
    agent.apply_events([XidEvent(None, 0, "NVML event wait failed: Unknown Error")])
    assert set(_unhealthy(agent)) == {"gpu0", "gpu1", "gpu2", "gpu3"}


def test_a_gpu_that_stops_answering(tmp_path: Path) -> None:
    agent, backend = make_agent(tmp_path, "t4-4x", quiet_period_s=30)
    clock = Clock()
    agent.clock = clock
    agent.discover()
    uuid = backend.gpu(2).uuid
    backend.set_answers(uuid, False, "NVML query failed: GPU is lost")
    agent.query_once()
    assert _unhealthy(agent) == {"gpu2": "NVML query failed: GPU is lost"}
    clock.now += 100
    agent.query_once()  # still failing: stays unhealthy however long it has been
    assert "gpu2" in _unhealthy(agent)
    backend.set_answers(uuid, True)
    clock.now += 29
    agent.query_once()
    assert "gpu2" in _unhealthy(agent)  # quiet period counts from the last failure
    clock.now += 1
    agent.query_once()
    assert _unhealthy(agent) == {}


def test_zero_quiet_period_keeps_a_gpu_out(tmp_path: Path) -> None:
    agent, backend = make_agent(tmp_path, "t4-4x", quiet_period_s=0)
    clock = Clock()
    agent.clock = clock
    agent.discover()
    agent.apply_events([XidEvent(backend.gpu(1).uuid, 48, "XID 48")])
    for _ in range(3):
        clock.now += 3600
        agent.query_once()
    assert _unhealthy(agent) == {"gpu1": "XID 48"}


def test_nic_ports(tmp_path: Path) -> None:
    agent, backend = make_agent(tmp_path)
    agent.discover()
    backend.set_port_states("mlx5_1", ("DOWN",))
    agent.query_once()
    nic = next(n for n in agent.inventory.nics if n.ibdev == "mlx5_1")
    assert (nic.healthy, nic.health_reason, nic.port_states) == (False, "port 1 DOWN", ("DOWN",))
    rdma = agent.units[RDMA].units
    assert {u.device for u in rdma if not u.healthy} == {"rdma-mlx5_1"}
    backend.set_port_states("mlx5_1", ("ACTIVE",))
    agent.query_once()
    assert all(n.healthy for n in agent.inventory.nics)


def test_health_transitions_seen_through_list_and_watch(sock_dir: Path) -> None:
    agent, backend = make_agent(
        sock_dir, quiet_period_s=0.3, query_interval_s=0.05, units=UnitConfig(nvidia_gpu=True)
    )
    with KubeletSimulator(sock_dir) as kubelet, running(agent):
        resources = [GPU_CORE, GPU_MEMORY_RATIO, GPU_MEMORY, GPU]
        kubelet.wait_registered(resources)
        core = kubelet.endpoint(GPU_CORE)
        core.wait_for(lambda m: len(m.devices) == 800)
        gpu5, gpu6 = backend.gpu(5).uuid, backend.gpu(6).uuid
        backend.inject_xid(gpu6, 31)  # application error: ignored
        backend.inject_xid(gpu5, 79)
        sick = core.wait_for(lambda m: health_by_device(m)[gpu5] == {"Unhealthy"})
        assert len(sick.devices) == 800  # a complete snapshot, not a delta
        assert all(h == {"Healthy"} for d, h in health_by_device(sick).items() if d != gpu5)
        for resource in resources:
            kubelet.endpoint(resource).wait_for(
                lambda m: health_by_device(m)[gpu5] == {"Unhealthy"}
            )
        # the GPU keeps answering NVML: after the quiet period it is back
        core.wait_for(lambda m: health_by_device(m)[gpu5] == {"Healthy"}, after=sick)
        history = [health_by_device(m) for m in core.snapshots]
        states = [h[gpu5] for h in history]
        first_bad = states.index({"Unhealthy"})
        assert {"Healthy"} in states[first_bad:]
        assert all(h[gpu6] == {"Healthy"} for h in history)  # XID 31 never counted
