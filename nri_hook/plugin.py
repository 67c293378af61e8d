"""The NRI plugin protocol: registration, Configure, Synchronize, events, reconnection.

Generic NRI machinery; what the plugin *does* lives in a `Handler` (tessera's is
nri_hook.enforce.Enforcer).

One session on one stream connection (containerd's NRI v0.2+ plugin protocol):
1. Wrap the connection in the multiplexer; serve the Plugin service on connection 1
   (the runtime is the ttrpc client there) before anything else.
2. Call Runtime/RegisterPlugin on connection 2 (we are the client) with the name and the
   two-digit index; the runtime drops plugins that have not registered within its
   registration timeout (5 s by default).
3. The runtime calls Configure: the reply carries the event mask. Bits outside what the
   runtime knows make it drop the plugin, so the mask is clipped to 0x7FF unless the
   runtime announces NRI v0.10 or later (ConfigureRequest.NRI_version exists from v0.12;
   runtimes that send none are treated as pre-v0.10, which is safe: 0x7FF is valid
   everywhere). A mask of 0 would mean "every event", so it is never sent.
4. Synchronize, possibly split: chunks with more=true are answered more=true with no
   updates and collected; the last chunk gets the handler's answer for everything.
5. Events: CreateContainer, UpdateContainer and StopContainer have their own methods in
   every version; the others arrive as dedicated methods (v0.12+) or as StateChange (all
   versions, and the only way before v0.12). Both reach `Handler.event`. Unknown methods
   get UNIMPLEMENTED, which a v0.12 runtime reads as "use StateChange".

Two ways in: dial the runtime's socket (external plugin, reconnecting with exponential
backoff whenever the runtime goes away), or use the connection a launching runtime passed
on the file descriptor in NRI_PLUGIN_SOCKET (the plugin ends with that connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf.message import Message

from nri_hook.errors import status_of
from nri_hook.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux
from protos.nri import api_pb2 as api
from tessera_edge.host_paths import NRI_SOCKET
from tessera_ttrpc import CallContext, Client, Code, RpcError, Server, unary

log = logging.getLogger(__name__)

PLUGIN_SERVICE: Final = api.DESCRIPTOR.services_by_name["Plugin"].full_name
RUNTIME_SERVICE: Final = api.DESCRIPTOR.services_by_name["Runtime"].full_name

DEFAULT_SOCKET_PATH: Final = NRI_SOCKET
PLUGIN_SOCKET_ENV: Final = "NRI_PLUGIN_SOCKET"
PLUGIN_NAME_ENV: Final = "NRI_PLUGIN_NAME"
PLUGIN_IDX_ENV: Final = "NRI_PLUGIN_IDX"

VALID_EVENTS_LEGACY: Final = 0x7FF
"""Events every runtime accepts (before NRI v0.10: RUN_POD_SANDBOX .. REMOVE_CONTAINER)."""
VALID_EVENTS_V0_10: Final = 0x3FFF
"""From NRI v0.10 (adds UPDATE_POD_SANDBOX, POST_UPDATE_POD_SANDBOX, VALIDATE_...)."""

DEFAULT_REGISTRATION_TIMEOUT: Final = 5.0

MAX_SYNC_OBJECTS: Final = 16384
"""Pods plus containers one Synchronize (all its chunks) may carry. kubelet runs at most
--max-pods pods on a node (110 by default, rarely configured above 500), each with a few
containers: this is ten times the busiest real node, and bounds what a peer can make the
plugin hold (each object collected costs memory until the last chunk)."""
MAX_SYNC_BYTES: Final = 128 << 20
"""Bytes of all chunks of one Synchronize. The runtime splits a Synchronize into chunks of
at most 4 MiB (the ttrpc limit); a pod or container is a few KiB (Kubernetes caps an
object's annotations at 256 KiB), so a node at 500 pods sends a few MiB to a few tens of
MiB: 32 full chunks is ample, and the memory a peer can pin stays bounded."""

_NAME_RE = re.compile(r"^[a-zA-Z0-9_.+-]+$")
_INDEX_RE = re.compile(r"^[0-9]{2}$")
_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)")


def event_bit(event: int) -> int:
    return 1 << (event - 1)


def event_mask(events: Iterable[int]) -> int:
    mask = 0
    for event in events:
        if not api.UNKNOWN < event < api.LAST:
            raise ValueError(f"not an NRI event: {event}")
        mask |= event_bit(event)
    return mask


def event_names(mask: int) -> str:
    names = [api.Event.Name(e) for e in range(api.RUN_POD_SANDBOX, api.LAST) if mask & event_bit(e)]
    return "|".join(names) or "none"


def valid_events_for(nri_version: str) -> int:
    """The event bits a runtime announcing `nri_version` accepts (see module doc)."""
    match = _VERSION_RE.match(nri_version.strip())
    if match and (int(match.group(1)), int(match.group(2))) >= (0, 10):
        return VALID_EVENTS_V0_10
    return VALID_EVENTS_LEGACY


def check_identity(name: str, index: str) -> None:
    """Raise ValueError unless name and index are what runtimes accept."""
    if not _NAME_RE.match(name):
        raise ValueError(
            f"plugin name {name!r} must be non-empty and use only letters, digits, _ . + -"
        )
    if not _INDEX_RE.match(index):
        raise ValueError(f"plugin index {index!r} must be exactly two digits (00-99)")


class Handler:
    """What a plugin does. Override what you need; the defaults do nothing."""

    events: frozenset[int] = frozenset()
    """The api.Event values to subscribe to."""

    async def configure(self, request: api.ConfigureRequest) -> None:
        """Called on Configure, before the mask is returned. Raise RpcError to refuse."""

    async def synchronize(
        self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container]
    ) -> Sequence[api.ContainerUpdate]:
        """Everything the runtime runs, after each (re)connection."""
        return ()

    async def create_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> api.CreateContainerResponse:
        """Return the adjustment; raise RpcError to fail the creation."""
        return api.CreateContainerResponse()

    async def update_container(
        self, pod: api.PodSandbox, container: api.Container, resources: api.LinuxResources
    ) -> api.UpdateContainerResponse:
        return api.UpdateContainerResponse()

    async def stop_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> Sequence[api.ContainerUpdate]:
        return ()

    async def event(self, event: int, pod: api.PodSandbox, container: api.Container | None) -> None:
        """Every other event (sandbox run/stop/remove, container start/remove, post-*),
        whether it came as a dedicated call or as StateChange. Raise RpcError to fail it
        (the runtime fails the operation where it can, e.g. RunPodSandbox)."""

    async def validate(
        self, request: api.ValidateContainerAdjustmentRequest
    ) -> api.ValidateContainerAdjustmentResponse:
        return api.ValidateContainerAdjustmentResponse()

    def connected(self) -> None:
        """The runtime accepted the registration: events follow on this connection."""

    def disconnected(self) -> None:
        """The runtime connection ended."""


@dataclass
class Backoff:
    """Exponential reconnect delay with +-jitter."""

    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.1
    _next: float = 0.0

    def reset(self) -> None:
        self._next = 0.0

    def next(self) -> float:
        base = self.initial if self._next == 0.0 else min(self._next * self.factor, self.maximum)
        self._next = base
        return base * (1 + random.uniform(-self.jitter, self.jitter))


class _Session:
    """Plugin-service state of one runtime connection."""

    _POD_EVENTS: Final = {
        "RunPodSandbox": api.RUN_POD_SANDBOX,
        "StopPodSandbox": api.STOP_POD_SANDBOX,
        "RemovePodSandbox": api.REMOVE_POD_SANDBOX,
        "PostUpdatePodSandbox": api.POST_UPDATE_POD_SANDBOX,
    }
    _CONTAINER_EVENTS: Final = {
        "PostCreateContainer": api.POST_CREATE_CONTAINER,
        "StartContainer": api.START_CONTAINER,
        "PostStartContainer": api.POST_START_CONTAINER,
        "PostUpdateContainer": api.POST_UPDATE_CONTAINER,
        "RemoveContainer": api.REMOVE_CONTAINER,
    }

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.runtime = ""
        self._sync_pods: list[api.PodSandbox] = []
        self._sync_containers: list[api.Container] = []
        self._sync_bytes = 0

    def register(self, server: Server) -> None:
        typed: dict[str, tuple[type[Message], MessageHandler]] = {
            "Configure": (api.ConfigureRequest, self._configure),
            "Synchronize": (api.SynchronizeRequest, self._synchronize),
            "Shutdown": (api.Empty, self._shutdown),
            "CreateContainer": (api.CreateContainerRequest, self._create_container),
            "UpdateContainer": (api.UpdateContainerRequest, self._update_container),
            "StopContainer": (api.StopContainerRequest, self._stop_container),
            "StateChange": (api.StateChangeEvent, self._state_change),
            "UpdatePodSandbox": (api.UpdatePodSandboxRequest, self._update_pod_sandbox),
            "ValidateContainerAdjustment": (
                api.ValidateContainerAdjustmentRequest,
                self._validate,
            ),
        }
        for method, event in self._POD_EVENTS.items():
            typed[method] = (getattr(api, f"{method}Request"), self._event_call(event, False))
        for method, event in self._CONTAINER_EVENTS.items():
            typed[method] = (getattr(api, f"{method}Request"), self._event_call(event, True))
        server.register(
            PLUGIN_SERVICE,
            {
                method: unary(request_type, _guarded(method, handler), method)
                for method, (request_type, handler) in typed.items()
            },
        )

    async def _configure(
        self, req: api.ConfigureRequest, ctx: CallContext
    ) -> api.ConfigureResponse:
        wanted = event_mask(self.handler.events)
        valid = valid_events_for(req.NRI_version)
        mask = wanted & valid
        if wanted & ~valid:
            log.warning(
                "runtime %s %s (NRI %s) does not know events %s; not subscribing to them",
                req.runtime_name,
                req.runtime_version,
                req.NRI_version or "unknown",
                event_names(wanted & ~valid),
            )
        if mask == 0:
            # 0 would subscribe to everything.
            raise RpcError(Code.FAILED_PRECONDITION, "plugin has no events to subscribe to")
        await self.handler.configure(req)
        self.runtime = f"{req.runtime_name} {req.runtime_version}".strip()
        log.info(
            "configured by %s (NRI %s, registration timeout %d ms, request timeout %d ms); "
            "events %s (0x%x)",
            self.runtime or "unknown runtime",
            req.NRI_version or "not announced",
            req.registration_timeout,
            req.request_timeout,
            event_names(mask),
            mask,
        )
        return api.ConfigureResponse(events=mask)

    async def _synchronize(
        self, req: api.SynchronizeRequest, ctx: CallContext
    ) -> api.SynchronizeResponse:
        objects = len(self._sync_pods) + len(self._sync_containers)
        objects += len(req.pods) + len(req.containers)
        self._sync_bytes += req.ByteSize()
        if objects > MAX_SYNC_OBJECTS or self._sync_bytes > MAX_SYNC_BYTES:
            self._sync_pods, self._sync_containers, self._sync_bytes = [], [], 0
            raise RpcError(
                Code.RESOURCE_EXHAUSTED,
                f"Synchronize carries over {MAX_SYNC_OBJECTS} pods and containers or over "
                f"{MAX_SYNC_BYTES >> 20} MiB",
            )
        self._sync_pods.extend(req.pods)
        self._sync_containers.extend(req.containers)
        if req.more:
            return api.SynchronizeResponse(more=True)
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers, self._sync_bytes = [], [], 0
        updates = await self.handler.synchronize(pods, containers)
        return api.SynchronizeResponse(update=updates, more=False)

    async def _shutdown(self, req: api.Empty, ctx: CallContext) -> api.Empty:
        log.info("runtime asked the plugin to shut down")
        return api.Empty()

    async def _create_container(
        self, req: api.CreateContainerRequest, ctx: CallContext
    ) -> api.CreateContainerResponse:
        return await self.handler.create_container(req.pod, req.container)

    async def _update_container(
        self, req: api.UpdateContainerRequest, ctx: CallContext
    ) -> api.UpdateContainerResponse:
        return await self.handler.update_container(req.pod, req.container, req.linux_resources)

    async def _stop_container(
        self, req: api.StopContainerRequest, ctx: CallContext
    ) -> api.StopContainerResponse:
        updates = await self.handler.stop_container(req.pod, req.container)
        return api.StopContainerResponse(update=updates)

    async def _state_change(self, req: api.StateChangeEvent, ctx: CallContext) -> api.Empty:
        container = req.container if req.HasField("container") else None
        await self.handler.event(req.event, req.pod, container)
        return api.Empty()

    async def _update_pod_sandbox(
        self, req: api.UpdatePodSandboxRequest, ctx: CallContext
    ) -> api.UpdatePodSandboxResponse:
        return api.UpdatePodSandboxResponse()

    async def _validate(
        self, req: api.ValidateContainerAdjustmentRequest, ctx: CallContext
    ) -> api.ValidateContainerAdjustmentResponse:
        return await self.handler.validate(req)

    def _event_call(self, event: int, with_container: bool) -> MessageHandler:
        handler = self.handler

        async def call(req: Any, ctx: CallContext) -> Message:
            await handler.event(event, req.pod, req.container if with_container else None)
            return api.Empty()  # the response messages of these events have no fields

        return call


MessageHandler = Callable[[Any, CallContext], Awaitable[Message]]


def _guarded(method: str, handler: MessageHandler) -> MessageHandler:
    """An exception fails this call only, with its status from NRI_ERRORS (INTERNAL for an
    unexpected one) naming the method and pod; the session and every other call carry on."""

    async def call(req: Any, ctx: CallContext) -> Message:
        try:
            return await handler(req, ctx)
        except RpcError:
            raise
        except Exception as exc:
            about = _about(req)
            code = status_of(exc)
            if code != Code.INTERNAL:
                raise RpcError(code, f"{method}{about}: {exc}") from None
            log.exception("%s%s failed", method, about)
            raise RpcError(
                code,
                f"{method}{about}: internal error in the plugin: {type(exc).__name__}: {exc}",
            ) from None

    return call


def _about(req: Message) -> str:
    pod = getattr(req, "pod", None)
    if not isinstance(pod, api.PodSandbox) or not (pod.name or pod.namespace):
        return ""
    return f" of pod {pod.namespace}/{pod.name}"


class NriPlugin:
    """Runs a Handler against a runtime: one connection (`serve_connection`) or the whole
    life of the plugin with reconnection (`run`)."""

    def __init__(
        self,
        handler: Handler,
        *,
        name: str,
        index: str,
        socket_path: str = DEFAULT_SOCKET_PATH,
        registration_timeout: float = DEFAULT_REGISTRATION_TIMEOUT,
        backoff: Backoff | None = None,
    ) -> None:
        check_identity(name, index)
        self.handler = handler
        self.name = name
        self.index = index
        self.socket_path = socket_path
        self.registration_timeout = registration_timeout
        self.backoff = backoff or Backoff()
        self.sessions = 0
        """Connections on which registration succeeded (for tests and logs)."""

    @property
    def qualified_name(self) -> str:
        return f"{self.index}-{self.name}"

    async def serve_connection(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        stop: asyncio.Event | None = None,
    ) -> bool:
        """Run one session until the runtime closes the connection (or `stop` is set).
        Returns whether registration succeeded."""
        mux = Mux(reader, writer)
        session = _Session(self.handler)
        server = Server()
        session.register(server)
        serving = asyncio.get_running_loop().create_task(
            server.serve(mux.open(PLUGIN_SERVICE_CONN))
        )
        client = Client(mux.open(RUNTIME_SERVICE_CONN))
        registered = False
        try:
            request = api.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
            await client.call_message(
                RUNTIME_SERVICE,
                "RegisterPlugin",
                request,
                api.Empty,
                timeout=self.registration_timeout,
            )
            registered = True
            self.sessions += 1
            self.handler.connected()
            log.info("registered with the runtime as %s", self.qualified_name)
            waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(mux.wait_closed())]
            if stop is not None:
                waits.append(asyncio.ensure_future(stop.wait()))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            if mux.error is not None:
                log.warning("runtime connection failed: %s", mux.error)
        except RpcError as exc:
            log.error("registration as %s failed: %s", self.qualified_name, exc)
        finally:
            mux.close()
            client.close()
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
            self.handler.disconnected()
        return registered

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serve until `stop` is set: on the inherited connection when NRI_PLUGIN_SOCKET
        is set (then return when it closes), else by dialing `socket_path` and
        reconnecting with backoff."""
        stop = stop or asyncio.Event()
        fd_text = os.environ.get(PLUGIN_SOCKET_ENV, "")
        if fd_text:
            await self._run_launched(fd_text, stop)
            return
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_unix_connection(self.socket_path)
            except OSError as exc:
                delay = self.backoff.next()
                log.warning(
                    "cannot connect to NRI socket %s (%s); retrying in %.1fs",
                    self.socket_path,
                    exc.strerror or exc,
                    delay,
                )
                await _sleep_unless(stop, delay)
                continue
            log.info("connected to NRI socket %s", self.socket_path)
            if await self.serve_connection(reader, writer, stop):
                self.backoff.reset()
            if stop.is_set():
                break
            delay = self.backoff.next()
            log.info("runtime connection closed; reconnecting in %.1fs", delay)
            await _sleep_unless(stop, delay)

    async def _run_launched(self, fd_text: str, stop: asyncio.Event) -> None:
        try:
            fd = int(fd_text)
            sock = socket.socket(fileno=fd)
        except (ValueError, OSError) as exc:
            raise RuntimeError(f"invalid {PLUGIN_SOCKET_ENV}={fd_text!r}: {exc}") from None
        log.info("launched by the runtime; using the connection on fd %d", fd)
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        await self.serve_connection(reader, writer, stop)


async def _sleep_unless(stop: asyncio.Event, delay: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=delay)
