"""The NodeDevices CRD agrees with what the code writes: every printer column reads a field
the node agent (spec) or the scheduler's status writer (status) fills, and those fields
pass the CRD's schema types."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from deviceplugin.inventory import cr_spec
from scheduler_plugin.state.cache import Cache
from scheduler_plugin.state.values import Holds, PodSeen
from scheduler_plugin.views.status_writer import StatusWriter
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.isolation import LAYERS, MAX_LAYER_REASON_CHARS, MAX_VERSION_CHARS, NodeIsolation
from tessera.model import NodeInventory
from tessera_testbed.inventory import inventory_spec

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "deploy" / "crds" / "nodedevices.yaml"
SERVER_WRITTEN = (".metadata.",)
"""Printer columns the API server fills itself."""


class _Recorder:
    """A client that keeps the status patches it is given."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def merge_patch(
        self, path: str, patch: dict[str, Any], *, answer: bool = True
    ) -> dict[str, Any]:
        self.patches.append(patch)
        return {}


def _version() -> dict[str, Any]:
    doc = yaml.safe_load(CRD.read_text())
    (version,) = doc["spec"]["versions"]
    return dict(version)


def _written_object() -> dict[str, Any]:
    """A NodeDevices as the agent and the scheduler write it, one pod holding a share."""
    spec = inventory_spec("gpu-1", gpus=2, nics=1)
    spec["isolation"] = NodeIsolation("hami-core", True, "8f3a89c+tessera.1", "8f3a" * 10).to_dict()
    inventory = NodeInventory.from_dict(spec, source="test")
    cache = Cache("binpack")
    cache.nodes.upsert("gpu-1", spec)
    grant = GpuGrant(spec["gpus"][0]["uuid"], 0, spec["gpus"][0]["minor"], 30, 8192)
    alloc = PodAllocation("u1", "default", "x", "gpu-1", (ContainerAllocation("main", (grant,)),))
    cache.pods.observed(PodSeen("u1", "default", "x", "gpu-1"), Holds(alloc))
    client = _Recorder()
    writer = StatusWriter(cache, client)  # type: ignore[arg-type]
    writer.mark_all()
    assert writer.flush() == 1 and len(client.patches) == 1
    return {"spec": cr_spec(inventory), "status": client.patches[0]["status"]}


def _lookup(obj: Any, json_path: str) -> Any:
    for key in json_path.lstrip(".").split("."):
        assert isinstance(obj, dict) and key in obj, json_path
        obj = obj[key]
    return obj


_TYPES: dict[str, type | tuple[type, ...]] = {
    "integer": int,
    "string": str,
    "number": (int, float),
    "boolean": bool,
}


def _schema_at(schema: dict[str, Any], json_path: str) -> dict[str, Any]:
    for key in json_path.lstrip(".").split("."):
        schema = schema["properties"][key]
    return schema


def test_every_printer_column_reads_a_field_the_code_writes_with_its_type() -> None:
    version = _version()
    obj = _written_object()
    schema = version["schema"]["openAPIV3Schema"]
    columns = list(version["additionalPrinterColumns"])
    assert [c["name"] for c in columns][:3] == ["GPUs", "Healthy", "Model"]
    assert {c["jsonPath"] for c in columns} >= {
        ".status.allocation.summary.coreAllocated",
        ".status.allocation.summary.memoryFree",
    }
    for column in columns:
        path = column["jsonPath"]
        if path.startswith(SERVER_WRITTEN):
            continue
        value = _lookup(obj, path)
        assert isinstance(value, _TYPES[column["type"]]), (path, value)
        assert _schema_at(schema, path)["type"] == column["type"], path
    summary = obj["status"]["allocation"]["summary"]
    assert summary == {
        "coreAllocated": 30,
        "coreFree": 170,
        "memoryAllocated": "8Gi",
        "memoryFree": "152Gi",
    }


def test_the_status_summary_schema_names_exactly_what_the_writer_writes() -> None:
    schema = _version()["schema"]["openAPIV3Schema"]
    declared = _schema_at(schema, ".status.allocation.summary")["properties"]
    written = _written_object()["status"]["allocation"]["summary"]
    assert set(declared) == set(written)
    for key, value in written.items():
        assert isinstance(value, _TYPES[declared[key]["type"]]), key


def test_the_isolation_schema_has_the_cores_bounds() -> None:
    """The API server refuses what the core would refuse for length and kind, so a broken
    agent's write fails at the server rather than fencing its node later."""
    schema = _version()["schema"]["openAPIV3Schema"]
    declared = _schema_at(schema, ".spec.isolation")
    assert declared["required"] == ["layer", "up"]
    fields = declared["properties"]
    assert tuple(sorted(fields["layer"]["enum"])) == tuple(sorted(LAYERS))
    assert fields["up"]["type"] == "boolean"
    assert fields["version"]["maxLength"] == fields["commit"]["maxLength"] == MAX_VERSION_CHARS
    assert fields["reason"]["maxLength"] == MAX_LAYER_REASON_CHARS
    written = _written_object()["spec"]["isolation"]
    assert set(written) == set(fields)
