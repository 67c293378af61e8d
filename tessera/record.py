"""The allocation record: the `tessera.dev/allocation` pod annotation, encoded and checked.

The scheduler writes it before binding; the NRI plugin applies it; the scheduler rebuilds
its state from it. Its JSON is canonical (sorted keys, no spaces) so the same allocation
always encodes to the same string, and the integrity proof (HMAC-SHA256 with a key shared
by the scheduler and the node agents) covers every field, the pod UID and node included:
a pod's author cannot obtain devices by writing the annotation. Schema: docs/record.md.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any, Final

from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation, RdmaGrant, VfGrant
from tessera.boundedjson import JsonLimitError, loads
from tessera.errors import IntegrityError, RecordError, RecordMismatchError
from tessera.model import MAX_DEVICE_NUMBER, MAX_GPU_MEMORY_MIB, MAX_NAME_CHARS, normalize_bus_id
from tessera.resources import UNITS_PER_DEVICE

SCHEMA_VERSION = 1
MAX_RECORD_BYTES: Final = 64 * 1024
"""Far above any real record (a 16-GPU pod is under 4 KiB); refuses absurd annotations."""
MAX_RECORD_DEPTH: Final = 8
"""Nesting of a record: record > containers > container > rdma > NIC > vfs > VF is 7 deep;
anything deeper is not a record (and must not reach a recursive parser)."""
MAX_HOST_AMOUNT: Final = 2**63 - 1
"""cpuMilli and memoryMiB: the scheduler keeps them in int64 columns."""
MAC_ALGORITHM = "HMAC-SHA256"
MIN_KEY_BYTES = 16


class Keyring:
    """Integrity keys by id. The first key signs; every key verifies (for rotation)."""

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        if not keys:
            raise ValueError("a keyring needs at least one key")
        for key_id, key in keys.items():
            if len(key) < MIN_KEY_BYTES:
                raise ValueError(f"integrity key {key_id!r} is shorter than {MIN_KEY_BYTES} bytes")
        self._keys = dict(keys)
        self.signing_id = next(iter(self._keys))

    @classmethod
    def single(cls, key: bytes, key_id: str = "default") -> Keyring:
        return cls({key_id: key})

    def key(self, key_id: str) -> bytes | None:
        return self._keys.get(key_id)

    def sign(self, body: bytes) -> str:
        return _mac(self._keys[self.signing_id], body)


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


def encode(alloc: PodAllocation, keyring: Keyring | None = None) -> str:
    """The annotation value. With a keyring the record carries its integrity proof."""
    doc = to_document(alloc)
    if keyring is not None:
        doc["integrity"] = {
            "alg": MAC_ALGORITHM,
            "keyId": keyring.signing_id,
            "mac": keyring.sign(_canonical(doc)),
        }
    return _canonical(doc).decode()


# --- decoding --------------------------------------------------------------------------------


def decode(
    text: str | bytes,
    keyring: Keyring | None = None,
    *,
    require_integrity: bool | None = None,
    pod_uid: str | None = None,
    node: str | None = None,
    namespace: str | None = None,
    name: str | None = None,
) -> PodAllocation:
    """Parse and validate a record. Raises RecordError (IntegrityError for the proof).

    With a keyring the proof must be present and verify (unless `require_integrity` is
    False). `pod_uid`, `node`, `namespace` and `name`, when given, must match what the
    record names: a record copied from another pod or node is refused (RecordMismatchError).
    """
    if not isinstance(text, str | bytes):
        raise RecordError(f"record: expected text, got {type(text).__name__}")
    try:
        doc = loads(text, what="record", max_bytes=MAX_RECORD_BYTES, max_depth=MAX_RECORD_DEPTH)
    except JsonLimitError as exc:
        raise RecordError(str(exc)) from None
    if not isinstance(doc, dict):
        raise RecordError("record must be a JSON object")
    version = doc.get("v")
    if version != SCHEMA_VERSION:
        raise RecordError(
            f"record.v: unsupported record schema version {_short(version)} "
            f"(this build reads {SCHEMA_VERSION})"
        )

    integrity = doc.pop("integrity", None)
    must_verify = keyring is not None if require_integrity is None else require_integrity
    if must_verify:
        _verify(doc, integrity, keyring)

    alloc = _parse(doc)
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


def _verify(doc: dict[str, Any], integrity: Any, keyring: Keyring | None) -> None:
    if keyring is None:
        raise IntegrityError("record integrity is required but no integrity key is configured")
    if integrity is None:
        raise IntegrityError("record carries no integrity proof")
    if not isinstance(integrity, dict) or set(integrity) != {"alg", "keyId", "mac"}:
        raise IntegrityError("record.integrity: must be {alg, keyId, mac}")
    if not all(isinstance(v, str) for v in integrity.values()):
        raise IntegrityError("record.integrity: alg, keyId and mac must be strings")
    if integrity["alg"] != MAC_ALGORITHM:
        raise IntegrityError(f"record.integrity.alg: unsupported {_short(integrity['alg'])}")
    key = keyring.key(integrity["keyId"])
    if key is None:
        raise IntegrityError(f"record.integrity.keyId: unknown key id {_short(integrity['keyId'])}")
    expected = _mac(key, _canonical(doc)).encode()
    if not hmac.compare_digest(expected, integrity["mac"].encode()):
        raise IntegrityError("record integrity proof does not verify (forged or altered record)")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Fields:
    """Strict field reader: exact key sets, exact types, paths in every message."""

    def __init__(self, doc: Any, path: str, required: set[str], optional: set[str]) -> None:
        if not isinstance(doc, dict):
            raise RecordError(f"{path}: expected an object")
        unknown = set(doc) - required - optional
        if unknown:
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


def _parse(doc: dict[str, Any]) -> PodAllocation:
    f = _Fields(
        doc,
        "record",
        {"v", "podUID", "namespace", "pod", "node", "containers"},
        {"policy", "cpuMilli", "memoryMiB"},
    )
    containers = tuple(
        _parse_container(c, f"record.containers[{i}]") for i, c in enumerate(f.items("containers"))
    )
    names = [c.name for c in containers]
    if len(set(names)) != len(names):
        raise RecordError("record.containers: duplicate container name")
    for c in containers:
        if c.reuses and (c.reuses not in names or c.reuses == c.name):
            raise RecordError(f"record: container {c.name!r} reuses unknown container {c.reuses!r}")
    return PodAllocation(
        pod_uid=f.text("podUID", nonempty=True),
        namespace=f.text("namespace", nonempty=True),
        name=f.text("pod", nonempty=True),
        node=f.text("node", nonempty=True),
        containers=containers,
        policy=f.text("policy", default=""),
        cpu_milli=f.number("cpuMilli", MAX_HOST_AMOUNT, default=0),
        memory_mib=f.number("memoryMiB", MAX_HOST_AMOUNT, default=0),
    )


def _parse_container(doc: Any, path: str) -> ContainerAllocation:
    f = _Fields(doc, path, {"name"}, {"gpus", "rdma", "init", "reuses"})
    gpus = []
    for i, g in enumerate(f.items("gpus")):
        gf = _Fields(g, f"{path}.gpus[{i}]", {"uuid", "index", "minor", "core", "memoryMiB"}, set())
        gpus.append(
            GpuGrant(
                uuid=gf.text("uuid", nonempty=True),
                index=gf.number("index", MAX_DEVICE_NUMBER),
                minor=gf.number("minor", MAX_DEVICE_NUMBER),
                core=gf.number("core", UNITS_PER_DEVICE),
                memory_mib=gf.number("memoryMiB", MAX_GPU_MEMORY_MIB),
            )
        )
    if len({g.uuid for g in gpus}) != len(gpus):
        raise RecordError(f"{path}.gpus: the same GPU is listed twice")
    rdma = [_parse_rdma(r, f"{path}.rdma[{i}]") for i, r in enumerate(f.items("rdma"))]
    init = doc.get("init", False)
    if not isinstance(init, bool):
        raise RecordError(f"{path}.init: expected true or false")
    return ContainerAllocation(
        name=f.text("name", nonempty=True),
        gpus=tuple(gpus),
        rdma=tuple(rdma),
        init=init,
        reuses=f.text("reuses", default=""),
    )


def _parse_rdma(doc: Any, path: str) -> RdmaGrant:
    f = _Fields(doc, path, {"pciBusId", "ibdev", "uverbsMinor", "share"}, {"netdev", "vfs"})
    vfs = []
    for i, v in enumerate(f.items("vfs")):
        vf = _Fields(v, f"{path}.vfs[{i}]", {"pciBusId", "ibdev", "uverbsMinor"}, {"netdev"})
        vfs.append(
            VfGrant(
                vf.bus("pciBusId"),
                vf.text("ibdev", nonempty=True),
                vf.number("uverbsMinor", MAX_DEVICE_NUMBER),
                vf.text("netdev", default=""),
            )
        )
    return RdmaGrant(
        pci_bus_id=f.bus("pciBusId"),
        ibdev=f.text("ibdev", nonempty=True),
        uverbs_minor=f.number("uverbsMinor", MAX_DEVICE_NUMBER),
        share=f.number("share", UNITS_PER_DEVICE, lo=1),
        vfs=tuple(vfs),
        netdev=f.text("netdev", default=""),
    )
