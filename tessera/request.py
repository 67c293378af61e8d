"""Turn a pod (Kubernetes JSON as a dict) into per-container device requests.

Every rule lives here, checked once; a broken rule raises RequestError naming the
container, the resource and the rule (docs/resources.md lists them for users).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from tessera import nri_required
from tessera import resources as rn
from tessera.errors import RequestError
from tessera.quantity import MAX_QUANTITY, cpu_millis, memory_mib, whole_count
from tessera.topology import Scope, Tier

_SHARE_MAX = rn.UNITS_PER_DEVICE
MAX_DEVICE_COUNT: Final = 2**24
"""Largest count of any device resource in one container. No node offers more units of any
device resource (2^24 one-MiB memory units would be 16 TiB on one GPU); the bound keeps
every product of a count and a unit size inside the scheduler's int64 columns."""


@dataclass(frozen=True)
class GpuAsk:
    """The GPU part of a request, in one of three forms: no GPU (every field 0), a share of
    one GPU (`core` percent plus a memory bound), or `gpu_count` whole GPUs."""

    gpu_count: int = 0
    """Whole GPUs (0 for a share or no GPU)."""
    core: int = 0
    """Compute share in percent of one GPU, for a share (0 = no compute guarantee)."""
    memory_ratio: int = 0
    """Memory in percent of the chosen GPU, for a share (0 = not given)."""
    memory_units: int = 0
    """Memory in the node's memory units, for a share (0 = not given)."""


@dataclass(frozen=True)
class ContainerRequest(GpuAsk):
    """What one container asks of tessera: its GPU ask, its RDMA ask, and what kind of
    container it is."""

    name: str = field(kw_only=True)
    rdma_share: int = 0
    """Percent of one RDMA NIC (1..100), 0 when whole NICs or none."""
    rdma_count: int = 0
    """Whole RDMA NICs."""
    init: bool = False
    sidecar: bool = False
    """An init container with restartPolicy Always: it runs beside the app containers."""

    @property
    def is_share(self) -> bool:
        return self.gpu_count == 0 and (self.memory_ratio > 0 or self.memory_units > 0)

    @property
    def wants_gpu(self) -> bool:
        return self.gpu_count > 0 or self.is_share

    @property
    def wants_rdma(self) -> bool:
        return self.rdma_share > 0 or self.rdma_count > 0

    @property
    def wants_devices(self) -> bool:
        return self.wants_gpu or self.wants_rdma

    def memory_mib_on(self, gpu_memory_mib: int, unit_mib: int) -> int:
        """The memory this share needs on a GPU of the given size."""
        if self.memory_units:
            return self.memory_units * unit_mib
        return gpu_memory_mib * self.memory_ratio // _SHARE_MAX

    @property
    def gpu_fraction(self) -> float:
        """GPU demand in GPUs, for statistics (a share counts its compute, else its memory)."""
        if self.gpu_count:
            return float(self.gpu_count)
        if not self.is_share:
            return 0.0
        return (self.core or self.memory_ratio) / _SHARE_MAX

    def shape(self) -> tuple[int, ...]:
        """Everything but the name: requests with equal shapes fit equally."""
        return (
            self.gpu_count,
            self.core,
            self.memory_ratio,
            self.memory_units,
            self.rdma_share,
            self.rdma_count,
            int(self.init),
            int(self.sidecar),
        )


@dataclass(frozen=True)
class PodHints:
    """The optional hint annotations of a pod, validated."""

    models: frozenset[str] = frozenset()
    """Allowed GPU models; empty means any."""
    uuids: frozenset[str] = frozenset()
    """Allowed GPU UUIDs; empty means any."""
    excluded_uuids: frozenset[str] = frozenset()
    topology: Scope | None = None
    """Required scope for multi-GPU containers; None prefers the tightest, requires nothing."""
    rdma_affinity: Tier | None = None
    """Loosest allowed tier between a container's RDMA NICs and its GPUs."""
    placement: str | None = None
    """Per-pod policy override."""


@dataclass(frozen=True)
class PodRequest:
    namespace: str
    name: str
    uid: str
    containers: tuple[ContainerRequest, ...]
    """Containers that want devices, app containers first, in pod order."""
    hints: PodHints = PodHints()
    cpu_milli: int = 0
    """The pod's effective CPU request (Kubernetes' rule: max of init, sum of app)."""
    memory_mib: int = 0
    required_plugins: tuple[str, ...] = ()
    """NRI plugins its containers must be created through, written with its record
    (tessera.nri_required); empty: nothing to write."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def wants_devices(self) -> bool:
        return bool(self.containers)

    @property
    def gpu_demand(self) -> float:
        """GPUs this pod holds, in GPUs, counting app and sidecar containers."""
        return sum(c.gpu_fraction for c in self.containers if not c.init or c.sidecar)

    def shape(self) -> tuple[object, ...]:
        """Two requests with equal shapes get equal fit and score on any node."""
        return (
            tuple(c.shape() for c in self.containers),
            self.hints,
            self.cpu_milli,
            self.memory_mib,
        )


# --- parsing --------------------------------------------------------------------------------


def parse_pod(
    pod: Mapping[str, Any], *, nvidia_gpu_enabled: bool = True, nri_plugin: str | None = None
) -> PodRequest:
    """Parse a pod dict. Raises RequestError on any broken rule.

    `nvidia_gpu_enabled` says whether tessera manages `nvidia.com/gpu` in this cluster; when
    it does not, that resource is left alone (another plugin owns it). `nri_plugin`, when
    given, is the NRI hook's name, which a pod that wants devices must require of
    containerd (with the plugins the pod already requires, `required_plugins`).
    """
    meta, spec, annotations = _sections(pod)
    return _identified(meta, _parse_body(spec, annotations, nvidia_gpu_enabled, nri_plugin))


class PodParser:
    """`parse_pod` with a memory of the last few pod bodies it parsed.

    Why: the pods of one job carry the same containers and annotations, and only their
    names and UIDs differ, yet each was parsed afresh (quantities through Decimal, every
    rule checked again): 45-100 µs of a 500-name filter. A pod whose body equals one of the
    last `size` parsed is given that body's parse, under its own name and UID.

    Exact: the body is what `parse_pod` reads beyond the pod's identity (each container's
    name, resources and restartPolicy, the spec's overhead, the annotations in
    READ_ANNOTATIONS), and only bodies whose every value is a string or null are kept.
    Python's `==` takes 1, 1.0 and true as equal, so a body holding numbers or booleans
    could match one the rules read differently; a body equal to one of strings and nulls
    holds exactly those strings and nulls. A body that breaks a rule is never kept (it
    raises again, the same way)."""

    def __init__(
        self, *, nvidia_gpu_enabled: bool = True, nri_plugin: str | None = None, size: int = 8
    ) -> None:
        self.nvidia_gpu_enabled = nvidia_gpu_enabled
        self.nri_plugin = nri_plugin
        self.size = size
        self._recent: list[tuple[tuple[object, ...], _Body]] = []
        """(body key, its parse), newest first; replaced whole, never changed in place, so
        a reader on another thread sees one version or the next."""

    def parse(self, pod: Mapping[str, Any]) -> PodRequest:
        meta, spec, annotations = _sections(pod)
        key = _body_key(spec, annotations)
        if key is not None:
            for seen, body in self._recent:
                if seen == key:
                    return _identified(meta, body)
        body = _parse_body(spec, annotations, self.nvidia_gpu_enabled, self.nri_plugin)
        if key is not None and _strings_only(key):
            self._recent = [(key, body), *self._recent[: self.size - 1]]
        return _identified(meta, body)


READ_ANNOTATIONS: Final = (
    *rn.HINT_ANNOTATIONS,
    rn.NRI_REQUIRED_PLUGINS_POD_ANNOTATION,
    rn.NRI_REQUIRED_PLUGINS_ANNOTATION,
)
"""Every annotation a pod's parse reads (PodParser's memory keys on them)."""

_ABSENT: Final = object()
"""An annotation the pod does not have (a null one is read differently)."""


@dataclass(frozen=True)
class _Body:
    """A pod's parse apart from its identity."""

    containers: tuple[ContainerRequest, ...]
    hints: PodHints
    cpu_milli: int
    memory_mib: int
    required_plugins: tuple[str, ...]


def _sections(pod: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any], Any]:
    """(metadata, spec, annotations), each checked to be an object."""
    if not isinstance(pod, Mapping):
        raise RequestError(None, None, "the pod must be a JSON object")
    meta = pod.get("metadata")
    spec = pod.get("spec")
    meta = {} if meta is None else meta
    spec = {} if spec is None else spec
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        raise RequestError(None, None, "pod metadata and spec must be JSON objects")
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        raise RequestError(None, None, "metadata.annotations must be a JSON object")
    return meta, spec, annotations


def _identified(meta: Mapping[str, Any], body: _Body) -> PodRequest:
    return PodRequest(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        containers=body.containers,
        hints=body.hints,
        cpu_milli=body.cpu_milli,
        memory_mib=body.memory_mib,
        required_plugins=body.required_plugins,
    )


def _body_key(spec: Mapping[str, Any], annotations: Mapping[str, Any]) -> tuple[object, ...] | None:
    """What `_parse_body` reads of the pod, as a value to compare; None when the spec is
    not shaped as the API server stores it (then the pod is parsed, never remembered)."""
    lists: list[object] = []
    for key in ("containers", "initContainers"):
        raw_list = spec.get(key)
        if raw_list is None:
            lists.append(None)
            continue
        if type(raw_list) is not list:
            return None
        read = []
        for raw in raw_list:
            if type(raw) is not dict:
                return None
            read.append((raw.get("name"), raw.get("resources"), raw.get("restartPolicy")))
        lists.append(tuple(read))
    shown = tuple(annotations.get(key, _ABSENT) for key in READ_ANNOTATIONS)
    return (*lists, spec.get("overhead"), shown)


def _strings_only(value: object) -> bool:
    """Whether every leaf of `value` (tuples, lists and dicts of JSON) is a string, null
    or _ABSENT, and every dict key a string."""
    todo = [value]
    while todo:
        item = todo.pop()
        kind = type(item)
        if kind is tuple or kind is list:
            todo.extend(item)  # type: ignore[arg-type]
        elif kind is dict:
            if not all(type(name) is str for name in item):  # type: ignore[attr-defined]
                return False
            todo.extend(item.values())  # type: ignore[attr-defined]
        elif not (kind is str or item is None or item is _ABSENT):
            return False
    return True


def _parse_body(
    spec: Mapping[str, Any],
    annotations: Mapping[str, Any],
    nvidia_gpu_enabled: bool,
    nri_plugin: str | None,
) -> _Body:
    containers: list[ContainerRequest] = []
    app_cpu = app_mem = init_cpu = init_mem = sidecar_cpu = sidecar_mem = 0
    for init, key in ((False, "containers"), (True, "initContainers")):
        raw_list = spec.get(key) or []
        if not isinstance(raw_list, list):
            raise RequestError(None, None, f"spec.{key} must be a list")
        for raw in raw_list:
            if not isinstance(raw, Mapping):
                raise RequestError(None, None, f"spec.{key} holds a non-object")
            request, cpu, mem = _parse_container(raw, init, nvidia_gpu_enabled)
            if request.wants_devices:
                containers.append(request)
            if not init:
                app_cpu, app_mem = app_cpu + cpu, app_mem + mem
            elif request.sidecar:
                # Sidecars keep running, so they add to the app containers (KEP-753).
                sidecar_cpu, sidecar_mem = sidecar_cpu + cpu, sidecar_mem + mem
            else:
                init_cpu = max(init_cpu, sidecar_cpu + cpu)
                init_mem = max(init_mem, sidecar_mem + mem)
    overhead = spec.get("overhead") or {}
    cpu_total = max(app_cpu + sidecar_cpu, init_cpu) + _host(overhead, "cpu", cpu_millis, None)
    mem_total = max(app_mem + sidecar_mem, init_mem) + _host(overhead, "memory", memory_mib, None)
    for resource, total in (("cpu", cpu_total), ("memory", mem_total)):
        if total > MAX_QUANTITY:
            raise RequestError(None, resource, f"the pod's total is above {MAX_QUANTITY}")

    hints = parse_hints(annotations) if containers else PodHints()
    _check_hints_fit(containers, hints)
    required = (
        nri_required.required_plugins(annotations, nri_plugin)
        if containers and nri_plugin is not None
        else ()
    )
    return _Body(tuple(containers), hints, cpu_total, mem_total, required)


def _host(amounts: Any, key: str, convert: Any, container: str | None) -> int:
    if not isinstance(amounts, Mapping) or key not in amounts:
        return 0
    try:
        return int(convert(amounts[key]))
    except ValueError as exc:
        raise RequestError(container, key, str(exc)) from None


def _parse_container(
    raw: Mapping[str, Any], init: bool, nvidia_gpu_enabled: bool
) -> tuple[ContainerRequest, int, int]:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise RequestError(None, None, "every container needs a name")
    res = raw.get("resources") or {}
    if not isinstance(res, Mapping):
        raise RequestError(name, None, "resources must be a JSON object")
    limits = res.get("limits") or {}
    requests = res.get("requests") or {}
    if not isinstance(limits, Mapping) or not isinstance(requests, Mapping):
        raise RequestError(name, None, "resources.limits and resources.requests must be objects")

    managed = set(rn.TESSERA_RESOURCES) | ({rn.NVIDIA_GPU} if nvidia_gpu_enabled else set())
    counts: dict[str, int] = {}
    for resource in set(limits) | set(requests):
        if not isinstance(resource, str):
            continue
        if resource.startswith(rn.DOMAIN + "/") and resource not in rn.TESSERA_RESOURCES:
            known = ", ".join(rn.TESSERA_RESOURCES)
            raise RequestError(name, resource, f"unknown tessera resource (known: {known})")
        if resource not in managed:
            continue
        counts[resource] = _count(name, resource, limits.get(resource), requests.get(resource))

    cpu = _host(requests, "cpu", cpu_millis, name) or _host(limits, "cpu", cpu_millis, name)
    mem = _host(requests, "memory", memory_mib, name) or _host(limits, "memory", memory_mib, name)
    sidecar = init and raw.get("restartPolicy") == "Always"
    request = _container_request(name, counts, init, sidecar)
    return request, cpu, mem


def _count(container: str, resource: str, limit: Any, request: Any) -> int:
    try:
        lim = whole_count(limit) if limit is not None else None
        req = whole_count(request) if request is not None else None
    except ValueError as exc:
        raise RequestError(container, resource, str(exc)) from None
    for value in (lim, req):
        if value is not None and value > MAX_DEVICE_COUNT:
            raise RequestError(
                container, resource, f"{value} is above the limit of {MAX_DEVICE_COUNT}"
            )
    if lim is not None and req is not None and lim != req:
        raise RequestError(
            container, resource, f"request ({req}) must equal limit ({lim}) for device resources"
        )
    return lim if lim is not None else (req or 0)


def _whole_or_share(container: str, resource: str, value: int) -> tuple[int, int]:
    """(whole devices, share percent) for a percent resource."""
    if value <= _SHARE_MAX:
        return (1, 0) if value == _SHARE_MAX else (0, value)
    if value % _SHARE_MAX:
        raise RequestError(
            container,
            resource,
            f"{value} is above {_SHARE_MAX} and not a multiple of {_SHARE_MAX}; a share above "
            f"{_SHARE_MAX} means whole devices ({_SHARE_MAX} per device)",
        )
    return value // _SHARE_MAX, 0


def _container_request(
    name: str, counts: Mapping[str, int], init: bool, sidecar: bool
) -> ContainerRequest:
    gpu = counts.get(rn.GPU, 0)
    core = counts.get(rn.GPU_CORE, 0)
    ratio = counts.get(rn.GPU_MEMORY_RATIO, 0)
    units = counts.get(rn.GPU_MEMORY, 0)
    nvidia = counts.get(rn.NVIDIA_GPU, 0)
    rdma = counts.get(rn.RDMA, 0)

    fine = [r for r in (rn.GPU_CORE, rn.GPU_MEMORY_RATIO, rn.GPU_MEMORY) if counts.get(r, 0)]
    if gpu and fine:
        raise RequestError(
            name,
            rn.GPU,
            f"already means compute and memory together; do not combine it with {fine[0]}",
        )
    if nvidia and (gpu or fine):
        other = rn.GPU if gpu else fine[0]
        raise RequestError(
            name, rn.NVIDIA_GPU, f"asks for whole GPUs; do not combine it with {other}"
        )
    if ratio and units:
        raise RequestError(
            name,
            rn.GPU_MEMORY,
            f"give the memory bound once: either {rn.GPU_MEMORY_RATIO} or {rn.GPU_MEMORY}",
        )

    whole = share_core = share_ratio = share_units = 0
    if nvidia:
        whole = nvidia
    elif gpu:
        whole, share = _whole_or_share(name, rn.GPU, gpu)
        share_core = share_ratio = share
    elif core or ratio or units:
        core_whole, core_share = _whole_or_share(name, rn.GPU_CORE, core) if core else (0, 0)
        ratio_whole, ratio_share = (
            _whole_or_share(name, rn.GPU_MEMORY_RATIO, ratio) if ratio else (0, 0)
        )
        if core_whole or ratio_whole:
            whole = core_whole or ratio_whole
            if core and ratio and (core_whole, core_share) != (ratio_whole, ratio_share):
                raise RequestError(
                    name,
                    rn.GPU_MEMORY_RATIO,
                    f"{rn.GPU_CORE}={core} asks for whole GPUs; the memory ratio must then be "
                    f"{core} or left out, got {ratio}",
                )
            if (core and not core_whole) or (ratio and not ratio_whole):
                raise RequestError(
                    name,
                    rn.GPU_CORE if core_share else rn.GPU_MEMORY_RATIO,
                    "whole GPUs and a share cannot be mixed in one container",
                )
            if units:
                raise RequestError(
                    name, rn.GPU_MEMORY, "whole GPUs come with all their memory; leave this out"
                )
        else:
            if core and not (ratio or units):
                raise RequestError(
                    name,
                    rn.GPU_CORE,
                    f"a compute share needs a memory bound: add {rn.GPU_MEMORY_RATIO} or "
                    f"{rn.GPU_MEMORY}",
                )
            share_core, share_ratio, share_units = core_share, ratio_share, units

    rdma_whole, rdma_share = _whole_or_share(name, rn.RDMA, rdma) if rdma else (0, 0)
    return ContainerRequest(
        name=name,
        gpu_count=whole,
        core=share_core,
        memory_ratio=share_ratio,
        memory_units=share_units,
        rdma_share=rdma_share,
        rdma_count=rdma_whole,
        init=init,
        sidecar=sidecar,
    )


def _csv(value: Any, key: str) -> frozenset[str]:
    if not isinstance(value, str):
        raise RequestError(None, key, "annotation values must be strings")
    items = [item.strip() for item in value.split(",")]
    if any(not item for item in items):
        raise RequestError(None, key, f"empty item in comma-separated list {value!r}")
    return frozenset(items)


def parse_hints(annotations: Mapping[str, Any]) -> PodHints:
    """Validate the hint annotations (all optional)."""
    models = (
        _csv(annotations[rn.GPU_MODEL_ANNOTATION], rn.GPU_MODEL_ANNOTATION)
        if (rn.GPU_MODEL_ANNOTATION in annotations)
        else frozenset()
    )
    uuids = (
        _csv(annotations[rn.GPU_UUID_ANNOTATION], rn.GPU_UUID_ANNOTATION)
        if (rn.GPU_UUID_ANNOTATION in annotations)
        else frozenset()
    )
    excluded = (
        _csv(annotations[rn.GPU_UUID_EXCLUDE_ANNOTATION], rn.GPU_UUID_EXCLUDE_ANNOTATION)
        if rn.GPU_UUID_EXCLUDE_ANNOTATION in annotations
        else frozenset()
    )
    both = uuids & excluded
    if both:
        raise RequestError(
            None,
            rn.GPU_UUID_EXCLUDE_ANNOTATION,
            f"{sorted(both)[0]} is both allowed ({rn.GPU_UUID_ANNOTATION}) and excluded",
        )

    topology = None
    if rn.TOPOLOGY_ANNOTATION in annotations:
        try:
            topology = Scope.parse(str(annotations[rn.TOPOLOGY_ANNOTATION]))
        except ValueError as exc:
            raise RequestError(None, rn.TOPOLOGY_ANNOTATION, str(exc)) from None

    affinity = None
    if rn.RDMA_AFFINITY_ANNOTATION in annotations:
        text = str(annotations[rn.RDMA_AFFINITY_ANNOTATION]).strip().lower()
        allowed = {"pcie": Tier.PCIE_ROOT, "numa": Tier.NUMA}
        if text not in allowed:
            raise RequestError(
                None, rn.RDMA_AFFINITY_ANNOTATION, f"unknown value {text!r} (one of pcie, numa)"
            )
        affinity = allowed[text]

    placement = None
    if rn.PLACEMENT_ANNOTATION in annotations:
        placement = str(annotations[rn.PLACEMENT_ANNOTATION]).strip().lower()
        if placement not in rn.PLACEMENT_POLICIES:
            raise RequestError(
                None,
                rn.PLACEMENT_ANNOTATION,
                f"unknown policy {placement!r} (one of {', '.join(rn.PLACEMENT_POLICIES)})",
            )
    return PodHints(models, uuids, excluded, topology, affinity, placement)


def _check_hints_fit(containers: Iterable[ContainerRequest], hints: PodHints) -> None:
    wanted = [c for c in containers if c.gpu_count > 0]
    if hints.uuids and wanted:
        biggest = max(wanted, key=lambda c: c.gpu_count)
        if biggest.gpu_count > len(hints.uuids):
            raise RequestError(
                biggest.name,
                rn.GPU_UUID_ANNOTATION,
                f"asks for {biggest.gpu_count} whole GPUs but only {len(hints.uuids)} UUIDs are "
                "allowed",
            )
