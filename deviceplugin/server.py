"""The kubelet-facing side: one gRPC device plugin server per resource, registration, and
recovery from kubelet restarts.

Each resource gets its own unix socket in the device-plugins directory and its own sync gRPC
server (a small thread pool). A server is serving before it registers, because the kubelet
calls GetDevicePluginOptions from inside its Register handler.

- ListAndWatch sends the current snapshot at once and again on every change; every message is
  complete. A resource keeps its snapshot serialized (8x H100: ~200 KB for the five
  resources, ~0.7 MB as message objects; nothing to serialize again per stream). A newer
  ListAndWatch stream of the same resource ends the older ones, so a kubelet that
  reconnects never leaves threads behind.
- GetPreferredAllocation answers with the units of the allocation record of the pod being
  admitted when a `chooser` (record_pods.py) finds it; otherwise (no chooser, or no pod that
  fits unambiguously) it keeps a container's units on as few devices as possible.
- Allocate answers every container at once, from the request alone: no pod lookup, no lock
  held across calls, nothing that can block. It returns a container annotation saying how
  many units of which device the kubelet counted (informational: the NRI hook applies the
  scheduler's real placement) and the fail-closed gate: a mount inside /proc that runc
  refuses, which only the NRI hook removes (tessera_edge.host_paths.NRI_GATE_DESTINATION),
  so that no container given tessera devices starts without the hook's adjustment.
- PreStartContainer is not requested (the option is off) but answered if called.

Every request is checked before any work (request_bounds.py): IDs must be ones this resource
advertised, each named once, within count and length bounds; a request the kubelet would
never send gets INVALID_ARGUMENT saying what is wrong, and so do bytes that do not decode.
gRPC itself refuses messages over MAX_RECEIVE_MESSAGE_BYTES (RESOURCE_EXHAUSTED). A refused
request changes nothing.

Kubelet restarts wipe the sockets in the directory and re-create kubelet.sock. A watcher
thread polls every `poll_interval_s` (default 100 ms; the standard library has no inotify,
and a stat of a few files is cheap): a missing or replaced plugin socket gets a fresh server,
a new kubelet.sock triggers registration of every resource. Registration retries with a
backoff (100 ms doubling to 5 s) until the kubelet accepts.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from deviceplugin.request_bounds import (
    MAX_CONCURRENT_RPCS,
    MAX_RECEIVE_MESSAGE_BYTES,
    MAX_SEND_MESSAGE_BYTES,
    check_allocation_size,
    check_container_requests,
    check_ids,
    check_subset,
)
from deviceplugin.units import (
    ResourceUnits,
    allocation_summary,
    annotation_key,
    preferred_allocation,
    socket_name,
)
from protos.kubelet.deviceplugin.v1beta1 import api_pb2 as pb
from protos.kubelet.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from tessera.errors import ErrorTable, InputError, TesseraError
from tessera_edge.host_paths import NRI_GATE_DESTINATION, NRI_GATE_SOURCE
from tessera_edge.threads import Repeating

log = logging.getLogger(__name__)

_PREFERENCE_ID_LISTS = ("available_deviceIDs", "must_include_deviceIDs")
"""The fields of a ContainerPreferredAllocationRequest that hold IDs."""
_ALLOCATE_ID_LISTS = ("devices_ids",)
"""The field of a ContainerAllocateRequest that holds IDs."""

Chooser = Callable[[str, Sequence[str], Sequence[str], int], list[str] | None]
"""(resource, available, must-include, size) -> the preferred IDs, or None for the default
choice. Must not raise (record_pods.RecordChooser logs and returns None instead)."""

API_VERSION = "v1beta1"
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_SOCKET_POLL_S = 0.1
"""How often the plugin sockets and kubelet.sock are checked (kubelet restarts)."""
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
"""The kubelet's pod-resources API (v1 PodResourcesLister) under its default root dir."""
KUBELET_SOCKET_NAME = "kubelet.sock"
OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

GRPC_ERRORS: ErrorTable[grpc.StatusCode] = ErrorTable(
    "device plugin: gRPC status to the kubelet",
    {
        TesseraError: grpc.StatusCode.UNKNOWN,
        InputError: grpc.StatusCode.INVALID_ARGUMENT,
    },
)
"""Error class -> the status the kubelet gets (subclasses take their nearest row). A request
the kubelet would never send is INVALID_ARGUMENT; anything else fails the call as gRPC
fails any uncaught exception, UNKNOWN, and is logged with its traceback. The kubelet then
fails the pod's admission (UnexpectedAdmissionError) with the message."""

SERVICE = "v1beta1.DevicePlugin"
SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_SEND_MESSAGE_BYTES),
)

# the generated gRPC module is untyped; this gives the entry point we call a type
_registration_stub: Callable[[grpc.Channel], Any] = pb_grpc.RegistrationStub


def _as_sent(message: bytes) -> bytes:
    """ListAndWatch's response serializer: snapshots are kept serialized."""
    return message


def build_snapshot(units: ResourceUnits) -> pb.ListAndWatchResponse:
    response = pb.ListAndWatchResponse()
    for unit in units.units:
        device = response.devices.add(ID=unit.id, health=unit.health)
        if unit.numa_node >= 0:
            device.topology.nodes.add(ID=unit.numa_node)
    return response


class ResourceState:
    """The latest snapshot of one resource, shared by its ListAndWatch streams."""

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self._cond = threading.Condition()
        self._version = 0
        self._key: object = None
        self._message = b""
        """The snapshot, serialized (an empty ListAndWatchResponse before the first)."""
        self._stream = 0
        self.known: frozenset[str] = frozenset()
        """Every ID of the current snapshot; requests may name only these."""
        self.healthy = 0
        self.total = 0

    def update(self, units: ResourceUnits) -> bool:
        """Install a new snapshot; returns False (and wakes nobody) if nothing changed."""
        key = units.key()
        if key == self._key:
            return False
        message = build_snapshot(units).SerializeToString()
        with self._cond:
            self._key = key
            self._message = message
            self.known = frozenset(u.id for u in units.units)
            self._version += 1
            self.healthy = units.healthy_count
            self.total = len(units.units)
            self._cond.notify_all()
        return True

    @property
    def version(self) -> int:
        return self._version

    def open_stream(self) -> int:
        with self._cond:
            self._stream += 1
            self._cond.notify_all()
            return self._stream

    def is_current(self, stream: int) -> bool:
        return self._stream == stream

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait_newer(self, version: int, stream: int, timeout_s: float) -> tuple[int, bytes] | None:
        """(version, serialized snapshot) once newer than `version`; None after `timeout_s`
        or when the stream was replaced."""
        with self._cond:
            if self._version == version and self._stream == stream:
                self._cond.wait(timeout_s)
            if self._version != version and self._version > 0:
                return self._version, self._message
            return None


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    def __init__(
        self, state: ResourceState, stopping: threading.Event, chooser: Chooser | None = None
    ) -> None:
        self._state = state
        self._stopping = stopping
        self._chooser = chooser
        self._annotation = annotation_key(state.resource)
        self.allocations = 0

    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return OPTIONS

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[bytes]:
        state = self._state
        stream = state.open_stream()
        context.add_callback(state.wake)
        version = 0
        log.info("%s: kubelet opened ListAndWatch", state.resource)
        while True:
            got = state.wait_newer(version, stream, 1.0)
            if self._stopping.is_set() or not context.is_active() or not state.is_current(stream):
                log.debug("%s: ListAndWatch stream %d ends", state.resource, stream)
                return
            if got is not None:
                version, message = got
                yield message

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        requests = request.container_requests
        check_container_requests(requests, _PREFERENCE_ID_LISTS, self._state.known)
        for creq in requests:
            check_subset(creq.must_include_deviceIDs, creq.available_deviceIDs)
            check_allocation_size(creq.allocation_size)
        response = pb.PreferredAllocationResponse()
        for creq in requests:
            ids = self._record_choice(creq)
            if ids is None:
                ids = preferred_allocation(
                    creq.available_deviceIDs, creq.must_include_deviceIDs, creq.allocation_size
                )
            response.container_responses.add(deviceIDs=ids)
        return response

    def _record_choice(self, creq: pb.ContainerPreferredAllocationRequest) -> list[str] | None:
        """The chooser's answer when it is one the kubelet can take: the wanted count of
        distinct available IDs, every must-include one among them. A chooser that fails is
        a bookkeeping miss, never the kubelet's: its call still gets the default answer."""
        if self._chooser is None:
            return None
        available = creq.available_deviceIDs
        must = creq.must_include_deviceIDs
        try:
            ids = self._chooser(self._state.resource, available, must, creq.allocation_size)
        except Exception:
            log.exception("%s: choosing the record's units failed", self._state.resource)
            return None
        if ids is None:
            return None
        offered = set(available)
        if (
            len(ids) != creq.allocation_size
            or len(set(ids)) != len(ids)
            or not offered.issuperset(ids)
            or not set(ids).issuperset(must)
        ):
            log.error("%s: record units that do not fit the request ignored", self._state.resource)
            return None
        return list(ids)

    def Allocate(
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        requests = request.container_requests
        check_container_requests(requests, _ALLOCATE_ID_LISTS, self._state.known)
        response = pb.AllocateResponse()
        for creq in requests:
            summary = allocation_summary(creq.devices_ids)
            # No env var: the kubelet's pick of units may name other GPUs than the allocation
            # record (see docs/deviceplugin.md), and an env var would read as the container's
            # GPUs. The annotation says only what the kubelet counted.
            container = response.container_responses.add()
            container.annotations[self._annotation] = summary
            # Fail closed: runc refuses this mount; the NRI hook removes it when it applies
            # the record. The kubelet keeps one mount per path over all resources.
            container.mounts.add(
                container_path=NRI_GATE_DESTINATION, host_path=NRI_GATE_SOURCE, read_only=True
            )
        self.allocations += 1
        return response

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        check_ids("devices_ids", request.devices_ids, self._state.known)
        return pb.PreStartContainerResponse()


class _Undecodable:
    """What a request that is not a valid protobuf message decodes to."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _decoder(message: type[Any]) -> Callable[[bytes], Any]:
    """gRPC answers INTERNAL when a deserializer raises; this one never does, so the handler
    can answer INVALID_ARGUMENT instead (invalid UTF-8 in a string field, a cut message)."""

    def decode(raw: bytes) -> Any:
        try:
            return message.FromString(raw)
        except Exception as exc:  # DecodeError, and whatever a broken buffer makes upb raise
            return _Undecodable(f"the request is not a valid {message.__name__}: {exc}")

    return decode


def _refuse(context: grpc.ServicerContext, method: str, reason: str) -> None:
    log.info("%s refused: %s", method, reason)
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: {reason}")


def _unary(method: str, handler: Callable[[Any, grpc.ServicerContext], Any]) -> Any:
    def guarded(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, _Undecodable):
            _refuse(context, method, request.reason)
        try:
            return handler(request, context)
        except TesseraError as exc:
            code = GRPC_ERRORS.lookup(exc)
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                log.info("%s refused: %s", method, exc)
            else:
                log.exception("%s failed", method)
            context.abort(code, f"{method}: {exc}")

    return guarded


def _stream(method: str, handler: Callable[[Any, grpc.ServicerContext], Iterator[Any]]) -> Any:
    def guarded(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        if isinstance(request, _Undecodable):
            _refuse(context, method, request.reason)
        yield from handler(request, context)

    return guarded


def service_handler(servicer: DevicePluginServicer) -> grpc.GenericRpcHandler[Any, Any]:
    """The DevicePlugin service with undecodable and bad requests answered INVALID_ARGUMENT."""
    s = servicer

    def unary(method: str, handler: Any, request: type[Any], response: type[Any]) -> Any:
        return grpc.unary_unary_rpc_method_handler(
            _unary(method, handler),
            request_deserializer=_decoder(request),
            response_serializer=response.SerializeToString,
        )

    methods = {
        "GetDevicePluginOptions": unary(
            "GetDevicePluginOptions", s.GetDevicePluginOptions, pb.Empty, pb.DevicePluginOptions
        ),
        "ListAndWatch": grpc.unary_stream_rpc_method_handler(
            _stream("ListAndWatch", s.ListAndWatch),
            request_deserializer=_decoder(pb.Empty),
            response_serializer=_as_sent,
        ),
        "GetPreferredAllocation": unary(
            "GetPreferredAllocation",
            s.GetPreferredAllocation,
            pb.PreferredAllocationRequest,
            pb.PreferredAllocationResponse,
        ),
        "Allocate": unary("Allocate", s.Allocate, pb.AllocateRequest, pb.AllocateResponse),
        "PreStartContainer": unary(
            "PreStartContainer",
            s.PreStartContainer,
            pb.PreStartContainerRequest,
            pb.PreStartContainerResponse,
        ),
    }
    return grpc.method_handlers_generic_handler(SERVICE, methods)


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class PluginServer:
    """One resource's socket, gRPC server and registration state."""

    BACKOFF_START_S = 0.1
    BACKOFF_MAX_S = 5.0

    def __init__(
        self,
        resource: str,
        plugin_dir: Path,
        workers: int = 4,
        chooser: Chooser | None = None,
    ) -> None:
        self.resource = resource
        self.plugin_dir = plugin_dir
        self.endpoint = socket_name(resource)
        self.socket_path = plugin_dir / self.endpoint
        self.state = ResourceState(resource)
        self._workers = workers
        self._stopping = threading.Event()
        self.servicer = DevicePluginServicer(self.state, self._stopping, chooser)
        self._server: grpc.Server | None = None
        self._socket_id: tuple[int, int] | None = None
        # registration bookkeeping: the watcher asks for a registration by bumping `wanted`;
        # a registration thread that succeeds records the request it answered in `done`, so
        # a kubelet restart during an in-flight Register still gets a fresh one
        self.wanted = 1
        self.done = 0
        self.registering = False
        self.next_attempt = 0.0
        self.backoff = self.BACKOFF_START_S
        self.registrations = 0
        self.last_registered = 0.0

    def start(self) -> None:
        path = self.socket_path
        if path.is_socket() or path.is_symlink():
            path.unlink()
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="dp"),
            handlers=[service_handler(self.servicer)],
            options=SERVER_OPTIONS,
            maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
        )
        if not server.add_insecure_port(f"unix://{path}"):
            raise OSError(f"cannot listen on {path}")
        server.start()
        st = os.stat(path)
        self._socket_id = (st.st_dev, st.st_ino)
        self._server = server
        log.info("%s: serving on %s", self.resource, path)

    def stop(self, grace_s: float | None = 0) -> None:
        self._stopping.set()
        self.state.wake()
        if self._server is not None:
            self._server.stop(grace_s).wait(5)
            self._server = None
        if self.socket_alive():
            self.socket_path.unlink(missing_ok=True)
        self._socket_id = None

    def restart(self) -> None:
        if self._server is not None:
            self._stopping.set()
            self.state.wake()
            self._server.stop(0).wait(5)
            self._server = None
        self._stopping.clear()
        self.start()

    @property
    def needs_registration(self) -> bool:
        return self.done < self.wanted

    def want_registration(self) -> None:
        self.wanted += 1
        self.next_attempt = 0.0
        self.backoff = self.BACKOFF_START_S

    def socket_alive(self) -> bool:
        try:
            st = os.stat(self.socket_path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._socket_id

    def register(self, kubelet_socket: Path, timeout_s: float) -> None:
        """One Register call; raises grpc.RpcError when the kubelet refuses or is absent."""
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.endpoint,
            resource_name=self.resource,
            options=OPTIONS,
        )
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            _registration_stub(channel).Register(request, timeout=timeout_s)


@dataclass(frozen=True)
class Registration:
    resource: str
    at: float


class PluginManager:
    """Every resource's server, kept serving and registered across kubelet restarts."""

    def __init__(
        self,
        resources: Sequence[str],
        plugin_dir: str | Path = DEFAULT_PLUGIN_DIR,
        kubelet_socket: str | Path | None = None,
        poll_interval_s: float = 0.1,
        register_timeout_s: float = 10.0,
        on_registered: Callable[[Registration], None] | None = None,
        chooser: Chooser | None = None,
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.kubelet_socket = (
            Path(kubelet_socket) if kubelet_socket else self.plugin_dir / KUBELET_SOCKET_NAME
        )
        self.servers = {r: PluginServer(r, self.plugin_dir, chooser=chooser) for r in resources}
        self.poll_interval_s = poll_interval_s
        self.register_timeout_s = register_timeout_s
        self._on_registered = on_registered
        self._kubelet_id: tuple[int, int, int] | None = None
        # the watcher must survive anything and keep recovering
        self._watcher = Repeating(
            "dp-watcher", poll_interval_s, self.check_once, log, "device plugin watcher"
        )

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        for server in self.servers.values():
            server.start()
        self._watcher.start()

    def stop(self) -> None:
        self._watcher.stop()
        for server in self.servers.values():
            server.stop(0)

    @property
    def registered(self) -> bool:
        """Whether every resource is registered with the kubelet that runs now: its socket
        is there, and each server serves and has registered since it (re)appeared."""
        return self._kubelet_id is not None and all(
            not s.needs_registration and s.socket_alive() for s in self.servers.values()
        )

    def update(self, units_by_resource: Mapping[str, ResourceUnits]) -> list[str]:
        """Install new snapshots; returns the resources whose snapshot changed."""
        changed = []
        for resource, units in units_by_resource.items():
            server = self.servers.get(resource)
            if server is not None and server.state.update(units):
                changed.append(resource)
        return changed

    # --- the watcher --------------------------------------------------------------------------

    def check_once(self) -> None:
        kubelet = _identity(self.kubelet_socket)
        if kubelet != self._kubelet_id:
            if kubelet is not None:
                log.info("kubelet socket %s (re)appeared; registering", self.kubelet_socket)
                for server in self.servers.values():
                    server.want_registration()
            self._kubelet_id = kubelet
        now = time.monotonic()
        for server in self.servers.values():
            if self._watcher.stopping:
                return
            if not server.socket_alive():
                log.warning(
                    "%s: socket %s is gone; serving again", server.resource, server.socket_path
                )
                server.restart()
                server.want_registration()
            if (
                kubelet is not None
                and server.needs_registration
                and not server.registering
                and now >= server.next_attempt
            ):
                server.registering = True
                threading.Thread(
                    target=self._register, args=(server,), name="dp-register", daemon=True
                ).start()

    def _register(self, server: PluginServer) -> None:
        generation = server.wanted
        try:
            server.register(self.kubelet_socket, self.register_timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            log.warning(
                "%s: registration failed (%s: %s); retrying in %.1fs",
                server.resource,
                code,
                detail,
                server.backoff,
            )
            server.next_attempt = time.monotonic() + server.backoff
            server.backoff = min(server.backoff * 2, PluginServer.BACKOFF_MAX_S)
        else:
            server.done = max(server.done, generation)
            server.backoff = PluginServer.BACKOFF_START_S
            server.registrations += 1
            server.last_registered = time.monotonic()
            log.info("%s: registered with the kubelet", server.resource)
            if self._on_registered is not None:
                self._on_registered(Registration(server.resource, server.last_registered))
        finally:
            server.registering = False
