from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deviceplugin.rdma import (
    LinkInfo,
    SysfsRdma,
    VfLink,
    link_info_from_message,
    parse_port_state,
    port_health,
)
from deviceplugin.sysfs import Sysfs
from tests.deviceplugin.sysfs_tree import SysfsTree


def _node(tmp_path: Path) -> SysfsTree:
    """Two NICs on different roots: mlx5_0 with two bound VFs and one unbound VF, mlx5_1."""
    tree = SysfsTree(tmp_path)
    pf0 = tree.add_pci(["0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:0c:00.0"], numa=0)
    tree.add_ib("mlx5_0", pf0, ports=["4: ACTIVE"], uverbs=0, netdevs=["ib0"])
    for k, (fn, ibdev, uverbs) in enumerate([("1", "mlx5_4", 4), ("2", "mlx5_5", 5)]):
        vf = tree.add_pci(["0000:15:01.0", "0000:16:00.0", "0000:17:00.0", f"0000:0c:00.{fn}"])
        tree.add_ib(ibdev, vf, uverbs=uverbs, netdevs=[f"ib0v{k}"])
        tree.add_vf(pf0, k, vf)
    unbound = tree.add_pci(["0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:0c:00.3"])
    tree.add_vf(pf0, 2, unbound)
    pf1 = tree.add_pci(["0000:97:01.0", "0000:8c:00.0"], root_complex="pci0000:97", numa=1)
    tree.add_ib("mlx5_1", pf1, ports=["4: ACTIVE", "1: DOWN"], uverbs=1, netdevs=["ib1"])
    return tree


def test_discovers_nics_with_vfs_and_topology(tmp_path: Path) -> None:
    _node(tmp_path)
    found = SysfsRdma(Sysfs(tmp_path), link_source_factory=None).discover()
    assert found.errors == []
    assert [n.ibdev for n in found.nics] == ["mlx5_0", "mlx5_1"]  # VFs are not NICs
    nic0, nic1 = found.nics
    assert (nic0.pci_bus_id, nic0.uverbs_minor, nic0.numa_node, nic0.netdev) == (
        "0000:0c:00.0",
        0,
        0,
        "ib0",
    )
    assert (nic0.pcie_root, nic0.pcie_switch) == ("pci0000:15", "0000:16:00.0")
    assert nic0.port_states == ("ACTIVE",)
    assert [(v.pci_bus_id, v.ibdev, v.uverbs_minor, v.netdev) for v in nic0.vfs] == [
        ("0000:0c:00.1", "mlx5_4", 4, "ib0v0"),
        ("0000:0c:00.2", "mlx5_5", 5, "ib0v1"),
    ]
    assert (nic1.numa_node, nic1.pcie_root, nic1.pcie_switch) == (1, "pci0000:97", "")
    assert nic1.port_states == ("ACTIVE", "DOWN")
    assert port_health(nic1.port_states) == (False, "port 2 DOWN")
    assert port_health(nic0.port_states) == (True, "")


def test_a_broken_entry_is_skipped_with_a_named_error(tmp_path: Path) -> None:
    tree = _node(tmp_path)
    bad = tree.add_pci(["0000:b7:01.0", "0000:bd:00.0"], root_complex="pci0000:b7")
    tree.add_ib("mlx5_2", bad, ports=["garbage"], uverbs=2)
    no_verbs = tree.add_pci(["0000:c7:01.0", "0000:cd:00.0"], root_complex="pci0000:c7")
    tree.add_ib("mlx5_3", no_verbs, uverbs=None)
    found = SysfsRdma(Sysfs(tmp_path), link_source_factory=None).discover()
    assert [n.ibdev for n in found.nics] == ["mlx5_0", "mlx5_1"]
    fields = {(e.field, Path(e.source).name) for e in found.errors}
    assert ("state", "state") in fields
    assert ("uverbs", "infiniband_verbs") in fields
    state_error = next(e for e in found.errors if e.field == "state")
    assert "mlx5_2/ports/1/state" in state_error.source
    assert "'garbage'" in str(state_error)


def test_device_link_missing(tmp_path: Path) -> None:
    (tmp_path / "class" / "infiniband" / "mlx5_7").mkdir(parents=True)
    found = SysfsRdma(Sysfs(tmp_path), link_source_factory=None).discover()
    assert found.nics == []
    assert found.errors[0].field == "device"


def test_no_infiniband_class_means_no_nics_and_no_netlink(tmp_path: Path) -> None:
    def boom() -> Any:
        raise AssertionError("netlink must not be opened without NICs")

    found = SysfsRdma(Sysfs(tmp_path), link_source_factory=boom).discover()
    assert (found.nics, found.errors) == ([], [])


class _Links:
    def __init__(self, infos: list[LinkInfo]) -> None:
        self.infos = infos

    def links(self) -> list[LinkInfo]:
        return self.infos


def test_netlink_fills_the_netdev_sysfs_lacks(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    pf = tree.add_pci(["0000:97:01.0", "0000:8c:00.0"], root_complex="pci0000:97")
    tree.add_ib("mlx5_1", pf, uverbs=1, netdevs=[])
    links = _Links(
        [
            LinkInfo("eth9", "UP", "0000:8c:00.0", (VfLink(0, "aa:bb:cc:dd:ee:ff", "auto"),)),
            LinkInfo("lo", "UNKNOWN"),
        ]
    )
    found = SysfsRdma(Sysfs(tmp_path), links=links).discover()
    assert found.nics[0].netdev == "eth9"
    assert found.links["eth9"].vfs[0].mac == "aa:bb:cc:dd:ee:ff"


def test_port_states_are_reread(tmp_path: Path) -> None:
    _node(tmp_path)
    rdma = SysfsRdma(Sysfs(tmp_path), link_source_factory=None)
    state = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "state"
    state.write_text("1: DOWN\n")
    assert rdma.port_states("mlx5_0") == ("DOWN",)
    assert parse_port_state("4: ACTIVE") == "ACTIVE"
    assert parse_port_state("ACTIVE") is None


class _Msg:
    def __init__(self, attrs: dict[str, Any]) -> None:
        self.attrs = attrs

    def get_attr(self, name: str) -> Any:
        return self.attrs.get(name)

    def get_attrs(self, name: str) -> list[Any]:
        value = self.attrs.get(name)
        return value if isinstance(value, list) else []


def test_link_info_from_a_pyroute2_shaped_message() -> None:
    vf_info = _Msg(
        {
            "IFLA_VF_MAC": {"vf": 3, "mac": "02:00:00:00:00:03"},
            "IFLA_VF_LINK_STATE": {"vf": 3, "link_state": 1},
        }
    )
    msg = _Msg(
        {
            "IFLA_IFNAME": "ens1f0",
            "IFLA_OPERSTATE": "UP",
            "IFLA_PARENT_DEV_NAME": "0000:1E:00.0",
            "IFLA_PARENT_DEV_BUS_NAME": "pci",
            "IFLA_VFINFO_LIST": _Msg({"IFLA_VF_INFO": [vf_info]}),
        }
    )
    info = link_info_from_message(msg)
    assert info == LinkInfo(
        "ens1f0", "UP", "0000:1e:00.0", (VfLink(3, "02:00:00:00:00:03", "enable"),)
    )
    assert link_info_from_message(_Msg({})) is None
    virtio = link_info_from_message(
        _Msg(
            {
                "IFLA_IFNAME": "eth0",
                "IFLA_PARENT_DEV_NAME": "virtio2",
                "IFLA_PARENT_DEV_BUS_NAME": "virtio",
            }
        )
    )
    assert virtio is not None and virtio.parent_bus_id == ""


def test_real_netlink_dump_sees_loopback() -> None:
    from deviceplugin.rdma import Pyroute2Links

    try:
        links = Pyroute2Links().links()
    except OSError as exc:  # no netlink in this sandbox
        pytest.skip(f"netlink unavailable: {exc}")
    names = {link.ifname for link in links}
    assert "lo" in names
    assert all(isinstance(link, LinkInfo) for link in links)
