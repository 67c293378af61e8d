"""A kubelet simulator for device plugin tests: the kubelet's side of the v1beta1 API over
real unix sockets, written from the kubelet's device plugin API v1beta1 independently of
the plugin's code.

What it does, as the kubelet does:
- serves `v1beta1.Registration/Register` on `<dir>/kubelet.sock`; inside the handler it checks
  the version and the resource name, dials the plugin's socket (`<dir>/<endpoint>`), calls
  GetDevicePluginOptions, and only then answers (so a plugin that is not yet serving fails
  to register); a newer registration of the same resource replaces the old endpoint;
- reads each plugin's ListAndWatch stream in a thread and keeps every snapshot;
- calls GetPreferredAllocation, Allocate and PreStartContainer like admission does (one
  container per call), also with raw request bytes (for captured vectors);
- `restart()` plays a kubelet restart: its server stops, every socket in the directory except
  the checkpoint file is deleted, and kubelet.sock is created again.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from protos.kubelet.deviceplugin.v1beta1 import api_pb2 as pb
from protos.kubelet.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

CHECKPOINT = "kubelet_internal_checkpoint"

# typed handles on the untyped generated gRPC module
_plugin_stub: Callable[[grpc.Channel], Any] = pb_grpc.DevicePluginStub
_add_registration: Callable[[pb_grpc.RegistrationServicer, grpc.Server], None] = (
    pb_grpc.add_RegistrationServicer_to_server
)
SERVICE = "/v1beta1.DevicePlugin/"

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def kubelet_accepts(resource: str) -> bool:
    """The kubelet's IsExtendedResourceName rule."""
    if "/" not in resource or "kubernetes.io/" in resource or resource.startswith("requests."):
        return False
    qualified = "requests." + resource
    if qualified.count("/") != 1:
        return False
    prefix, name = qualified.split("/")
    return (
        len(prefix) <= 253
        and bool(_SUBDOMAIN.match(prefix))
        and 0 < len(name) <= 63
        and bool(_NAME.match(name))
    )


class PluginEndpoint:
    """One registered plugin as the kubelet sees it."""

    def __init__(self, resource: str, socket: Path, channel: grpc.Channel) -> None:
        self.resource = resource
        self.socket = socket
        self.channel = channel
        self.stub: Any = _plugin_stub(channel)
        self.options: pb.DevicePluginOptions | None = None
        self.snapshots: list[pb.ListAndWatchResponse] = []
        self.stream_open = False
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None
        self._closed = False

    def start_reading(self) -> None:
        self.stream_open = True
        self._reader = threading.Thread(target=self._read, name="kubelet-law", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for message in self.stub.ListAndWatch(pb.Empty()):
                with self._cond:
                    self.snapshots.append(message)
                    self._cond.notify_all()
        except grpc.RpcError:
            pass
        except ValueError:
            # grpc raises ValueError for a call on a closed channel: the endpoint was replaced
            # or stopped before this thread opened its stream, as a kubelet drops a plugin
            if not self._closed:
                raise
        finally:
            with self._cond:
                self.stream_open = False
                self._cond.notify_all()

    def close(self) -> None:
        self._closed = True
        self.channel.close()
        if self._reader is not None:
            self._reader.join(5)

    def latest(self) -> pb.ListAndWatchResponse | None:
        with self._cond:
            return self.snapshots[-1] if self.snapshots else None

    def wait_for(
        self,
        predicate: Callable[[pb.ListAndWatchResponse], bool],
        timeout_s: float = 10.0,
        after: pb.ListAndWatchResponse | None = None,
    ) -> pb.ListAndWatchResponse:
        """The first snapshot that satisfies `predicate`, looking at every snapshot received
        (or only those received after `after`); TimeoutError if none comes."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            seen = 0
            if after is not None:
                seen = next(i for i, m in enumerate(self.snapshots) if m is after) + 1
            while True:
                for message in self.snapshots[seen:]:
                    if predicate(message):
                        return message
                seen = len(self.snapshots)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.resource}: no matching ListAndWatch snapshot")
                self._cond.wait(left)

    def call_raw(self, method: str, request: bytes, timeout_s: float = 10.0) -> bytes:
        """Send serialized request bytes to a DevicePlugin method; the response bytes."""
        call = self.channel.unary_unary(
            SERVICE + method, request_serializer=None, response_deserializer=None
        )
        response: bytes = call(request, timeout=timeout_s)
        return response


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletSimulator) -> None:
        self.kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        kubelet = self.kubelet
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.UNKNOWN, f"unsupported version {request.version!r}")
        if not kubelet_accepts(request.resource_name):
            context.abort(
                grpc.StatusCode.UNKNOWN, f'the ResourceName "{request.resource_name}" is invalid'
            )
        if not request.endpoint or "/" in request.endpoint:
            context.abort(grpc.StatusCode.UNKNOWN, f"bad endpoint {request.endpoint!r}")
        socket = kubelet.plugin_dir / request.endpoint
        channel = grpc.insecure_channel(f"unix://{socket}")
        try:
            grpc.channel_ready_future(channel).result(timeout=kubelet.dial_timeout_s)
        except grpc.FutureTimeoutError:
            channel.close()
            context.abort(grpc.StatusCode.UNKNOWN, f"cannot dial the plugin at {socket}")
        endpoint = PluginEndpoint(request.resource_name, socket, channel)
        try:
            endpoint.options = endpoint.stub.GetDevicePluginOptions(pb.Empty())
        except grpc.RpcError as exc:
            channel.close()
            context.abort(grpc.StatusCode.UNKNOWN, f"GetDevicePluginOptions failed: {exc}")
        kubelet._add(endpoint, request)
        return pb.Empty()


class KubeletSimulator:
    def __init__(self, plugin_dir: str | Path, dial_timeout_s: float = 10.0) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.socket_path = self.plugin_dir / "kubelet.sock"
        self.dial_timeout_s = dial_timeout_s
        self.endpoints: dict[str, PluginEndpoint] = {}
        self.requests: list[pb.RegisterRequest] = []
        self.registrations: list[tuple[float, str]] = []
        """(time.monotonic(), resource) of every accepted registration."""
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        checkpoint = self.plugin_dir / CHECKPOINT
        if not checkpoint.exists():
            checkpoint.write_text("{}")
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        _add_registration(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait(5)
            self._server = None
        with self._cond:
            endpoints = list(self.endpoints.values())
            self.endpoints.clear()
        for endpoint in endpoints:
            endpoint.close()

    def restart(self) -> float:
        """Stop, wipe every socket but the checkpoint, start again; returns when it started."""
        self.stop()
        for entry in self.plugin_dir.iterdir():
            if entry.name != CHECKPOINT and entry.is_socket():
                entry.unlink()
        self.start()
        return time.monotonic()

    def __enter__(self) -> KubeletSimulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- registration -----------------------------------------------------------------------

    def _add(self, endpoint: PluginEndpoint, request: pb.RegisterRequest) -> None:
        with self._cond:
            old = self.endpoints.get(endpoint.resource)
            self.endpoints[endpoint.resource] = endpoint
            self.requests.append(request)
            self.registrations.append((time.monotonic(), endpoint.resource))
            self._cond.notify_all()
        if old is not None:
            old.close()
        endpoint.start_reading()

    def wait_registered(
        self, resources: Iterable[str], timeout_s: float = 10.0, since: float = 0.0
    ) -> dict[str, float]:
        """Wait until every resource registered after `since`; their registration times."""
        wanted = set(resources)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                done = {r: t for t, r in self.registrations if r in wanted and t >= since}
                if set(done) == wanted:
                    return done
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = ", ".join(sorted(wanted - set(done)))
                    raise TimeoutError(f"not registered: {missing}")
                self._cond.wait(left)

    def endpoint(self, resource: str) -> PluginEndpoint:
        with self._cond:
            return self.endpoints[resource]

    # --- admission --------------------------------------------------------------------------

    def get_preferred_allocation(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        request = pb.PreferredAllocationRequest()
        request.container_requests.add(
            available_deviceIDs=available,
            must_include_deviceIDs=must_include,
            allocation_size=size,
        )
        response = self.endpoint(resource).stub.GetPreferredAllocation(request, timeout=10)
        return list(response.container_responses[0].deviceIDs)

    def allocate(self, resource: str, ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        request = pb.AllocateRequest()
        request.container_requests.add(devices_ids=ids)
        response = self.endpoint(resource).stub.Allocate(request, timeout=10)
        if not response.container_responses:
            raise ValueError("the plugin answered Allocate with no container response")
        result: pb.ContainerAllocateResponse = response.container_responses[0]
        return result

    def pre_start_container(self, resource: str, ids: Sequence[str]) -> None:
        self.endpoint(resource).stub.PreStartContainer(
            pb.PreStartContainerRequest(devices_ids=ids), timeout=30
        )


CHECKOUT = Path(__file__).resolve().parents[1]


def fake_agent_command(
    plugin_dir: Path | str, topology: str, *flags: str
) -> tuple[list[str], dict[str, str]]:
    """argv and environment to run the real node agent as its own process, on the fake backend
    (a topology file or built-in name), serving in `plugin_dir`: this checkout's code first."""
    argv = [sys.executable, "-m", "deviceplugin.cli", "--backend", "fake", "--topology", topology]
    argv += ["--device-plugin-dir", str(plugin_dir), *flags]
    return argv, dict(os.environ, PYTHONPATH=str(CHECKOUT))
