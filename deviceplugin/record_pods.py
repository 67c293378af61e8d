"""Finds the pod a GetPreferredAllocation call is for, and answers with its record's units.

For each call (the kubelet makes one per container and resource while it admits a pod):

1. list the pods bound to this node (`GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`,
   a consistent read, so a pod the kubelet is admitting is in it) that are not finished or
   being deleted and carry an allocation record;
2. verify each record as the NRI plugin does (signature, this pod's UID, this node, its
   namespace and name); a record that does not verify is skipped, so a forged record cannot
   steer another pod's units;
3. ask the kubelet's pod-resources API (List) which containers already hold units of the
   resource, add the containers this agent answered for (List leaves out ordinary init
   containers), and skip pods the kubelet already runs (they have container statuses);
   each remaining pod's next container is the one still waiting;
4. hand the waiting containers to the pure choice (record_units.py).

Choosing units is bookkeeping (the NRI plugin applies the record whatever units the kubelet
counted), so every failure here (API server or kubelet unreachable, no keys, no pod that
fits, pods that cannot be told apart) falls back to the default choice, with one log line
saying why. Each remote call is bounded by `timeout_s`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from deviceplugin.record_units import Demand, PodView, choose, next_demand
from deviceplugin.server import DEFAULT_POD_RESOURCES_SOCKET
from deviceplugin.units import gpu_device_key, nic_device_key
from kube_edge.client import KubeClient
from kube_edge.errors import ApiError
from protos.kubelet.podresources.v1 import api_pb2 as prpb
from protos.kubelet.podresources.v1 import api_pb2_grpc as prpb_grpc
from tessera.errors import TesseraError
from tessera.model import NodeInventory
from tessera.quantity import whole_count
from tessera.record import KeySource, decode
from tessera.resources import ALLOCATION_ANNOTATION

log = logging.getLogger(__name__)

POD_RESOURCES_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""What the kubelet's List answer may take (dcgm-exporter allows the same)."""
PAGE_SIZE = 500
MAX_PAGES = 20
"""A node runs at most a few hundred pods; 10,000 listed pods is far beyond any."""

_list_stub: Callable[[grpc.Channel], Any] = prpb_grpc.PodResourcesListerStub


class PodLookupError(TesseraError):
    """The pods or the kubelet's assignments could not be read; the caller falls back."""


@dataclass(frozen=True)
class DeviceKeys:
    """How this node's devices appear in unit IDs: GPU UUID -> key, NIC ibdev -> key."""

    gpus: Mapping[str, str]
    nics: Mapping[str, str]

    @classmethod
    def of(cls, inventory: NodeInventory) -> DeviceKeys:
        return cls(
            {g.uuid: gpu_device_key(g.uuid, g.index) for g in inventory.gpus},
            {n.ibdev: nic_device_key(n.ibdev, slot) for slot, n in enumerate(inventory.nics)},
        )


def _limits(pod: Mapping[str, Any], resource: str) -> tuple[tuple[str, int], ...] | None:
    """(container, limit) of the containers that ask for `resource`, init containers first
    (the kubelet's admission order); None when the spec is not what the API server serves."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return None
    out: list[tuple[str, int]] = []
    for key in ("initContainers", "containers"):
        containers = spec.get(key) or []
        if not isinstance(containers, list):
            return None
        for c in containers:
            if not isinstance(c, Mapping) or not isinstance(c.get("name"), str):
                return None
            resources = c.get("resources") or {}
            limits = resources.get("limits") if isinstance(resources, Mapping) else None
            value = limits.get(resource) if isinstance(limits, Mapping) else None
            if value is None:
                continue
            try:
                count = whole_count(value)
            except ValueError:
                return None
            if count > 0:
                out.append((c["name"], count))
    return tuple(out)


def list_node_pods(client: KubeClient, node: str, timeout_s: float) -> list[dict[str, Any]]:
    """Every pod bound to `node`, page by page (raises PodLookupError)."""
    out: list[dict[str, Any]] = []
    token = ""
    for _ in range(MAX_PAGES):
        query: dict[str, Any] = {"fieldSelector": f"spec.nodeName={node}", "limit": PAGE_SIZE}
        if token:
            query["continue"] = token
        try:
            page = client.request("GET", "/api/v1/pods", query=query, timeout=timeout_s)
        except ApiError as exc:
            raise PodLookupError(f"cannot list this node's pods: {exc}") from None
        if not isinstance(page, dict):
            raise PodLookupError("the pod list is not an object")
        items = page.get("items") or []
        out.extend(i for i in items if isinstance(i, dict))
        meta = page.get("metadata")
        token = str(meta.get("continue") or "") if isinstance(meta, dict) else ""
        if not token:
            return out
    raise PodLookupError(f"more than {MAX_PAGES * PAGE_SIZE} pods on this node")


class RecordChooser:
    """GetPreferredAllocation's record-based answer for every resource of this node."""

    def __init__(
        self,
        client: KubeClient,
        node: str,
        keys: KeySource,
        inventory: Callable[[], NodeInventory],
        pod_resources_socket: str | Path = DEFAULT_POD_RESOURCES_SOCKET,
        timeout_s: float = 2.0,
    ) -> None:
        self.client = client
        self.node = node
        self.keys = keys
        self.inventory = inventory
        self.socket = Path(pod_resources_socket)
        self.timeout_s = timeout_s
        self.chosen = 0
        self.fallbacks = 0
        self._lock = threading.Lock()
        self._answered: dict[tuple[str, str], set[str]] = {}
        """(pod UID, resource) -> containers this agent answered for: the kubelet goes on to
        Allocate them, but its List never shows ordinary init containers."""

    # --- reading ------------------------------------------------------------------------------

    def pods(self) -> list[dict[str, Any]]:
        """Every pod bound to this node (raises PodLookupError)."""
        return list_node_pods(self.client, self.node, self.timeout_s)

    def assigned(self, resource: str) -> dict[tuple[str, str], set[str]]:
        """(namespace, pod name) -> containers the kubelet gave units of `resource`."""
        options = [("grpc.max_receive_message_length", POD_RESOURCES_MAX_MESSAGE_BYTES)]
        try:
            with grpc.insecure_channel(f"unix://{self.socket}", options=options) as channel:
                answer = _list_stub(channel).List(
                    prpb.ListPodResourcesRequest(), timeout=self.timeout_s
                )
        except grpc.RpcError as exc:
            detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise PodLookupError(f"kubelet pod-resources List at {self.socket}: {detail}") from None
        out: dict[tuple[str, str], set[str]] = {}
        for pod in answer.pod_resources:
            for container in pod.containers:
                if any(d.resource_name == resource and d.device_ids for d in container.devices):
                    out.setdefault((pod.namespace, pod.name), set()).add(container.name)
        return out

    def views(self, resource: str) -> tuple[list[PodView], list[str]]:
        """The pods with a record that verifies and a container asking for `resource`, and
        why others were left out."""
        ring = self.keys.get()
        if ring is None:
            raise PodLookupError("no record keys: records cannot be verified")
        views: list[PodView] = []
        skipped: list[str] = []
        for pod in self.pods():
            meta = pod.get("metadata")
            status = pod.get("status")
            if not isinstance(meta, dict):
                continue
            status = status if isinstance(status, dict) else {}
            if status.get("phase") in ("Running", "Succeeded", "Failed"):
                continue
            if meta.get("deletionTimestamp"):
                continue
            if status.get("containerStatuses") or status.get("initContainerStatuses"):
                continue  # admitted already: the kubelet reports its containers
            annotations = meta.get("annotations")
            text = annotations.get(ALLOCATION_ANNOTATION) if isinstance(annotations, dict) else None
            limits = _limits(pod, resource)
            if not isinstance(text, str) or not limits:
                continue
            ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
            try:
                record = decode(
                    text,
                    ring,
                    require_integrity=True,
                    pod_uid=str(meta.get("uid") or ""),
                    node=self.node,
                    namespace=ns,
                    name=name,
                )
            except Exception as exc:  # a hostile annotation: skip the pod, never fail
                skipped.append(f"{ns}/{name}: record not trusted ({type(exc).__name__})")
                continue
            created = str(meta.get("creationTimestamp") or "")
            views.append(PodView(str(meta.get("uid")), ns, name, created, limits, record))
        return views, skipped

    # --- answering ----------------------------------------------------------------------------

    def _count(self, chosen: bool) -> None:
        with self._lock:  # the kubelet may call for several resources at once
            if chosen:
                self.chosen += 1
            else:
                self.fallbacks += 1

    def demands(self, resource: str) -> tuple[list[Demand], list[str]]:
        views, notes = self.views(resource)
        if not views:
            return [], notes
        assigned = self.assigned(resource)
        keys = DeviceKeys.of(self.inventory())
        with self._lock:
            live = {v.uid for v in views}
            for gone in [k for k in self._answered if k[1] == resource and k[0] not in live]:
                del self._answered[gone]
            answered = {k: set(v) for k, v in self._answered.items()}
        out: list[Demand] = []
        for view in views:
            got = next_demand(
                resource,
                view,
                assigned.get((view.namespace, view.name), set())
                | answered.get((view.uid, resource), set()),
                keys.gpus,
                keys.nics,
            )
            if isinstance(got, Demand):
                out.append(got)
            elif got is not None:
                notes.append(got)
        return out, notes

    def __call__(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str] | None:
        """The record's units for the container being admitted, or None (then the caller's
        default), logging one line either way."""
        try:
            demands, notes = self.demands(resource)
        except PodLookupError as exc:
            self._count(chosen=False)
            log.info("%s: preferred allocation by default: %s", resource, exc)
            return None
        choice = choose(available, must_include, size, demands)
        if choice.ids is None:
            self._count(chosen=False)
            extra = f"; {notes[0]}" if notes else ""
            log.info("%s: preferred allocation by default: %s%s", resource, choice.reason, extra)
            return None
        self._count(chosen=True)
        if choice.demand is not None:
            with self._lock:
                key = (choice.demand.pod.uid, resource)
                self._answered.setdefault(key, set()).add(choice.demand.container)
        log.info("%s: %d units from the allocation record of %s", resource, size, choice.reason)
        return choice.ids
