"""Watches that keep the Cache equal to the cluster: NodeDevices, Leases, Nodes, Pods.

Each resource has a kube_edge Informer (list, then watch; a 410 Gone or any error leads to
a fresh list whose items *replace* what the handler knew) feeding one of the handlers here.
The service is ready only after every informer has listed once.

Every handler processes each object on its own: whatever one object holds (a poison
record, a NodeDevices past every bound, a wrong shape), its failure is recorded against
that object (an unusable or fenced node, an invalid record) and logged; it never aborts a
list, the watch, the initial sync (readiness) or any other object. An unexpected exception
is logged as a bug with the object's name, and handled as the safe case: a pod that cannot
be judged, bound and not finished, fences its node.

Pods are judged here by the same rule as a rebuild (recovery.judge), outside the cache's
lock; the Cache accounts the verdicts, guarding binds of our own that the watch has not
caught up with (its module doc; an assumed allocation the watch never confirms is read
back by `Reconciler.expire_assumed`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from operator import itemgetter
from sys import intern
from typing import Any

from kube_edge.client import KubeClient, lease_path, pod_path
from kube_edge.errors import ApiError
from kube_edge.informer import Handler, Informer
from scheduler_plugin.decisions.gangs import Gangs
from scheduler_plugin.state.cache import Cache
from scheduler_plugin.state.nodes import INTERNAL_ERROR
from scheduler_plugin.state.values import Holds, PodSeen, Verdict
from scheduler_plugin.views.metrics import Metrics
from scheduler_plugin.watches.recovery import apply_order, judge, record_text
from tessera.allocation import PodAllocation
from tessera.pod_fields import is_finished, pod_identity, pod_node, section
from tessera.record import KeySource
from tessera.resources import (
    INVENTORY_GROUP,
    INVENTORY_PLURAL,
    INVENTORY_VERSION,
)

log = logging.getLogger(__name__)

LabelSink = Callable[[str, Any], None]
"""(node, its labels, or None when the Node is gone)."""

INVENTORY_PATH = f"/apis/{INVENTORY_GROUP}/{INVENTORY_VERSION}/{INVENTORY_PLURAL}"


def _name(obj: Mapping[str, Any]) -> str:
    name = section(obj, "metadata").get("name")
    return name if isinstance(name, str) else ""


def _bug(what: str, obj: Mapping[str, Any]) -> None:
    """Log an exception that escaped the handling of one object (a bug: handlers turn bad
    input into recorded problems), naming the object; the caller goes on."""
    log.exception("bug: handling %s %r failed; skipped it", what, _name(obj)[:253])


def _version(obj: Mapping[str, Any]) -> tuple[object, object] | None:
    """(uid, generation) of an object, or None without a generation. The API server
    raises a NodeDevices' generation only when its spec changes (status has its own
    subresource), and a re-created object has another uid."""
    meta = section(obj, "metadata")
    generation = meta.get("generation")
    if not isinstance(generation, int) or isinstance(generation, bool):
        return None
    return (meta.get("uid"), generation)


class InventoryHandler(Handler):
    """NodeDevices -> the cache. An event whose spec generation was already handled (a
    status write, most often the scheduler's own summary) is skipped before parsing."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self._handled: dict[str, tuple[object, object]] = {}
        """Node -> (uid, generation) of the NodeDevices last handed to the cache."""
        self.skipped = 0

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        handled: dict[str, tuple[object, object]] = {}

        def specs() -> Iterator[tuple[str, Any]]:
            for obj in items:
                name = _name(obj)
                if not name:
                    continue
                version = _version(obj)
                if version is not None:
                    handled[name] = version
                yield name, obj.get("spec")

        # the cache parses each spec as the pages come and keeps only the inventories
        self.cache.nodes.replace(specs())
        self._handled = handled

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        name = _name(obj)
        if not name:
            return
        try:
            if kind == "DELETED":
                self._handled.pop(name, None)
                self.cache.nodes.remove(name)
                return
            version = _version(obj)
            if version is not None and self._handled.get(name) == version:
                self.skipped += 1
                return
            self.cache.nodes.upsert(name, obj.get("spec"))
            if version is None:
                self._handled.pop(name, None)
            else:
                self._handled[name] = version
        except Exception:
            _bug("nodedevices", obj)


class NodeHandler(Handler):
    """Nodes -> the cache (which exist); their labels -> `on_labels` (gang topology)."""

    def __init__(self, cache: Cache, on_labels: LabelSink | None = None) -> None:
        self.cache = cache
        self.on_labels = on_labels

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        names = []
        for obj in items:
            name = _name(obj)
            if name:
                names.append(name)
                self._labels(name, obj)
        self.cache.nodes.replace_objects(names)

    def _labels(self, name: str, obj: Mapping[str, Any] | None) -> None:
        if self.on_labels is not None:
            labels = None if obj is None else section(obj, "metadata").get("labels")
            self.on_labels(name, labels if labels is not None or obj is None else {})

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        name = _name(obj)
        if name and kind == "DELETED":
            self.cache.nodes.object_gone(name)
            self._labels(name, None)
        elif name:
            self.cache.nodes.object_seen(name)
            self._labels(name, obj)


class GangGroupHandler(Handler):
    """Gang objects (PodGroups) -> Gangs."""

    def __init__(self, gangs: Gangs) -> None:
        self.gangs = gangs

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        self.gangs.groups_replaced(items)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        try:
            if kind == "DELETED":
                self.gangs.group_gone(obj)
            else:
                self.gangs.group_seen(obj)
        except Exception:
            _bug("gang object", obj)


class GangMemberHandler(Handler):
    """Pods carrying the gang label, pending or bound -> Gangs."""

    def __init__(self, gangs: Gangs) -> None:
        self.gangs = gangs

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        self.gangs.members_replaced(items)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        try:
            if kind == "DELETED":
                self.gangs.member_gone(obj)
            else:
                self.gangs.member_seen(obj)
        except Exception:
            _bug("gang pod", obj)


def gang_informers(
    client: KubeClient, gangs: Gangs, *, metrics: Metrics | None = None
) -> list[Informer]:
    """The gang objects and the gang's pods. Not part of readiness: a cluster without the
    PodGroup CRD serves every other pod, and gang members wait until both have listed."""

    def relisted(name: str) -> None:
        if metrics is not None:
            metrics.watch_relists.labels(name).inc()

    return [
        Informer(
            client, gangs.source.path, GangGroupHandler(gangs), name="gangs", on_relist=relisted
        ),
        Informer(
            client,
            "/api/v1/pods",
            GangMemberHandler(gangs),
            name="gang-pods",
            on_relist=relisted,
            label_selector=gangs.source.label,
        ),
    ]


class LeaseHandler(Handler):
    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        self.cache.leases.replace(list(items))

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        try:
            if kind == "DELETED":
                self.cache.leases.gone(obj)
            else:
                self.cache.leases.seen(obj)
        except Exception:
            _bug("lease", obj)


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
    """A pod dict with what `seen` knows (identity, node, finished), for `_crashed`."""
    return {
        "metadata": {"uid": seen.uid, "namespace": seen.namespace, "name": seen.name},
        "spec": {"nodeName": seen.node},
        "status": {"phase": "Succeeded" if seen.finished else "Running"},
    }


class Reconciler(Handler):
    """Pods -> the cache (the rebuild rule, judged here one pod at a time, outside the
    cache's lock: judging verifies signatures)."""

    def __init__(
        self,
        cache: Cache,
        keyring: KeySource | None,
        *,
        assume_ttl: float = 30.0,
    ) -> None:
        self.cache = cache
        self.keyring = keyring
        self.assume_ttl = assume_ttl
        self._verdicts: dict[str, tuple[int, Verdict | PodAllocation]] = {}
        """UID -> (hash of what judging read, the verdict): a Holds verdict is kept as its
        bare allocation (one object less per pod)."""

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
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
                self._crashed(pod)
        del stamps
        waiting.sort(key=_APPLY_ORDER)
        for entry in waiting:
            pod_seen = PodSeen(*entry[1:7])
            kept = entry[7]
            verdict = Holds(kept) if isinstance(kept, PodAllocation) else kept
            try:
                self.cache.pods.observed(pod_seen, verdict)
            except Exception:
                self._crashed(_as_pod(pod_seen))
        del waiting
        for uid in [u for u in self._verdicts if u not in seen]:
            del self._verdicts[uid]
        self.cache.pods.relisted(seen)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        try:
            if kind == "DELETED":
                self.deleted(obj)
            else:
                self.apply(obj)
        except Exception:
            self._crashed(obj)

    def _crashed(self, pod: Mapping[str, Any]) -> None:
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
            self.cache.records.distrust(key, uid, node, INTERNAL_ERROR)
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


INVENTORY_PAGE = 100
"""NodeDevices per list page (measured at 5,000 nodes: peak RSS 166 MiB with pages of 500,
144 MiB with 100, and no lower with 50)."""
BOUND_PODS = "spec.nodeName!="
"""The pods the scheduler's state is rebuilt from: those bound to a node."""


def informers(
    client: KubeClient,
    cache: Cache,
    reconciler: Reconciler,
    *,
    heartbeat_namespace: str,
    watch_nodes: bool = True,
    metrics: Metrics | None = None,
    on_labels: LabelSink | None = None,
) -> list[Informer]:
    """The informers in sync order: nodes and inventories first, then leases, then pods."""

    def relisted(name: str) -> None:
        if metrics is not None:
            metrics.watch_relists.labels(name).inc()

    result = []
    if watch_nodes:
        result.append(
            Informer(
                client,
                "/api/v1/nodes",
                NodeHandler(cache, on_labels),
                name="nodes",
                on_relist=relisted,
            )
        )
    result += [
        # a NodeDevices object is ~17 KB of JSON (8 GPUs, 4 NICs): pages of 100, not 500,
        # keep a relist's transient decoded page near 10 MB instead of 50 (peak RSS)
        Informer(
            client,
            INVENTORY_PATH,
            InventoryHandler(cache),
            name="nodedevices",
            on_relist=relisted,
            page_size=INVENTORY_PAGE,
        ),
        Informer(
            client,
            lease_path(heartbeat_namespace),
            LeaseHandler(cache),
            name="leases",
            on_relist=relisted,
        ),
        # bound pods only: a pending pod holds nothing (its record, if any, counts once it
        # is bound), and unschedulable pods' status updates would each cost a decode here
        Informer(
            client,
            "/api/v1/pods",
            reconciler,
            name="pods",
            on_relist=relisted,
            field_selector=BOUND_PODS,
        ),
    ]
    return result
