"""The openb trace loader and the conversion of trace rows into core objects."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera import resources as rn
from tessera_sim.trace import (
    GPU_MEMORY_MIB,
    TraceError,
    TraceNode,
    TracePod,
    load_nodes,
    load_pods,
)

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn-1,96000,393216,8,G2\nn-0,64000,262144,2,P100\n"
PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n"
    "p-0,12000,16384,1,1000,,LS\n"
    "p-1,6000,12288,1,460,V100M16|V100M32,LS\n"
    "p-2,88000,262144,8,1000,,BE\n"
    "p-3,32000,65536,0,0,,BE\n"
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_loads_nodes_and_pods(tmp_path: Path) -> None:
    nodes = load_nodes(write(tmp_path, "n.csv", NODES))
    assert [n.name for n in nodes] == ["n-1", "n-0"]
    assert nodes[0] == TraceNode("n-1", 96000, 393216, 8, "G2")
    pods = load_pods(write(tmp_path, "p.csv", PODS))
    assert [p.name for p in pods] == ["p-0", "p-1", "p-2", "p-3"]
    assert pods[1].gpu_spec == ("V100M16", "V100M32")
    assert pods[1].is_share and not pods[0].is_share
    assert [p.gpu_milli_total for p in pods] == [1000, 460, 8000, 0]


def test_pod_list_without_optional_columns(tmp_path: Path) -> None:
    text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np-0,4000,1024,2,1000\n"
    (pod,) = load_pods(write(tmp_path, "p.csv", text))
    assert pod.gpu_spec == () and pod.num_gpu == 2


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        ("name,cpu_milli,memory_mib,num_gpu\np,1,1,0\n", 1, "gpu_milli", "missing column"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,x,1,0,0\n", 2, "cpu_milli", "not a"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1.5,1,0,0\n", 2, "cpu_milli", "whole"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,-1,0\n", 2, "num_gpu", ">= 0"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,0\n", 2, "gpu_milli", "1..1000"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,455\n", 2, "gpu_milli", "10"),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,0,0\np,1,1,0,0\n",
            3,
            "name",
            "duplicate",
        ),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,0\n", 2, None, "fields"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", 1, None, "no pods"),
        ("", 1, None, "empty file"),
    ],
)
def test_pod_errors_name_file_line_and_column(
    tmp_path: Path, text: str, line: int, column: str | None, words: str
) -> None:
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(TraceError) as info:
        load_pods(path)
    err = info.value
    assert err.path == str(path) and err.line == line and err.column == column
    assert words in str(err) and str(path) in str(err)
    if column:
        assert repr(column) in str(err)


def test_node_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,2,\n")
    with pytest.raises(TraceError, match="needs a model") as info:
        load_nodes(path)
    assert info.value.line == 2 and info.value.column == "model"
    with pytest.raises(TraceError, match="cannot open"):
        load_nodes(tmp_path / "missing.csv")


def test_node_inventory_uses_model_memory() -> None:
    inv = TraceNode("n", 1000, 1000, 4, "V100M32").inventory()
    assert inv.node_name == "n" and len(inv.gpus) == 4
    assert {g.model for g in inv.gpus} == {"V100M32"}
    assert {g.memory_mib for g in inv.gpus} == {GPU_MEMORY_MIB["V100M32"]}
    assert len({g.uuid for g in inv.gpus}) == 4 and len({g.pci_bus_id for g in inv.gpus}) == 4


def test_share_pod_becomes_a_percent_share() -> None:
    req = TracePod("p", 6000, 12288, 1, 460).request("uid-1")
    (c,) = req.containers
    assert (c.gpu_count, c.core, c.memory_ratio) == (0, 46, 46)
    assert (req.cpu_milli, req.memory_mib, req.uid, req.name) == (6000, 12288, "uid-1", "p")


def test_whole_and_cpu_pods() -> None:
    (c,) = TracePod("p", 88000, 1024, 8, 1000).request("u").containers
    assert c.gpu_count == 8 and c.core == 0
    (c,) = TracePod("p", 1000, 1024, 1, 1000).request("u").containers
    assert c.gpu_count == 1
    assert TracePod("p", 32000, 1024, 0, 0).request("u").containers == ()


def test_gpu_spec_is_a_model_allow_list() -> None:
    pod = TracePod("p", 1, 1, 1, 1000, ("V100M16", "V100M32"))
    assert pod.pod_dict("u")["metadata"]["annotations"] == {
        rn.GPU_MODEL_ANNOTATION: "V100M16,V100M32"
    }
    assert pod.request("u").hints.models == frozenset({"V100M16", "V100M32"})


def test_absolute_memory_mode_asks_memory_units() -> None:
    (c,) = TracePod("p", 1, 1, 1, 500).request("u", "absolute", 20000).containers
    assert c.core == 50 and c.memory_ratio == 0
    assert c.memory_units == 10  # 50% of 20000 MiB, rounded up to whole GiB
