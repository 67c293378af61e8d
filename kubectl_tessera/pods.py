"""`kubectl tessera pods`: pods holding tessera devices and what each container got.

The allocation records are decoded WITHOUT verifying their integrity proof (this tool has
no key, and should not): what it prints is what the annotation says, for display only.
The scheduler and the node hook verify every record before they act on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kubectl_tessera.objects import (
    FINISHED_PHASES,
    holds_devices,
    name_of,
    namespace_of,
    node_of,
    phase_of,
    record_of,
)
from kubectl_tessera.objects import uid_of as pod_uid
from kubectl_tessera.table import render
from tessera.allocation import ContainerAllocation, PodAllocation
from tessera.errors import RecordError
from tessera.pod_fields import requests_devices
from tessera.record import decode

UNVERIFIED_NOTE = "allocation records shown as written, integrity NOT verified (display only)"
UUID_PREFIX_CHARS = 12
"""'GPU-' and 8 hex digits, to match against nvidia-smi at a glance; the index says which
GPU of the node it is, `-o json` has the whole UUID."""


@dataclass
class PodRow:
    namespace: str
    name: str
    node: str
    container: str = ""
    gpus: list[dict[str, Any]] = field(default_factory=list)
    rdma: list[dict[str, Any]] = field(default_factory=list)
    invalid: str = ""

    def cells(self) -> list[str]:
        if self.invalid:
            return [self.namespace, self.name, self.node, "-", "-", f"invalid: {self.invalid}"]
        gpus = ", ".join(
            f"{g['index']}:{g['uuid'][:UUID_PREFIX_CHARS]} {g['core']}% {_mib(g['memoryMiB'])}"
            for g in self.gpus
        )
        rdma = ", ".join(
            f"{r['ibdev']} {r['share']}%" + (f" +{len(r['vfs'])}vf" if r["vfs"] else "")
            for r in self.rdma
        )
        return [self.namespace, self.name, self.node, self.container, rdma or "-", gpus or "-"]


HEADERS = ["NAMESPACE", "NAME", "NODE", "CONTAINER", "RDMA", "GPUS (INDEX:UUID CORE MEMORY)"]


def _mib(value: int) -> str:
    return f"{value / 1024:.1f}GiB" if value >= 1024 else f"{value}MiB"


def _container_row(pod: PodRow, c: ContainerAllocation) -> PodRow:
    return PodRow(
        namespace=pod.namespace,
        name=pod.name,
        node=pod.node,
        container=c.name + (" (init)" if c.init else ""),
        gpus=[
            {"index": g.index, "uuid": g.uuid, "core": g.core, "memoryMiB": g.memory_mib}
            for g in c.gpus
        ],
        rdma=[
            {
                "ibdev": r.ibdev,
                "pciBusId": r.pci_bus_id,
                "share": r.share,
                "vfs": [v.ibdev for v in r.vfs],
            }
            for r in c.rdma
        ],
    )


def decode_unverified(pod: Mapping[str, Any]) -> PodAllocation:
    """The pod's record, checked against the pod it sits on (UID, node, name) but not for
    its integrity proof. Raises RecordError."""
    text = record_of(pod)
    if text is None:
        raise RecordError("no allocation record")
    return decode(
        text,
        None,
        require_integrity=False,
        pod_uid=pod_uid(pod),
        node=node_of(pod),
        namespace=namespace_of(pod),
        name=name_of(pod),
    )


MISSING_RECORD = "asks for tessera devices but carries no allocation record"


def running_unaccounted(pod: Mapping[str, Any]) -> bool:
    """Bound, unfinished, asking for tessera devices: with no record, what its containers
    use is unknown (the scheduler fences its node)."""
    return bool(node_of(pod)) and phase_of(pod) not in FINISHED_PHASES and requests_devices(pod)


def rows(pods: Iterable[Mapping[str, Any]]) -> list[PodRow]:
    """One row per container holding devices (bound, unfinished pods with a record); a
    record that does not decode, or a missing one on a pod that asks for devices, is one
    `invalid` row for its pod."""
    result = []
    for pod in pods:
        base = PodRow(namespace_of(pod), name_of(pod), node_of(pod))
        if record_of(pod) is None and running_unaccounted(pod):
            base.invalid = MISSING_RECORD
            result.append(base)
            continue
        if not holds_devices(pod):
            continue
        try:
            alloc = decode_unverified(pod)
        except RecordError as exc:
            base.invalid = str(exc)
            result.append(base)
            continue
        held = [c for c in alloc.containers if c.gpus or c.rdma]
        result.extend(_container_row(base, c) for c in held)
        if not held:
            result.append(base)
    return sorted(result, key=lambda r: (r.namespace, r.name, r.container))


def render_rows(items: list[PodRow]) -> str:
    return f"# {UNVERIFIED_NOTE}\n" + render(HEADERS, [r.cells() for r in items])


def as_json(items: list[PodRow]) -> dict[str, Any]:
    return {"note": UNVERIFIED_NOTE, "pods": [asdict(r) for r in items]}
