"""Broken input is named precisely, and the agent serves what it could read."""

from __future__ import annotations

from pathlib import Path

from deviceplugin.agent import Agent, AgentConfig
from deviceplugin.fake_backend import FakeBackend
from deviceplugin.rdma import SysfsRdma
from deviceplugin.sysfs import Sysfs
from tessera.resources import GPU_CORE, RDMA
from tessera_testbed.kubelet import KubeletSimulator
from tests.deviceplugin.helpers import running
from tests.deviceplugin.sysfs_tree import SysfsTree


def test_a_broken_nic_is_skipped_and_everything_else_served(sock_dir: Path, tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    good = tree.add_pci(["0000:3a:00.0", "0000:3f:00.0"], root_complex="pci0000:3a")
    tree.add_ib("mlx5_0", good, uverbs=0, netdevs=["ens1"])
    bad = tree.add_pci(["0000:97:01.0", "0000:98:00.0"], root_complex="pci0000:97")
    tree.add_ib("mlx5_1", bad, ports=["ACTIVE"], uverbs=1)  # not '<n>: <STATE>'
    backend = FakeBackend.from_topology("t4-4x")
    nics = SysfsRdma(Sysfs(tmp_path), link_source_factory=None)
    agent = Agent(
        AgentConfig("node-a", plugin_dir=sock_dir, poll_interval_s=0.05, query_interval_s=0),
        backend,
        nics,
    )
    with KubeletSimulator(sock_dir) as kubelet, running(agent):
        kubelet.wait_registered([GPU_CORE, RDMA])
        rdma = kubelet.endpoint(RDMA).wait_for(lambda m: len(m.devices) > 0)
        assert {d.ID.split("::")[0] for d in rdma.devices} == {"rdma-mlx5_0"}
        assert len(rdma.devices) == 100
        core = kubelet.endpoint(GPU_CORE).wait_for(lambda m: len(m.devices) > 0)
        assert len(core.devices) == 400
    (error,) = agent.errors
    assert error.source.endswith("mlx5_1/ports/1/state") and error.field == "state"
    assert "'ACTIVE'" in str(error)
