"""GetPreferredAllocation's choice of the allocation record's units (pure, no I/O).

The kubelet's GetPreferredAllocation request names no pod: only the resource's available
unit IDs, the ones it must include and how many it wants. The kubelet admits one pod at a
time and asks per container and per resource, so the container being admitted is the next
one of a pod that is bound to this node and still has no units of that resource. The
adapter (record_pods.py) lists those pods, with their verified records; this module says
which units each one's record needs (`next_demand`) and picks the pod the request is for
(`choose`):

- a pod's containers are admitted in the kubelet's order (init containers, then app
  containers); the next one is the first that asks for the resource after the last one
  known to hold units of it (the kubelet's pod-resources API does not list ordinary init
  containers, so a later container holding units says the earlier ones were served);
- its record says on which devices: one GPU takes the whole request; several GPUs are whole
  GPUs (a share is always of one GPU), every unit of each; NICs take their record share
  each;
- a demand fits a request when it sums to `allocation_size`, the must-include units lie on
  its devices (no more of them per device than it needs) and enough units are available
  on each of its devices;
- one fitting demand is the answer; several that place the same counts on the same devices
  give the same answer; otherwise the oldest pod is taken when it is strictly older than
  every other (the kubelet admits a batch of new pods oldest first). Anything else is
  ambiguous: no choice, and the caller falls back to its default (and says why).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from deviceplugin.units import device_of, unit_number
from tessera.allocation import ContainerAllocation, PodAllocation
from tessera.resources import GPU_MEMORY, GPU_RESOURCES, NVIDIA_GPU, RDMA, UNITS_PER_DEVICE

Plan = tuple[tuple[str, int], ...]
"""(device key, units) in record order: what one container needs of one resource."""


@dataclass(frozen=True)
class PodView:
    """A pod bound to this node, as much of it as the choice needs (one resource)."""

    uid: str
    namespace: str
    name: str
    created: str
    """metadata.creationTimestamp: RFC 3339 in UTC with whole seconds, as the API server
    writes it, so text order is time order."""
    limits: tuple[tuple[str, int], ...]
    """(container, limit of the resource) for every container that asks for it, in the
    kubelet's admission order: init containers first, then app containers."""
    record: PodAllocation
    """The pod's allocation record, already verified for this pod and node."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Demand:
    """The container of `pod` the kubelet admits next, and the units its record needs."""

    pod: PodView
    container: str
    plan: Plan

    @property
    def size(self) -> int:
        return sum(n for _, n in self.plan)


@dataclass(frozen=True)
class Choice:
    """The answer (None: no unambiguous pod) and why, for the log."""

    ids: list[str] | None
    demand: Demand | None
    reason: str


def container_plan(
    resource: str,
    entry: ContainerAllocation,
    limit: int,
    gpu_keys: Mapping[str, str],
    nic_keys: Mapping[str, str],
) -> Plan | None:
    """The units of `resource` the record entry puts on each device, or None when the record
    does not say (no such device here, an uneven split, shares that do not add up)."""
    if limit <= 0:
        return None
    if resource in GPU_RESOURCES:
        keys = [gpu_keys.get(g.uuid) for g in entry.gpus]
        if not keys or any(k is None for k in keys):
            return None
        if len(keys) == 1:
            return ((str(keys[0]), limit),)
        # several GPUs are whole GPUs: every unit of each (memory units never span GPUs)
        whole = 1 if resource == NVIDIA_GPU else UNITS_PER_DEVICE
        if resource == GPU_MEMORY or limit != whole * len(keys):
            return None
        return tuple((str(k), whole) for k in keys)
    if resource == RDMA:
        nics = [(nic_keys.get(r.ibdev), r.share) for r in entry.rdma]
        if not nics or any(k is None or share <= 0 for k, share in nics):
            return None
        if sum(share for _, share in nics) != limit:
            return None
        return tuple((str(k), share) for k, share in nics)
    return None


def next_demand(
    resource: str,
    pod: PodView,
    assigned: AbstractSet[str],
    gpu_keys: Mapping[str, str],
    nic_keys: Mapping[str, str],
) -> Demand | str | None:
    """The pod's next container without units of `resource`: its Demand, a reason when its
    record does not say which units it needs, or None when no container is waiting. The
    next container is the first after the last one in `assigned` (kubelet order)."""
    served = [i for i, (container, _) in enumerate(pod.limits) if container in assigned]
    for container, limit in pod.limits[max(served, default=-1) + 1 :]:
        entry = next((c for c in pod.record.containers if c.name == container), None)
        if entry is None:
            return f"{pod.key}: the record has no container {container!r}"
        plan = container_plan(resource, entry, limit, gpu_keys, nic_keys)
        if plan is None:
            return f"{pod.key}: the record does not place {limit} {resource} of {container!r}"
        return Demand(pod, container, plan)
    return None


def _fit(demand: Demand, free: Mapping[str, list[str]], must: Mapping[str, int], size: int) -> bool:
    if demand.size != size:
        return False
    wanted = dict(demand.plan)
    if any(device not in wanted or count > wanted[device] for device, count in must.items()):
        return False
    return all(len(free.get(d, ())) >= n - must.get(d, 0) for d, n in demand.plan)


def choose(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    demands: Sequence[Demand],
) -> Choice:
    """The record's units for the one pod this request can be for; ids None when no pod fits
    or the fitting pods cannot be told apart. Linear in the request and the demands."""
    must_ids = list(dict.fromkeys(must_include))
    taken = set(must_ids)
    free: dict[str, list[str]] = {}
    for unit in dict.fromkeys(available):
        if unit not in taken:
            free.setdefault(device_of(unit), []).append(unit)
    must: dict[str, int] = {}
    for unit in must_ids:
        must[device_of(unit)] = must.get(device_of(unit), 0) + 1

    fitting = sorted(
        (d for d in demands if _fit(d, free, must, size)),
        key=lambda d: (d.pod.created, d.pod.key, d.container),
    )
    if not fitting:
        return Choice(
            None,
            None,
            f"no pending pod's record needs {size} units on devices with that many free "
            f"({len(demands)} pending)",
        )
    first = fitting[0]
    different = len({d.plan for d in fitting}) > 1
    if different and first.pod.created == fitting[1].pod.created:
        names = ", ".join(d.pod.key for d in fitting[:4])
        return Choice(None, None, f"{len(fitting)} pending pods fit, created together: {names}")
    ids = list(must_ids)
    for device, count in first.plan:
        units = sorted(free.get(device, ()), key=unit_number)
        ids.extend(units[: count - must.get(device, 0)])
    return Choice(ids, first, f"{first.pod.key} container {first.container!r}")
