"""Why pending: the device pods tessera's filter found no node for, for the allocation
page.

The scheduler watches bound pods only, so it learns of a pending pod when kube-scheduler
asks the extender about it. A filter that passes no node notes the pod here, with the
reasons tessera gave, and with the message kube-scheduler recorded on the pod after its
last attempt (the PodScheduled condition the pod carries into the next filter call).
kube-scheduler retries an unschedulable pod at least every five minutes, so a pod not
refused again for `ttl` seconds is dropped (it was bound elsewhere, or deleted), and so is
one the bound-pod watch shows. At most `limit` pods are kept, the most recently refused.

Everything here comes from a pod object, written by a tenant: kept bounded.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler_plugin.state.values import StateReading
from tessera.explain import asks, nearest, verdicts
from tessera.pod_fields import section
from tessera.request import PodRequest

MAX_TEXT = 1024
"""Characters kept of a message kube-scheduler recorded (it lists every node's reason)."""
TOP_REASONS = 3


@dataclass(frozen=True, slots=True)
class Refusal:
    uid: str
    pod: str
    """namespace/name"""
    request: PodRequest | None
    """None when the request breaks a rule (`reasons` says which)."""
    reasons: tuple[tuple[str, int], ...]
    """tessera's reasons at the last refusal, with how many nodes each, most first."""
    nodes: int
    """Nodes kube-scheduler asked about."""
    scheduler: str
    """What kube-scheduler last recorded on the pod ("" before its first record)."""
    first: float
    last: float
    times: int


def scheduler_message(pod: Mapping[str, Any]) -> str:
    """The message of the pod's PodScheduled=False condition, bounded ("" without one)."""
    conditions = section(pod, "status").get("conditions")
    if not isinstance(conditions, list):
        return ""
    for c in conditions[:32]:
        if (
            isinstance(c, Mapping)
            and c.get("type") == "PodScheduled"
            and c.get("status") == "False"
        ):
            message = c.get("message")
            reason = c.get("reason")
            text = message if isinstance(message, str) else ""
            if isinstance(reason, str) and reason:
                text = f"{reason[:64]}: {text}" if text else reason[:64]
            return text[:MAX_TEXT]
    return ""


def top_reasons(failed: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """The most common reasons of a filter's failed nodes, with their counts."""
    counts = Counter(v for v in failed.values() if isinstance(v, str))
    return tuple((text[:MAX_TEXT], n) for text, n in counts.most_common(TOP_REASONS))


class Refusals:
    """The pods tessera refused lately (see the module doc). Thread-safe."""

    def __init__(
        self, limit: int = 1000, ttl: float = 600.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.limit = limit
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._pods: OrderedDict[str, Refusal] = OrderedDict()

    def note(
        self,
        pod: Mapping[str, Any],
        request: PodRequest | None,
        reasons: tuple[tuple[str, int], ...],
        nodes: int,
    ) -> None:
        meta = section(pod, "metadata")
        uid, namespace, name = (meta.get(k) for k in ("uid", "namespace", "name"))
        if not (isinstance(uid, str) and uid and isinstance(name, str) and name):
            return
        key = f"{namespace if isinstance(namespace, str) else ''}/{name}"[:320]
        now = self._clock()
        message = scheduler_message(pod)
        with self._lock:
            old = self._pods.pop(uid[:128], None)
            self._pods[uid[:128]] = Refusal(
                uid[:128],
                key,
                request,
                reasons,
                nodes,
                message or (old.scheduler if old else ""),
                old.first if old else now,
                now,
                old.times + 1 if old else 1,
            )
            while len(self._pods) > self.limit:
                self._pods.popitem(last=False)

    def forget(self, uid: str) -> None:
        with self._lock:
            self._pods.pop(uid, None)

    def current(self, bound: Callable[[list[str]], set[str]]) -> list[Refusal]:
        """The pods still pending, most recently refused first; `bound` names those of
        the given UIDs that are bound by now (they are dropped)."""
        cutoff = self._clock() - self.ttl
        with self._lock:
            for uid in [u for u, r in self._pods.items() if r.last < cutoff]:
                del self._pods[uid]
            uids = list(self._pods)
        for uid in bound(uids):
            self.forget(uid)
        with self._lock:
            return list(reversed(self._pods.values()))


EXPLAINED = 10
"""Pods per answer given their nearest fit (each evaluates the pod on every node)."""


def refusal_json(r: Refusal, now: float) -> dict[str, Any]:
    return {
        "pod": r.pod,
        "uid": r.uid,
        "asks": asks(r.request) if r.request is not None else [],
        "tessera": [{"reason": text, "nodes": n} for text, n in r.reasons],
        "nodesAsked": r.nodes,
        "scheduler": r.scheduler,
        "pendingS": round(max(now - r.first, 0.0)),
        "lastRefusedS": round(max(now - r.last, 0.0)),
        "refusals": r.times,
    }


def explanation(reading: StateReading, request: PodRequest) -> dict[str, Any]:
    """`kubectl tessera explain` from the scheduler's own state: how many nodes fit now,
    are closed, or cannot take the pod however long it waits, and the nearest others."""
    names = sorted(reading.state.nodes)
    found = verdicts(reading.decider.evaluate(request, names), names, reading.problems)
    near = nearest(found, reading.decider.index, request)
    return {
        "fitsNow": [v.node for v in found if v.fits][:5],
        "fitsNowCount": sum(1 for v in found if v.fits),
        "closed": sum(1 for v in found if v.closed),
        "hopeless": sum(1 for v in found if v.hopeless),
        "nearest": [
            {"node": v.node, "closeness": round(score, 3), "reason": v.text} for v, score in near
        ],
    }
