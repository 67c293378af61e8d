from __future__ import annotations

from pathlib import Path

import pytest

from deviceplugin.sysfs import (
    PORT_TYPE_DOWNSTREAM,
    PORT_TYPE_ROOT,
    PORT_TYPE_UPSTREAM,
    Sysfs,
    pcie_port_type,
)
from tessera.errors import InventoryError
from tests.deviceplugin.sysfs_tree import SysfsTree, pcie_config

H100_CHAIN = ["0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:18:00.0"]


def test_port_type_is_read_from_the_pcie_capability() -> None:
    assert pcie_port_type(pcie_config(PORT_TYPE_UPSTREAM)) == PORT_TYPE_UPSTREAM
    assert pcie_port_type(pcie_config(PORT_TYPE_ROOT)) == PORT_TYPE_ROOT
    assert pcie_port_type(pcie_config(PORT_TYPE_UPSTREAM)[:64]) is None  # unprivileged read
    no_caps = bytearray(pcie_config(PORT_TYPE_UPSTREAM))
    no_caps[0x06] = 0
    assert pcie_port_type(bytes(no_caps)) is None
    looping = bytearray(pcie_config(PORT_TYPE_UPSTREAM))
    looping[0x50], looping[0x51] = 0x05, 0x40  # MSI pointing back at PM: a loop
    assert pcie_port_type(bytes(looping)) is None


def test_switch_found_from_port_types(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    tree.add_pci(
        H100_CHAIN,
        numa=1,
        port_types={
            "0000:15:01.0": PORT_TYPE_ROOT,
            "0000:16:00.0": PORT_TYPE_UPSTREAM,
            "0000:17:00.0": PORT_TYPE_DOWNSTREAM,
        },
    )
    loc = Sysfs(tmp_path).pci_location("00000000:18:00.0")
    assert (loc.pci_bus_id, loc.numa_node, loc.pcie_root, loc.pcie_switch) == (
        "0000:18:00.0",
        1,
        "pci0000:15",
        "0000:16:00.0",
    )


def test_two_switch_levels_give_the_nearest(tmp_path: Path) -> None:
    chain = [
        "0000:15:01.0",
        "0000:16:00.0",
        "0000:17:00.0",
        "0000:18:00.0",
        "0000:19:00.0",
        "0000:1a:00.0",
    ]
    types = dict(
        zip(
            chain[:-1],
            [
                PORT_TYPE_ROOT,
                PORT_TYPE_UPSTREAM,
                PORT_TYPE_DOWNSTREAM,
                PORT_TYPE_UPSTREAM,
                PORT_TYPE_DOWNSTREAM,
            ],
            strict=True,
        )
    )
    SysfsTree(tmp_path).add_pci(chain, port_types=types)
    assert Sysfs(tmp_path).pci_location("0000:1a:00.0").pcie_switch == "0000:18:00.0"
    # without readable config space the path's shape gives the same answer
    other = tmp_path / "b"
    SysfsTree(other).add_pci(chain)
    assert Sysfs(other).pci_location("0000:1a:00.0").pcie_switch == "0000:18:00.0"


def test_shape_fallback_and_no_switch(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    tree.add_pci(H100_CHAIN)
    tree.add_pci(["0000:3a:00.0", "0000:3b:00.0"], root_complex="pci0000:3a", numa="-1")
    sysfs = Sysfs(tmp_path)
    assert sysfs.pci_location("0000:18:00.0").pcie_switch == "0000:16:00.0"
    t4 = sysfs.pci_location("0000:3b:00.0")
    assert (t4.pcie_root, t4.pcie_switch, t4.numa_node) == ("pci0000:3a", "", -1)


def test_missing_numa_file_means_no_numa(tmp_path: Path) -> None:
    SysfsTree(tmp_path).add_pci(
        ["0000:00:01.0", "0000:01:00.0"], root_complex="pci0000:00", numa=None
    )
    assert Sysfs(tmp_path).pci_location("0000:01:00.0").numa_node == -1


def test_malformed_numa_node_names_the_file_and_field(tmp_path: Path) -> None:
    SysfsTree(tmp_path).add_pci(H100_CHAIN, numa="zero")
    with pytest.raises(InventoryError) as err:
        Sysfs(tmp_path).pci_location("0000:18:00.0")
    assert err.value.field == "numa_node"
    assert err.value.source.endswith("0000:18:00.0/numa_node")
    assert "'zero'" in str(err.value)


def test_unknown_device_and_bad_bus_id(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as err:
        Sysfs(tmp_path).pci_location("0000:99:00.0")
    assert err.value.field == "pciBusId" and "0000:99:00.0" in err.value.source
    with pytest.raises(InventoryError, match="not a PCI bus ID"):
        Sysfs(tmp_path).pci_location("garbage")
