"""VF netdev moves, for real: `ip netns add` namespaces and veth links standing in for VFs."""

from __future__ import annotations

from pathlib import Path

import pytest

from nri_hook.netdev import (
    NetdevError,
    NetdevMove,
    NetdevMover,
    network_namespace,
    plan_moves,
)
from tessera.allocation import ContainerAllocation, PodAllocation, RdmaGrant, VfGrant
from tests.nri_hook.netns_helpers import links, netlab, rename


def _vf(n: int, netdev: str) -> VfGrant:
    return VfGrant(f"0000:3b:00.{n}", f"mlx5_{n + 2}", n + 2, netdev)


def test_plan_moves_deduplicates_and_renames() -> None:
    shared = RdmaGrant("0000:3b:00.0", "mlx5_0", 0, 25, vfs=(_vf(2, "ens1v0"),))
    other = RdmaGrant("0000:5e:00.0", "mlx5_1", 1, 25, vfs=(_vf(3, "ens2v0"), _vf(4, "")))
    alloc = PodAllocation(
        "uid",
        "ns",
        "p",
        "node",
        (
            ContainerAllocation("a", rdma=(shared,)),
            ContainerAllocation("b", rdma=(other,)),
            ContainerAllocation("init", rdma=(shared,), init=True, reuses="a"),
        ),
    )
    assert plan_moves(alloc) == [
        NetdevMove("ens1v0", "ens1v0", "0000:3b:00.2"),
        NetdevMove("ens2v0", "ens2v0", "0000:3b:00.3"),
    ]
    assert [m.pod_name for m in plan_moves(alloc, "rdma")] == ["rdma0", "rdma1"]
    with pytest.raises(NetdevError):
        plan_moves(alloc, "a-very-long-prefix")


def test_network_namespace_of_a_sandbox() -> None:
    assert network_namespace([("ipc", ""), ("network", "/var/run/netns/cni-1")]) == (
        "/var/run/netns/cni-1"
    )
    assert network_namespace([("ipc", ""), ("network", "")]) is None  # hostNetwork
    assert network_namespace([]) is None


@pytest.mark.netns
def test_move_in_renamed_and_back_out() -> None:
    with netlab() as lab:
        ns = lab.namespace()
        vf = lab.vf()
        moves = [NetdevMove(vf, "net0", "0000:00:00.0")]
        mover = NetdevMover()
        mover.move_in(lab.path(ns), moves)
        assert vf not in links()
        assert "net0" in links(ns)
        mover.move_in(lab.path(ns), moves)  # again: already there, nothing to do
        assert "net0" in links(ns)
        assert mover.move_out(lab.path(ns), moves) == []
        assert vf in links()
        assert "net0" not in links(ns)


@pytest.mark.netns
def test_a_missing_vf_fails_and_rolls_back_the_others() -> None:
    with netlab() as lab:
        ns = lab.namespace()
        vf = lab.vf()
        moves = [
            NetdevMove(vf, vf, "0000:00:00.1"),
            NetdevMove("tsr-nosuchvf", "tsr-nosuchvf", "0000:00:00.2"),
        ]
        with pytest.raises(NetdevError) as failed:
            NetdevMover().move_in(lab.path(ns), moves)
        assert "tsr-nosuchvf" in str(failed.value) and "0000:00:00.2" in str(failed.value)
        assert vf in links()  # moved, then moved back
        assert vf not in links(ns)


@pytest.mark.netns
def test_missing_namespace_is_an_error() -> None:
    with netlab() as lab:
        vf = lab.vf()
        with pytest.raises(NetdevError) as failed:
            NetdevMover().move_in("/run/netns/tsr-does-not-exist", [NetdevMove(vf, vf, "x")])
        assert "tsr-does-not-exist" in str(failed.value)
        assert vf in links()


@pytest.mark.netns
def test_after_the_namespace_is_gone_a_returned_device_gets_its_name_back() -> None:
    """A physical VF comes back to the host under its pod name when the namespace dies
    (veth ends are destroyed instead, so the kernel's return is played by a rename)."""
    with netlab() as lab:
        ns = lab.namespace()
        vf = lab.vf()
        moves = [NetdevMove(vf, "pod0", "0000:00:00.3")]
        rename(vf, "pod0")  # as the kernel would hand it back
        lab.remove_namespace(ns)
        assert NetdevMover().move_out(lab.path(ns), moves) == []
        assert vf in links() and "pod0" not in links()


@pytest.mark.netns
def test_a_vf_found_nowhere_is_reported() -> None:
    with netlab() as lab:
        ns = lab.namespace()
        problems = NetdevMover().move_out(
            lab.path(ns), [NetdevMove("tsr-gone", "tsr-gone0", "0000:00:00.4")]
        )
        assert len(problems) == 1 and "tsr-gone" in problems[0]


@pytest.mark.netns
def test_a_returned_device_under_another_name_is_found_by_pci_address(tmp_path: Path) -> None:
    """When its names are taken the kernel hands a device back as devN: find it by PCI
    address in sysfs (a fake sysfs tree here, as veth ends have no PCI device)."""
    with netlab() as lab:
        vf = lab.vf()
        stray = f"tsrd{lab.tag}"[:15]
        rename(vf, stray)
        device_dir = tmp_path / "sys/devices/pci0000:00/0000:00:00.9"
        device_dir.mkdir(parents=True)
        (tmp_path / "sys/class/net" / stray).mkdir(parents=True)
        (tmp_path / "sys/class/net" / stray / "device").symlink_to(device_dir)
        mover = NetdevMover(sysfs_root=str(tmp_path))
        assert mover.move_out(None, [NetdevMove(vf, "pod0", "0000:00:00.9")]) == []
        assert vf in links() and stray not in links()
