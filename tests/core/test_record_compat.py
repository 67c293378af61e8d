"""The record's compatibility rule between releases (docs/record.md, compatibility), both
ways: what this release reads from an older scheduler, what an older reader reads from this
release, what a newer minor version may add, and what is refused."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera import record
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation, RdmaGrant, VfGrant
from tessera.errors import IntegrityError, RecordError, RecordVersionError

KEY = record.Keyring(signing=("k1", Ed25519PrivateKey.from_private_bytes(bytes(range(32)))))
NODE = KEY.verifier()

PREVIOUS_RELEASE_RECORD = (
    '{"containers":[{"gpus":[{"core":50,"index":3,"memoryMiB":40960,"minor":3,"uuid":"GPU-aaaa"},'
    '{"core":100,"index":4,"memoryMiB":81559,"minor":4,"uuid":"GPU-bbbb"}],"name":"main","rdma":'
    '[{"ibdev":"mlx5_0","netdev":"ib0","pciBusId":"0000:0c:00.0","share":25,"uverbsMinor":0,'
    '"vfs":[{"ibdev":"mlx5_4","netdev":"ib0v0","pciBusId":"0000:0c:00.1","uverbsMinor":4}]}]},'
    '{"name":"sidecar","rdma":[{"ibdev":"mlx5_1","netdev":"ib1","pciBusId":"0000:0d:00.0",'
    '"share":100,"uverbsMinor":1}]},{"gpus":[{"core":50,"index":3,"memoryMiB":40960,"minor":3,'
    '"uuid":"GPU-aaaa"}],"init":true,"name":"warmup","reuses":"main"}],"cpuMilli":4000,'
    '"integrity":{"alg":"Ed25519","keyId":"k1","sig":"+DZnE9hTLHeJ23hBk02TfpfVASp0eUsu7FTnpJRFA'
    'RjaMyWhDJMS41ud76z3fdF5IVuqxBSYih0gL1WPTcbDDg=="},"memoryMiB":16384,"namespace":"ml",'
    '"node":"gpu-node-7","pod":"trainer-0","podUID":"6a1f0c0e-1111-4222-8333-444455556666",'
    '"policy":"binpack","v":1}'
)
"""Written, byte for byte, by the release before the compatibility rule (its scheduler's
encoder with KEY): running pods carry records like it through an upgrade."""
PREVIOUS_RELEASE_ALLOC = PodAllocation(
    pod_uid="6a1f0c0e-1111-4222-8333-444455556666",
    namespace="ml",
    name="trainer-0",
    node="gpu-node-7",
    containers=(
        ContainerAllocation(
            "main",
            gpus=(GpuGrant("GPU-aaaa", 3, 3, 50, 40960), GpuGrant("GPU-bbbb", 4, 4, 100, 81559)),
            rdma=(
                RdmaGrant(
                    "0000:0c:00.0",
                    "mlx5_0",
                    0,
                    25,
                    (VfGrant("0000:0c:00.1", "mlx5_4", 4, "ib0v0"),),
                    "ib0",
                ),
            ),
        ),
        ContainerAllocation(
            "sidecar", rdma=(RdmaGrant("0000:0d:00.0", "mlx5_1", 1, 100, (), "ib1"),)
        ),
        ContainerAllocation(
            "warmup", gpus=(GpuGrant("GPU-aaaa", 3, 3, 50, 40960),), init=True, reuses="main"
        ),
    ),
    policy="binpack",
    cpu_milli=4000,
    memory_mib=16384,
)

# The fields of schema 1.0, per object, as the release before the rule reads them (it
# refuses any other field, and any `minor`): what this release may write.
V1_0_FIELDS: dict[str, frozenset[str]] = {
    "record": frozenset(
        {"v", "podUID", "namespace", "pod", "node", "containers", "policy", "cpuMilli", "memoryMiB"}
    ),
    "container": frozenset({"name", "gpus", "rdma", "init", "reuses"}),
    "gpu": frozenset({"uuid", "index", "minor", "core", "memoryMiB"}),
    "nic": frozenset({"pciBusId", "ibdev", "uverbsMinor", "share", "netdev", "vfs"}),
    "vf": frozenset({"pciBusId", "ibdev", "uverbsMinor", "netdev"}),
}
KNOWN_NAMES = frozenset().union(*V1_0_FIELDS.values()) | {"minor", "integrity"}


def _objects(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every object of a record document with its kind (a key of V1_0_FIELDS)."""
    found: list[tuple[str, dict[str, Any]]] = [("record", doc)]
    for c in doc["containers"]:
        found.append(("container", c))
        found += [("gpu", g) for g in c.get("gpus", [])]
        for nic in c.get("rdma", []):
            found.append(("nic", nic))
            found += [("vf", vf) for vf in nic.get("vfs", [])]
    return found


def _signed(doc: dict[str, Any]) -> str:
    """`doc` signed as a scheduler signs: Ed25519 over its canonical JSON, then the block."""
    body = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    return json.dumps(
        {**doc, "integrity": {"alg": "Ed25519", "keyId": "k1", "sig": KEY.sign(body)}}
    )


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-0123456789", min_size=1, max_size=10)
buses = st.builds("0000:{:02x}:00.{}".format, st.integers(0, 255), st.integers(0, 7))
vfs = st.builds(VfGrant, buses, names, st.integers(0, 63), names | st.just(""))
nics = st.builds(
    RdmaGrant,
    buses,
    names,
    st.integers(0, 63),
    st.integers(1, 100),
    st.lists(vfs, max_size=2).map(tuple),
    names | st.just(""),
)
gpus = st.builds(
    GpuGrant,
    names,
    st.integers(0, 15),
    st.integers(0, 15),
    st.integers(0, 100),
    st.integers(0, 10**6),
)


@st.composite
def allocations(draw: st.DrawFn) -> PodAllocation:
    containers = draw(
        st.lists(
            st.tuples(
                names,
                st.lists(gpus, max_size=3, unique_by=lambda g: g.uuid),
                st.lists(nics, max_size=2),
            ),
            min_size=1,
            max_size=3,
            unique_by=lambda t: t[0],
        )
    )
    built = [ContainerAllocation(n, tuple(g), tuple(r)) for n, g, r in containers]
    if draw(st.booleans()):  # an init container on the first container's devices
        first = built[0]
        built.append(
            ContainerAllocation("init-" + first.name, first.gpus, init=True, reuses=first.name)
        )
    return PodAllocation(
        draw(names),
        draw(names),
        draw(names),
        draw(names),
        tuple(built),
        policy=draw(st.sampled_from(["", "binpack", "spread"])),
        cpu_milli=draw(st.integers(0, 10**6)),
        memory_mib=draw(st.integers(0, 10**6)),
    )


json_leaves = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=12)


def json_values(levels: int) -> st.SearchStrategy[Any]:
    """JSON values holding at most `levels` nested lists and objects."""
    if levels == 0:
        return json_leaves
    inner = json_values(levels - 1)
    return json_leaves | st.lists(inner, max_size=2) | st.dictionaries(names, inner, max_size=2)


ROOM = {"record": 3, "container": 3, "gpu": 2, "nic": 2, "vf": 1}
"""How deep a new field's value may nest at each object: a VF sits 7 levels down and every
record, of any version, stays within the 8 levels MAX_RECORD_DEPTH allows."""
extra_names = names.filter(lambda n: n not in KNOWN_NAMES)


# --- an older scheduler's records, read by this release -----------------------------------


def test_the_previous_release_record_reads_as_it_was_written() -> None:
    assert record.decode(PREVIOUS_RELEASE_RECORD, NODE) == PREVIOUS_RELEASE_ALLOC
    # and this release writes the very same bytes for it: nothing new for an older reader
    assert record.encode(PREVIOUS_RELEASE_ALLOC, KEY) == PREVIOUS_RELEASE_RECORD


# --- this release's records, read by an older release -------------------------------------


@settings(max_examples=200, deadline=None)
@given(allocations())
def test_this_release_writes_only_fields_of_schema_1_0(alloc: PodAllocation) -> None:
    doc = json.loads(record.encode(alloc, KEY))
    assert doc["v"] == 1 and "minor" not in doc
    assert set(doc.pop("integrity")) == {"alg", "keyId", "sig"}
    for kind, obj in _objects(doc):
        assert set(obj) <= V1_0_FIELDS[kind], (kind, sorted(obj))
    assert record.decode(record.encode(alloc, KEY), NODE) == alloc


# --- a newer minor version, read by this release -------------------------------------------


@settings(max_examples=200, deadline=None)
@given(allocations(), st.integers(1, record.MAX_MINOR), st.data())
def test_a_newer_minor_reads_as_the_same_allocation_its_extra_fields_ignored(
    alloc: PodAllocation, minor: int, data: st.DataObject
) -> None:
    doc = record.to_document(alloc)
    doc["minor"] = minor
    for kind, obj in _objects(doc):
        obj.update(data.draw(st.dictionaries(extra_names, json_values(ROOM[kind]), max_size=2)))
    assert record.decode(_signed(doc), NODE) == alloc


@settings(max_examples=100, deadline=None)
@given(allocations(), st.data())
def test_unknown_fields_are_refused_in_a_minor_this_release_knows(
    alloc: PodAllocation, data: st.DataObject
) -> None:
    doc = record.to_document(alloc)
    if data.draw(st.booleans()):
        doc["minor"] = record.SCHEMA_MINOR  # written out instead of left absent
    kind, obj = data.draw(st.sampled_from(_objects(doc)))
    field = data.draw(extra_names)
    obj[field] = data.draw(json_values(ROOM[kind]))
    with pytest.raises(RecordError, match="unknown field"):
        record.decode(_signed(doc), NODE)


def _newer(path: tuple[str | int, ...], value: object) -> str:
    """PREVIOUS_RELEASE_ALLOC as minor 1 with an extra field, one field at `path` set to
    `value` (KeyError: removed), signed."""
    doc = record.to_document(PREVIOUS_RELEASE_ALLOC) | {"minor": 1, "hint": {"x": 1}}
    target: Any = doc
    for step in path[:-1]:
        target = target[step]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return _signed(doc)


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("podUID",), KeyError, "missing field 'podUID'"),
        (("containers", 0, "gpus", 0, "uuid"), KeyError, "missing field 'uuid'"),
        (("containers", 0, "rdma", 0, "vfs", 0, "uverbsMinor"), KeyError, "missing field"),
        (("containers", 0, "gpus", 0, "core"), "50", "expected an integer"),
        (("containers", 0, "gpus", 0, "core"), 101, "out of range"),
        (("containers", 0, "rdma", 0, "pciBusId"), "0C:00.0", "normalized PCI bus ID"),
        (("containers", 2, "reuses"), "ghost", "reuses unknown container"),
        (("containers",), {}, "expected a list"),
    ],
)
def test_a_newer_minor_is_held_to_every_field_this_release_knows(
    path: tuple[str | int, ...], value: object, needle: str
) -> None:
    with pytest.raises(RecordError, match=needle):
        record.decode(_newer(path, value), NODE)


def test_the_size_and_depth_limits_hold_for_every_minor() -> None:
    deep = json.loads(_newer(("containers", 0, "rdma", 0, "vfs", 0, "later"), [[1]]))
    with pytest.raises(RecordError, match="nested deeper than 8"):
        record.decode(json.dumps(deep), NODE)
    with pytest.raises(RecordError, match="over the"):
        record.decode(_newer(("hint",), "x" * record.MAX_RECORD_BYTES), NODE)


def test_fields_a_reader_ignores_are_still_signed() -> None:
    doc = json.loads(_newer(("policy",), "binpack"))
    doc["hint"] = {"x": 2}
    with pytest.raises(IntegrityError, match="does not verify"):
        record.decode(json.dumps(doc), NODE)


# --- what is refused -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("v", 2, "version 2 .*from a newer release"),
        ("v", 0, "unsupported record schema version 0"),
        ("v", "1", "unsupported record schema version '1'"),
        ("v", True, "unsupported record schema version True"),
        ("v", 1.0, "unsupported record schema version 1.0"),
        ("v", KeyError, "unsupported record schema version None"),
        ("minor", -1, "record.minor: -1 is not a minor version"),
        ("minor", "1", "record.minor: '1' is not a minor version"),
        ("minor", True, "record.minor: True is not a minor version"),
        ("minor", record.MAX_MINOR + 1, "is not a minor version"),
    ],
)
def test_versions_this_release_does_not_read_are_refused_with_a_typed_error(
    field: str, value: object, needle: str
) -> None:
    doc = record.to_document(PREVIOUS_RELEASE_ALLOC)
    if value is KeyError:
        del doc[field]
    else:
        doc[field] = value
    with pytest.raises(RecordVersionError, match=needle):
        record.decode(_signed(doc), NODE)
    with pytest.raises(RecordVersionError):  # the same without a signature check
        record.decode(_signed(doc))


def test_a_newer_major_is_refused_whatever_it_holds() -> None:
    doc = {"v": 2, "podUID": "u", "devices": [{"kind": "fpga"}]}
    with pytest.raises(RecordVersionError, match="newer release"):
        record.decode(_signed(doc), NODE)
    assert base64.b64decode(json.loads(_signed(doc))["integrity"]["sig"])  # signed, still refused
