"""Property tests: whatever a pod author, node agent or attacker writes, the core answers
with the allocation that was signed or with its typed error, never another exception."""

from __future__ import annotations

import contextlib
import json
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz.common import mutate
from fuzz.surface_nodedevices import paths
from tessera import record
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation, RdmaGrant, VfGrant
from tessera.cluster_index import ClusterIndex
from tessera.cluster_state import ClusterState
from tessera.errors import InventoryError, RecordError
from tessera.model import NodeInventory
from tessera.quantity import QuantityError, cpu_millis, memory_mib, parse_quantity, whole_count
from tessera.sharing import SharedValues
from tessera_edge.topology_file import BUILTIN_TOPOLOGIES, load_topology

SIGNER = record.Keyring.generate("k1")
NODE = SIGNER.verifier()

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-0123456789", min_size=1, max_size=12)
bus_ids = st.builds(
    "0000:{:02x}:{:02x}.{}".format, st.integers(0, 255), st.integers(0, 31), st.integers(0, 7)
)
gpu_grants = st.builds(
    GpuGrant,
    names.map("GPU-{}".format),
    st.integers(0, 63),
    st.integers(0, 63),
    st.integers(0, 100),
    st.integers(0, 2**20),
)
vf_grants = st.builds(VfGrant, bus_ids, names, st.integers(0, 255), st.just("") | names)
rdma_grants = st.builds(
    RdmaGrant,
    bus_ids,
    names,
    st.integers(0, 255),
    st.integers(1, 100),
    st.lists(vf_grants, max_size=2).map(tuple),
    st.just("") | names,
)


@st.composite
def allocations(draw: Any) -> PodAllocation:
    container_names = draw(st.lists(names, min_size=0, max_size=4, unique=True))
    containers = []
    for i, name in enumerate(container_names):
        reuses = draw(st.sampled_from(["", *container_names[:i]])) if i else ""
        containers.append(
            ContainerAllocation(
                name,
                tuple(draw(st.lists(gpu_grants, max_size=3, unique_by=lambda g: g.uuid))),
                tuple(draw(st.lists(rdma_grants, max_size=2))),
                init=draw(st.booleans()),
                reuses=reuses,
            )
        )
    return PodAllocation(
        draw(names),
        draw(names),
        draw(names),
        draw(names),
        tuple(containers),
        policy=draw(st.just("") | names),
        cpu_milli=draw(st.integers(0, 2**40)),
        memory_mib=draw(st.integers(0, 2**30)),
    )


@settings(max_examples=150, deadline=None)
@given(allocations())
def test_every_allocation_round_trips_signed(alloc: PodAllocation) -> None:
    text = record.encode(alloc, SIGNER)
    assert record.decode(text, NODE, pod_uid=alloc.pod_uid, node=alloc.node) == alloc
    assert record.encode(record.decode(text, NODE), SIGNER) == text


@settings(max_examples=200, deadline=None)
@given(allocations(), st.integers(0, 2**32), st.integers(1, 4))
def test_a_mutated_signed_record_is_the_signed_allocation_or_a_record_error(
    alloc: PodAllocation, seed: int, edits: int
) -> None:
    rng = random.Random(seed)
    data = record.encode(alloc, SIGNER).encode()
    for _ in range(edits):
        data = mutate(data, rng)
    try:
        got = record.decode(data, NODE, pod_uid=alloc.pod_uid, node=alloc.node)
    except RecordError:
        return
    assert got == alloc  # whitespace or an equivalent spelling: never a different grant


json_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=25,
)


@settings(max_examples=120, deadline=None)
@given(allocations(), st.dictionaries(st.sampled_from(["alg", "keyId", "sig", "mac"]), json_values))
def test_any_integrity_block_is_refused_with_a_record_error(
    alloc: PodAllocation, block: dict[str, Any]
) -> None:
    doc = json.loads(record.encode(alloc, SIGNER))
    doc["integrity"] = block
    with contextlib.suppress(RecordError):
        record.decode(json.dumps(doc), NODE)
        raise AssertionError("a record with a made-up integrity block verified")


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_arbitrary_json_only_ever_raises_record_errors(doc: Any) -> None:
    with contextlib.suppress(RecordError):
        record.decode(json.dumps(doc), NODE)


quantity_text = st.one_of(
    st.text(max_size=80),
    st.text(alphabet="0123456789.eE+-mkMGTPEi ", max_size=80),
    st.from_regex(r"\A[+-]?[0-9]{0,40}(\.[0-9]{0,40})?([eE][+-]?[0-9]{1,12})?(m|k|Ki|Gi|Ei|E)?\Z"),
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(quantity_text, st.integers(), st.floats(), st.none(), st.booleans()))
def test_any_quantity_parses_or_is_a_quantity_error(value: str | int | float | bool | None) -> None:
    for convert in (parse_quantity, cpu_millis, memory_mib, whole_count):
        try:
            result = convert(value)
        except QuantityError:
            continue
        assert abs(int(result)) <= 2**63 - 1 or convert is parse_quantity


TOPOLOGIES = [load_topology(name, "n1").to_dict() for name in BUILTIN_TOPOLOGIES]
SHARED = SharedValues(limit=16)


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(doc))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return copy


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(TOPOLOGIES), st.data())
def test_a_mutated_node_devices_spec_parses_or_is_an_inventory_error(
    spec: dict[str, Any], data: st.DataObject
) -> None:
    doc = spec
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths(doc)))
        value: object = data.draw(
            json_values
            | st.integers(2**62, 2**70)
            | st.just([{}] * 3000)
            | st.text(min_size=300, max_size=400)
        )
        doc = _replace(doc, path, value)
    try:
        inventory = NodeInventory.from_dict(doc, source="nodedevices/n1", node_name="n1")
    except InventoryError:
        return
    # shared with what earlier examples left in a small table: the same inventory
    shared = NodeInventory.from_dict(doc, source="nodedevices/n1", node_name="n1", shared=SHARED)
    assert shared == inventory
    state = ClusterState()
    state.set_node(inventory)
    ClusterIndex(state)  # whatever parses fits the scheduler's columns


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(TOPOLOGIES), st.integers(0, 2**32))
def test_a_byte_mutated_node_devices_spec_parses_or_is_an_inventory_error(
    spec: dict[str, Any], seed: int
) -> None:
    from tessera.boundedjson import JsonLimitError, loads

    rng = random.Random(seed)
    data = json.dumps(spec).encode()
    for _ in range(rng.randrange(1, 4)):
        data = mutate(data, rng)
    try:
        doc = loads(data, what="nodedevices", max_bytes=1 << 20, max_depth=16)
    except JsonLimitError:
        return
    with contextlib.suppress(InventoryError):
        NodeInventory.from_dict(doc, source="nodedevices/n1", node_name="n1")
