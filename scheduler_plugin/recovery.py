"""The rebuild rule: which pods hold devices, judged from API objects alone.

A pod holds the devices its allocation record names exactly when
- it carries the record (`tessera.dev/allocation`),
- it is bound (`spec.nodeName` set) to the node the record names,
- it has not finished (phase Succeeded or Failed) and still exists (a deleted pod is gone
  from the list; a pod with a deletionTimestamp keeps its devices until it is gone,
  because its containers may still run during graceful termination),
- the record decodes and its integrity proof verifies for this pod's UID and node.

A pod with a record but no nodeName was interrupted between writing the record and
binding: it holds nothing, and its next bind overwrites the record. A record that fails to
decode or verify (forged by a user, corrupt, copied from another pod) never counts; the
pod is reported so an operator can see it.

Everything here is pure so that the running service and a rebuild after a restart apply
literally the same function.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.allocation import PodAllocation
from tessera.errors import RecordError, StateError
from tessera.model import NodeInventory
from tessera.record import Keyring, decode
from tessera.resources import ALLOCATION_ANNOTATION
from tessera.state import ClusterState

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class Holds:
    """The pod holds this allocation."""

    allocation: PodAllocation


@dataclass(frozen=True)
class Nothing:
    """The pod holds no tessera devices (and why, for the debug API)."""

    why: str


@dataclass(frozen=True)
class Invalid:
    """The pod carries a record that must not count."""

    problem: str


Verdict = Holds | Nothing | Invalid


def pod_identity(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    """(uid, namespace, name) of a pod dict."""
    meta = pod.get("metadata") or {}
    return (
        str(meta.get("uid") or ""),
        str(meta.get("namespace") or "default"),
        str(meta.get("name") or ""),
    )


def record_text(pod: Mapping[str, Any]) -> str | None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(ALLOCATION_ANNOTATION)
    return value if isinstance(value, str) else None


def is_finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in FINISHED_PHASES


def apply_order(pod: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """The order in which pods are accounted: oldest first, then by UID."""
    created = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
    return (created, *pod_identity(pod))


def judge(pod: Mapping[str, Any], keyring: Keyring | None) -> Verdict:
    """Apply the rebuild rule to one pod dict (see the module doc)."""
    text = record_text(pod)
    if text is None:
        return Nothing("no allocation record")
    if is_finished(pod):
        return Nothing("finished")
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return Nothing("record without a binding (interrupted bind)")
    uid, namespace, name = pod_identity(pod)
    try:
        alloc = decode(text, keyring, pod_uid=uid, node=str(node), namespace=namespace, name=name)
    except RecordError as exc:
        return Invalid(str(exc))
    return Holds(alloc)


@dataclass(frozen=True)
class Rebuilt:
    state: ClusterState
    invalid: dict[str, str]
    """Pod key -> why its record does not count (bad record or a conflicting one)."""


def rebuild(
    inventories: Iterable[NodeInventory],
    pods: Iterable[Mapping[str, Any]],
    keyring: Keyring | None,
) -> Rebuilt:
    """State from the cluster's objects alone. Pods are applied in (creation, uid) order so
    that two rebuilds from the same objects agree even on which of two conflicting records
    wins (a conflict means some record overcommits a device; the later pod loses)."""
    state = ClusterState()
    for inventory in inventories:
        state.set_node(inventory)
    invalid: dict[str, str] = {}
    ordered = sorted(pods, key=apply_order)
    for pod in ordered:
        verdict = judge(pod, keyring)
        _, namespace, name = pod_identity(pod)
        if isinstance(verdict, Invalid):
            invalid[f"{namespace}/{name}"] = verdict.problem
        elif isinstance(verdict, Holds):
            try:
                state.add(verdict.allocation)
            except StateError as exc:
                invalid[f"{namespace}/{name}"] = f"conflicts with another pod: {exc}"
    return Rebuilt(state, invalid)
