import base64
import contextlib
import hashlib
import hmac
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera import record
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation, RdmaGrant, VfGrant
from tessera.errors import IntegrityError, RecordError, RecordMismatchError

SEED = bytes(range(32))
"""A fixed private key, so the golden signature below is fixed (Ed25519 is deterministic)."""
KEY = record.Keyring(signing=("k1", Ed25519PrivateKey.from_private_bytes(SEED)))

ALLOC = PodAllocation(
    pod_uid="6a1f0c0e-1111-4222-8333-444455556666",
    namespace="ml",
    name="trainer-0",
    node="gpu-node-7",
    containers=(
        ContainerAllocation(
            "main",
            gpus=(GpuGrant("GPU-aaaa", 3, 3, 50, 40960),),
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
            "warmup", gpus=(GpuGrant("GPU-aaaa", 3, 3, 50, 40960),), init=True, reuses="main"
        ),
    ),
    policy="binpack",
    cpu_milli=4000,
)

# The exact bytes of the annotation: any change to the schema or encoding shows up here.
GOLDEN_UNSIGNED = (
    '{"containers":[{"gpus":[{"core":50,"index":3,"memoryMiB":40960,"minor":3,"uuid":"GPU-aaaa"}],'
    '"name":"main","rdma":[{"ibdev":"mlx5_0","netdev":"ib0","pciBusId":"0000:0c:00.0","share":25,'
    '"uverbsMinor":0,"vfs":[{"ibdev":"mlx5_4","netdev":"ib0v0","pciBusId":"0000:0c:00.1",'
    '"uverbsMinor":4}]}]},{"gpus":[{"core":50,"index":3,"memoryMiB":40960,"minor":3,"uuid":"GPU-aaaa"}],'
    '"init":true,"name":"warmup","reuses":"main"}],"cpuMilli":4000,"namespace":"ml","node":"gpu-node-7",'
    '"pod":"trainer-0","podUID":"6a1f0c0e-1111-4222-8333-444455556666","policy":"binpack","v":1}'
)


def test_golden_unsigned_encoding() -> None:
    assert record.encode(ALLOC) == GOLDEN_UNSIGNED


def test_golden_signature() -> None:
    signed = json.loads(record.encode(ALLOC, KEY))
    # Ed25519 over GOLDEN_UNSIGNED with the fixed key, computed independently of the codec
    expected = Ed25519PrivateKey.from_private_bytes(SEED).sign(GOLDEN_UNSIGNED.encode())
    assert signed["integrity"] == {
        "alg": "Ed25519",
        "keyId": "k1",
        "sig": base64.b64encode(expected).decode(),
    }


def test_round_trip_signed_and_unsigned() -> None:
    assert record.decode(record.encode(ALLOC)) == ALLOC
    assert record.decode(record.encode(ALLOC, KEY), KEY) == ALLOC


def test_tampering_is_detected() -> None:
    doc = json.loads(record.encode(ALLOC, KEY))
    doc["containers"][0]["gpus"][0]["core"] = 100
    with pytest.raises(IntegrityError, match="does not verify"):
        record.decode(json.dumps(doc), KEY)


def test_missing_or_foreign_proof() -> None:
    with pytest.raises(IntegrityError, match="no integrity proof"):
        record.decode(record.encode(ALLOC), KEY)
    other = record.Keyring.generate("k2")
    with pytest.raises(IntegrityError, match="unknown key id"):
        record.decode(record.encode(ALLOC, other), KEY)
    same_id = record.Keyring.generate("k1")
    with pytest.raises(IntegrityError, match="does not verify"):
        record.decode(record.encode(ALLOC, same_id), KEY)


def test_integrity_required_without_key_is_an_error() -> None:
    with pytest.raises(IntegrityError, match="no integrity key"):
        record.decode(record.encode(ALLOC), None, require_integrity=True)


def test_rotation_verifies_with_any_public_key_and_signs_with_the_signing_key() -> None:
    new = record.Keyring.generate("new")
    assert KEY.signing_key is not None and new.signing_key is not None
    ring = record.Keyring({"k1": KEY.signing_key.public_key()}, signing=("new", new.signing_key))
    assert record.decode(record.encode(ALLOC, KEY), ring) == ALLOC
    assert json.loads(record.encode(ALLOC, ring))["integrity"]["keyId"] == "new"


def test_a_node_verifies_but_cannot_sign() -> None:
    node = KEY.verifier()
    assert node.signing_id is None and node.signing_key is None
    assert record.decode(record.encode(ALLOC, KEY), node) == ALLOC
    with pytest.raises(IntegrityError, match="no record signing key"):
        record.encode(ALLOC, node)


def test_a_public_key_must_match_the_signing_key_of_its_id() -> None:
    assert KEY.signing_key is not None
    with pytest.raises(ValueError, match="does not belong"):
        record.Keyring(
            {"k1": Ed25519PrivateKey.generate().public_key()}, signing=("k1", KEY.signing_key)
        )


def _hmac_record(key: bytes, key_id: str = "default") -> str:
    doc = json.loads(GOLDEN_UNSIGNED)
    mac = base64.b64encode(hmac.new(key, GOLDEN_UNSIGNED.encode(), hashlib.sha256).digest())
    doc["integrity"] = {"alg": "HMAC-SHA256", "keyId": key_id, "mac": mac.decode()}
    return json.dumps(doc)


def test_hmac_records_verify_only_with_legacy_keys() -> None:
    old = b"0123456789abcdef0123456789abcdef"
    text = _hmac_record(old)
    with pytest.raises(IntegrityError, match="not trusted"):
        record.decode(text, KEY)
    with pytest.raises(IntegrityError, match="not trusted"):
        record.decode(text, KEY.verifier())
    upgraded = KEY.with_legacy_hmac({"default": old})
    assert record.decode(text, upgraded) == ALLOC
    assert record.signature_algorithm(text) == "HMAC-SHA256"
    assert record.signature_algorithm(record.encode(ALLOC, upgraded)) == "Ed25519"
    with pytest.raises(IntegrityError, match="does not verify"):
        record.decode(_hmac_record(b"x" * 32), upgraded)


def test_short_legacy_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="shorter"):
        KEY.with_legacy_hmac({"default": b"short"})


def test_pod_and_node_binding() -> None:
    text = record.encode(ALLOC, KEY)
    record.decode(text, KEY, pod_uid=ALLOC.pod_uid, node="gpu-node-7")
    with pytest.raises(RecordMismatchError, match="not 'other-uid'"):
        record.decode(text, KEY, pod_uid="other-uid")
    with pytest.raises(RecordMismatchError, match="not 'node-x'"):
        record.decode(text, KEY, node="node-x")
    record.decode(text, KEY, namespace="ml", name="trainer-0")
    with pytest.raises(RecordMismatchError, match="not ml/trainer-1"):
        record.decode(text, KEY, namespace="ml", name="trainer-1")
    with pytest.raises(RecordMismatchError, match="not dev/trainer-0"):
        record.decode(text, KEY, namespace="dev")


def mutate(path: tuple[str | int, ...], value: object) -> str:
    doc = json.loads(GOLDEN_UNSIGNED)
    target = doc
    for step in path[:-1]:
        target = target[step]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("v",), 2, "unsupported record schema version 2"),
        (("podUID",), "", "record.podUID: expected a non-empty string"),
        (("node",), KeyError, "missing field 'node'"),
        (("extra",), 1, "unknown field 'extra'"),
        (("containers", 0, "gpus", 0, "core"), 101, "out of range"),
        (("containers", 0, "gpus", 0, "core"), "50", "expected an integer"),
        (("containers", 0, "gpus", 0, "core"), True, "expected an integer"),
        (("containers", 0, "gpus", 0, "memoryMiB"), -1, "out of range"),
        (("containers", 0, "rdma", 0, "pciBusId"), "0C:00.0", "normalized PCI bus ID"),
        (("containers", 0, "rdma", 0, "share"), 0, "out of range"),
        (("containers", 1, "reuses"), "ghost", "reuses unknown container"),
        (("containers", 1, "name"), "main", "duplicate container name"),
        (("containers", 1, "init"), "yes", "true or false"),
        (("containers",), {}, "expected a list"),
    ],
)
def test_malformed_records_say_what_is_wrong(
    path: tuple[str | int, ...], value: object, needle: str
) -> None:
    with pytest.raises(RecordError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        record.decode(mutate(path, value))


def test_same_gpu_twice_in_a_container() -> None:
    doc = json.loads(GOLDEN_UNSIGNED)
    doc["containers"][0]["gpus"] *= 2
    with pytest.raises(RecordError, match="listed twice"):
        record.decode(json.dumps(doc))


def test_not_json_and_too_large() -> None:
    with pytest.raises(RecordError, match="not valid JSON"):
        record.decode("{")
    with pytest.raises(RecordError, match="must be a JSON object"):
        record.decode("[]")
    with pytest.raises(RecordError, match="over the"):
        record.decode("x" * (record.MAX_RECORD_BYTES + 1))
    with pytest.raises(RecordError, match="not valid JSON"):
        record.decode(b"\xff\xfe")


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300)))
def test_arbitrary_input_only_ever_raises_record_errors(data: bytes | str) -> None:
    with contextlib.suppress(RecordError):
        record.decode(data, KEY)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 200) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["v", "podUID", "namespace", "pod", "node", "containers", "policy"]),
        json_values,
    )
)
def test_arbitrary_structures_only_ever_raise_record_errors(doc: dict[str, Any]) -> None:
    doc.setdefault("v", 1)
    with contextlib.suppress(RecordError):
        record.decode(json.dumps(doc))


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-0123456789", min_size=1, max_size=12)
grants = st.builds(
    GpuGrant,
    names,
    st.integers(0, 15),
    st.integers(0, 15),
    st.integers(0, 100),
    st.integers(0, 10**6),
)


@settings(max_examples=100, deadline=None)
@given(
    names,
    names,
    st.lists(
        st.tuples(names, st.lists(grants, max_size=3, unique_by=lambda g: g.uuid)),
        max_size=4,
        unique_by=lambda t: t[0],
    ),
)
def test_any_allocation_round_trips(
    uid: str, node_name: str, containers: list[tuple[str, list[GpuGrant]]]
) -> None:
    alloc = PodAllocation(
        uid, "ns", "pod", node_name, tuple(ContainerAllocation(n, tuple(g)) for n, g in containers)
    )
    text = record.encode(alloc, KEY)
    assert record.decode(text, KEY) == alloc
    assert record.encode(record.decode(text, KEY), KEY) == text


def test_decode_shares_repeated_strings_and_keeps_the_callers_identity() -> None:
    pool: dict[str, str] = {}

    def share(text: str) -> str:
        return pool.setdefault(text, text)

    text = record.encode(ALLOC, KEY)
    uid, name = (ALLOC.pod_uid + ".")[:-1], (ALLOC.name + ".")[:-1]  # equal, not the same
    first = record.decode(text, KEY, pod_uid=uid, name=name, share=share)
    second = record.decode(text, KEY, share=share)
    assert first == second == ALLOC == record.decode(text, KEY)
    assert first.pod_uid is uid and first.name is name
    gpu, rdma = first.containers[0].gpus[0], first.containers[0].rdma[0]
    again = second.containers[0]
    assert gpu.uuid is again.gpus[0].uuid and rdma.vfs[0].ibdev is again.rdma[0].vfs[0].ibdev
    assert first.node is second.node and first.namespace is second.namespace
    assert set(pool) >= {"GPU-aaaa", "main", "ml", "gpu-node-7", "0000:0c:00.1", "mlx5_4"}


def _grant_mib(mib: int) -> int:
    """The memory_mib of a freshly decoded record granting `mib` (its own JSON text)."""
    alloc = PodAllocation(
        "u", "ns", "p", "n", (ContainerAllocation("c", (GpuGrant("GPU-0", 0, 0, 25, mib),)),)
    )
    return record.decode(record.encode(alloc)).containers[0].gpus[0].memory_mib


def test_decoded_gpu_memory_grants_of_one_size_share_one_int(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(record, "_MIB", {})
    assert _grant_mib(20480) is _grant_mib(20480) == 20480
    # bounded: past the limit a value is its own object, and nothing more is kept
    monkeypatch.setattr(record, "SHARED_MIB_VALUES", 1)
    assert _grant_mib(10240) == 10240 and _grant_mib(10240) is not _grant_mib(10240)
    assert list(record._MIB) == [20480]
