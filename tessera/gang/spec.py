"""What a gang is, read from objects any tenant writes (bounded, typed errors).

A pod joins a gang with the label `scheduling.x-k8s.io/pod-group: <name>`; the gang is the
PodGroup of that name in the pod's namespace (`spec.minMember`,
`spec.scheduleTimeoutSeconds`, `spec.minResources`). Where gangs come from is one small interface,
`GangSource`, so that another API (kube-scheduler's Workload) can be a second source.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

from tessera.errors import GangError
from tessera.pod_fields import section
from tessera.quantity import QuantityError, parse_quantity
from tessera.resources import (
    DEFAULT_GANG_TIMEOUT_SECONDS,
    GANG_PREFERRED_TOPOLOGY_ANNOTATION,
    GANG_REQUIRED_TOPOLOGY_ANNOTATION,
    POD_GROUP_GROUP,
    POD_GROUP_LABEL,
    POD_GROUP_PLURAL,
    POD_GROUP_VERSION,
)

MAX_MIN_MEMBER = 10_000
"""More members than any cluster tessera serves can hold at once (5,000 nodes)."""
MAX_TIMEOUT_SECONDS = 86_400
MAX_MIN_RESOURCES = 32
"""Resource names one PodGroup's minResources may list: a node offers a few dozen at most."""
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""A DNS subdomain (object names, namespaces), at most 253 characters."""
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


@dataclass(frozen=True, order=True, slots=True)
class GangKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class MinResources:
    """A PodGroup's `spec.minResources`: what the whole gang needs free before any member is
    placed, by resource name (Kubernetes quantities, so `tessera.dev/gpu: 800` is eight
    whole GPUs, as a pod asks for them)."""

    amounts: tuple[tuple[str, Decimal], ...] = ()
    """(resource name, amount), by name."""

    def __bool__(self) -> bool:
        return bool(self.amounts)


NO_MIN_RESOURCES = MinResources()


@dataclass(frozen=True, slots=True)
class GangSpec:
    key: GangKey
    min_member: int
    timeout_seconds: int
    """How long a reservation waits for its members to bind."""
    min_resources: MinResources = NO_MIN_RESOURCES


@dataclass(frozen=True, slots=True)
class GangTopology:
    """Node label keys: every member in one value of `required`, or none placed; as few
    values of `preferred` as possible."""

    required: str | None = None
    preferred: str | None = None


NO_TOPOLOGY = GangTopology()


def is_label_key(text: str) -> bool:
    """A Kubernetes label key: an optional DNS-subdomain prefix and '/', then a name of at
    most 63 characters."""
    if len(text) > 253 + 1 + 63:
        return False
    prefix, slash, name = text.rpartition("/")
    if slash and not (len(prefix) <= 253 and _LABEL_PREFIX.fullmatch(prefix)):
        return False
    return _LABEL_NAME.fullmatch(name) is not None


def _int(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GangError(f"{where} must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise GangError(f"{where} must be between {low} and {high}, got {value}")
    return value


def parse_min_resources(value: Any, where: str) -> MinResources:
    """`spec.minResources` (`where` names it in errors): a map of at most
    MAX_MIN_RESOURCES resource names (qualified names, as label keys are) to non-negative
    quantities, each bounded as a pod's are. Absent or null: nothing is asked."""
    if value is None:
        return NO_MIN_RESOURCES
    if not isinstance(value, Mapping):
        raise GangError(f"{where} must be a map of resource names to quantities")
    if len(value) > MAX_MIN_RESOURCES:
        raise GangError(f"{where} names more than {MAX_MIN_RESOURCES} resources")
    amounts = []
    for name, quantity in value.items():
        if not isinstance(name, str) or not is_label_key(name):
            shown = name[:64] if isinstance(name, str) else type(name).__name__
            raise GangError(f"{where}: {shown!r} is not a resource name")
        try:
            amount = parse_quantity(quantity)
        except QuantityError as exc:
            raise GangError(f"{where}.{name}: {exc}") from None
        if amount < 0:
            raise GangError(f"{where}.{name} must not be negative")
        amounts.append((name, amount))
    return MinResources(tuple(sorted(amounts)))


def gang_key_of(pod: Mapping[str, Any]) -> GangKey | None:
    """The gang a pod belongs to, by its pod-group label; None when it has none. A label
    value that cannot name a PodGroup raises GangError."""
    meta = section(pod, "metadata")
    value = section(meta, "labels").get(POD_GROUP_LABEL)
    if value is None:
        return None
    namespace = meta.get("namespace")
    if not isinstance(namespace, str) or not _NAME.fullmatch(namespace):
        raise GangError("a gang member needs a valid metadata.namespace")
    if not isinstance(value, str) or not value or len(value) > 63:
        raise GangError(f"label {POD_GROUP_LABEL} must name a PodGroup")
    if not _LABEL_VALUE.fullmatch(value) or not _NAME.fullmatch(value):
        raise GangError(f"label {POD_GROUP_LABEL}: {value!r} cannot name a PodGroup")
    return GangKey(namespace, value)


def topology_of(pod: Mapping[str, Any]) -> GangTopology:
    """A member's gang topology annotations (GangError when one is not a label key)."""
    annotations = section(section(pod, "metadata"), "annotations")
    keys: dict[str, str | None] = {}
    for field, annotation in (
        ("required", GANG_REQUIRED_TOPOLOGY_ANNOTATION),
        ("preferred", GANG_PREFERRED_TOPOLOGY_ANNOTATION),
    ):
        value = annotations.get(annotation)
        if value is None:
            keys[field] = None
            continue
        if not isinstance(value, str) or not is_label_key(value.strip()):
            shown = value[:64] if isinstance(value, str) else type(value).__name__
            raise GangError(f"annotation {annotation}: {shown!r} is not a node label key")
        keys[field] = value.strip()
    return GangTopology(keys["required"], keys["preferred"])


class GangSource(Protocol):
    """Where gangs come from: which gang a pod belongs to, and the gang object's path and
    reading. PodGroups are one source; kube-scheduler's Workload API can be another."""

    @property
    def path(self) -> str:
        """The cluster-wide collection the adapter lists and watches."""
        ...

    @property
    def label(self) -> str:
        """The pod label that names a pod's gang (the adapter watches pods that carry it)."""
        ...

    @property
    def default_timeout(self) -> int:
        """A gang's timeout in seconds where its object does not say (or is missing or
        cannot be read)."""
        ...

    def member_of(self, pod: Mapping[str, Any]) -> GangKey | None: ...

    def topology(self, pod: Mapping[str, Any]) -> GangTopology: ...

    def parse(self, obj: Mapping[str, Any]) -> GangSpec: ...

    def key(self, obj: Mapping[str, Any]) -> GangKey | None:
        """The key of a gang object (None when it names none), for deletions."""
        ...


@dataclass(frozen=True)
class PodGroupSource:
    """scheduler-plugins' PodGroup (scheduling.x-k8s.io/v1alpha1) and its pod label."""

    default_timeout: int = DEFAULT_GANG_TIMEOUT_SECONDS
    path: str = f"/apis/{POD_GROUP_GROUP}/{POD_GROUP_VERSION}/{POD_GROUP_PLURAL}"
    label: str = POD_GROUP_LABEL

    def member_of(self, pod: Mapping[str, Any]) -> GangKey | None:
        return gang_key_of(pod)

    def topology(self, pod: Mapping[str, Any]) -> GangTopology:
        return topology_of(pod)

    def key(self, obj: Mapping[str, Any]) -> GangKey | None:
        meta = section(obj, "metadata")
        namespace, name = meta.get("namespace"), meta.get("name")
        if not isinstance(namespace, str) or not isinstance(name, str):
            return None
        if not _NAME.fullmatch(namespace) or not _NAME.fullmatch(name):
            return None
        return GangKey(namespace, name)

    def parse(self, obj: Mapping[str, Any]) -> GangSpec:
        """A PodGroup's spec (GangError naming the field when it is not usable)."""
        key = self.key(obj)
        if key is None:
            raise GangError("PodGroup needs a valid metadata.namespace and metadata.name")
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        if not isinstance(spec, Mapping):
            raise GangError(f"PodGroup {key}: spec is missing or not an object")
        where = f"PodGroup {key}: spec"
        min_member = _int(spec.get("minMember", 1), f"{where}.minMember", 1, MAX_MIN_MEMBER)
        timeout = spec.get("scheduleTimeoutSeconds")
        seconds = (
            self.default_timeout
            if timeout is None
            else _int(timeout, f"{where}.scheduleTimeoutSeconds", 1, MAX_TIMEOUT_SECONDS)
        )
        resources = parse_min_resources(spec.get("minResources"), f"{where}.minResources")
        return GangSpec(key, min_member, seconds, resources)
