"""The informers that keep the state equal to the cluster, in sync order: Nodes and
NodeDevices first, then Leases, then bound Pods; and the gang watches beside them.

Each resource has a kube_edge Informer (list, then watch; a 410 Gone or any error leads to
a fresh list whose items *replace* what the handler knew) feeding one of the handlers
(handlers.py, reconciler.py). The service is ready only after every informer of the state
has listed once.
"""

from __future__ import annotations

from kube_edge.client import KubeClient, lease_path
from kube_edge.informer import Informer
from scheduler_plugin.state.cache import Cache
from scheduler_plugin.views.metrics import Metrics
from scheduler_plugin.watches.handlers import (
    GangFeeds,
    GangGroupHandler,
    GangMemberHandler,
    InventoryHandler,
    LabelSink,
    LeaseHandler,
    NodeHandler,
)
from scheduler_plugin.watches.reconciler import Reconciler
from tessera.resources import INVENTORY_PATH

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


def gang_informers(
    client: KubeClient, gangs: GangFeeds, *, metrics: Metrics | None = None
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
