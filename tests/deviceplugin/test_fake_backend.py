from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.backend import BackendError, XidEvent
from deviceplugin.backend_choice import open_backend
from deviceplugin.fake_backend import FakeBackend, load_topology_lenient
from tessera.errors import InventoryError
from tessera.topology import Tier, TierMatrix
from tessera_edge.topology_file import builtin_topology_text


def test_h100_example_topology() -> None:
    inv, errors = load_topology_lenient("h100-sxm-8x", "n")
    assert errors == []
    assert len(inv.gpus) == 8 and {g.model for g in inv.gpus} == {"NVIDIA H100 80GB HBM3"}
    matrix = TierMatrix(inv.gpus)
    assert all(matrix.tier[a][b] == Tier.NVLINK for a in range(8) for b in range(8) if a != b)
    assert len(inv.nics) == 4 and all(len(n.vfs) == 8 for n in inv.nics)
    roots = [n.pcie_root for n in inv.nics]
    assert len(set(roots)) == 4  # one NIC per PCIe root
    assert set(roots) == {g.pcie_root for g in inv.gpus}


def test_a100_and_t4_example_topologies() -> None:
    a100, _ = load_topology_lenient("a100-pcie-8x")
    assert len(a100.gpus) == 8 and all(g.nvlinks == () for g in a100.gpus)
    assert len({g.pcie_switch for g in a100.gpus}) == 4
    assert {g.numa_node for g in a100.gpus} == {0, 1}
    t4, _ = load_topology_lenient("t4-4x")
    assert len(t4.gpus) == 4 and t4.nics == ()


def _write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _h100_doc() -> dict[str, Any]:
    from importlib import resources

    text = (resources.files("tessera_edge") / "topologies" / "h100-sxm-8x.yaml").read_text()
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


def test_a_malformed_gpu_is_dropped_and_named(tmp_path: Path) -> None:
    doc = _h100_doc()
    doc["gpus"][2]["memoryMiB"] = "lots"
    path = _write(tmp_path, doc)
    inv, errors = load_topology_lenient(str(path))
    assert [g.index for g in inv.gpus] == [0, 1, 3, 4, 5, 6, 7]
    (error,) = errors
    assert (error.source, error.field) == (str(path), "gpus[2].memoryMiB")
    assert "'lots'" in str(error)
    # the others' links to the dropped GPU went with it; the rest are intact
    for gpu in inv.gpus:
        assert len(gpu.nvlinks) == 6
    assert len(inv.nics) == 4


def test_malformed_nic_and_duplicate_gpu(tmp_path: Path) -> None:
    doc = _h100_doc()
    doc["rdma"][1]["vfs"][3]["pciBusId"] = "not-a-bus"
    doc["gpus"][5]["uuid"] = doc["gpus"][4]["uuid"]
    inv, errors = load_topology_lenient(str(_write(tmp_path, doc)))
    assert [n.ibdev for n in inv.nics] == ["mlx5_0", "mlx5_2", "mlx5_3"]
    assert {e.field for e in errors} == {"rdma[1].vfs[3].pciBusId", "gpus[5].uuid"}
    assert len(inv.gpus) == 7


def test_file_level_problems_fail(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("gpus:\n  - index: 0\n   uuid: x\n")
    with pytest.raises(InventoryError) as err:
        load_topology_lenient(str(bad_yaml))
    assert err.value.source == str(bad_yaml) and err.value.field.startswith("line ")
    with pytest.raises(InventoryError, match="cannot read topology file"):
        load_topology_lenient(str(tmp_path / "missing.yaml"))
    unit = _write(tmp_path, {"memoryUnitMiB": 0, "gpus": []})
    with pytest.raises(InventoryError) as err:
        load_topology_lenient(str(unit))
    assert err.value.field == "$.memoryUnitMiB"
    with pytest.raises(BackendError, match=r"missing\.yaml"):
        FakeBackend.from_topology(str(tmp_path / "missing.yaml"))


def test_open_backend_choices() -> None:
    assert open_backend("fake", "t4-4x", "/sys").name == "fake"
    with pytest.raises(BackendError, match="needs --topology"):
        open_backend("fake", None, "/sys")
    # this machine has no NVML library: auto falls back to the topology, or says why not
    assert open_backend("auto", "t4-4x", "/sys").name in ("fake", "nvml")
    try:
        backend = open_backend("auto", None, "/sys")
    except BackendError as exc:
        assert "no --topology" in str(exc)
    else:
        assert backend.name == "nvml"


def test_controls() -> None:
    backend = FakeBackend.from_topology("t4-4x")
    uuid = backend.gpu(1).uuid
    assert backend.wait_events(0.01) == []
    backend.inject_xid(uuid, 79)
    assert backend.wait_events(1) == [XidEvent(uuid, 79, "injected XID 79")]
    backend.set_answers(uuid, False, "GPU is lost")
    assert backend.query(uuid) == "GPU is lost"
    backend.set_answers(uuid, True)
    assert backend.query(uuid) is None
    h100 = FakeBackend.from_topology("h100-sxm-8x")
    h100.set_port_states("mlx5_2", ("DOWN",))
    assert h100.port_states("mlx5_2") == ("DOWN",)
    with pytest.raises(InventoryError):
        h100.port_states("mlx5_99")


def test_a_gpu_the_file_marks_unhealthy_reports_its_failure_once(tmp_path: Path) -> None:
    doc = yaml.safe_load(builtin_topology_text("t4-4x"))
    doc["gpus"][0]["healthy"] = False
    path = tmp_path / "t4.yaml"
    path.write_text(yaml.safe_dump(doc))
    backend = FakeBackend.from_topology(str(path))
    first = backend.gpu(0)
    failed = XidEvent(first.uuid, 79, "marked unhealthy in the topology")
    assert backend.wait_events(0.01) == [failed]
    assert backend.wait_events(0.01) == []
