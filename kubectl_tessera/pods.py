"""`kubectl tessera pods`: pods holding tessera devices, what each container got, and
beside it what the container uses (memory, SM %) as its node agent last read it.

The allocation records are decoded WITHOUT verifying their integrity proof (this tool has
no key, and should not): what it prints is what the annotation says, for display only.
The scheduler and the node hook verify every record before they act on it. Use comes
from the usage annotation on each node agent's heartbeat Lease (tessera.usage), decoded
once per node that a listed pod runs on; where it is missing or does not decode, that
node's use is unknown (`-`, the reason in `-o json`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kubectl_tessera.objects import (
    FINISHED_PHASES,
    LEASES_UNREADABLE,
    heartbeat_leases,
    holds_devices,
    mib,
    name_of,
    namespace_of,
    node_of,
    phase_of,
    record_of,
    usage_of,
)
from kubectl_tessera.objects import uid_of as pod_uid
from kubectl_tessera.table import render
from tessera.allocation import ContainerAllocation, PodAllocation
from tessera.errors import RecordError
from tessera.pod_fields import requests_devices
from tessera.record import decode
from tessera.usage import NodeUsage

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
    usage_observed: str = ""
    """When the node agent read the use shown ("" when unknown)."""
    usage_unknown: str = ""
    """Why the use is unknown ("" when known)."""

    def cells(self) -> list[str]:
        if self.invalid:
            return [self.namespace, self.name, self.node, *["-"] * 4, f"invalid: {self.invalid}"]
        gpus = ", ".join(
            f"{g['index']}:{g['uuid'][:UUID_PREFIX_CHARS]} {g['core']}% {mib(g['memoryMiB'])}"
            for g in self.gpus
        )
        rdma = ", ".join(
            f"{r['ibdev']} {r['share']}%" + (f" +{len(r['vfs'])}vf" if r["vfs"] else "")
            for r in self.rdma
        )
        memory, sm = _used_cells(self.gpus)
        return [
            *(self.namespace, self.name, self.node, self.container, rdma or "-"),
            *(memory, sm, gpus or "-"),
        ]


HEADERS = [
    *("NAMESPACE", "NAME", "NODE", "CONTAINER", "RDMA"),
    *("MEMORY USED/GRANTED", "SM USED", "GPUS (INDEX:UUID CORE MEMORY)"),
]


def _used_cells(gpus: list[dict[str, Any]]) -> tuple[str, str]:
    """Per GPU, as INDEX:figure in the GPUS column's order; `-` where unknown."""
    if not gpus or all(g["used"] is None for g in gpus):
        return "-", "-"
    memory, sm = [], []
    for g in gpus:
        used = g["used"] or {"memoryMiB": None, "smPercent": None}
        value, percent = used["memoryMiB"], used["smPercent"]
        memory.append(f"{g['index']}:{'-' if value is None else mib(value)}/{mib(g['memoryMiB'])}")
        sm.append(f"{g['index']}:{'-' if percent is None else f'{percent}%'}")
    return ", ".join(memory), ", ".join(sm)


def _used(
    usage: NodeUsage | str, uid: str, container: str, gpu: str
) -> dict[str, int | None] | None:
    """One container's use of one GPU: its rows added up; none (0) when the reading has no
    process of it there. Only rows of this pod UID and container count: use that belongs to
    no tessera container is never put on a pod (`kubectl tessera nodes` lists it)."""
    if isinstance(usage, str):
        return None
    rows = [c for c in usage.containers if (c.pod_uid, c.container, c.gpu) == (uid, container, gpu)]
    samples = [c.sm_percent for c in rows if c.sm_percent is not None]
    return {
        "memoryMiB": sum(c.memory_mib for c in rows),
        "smPercent": min(100, sum(samples)) if samples or not rows else None,
    }


def _container_row(pod: PodRow, c: ContainerAllocation, uid: str, usage: NodeUsage | str) -> PodRow:
    return PodRow(
        namespace=pod.namespace,
        name=pod.name,
        node=pod.node,
        container=c.name + (" (init)" if c.init else ""),
        gpus=[
            {
                "index": g.index,
                "uuid": g.uuid,
                "core": g.core,
                "memoryMiB": g.memory_mib,
                "used": _used(usage, uid, c.name, g.uuid),
            }
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
        usage_observed="" if isinstance(usage, str) else usage.observed,
        usage_unknown=usage if isinstance(usage, str) else "",
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


class _Readings:
    """Each node's usage reading, decoded on first ask (only nodes of listed pods)."""

    def __init__(self, leases: Iterable[Mapping[str, Any]] | None) -> None:
        self._leases = None if leases is None else heartbeat_leases(leases)
        self._decoded: dict[str, NodeUsage | str] = {}

    def of(self, node: str) -> NodeUsage | str:
        if self._leases is None:
            return LEASES_UNREADABLE
        if node not in self._decoded:
            self._decoded[node] = usage_of(self._leases.get(node))
        return self._decoded[node]


def rows(
    pods: Iterable[Mapping[str, Any]], leases: Iterable[Mapping[str, Any]] | None = ()
) -> list[PodRow]:
    """One row per container holding devices (bound, unfinished pods with a record); a
    record that does not decode, or a missing one on a pod that asks for devices, is one
    `invalid` row for its pod. Use comes from the heartbeat `leases` (None: they could
    not be read)."""
    readings = _Readings(leases)
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
        usage = readings.of(base.node)
        result.extend(_container_row(base, c, alloc.pod_uid, usage) for c in held)
        if not held:
            result.append(base)
    return sorted(result, key=lambda r: (r.namespace, r.name, r.container))


def render_rows(items: list[PodRow]) -> str:
    return f"# {UNVERIFIED_NOTE}\n" + render(HEADERS, [r.cells() for r in items])


def as_json(items: list[PodRow]) -> dict[str, Any]:
    return {"note": UNVERIFIED_NOTE, "pods": [asdict(r) for r in items]}
