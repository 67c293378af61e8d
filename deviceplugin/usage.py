"""Every share's real use: the driver's process lists joined with the containers they run in
and what each container's allocation record grants it. Pure: no I/O.

`attribute` takes what NVML listed per GPU, the owner of each PID (from its cgroup) and the
pods the agent knows, and returns one `GpuUse` per container and GPU (used beside granted)
and one `OtherUse` per GPU and owner for whatever is no tessera container's: a host
process, a pod without a tessera record (another device plugin's), the MPS server. Those are
never put on a pod. `OverGrantWatch` says, once per container, GPU and kind, when a share
uses more memory or compute than it was granted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from deviceplugin.backend import GpuProcesses
from tessera.allocation import GpuGrant
from tessera.usage import (
    OWNER_HOST,
    OWNER_OTHER_POD,
    ContainerUsage,
    NodeUsage,
    UnattributedUsage,
)

MIB: Final = 1 << 20
OWNER_CONTAINER: Final = "container"

MEMORY_SLACK_MIB: Final = 256
"""How far past its granted memory a container's driver-reported memory may go before it
counts as over its grant. A layer caps what the program allocates by its own count; the
driver counts a little more (on an H200, a HAMi-core container that filled its 4,096 MiB
showed 4,130 MiB to NVML; docs/isolation.md)."""
COMPUTE_SLACK_PERCENT: Final = 10
"""How many points above its compute share a container's sampled SM use may run."""
COMPUTE_READINGS: Final = 3
"""Consecutive readings over its share before a container counts as over (one reading is
a short burst the driver's sampling caught)."""
MAX_TRACKED: Final = 10_000
"""Containers the over-grant watch remembers; a node runs a few hundred."""


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a GPU process belongs to."""

    kind: str
    """OWNER_CONTAINER, OWNER_HOST or OWNER_MPS_SERVER."""
    pod_uid: str = ""
    container_id: str = ""


@dataclass(frozen=True, slots=True)
class PodView:
    """What the agent knows of a pod on its node."""

    uid: str
    namespace: str
    name: str
    containers: Mapping[str, str] = field(default_factory=dict)
    """Container ID -> container name, from the pod's status."""
    grants: Mapping[str, Mapping[str, GpuGrant]] | None = None
    """Container name -> GPU UUID -> grant, from the allocation record; None when the pod
    has no tessera record (or none that verifies)."""


@dataclass(frozen=True, slots=True)
class GpuUse:
    """One tessera container on one GPU: what it uses beside what it was granted."""

    pod_uid: str
    namespace: str
    pod: str
    container: str
    gpu: str
    gpu_index: int
    used_bytes: int
    sm_percent: int | None
    processes: int
    granted_core: int
    """0 when the record gives this container nothing of this GPU."""
    granted_memory_mib: int

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.pod_uid, self.container, self.gpu)


@dataclass(frozen=True, slots=True)
class OtherUse:
    gpu: str
    gpu_index: int
    owner: str
    used_bytes: int
    processes: int


@dataclass(frozen=True, slots=True)
class UsageSnapshot:
    containers: tuple[GpuUse, ...] = ()
    other: tuple[OtherUse, ...] = ()
    errors: tuple[str, ...] = ()
    """GPUs whose process list could not be read, with why."""

    def report(self, observed: str) -> NodeUsage:
        """The heartbeat's usage annotation."""
        return NodeUsage(
            observed,
            tuple(
                ContainerUsage(
                    u.pod_uid,
                    u.namespace,
                    u.pod,
                    u.container,
                    u.gpu,
                    u.used_bytes // MIB,
                    u.sm_percent,
                )
                for u in self.containers
            ),
            tuple(
                UnattributedUsage(o.gpu, o.owner, o.used_bytes // MIB, o.processes)
                for o in self.other
            ),
        )


def _sum(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def attribute(
    readings: Sequence[GpuProcesses],
    owners: Mapping[int, Owner],
    pods: Mapping[str, PodView],
    gpu_index: Mapping[str, int],
) -> UsageSnapshot:
    """Join the driver's lists with the processes' owners and the pods' records.

    A process of a container counts toward that container when its pod has a tessera
    record naming the container; a process of any other pod is `other-pod`; a PID without
    a known owner (it ended between the two reads) counts as `host`.
    """
    mine: dict[tuple[str, str, str], list[tuple[int | None, int | None]]] = {}
    other: dict[tuple[str, str], list[int | None]] = {}
    views: dict[str, PodView] = {}
    errors: list[str] = []
    for reading in readings:
        if reading.error:
            errors.append(f"{reading.uuid}: {reading.error}")
            continue
        for proc in reading.processes:
            owner = owners.get(proc.pid, Owner(OWNER_HOST))
            pod = pods.get(owner.pod_uid) if owner.kind == OWNER_CONTAINER else None
            name = pod.containers.get(owner.container_id) if pod is not None else None
            if pod is None or pod.grants is None or name is None or name not in pod.grants:
                kind = owner.kind if owner.kind != OWNER_CONTAINER else OWNER_OTHER_POD
                other.setdefault((reading.uuid, kind), []).append(proc.used_bytes)
                continue
            views[pod.uid] = pod
            mine.setdefault((pod.uid, name, reading.uuid), []).append(
                (proc.used_bytes, proc.sm_percent)
            )
    uses = []
    for (uid, name, gpu), procs in sorted(mine.items()):
        pod = views[uid]
        grant = (pod.grants or {}).get(name, {}).get(gpu)
        uses.append(
            GpuUse(
                uid,
                pod.namespace,
                pod.name,
                name,
                gpu,
                gpu_index.get(gpu, -1),
                sum(used or 0 for used, _ in procs),
                _sum(sm for _, sm in procs),
                len(procs),
                grant.core if grant is not None else 0,
                grant.memory_mib if grant is not None else 0,
            )
        )
    others = [
        OtherUse(gpu, gpu_index.get(gpu, -1), kind, sum(u or 0 for u in used), len(used))
        for (gpu, kind), used in sorted(other.items())
    ]
    return UsageSnapshot(tuple(uses), tuple(others), tuple(errors))


@dataclass(frozen=True, slots=True)
class Breach:
    """A container seen using more of a GPU than its record grants."""

    use: GpuUse
    kind: str
    """"memory" or "compute"."""

    def describe(self) -> str:
        u = self.use
        if self.kind == "memory":
            figures = (
                f"uses {u.used_bytes // MIB:,} MiB of GPU memory, granted "
                f"{u.granted_memory_mib:,} MiB"
            )
        else:
            figures = f"uses {u.sm_percent}% of the GPU's time, granted {u.granted_core}%"
        return (
            f"pod={u.namespace}/{u.pod} container={u.container} GPU {u.gpu} (index "
            f"{u.gpu_index}): {figures}"
        )


class OverGrantWatch:
    """Which containers use more than their grant; each (container, GPU, kind) is reported
    once for as long as the container is seen (again after it was gone and came back)."""

    def __init__(
        self,
        memory_slack_mib: int = MEMORY_SLACK_MIB,
        compute_slack: int = COMPUTE_SLACK_PERCENT,
        compute_readings: int = COMPUTE_READINGS,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self.memory_slack_mib = memory_slack_mib
        self.compute_slack = compute_slack
        self.compute_readings = compute_readings
        self.max_tracked = max_tracked
        self._reported: set[tuple[str, str, str, str]] = set()
        self._compute_streak: dict[tuple[str, str, str], int] = {}
        self.counts: dict[str, int] = {"memory": 0, "compute": 0}
        """Containers found over their grant since the start, by kind."""

    def _over_memory(self, use: GpuUse) -> bool:
        return use.used_bytes > (use.granted_memory_mib + self.memory_slack_mib) * MIB

    def _over_compute(self, use: GpuUse) -> bool:
        return use.sm_percent is not None and (
            use.sm_percent > use.granted_core + self.compute_slack
        )

    def observe(self, snapshot: UsageSnapshot) -> list[Breach]:
        """The breaches first seen in this reading."""
        seen = {u.key for u in snapshot.containers}
        self._reported = {r for r in self._reported if r[:3] in seen}
        self._compute_streak = {k: v for k, v in self._compute_streak.items() if k in seen}
        found: list[Breach] = []
        for use in snapshot.containers:
            streak = self._compute_streak.get(use.key, 0) + 1 if self._over_compute(use) else 0
            if streak:
                self._compute_streak[use.key] = streak
            else:
                self._compute_streak.pop(use.key, None)
            over = {"memory": self._over_memory(use), "compute": streak >= self.compute_readings}
            for kind, now in over.items():
                key = (*use.key, kind)
                if now and key not in self._reported and len(self._reported) < self.max_tracked:
                    self._reported.add(key)
                    self.counts[kind] += 1
                    found.append(Breach(use, kind))
        return found
