"""The allocation record: the `tessera.dev/allocation` pod annotation, encoded and checked.

The scheduler writes it before binding; the NRI plugin applies it; the scheduler rebuilds
its state from it. Its JSON is canonical (sorted keys, no spaces) so the same allocation
always encodes to the same string, and an Ed25519 signature covers every field, the pod UID
and node included. Only the scheduler holds the private key; nodes hold public keys, so
neither a pod's author nor a node can mint a record another node accepts. Schema, keys,
rotation, the upgrade from HMAC records and the compatibility rule between releases
(`v` and `minor`): docs/record.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation, RdmaGrant, VfGrant
from tessera.boundedjson import JsonLimitError, loads
from tessera.errors import IntegrityError, RecordError, RecordMismatchError, RecordVersionError
from tessera.model import MAX_DEVICE_NUMBER, MAX_GPU_MEMORY_MIB, MAX_NAME_CHARS, normalize_bus_id
from tessera.resources import UNITS_PER_DEVICE

SCHEMA_VERSION: Final = 1
"""The major version (`v`): a reader reads exactly the majors it knows."""
SCHEMA_MINOR: Final = 0
"""The newest minor version (`minor`, absent for 0) of SCHEMA_VERSION this build knows. A
record of a newer minor may carry fields this build does not know; they are ignored (a
minor only adds fields a reader may ignore and still apply the record rightly). A writer
writes the lowest minor that holds the record, so an older release keeps reading it."""
MAX_MINOR: Final = 2**31 - 1
MAX_RECORD_BYTES: Final = 64 * 1024
"""Far above any real record (a 16-GPU pod is under 4 KiB); refuses absurd annotations."""
MAX_RECORD_DEPTH: Final = 8
"""Nesting of a record: record > containers > container > rdma > NIC > vfs > VF is 7 deep;
anything deeper is not a record (and must not reach a recursive parser)."""
MAX_HOST_AMOUNT: Final = 2**63 - 1
"""cpuMilli and memoryMiB: the scheduler keeps them in int64 columns."""
MAX_KEY_ID_CHARS: Final = 253
"""A key ID is the name of a file in a Secret, and Secret keys stop at 253 characters."""
SIGNATURE_ALGORITHM: Final = "Ed25519"
LEGACY_MAC_ALGORITHM: Final = "HMAC-SHA256"
"""What releases before Ed25519 signed with; read only when the scheduler is given the old
keys (see docs/record.md, upgrade)."""
MIN_LEGACY_KEY_BYTES: Final = 16
_SIGNATURE_BYTES: Final = 64


class Keyring:
    """Record keys: an optional signing key, public keys by key ID (for verification and
    rotation), and optionally old HMAC keys that only verify (upgrade from HMAC records)."""

    def __init__(
        self,
        public: Mapping[str, Ed25519PublicKey] | None = None,
        signing: tuple[str, Ed25519PrivateKey] | None = None,
        legacy_hmac: Mapping[str, bytes] | None = None,
    ) -> None:
        self._public = dict(public or {})
        self._signing = signing
        self._legacy = dict(legacy_hmac or {})
        for key_id, key in self._legacy.items():
            if len(key) < MIN_LEGACY_KEY_BYTES:
                raise ValueError(
                    f"HMAC key {key_id!r} is shorter than {MIN_LEGACY_KEY_BYTES} bytes"
                )
        if signing is not None:
            key_id, private = signing
            mine = private.public_key()
            known = self._public.setdefault(key_id, mine)
            if _raw(known) != _raw(mine):
                raise ValueError(f"public key {key_id!r} does not belong to the signing key")
        if not self._public and not self._legacy:
            raise ValueError("a keyring needs at least one key")

    @classmethod
    def generate(cls, key_id: str = "default") -> Keyring:
        """A keyring with a fresh signing key (tests, the demo)."""
        return cls(signing=(key_id, Ed25519PrivateKey.generate()))

    @property
    def signing_id(self) -> str | None:
        return self._signing[0] if self._signing else None

    @property
    def key_ids(self) -> tuple[str, ...]:
        """IDs of the public (verification) keys, sorted."""
        return tuple(sorted(self._public))

    @property
    def signing_key(self) -> Ed25519PrivateKey | None:
        return self._signing[1] if self._signing else None

    def public_key(self, key_id: str) -> Ed25519PublicKey | None:
        return self._public.get(key_id)

    @property
    def legacy_key_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._legacy))

    def legacy_key(self, key_id: str) -> bytes | None:
        return self._legacy.get(key_id)

    def verifier(self) -> Keyring:
        """The same keyring without its private key: what a node holds."""
        return Keyring(self._public, None, self._legacy)

    def with_legacy_hmac(self, keys: Mapping[str, bytes]) -> Keyring:
        return Keyring(self._public, self._signing, keys)

    def get(self) -> Keyring:
        """A keyring is its own KeySource (a fixed one)."""
        return self

    def sign(self, body: bytes) -> str:
        if self._signing is None:
            raise IntegrityError("no record signing key is configured (only public keys)")
        return base64.b64encode(self._signing[1].sign(body)).decode("ascii")


class KeySource(Protocol):
    """Anything that yields the current keyring: a Keyring, or tessera_edge.keyfiles.KeyringSource
    (which re-reads rotated key files)."""

    def get(self) -> Keyring | None: ...


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes_raw()


def _mac(key: bytes, body: bytes) -> str:
    return base64.b64encode(hmac.new(key, body, hashlib.sha256).digest()).decode("ascii")


def _canonical(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


# --- encoding --------------------------------------------------------------------------------


def to_document(alloc: PodAllocation) -> dict[str, Any]:
    """The record as a JSON-ready dict, without the integrity proof."""
    doc: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "podUID": alloc.pod_uid,
        "namespace": alloc.namespace,
        "pod": alloc.name,
        "node": alloc.node,
        "containers": [_container_doc(c) for c in alloc.containers],
    }
    if alloc.policy:
        doc["policy"] = alloc.policy
    if alloc.cpu_milli:
        doc["cpuMilli"] = alloc.cpu_milli
    if alloc.memory_mib:
        doc["memoryMiB"] = alloc.memory_mib
    return doc


def _container_doc(c: ContainerAllocation) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": c.name}
    if c.gpus:
        doc["gpus"] = [
            {
                "uuid": g.uuid,
                "index": g.index,
                "minor": g.minor,
                "core": g.core,
                "memoryMiB": g.memory_mib,
            }
            for g in c.gpus
        ]
    if c.rdma:
        doc["rdma"] = [_rdma_doc(r) for r in c.rdma]
    if c.init:
        doc["init"] = True
    if c.reuses:
        doc["reuses"] = c.reuses
    return doc


def _rdma_doc(r: RdmaGrant) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "pciBusId": r.pci_bus_id,
        "ibdev": r.ibdev,
        "uverbsMinor": r.uverbs_minor,
        "share": r.share,
    }
    if r.netdev:
        doc["netdev"] = r.netdev
    if r.vfs:
        doc["vfs"] = [
            {"pciBusId": v.pci_bus_id, "ibdev": v.ibdev, "uverbsMinor": v.uverbs_minor}
            | ({"netdev": v.netdev} if v.netdev else {})
            for v in r.vfs
        ]
    return doc


def encode(alloc: PodAllocation, keyring: KeySource | None = None) -> str:
    """The annotation value. With a keyring the record carries its signature
    (IntegrityError when the keyring holds no signing key)."""
    doc = to_document(alloc)
    if keyring is not None:
        ring = keyring.get()
        if ring is None or ring.signing_id is None:
            raise IntegrityError("no record signing key is configured")
        doc["integrity"] = {
            "alg": SIGNATURE_ALGORITHM,
            "keyId": ring.signing_id,
            "sig": ring.sign(_canonical(doc)),
        }
    return _canonical(doc).decode()


# --- decoding --------------------------------------------------------------------------------


def decode(
    text: str | bytes,
    keyring: KeySource | None = None,
    *,
    require_integrity: bool | None = None,
    pod_uid: str | None = None,
    node: str | None = None,
    namespace: str | None = None,
    name: str | None = None,
    share: Callable[[str], str] | None = None,
) -> PodAllocation:
    """Parse and validate a record. Raises RecordError (IntegrityError for the proof).

    With a keyring the proof must be present and verify (unless `require_integrity` is
    False). `pod_uid`, `node`, `namespace` and `name`, when given, must match what the
    record names: a record copied from another pod or node is refused (RecordMismatchError).
    `share` maps each string that many records repeat (device IDs, container names,
    namespace, node, policy) to the one copy the caller keeps (e.g. sys.intern); the pod's
    UID and name are the caller's own objects when they match.
    """
    if not isinstance(text, str | bytes):
        raise RecordError(f"record: expected text, got {type(text).__name__}")
    try:
        doc = loads(text, what="record", max_bytes=MAX_RECORD_BYTES, max_depth=MAX_RECORD_DEPTH)
    except JsonLimitError as exc:
        raise RecordError(str(exc)) from None
    if not isinstance(doc, dict):
        raise RecordError("record must be a JSON object")
    newer = _check_version(doc)

    integrity = doc.pop("integrity", None)
    must_verify = keyring is not None if require_integrity is None else require_integrity
    if must_verify:
        _verify(doc, integrity, None if keyring is None else keyring.get())

    alloc = _parse(doc, (pod_uid, namespace, name, node), share or _as_is, newer)
    if pod_uid is not None and alloc.pod_uid != pod_uid:
        raise RecordMismatchError(f"record is for pod UID {alloc.pod_uid!r}, not {pod_uid!r}")
    if node is not None and alloc.node != node:
        raise RecordMismatchError(f"record is for node {alloc.node!r}, not {node!r}")
    if (namespace is not None and alloc.namespace != namespace) or (
        name is not None and alloc.name != name
    ):
        raise RecordMismatchError(
            f"record is for pod {alloc.namespace}/{alloc.name}, not "
            f"{namespace or alloc.namespace}/{name or alloc.name}"
        )
    return alloc


def _check_version(doc: dict[str, Any]) -> bool:
    """Whether the record is of a newer minor than this build's (its unknown fields are then
    ignored); RecordVersionError for a major this build does not read."""
    version = doc.get("v")
    if type(version) is not int or version != SCHEMA_VERSION:  # not true, not 1.0
        newer = type(version) is int and version > SCHEMA_VERSION
        raise RecordVersionError(
            f"record.v: unsupported record schema version {_short(version)} "
            f"(this build reads {SCHEMA_VERSION}"
            + (": the record is from a newer release, see docs/record.md)" if newer else ")")
        )
    minor = doc.get("minor", 0)
    if type(minor) is not int or not 0 <= minor <= MAX_MINOR:
        raise RecordVersionError(f"record.minor: {_short(minor)} is not a minor version")
    return minor > SCHEMA_MINOR


def _verify(doc: dict[str, Any], integrity: Any, keyring: Keyring | None) -> None:
    if keyring is None:
        raise IntegrityError("record integrity is required but no integrity key is configured")
    if integrity is None:
        raise IntegrityError("record carries no integrity proof")
    if not isinstance(integrity, dict) or not all(isinstance(v, str) for v in integrity.values()):
        raise IntegrityError("record.integrity: must be an object of strings {alg, keyId, sig}")
    alg = integrity.get("alg")
    if alg == LEGACY_MAC_ALGORITHM:
        _verify_legacy(doc, integrity, keyring)
        return
    if alg != SIGNATURE_ALGORITHM:
        raise IntegrityError(f"record.integrity.alg: unsupported {_short(alg)}")
    if set(integrity) != {"alg", "keyId", "sig"}:
        raise IntegrityError("record.integrity: must be {alg, keyId, sig}")
    key_id, sig = integrity["keyId"], integrity["sig"]
    key = keyring.public_key(key_id) if len(key_id) <= MAX_KEY_ID_CHARS else None
    if key is None:
        raise IntegrityError(f"record.integrity.keyId: unknown key id {_short(key_id)}")
    signature = _strict_b64(sig)
    if signature is None or len(signature) != _SIGNATURE_BYTES:
        raise IntegrityError("record.integrity.sig: not a base64 Ed25519 signature")
    try:
        key.verify(signature, _canonical(doc))
    except InvalidSignature:
        raise IntegrityError(
            "record integrity proof does not verify (forged or altered record)"
        ) from None


def _strict_b64(text: str) -> bytes | None:
    """The bytes of canonical base64 `text`, else None (one signature has one spelling)."""
    if not text.isascii():
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if base64.b64encode(raw).decode("ascii") == text else None


def _verify_legacy(doc: dict[str, Any], integrity: dict[str, str], keyring: Keyring) -> None:
    if set(integrity) != {"alg", "keyId", "mac"}:
        raise IntegrityError("record.integrity: must be {alg, keyId, mac}")
    key = keyring.legacy_key(integrity["keyId"])
    if key is None:
        raise IntegrityError(
            f"record.integrity.alg: {LEGACY_MAC_ALGORITHM} records from an older release are "
            f"not trusted (key id {_short(integrity['keyId'])} is no legacy key here); "
            "this release verifies Ed25519 signatures"
        )
    expected = _mac(key, _canonical(doc)).encode()
    if not integrity["mac"].isascii() or not hmac.compare_digest(
        expected, integrity["mac"].encode()
    ):
        raise IntegrityError("record integrity proof does not verify (forged or altered record)")


def signature_algorithm(text: str | bytes) -> str | None:
    """The `alg` a record claims (not verified), None when it has none or is unreadable.
    The scheduler uses it to find valid legacy records to re-sign."""
    try:
        doc = loads(text, what="record", max_bytes=MAX_RECORD_BYTES, max_depth=MAX_RECORD_DEPTH)
    except JsonLimitError:
        return None
    block = doc.get("integrity") if isinstance(doc, dict) else None
    alg = block.get("alg") if isinstance(block, dict) else None
    return alg if isinstance(alg, str) else None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Fields:
    """Strict field reader: exact key sets, exact types, paths in every message."""

    def __init__(
        self, doc: Any, path: str, required: set[str], optional: set[str], newer: bool
    ) -> None:
        if not isinstance(doc, dict):
            raise RecordError(f"{path}: expected an object")
        unknown = set(doc) - required - optional
        if unknown and not newer:  # a newer minor's fields are for newer readers
            raise RecordError(f"{path}: unknown field {_short(sorted(unknown)[0])}")
        missing = required - set(doc)
        if missing:
            raise RecordError(f"{path}: missing field {sorted(missing)[0]!r}")
        self.doc = doc
        self.path = path

    def text(self, key: str, default: str | None = None, nonempty: bool = False) -> str:
        value = self.doc.get(key, default)
        if not isinstance(value, str) or (nonempty and not value):
            raise RecordError(
                f"{self.path}.{key}: expected a{' non-empty' if nonempty else ''} string"
            )
        if len(value) > MAX_NAME_CHARS:
            raise RecordError(f"{self.path}.{key}: longer than {MAX_NAME_CHARS} characters")
        return value

    def number(self, key: str, hi: int, lo: int = 0, default: int | None = None) -> int:
        value = self.doc.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordError(f"{self.path}.{key}: expected an integer")
        if not lo <= value <= hi:
            raise RecordError(f"{self.path}.{key}: {value} is out of range ({lo}..{hi})")
        return value

    def items(self, key: str) -> list[Any]:
        value = self.doc.get(key, [])
        if not isinstance(value, list):
            raise RecordError(f"{self.path}.{key}: expected a list")
        return value

    def bus(self, key: str) -> str:
        value = self.text(key, nonempty=True)
        try:
            if normalize_bus_id(value) != value:
                raise ValueError("not in normal form")
        except ValueError:
            raise RecordError(
                f"{self.path}.{key}: {value!r} is not a normalized PCI bus ID"
            ) from None
        return value


Known = tuple[str | None, str | None, str | None, str | None]
"""The (UID, namespace, name, node) a caller expects a record to name."""


def _same(value: str, known: str | None) -> str:
    """`known` when equal to `value`: the caller's string object is kept instead of a second
    copy (a scheduler holding 50,000 pods keeps each UID and name once, and can share one
    namespace and node name between many)."""
    return known if known == value else value


SHARED_MIB_VALUES: Final = 4096
"""Distinct GPU memory grants whose int objects are shared (see `_shared_mib`)."""
_MIB: dict[int, int] = {}


def _shared_mib(value: int) -> int:
    """One int object per GPU memory grant value: Python caches only ints up to 256, and
    50,000 grants of a few distinct sizes (a share of one GPU model's memory) would each
    keep their own (32 bytes). At most SHARED_MIB_VALUES distinct values are kept, so
    hostile records cannot grow it; past that a value is its own object, as before."""
    kept = _MIB.get(value)
    if kept is not None:
        return kept
    if len(_MIB) < SHARED_MIB_VALUES:
        _MIB[value] = value
    return value


def _as_is(text: str) -> str:
    return text


def _parse(
    doc: dict[str, Any], known: Known, share: Callable[[str], str], newer: bool
) -> PodAllocation:
    """The allocation a record names; strings equal to `known` are the caller's objects,
    the others go through `share`. `newer`: the record is of a newer minor version, whose
    fields this build does not know are ignored."""
    f = _Fields(
        doc,
        "record",
        {"v", "podUID", "namespace", "pod", "node", "containers"},
        {"minor", "policy", "cpuMilli", "memoryMiB"},
        newer,
    )
    containers = tuple(
        _parse_container(c, f"record.containers[{i}]", share, newer)
        for i, c in enumerate(f.items("containers"))
    )
    names = [c.name for c in containers]
    if len(set(names)) != len(names):
        raise RecordError("record.containers: duplicate container name")
    for c in containers:
        if c.reuses and (c.reuses not in names or c.reuses == c.name):
            raise RecordError(f"record: container {c.name!r} reuses unknown container {c.reuses!r}")
    return PodAllocation(
        pod_uid=_same(f.text("podUID", nonempty=True), known[0]),
        namespace=_same(share(f.text("namespace", nonempty=True)), known[1]),
        name=_same(f.text("pod", nonempty=True), known[2]),
        node=_same(share(f.text("node", nonempty=True)), known[3]),
        containers=containers,
        policy=share(f.text("policy", default="")),
        cpu_milli=f.number("cpuMilli", MAX_HOST_AMOUNT, default=0),
        memory_mib=f.number("memoryMiB", MAX_HOST_AMOUNT, default=0),
    )


def _parse_container(
    doc: Any, path: str, share: Callable[[str], str], newer: bool
) -> ContainerAllocation:
    f = _Fields(doc, path, {"name"}, {"gpus", "rdma", "init", "reuses"}, newer)
    gpus = []
    for i, g in enumerate(f.items("gpus")):
        gf = _Fields(
            g, f"{path}.gpus[{i}]", {"uuid", "index", "minor", "core", "memoryMiB"}, set(), newer
        )
        gpus.append(
            GpuGrant(
                uuid=share(gf.text("uuid", nonempty=True)),
                index=gf.number("index", MAX_DEVICE_NUMBER),
                minor=gf.number("minor", MAX_DEVICE_NUMBER),
                core=gf.number("core", UNITS_PER_DEVICE),
                memory_mib=_shared_mib(gf.number("memoryMiB", MAX_GPU_MEMORY_MIB)),
            )
        )
    if len({g.uuid for g in gpus}) != len(gpus):
        raise RecordError(f"{path}.gpus: the same GPU is listed twice")
    rdma = [
        _parse_rdma(r, f"{path}.rdma[{i}]", share, newer) for i, r in enumerate(f.items("rdma"))
    ]
    init = doc.get("init", False)
    if not isinstance(init, bool):
        raise RecordError(f"{path}.init: expected true or false")
    return ContainerAllocation(
        name=share(f.text("name", nonempty=True)),
        gpus=tuple(gpus),
        rdma=tuple(rdma),
        init=init,
        reuses=share(f.text("reuses", default="")),
    )


def _parse_rdma(doc: Any, path: str, share: Callable[[str], str], newer: bool) -> RdmaGrant:
    f = _Fields(doc, path, {"pciBusId", "ibdev", "uverbsMinor", "share"}, {"netdev", "vfs"}, newer)
    vfs = []
    for i, v in enumerate(f.items("vfs")):
        vf = _Fields(v, f"{path}.vfs[{i}]", {"pciBusId", "ibdev", "uverbsMinor"}, {"netdev"}, newer)
        vfs.append(
            VfGrant(
                share(vf.bus("pciBusId")),
                share(vf.text("ibdev", nonempty=True)),
                vf.number("uverbsMinor", MAX_DEVICE_NUMBER),
                vf.text("netdev", default=""),
            )
        )
    return RdmaGrant(
        pci_bus_id=share(f.bus("pciBusId")),
        ibdev=share(f.text("ibdev", nonempty=True)),
        uverbs_minor=f.number("uverbsMinor", MAX_DEVICE_NUMBER),
        share=f.number("share", UNITS_PER_DEVICE, lo=1),
        vfs=tuple(vfs),
        netdev=f.text("netdev", default=""),
    )
