"""tessera's NRI handler: applies the allocation record to containers and VF netdevs.

Data flows one way: the pod's `tessera.dev/allocation` annotation -> decoded and verified
record (tessera.record) -> decision (nri_hook.adjust, pure) -> NRI adjustment (here).

- A pod without the annotation, and a container the record does not name, are left
  untouched (empty adjustment), unless the kubelet gave the container tessera devices:
  then it carries the node agent's fail-closed gate (a mount runc refuses), and it is
  refused here saying why. The gate is removed only from containers whose record is
  applied, so none starts with tessera devices but without its record's adjustment.
- A record that is malformed, fails integrity, belongs to another pod or node, or names a
  device this node lacks fails the container creation with a status that says exactly
  what is wrong. With on_invalid="warn" the container is created untouched instead and a
  warning is logged.
- Sandbox start moves the pod's VF netdevs into its network namespace (a failure fails the
  sandbox, under the same policy); sandbox stop and removal bring them back (never failing:
  a pod must always be deletable; problems are logged). A sandbox whose record is invalid
  starts with nothing moved: its containers are refused, where the kubelet shows why.
- The hook holds each namespace it moved VFs into (an open descriptor). containerd sends
  no sandbox stop or removal for a sandbox that started before it restarted; the periodic
  `reconcile` finds such a namespace deleted and brings its VFs back through the
  descriptor, before the kernel would destroy a virtual one or hand back a physical one
  under its pod name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from nri_hook.adjust import (
    ISOLATION_NONE,
    NVIDIA_CONTROL_DEVICE,
    REMOVAL_PREFIX,
    UNGATE_ONLY,
    Adjustment,
    ContainerUser,
    HostView,
    Settings,
    decode_record,
    gated,
    gpu_device_path,
    open_gate,
    plan_container,
)
from nri_hook.device_access import ANY_GPU, NVIDIA_GPU_MAJOR, named_minors, open_gpus
from nri_hook.errors import RejectError, status_of
from nri_hook.netdev import NetdevError, NetdevMove, NetdevMover, network_namespace, plan_moves
from nri_hook.plugin import Handler
from protos.nri import api_pb2 as api
from tessera.allocation import PodAllocation
from tessera.resources import ALLOCATION_ANNOTATION
from tessera_edge.host_paths import NRI_GATE_DESTINATION
from tessera_edge.keyfiles import KeyringSource
from tessera_ttrpc import Code, RpcError

log = logging.getLogger(__name__)

OnInvalid = Literal["fail", "warn"]
MAX_REMEMBERED_WARNINGS: Final = 4096
"""Bad pods (pod, reason) whose warning was already logged, so that a pod skipped at every
Synchronize and event is logged once. A node runs a few hundred pods, so every one is
remembered; the bound only keeps a flood of distinct pods from growing memory."""
RECONCILE_SECONDS: Final = 5.0
"""Between checks that each namespace holding VFs is still its sandbox's. A sandbox the
runtime deleted without telling plugins keeps its VFs out of the host this long at most;
the check itself is two stat calls per such pod."""


@dataclass(frozen=True)
class EnforcerConfig:
    node_name: str
    settings: Settings = field(default_factory=Settings)
    on_invalid: OnInvalid = "fail"
    require_integrity: bool = True
    move_vf_netdevs: bool = True
    vf_rename_prefix: str = ""


@dataclass(frozen=True)
class _PodNetdevs:
    key: str
    netns: str
    moves: tuple[NetdevMove, ...]


def to_proto(adjustment: Adjustment) -> api.ContainerAdjustment:
    result = api.ContainerAdjustment(
        env=[api.KeyValue(key=k, value=v) for k, v in adjustment.env],
        mounts=[
            api.Mount(destination=m.destination, type=m.type, source=m.source, options=m.options)
            for m in adjustment.mounts
        ],
    )
    if adjustment.ungate:
        result.mounts.append(api.Mount(destination=REMOVAL_PREFIX + NRI_GATE_DESTINATION))
    if adjustment.devices:
        result.linux.devices.extend(
            api.LinuxDevice(
                path=d.path,
                type=d.type,
                major=d.major,
                minor=d.minor,
                file_mode=api.OptionalFileMode(value=d.file_mode),
            )
            for d in adjustment.devices
        )
    return result


def _pod_key(pod: api.PodSandbox) -> str:
    return f"{pod.namespace}/{pod.name}"


@dataclass(eq=False)
class Enforcer(Handler):
    events = frozenset(
        {
            api.RUN_POD_SANDBOX,
            api.STOP_POD_SANDBOX,
            api.REMOVE_POD_SANDBOX,
            api.CREATE_CONTAINER,
            api.STOP_CONTAINER,
            api.REMOVE_CONTAINER,
        }
    )

    config: EnforcerConfig
    keys: KeyringSource
    host: HostView
    mover: NetdevMover | None = None
    """None, or when the config does not move VF netdevs: they stay where they are."""
    metrics: Metrics | None = None

    def __post_init__(self) -> None:
        if not self.config.move_vf_netdevs:
            self.mover = None
        self.pod_netdevs: dict[str, _PodNetdevs] = {}
        """Sandbox ID -> the VF netdevs moved into it."""
        self._held: dict[str, int] = {}
        """Sandbox ID -> an open descriptor of its network namespace while VFs are in it:
        the namespace lives as long as we hold it, whatever the runtime does."""
        self._moved_here: set[str] = set()
        """Sandbox IDs whose VF netdevs this process moved in or found in place (with none
        to move, too): later containers of those pods need no check."""
        self.injected: dict[str, tuple[str, str]] = {}
        """Container ID -> (sandbox ID, what it was given), while the container lives."""
        self._warned: OrderedDict[tuple[str, str], None] = OrderedDict()
        """(pod, reason) already logged as a warning, oldest first."""

    # --- records ----------------------------------------------------------------------------

    def _decode(self, pod: api.PodSandbox, text: str) -> PodAllocation:
        return decode_record(
            text,
            self.keys.get(),
            require_integrity=self.config.require_integrity,
            pod_uid=pod.uid,
            node=self.config.node_name,
            namespace=pod.namespace,
            name=pod.name,
        )

    def _invalid(self, error: RejectError, operation: str) -> None:
        """Apply the on-invalid policy: raise the status, or log and carry on."""
        if self.config.on_invalid == "warn":
            log.warning(
                "%s (given no device, but let run: --on-invalid-record=warn)", error.message
            )
            self._count(operation, "warned")
            return
        log.error("refusing %s: %s", operation, error.message)
        self._count(operation, "rejected")
        raise RpcError(error.code, f"tessera: {error.message}")

    def _count(self, operation: str, result: str) -> None:
        if self.metrics is not None:
            self.metrics.count(operation, result)

    # --- containers -------------------------------------------------------------------------

    async def create_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> api.CreateContainerResponse:
        started = time.perf_counter()
        try:
            response = await self._create(pod, container)
            self._audit_gpu_access(pod, container, response)
            return response
        finally:
            if self.metrics is not None:
                self.metrics.observe_create(time.perf_counter() - started)

    def _audit_gpu_access(
        self, pod: api.PodSandbox, container: api.Container, response: api.CreateContainerResponse
    ) -> None:
        """Warn when the container's own device rules open GPUs it was not given (see
        nri_hook.device_access): the allocation does not bind such a container."""
        rules = container.linux.resources.devices
        if not rules:
            return
        known = self.host.gpu_minors()
        if known is not None:
            minors = set(known.values())
        elif self.host.exists(NVIDIA_CONTROL_DEVICE):
            # the driver is there but its list of GPUs is not visible: ANY_GPU stands for
            # the GPUs no rule names
            minors = named_minors(rules) | {ANY_GPU}
        else:
            return  # no NVIDIA driver on this node: no GPU to open
        given = {d.minor for d in response.adjust.linux.devices if d.major == NVIDIA_GPU_MAJOR}
        opened = [m for m in open_gpus(rules, sorted(minors)) if m not in given]
        if not opened:
            return
        log.warning(
            "pod=%s container=%s: its own device rules open %s of this node, which tessera "
            "did not give it (a privileged container, or a device rule for major %d); the "
            "scheduler's allocation does not bind it",
            _pod_key(pod),
            container.name,
            ", ".join("every GPU" if m == ANY_GPU else gpu_device_path(m) for m in opened),
            NVIDIA_GPU_MAJOR,
            extra={"pod": _pod_key(pod), "container": container.name},
        )
        if self.metrics is not None:
            self.metrics.unmanaged_gpu_access()

    async def _create(
        self, pod: api.PodSandbox, container: api.Container
    ) -> api.CreateContainerResponse:
        is_gated = gated(m.destination for m in container.mounts)
        text = pod.annotations.get(ALLOCATION_ANNOTATION)
        context = f'pod {_pod_key(pod)} (uid {pod.uid}), container "{container.name}"'
        if text is None:
            if is_gated:
                return self._refuse_gated(context, "the pod has no allocation record")
            self._count("create", "untouched")
            return api.CreateContainerResponse()
        try:
            alloc = self._decode(pod, text)
            plan = open_gate(
                plan_container(
                    alloc,
                    container.name,
                    self.config.settings,
                    self.host,
                    container_user(container),
                ),
                is_gated,
            )
        except RejectError as exc:
            self._invalid(exc.with_context(context), "create")
            return self._let_run(is_gated)
        if plan is None and is_gated:
            return self._refuse_gated(context, "its allocation record does not name it")
        if plan is None or plan.empty:
            log.debug("%s: not named in the allocation record; untouched", context)
            self._count("create", "untouched")
            return api.CreateContainerResponse()
        if not await self._netdevs_in_place(pod, alloc, context):
            return self._let_run(is_gated)
        summary = (
            f"gpus={','.join(plan.gpus) or '-'} rdma={','.join(plan.rdma) or '-'} "
            f"devices={','.join(d.path for d in plan.devices)} "
            f"isolation={self.config.settings.isolation}"
        )
        log.info(
            "injected pod=%s container=%s %s",
            _pod_key(pod),
            container.name,
            summary,
            extra={"pod": _pod_key(pod), "container": container.name},
        )
        self.injected[container.id] = (pod.id, summary)
        self._count("create", "injected")
        if plan.without_layer:
            log.warning(
                "pod=%s container=%s: whole GPU(s) given without the isolation layer %s: %s",
                _pod_key(pod),
                container.name,
                self.config.settings.isolation,
                plan.without_layer,
                extra={"pod": _pod_key(pod), "container": container.name},
            )
        if plan.shares and self.config.settings.isolation == ISOLATION_NONE:
            # The operator accepted this (--allow-unisolated-sharing); say it every time,
            # since a neighbour on the same GPU can take all its memory.
            log.warning(
                "pod=%s container=%s: %d GPU share(s) given WITHOUT isolation "
                "(--isolation=none): memory and compute are not limited",
                _pod_key(pod),
                container.name,
                plan.shares,
            )
            if self.metrics is not None:
                self.metrics.unisolated(plan.shares)
        return api.CreateContainerResponse(adjust=to_proto(plan))

    async def _netdevs_in_place(
        self, pod: api.PodSandbox, alloc: PodAllocation, context: str
    ) -> bool:
        """Make sure the pod's VF netdevs are in its namespace before a container the
        record names is created: its sandbox may have started while the hook was away
        (no RunPodSandbox seen; or seen only by a hook that was restarted since), and
        the container would then run without them. Moving is a no-op for VFs already
        there. False (under `warn`) when they cannot be moved; raises under `fail`."""
        if self.mover is None or pod.id in self._moved_here:
            return True
        try:
            planned = self._plan_moves(pod, alloc)
            if planned is not None:
                await asyncio.to_thread(self.mover.move_in, planned.netns, list(planned.moves))
        except NetdevError as exc:
            self._netdev_count("in", "error")
            self._invalid(RejectError(status_of(exc), str(exc), context), "create")
            return False
        except RejectError as exc:
            self._invalid(exc.with_context(context), "create")
            return False
        self._moved_here.add(pod.id)
        if planned is not None and pod.id not in self.pod_netdevs:
            log.warning(
                "moved VF netdevs of pod=%s into %s at container creation (its sandbox "
                "started while the hook was away): %s",
                planned.key,
                planned.netns,
                ", ".join(f"{m.host_name}->{m.pod_name}" for m in planned.moves),
            )
            self._netdev_count("in", "ok")
            self.pod_netdevs[pod.id] = planned
            self._hold(pod.id, planned.netns)
        return True

    def _refuse_gated(self, context: str, why: str) -> api.CreateContainerResponse:
        """A container the kubelet gave tessera devices that the record does not cover
        (a pod placed by another scheduler, a record without it): refused, or with
        `warn` let run without any device."""
        self._invalid(
            RejectError(
                Code.FAILED_PRECONDITION,
                f"the kubelet gave it tessera devices but {why}; it would run without "
                "them (was the pod placed by tessera's scheduler extender?)",
                context,
            ),
            "create",
        )
        return self._let_run(True)

    @staticmethod
    def _let_run(is_gated: bool) -> api.CreateContainerResponse:
        """What a container refused under `warn` gets: nothing, but its gate removed so
        that it starts (the operator's choice)."""
        if not is_gated:
            return api.CreateContainerResponse()
        return api.CreateContainerResponse(adjust=to_proto(UNGATE_ONLY))

    async def stop_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> Sequence[api.ContainerUpdate]:
        if self.injected.pop(container.id, None) is not None:
            log.info("released pod=%s container=%s", _pod_key(pod), container.name)
        return ()

    # --- sandboxes and other events ---------------------------------------------------------

    async def event(self, event: int, pod: api.PodSandbox, container: api.Container | None) -> None:
        if event == api.RUN_POD_SANDBOX:
            await self._sandbox_started(pod)
        elif event == api.STOP_POD_SANDBOX:
            await self._sandbox_stopped(pod, forget=False)
        elif event == api.REMOVE_POD_SANDBOX:
            await self._sandbox_stopped(pod, forget=True)
        elif event == api.REMOVE_CONTAINER and container is not None:
            self.injected.pop(container.id, None)

    def _plan_pod_netdevs(self, pod: api.PodSandbox) -> _PodNetdevs | None:
        """The VF moves the pod's record asks for; None when there are none or the pod
        shares the host network. Raises RejectError for a bad record."""
        text = pod.annotations.get(ALLOCATION_ANNOTATION)
        if text is None:
            return None
        return self._plan_moves(pod, self._decode(pod, text))

    def _plan_moves(self, pod: api.PodSandbox, alloc: PodAllocation) -> _PodNetdevs | None:
        """The VF moves of a verified record; None when there are none or the pod shares
        the host network. Raises RejectError for a VF that cannot be named in the pod."""
        try:
            moves = plan_moves(alloc, self.config.vf_rename_prefix)
        except NetdevError as exc:
            raise RejectError(status_of(exc), str(exc)) from None
        if not moves:
            return None
        netns = network_namespace((ns.type, ns.path) for ns in pod.linux.namespaces)
        if netns is None:
            log.info(
                "pod %s shares the host network; its VF netdevs stay in the host namespace",
                _pod_key(pod),
            )
            return None
        return _PodNetdevs(_pod_key(pod), netns, tuple(moves))

    async def _sandbox_started(self, pod: api.PodSandbox) -> None:
        if self.mover is None:
            return
        context = f"pod {_pod_key(pod)} (uid {pod.uid})"
        text = pod.annotations.get(ALLOCATION_ANNOTATION)
        if text is None:
            return
        try:
            alloc = self._decode(pod, text)
        except RejectError as exc:
            # Nothing is moved for a record that does not verify, and the sandbox (pause)
            # gets no device. Its containers are refused with this reason, which the kubelet
            # puts in the pod's status; a refused sandbox would show only as an event, the
            # pod reading ContainerCreating, and each retry would set up its network again.
            self._warn_once(pod, f"{exc.message}; no VF moved, its containers are refused")
            self._count("sandbox", "invalid")
            return
        try:
            planned = self._plan_moves(pod, alloc)
        except RejectError as exc:
            self._invalid(exc.with_context(context), "sandbox")
            return
        if planned is None:
            self._moved_here.add(pod.id)
            return
        try:
            await asyncio.to_thread(self.mover.move_in, planned.netns, list(planned.moves))
        except NetdevError as exc:
            self._netdev_count("in", "error")
            self._invalid(RejectError(status_of(exc), str(exc), context), "sandbox")
            return
        self._netdev_count("in", "ok")
        self._moved_here.add(pod.id)
        self.pod_netdevs[pod.id] = planned
        self._hold(pod.id, planned.netns)
        log.info(
            "moved VF netdevs of pod=%s into %s: %s",
            planned.key,
            planned.netns,
            ", ".join(f"{m.host_name}->{m.pod_name}" for m in planned.moves),
        )

    async def _sandbox_stopped(self, pod: api.PodSandbox, *, forget: bool) -> None:
        """Never fails: a pod must always be deletable, whatever its record says."""
        planned = self.pod_netdevs.get(pod.id)
        if forget:
            self.pod_netdevs.pop(pod.id, None)
            self._moved_here.discard(pod.id)
            self.injected = {
                cid: entry for cid, entry in self.injected.items() if entry[0] != pod.id
            }
        if self.mover is None:
            return
        try:
            if planned is None:
                planned = self._plan_pod_netdevs(pod)
            if planned is None:
                return
        except RejectError as exc:
            # nothing of ours was moved for an invalid record
            self._warn_once(pod, f"{exc.message}; nothing to bring back")
            return
        except Exception as exc:
            self._warn_once(
                pod, f"cannot bring its VF netdevs back: {type(exc).__name__}: {exc}", exc
            )
            return
        if await self._bring_back(pod.id, planned) or forget:
            self._release(pod.id)

    async def _bring_back(self, pod_id: str, planned: _PodNetdevs) -> bool:
        """Move the pod's VFs back to the host, through the namespace we hold when its path
        no longer leads there. True when all are back; problems are logged, never raised."""
        assert self.mover is not None
        fd = self._held.get(pod_id)
        netns = planned.netns
        if fd is not None and not _same_file(netns, fd):
            netns = f"/proc/self/fd/{fd}"
        try:
            problems = await asyncio.to_thread(self.mover.move_out, netns, list(planned.moves))
        except Exception as exc:
            self._netdev_count("out", "error")
            log.error(
                "pod %s: cannot bring its VF netdevs back: %s: %s",
                planned.key,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
            return False
        if problems:
            self._netdev_count("out", "error")
            for problem in problems:
                log.error("pod %s: %s", planned.key, problem)
            return False
        self._netdev_count("out", "ok")
        log.info("VF netdevs of pod=%s are back in the host namespace", planned.key)
        return True

    def _hold(self, pod_id: str, netns: str) -> None:
        if pod_id in self._held:
            return
        try:
            self._held[pod_id] = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("cannot hold network namespace %s: %s", netns, exc.strerror or exc)

    def _release(self, pod_id: str) -> None:
        fd = self._held.pop(pod_id, None)
        if fd is not None:
            os.close(fd)

    async def reconcile(self) -> None:
        """Bring back the VFs of every pod whose namespace path no longer leads to the
        namespace we moved them into: the runtime deleted the sandbox without telling us
        (containerd does so for sandboxes that started before it restarted)."""
        for pod_id, planned in list(self.pod_netdevs.items()):
            fd = self._held.get(pod_id)
            if fd is None or _same_file(planned.netns, fd):
                continue
            log.warning(
                "pod %s: its network namespace %s was deleted without a sandbox stop event; "
                "bringing its VF netdevs back",
                planned.key,
                planned.netns,
            )
            await self._bring_back(pod_id, planned)
            self._release(pod_id)
            self.pod_netdevs.pop(pod_id, None)

    async def maintain(self, stop: asyncio.Event) -> None:
        """Run `reconcile` every RECONCILE_SECONDS until `stop`; then let go of every
        namespace held (the VFs stay with their running pods)."""
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), RECONCILE_SECONDS)
                try:
                    await self.reconcile()
                except Exception:
                    log.exception("VF netdev reconciliation failed; retrying later")
        finally:
            for pod_id in list(self._held):
                self._release(pod_id)

    def _warn_once(
        self, pod: api.PodSandbox, reason: str, error: BaseException | None = None
    ) -> None:
        """Log a bad pod that is skipped: a warning the first time, debug after."""
        key = (pod.uid or pod.id, reason)
        if key in self._warned:
            self._warned.move_to_end(key)
            log.debug("pod %s: %s", _pod_key(pod), reason)
            return
        self._warned[key] = None
        if len(self._warned) > MAX_REMEMBERED_WARNINGS:
            self._warned.popitem(last=False)
        log.warning("pod %s: %s", _pod_key(pod), reason, exc_info=error)

    def _netdev_count(self, direction: str, result: str) -> None:
        if self.metrics is not None:
            self.metrics.netdev(direction, result)

    # --- the runtime connection ----------------------------------------------------------

    def connected(self) -> None:
        if self.metrics is not None:
            self.metrics.connection(True)

    def disconnected(self) -> None:
        # containerd creates containers without the hook now: the fail-closed gate (or
        # NRI's required-plugins validation) holds the device pods' containers meanwhile
        if self.metrics is not None:
            self.metrics.connection(False)

    # --- synchronization --------------------------------------------------------------------

    async def synchronize(
        self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container]
    ) -> Sequence[api.ContainerUpdate]:
        """Rebuild what a restarted plugin needs to clean up later: which sandboxes hold
        moved VF netdevs. Nothing is changed on the node but the VFs of pods deleted while
        we were away, brought back through the namespace we held. What is remembered of pods and
        containers the runtime no longer has is dropped, so this state never outgrows
        what runs on the node."""
        pod_ids = {pod.id for pod in pods}
        container_ids = {c.id for c in containers}
        for pod_id, gone in list(self.pod_netdevs.items()):
            if pod_id not in pod_ids:  # deleted while we were away from the runtime
                if pod_id in self._held and self.mover is not None:
                    await self._bring_back(pod_id, gone)
                self._release(pod_id)
        self.pod_netdevs = {k: v for k, v in self.pod_netdevs.items() if k in pod_ids}
        self._moved_here &= pod_ids
        self.injected = {k: v for k, v in self.injected.items() if k in container_ids}
        tracked = 0
        for pod in pods:
            if pod.id in self.pod_netdevs or self.mover is None:
                continue
            try:
                planned = self._plan_pod_netdevs(pod)
            except RejectError as exc:
                self._warn_once(pod, f"{exc.message}; skipped")
                continue
            except Exception as exc:
                self._warn_once(pod, f"skipped: {type(exc).__name__}: {exc}", exc)
                continue
            if planned is not None:
                self.pod_netdevs[pod.id] = planned
                self._hold(pod.id, planned.netns)
                tracked += 1
        log.info(
            "synchronized: %d pods, %d containers; %d pods with VF netdevs tracked",
            len(pods),
            len(containers),
            tracked,
        )
        self._report_gated(pods, containers)
        return ()

    @staticmethod
    def _report_gated(pods: Sequence[api.PodSandbox], containers: Sequence[api.Container]) -> None:
        """Containers the runtime created while the hook was away still carry the gate:
        runc refuses to start them and the kubelet creates them again, through the hook.
        Nothing can be changed in a created container's spec, so they are only named."""
        names = {pod.id: _pod_key(pod) for pod in pods}
        left = [
            f"{names.get(c.pod_sandbox_id, c.pod_sandbox_id)}/{c.name}"
            for c in containers
            if gated(m.destination for m in c.mounts)
        ]
        if left:
            log.warning(
                "%d container(s) were created while the hook was not connected and keep the "
                "fail-closed gate (runc refuses to start them; the kubelet creates them "
                "again): %s",
                len(left),
                ", ".join(sorted(left)[:20]) + (" ..." if len(left) > 20 else ""),
            )


def container_user(container: api.Container) -> ContainerUser | None:
    """Who the container runs as, when the runtime said (NRI API 0.11 and later)."""
    if not container.HasField("user"):
        return None
    own = any(ns.type == "user" for ns in container.linux.namespaces)
    return ContainerUser(container.user.uid, own_user_namespace=own)


def _same_file(path: str, fd: int) -> bool:
    """Whether `path` still names the file open as `fd` (a namespace's bind mount)."""
    try:
        a, b = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class Metrics:
    """Prometheus counters in a private registry; served only when a port is given."""

    DEFAULT_PORT = 9466
    """The hook's metrics port in the shipped DaemonSet (host network; 9465 is the node
    agent's, 9400 dcgm-exporter's)."""

    def __init__(self, node: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        # the node label lets an alert name the node, and find a node agent without a hook
        self._connected = Gauge(
            "tessera_nri_connected",
            "1 while the hook is registered with the container runtime on its NRI socket "
            "(containers are created through it), else 0",
            ["node"],
            registry=self.registry,
        ).labels(node)
        self._results = Counter(
            "tessera_nri_requests",
            "Container creations and sandbox starts handled, by result",
            ["operation", "result"],
            registry=self.registry,
        )
        self._netdevs = Counter(
            "tessera_nri_vf_netdev_moves",
            "VF netdev moves into (in) and out of (out) pod namespaces, by result",
            ["direction", "result"],
            registry=self.registry,
        )
        self._create = Histogram(
            "tessera_nri_create_container_seconds",
            "Time to decide a CreateContainer adjustment",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05),
            registry=self.registry,
        )
        self._layer = Gauge(
            "tessera_nri_isolation_layer",
            '1 for the GPU isolation layer the hook configures (--isolation); layer="none" '
            "means GPU shares are not limited",
            ["layer"],
            registry=self.registry,
        )
        self._unisolated = Counter(
            "tessera_nri_unisolated_gpu_shares",
            "GPU shares (below a whole GPU) given to containers with no isolation layer",
            registry=self.registry,
        )
        self._unmanaged = Counter(
            "tessera_nri_unmanaged_gpu_access",
            "Containers created whose own device rules open GPUs tessera did not give them "
            "(privileged, or a device rule for the NVIDIA major)",
            registry=self.registry,
        )

    def isolation(self, layer: str) -> None:
        self._layer.labels(layer).set(1)

    def connection(self, connected: bool) -> None:
        self._connected.set(1 if connected else 0)

    def unisolated(self, shares: int) -> None:
        self._unisolated.inc(shares)

    def unmanaged_gpu_access(self) -> None:
        self._unmanaged.inc()

    def count(self, operation: str, result: str) -> None:
        self._results.labels(operation, result).inc()

    def netdev(self, direction: str, result: str) -> None:
        self._netdevs.labels(direction, result).inc()

    def observe_create(self, seconds: float) -> None:
        self._create.observe(seconds)
