"""The rebuild rule: which pods hold devices, judged from API objects alone.

A pod holds the devices its allocation record names exactly when
- it carries the record (`tessera.dev/allocation`),
- it is bound (`spec.nodeName` set) to the node the record names,
- it has not finished (phase Succeeded or Failed) and still exists (a deleted pod is gone
  from the list; a pod with a deletionTimestamp keeps its devices until it is gone,
  because its containers may still run during graceful termination),
- the record decodes and its integrity proof verifies for this pod's UID and node.

A pod with a record but no nodeName was interrupted between writing the record and
binding: it holds nothing, and its next bind overwrites the record. A record that fails
to decode or verify (forged by a user, corrupt, copied from another pod) never counts;
the pod is reported so an operator can see it. Such a pod, bound and not finished, may
still be using devices nobody can account for: its node is *fenced* (no new tessera
pods) until the pod is gone or its record is fixed (docs/scheduler.md "Fencing"). So is
the node of a bound, unfinished pod that asks for tessera devices but carries no record
(removed after binding, or the pod was bound around this scheduler).

Every pod is judged on its own: whatever one pod carries (any shape, any record), judging
it returns a verdict and never raises, so one object cannot stop a rebuild or a relist.

Everything here is pure so that the running service and a rebuild after a restart apply
literally the same function.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from sys import intern
from typing import Any

from scheduler_plugin.state.values import Holds, Invalid, Nothing, Verdict
from tessera.cluster_state import ClusterState
from tessera.errors import RecordError, StateError
from tessera.model import NodeInventory
from tessera.pod_fields import is_finished, pod_identity, pod_node, requests_devices, section, text
from tessera.record import KeySource, decode
from tessera.resources import ALLOCATION_ANNOTATION

log = logging.getLogger(__name__)


def record_text(pod: Mapping[str, Any]) -> str | None:
    value = section(section(pod, "metadata"), "annotations").get(ALLOCATION_ANNOTATION)
    return value if isinstance(value, str) else None


def apply_order(pod: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """The order in which pods are accounted: oldest first, then by UID."""
    created = text(section(pod, "metadata").get("creationTimestamp"))
    return (created, *pod_identity(pod))


def judge(pod: Mapping[str, Any], keyring: KeySource | None) -> Verdict:
    """Apply the rebuild rule to one pod dict (see the module doc)."""
    text = record_text(pod)
    if text is None:
        node = pod_node(pod)
        if node and not is_finished(pod) and requests_devices(pod):
            # Our binds write the record before the Binding, so a bound pod that asks for
            # tessera devices has one unless somebody removed it (or bound the pod around
            # this scheduler): what its containers use is unknown.
            return Invalid("asks for tessera devices but carries no allocation record", node)
        return Nothing("no allocation record")
    if is_finished(pod):
        return Nothing("finished")
    # interned: many pods share a node and a namespace, and the allocation keeps these
    node = intern(pod_node(pod))
    if not node:
        return Nothing("record without a binding (interrupted bind)")
    uid, namespace, name = pod_identity(pod)
    namespace = intern(namespace)
    try:
        alloc = decode(
            text, keyring, pod_uid=uid, node=node, namespace=namespace, name=name, share=intern
        )
    except RecordError as exc:
        return Invalid(str(exc), node)
    except Exception as exc:  # a bug in the codec must not stop the rebuild
        # Defence in depth: the codec raises only RecordError by contract; anything else
        # is a bug in it, and the record is untrusted all the same.
        log.error(
            "bug: decoding the allocation record of pod %s/%s raised %s: %s",
            namespace,
            name,
            type(exc).__name__,
            str(exc)[:200],
        )
        return Invalid(f"record cannot be read ({type(exc).__name__})", node)
    return Holds(alloc)


@dataclass(frozen=True)
class Rebuilt:
    state: ClusterState
    invalid: dict[str, str]
    """Pod key -> why its record does not count (bad record or a conflicting one)."""
    fenced: dict[str, dict[str, str]] = field(default_factory=dict)
    """Node -> {pod key: why} for bound, unfinished pods whose record does not count."""


def rebuild(
    inventories: Iterable[NodeInventory],
    pods: Iterable[Mapping[str, Any]],
    keyring: KeySource | None,
) -> Rebuilt:
    """State from the cluster's objects alone. Pods are applied in (creation, uid) order so
    that two rebuilds from the same objects agree even on which of two conflicting records
    wins (a conflict means some record overcommits a device; the later pod loses)."""
    state = ClusterState()
    for inventory in inventories:
        state.set_node(inventory)
    invalid: dict[str, str] = {}
    fenced: dict[str, dict[str, str]] = {}
    ordered = sorted(pods, key=apply_order)
    for pod in ordered:
        verdict = judge(pod, keyring)
        _, namespace, name = pod_identity(pod)
        key = f"{namespace}/{name}"
        problem = None
        if isinstance(verdict, Invalid):
            problem = verdict.problem
        elif isinstance(verdict, Holds):
            try:
                state.add(verdict.allocation)
            except StateError as exc:
                problem = f"conflicts with another pod: {exc}"
        if problem is not None:
            invalid[key] = problem
            fenced.setdefault(pod_node(pod), {})[key] = problem
    return Rebuilt(state, invalid, fenced)
