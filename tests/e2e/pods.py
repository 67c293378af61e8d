"""Pods for the e2e suite and the checks on what tessera recorded for them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from kube_edge.client import KubeClient, pod_path
from tessera import resources as rn
from tessera.allocation import PodAllocation
from tessera.record import Keyring, decode

NS = "default"


def container(name: str, limits: Mapping[str, str], **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name,
        "image": "busybox",
        "command": ["sleep", "3600"],
        "resources": {"limits": dict(limits), "requests": dict(limits)},
    }
    c.update(extra)
    return c


def pod(
    name: str,
    limits: Mapping[str, str] | None = None,
    *,
    annotations: Mapping[str, str] | None = None,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    priority_class: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": containers or [container("main", limits or {})],
        "terminationGracePeriodSeconds": 0,
        "hostNetwork": True,
    }
    if init:
        spec["initContainers"] = init
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}),
        },
        "spec": spec,
    }


def bound(client: KubeClient, name: str) -> dict[str, Any] | None:
    obj = client.get(pod_path(NS, name))
    return obj if obj["spec"].get("nodeName") else None


def record(obj: Mapping[str, Any], keyring: Keyring) -> PodAllocation:
    """The pod's allocation record, verified as the node side verifies it."""
    meta = obj["metadata"]
    text = (meta.get("annotations") or {})[rn.ALLOCATION_ANNOTATION]
    return decode(
        text,
        keyring,
        require_integrity=True,
        pod_uid=meta["uid"],
        node=obj["spec"]["nodeName"],
        namespace=meta["namespace"],
        name=meta["name"],
    )


def pending_reason(client: KubeClient, name: str) -> str:
    """The PodScheduled=False message of an unbound pod ('' while there is none)."""
    obj = client.get(pod_path(NS, name))
    assert not obj["spec"].get("nodeName"), f"{name} was bound to {obj['spec']['nodeName']}"
    return unschedulable_message(obj)


def unschedulable_message(obj: Mapping[str, Any]) -> str:
    """The PodScheduled=False message ('' while there is none)."""
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or "")
    return ""


def delete_now(client: KubeClient, name: str) -> None:
    """No kubelet confirms termination here: delete with grace 0, as a force delete does."""
    client.request(
        "DELETE",
        pod_path(NS, name),
        body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
    )


def ledger(allocs: Iterable[PodAllocation]) -> tuple[dict[Any, int], dict[Any, int], list[str]]:
    """Per (node, GPU): compute percent and memory MiB handed out; per (node, NIC): percent.
    Also the whole-device conflicts: a VF or a whole GPU given twice."""
    core: dict[Any, int] = defaultdict(int)
    nic: dict[Any, int] = defaultdict(int)
    vfs: dict[Any, str] = {}
    conflicts: list[str] = []
    memory: dict[Any, int] = defaultdict(int)
    for alloc in allocs:
        for c in alloc.containers:
            if not c.counted:
                continue
            for g in c.gpus:
                core[(alloc.node, g.uuid)] += g.core
                memory[(alloc.node, g.uuid)] += g.memory_mib
            for r in c.rdma:
                nic[(alloc.node, r.pci_bus_id)] += r.share
                for vf in r.vfs:
                    key = (alloc.node, vf.pci_bus_id)
                    if key in vfs:
                        conflicts.append(f"VF {key} given to {vfs[key]} and {alloc.name}")
                    vfs[key] = alloc.name
    for key, used in core.items():
        if used > 100:
            conflicts.append(f"GPU {key}: {used}% compute handed out")
    for key, used in nic.items():
        if used > 100:
            conflicts.append(f"NIC {key}: {used}% handed out")
    return core, memory, conflicts
