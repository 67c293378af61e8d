"""Hostile input to the core: every bad record, quantity or inventory gets its typed error.

Each test here was first written against a reported failure (an uncaught RecursionError,
TypeError, OverflowError or a huge integer built from a tiny string).
"""

import json
import math

import pytest

from tessera import record
from tessera import resources as rn
from tessera.cluster_index import ClusterIndex
from tessera.cluster_state import ClusterState
from tessera.errors import InventoryError, RecordError, RequestError
from tessera.model import NodeInventory
from tessera.quantity import QuantityError, parse_quantity
from tessera.request import parse_pod

from .builders import gpu_entry, pod
from .test_record import GOLDEN_UNSIGNED, KEY

# --- allocation records --------------------------------------------------------------------


@pytest.mark.parametrize("text", ["[" * 1000, '{"a":' * 1000, "[" * 100_000])
def test_deep_nesting_is_a_record_error(text: str) -> None:
    with pytest.raises(RecordError, match="record"):
        record.decode(text, KEY)


def test_non_ascii_proof_is_a_record_error() -> None:
    doc = json.loads(record.encode(record.decode(GOLDEN_UNSIGNED), KEY))
    for field in list(doc["integrity"]):
        if field not in ("alg", "keyId"):
            doc["integrity"][field] = "\u00e9\u00e9\u00e9"
    with pytest.raises(RecordError):
        record.decode(json.dumps(doc), KEY)


@pytest.mark.parametrize(
    "block",
    [None, [], "x", 1, {}, {"alg": 1, "keyId": [], "sig": {}}, {"keyId": {"a": 1}}],
)
def test_any_integrity_block_is_a_record_error(block: object) -> None:
    doc = json.loads(GOLDEN_UNSIGNED)
    doc["integrity"] = block
    with pytest.raises(RecordError):
        record.decode(json.dumps(doc), KEY)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("containers", 0, "gpus", 0, "memoryMiB"), 2**64),
        (("containers", 0, "gpus", 0, "index"), 2**40),
        (("containers", 0, "gpus", 0, "minor"), 2**40),
        (("cpuMilli",), 2**63),
        (("memoryMiB",), 2**63),
        (("containers", 0, "rdma", 0, "uverbsMinor"), 2**40),
        (("containers", 0, "name"), "x" * 5000),
    ],
)
def test_record_numbers_and_strings_are_bounded(
    path: tuple[str | int, ...], value: int | str
) -> None:
    doc = json.loads(GOLDEN_UNSIGNED)
    target = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    with pytest.raises(RecordError, match="record"):
        record.decode(json.dumps(doc))


def test_huge_numbers_in_records_are_refused_without_building_them() -> None:
    text = GOLDEN_UNSIGNED.replace('"cpuMilli":4000', '"cpuMilli":' + "9" * 5000)
    with pytest.raises(RecordError):
        record.decode(text)


# --- quantities ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["1e999999", "1e-999999", "9" * 100_000, "1" + "0" * 200 + "Gi", "1e40", math.inf, math.nan],
)
def test_absurd_quantities_are_refused(value: str | float) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)


def test_quantity_error_is_a_value_error_for_existing_callers() -> None:
    assert issubclass(QuantityError, ValueError)


@pytest.mark.parametrize(
    ("resource", "value"),
    [
        (rn.GPU_MEMORY, "1e999999"),
        (rn.GPU_MEMORY, "1e18"),
        (rn.GPU, "1e999999"),
        ("cpu", "1e999999"),
        ("memory", "9" * 100_000),
    ],
)
def test_absurd_quantities_in_pods_name_container_and_resource(resource: str, value: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_pod(pod(containers={"main": {resource: value}}))
    assert info.value.container == "main"
    assert info.value.resource == resource


def test_huge_overhead_is_a_request_error() -> None:
    p = pod(containers={"main": {rn.GPU: "1"}})
    p["spec"]["overhead"] = {"cpu": "1e999999"}
    with pytest.raises(RequestError):
        parse_pod(p)


# --- node inventories (NodeDevices specs written by node agents) ----------------------------


def _nic(**fields: object) -> dict[str, object]:
    n: dict[str, object] = {"ibdev": "mlx5_0", "pciBusId": "0000:0c:00.0", "uverbsMinor": 0}
    n.update(fields)
    return n


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ({"gpus": [gpu_entry(memoryMiB=2**63 + 1)]}, "gpus[0].memoryMiB"),
        ({"gpus": [gpu_entry(memoryMiB=2**40)]}, "gpus[0].memoryMiB"),
        ({"gpus": [gpu_entry(index=2**40)]}, "gpus[0].index"),
        ({"gpus": [gpu_entry(minor=2**40)]}, "gpus[0].minor"),
        ({"gpus": [gpu_entry(numaNode=2**40)]}, "gpus[0].numaNode"),
        ({"memoryUnitMiB": 2**63}, "$.memoryUnitMiB"),
        ({"gpus": [gpu_entry(uuid="G" * 100_000)]}, "gpus[0].uuid"),
        ({"gpus": [gpu_entry(model="m" * 100_000)]}, "gpus[0].model"),
        ({"nodeName": "n" * 100_000}, "$.nodeName"),
        ({"gpus": [gpu_entry(uuid=f"GPU-{i}", index=i) for i in range(5000)]}, "gpus"),
        ({"rdma": [_nic(uverbsMinor=2**40)]}, "rdma[0].uverbsMinor"),
        ({"rdma": [_nic(portStates=["ACTIVE"] * 10_000)]}, "rdma[0].portStates"),
        ({"rdma": [_nic(portStates=["A" * 10_000])]}, "rdma[0].portStates[0]"),
        ({"rdma": [_nic(vfs=[{}] * 100_000)]}, "rdma[0].vfs"),
        ({"gpus": [gpu_entry(nvlinks={"x": 2**70})]}, "gpus[0].nvlinks.x"),
    ],
)
def test_inventory_numbers_lists_and_strings_are_bounded(
    doc: dict[str, object], where: str
) -> None:
    with pytest.raises(InventoryError) as info:
        NodeInventory.from_dict(doc, source="nodedevices/n1")
    assert info.value.field == where


def test_a_parsed_inventory_always_fits_the_index() -> None:
    """The reported crash: memoryMiB above 2^63 reached numpy as an OverflowError."""
    inv = NodeInventory.from_dict({"gpus": [gpu_entry()]}, node_name="n1")
    state = ClusterState()
    state.set_node(inv)
    ClusterIndex(state)  # the largest accepted values must fit int64 columns
    big = {"gpus": [gpu_entry(memoryMiB=2**63 + 1)]}
    with pytest.raises(InventoryError):
        NodeInventory.from_dict(big, node_name="n1")
