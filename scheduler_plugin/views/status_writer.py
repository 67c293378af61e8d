"""Writes each node's allocation summary into its NodeDevices status, off the hot path.

Changes to the cluster state only mark a node dirty (a set insert, inside the state's
change notification). A background thread wakes every `interval` seconds, takes the dirty
set, renders each node's summary under the lock, and patches `status.allocation` through
the status subresource outside it; at most `max_per_flush` nodes per round, the rest wait
for the next round. A summary equal to the last one written for that node is skipped
(only a digest of each written summary is kept: 5,000 summaries kept whole cost tens of
MiB).
Only the leader writes; a failed write re-marks the node dirty.

Layout (docs/scheduler.md): `status.allocation = {updated, usable, problem, summary:
{coreAllocated, coreFree, memoryAllocated, memoryFree}, gpus: [{uuid, index, model, healthy,
core: {total, used, free}, memoryMiB: {total, used, free}, pods: [{namespace, name, uid,
container, core, memoryMiB}]}], rdma: [{ibdev, pciBusId, healthy, share: {total, used,
free}, vfs: {total, free}, pods: [...]}]}`. `summary` is what `kubectl get nodedevices`
prints (the CRD's printer columns); it travels in the same patch as the rest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar
from urllib.parse import quote

from kube_edge.client import KubeClient
from kube_edge.errors import ApiError
from scheduler_plugin.state.cache import Cache
from scheduler_plugin.views.metrics import Metrics
from scheduler_plugin.views.rounds import Rounds
from tessera.resources import INVENTORY_PATH

log = logging.getLogger(__name__)


def status_path(node: str) -> str:
    return f"{INVENTORY_PATH}/{quote(node, safe='')}/status"


def mib_quantity(mib: int) -> str:
    """MiB as a Kubernetes quantity: whole GiB as `Gi`, anything else as `Mi`."""
    if mib == 0:
        return "0"
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def node_totals(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """The node's GPU totals from its per-GPU summaries. Compute in percent of one GPU
    (250 = two and a half GPUs). Allocated counts every GPU (what pods hold); free counts
    healthy GPUs only, since an unhealthy GPU's free part takes no new pod."""
    healthy = [g for g in gpus if g["healthy"]]
    return {
        "coreAllocated": sum(g["core"]["used"] for g in gpus),
        "coreFree": sum(g["core"]["free"] for g in healthy),
        "memoryAllocated": mib_quantity(sum(g["memoryMiB"]["used"] for g in gpus)),
        "memoryFree": mib_quantity(sum(g["memoryMiB"]["free"] for g in healthy)),
    }


def digest(summary: Any) -> bytes:
    """What the writer remembers of a summary it wrote: equal summaries, equal digests."""
    text = json.dumps(summary, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


@dataclass(eq=False)
class StatusWriter(Rounds):
    ROUNDS: ClassVar[str] = "status writer"
    cache: Cache
    client: KubeClient
    _: KW_ONLY
    interval: float = 2.0
    max_per_flush: int = 200
    enabled: Callable[[], bool] = lambda: True
    metrics: Metrics | None = None

    def __post_init__(self) -> None:
        self._dirty: set[str] = set()
        self._dirty_lock = threading.Lock()
        self._written: dict[str, bytes] = {}
        """Node -> digest of the summary last written for it."""
        self._init_rounds()
        self.cache.subscribe(self.mark)

    def mark(self, node: str) -> None:
        with self._dirty_lock:
            self._dirty.add(node)

    def mark_all(self) -> None:
        for name in self.cache.node_names():
            self.mark(name)

    def flush(self) -> int:
        """One round; returns how many nodes were written."""
        if not self.enabled():
            return 0
        with self._dirty_lock:
            batch = sorted(self._dirty)[: self.max_per_flush]
            self._dirty.difference_update(batch)
        written = 0
        for node in batch:
            summary = self.cache.node_summary(node)
            if summary is None:
                self._written.pop(node, None)
                continue
            body = {k: v for k, v in summary.items() if k != "node"}
            body["summary"] = node_totals(body["gpus"])
            seen = digest(body)
            if self._written.get(node) == seen:
                continue
            patch = {
                "status": {
                    "allocation": body
                    | {"updated": datetime.now(UTC).isoformat(timespec="seconds")}
                }
            }
            try:
                # the answer is the whole NodeDevices (about 20 KB at 8 GPUs): not parsed
                self.client.merge_patch(status_path(node), patch, answer=False)
            except ApiError as exc:
                if exc.status == 404:
                    self._written.pop(node, None)
                    continue  # the inventory is gone; nothing to write to
                log.warning("writing the status of nodedevices/%s failed: %s", node, exc)
                self.mark(node)
                self._count("error")
                continue
            self._written[node] = seen
            written += 1
            self._count("ok")
        return written

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.status_writes.labels(outcome).inc()

    def one_round(self) -> None:
        self.flush()
