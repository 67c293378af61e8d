"""Bind: choose the devices, then one API write: the Binding, carrying the signed record.

The API server applies a Binding's `metadata.annotations` to the pod in the same update
that sets `spec.nodeName`, with the pod's UID as precondition. So the record and the node
land together or not at all: there is no pod with a record but no node, and a bind costs
one write. The same write names the NRI hook in NRI's required-plugins annotation
(tessera.nri_required), so that containerd does not create the pod's containers without
it. (Pods bound by older versions, record first and Binding second, are still read as
before: an unbound pod's record holds nothing, see recovery.py.)

There is no per-node lock. The only serialized step is a short in-memory section
(`Cache.pods.assume`, under the state's lock) that computes the exact placement on the chosen
node and adds it to the state as *assumed*; the API call happens outside it, so binds on
one node overlap. Because the placement is assumed before any I/O, a concurrent bind on
the same node sees those devices as taken: two pods can never get the same share between
bind and watch.

When the Binding fails the assumed allocation is removed. When its answer was lost
(timeout, 5xx), the pod is read back first: if it is bound to our node, the bind (and so
the record) landed after all.

The steps are written once, as a coroutine over the two API calls they make (`BindApi`).
The extender's event loop awaits them with kube_edge.loop_client, so a bind never waits
for a thread to get the interpreter back from the loop; `bind` runs the same steps with
the blocking client, whose calls complete without suspending.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from kube_edge.client import KubeClient, pod_path
from kube_edge.errors import ApiError
from scheduler_plugin.decisions.extender import (
    BadArgsError,
    Extender,
    get_field,
)
from scheduler_plugin.state.cache import Cache
from scheduler_plugin.state.values import AlreadyHeld, Refused
from scheduler_plugin.views.metrics import Metrics
from tessera.allocation import PodAllocation
from tessera.errors import RequestError, TesseraError
from tessera.nri_required import render
from tessera.record import KeySource, encode
from tessera.request import PodRequest
from tessera.resources import ALLOCATION_ANNOTATION, NRI_REQUIRED_PLUGINS_POD_ANNOTATION

log = logging.getLogger(__name__)


class BindRefusedError(TesseraError):
    """The bind cannot be done; the message goes back to kube-scheduler as `Error`."""


class BindApi(Protocol):
    """The API calls a bind makes (kube_edge.loop_client.LoopClient has them)."""

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def get(self, path: str) -> dict[str, Any]: ...


class _Blocking:
    """The blocking client behind `BindApi`: each call completes before it returns, so a
    bind's coroutine over it never suspends."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._client.create(path, body)

    async def get(self, path: str) -> dict[str, Any]:
        return self._client.get(path)


_T = TypeVar("_T")


def _run_to_end(steps: Coroutine[Any, Any, _T]) -> _T:
    """The result of a coroutine that never suspends (steps over `_Blocking`)."""
    try:
        steps.send(None)
    except StopIteration as done:
        result: _T = done.value
        return result
    steps.close()
    raise RuntimeError("a bind step over the blocking client suspended")


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""Pod, namespace and node names as the API server admits them (at most 253 characters);
anything else cannot name a real object and must not reach a URL."""
_UID = re.compile(r"[!-~]{1,128}")
"""A UID: printable ASCII (the API server's are 36-character UUIDs)."""
_PATTERNS = {
    "PodName": _DNS_SUBDOMAIN,
    "PodNamespace": _DNS_SUBDOMAIN,
    "PodUID": _UID,
    "Node": _DNS_SUBDOMAIN,
}


@dataclass(frozen=True)
class BindArgs:
    name: str
    namespace: str
    uid: str
    node: str

    @classmethod
    def parse(cls, args: Any) -> BindArgs:
        if not isinstance(args, Mapping):
            raise BadArgsError("the body must be a JSON object")
        values = {}
        for key in ("PodName", "PodNamespace", "PodUID", "Node"):
            value = get_field(args, key)
            if not isinstance(value, str) or not value:
                raise BadArgsError(f"{key} is missing or not a non-empty string")
            if not _PATTERNS[key].fullmatch(value):
                raise BadArgsError(f"{key} {value[:64]!r} is not a valid name")
            values[key] = value
        return cls(values["PodName"], values["PodNamespace"], values["PodUID"], values["Node"])

    def to_json(self) -> dict[str, str]:
        """The ExtenderBindingArgs body that `parse` reads (what kube-scheduler sends)."""
        return {
            "PodName": self.name,
            "PodNamespace": self.namespace,
            "PodUID": self.uid,
            "Node": self.node,
        }


def binding_path(args: BindArgs) -> str:
    """Where the pod's Binding is created (the pods/binding subresource)."""
    return pod_path(args.namespace, args.name) + "/binding"


def binding_body(args: BindArgs, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """The Binding of the pod to its node, with the pod's UID as precondition; the API
    server sets `annotations` on the pod in the same update."""
    meta: dict[str, Any] = {"name": args.name, "namespace": args.namespace, "uid": args.uid}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
    }


@dataclass(eq=False)
class Binder:
    cache: Cache
    extender: Extender
    client: KubeClient
    keyring: KeySource
    metrics: Metrics | None = None
    signed: Callable[[str, str, str, str, str, PodAllocation], None] | None = None
    """Told (uid, namespace, name, node, record text, allocation) before each Binding that
    carries a record (the Reconciler, so that the watch need not verify it again)."""

    def bind(self, raw: Any) -> dict[str, Any]:
        """The ExtenderBindingResult for one ExtenderBindingArgs body (blocking)."""
        return _run_to_end(self.bind_with(raw, _Blocking(self.client)))

    async def bind_with(self, raw: Any, api: BindApi) -> dict[str, Any]:
        """The ExtenderBindingResult for one ExtenderBindingArgs body, the API calls made
        through `api`."""
        try:
            args = BindArgs.parse(raw)
        except BadArgsError as exc:  # answered in Error too, as the bind protocol wants
            return {"Error": f"tessera: bad bind request: {exc}"}
        try:
            await self._bind(args, api)
        except BindRefusedError as exc:
            return {"Error": f"tessera: {exc}"}
        return {"Error": ""}

    # --- the steps ---------------------------------------------------------------------

    async def _request(self, args: BindArgs, api: BindApi) -> PodRequest:
        request = self.extender.remembered(args.uid)
        if request is not None:
            return request
        try:
            pod = await api.get(pod_path(args.namespace, args.name))
        except ApiError as exc:
            self._failed("read_pod")
            raise BindRefusedError(f"cannot read pod {args.namespace}/{args.name}: {exc}") from None
        if str((pod.get("metadata") or {}).get("uid")) != args.uid:
            raise BindRefusedError(f"pod {args.namespace}/{args.name} is not UID {args.uid}")
        try:
            return self.extender.parse(pod)
        except RequestError as exc:
            raise BindRefusedError(f"invalid device request: {exc}") from None

    def _failed(self, step: str) -> None:
        if self.metrics is not None:
            self.metrics.bind_failures.labels(step).inc()

    async def _bind(self, args: BindArgs, api: BindApi) -> None:
        request = await self._request(args, api)
        if request.uid != args.uid:
            raise BindRefusedError(f"pod {args.namespace}/{args.name} is not UID {args.uid}")
        if not request.wants_devices:
            await self._create_binding(args, api)
            return
        gangs = self.extender.gangs
        gang = None if gangs is None else gangs.key_of(args.uid)
        outcome = self.cache.pods.assume(request, args.node, gang=gang)
        if isinstance(outcome, Refused):
            raise BindRefusedError(outcome.reason)
        if isinstance(outcome, AlreadyHeld):
            # a retried bind whose first attempt succeeded (its answer was lost) succeeds
            held = outcome.allocation
            if held.node == args.node and await self._bound_to(args, api):
                return
            raise BindRefusedError(
                f"pod {args.namespace}/{args.name} already holds devices on {held.node}"
            )
        alloc = outcome.allocation
        try:
            text = encode(alloc, self.keyring)
            if self.signed is not None:  # before the write: its watch event may come first
                self.signed(args.uid, args.namespace, args.name, args.node, text, alloc)
            annotations = {ALLOCATION_ANNOTATION: text}
            if request.required_plugins:
                annotations[NRI_REQUIRED_PLUGINS_POD_ANNOTATION] = render(request.required_plugins)
            await self._create_binding(args, api, annotations)
        except BindRefusedError:
            self.cache.pods.forget(args.uid, alloc)
            raise
        except Exception as exc:
            log.exception("bind of %s/%s failed", args.namespace, args.name)
            self.cache.pods.forget(args.uid, alloc)
            raise BindRefusedError(f"bind failed: {exc}") from None
        self.cache.pods.bind(args.uid)
        self.extender.forget(args.uid)
        log.info(
            "bound %s/%s to %s: %s",
            args.namespace,
            args.name,
            args.node,
            allocation_summary(alloc),
        )

    async def _create_binding(
        self, args: BindArgs, api: BindApi, annotations: dict[str, str] | None = None
    ) -> None:
        """Bind the pod (UID as precondition), setting `annotations` on it in the same
        update."""
        try:
            started = time.perf_counter()
            try:
                await api.create(binding_path(args), binding_body(args, annotations))
            finally:
                if self.metrics is not None:
                    self.metrics.binding_writes.observe(time.perf_counter() - started)
        except ApiError as exc:
            if exc.transient and await self._bound_to(args, api):
                return  # the answer was lost but the Binding exists
            self._failed("binding")
            raise BindRefusedError(f"creating the Binding failed: {exc}") from None

    async def _bound_to(self, args: BindArgs, api: BindApi) -> bool:
        try:
            pod = await api.get(pod_path(args.namespace, args.name))
        except ApiError:
            return False
        meta = pod.get("metadata") or {}
        return meta.get("uid") == args.uid and (pod.get("spec") or {}).get("nodeName") == args.node


def allocation_summary(alloc: PodAllocation) -> str:
    """A short human sentence of what a pod was given (logs and events)."""
    parts = []
    for c in alloc.containers:
        if not c.counted:
            continue
        gpus = ", ".join(f"GPU {g.index} {g.core}%/{g.memory_mib}MiB" for g in c.gpus)
        nics = ", ".join(f"{r.ibdev} {r.share}%" for r in c.rdma)
        parts.append(f"{c.name}: " + "; ".join(p for p in (gpus, nics) if p))
    return " | ".join(parts)
