"""Leader election on a coordination.k8s.io/v1 Lease, as client-go does it.

- A candidate reads the Lease. It takes it when nobody holds it, when the holder released
  it (empty holderIdentity), or when the holder's record has not changed for
  leaseDurationSeconds *as observed on our clock* (so clock skew between replicas does
  not matter). Taking and renewing are updates guarded by the resourceVersion, so of two
  candidates only one wins.
- The leader renews every `retry_period`; if it cannot renew for `renew_deadline`
  (shorter than the lease duration) it stops being the leader *before* anybody else can
  take over, so two replicas never both answer.
- On shutdown the leader releases the Lease (empty holder, 1 s duration) so a standby
  takes over at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime
from typing import Any

from kube_edge.client import KubeClient, lease_path
from kube_edge.errors import ApiError

log = logging.getLogger(__name__)


def _now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(eq=False)
class LeaderElector:
    client: KubeClient
    namespace: str
    name: str
    identity: str
    _: KW_ONLY
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    on_change: Callable[[bool], None] | None = None
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if not self.renew_deadline < self.lease_duration:
            raise ValueError("renew_deadline must be shorter than lease_duration")
        self.path = lease_path(self.namespace, self.name)
        self.is_leader = False
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._last_renew = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def leading(self) -> bool:
        """Leader now: elected and renewed within the renew deadline (checked per call, so
        a stalled renew loop cannot leave two replicas answering)."""
        return self.is_leader and self.clock() - self._last_renew < self.renew_deadline

    # --- one step (tests drive it directly) -----------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One attempt; returns whether we hold the lease afterwards."""
        now = self.clock()
        try:
            lease = self.client.get(self.path)
        except ApiError as exc:
            if exc.status != 404:
                log.warning("reading the leader Lease failed: %s", exc)
                return self._renew_failed(now)
            return self._create(now)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed = record
            self._observed_at = now
        duration = spec.get("leaseDurationSeconds") or self.lease_duration
        if holder and holder != self.identity and now - self._observed_at < float(duration):
            self._set_leader(False)
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        new_spec = dict(spec)
        new_spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=int(self.lease_duration),
            renewTime=_now_text(),
        )
        if holder != self.identity:
            new_spec["acquireTime"] = _now_text()
            new_spec["leaseTransitions"] = transitions + 1
        body = dict(lease)
        body["spec"] = new_spec
        try:
            updated = self.client.replace(self.path, body)
        except ApiError as exc:
            if exc.status != 409:
                log.warning("renewing the leader Lease failed: %s", exc)
            return self._renew_failed(now)
        uspec = updated.get("spec") or {}
        self._observed = (self.identity, uspec.get("renewTime"), uspec.get("leaseTransitions"))
        self._observed_at = now
        self._last_renew = now
        self._set_leader(True)
        return True

    def _create(self, now: float) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.lease_duration),
                "acquireTime": _now_text(),
                "renewTime": _now_text(),
                "leaseTransitions": 0,
            },
        }
        try:
            self.client.create(lease_path(self.namespace), body)
        except ApiError:
            return self._renew_failed(now)
        self._last_renew = now
        self._set_leader(True)
        return True

    def _renew_failed(self, now: float) -> bool:
        if self.is_leader and now - self._last_renew < self.renew_deadline:
            return True  # keep leading while within the renew deadline
        self._set_leader(False)
        return False

    def _set_leader(self, leading: bool) -> None:
        if leading != self.is_leader:
            self.is_leader = leading
            log.info(
                "%s leadership of %s/%s",
                "acquired" if leading else "lost",
                self.namespace,
                self.name,
            )
            if self.on_change is not None:
                self.on_change(leading)

    def release(self) -> None:
        """Give the lease up (shutdown), so a standby does not wait for it to expire."""
        if not self.is_leader:
            return
        try:
            lease = self.client.get(self.path)
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") == self.identity:
                spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=_now_text())
                lease["spec"] = spec
                self.client.replace(self.path, lease)
        except ApiError as exc:
            log.warning("releasing the leader Lease failed: %s", exc)
        self._set_leader(False)

    # --- the loop -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="leader")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.try_acquire_or_renew()
            self._stop.wait(self.retry_period)

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if release:
            self.release()
