"""The usage loop: every interval, which processes use each GPU and whose they are.

One reading: the backend's process lists (NVML), each PID's cgroup and command name from
the host's `/proc` (`proc_root`; NVML gives host PIDs, and the DaemonSet mounts the host's
`/proc` read-only rather than joining its PID namespace), the pods
that own them (listed from the API server only when a pod not yet known appears, at most
every `POD_REFRESH_S`), then `usage.attribute`. The reading feeds the metrics, the
over-grant warnings (logged once per container) and the heartbeat's usage annotation.

Failures never stop the loop: an unreadable process list is reported per GPU, a PID gone
between two reads counts as a host process, an unreachable API server leaves pods unnamed
(their use counts as `other-pod` until they can be named), each logged once per cause.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from deviceplugin.backend import GpuBackend
from deviceplugin.cgroups import container_of, runtime_container_id
from deviceplugin.usage import (
    OWNER_CONTAINER,
    Breach,
    OverGrantWatch,
    Owner,
    PodView,
    UsageSnapshot,
    attribute,
)
from tessera.allocation import GpuGrant
from tessera.pod_fields import section
from tessera.resources import ALLOCATION_ANNOTATION
from tessera.usage import OWNER_HOST, OWNER_MPS_SERVER, encode_usage
from tessera_edge.threads import Repeating

if TYPE_CHECKING:
    from tessera.record import KeySource

log = logging.getLogger(__name__)

DEFAULT_USAGE_INTERVAL_S: Final = 10.0
POD_REFRESH_S: Final = 30.0
"""Least time between two listings of the node's pods (only when an unknown pod shows up
on a GPU): a pod that starts using a GPU is named within this long."""
MPS_SERVER_COMMAND: Final = "nvidia-cuda-mps-server"
MAX_PROC_READ: Final = 64 * 1024


class PodSource(Protocol):
    def pods(self, wanted: set[str]) -> Mapping[str, PodView]:
        """The pods of these UIDs that can be named now (others are left out)."""
        ...


def _read(path: Path) -> str:
    with path.open("rb") as f:
        return f.read(MAX_PROC_READ).decode("utf-8", "replace")


def process_owner(proc_root: Path, pid: int) -> Owner:
    """Whose a process is, from /proc; a process that is gone is the host's."""
    try:
        command = _read(proc_root / str(pid) / "comm").strip()
        cgroup = _read(proc_root / str(pid) / "cgroup")
    except OSError:
        return Owner(OWNER_HOST)
    if command == MPS_SERVER_COMMAND:
        return Owner(OWNER_MPS_SERVER)
    ref = container_of(cgroup)
    if ref is None:
        return Owner(OWNER_HOST)
    return Owner(OWNER_CONTAINER, ref.pod_uid, ref.container_id)


def pod_view(
    pod: Mapping[str, Any], node: str, keys: KeySource | None, require_integrity: bool
) -> PodView | None:
    """A pod object (as the API server lists it) as the usage loop needs it; None when it
    names no UID. With `require_integrity` the record must verify with `keys`."""
    meta, status = section(pod, "metadata"), section(pod, "status")
    uid, ns, name = (str(meta.get(k) or "") for k in ("uid", "namespace", "name"))
    if not uid:
        return None
    containers: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        entries = status.get(key)
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, Mapping) and isinstance(entry.get("containerID"), str):
                containers[runtime_container_id(entry["containerID"])] = str(entry.get("name"))
    text = section(meta, "annotations").get(ALLOCATION_ANNOTATION)
    grants: dict[str, dict[str, GpuGrant]] | None = None
    if isinstance(text, str):
        # imported here: without a cluster the loop names no pods, and the record's
        # signature code (the cryptography package, ~7 MB) is not loaded for nothing
        from tessera.record import decode

        try:
            record = decode(
                text,
                keys,
                require_integrity=require_integrity,
                pod_uid=uid,
                node=node,
                namespace=ns,
                name=name,
            )
            grants = {c.name: {g.uuid: g for g in c.gpus} for c in record.containers}
        except Exception as exc:  # a tenant's text: a pod we cannot trust, never a failure
            log.debug("usage: pod %s/%s: record not used: %s", ns, name, type(exc).__name__)
    return PodView(uid, ns, name, containers, grants)


class ApiPods:
    """Pods from the API server: the node's pods, listed again only when a pod not yet
    known is asked for and the last listing is older than `refresh_s`."""

    def __init__(
        self,
        list_pods: Callable[[], list[dict[str, Any]]],
        node: str,
        keys: KeySource | None,
        refresh_s: float = POD_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._list = list_pods
        self.node = node
        self.keys = keys
        self.refresh_s = refresh_s
        self.clock = clock
        self._known: dict[str, PodView] = {}
        self._listed_at = float("-inf")
        self.listings = 0
        self.error = ""

    def pods(self, wanted: set[str]) -> Mapping[str, PodView]:
        missing = wanted - self._known.keys()
        now = self.clock()
        if missing and now - self._listed_at >= self.refresh_s:
            self._listed_at = now
            try:
                listed = self._list()
            except Exception as exc:  # PodLookupError, or whatever the client raised
                if str(exc) != self.error:
                    log.warning("usage: cannot name the pods using GPUs: %s", exc)
                self.error = str(exc)
            else:
                self.listings += 1
                self.error = ""
                ring = self.keys.get() if self.keys is not None else None
                require = self.keys is not None
                views = (pod_view(p, self.node, ring, require) for p in listed)
                self._known = {v.uid: v for v in views if v is not None}
        return {uid: self._known[uid] for uid in wanted if uid in self._known}


class UsageMonitor:
    def __init__(
        self,
        backend: GpuBackend,
        gpu_index: Callable[[], Mapping[str, int]],
        pods: PodSource | None = None,
        proc_root: str | Path = "/proc",
        interval_s: float = DEFAULT_USAGE_INTERVAL_S,
        watch: OverGrantWatch | None = None,
    ) -> None:
        self.backend = backend
        self.gpu_index = gpu_index
        self.pod_source = pods
        self.proc_root = Path(proc_root)
        self.interval_s = interval_s
        self.watch = watch or OverGrantWatch()
        self.latest = UsageSnapshot()
        self.observed = ""
        """When `latest` was read (RFC 3339, UTC); empty before the first reading."""
        self.readings = 0
        self.failures = 0
        self.cpu_seconds = 0.0
        """CPU time the readings took (this thread's), for the benchmark and the metrics."""
        self._errors: set[str] = set()
        self._loop = Repeating("usage", interval_s, self._read, log, "usage", wait_first=True)

    def read_once(self) -> UsageSnapshot:
        started = time.thread_time()
        readings = self.backend.processes()
        pids = {p.pid for r in readings for p in r.processes}
        owners = {pid: process_owner(self.proc_root, pid) for pid in pids}
        wanted = {o.pod_uid for o in owners.values() if o.kind == OWNER_CONTAINER}
        pods = self.pod_source.pods(wanted) if self.pod_source is not None and wanted else {}
        snapshot = attribute(readings, owners, pods, self.gpu_index())
        for breach in self.watch.observe(snapshot):
            _warn(breach)
        errors = set(snapshot.errors)
        for error in errors - self._errors:
            log.warning("usage: cannot read the processes of GPU %s", error)
        self._errors = errors
        self.latest = snapshot
        self.observed = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.readings += 1
        self.cpu_seconds += time.thread_time() - started
        return snapshot

    def annotation(self) -> str | None:
        """The heartbeat's usage annotation; None before the first reading."""
        if not self.observed:
            return None
        return encode_usage(self.latest.report(self.observed))

    def _read(self) -> None:
        try:
            self.read_once()
        except Exception:
            self.failures += 1
            log.exception("usage reading")

    def start(self) -> None:
        """The first reading now, then one every `interval_s` on a thread of its own."""
        self._read()
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()


def _warn(breach: Breach) -> None:
    log.warning("GPU share over its grant (%s): %s", breach.kind, breach.describe())
