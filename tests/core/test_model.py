from dataclasses import replace
from pathlib import Path

import pytest

from tessera.errors import InventoryError
from tessera.model import (
    NodeInventory,
    PciDevice,
    model_matches,
    models_allow,
    normalize_bus_id,
)
from tessera_edge.topology_file import BUILTIN_TOPOLOGIES, load_topology, parse_topology_text

from .builders import gpu_entry


@pytest.mark.parametrize("name", BUILTIN_TOPOLOGIES)
def test_builtin_topologies_load_and_round_trip(name: str) -> None:
    inv = load_topology(name, "node-1")
    assert inv.node_name == "node-1" and inv.gpus
    assert NodeInventory.from_dict(inv.to_dict()) == inv


def test_h100_topology_matches_its_description() -> None:
    inv = load_topology("h100-sxm-8x")
    assert len(inv.gpus) == 8 and len(inv.nics) == 4
    assert all(len(g.nvlinks) == 7 for g in inv.gpus)
    assert {g.numa_node for g in inv.gpus} == {0, 1}
    assert len({n.pcie_root for n in inv.nics}) == 4
    assert all(len(n.vfs) == 8 for n in inv.nics)


def test_a100_topology_has_four_switches_on_two_numa_nodes() -> None:
    inv = load_topology("a100-pcie-8x")
    assert len({g.pcie_switch for g in inv.gpus}) == 4
    assert {g.numa_node for g in inv.gpus} == {0, 1}
    assert not any(g.nvlinks for g in inv.gpus)


def test_bus_ids_are_normalized() -> None:
    assert normalize_bus_id("00000000:1A:00.0") == "0000:1a:00.0"
    with pytest.raises(ValueError):
        normalize_bus_id("1a:00.0")


@pytest.mark.parametrize(
    ("fields", "where", "needle"),
    [
        ({"memoryMiB": "16G"}, "gpus[0].memoryMiB", "expected an integer"),
        ({"memoryMiB": 0}, "gpus[0].memoryMiB", "must be >= 1"),
        ({"pciBusId": "3b:00.0"}, "gpus[0].pciBusId", "not a PCI bus ID"),
        ({"uuid": None}, "gpus[0].uuid", "required field is missing"),
        ({"nvlinks": {"5": 4}}, "gpus[0].nvlinks", "peer index 5"),
        ({"nvlinks": {"GPU-zzz": 2}}, "gpus[0].nvlinks", "not a GPU of this node"),
        ({"healthy": "yes"}, "gpus[0].healthy", "true or false"),
    ],
)
def test_inventory_errors_name_source_and_field(
    fields: dict[str, object], where: str, needle: str
) -> None:
    with pytest.raises(InventoryError) as info:
        NodeInventory.from_dict({"gpus": [gpu_entry(**fields)]}, source="topo.yaml")
    assert info.value.source == "topo.yaml"
    assert info.value.field == where
    assert needle in info.value.problem
    assert str(info.value).startswith("topo.yaml: " + where)


def test_duplicate_devices_are_refused() -> None:
    doc = {"gpus": [gpu_entry(), gpu_entry(pciBusId="0000:3c:00.0")]}
    with pytest.raises(InventoryError, match=r"gpus\[1\].uuid: duplicate"):
        NodeInventory.from_dict(doc)


def test_nvlink_peers_by_index_or_uuid_are_kept_as_indexes() -> None:
    doc = {
        "gpus": [
            {
                "uuid": "GPU-a",
                "model": "H",
                "memoryMiB": 1,
                "pciBusId": "0000:01:00.0",
                "nvlinks": {1: 4},
            },
            {
                "uuid": "GPU-b",
                "model": "H",
                "memoryMiB": 1,
                "pciBusId": "0000:02:00.0",
                "nvlinks": [{"peer": "GPU-a", "links": 4}],
            },
        ]
    }
    inv = NodeInventory.from_dict(doc)
    assert inv.gpus[0].nvlinks == ((1, 4),)
    assert inv.gpus[1].nvlink_count(0) == 4
    # the dict form names peers by UUID, and reads back to the same inventory
    written = inv.to_dict()
    assert [g["nvlinks"] for g in written["gpus"]] == [
        [{"peer": "GPU-b", "links": 4}],
        [{"peer": "GPU-a", "links": 4}],
    ]
    assert NodeInventory.from_dict(written) == inv


def test_topology_text_errors(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="not valid YAML"):
        parse_topology_text("gpus: [", "bad.yaml")
    with pytest.raises(InventoryError, match="empty"):
        parse_topology_text("", "empty.yaml")
    with pytest.raises(InventoryError, match="cannot read"):
        load_topology(str(tmp_path / "missing.yaml"))
    with pytest.raises(InventoryError, match=r"\$: expected a mapping"):
        parse_topology_text("- 1\n- 2\n", "list.yaml")


def test_health_changes_make_new_inventories() -> None:
    inv = load_topology("t4-4x", "n")
    sick = inv.with_gpu_health(inv.gpus[1].uuid, False, "XID 79")
    assert inv.gpus[1].healthy and not sick.gpus[1].healthy
    assert sick.gpus[1].health_reason == "XID 79"
    assert sick.gpu_slot(inv.gpus[2].uuid) == 2


@pytest.mark.parametrize(
    ("wanted", "expected"),
    [("NVIDIA H100 80GB HBM3", True), ("h100", True), ("H10", False), ("HBM3", True), ("", False)],
)
def test_model_matching(wanted: str, expected: bool) -> None:
    assert model_matches("NVIDIA H100 80GB HBM3", wanted) is expected


@pytest.mark.parametrize(
    ("models", "expected"),
    [
        ((), True),
        (("h100",), True),
        (("A100", "H100"), True),
        (("A100",), False),
        (("H10",), False),
    ],
)
def test_a_pods_model_hints_allow_a_gpu_when_one_matches_or_there_are_none(
    models: tuple[str, ...], expected: bool
) -> None:
    assert models_allow(models, "NVIDIA H100 80GB HBM3") is expected


def test_from_dict_shares_every_string_it_keeps() -> None:
    pool: dict[str, str] = {}

    def share(text: str) -> str:
        return pool.setdefault(text, text)

    doc = load_topology("h100-sxm-8x").to_dict()
    a = NodeInventory.from_dict(doc, node_name="n1", share=share)
    b = NodeInventory.from_dict(doc, node_name="n2", share=share)
    assert a == NodeInventory.from_dict(doc, node_name="n1")
    assert a.gpus[0].model is b.gpus[0].model and a.gpus[3].uuid is b.gpus[3].uuid
    assert a.gpus[0].pci_bus_id is b.gpus[0].pci_bus_id
    assert a.nics[0].ibdev is b.nics[0].ibdev
    assert "n1" in pool and a.gpus[0].model in pool


def test_a_link_to_a_gpu_the_inventory_lacks_is_written_by_index_and_refused() -> None:
    inv = NodeInventory.from_dict({"gpus": [gpu_entry()]})
    gpu = replace(inv.gpus[0], nvlinks=((5, 2),))  # built in code, not parsed
    written = replace(inv, gpus=(gpu,)).to_dict()
    assert written["gpus"][0]["nvlinks"] == [{"peer": 5, "links": 2}]
    with pytest.raises(InventoryError, match="peer index 5 is not a GPU of this node"):
        NodeInventory.from_dict(written)


def test_a_device_placed_where_sysfs_says_keeps_everything_else() -> None:
    inv = load_topology("h100-sxm-8x")
    gpu, nic = inv.gpus[3], inv.nics[1]
    where = PciDevice(
        pci_bus_id="ffff:ff:00.0", numa_node=7, pcie_root="pci0009:00", pcie_switch="0009:01:00.0"
    )
    for device in (gpu, nic):
        moved = device.placed(where)
        assert type(moved) is type(device)
        assert (moved.numa_node, moved.pcie_root, moved.pcie_switch) == (
            7,
            "pci0009:00",
            "0009:01:00.0",
        )
        assert moved.pci_bus_id == device.pci_bus_id  # its own address, not the reading's
        assert (
            replace(
                moved,
                numa_node=device.numa_node,
                pcie_root=device.pcie_root,
                pcie_switch=device.pcie_switch,
            )
            == device
        )
    assert gpu.placed(PciDevice(pci_bus_id=gpu.pci_bus_id)).numa_node == -1  # nothing known
