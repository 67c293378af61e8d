"""A stand-in for containerd's NRI side, for tests and benchmarks (not used in production).

It speaks what a real runtime speaks, over a real unix socket: the multiplexer, the
Runtime service on connection 2 (RegisterPlugin), and calls to the plugin on connection 1
as a ttrpc client. It enforces what the runtime enforces: the registration timeout, the
valid event mask of its NRI version, split Synchronize answers, and it delivers events the
way its version does (dedicated methods with StateChange fallback on UNIMPLEMENTED for
NRI v0.12+, StateChange only for older runtimes). Requests carry containerd's metadata
and per-request timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Final, TypeVar, cast

from google.protobuf.message import Message

from nri_hook.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux
from nri_hook.plugin import (
    PLUGIN_SERVICE,
    RUNTIME_SERVICE,
    VALID_EVENTS_LEGACY,
    VALID_EVENTS_V0_10,
    check_identity,
    event_bit,
)
from protos.kubelet.deviceplugin.v1beta1 import api_pb2 as dp
from protos.nri import api_pb2 as api
from tessera.errors import TesseraError
from tessera_ttrpc import CallContext, Client, Code, RpcError, Server, unary

log = logging.getLogger(__name__)

NAMESPACE_METADATA: Final = ("containerd-namespace-ttrpc", "k8s.io")

M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class RuntimeVersion:
    name: str
    version: str
    nri_version: str
    """Sent in ConfigureRequest.NRI_version; empty for runtimes before NRI v0.12."""
    valid_events: int
    dedicated_events: bool
    """NRI v0.12+: one method per event, StateChange only as fallback."""


CONTAINERD_2_3: Final = RuntimeVersion("containerd", "v2.3.4", "v0.12.0", VALID_EVENTS_V0_10, True)
CONTAINERD_1_7: Final = RuntimeVersion("containerd", "1.7.34", "", VALID_EVENTS_LEGACY, False)

_DEDICATED: Final[dict[int, str]] = {
    api.RUN_POD_SANDBOX: "RunPodSandbox",
    api.STOP_POD_SANDBOX: "StopPodSandbox",
    api.REMOVE_POD_SANDBOX: "RemovePodSandbox",
    api.POST_CREATE_CONTAINER: "PostCreateContainer",
    api.START_CONTAINER: "StartContainer",
    api.POST_START_CONTAINER: "PostStartContainer",
    api.POST_UPDATE_CONTAINER: "PostUpdateContainer",
    api.REMOVE_CONTAINER: "RemoveContainer",
    api.POST_UPDATE_POD_SANDBOX: "PostUpdatePodSandbox",
}
_POD_EVENTS: Final[set[int]] = {
    api.RUN_POD_SANDBOX,
    api.STOP_POD_SANDBOX,
    api.REMOVE_POD_SANDBOX,
    api.POST_UPDATE_POD_SANDBOX,
}


class PluginDroppedError(TesseraError):
    """The simulated runtime dropped the plugin (as containerd would), saying why."""


@dataclass
class PluginConnection:
    """One connected plugin, as the runtime sees it."""

    mux: Mux
    client: Client
    version: RuntimeVersion
    request_timeout: float
    registration: api.RegisterPluginRequest | None = None
    events: int = 0
    configure_request: api.ConfigureRequest | None = None
    sync_replies: list[api.SynchronizeResponse] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    """Methods called on the plugin, in order (StateChange as StateChange:<EVENT>)."""
    dropped: str = ""

    def subscribed(self, event: int) -> bool:
        return bool(self.events & event_bit(event))

    async def call(
        self,
        method: str,
        request: Message,
        response_type: type[M],
        *,
        namespaced: bool = True,
    ) -> M:
        self.calls.append(method)
        metadata = [NAMESPACE_METADATA] if namespaced else []
        return await self.client.call_message(
            PLUGIN_SERVICE,
            method,
            request,
            response_type,
            timeout=self.request_timeout,
            metadata=metadata,
        )

    async def create_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> api.CreateContainerResponse:
        """Raises RpcError when the plugin fails the creation."""
        return await self.call(
            "CreateContainer",
            api.CreateContainerRequest(pod=pod, container=container),
            api.CreateContainerResponse,
        )

    async def stop_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        await self.call(
            "StopContainer",
            api.StopContainerRequest(pod=pod, container=container),
            api.StopContainerResponse,
            namespaced=False,
        )

    async def event(
        self, event: int, pod: api.PodSandbox, container: api.Container | None = None
    ) -> bool:
        """Deliver a non-dedicated event the way this runtime version does. Returns whether
        the plugin was subscribed (and so was called). RpcError: the plugin failed it."""
        if not self.subscribed(event):
            return False
        method = _DEDICATED.get(event)
        if self.version.dedicated_events and method is not None:
            request_type = getattr(api, f"{method}Request")
            request = (
                request_type(pod=pod)
                if event in _POD_EVENTS
                else request_type(pod=pod, container=container)
            )
            try:
                await self.call(method, request, getattr(api, f"{method}Response"))
                return True
            except RpcError as exc:
                if exc.code != Code.UNIMPLEMENTED:
                    raise
        self.calls.append(f"StateChange:{api.Event.Name(event)}")
        state = api.StateChangeEvent(event=cast(api.Event, event), pod=pod)
        if container is not None:
            state.container.CopyFrom(container)
        await self.client.call_message(
            PLUGIN_SERVICE,
            "StateChange",
            state,
            api.Empty,
            timeout=self.request_timeout,
            metadata=[NAMESPACE_METADATA],
        )
        return True

    def close(self) -> None:
        self.client.close()
        self.mux.close()


@dataclass(eq=False)
class RuntimeSimulator:
    """Accepts plugin connections on `socket_path` (or on a socket given to `attach`)."""

    socket_path: str | None = None
    _: KW_ONLY
    version: RuntimeVersion = CONTAINERD_2_3
    registration_timeout: float = 5.0
    request_timeout: float = 2.0
    sync_pods: Sequence[api.PodSandbox] = ()
    sync_containers: Sequence[api.Container] = ()
    sync_chunk: int = 0
    """Objects per Synchronize message; 0: everything in one message."""
    external: bool = True
    dropped: list[str] = field(default_factory=list, init=False)
    _server: asyncio.base_events.Server | None = field(default=None, init=False)
    _ready: asyncio.Queue[PluginConnection] = field(default_factory=asyncio.Queue, init=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    async def start(self) -> None:
        assert self.socket_path is not None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self._server = await asyncio.start_unix_server(self._accept, self.socket_path)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def attach(self, sock: socket.socket) -> None:
        """Serve a plugin on an already connected socket (a launched plugin's pair)."""

        async def go() -> None:
            reader, writer = await asyncio.open_unix_connection(sock=sock)
            await self._accept(reader, writer)

        self._spawn(go())

    async def next_plugin(self, timeout: float = 10.0) -> PluginConnection:
        """The next plugin that registered, was configured and synchronized."""
        return await asyncio.wait_for(self._ready.get(), timeout)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mux = Mux(reader, writer)
        registered: asyncio.Future[api.RegisterPluginRequest] = (
            asyncio.get_running_loop().create_future()
        )
        external = self.external

        async def register(req: api.RegisterPluginRequest, ctx: CallContext) -> api.Empty:
            if external:
                try:
                    check_identity(req.plugin_name, req.plugin_idx)
                except ValueError as exc:
                    if not registered.done():
                        registered.set_exception(PluginDroppedError(str(exc)))
                    raise RpcError(Code.UNKNOWN, f"invalid plugin: {exc}") from None
            if not registered.done():
                registered.set_result(req)
            return api.Empty()

        async def update(
            req: api.UpdateContainersRequest, ctx: CallContext
        ) -> api.UpdateContainersResponse:
            return api.UpdateContainersResponse(failed=req.update)

        server = Server()
        server.register(
            RUNTIME_SERVICE,
            {
                "RegisterPlugin": unary(api.RegisterPluginRequest, register),
                "UpdateContainers": unary(api.UpdateContainersRequest, update),
            },
        )
        self._spawn(server.serve(mux.open(RUNTIME_SERVICE_CONN)))
        conn = PluginConnection(
            mux, Client(mux.open(PLUGIN_SERVICE_CONN)), self.version, self.request_timeout
        )
        try:
            conn.registration = await asyncio.wait_for(registered, self.registration_timeout)
            await self._configure(conn)
            await self._synchronize(conn)
        except TimeoutError:
            self._drop(conn, "plugin did not register within the registration timeout")
            return
        except (PluginDroppedError, RpcError) as exc:
            self._drop(conn, str(exc))
            return
        await self._ready.put(conn)

    def _drop(self, conn: PluginConnection, reason: str) -> None:
        log.info("runtime simulator drops the plugin: %s", reason)
        conn.dropped = reason
        self.dropped.append(reason)
        conn.close()

    async def _configure(self, conn: PluginConnection) -> None:
        request = api.ConfigureRequest(
            runtime_name=self.version.name,
            runtime_version=self.version.version,
            registration_timeout=int(self.registration_timeout * 1000),
            request_timeout=int(self.request_timeout * 1000),
            NRI_version=self.version.nri_version,
        )
        conn.configure_request = request
        reply = await conn.call("Configure", request, api.ConfigureResponse, namespaced=False)
        events = reply.events
        if events == 0:
            events = self.version.valid_events
        elif events & ~self.version.valid_events:
            raise PluginDroppedError(
                f"invalid plugin events: 0x{events & ~self.version.valid_events:x}"
            )
        conn.events = events

    async def _synchronize(self, conn: PluginConnection) -> None:
        objects: list[api.PodSandbox | api.Container] = [*self.sync_pods, *self.sync_containers]
        size = self.sync_chunk or max(1, len(objects))
        chunks = [objects[i : i + size] for i in range(0, len(objects), size)] or [[]]
        for n, chunk in enumerate(chunks):
            more = n < len(chunks) - 1
            request = api.SynchronizeRequest(
                pods=[o for o in chunk if isinstance(o, api.PodSandbox)],
                containers=[o for o in chunk if isinstance(o, api.Container)],
                more=more,
            )
            reply = await conn.call(
                "Synchronize", request, api.SynchronizeResponse, namespaced=False
            )
            conn.sync_replies.append(reply)
            if more and (len(reply.update) > 0 or reply.more != more):
                raise PluginDroppedError("plugin does not handle split sync requests")


# --- realistic pods and containers, shaped like containerd's --------------------------------


def make_pod(
    name: str,
    *,
    namespace: str = "default",
    uid: str = "00000000-0000-4000-8000-000000000001",
    sandbox_id: str | None = None,
    annotations: Mapping[str, str] | None = None,
    netns: str | None = None,
) -> api.PodSandbox:
    """A PodSandbox as containerd builds it for a Kubernetes pod."""
    sandbox_id = sandbox_id or (uid.replace("-", "") * 2)[:64]
    labels = {
        "io.kubernetes.pod.name": name,
        "io.kubernetes.pod.namespace": namespace,
        "io.kubernetes.pod.uid": uid,
        "io.cri-containerd.kind": "sandbox",
    }
    all_annotations = {
        "io.kubernetes.cri.container-type": "sandbox",
        "io.kubernetes.cri.sandbox-id": sandbox_id,
        "io.kubernetes.cri.sandbox-name": name,
        "io.kubernetes.cri.sandbox-namespace": namespace,
        "io.kubernetes.cri.sandbox-uid": uid,
        "io.kubernetes.cri.sandbox-log-directory": f"/var/log/pods/{namespace}_{name}_{uid}",
        "kubernetes.io/config.source": "api",
        **(annotations or {}),
    }
    namespaces = [api.LinuxNamespace(type="ipc"), api.LinuxNamespace(type="uts")]
    if netns is not None:
        namespaces.append(api.LinuxNamespace(type="network", path=netns))
    return api.PodSandbox(
        id=sandbox_id,
        name=name,
        uid=uid,
        namespace=namespace,
        labels=labels,
        annotations=all_annotations,
        linux=api.LinuxPodSandbox(
            cgroups_path=f"/kubepods/besteffort/pod{uid}/{sandbox_id}",
            namespaces=namespaces,
            resources=api.LinuxResources(
                cpu=api.LinuxCPU(shares=api.OptionalUInt64(value=2)),
                devices=[api.LinuxDeviceCgroup(allow=False, access="rwm")],
            ),
        ),
        pid=4242,
    )


def make_container(
    pod: api.PodSandbox,
    name: str,
    *,
    container_id: str | None = None,
    env: Iterable[str] = (),
    privileged: bool = False,
    allocated: Iterable[dp.ContainerAllocateResponse] = (),
) -> api.Container:
    """A Container as containerd describes it at CreateContainer: its device rules deny
    every device (the runtime then allows its defaults), or, privileged, allow every one.
    `allocated`: the device plugins' Allocate answers for it, whose mounts the kubelet
    passes on (one per container path) and containerd turns into bind mounts."""
    container_id = container_id or (pod.id[:32] + name.encode().hex())[:64].ljust(64, "0")
    plugin_mounts: dict[str, api.Mount] = {}
    for answer in allocated:
        for m in answer.mounts:
            plugin_mounts.setdefault(
                m.container_path,
                api.Mount(
                    destination=m.container_path,
                    type="bind",
                    source=m.host_path,
                    options=["rbind", "rprivate", "ro" if m.read_only else "rw"],
                ),
            )
    container = api.Container(
        id=container_id,
        pod_sandbox_id=pod.id,
        name=name,
        state=api.CONTAINER_CREATED,
        labels={
            "io.kubernetes.container.name": name,
            "io.kubernetes.pod.name": pod.name,
            "io.kubernetes.pod.namespace": pod.namespace,
            "io.kubernetes.pod.uid": pod.uid,
        },
        annotations={
            "io.kubernetes.cri.container-name": name,
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.image-name": "docker.io/library/busybox:latest",
            "io.kubernetes.cri.sandbox-id": pod.id,
            "io.kubernetes.cri.sandbox-name": pod.name,
            "io.kubernetes.cri.sandbox-namespace": pod.namespace,
            "io.kubernetes.cri.sandbox-uid": pod.uid,
        },
        args=["sleep", "3600"],
        env=["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", *env],
        mounts=[
            api.Mount(
                destination="/etc/hosts",
                type="bind",
                source=f"/var/lib/kubelet/pods/{pod.uid}/etc-hosts",
                options=["rbind", "rprivate", "rw"],
            ),
            api.Mount(
                destination="/dev/termination-log",
                type="bind",
                source=f"/var/lib/kubelet/pods/{pod.uid}/containers/{name}/0",
                options=["rbind", "rprivate", "rw"],
            ),
        ],
        linux=api.LinuxContainer(
            namespaces=[
                api.LinuxNamespace(type="pid"),
                api.LinuxNamespace(type="ipc", path=f"/proc/{pod.pid}/ns/ipc"),
                api.LinuxNamespace(type="network", path=f"/proc/{pod.pid}/ns/net"),
                api.LinuxNamespace(type="mount"),
            ],
            resources=api.LinuxResources(
                cpu=api.LinuxCPU(
                    shares=api.OptionalUInt64(value=2), period=api.OptionalUInt64(value=100000)
                ),
                memory=api.LinuxMemory(),
                devices=[api.LinuxDeviceCgroup(allow=privileged, access="rwm")],
            ),
            oom_score_adj=api.OptionalInt(value=1000),
            cgroups_path=f"/kubepods/besteffort/pod{pod.uid}/{container_id}",
        ),
        rlimits=[api.POSIXRlimit(type="RLIMIT_NOFILE", hard=1048576, soft=1048576)],
    )
    container.mounts.extend(plugin_mounts.values())
    return container


# --- what containerd and runc make of an adjustment -----------------------------------------

RUNC_PROC_MOUNTS: Final = frozenset(
    {
        "/proc/cpuinfo",
        "/proc/diskstats",
        "/proc/meminfo",
        "/proc/stat",
        "/proc/swaps",
        "/proc/uptime",
        "/proc/loadavg",
        "/proc/slabinfo",
        "/proc/net/dev",
        "/proc/sys/kernel/ns_last_pid",
    }
)
"""The files inside /proc that runc lets a mount cover (those lxcfs emulates)."""


ROOTFS: Final = "/run/containerd/io.containerd.runtime.v2.task/k8s.io/<id>/rootfs"
"""Where the container's root is when runc mounts (its error names the full path)."""


class RuncRefusedError(TesseraError):
    """runc refused to create the container (containerd reports it when starting it)."""


def adjusted_mounts(
    container: api.Container, adjust: api.ContainerAdjustment | None
) -> list[api.Mount]:
    """The container's mounts after a plugin's adjustment, as NRI applies it: a mount
    whose destination is marked with "-" removes the container's mount at that path, the
    others are added (replacing one at the same path). None: no plugin adjusted it."""
    mounts = {m.destination: m for m in container.mounts}
    for m in adjust.mounts if adjust is not None else ():
        if m.destination.startswith("-"):
            mounts.pop(m.destination[1:], None)
        else:
            mounts[m.destination] = m
    return list(mounts.values())


def runc_create(container: api.Container, adjust: api.ContainerAdjustment | None) -> None:
    """runc's check on the final spec's mounts: none may land inside /proc but on the
    files it lets through. Raises RuncRefusedError with the words the kubelet shows (as
    containerd 1.7.34 and 2.3.4 with runc 1.1.5 report them)."""
    for m in adjusted_mounts(container, adjust):
        dest = m.destination.rstrip("/")
        if dest.startswith("/proc/") and dest not in RUNC_PROC_MOUNTS:
            raise RuncRefusedError(
                "failed to create containerd task: failed to create shim task: OCI runtime "
                "create failed: runc create failed: unable to start container process: error "
                f'during container init: error mounting "{m.source}" to rootfs at '
                f'"{m.destination}": "{ROOTFS}{m.destination}" cannot be mounted because it is '
                "inside /proc: unknown"
            )
