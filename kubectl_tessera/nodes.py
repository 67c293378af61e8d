"""`kubectl tessera nodes`: per node, its GPUs, what is allocated, whether it takes pods.

Devices and the GPU isolation layer come from the NodeDevices `spec` (the node agent's
inventory); allocation, fencing and the reason a node takes no pods from
`status.allocation`, which tessera-scheduler writes; a node whose layer is down takes no new
GPU share, for the reason the scheduler gives (`tessera.isolation.share_refusal`); the
heartbeat from the node agent's Lease, and from the usage reading on it what no tessera
container owns on each GPU (host processes, pods of no tessera record, the MPS server):
`kubectl tessera pods` sets the rest beside each container's grant.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kubectl_tessera.objects import (
    LEASES_UNREADABLE,
    age,
    heartbeat_leases,
    integer,
    mib,
    name_of,
    parse_time,
    text,
    usage_of,
)
from kubectl_tessera.table import clean, render
from tessera.errors import TesseraError
from tessera.isolation import share_refusal
from tessera.model import NodeInventory
from tessera.pod_fields import section
from tessera.resources import DEFAULT_HEARTBEAT_NAMESPACE, HEARTBEAT_LEASE_PREFIX

HEARTBEAT_GRACE_S = 5.0
"""The scheduler's default `--heartbeat-grace`: a Lease older than its duration plus this
is stale (the node takes no new tessera pods)."""


@dataclass
class NodeRow:
    node: str
    state: str
    """ready, fenced, unusable, invalid (inventory does not parse), unknown (no status) or
    missing (a Node labeled for the node agent without NodeDevices)."""
    gpus: str = ""
    gpu_count: int = 0
    healthy_gpus: int = 0
    rdma: int = 0
    layer: str = "-"
    """The isolation layer in a few words (`NodeIsolation.brief`); `-` when not reported."""
    isolation: dict[str, Any] | None = None
    """The layer as the agent reports it (NodeDevices spec.isolation); None: unknown."""
    share_problem: str = ""
    """Why the node takes no new GPU share ("" when it takes them)."""
    core_used: int | None = None
    core_free: int | None = None
    memory_used_mib: int | None = None
    memory_free_mib: int | None = None
    heartbeat_age_s: float | None = None
    heartbeat: str = "missing"
    reason: str = ""
    fenced_by: list[dict[str, str]] = field(default_factory=list)
    stranded: list[dict[str, str]] = field(default_factory=list)
    """Pods holding a device the node now reports unhealthy or no longer lists:
    {pod, container, device, state}."""
    unattributed: list[dict[str, Any]] = field(default_factory=list)
    """Per GPU and owner, use that belongs to no tessera container: {index (None: a GPU
    the inventory lacks), uuid, owner, memoryMiB, processes}."""
    usage_observed: str = ""
    """When the node agent read it ("" when unknown)."""
    usage_unknown: str = ""
    """Why it is unknown ("" when known, or when the inventory does not parse)."""

    def unattributed_cell(self) -> str:
        """`-` unknown, `none` read and empty."""
        if not self.usage_observed:
            return "-"
        if not self.unattributed:
            return "none"
        return ", ".join(
            f"{'?' if u['index'] is None else u['index']}:{u['owner']} {mib(u['memoryMiB'])}"
            for u in self.unattributed
        )

    def cells(self) -> list[str]:
        def pair(used: int | None, free: int | None, unit: str) -> str:
            if used is None or free is None:
                return "-"
            if unit == "%":
                return f"{used}%/{free}%"
            return f"{mib(used)}/{mib(free)}"

        return [
            self.node,
            self.state,
            self.gpus or "-",
            f"{self.healthy_gpus}/{self.gpu_count}",
            pair(self.core_used, self.core_free, "%"),
            pair(self.memory_used_mib, self.memory_free_mib, "MiB"),
            str(self.rdma),
            self.layer,
            self.heartbeat,
            self.unattributed_cell(),
            self.reason or "-",
        ]


HEADERS = [
    "NODE",
    "STATE",
    "GPUS",
    "HEALTHY",
    "CORE USED/FREE",
    "MEMORY USED/FREE",
    "RDMA",
    "LAYER",
    "HEARTBEAT",
    "NOT TESSERA (INDEX:OWNER MEMORY)",
    "REASON",
]


def _models(inventory: NodeInventory) -> str:
    counts = Counter(g.model for g in inventory.gpus)
    return ", ".join(f"{n}x {model}" for model, n in sorted(counts.items()))


def _allocation(row: NodeRow, status: Mapping[str, Any]) -> None:
    """Sums of the scheduler's per-GPU figures; a malformed entry makes the sums unknown."""
    gpus = status.get("gpus")
    if not isinstance(gpus, list):
        return
    totals = [0, 0, 0, 0]
    for gpu in gpus:
        core, memory = section(gpu, "core"), section(gpu, "memoryMiB")
        values = [
            integer(core.get("used")),
            integer(core.get("free")),
            integer(memory.get("used")),
            integer(memory.get("free")),
        ]
        if any(v is None for v in values):
            return
        totals = [t + (v or 0) for t, v in zip(totals, values, strict=True)]
    row.core_used, row.core_free, row.memory_used_mib, row.memory_free_mib = totals


STRANDED_SHOWN = 3
"""Pods on bad devices named in the REASON cell (all of them in -o json)."""


def _stranded(row: NodeRow, entries: object) -> None:
    row.stranded = [
        {
            "pod": f"{text(e.get('namespace'))}/{text(e.get('name'))}",
            "container": text(e.get("container")),
            "device": text(e.get("device")),
            "state": text(e.get("state")),
        }
        for e in (entries if isinstance(entries, list) else [])
        if isinstance(e, Mapping)
    ]
    if not row.stranded:
        return
    named = ", ".join(
        f"{s['pod']} ({s['device']} {s['state']})" for s in row.stranded[:STRANDED_SHOWN]
    )
    more = len(row.stranded) - STRANDED_SHOWN
    note = f"pods on unhealthy or missing devices: {named}" + (
        f" and {more} more" if more > 0 else ""
    )
    row.reason = f"{row.reason}; {note}" if row.reason else note


def _unattributed(
    row: NodeRow, inventory: NodeInventory, lease: Mapping[str, Any] | None, readable: bool
) -> None:
    """What no tessera container owns per GPU, from the agent's usage reading (hostile
    input: what does not decode leaves the use unknown, with the reason)."""
    usage = usage_of(lease) if readable else LEASES_UNREADABLE
    if isinstance(usage, str):
        row.usage_unknown = usage
        return
    row.usage_observed = usage.observed
    index = {g.uuid: g.index for g in inventory.gpus}
    row.unattributed = [
        {
            "index": index.get(o.gpu),
            "uuid": o.gpu,
            "owner": o.owner,
            "memoryMiB": o.memory_mib,
            "processes": o.processes,
        }
        for o in usage.unattributed
    ]
    # by GPU as the inventory numbers them (the agent writes the largest first)
    row.unattributed.sort(key=lambda u: (u["index"] is None, u["index"] or 0, u["owner"]))


def _heartbeat(row: NodeRow, lease: Mapping[str, Any] | None, now: float | None, where: str) -> str:
    """Fills the heartbeat cells; returns a problem when the Lease is missing or stale.
    `now` None: the Leases could not be read."""
    if now is None:
        row.heartbeat = "?"
        return ""
    if lease is None:
        row.heartbeat = "missing"
        return f"node agent heartbeat Lease {where} is missing"
    spec = section(lease, "spec")
    renewed = parse_time(spec.get("renewTime"))
    if renewed is None:
        row.heartbeat = "unknown"
        return f"node agent heartbeat Lease {where} has no renewTime"
    row.heartbeat_age_s = max(0.0, now - renewed)
    row.heartbeat = age(row.heartbeat_age_s)
    duration = integer(spec.get("leaseDurationSeconds")) or 0
    if row.heartbeat_age_s > duration + HEARTBEAT_GRACE_S:
        row.heartbeat += " (stale)"
        return (
            f"node agent is silent: heartbeat Lease {where} not renewed for "
            f"{row.heartbeat_age_s:.0f}s (lease duration {duration}s)"
        )
    return ""


def node_row(
    obj: Mapping[str, Any],
    lease: Mapping[str, Any] | None,
    now: float | None,
    lease_namespace: str = DEFAULT_HEARTBEAT_NAMESPACE,
) -> NodeRow:
    """One node's row; `now` None when the Leases could not be read."""
    name = name_of(obj)
    where = f"{lease_namespace}/{HEARTBEAT_LEASE_PREFIX}{name}"
    row = NodeRow(node=name, state="unknown")
    try:
        spec = obj.get("spec")
        if not isinstance(spec, Mapping):
            raise ValueError("spec is missing or not an object")
        inventory = NodeInventory.from_dict(spec, source=f"nodedevices/{name}", node_name=name)
    except (TesseraError, ValueError, TypeError) as exc:
        row.state = "invalid"
        row.reason = f"inventory does not parse: {exc}"
        _heartbeat(row, lease, now, where)
        return row
    row.gpus = _models(inventory)
    row.gpu_count = len(inventory.gpus)
    row.healthy_gpus = sum(1 for g in inventory.gpus if g.healthy)
    row.rdma = len(inventory.nics)
    if inventory.isolation is not None:
        row.layer = inventory.isolation.brief()
        row.isolation = inventory.isolation.to_dict()
        row.share_problem = share_refusal(inventory.isolation) or ""
    silent = _heartbeat(row, lease, now, where)
    _unattributed(row, inventory, lease, now is not None)

    status = section(section(obj, "status"), "allocation")
    fenced = status.get("fenced")
    row.fenced_by = [
        {"pod": text(f.get("pod")), "uid": text(f.get("uid")), "problem": text(f.get("problem"))}
        for f in (fenced if isinstance(fenced, list) else [])
        if isinstance(f, Mapping)
    ]
    problem = text(status.get("problem"))
    if not status:
        row.reason = "no allocation status yet (is tessera-scheduler running?)"
    elif row.fenced_by or problem.startswith("node is fenced"):
        row.state = "fenced"
    elif status.get("usable") is False:
        row.state = "unusable"
    elif status.get("usable") is True:
        row.state = "ready"
    if status:
        _allocation(row, status)
        row.reason = problem
        _stranded(row, status.get("stranded"))
    if silent and row.state in ("ready", "unknown"):
        # the scheduler writes status only on changes: a stale Lease may be newer news
        row.state = "unusable"
        row.reason = silent
    row.reason = row.reason or silent
    if row.share_problem:
        note = f"takes no GPU shares: {row.share_problem}"
        row.reason = f"{row.reason}; {note}" if row.reason else note
    return row


NODE_AGENT_LABEL = "tessera.dev/node-agent"
"""The label the shipped node agent DaemonSet selects (deploy/deviceplugin/daemonset.yaml)."""


def rows(
    nodedevices: Iterable[Mapping[str, Any]],
    leases: Iterable[Mapping[str, Any]] | None,
    now: float,
    lease_namespace: str = DEFAULT_HEARTBEAT_NAMESPACE,
    node_objects: Iterable[Mapping[str, Any]] = (),
) -> list[NodeRow]:
    """One row per NodeDevices object, by node name, plus one per Node labeled for the node
    agent that has none. `leases` None: they could not be read."""
    by_node = heartbeat_leases(leases)
    clock = None if leases is None else now
    result = [
        node_row(obj, by_node.get(name_of(obj)), clock, lease_namespace) for obj in nodedevices
    ]
    published = {r.node for r in result}
    for node in node_objects:
        name = name_of(node)
        labels = section(section(node, "metadata"), "labels")
        if name and name not in published and labels.get(NODE_AGENT_LABEL) == "true":
            row = NodeRow(node=name, state="missing")
            row.reason = (
                f"labeled {NODE_AGENT_LABEL}=true but has no NodeDevices: is the node agent "
                "running there?"
            )
            _heartbeat(
                row, by_node.get(name), clock, f"{lease_namespace}/{HEARTBEAT_LEASE_PREFIX}{name}"
            )
            result.append(row)
    return sorted(result, key=lambda r: r.node)


def render_rows(items: list[NodeRow]) -> str:
    return render(HEADERS, [r.cells() for r in items])


def render_node(row: NodeRow) -> str:
    """One node (`kubectl tessera nodes NODE`): its row, then what does not fit in a cell:
    the isolation layer in full and why the node takes no GPU shares."""
    lines = [render_rows([row])]
    iso = row.isolation
    if iso is None:
        lines.append("Isolation layer: not reported (the scheduler places shares as before)")
    else:
        known = ", ".join(f"{key} {iso[key]}" for key in ("version", "commit") if iso.get(key))
        state = "up" if iso.get("up") else f"down: {iso.get('reason') or 'no reason given'}"
        lines.append(
            f"Isolation layer: {iso.get('layer')}{f' ({known})' if known else ''}, {state}"
        )
    if row.share_problem:
        lines.append(f"Takes no new GPU shares: {row.share_problem}")
    return "\n".join(clean(line) if i else line for i, line in enumerate(lines))


def as_json(items: list[NodeRow]) -> list[dict[str, Any]]:
    return [asdict(r) for r in items]
