"""The node inventory for the scheduler: the NodeDevices custom resource, node labels and the
heartbeat Lease.

- NodeDevices (`tessera.dev/v1alpha1`, cluster-scoped, named after the node, owned by the
  Node): `spec` is exactly `NodeInventory.to_dict()` plus a `summary` for the printer columns.
  It is written only when the spec differs from what the API server holds (a GET, compare,
  then create or replace with the resourceVersion read; a conflict re-reads and retries).
  `status` belongs to the scheduler and is never written here.
- Node labels: GPU model, count and memory (MiB), sanitized to valid label values, and the
  GPU isolation layer (when the agent reports one); patched only when they differ.
- Heartbeat: a `coordination.k8s.io/v1` Lease per node agent, renewed every few seconds, so the
  scheduler can tell a live agent from a dead one. It carries the agent's last usage reading
  (which container uses how much of each GPU) as the `tessera.dev/gpu-usage` annotation.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kube_edge.client import STRATEGIC_MERGE_PATCH, KubeClient
from kube_edge.errors import ApiError
from tessera.model import NodeInventory
from tessera.resources import (
    DEFAULT_HEARTBEAT_NAMESPACE,
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_MODEL_LABEL,
    HEARTBEAT_LEASE_PREFIX,
    INVENTORY_API_VERSION,
    INVENTORY_GROUP,
    INVENTORY_KIND,
    INVENTORY_PLURAL,
    INVENTORY_VERSION,
    ISOLATION_LABEL,
    USAGE_ANNOTATION,
)

MAX_ANSWER_BYTES = 4 * 1024 * 1024
"""Largest API answer the agent reads: it reads one Node, its Lease and its NodeDevices
object, each at most 1.5 MiB (etcd's default request limit); a longer answer is refused
(ApiError) without being read to the end."""

log = logging.getLogger(__name__)

MIXED_MODELS = "mixed"
"""The model in the summary and the label when a node has GPUs of several models."""
DEFAULT_LEASE_DURATION_S = 40
DEFAULT_HEARTBEAT_INTERVAL_S = 10.0
DEFAULT_RESYNC_INTERVAL_S = 300.0
"""How often the NodeDevices object and labels are compared with the API server."""
LEASE_API = "/apis/coordination.k8s.io/v1"


def gpu_model(inventory: NodeInventory) -> str:
    models = {g.model for g in inventory.gpus}
    if not models:
        return ""
    return models.pop() if len(models) == 1 else MIXED_MODELS


def summary(inventory: NodeInventory) -> dict[str, Any]:
    return {
        "gpuCount": len(inventory.gpus),
        "healthyGpuCount": sum(1 for g in inventory.gpus if g.healthy),
        "gpuModel": gpu_model(inventory),
        "rdmaCount": len(inventory.nics),
        "healthyRdmaCount": sum(1 for n in inventory.nics if n.healthy),
    }


def cr_spec(inventory: NodeInventory) -> dict[str, Any]:
    spec = inventory.to_dict()
    spec["summary"] = summary(inventory)
    return spec


def node_owner(node_name: str, node_uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}


def cr_path(node_name: str | None = None) -> str:
    base = f"/apis/{INVENTORY_GROUP}/{INVENTORY_VERSION}/{INVENTORY_PLURAL}"
    return f"{base}/{node_name}" if node_name is not None else base


def lease_path(namespace: str, name: str | None = None) -> str:
    base = f"{LEASE_API}/namespaces/{namespace}/leases"
    return f"{base}/{name}" if name is not None else base


_LABEL_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def sanitize_label_value(text: str) -> str:
    """A valid label value: [A-Za-z0-9_.-], at most 63, alphanumeric at both ends."""
    value = _LABEL_BAD.sub("-", text.strip())
    value = re.sub(r"-{2,}", "-", value)[:63]
    return value.strip("-_.")


def node_labels(
    inventory: NodeInventory, gfd: DriverVersions | None = None
) -> dict[str, str | None]:
    """The labels this agent owns; None removes a label (a node without GPUs). With `gfd`
    (--gfd-labels) GPU Feature Discovery's labels too.

    The memory label is the smallest GPU's memory in MiB, so `gt` node affinity is safe on
    a node whose GPUs differ; the model label says `mixed` then. The isolation label names
    the layer whether or not it is up (a pod chooses a layer with it; whether the layer is
    up now is the NodeDevices object's to say), and is removed when none is reported.
    """
    extra = gfd_labels(inventory, gfd) if gfd is not None else {}
    layer = {ISOLATION_LABEL: inventory.isolation.layer if inventory.isolation else None}
    if not inventory.gpus:
        gpus: dict[str, str | None] = dict.fromkeys(
            (GPU_MODEL_LABEL, GPU_COUNT_LABEL, GPU_MEMORY_LABEL)
        )
        return gpus | layer | extra
    return (
        {
            GPU_MODEL_LABEL: sanitize_label_value(gpu_model(inventory)),
            GPU_COUNT_LABEL: str(len(inventory.gpus)),
            GPU_MEMORY_LABEL: str(min(g.memory_mib for g in inventory.gpus)),
        }
        | layer
        | extra
    )


GFD_PRESENT = "nvidia.com/gpu.present"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_COUNT = "nvidia.com/gpu.count"
GFD_MEMORY = "nvidia.com/gpu.memory"
GFD_DRIVER = (
    "nvidia.com/cuda.driver.major",
    "nvidia.com/cuda.driver.minor",
    "nvidia.com/cuda.driver.rev",
)
GFD_RUNTIME = ("nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor")
GFD_LABELS = (GFD_PRESENT, GFD_PRODUCT, GFD_COUNT, GFD_MEMORY, *GFD_DRIVER, *GFD_RUNTIME)
"""The NVIDIA GPU Feature Discovery labels written with --gfd-labels (and only these: the
admission policy lets the node agent change exactly these nvidia.com/ keys)."""
_VERSION_PART = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True)
class DriverVersions:
    """What NVML reports, for the GFD labels; empty when unknown (the fake backend)."""

    driver: str = ""
    """The kernel driver's version, e.g. "550.54.15"."""
    cuda: str = ""
    """The CUDA version the driver supports, e.g. "12.4"."""


def _version_labels(keys: tuple[str, ...], version: str) -> dict[str, str | None]:
    """GFD's split of a dotted version, one label per part ("" for a missing last part, as
    GFD writes `rev`); all removed when the version is unknown or not plain digits."""
    parts = version.strip().split(".") if version else []
    if not 2 <= len(parts) <= len(keys) or not all(_VERSION_PART.fullmatch(x) for x in parts):
        return dict.fromkeys(keys)
    parts += [""] * (len(keys) - len(parts))
    return dict(zip(keys, parts, strict=True))


def gfd_labels(inventory: NodeInventory, versions: DriverVersions) -> dict[str, str | None]:
    """GPU Feature Discovery's labels in its value formats; None removes a label."""
    if not inventory.gpus:
        return dict.fromkeys(GFD_LABELS)
    return {
        GFD_PRESENT: "true",
        GFD_PRODUCT: sanitize_label_value(gpu_model(inventory).replace(" ", "-")),
        GFD_COUNT: str(len(inventory.gpus)),
        GFD_MEMORY: str(min(g.memory_mib for g in inventory.gpus)),
        **_version_labels(GFD_DRIVER, versions.driver),
        **_version_labels(GFD_RUNTIME, versions.cuda),
    }


def micro_time(epoch_s: float) -> str:
    """A Kubernetes MicroTime: RFC 3339 with microseconds, UTC."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class InventoryConfig:
    node_name: str
    heartbeat_namespace: str = DEFAULT_HEARTBEAT_NAMESPACE
    lease_duration_s: int = DEFAULT_LEASE_DURATION_S
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S
    conflict_retries: int = 5
    gfd_labels: DriverVersions | None = None
    """Also write GPU Feature Discovery's labels (--gfd-labels), with these versions."""

    @property
    def lease_name(self) -> str:
        return HEARTBEAT_LEASE_PREFIX + self.node_name


class InventoryPublisher:
    """Writes the NodeDevices object, the node labels and the heartbeat Lease."""

    def __init__(
        self, api: KubeClient, config: InventoryConfig, clock: Callable[[], float] = time.time
    ) -> None:
        self.api = api
        self.config = config
        self.clock = clock
        self._node_uid = ""
        self._written: dict[str, Any] | None = None
        self._labels: Mapping[str, str | None] | None = None
        self._lease: dict[str, Any] | None = None
        self.writes = 0
        """Create or replace calls on the NodeDevices object that succeeded."""

    # --- the node ---------------------------------------------------------------------------

    def _node(self) -> dict[str, Any]:
        node: dict[str, Any] = self.api.request("GET", f"/api/v1/nodes/{self.config.node_name}")
        self._node_uid = str(node.get("metadata", {}).get("uid", ""))
        return node

    def node_uid(self) -> str:
        if not self._node_uid:
            self._node()
        return self._node_uid

    def labels(self, inventory: NodeInventory) -> dict[str, str | None]:
        return node_labels(inventory, self.config.gfd_labels)

    def update_labels(self, inventory: NodeInventory) -> bool:
        """Patch the node's labels if they differ; returns True when it patched."""
        wanted = self.labels(inventory)
        node = self._node()
        current = node.get("metadata", {}).get("labels") or {}
        diff = {k: v for k, v in wanted.items() if current.get(k) != v}
        if not diff:
            self._labels = wanted
            return False
        self.api.request(
            "PATCH",
            f"/api/v1/nodes/{self.config.node_name}",
            {"metadata": {"labels": diff}},
            STRATEGIC_MERGE_PATCH,
        )
        self._labels = wanted
        log.info("node labels updated: %s", diff)
        return True

    # --- NodeDevices ------------------------------------------------------------------------

    def _owned(self, obj: Mapping[str, Any], uid: str) -> bool:
        refs = obj.get("metadata", {}).get("ownerReferences") or []
        return any(r.get("kind") == "Node" and r.get("uid") == uid for r in refs)

    def publish(self, inventory: NodeInventory, force_check: bool = False) -> bool:
        """Make the API server's NodeDevices match `inventory`; True when it wrote.

        Skips the API entirely when the spec equals what this publisher last wrote or saw,
        unless `force_check` (periodic resync) asks to compare with the server again.
        """
        spec = cr_spec(inventory)
        if spec == self._written and not force_check:
            return False
        name = self.config.node_name
        uid = self.node_uid()
        for _ in range(self.config.conflict_retries + 1):
            try:
                current = self.api.request("GET", cr_path(name))
            except ApiError as exc:
                if exc.status != 404:
                    raise
                current = None
            if current is None:
                body = {
                    "apiVersion": INVENTORY_API_VERSION,
                    "kind": INVENTORY_KIND,
                    "metadata": {"name": name, "ownerReferences": [node_owner(name, uid)]},
                    "spec": spec,
                }
                try:
                    self.api.request("POST", cr_path(), body)
                except ApiError as exc:
                    if exc.status == 409:  # created meanwhile: read it and compare again
                        continue
                    raise
                log.info("created %s/%s", INVENTORY_PLURAL, name)
            else:
                if current.get("spec") == spec and self._owned(current, uid):
                    self._written = spec
                    return False
                body = dict(current)
                metadata = dict(current.get("metadata", {}))
                refs = [r for r in metadata.get("ownerReferences") or [] if r.get("kind") != "Node"]
                metadata["ownerReferences"] = [*refs, node_owner(name, uid)]
                body["metadata"] = metadata
                body["spec"] = spec
                body.pop("status", None)  # the scheduler's; a replace ignores it anyway
                try:
                    self.api.request("PUT", cr_path(name), body)
                except ApiError as exc:
                    if exc.status in (404, 409):
                        log.info(
                            "%s/%s changed meanwhile (%d); retrying",
                            INVENTORY_PLURAL,
                            name,
                            exc.status,
                        )
                        continue
                    raise
                log.info("updated %s/%s", INVENTORY_PLURAL, name)
            self._written = spec
            self.writes += 1
            return True
        raise ApiError(
            409, reason="Conflict", message=f"gave up after {self.config.conflict_retries} retries"
        )

    # --- heartbeat --------------------------------------------------------------------------

    def _lease_body(
        self, now: str, previous: Mapping[str, Any] | None, usage: str | None = None
    ) -> dict[str, Any]:
        cfg = self.config
        spec = dict((previous or {}).get("spec") or {})
        if spec.get("holderIdentity") != cfg.node_name or "acquireTime" not in spec:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if previous is not None else 0
            )
        spec.update(
            holderIdentity=cfg.node_name,
            leaseDurationSeconds=cfg.lease_duration_s,
            renewTime=now,
        )
        if previous is not None:
            body = dict(previous)
        else:
            metadata: dict[str, Any] = {
                "name": cfg.lease_name,
                "namespace": cfg.heartbeat_namespace,
            }
            if self._node_uid:
                metadata["ownerReferences"] = [node_owner(cfg.node_name, self._node_uid)]
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata}
        body["spec"] = spec
        metadata = dict(body.get("metadata") or {})
        annotations = dict(metadata.get("annotations") or {})
        if usage is None:
            annotations.pop(USAGE_ANNOTATION, None)
        else:
            annotations[USAGE_ANNOTATION] = usage
        if annotations:
            metadata["annotations"] = annotations
        else:
            metadata.pop("annotations", None)
        body["metadata"] = metadata
        return body

    def heartbeat(self, usage: str | None = None) -> None:
        """Renew (or create) this agent's Lease, carrying `usage` (the GPU use the agent
        last read, tessera.usage) as an annotation: the reading rides on a write the
        heartbeat makes anyway."""
        cfg = self.config
        path = lease_path(cfg.heartbeat_namespace, cfg.lease_name)
        for _ in range(self.config.conflict_retries + 1):
            now = micro_time(self.clock())
            if self._lease is None:
                try:
                    self._lease = self.api.request("GET", path)
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                    try:
                        self._lease = self.api.request(
                            "POST",
                            lease_path(cfg.heartbeat_namespace),
                            self._lease_body(now, None, usage),
                        )
                    except ApiError as exc2:
                        if exc2.status == 409:
                            continue
                        raise
                    return
            try:
                self._lease = self.api.request(
                    "PUT", path, self._lease_body(now, self._lease, usage)
                )
                return
            except ApiError as exc:
                self._lease = None
                if exc.status in (404, 409):
                    continue
                raise
        raise ApiError(409, reason="Conflict", message="could not renew the heartbeat Lease")
