"""`kubectl tessera explain POD`: why a pending pod fits nowhere, node by node.

The cluster state is rebuilt the way tessera-scheduler rebuilds it (NodeDevices for the
devices; the records of bound, unfinished pods, oldest first, for what is taken) and the
pod's request is evaluated with the scheduler's own core (`tessera.request.parse_pod`,
`tessera.cluster_decision.Decider`). Two differences, said in the output: records are decoded
without verifying their integrity proof, and only tessera's devices are judged (taints,
CPU, memory and affinity are kube-scheduler's business; `kubectl describe pod` shows them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kubectl_tessera.gangs import GangRow
from kubectl_tessera.nodes import node_row
from kubectl_tessera.objects import holds_devices, name_of, namespace_of, node_of, text, uid_of
from kubectl_tessera.pods import decode_unverified
from kubectl_tessera.table import clean, render
from tessera.cluster_decision import Decider
from tessera.cluster_state import ClusterState
from tessera.errors import RecordError, RequestError, StateError, TesseraError
from tessera.explain import NodeVerdict, asks, nearest, verdicts
from tessera.model import NodeInventory
from tessera.pod_fields import section
from tessera.policy_registry import make_policies
from tessera.request import PodRequest, parse_pod
from tessera.resources import (
    DEFAULT_HEARTBEAT_NAMESPACE,
    DEFAULT_NRI_PLUGIN_NAME,
    HEARTBEAT_LEASE_PREFIX,
)

NOTE = (
    "estimated from the NodeDevices and allocation records read now (records not verified); "
    "only tessera devices are judged, see `kubectl describe pod` for kube-scheduler's reasons"
)


@dataclass
class Explanation:
    pod: str
    summary: str
    """One line: what the pod asks for, or why there is nothing to evaluate."""
    containers: list[str] = field(default_factory=list)
    nodes: list[NodeVerdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    nearest: list[str] = field(default_factory=list)
    """The nodes nearest to taking the pod (tessera.explain.nearest), with their reasons."""
    gang: GangRow | None = None
    """The gang the pod waits for, when it is a member (placed with it or not at all)."""


def _order(pod: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """The scheduler's apply order: oldest first, then by UID."""
    created = text(section(pod, "metadata").get("creationTimestamp"))
    return (created, uid_of(pod), namespace_of(pod), name_of(pod))


def explain(
    pod: Mapping[str, Any],
    nodedevices: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    leases: Iterable[Mapping[str, Any]] | None,
    now: float,
    *,
    policy: str,
    nvidia_gpu: bool = False,
    nri_plugin: str | None = DEFAULT_NRI_PLUGIN_NAME,
    lease_namespace: str = DEFAULT_HEARTBEAT_NAMESPACE,
    gang: GangRow | None = None,
) -> Explanation:
    key = f"{namespace_of(pod)}/{name_of(pod)}"
    if node_of(pod):
        return Explanation(key, f"the pod is already bound to node {node_of(pod)}")
    try:
        # what the scheduler's filter parses, with the same switches
        request = parse_pod(pod, nvidia_gpu_enabled=nvidia_gpu, nri_plugin=nri_plugin)
    except RequestError as exc:
        return Explanation(
            key,
            f"the request breaks a rule, so it fits no node: {exc}",
            notes=["fix the pod's resources or tessera.dev/ annotations (docs/resources.md)"],
        )
    result = _explain(key, request, nodedevices, pods, leases, now, policy, lease_namespace)
    if gang is not None:
        result.gang = gang
        result.notes.insert(0, GANG_NOTE)
    return result


GANG_NOTE = (
    "a gang is placed whole or not at all: the nodes below judge this member alone, "
    "the gang's reason above is what holds it"
)


def gang_line(gang: GangRow) -> str:
    want = "no usable PodGroup" if gang.min_member is None else f"minMember {gang.min_member}"
    return (
        f"Waits for its gang {gang.key} ({gang.state}; {gang.pending} pending, "
        f"{gang.bound} bound, {want}): {gang.reason.removeprefix(f'gang {gang.key}: ')}"
    )


def _explain(
    key: str,
    request: PodRequest,
    nodedevices: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    leases: Iterable[Mapping[str, Any]] | None,
    now: float,
    policy: str,
    lease_namespace: str,
) -> Explanation:
    if not request.wants_devices:
        return Explanation(key, "the pod asks for no tessera devices; tessera does not hold it")

    result = Explanation(
        key,
        f"{len(request.containers)} container(s) ask for tessera devices",
        containers=asks(request),
        notes=[NOTE],
    )
    objects = {name_of(o): o for o in nodedevices if name_of(o)}
    state = ClusterState()
    broken: dict[str, str] = {}
    for name, obj in sorted(objects.items()):
        try:
            spec = obj.get("spec")
            if not isinstance(spec, Mapping):
                raise ValueError("spec is missing or not an object")
            state.set_node(
                NodeInventory.from_dict(spec, source=f"nodedevices/{name}", node_name=name)
            )
        except (TesseraError, ValueError, TypeError, OverflowError) as exc:
            broken[name] = f"device inventory does not parse: {exc}"

    held = sorted((p for p in pods if holds_devices(p) and uid_of(p) != request.uid), key=_order)
    skipped = 0
    for other in held:
        try:
            state.add(decode_unverified(other))
        except (RecordError, StateError):
            skipped += 1
    if skipped:
        result.notes.append(
            f"{skipped} bound pod(s) carry a record that does not decode or conflicts; their "
            "devices are unknown (the scheduler fences their nodes): `kubectl tessera pods`"
        )

    by_node = {
        name_of(lease)[len(HEARTBEAT_LEASE_PREFIX) :]: lease
        for lease in leases or ()
        if name_of(lease).startswith(HEARTBEAT_LEASE_PREFIX)
    }
    policies = make_policies()
    if policy not in policies:
        raise ValueError(f"unknown placement policy {policy!r} (one of {', '.join(policies)})")
    decider = Decider(state, policies, policy)
    evaluation = decider.evaluate(request, sorted(state.nodes))
    closed = dict(broken)
    for name in sorted(objects):
        if name in broken:
            continue
        row = node_row(
            objects[name], by_node.get(name), None if leases is None else now, lease_namespace
        )
        if row.state in ("fenced", "unusable"):
            closed[name] = row.reason
    result.nodes = verdicts(evaluation, sorted(objects), closed)
    result.nearest = [
        f"{v.node} ({100 * score:.0f}% of the ask free): {v.text}"
        for v, score in nearest(result.nodes, decider.index, request)
    ]
    if not objects:
        result.notes.append("no NodeDevices objects: is the tessera node agent running?")
    return result


def render_explanation(e: Explanation) -> str:
    lines = [clean(f"Pod {e.pod}: {e.summary}")]
    if e.gang is not None:
        lines.append(clean(gang_line(e.gang)))
    lines += ["  " + clean(c) for c in e.containers]
    lines += [clean(f"# {n}") for n in e.notes]
    if e.nearest:
        lines.append("# nearest to fitting (most of the ask free; an estimate):")
        lines += ["  " + clean(n) for n in e.nearest]
    if e.nodes:
        rows = [[v.node, "yes" if v.fits else "no", v.text] for v in e.nodes]
        lines.append(render(["NODE", "FITS", "REASON"], rows))
    return "\n".join(lines)


def as_json(e: Explanation) -> dict[str, Any]:
    doc = asdict(e)
    for node, verdict in zip(doc["nodes"], e.nodes, strict=True):
        node["reason"] = verdict.text
    return doc
