"""Pods -> the state: each bound pod judged by the rebuild rule (recovery.judge), outside
the state's lock; the state's pod ledger accounts the verdicts, guarding binds of our own
that the watch has not caught up with (state/pods.py; an assumed allocation the watch
never confirms is read back by `Reconciler.expire_assumed`). A pod that cannot be judged
(a bug), bound and not finished, fences its node: the safe case.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from operator import itemgetter
from sys import intern
from typing import Any

from kube_edge.client import KubeClient, pod_path
from kube_edge.errors import ApiError
from scheduler_plugin.state.cache import Cache
from scheduler_plugin.state.nodes import INTERNAL_ERROR
from scheduler_plugin.state.values import Holds, PodSeen, Verdict
from scheduler_plugin.watches.handlers import Feed
from scheduler_plugin.watches.recovery import apply_order, judge, record_text
from tessera.allocation import PodAllocation
from tessera.pod_fields import is_finished, pod_identity, pod_node, section
from tessera.record import KeySource

log = logging.getLogger(__name__)


def _priority(pod: Mapping[str, Any]) -> int:
    value = section(pod, "spec").get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _seen(uid: str, pod: Mapping[str, Any]) -> PodSeen:
    """What the cache keeps of a pod (namespace and node interned: many pods share them)."""
    _, namespace, name = pod_identity(pod)
    node = intern(pod_node(pod))
    return PodSeen(uid, intern(namespace), name, node, _priority(pod), is_finished(pod))


_Waiting = tuple[str, str, str, str, str, int, bool, Verdict | PodAllocation]
"""A listed pod waiting to be accounted: (creationTimestamp, uid, namespace, name, node,
priority, finished, verdict or the allocation a Holds verdict holds)."""
_APPLY_ORDER = itemgetter(0, 1, 2, 3)
"""recovery.apply_order of a waiting pod."""


def _waiting(
    pod: Mapping[str, Any], uid: str, verdict: Verdict, stamps: dict[str, str]
) -> _Waiting:
    created = apply_order(pod)[0]
    seen = _seen(uid, pod)
    kept = verdict.allocation if isinstance(verdict, Holds) else verdict
    return (
        stamps.setdefault(created, created),
        uid,
        seen.namespace,
        seen.name,
        seen.node,
        seen.priority,
        seen.finished,
        kept,
    )


def _as_pod(seen: PodSeen) -> dict[str, Any]:
    """A pod dict with what `seen` knows (identity, node, finished), for `failed`."""
    return {
        "metadata": {"uid": seen.uid, "namespace": seen.namespace, "name": seen.name},
        "spec": {"nodeName": seen.node},
        "status": {"phase": "Succeeded" if seen.finished else "Running"},
    }


class Reconciler(Feed):
    """Pods -> the state (the rebuild rule, judged here one pod at a time, outside the
    state's lock: judging verifies signatures)."""

    def __init__(
        self,
        cache: Cache,
        keyring: KeySource | None,
        *,
        assume_ttl: float = 30.0,
    ) -> None:
        super().__init__("pod", self._relisted, self.apply, self.deleted)
        self.cache = cache
        self.keyring = keyring
        self.assume_ttl = assume_ttl
        self._verdicts: dict[str, tuple[int, Verdict | PodAllocation]] = {}
        """UID -> (hash of what judging read, the verdict): a Holds verdict is kept as its
        bare allocation (one object less per pod)."""

    def _relisted(self, items: Iterable[dict[str, Any]]) -> None:
        seen: set[str] = set()
        # Pods with a record are judged as their page comes (the record's text goes with
        # the page) and accounted oldest first once the list is complete, as a rebuild
        # does (recovery.apply_order). Until then 50,000 pods wait as one flat tuple each
        # (apply order, what PodSeen keeps, the verdict with Holds unwrapped), creation
        # stamps shared (pods made in one second share theirs): the list and the state
        # it builds are alive together, and this is the load's peak.
        waiting: list[_Waiting] = []
        stamps: dict[str, str] = {}
        for pod in items:
            try:
                uid = pod_identity(pod)[0]
                seen.add(uid)
                if record_text(pod) is None:
                    self.apply(pod)
                elif uid:
                    waiting.append(_waiting(pod, uid, self._judge(uid, pod), stamps))
            except Exception:
                self.failed(pod)
        del stamps
        waiting.sort(key=_APPLY_ORDER)
        for entry in waiting:
            pod_seen = PodSeen(*entry[1:7])
            kept = entry[7]
            verdict = Holds(kept) if isinstance(kept, PodAllocation) else kept
            try:
                self.cache.pods.observed(pod_seen, verdict)
            except Exception:
                self.failed(_as_pod(pod_seen))
        del waiting
        for uid in [u for u in self._verdicts if u not in seen]:
            del self._verdicts[uid]
        self.cache.pods.relisted(seen)

    def failed(self, pod: Mapping[str, Any]) -> None:
        """An exception escaped the handling of one pod (a bug). The pod's record cannot
        be trusted: when bound and not finished, its node is fenced (fail closed)."""
        uid, namespace, name = pod_identity(pod)
        log.exception("bug: handling pod %s/%s failed; its record does not count", namespace, name)
        node = pod_node(pod)
        if not uid or not node or is_finished(pod):
            return
        key = f"{namespace}/{name}"
        try:
            self._verdicts.pop(uid, None)
            self.cache.problems.distrust(key, uid, node, INTERNAL_ERROR)
        except Exception:
            log.exception("bug: fencing node %s for pod %s failed", node, key)

    def _judge(self, uid: str, pod: Mapping[str, Any]) -> Verdict:
        """judge(), remembered per pod while what it reads is unchanged: running pods get
        many status updates, and each would otherwise verify the record's signature again.
        Only a hash of what it read is kept (str hashes are keyed per process, so nobody can
        make two records collide)."""
        text = record_text(pod)
        if text is None:
            self._verdicts.pop(uid, None)
            return judge(pod, self.keyring)
        _, namespace, name = pod_identity(pod)
        seen = hash((text, pod_node(pod), is_finished(pod), namespace, name))
        hit = self._verdicts.get(uid)
        if hit is not None and hit[0] == seen:
            kept = hit[1]
            return Holds(kept) if isinstance(kept, PodAllocation) else kept
        verdict = judge(pod, self.keyring)
        if isinstance(verdict, Holds):
            self._verdicts[uid] = (seen, verdict.allocation)
            return verdict
        self._verdicts[uid] = (seen, verdict)
        return verdict

    def signed(
        self, uid: str, namespace: str, name: str, node: str, text: str, alloc: PodAllocation
    ) -> None:
        """What judging will read when this scheduler's own Binding lands: the record it
        just signed for that pod on that node. The watch event then finds the verdict
        remembered, as a status update would, instead of verifying our own signature."""
        self._verdicts[uid] = (hash((text, node, False, namespace, name)), alloc)

    def deleted(self, pod: Mapping[str, Any]) -> None:
        uid, namespace, name = pod_identity(pod)
        self._verdicts.pop(uid, None)
        self.cache.pods.deleted(uid, f"{namespace}/{name}")

    def apply(self, pod: Mapping[str, Any], *, authoritative: bool = False) -> None:
        """Account one pod as the rebuild rule says. `authoritative`: the object was just
        read (not a possibly stale event), so it may drop an assumed allocation."""
        uid = pod_identity(pod)[0]
        if not uid:
            return
        verdict = self._judge(uid, pod)
        self.cache.pods.observed(_seen(uid, pod), verdict, authoritative=authoritative)

    def expire_assumed(self, client: KubeClient, now: float | None = None) -> None:
        """Read back each assumed pod the watch has not confirmed within `assume_ttl` of
        its bind, and judge it authoritatively."""
        for uid, namespace, name in self.cache.pods.expired_assumptions(self.assume_ttl, now):
            try:
                pod = client.get(pod_path(namespace, name))
            except ApiError as exc:
                if exc.status == 404:
                    self.cache.pods.assumption_gone(uid)
                continue
            if pod_identity(pod)[0] != uid:
                self.cache.pods.assumption_gone(uid)
                continue
            self.apply(pod, authoritative=True)
