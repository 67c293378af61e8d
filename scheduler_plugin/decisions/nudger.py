"""Nudges: a small patch to each member of a newly reserved gang.

kube-scheduler retries an unschedulable pod only when it sees an event that may help it;
for a pod an extender refused it knows no better than "any change". A member whose gang
was just reserved has seen nothing change, and would wait for its backoff or the next
periodic flush (up to minutes). So the leader patches each such member's
`GANG_RESERVED_ANNOTATION` with its reserved node, and `GANG_NUDGED_ANNOTATION` with the
time, so that the patch changes the pod even when the node is the last nudge's: the update
moves the pod back into kube-scheduler's active queue, and its next filter finds the
reservation. Members refused
before the gang watches had listed are nudged the same way (no node) once they have, so
that kube-scheduler records the gang's real reason.

The patches go out on a thread of their own (the filter that reserved a gang must not wait
for the API server); one that fails is logged and not retried: the reservation's timeout
and the gang's next plan cover it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from kube_edge.client import KubeClient, pod_path
from kube_edge.errors import ApiError
from scheduler_plugin.decisions.gangs import Poke
from tessera.resources import GANG_NUDGED_ANNOTATION, GANG_RESERVED_ANNOTATION

log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class Nudger:
    def __init__(
        self,
        client: KubeClient,
        *,
        enabled: Callable[[], bool] = lambda: True,
        clock: Callable[[], str] = _now,
    ) -> None:
        self.client = client
        self.enabled = enabled
        self.clock = clock
        """The time each nudge writes (RFC 3339)."""
        self.sent = 0
        self.failed = 0
        self._queue: queue.SimpleQueue[Poke | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def nudge(self, pokes: list[Poke]) -> None:
        """Queue the patches (returns at once)."""
        for poke in pokes:
            self._queue.put(poke)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="gang-nudger")
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while (poke := self._queue.get()) is not None:
            if self.enabled():
                self.send(poke)

    def send(self, poke: Poke) -> None:
        namespace, name, uid, node = poke
        annotations = {GANG_RESERVED_ANNOTATION: node, GANG_NUDGED_ANNOTATION: self.clock()}
        patch = {"metadata": {"uid": uid, "annotations": annotations}}
        try:
            self.client.merge_patch(pod_path(namespace, name), patch)
            self.sent += 1
        except ApiError as exc:
            self.failed += 1
            log.warning("nudging gang member %s/%s failed: %s", namespace, name, exc)
