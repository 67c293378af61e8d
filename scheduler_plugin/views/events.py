"""Kubernetes Events about pods (core/v1), posted off the hot path and rate-limited.

`warn` only queues (it is called inside the cache lock, from a fence listener); a
background thread posts the queue every `interval` seconds while this replica leads. The
same (pod UID, reason) is posted at most once per `min_gap` seconds however often it is
queued, so a relist, a flapping record or a pod's author toggling an annotation cannot
flood the API server. The queue is bounded: past `max_queue` waiting Events, new ones are
dropped (and counted in the log), never the process.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime
from typing import ClassVar
from urllib.parse import quote

from kube_edge.client import KubeClient
from kube_edge.errors import ApiError
from scheduler_plugin.views.rounds import Rounds
from tessera.errors import ErrorTable, RecordError, StateError, TesseraError

log = logging.getLogger(__name__)

COMPONENT = "tessera-scheduler"
UNTRUSTED_RECORD = "UntrustedAllocationRecord"
"""Event reason on a pod whose allocation record fences its node."""
DEVICE_UNHEALTHY = "AllocatedDeviceUnhealthy"
"""Event reason on a pod given a GPU or NIC that its node now reports unhealthy."""
DEVICE_MISSING = "AllocatedDeviceMissing"
"""Event reason on a pod given a GPU or NIC that its node's inventory no longer lists."""
EVENT_REASONS: ErrorTable[str | None] = ErrorTable(
    "scheduler: Kubernetes Event reason",
    {
        TesseraError: None,
        RecordError: UNTRUSTED_RECORD,
        StateError: UNTRUSTED_RECORD,
    },
)
"""Error class -> the reason of the Warning Event on the pod; None: no Event, a log line.
A record that does not decode or verify (RecordError) or that overcommits a device another
record holds (StateError) makes the pod fence its node: the pod gets an Event saying so."""
MAX_MESSAGE = 1024
"""Characters of an Event message (the events.k8s.io limit; longer ones are refused)."""
MIN_GAP = 600.0
"""Seconds between two Events with the same pod and reason (kubectl shows the last one)."""
MAX_QUEUE = 1000
"""Events waiting to be posted; a burst past this is dropped, not buffered without end."""
MAX_REMEMBERED = 10_000
"""(pod, reason) pairs whose last post time is kept for the rate limit (oldest forgotten)."""


@dataclass(frozen=True)
class PodEvent:
    namespace: str
    name: str
    uid: str
    reason: str
    message: str


def events_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/events"


def event_body(event: PodEvent, instance: str, now: datetime) -> dict[str, object]:
    stamp = now.isoformat(timespec="seconds").replace("+00:00", "Z")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            # an Event name is a DNS subdomain (253): the pod's name, cut, and a unique tail
            "name": f"{event.name[:200]}.{uuid.uuid4().hex[:16]}",
            "namespace": event.namespace,
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": event.namespace,
            "name": event.name,
            "uid": event.uid,
        },
        "reason": event.reason,
        "message": event.message[:MAX_MESSAGE],
        "type": "Warning",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


@dataclass(eq=False)
class EventRecorder(Rounds):
    ROUNDS: ClassVar[str] = "event recorder"
    client: KubeClient
    _: KW_ONLY
    instance: str = COMPONENT
    interval: float = 1.0
    min_gap: float = MIN_GAP
    max_queue: int = MAX_QUEUE
    enabled: Callable[[], bool] = lambda: True
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.dropped = 0
        self._queue: OrderedDict[tuple[str, str], PodEvent] = OrderedDict()
        self._posted: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._lock = threading.Lock()
        self._init_rounds()

    def warn(self, event: PodEvent) -> None:
        """Queue a Warning Event (cheap; never blocks on the API)."""
        key = (event.uid, event.reason)
        with self._lock:
            if key not in self._queue and len(self._queue) >= self.max_queue:
                self.dropped += 1
                return
            self._queue[key] = event  # a newer message replaces a waiting one

    def flush(self) -> int:
        """Post what is queued; returns how many Events were created."""
        with self._lock:
            batch = list(self._queue.values())
            self._queue.clear()
        if not self.enabled():
            return 0  # a follower: the leader posts (and re-announces when this one leads)
        posted = 0
        for event in batch:
            key = (event.uid, event.reason)
            now = self.clock()
            last = self._posted.get(key)
            if last is not None and now - last < self.min_gap:
                continue
            body = event_body(event, self.instance, datetime.now(UTC))
            try:
                self.client.create(events_path(event.namespace), body)
            except ApiError as exc:
                log.warning(
                    "posting event %s on pod %s/%s failed: %s",
                    event.reason,
                    event.namespace,
                    event.name,
                    exc,
                )
                continue
            self._posted[key] = now
            self._posted.move_to_end(key)
            while len(self._posted) > MAX_REMEMBERED:
                self._posted.popitem(last=False)
            posted += 1
        return posted

    def one_round(self) -> None:
        self.flush()
        if self.dropped:
            log.warning("dropped %d events (queue full)", self.dropped)
            self.dropped = 0
