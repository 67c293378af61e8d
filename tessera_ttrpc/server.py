"""The server role: answer unary ttrpc calls arriving on one connection.

Behaviour mirrors the Go server (containerd/ttrpc) where a peer can observe it:
- client stream IDs must be odd and strictly increasing, else INVALID_ARGUMENT on that ID;
- an undecodable Request envelope gives INVALID_ARGUMENT, an unknown service or method
  UNIMPLEMENTED ("service X" / "method X"); an undecodable request payload gives
  INVALID_ARGUMENT through `unary` (Go says INTERNAL; no runtime tells them apart, and
  bytes the caller got wrong are the caller's fault, not the server's);
- an oversized frame is skipped and answered with RESOURCE_EXHAUSTED; the connection lives;
- Data frames get INVALID_ARGUMENT (this implementation serves unary calls only) and
  unknown frame types are ignored;
- handlers run concurrently, so responses may leave in a different order than requests;
- a request's timeout_nano bounds its handler (DEADLINE_EXCEEDED when it runs over).

Limits (`Limits`, each a named constant below): requests handled at once and the request
bytes they hold, metadata entries and bytes per request. A request over a limit is
answered RESOURCE_EXHAUSTED on its own stream and the connection carries on; frames over
4 MiB are skipped by the frame reader, never buffered (tessera_ttrpc.frame).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

from google.protobuf.message import DecodeError, Message

from protos.ttrpc import ttrpc_pb2
from tessera_ttrpc.budget import MAX_DECODED_ITEMS, within_budget
from tessera_ttrpc.frame import (
    FrameDecoder,
    FrameTooLargeError,
    MessageType,
    OversizedFrame,
    encode_frame,
)
from tessera_ttrpc.status import Code, RpcError
from tessera_ttrpc.stream import ByteStream

log = logging.getLogger(__name__)

MAX_IN_FLIGHT: Final = 64
"""Requests one connection may have being handled at once. Go's ttrpc client sends calls
concurrently, but a runtime calls a plugin about one container or pod event at a time (a
few at once on a busy node); 64 is far above that and bounds the handler tasks a peer can
pile up."""
MAX_IN_FLIGHT_BYTES: Final = 32 << 20
"""Request payload bytes held by the requests being handled on one connection: eight of
the largest (4 MiB) messages, so a full-size Synchronize chunk always fits while a peer
cannot pin more than this (plus the decoded messages) in memory."""
MAX_METADATA_ENTRIES: Final = 64
"""Metadata pairs in one Request envelope. containerd sends one
(containerd-namespace-ttrpc); 64 leaves room for tracing and other callers."""
MAX_METADATA_BYTES: Final = 64 << 10
"""Bytes of all metadata keys and values of one Request (the same order of size as
gRPC's 8 KiB default header list limit, with room to spare)."""
MAX_NAME_IN_ERROR: Final = 200
"""Characters of a peer-chosen service or method name quoted back in an error status."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one connection may ask of a Server (see the constants for the reasons)."""

    max_in_flight: int = MAX_IN_FLIGHT
    max_in_flight_bytes: int = MAX_IN_FLIGHT_BYTES
    max_metadata_entries: int = MAX_METADATA_ENTRIES
    max_metadata_bytes: int = MAX_METADATA_BYTES


@dataclass(frozen=True, slots=True)
class CallContext:
    service: str
    method: str
    stream_id: int
    metadata: tuple[tuple[str, str], ...]
    timeout: float | None
    """Seconds the caller allows (from timeout_nano), None without a deadline."""


Handler = Callable[[bytes, CallContext], Awaitable[bytes]]
"""A method: serialized request in, serialized response out; raise RpcError to fail."""

Req = TypeVar("Req", bound=Message)


def unary(
    request_type: type[Req],
    handler: Callable[[Req, CallContext], Awaitable[Message]],
    method: str = "",
) -> Handler:
    """Wrap a handler that works on protobuf messages into a byte-level Handler. Bytes that
    are not a `request_type` are the caller's fault: INVALID_ARGUMENT (prefixed `method: `
    when one is named)."""
    prefix = f"{method}: " if method else ""

    async def call(payload: bytes, ctx: CallContext) -> bytes:
        if not within_budget(payload, request_type.DESCRIPTOR):
            raise RpcError(Code.RESOURCE_EXHAUSTED, prefix + _over_budget(request_type.__name__))
        try:
            request = request_type.FromString(payload)
        except (DecodeError, RecursionError) as exc:
            raise RpcError(
                Code.INVALID_ARGUMENT, f"{prefix}cannot decode {request_type.__name__}: {exc}"
            ) from None
        response = await handler(request, ctx)
        return response.SerializeToString()

    return call


class Server:
    """Services by fully-qualified name; `serve` runs one connection."""

    def __init__(self, limits: Limits | None = None) -> None:
        self._services: dict[str, dict[str, Handler]] = {}
        self.limits = limits or Limits()

    def register(self, service: str, methods: Mapping[str, Handler]) -> None:
        if service in self._services:
            raise ValueError(f"service {service} is already registered")
        self._services[service] = dict(methods)

    async def serve(self, stream: ByteStream) -> None:
        """Answer calls until the peer closes the stream (or the task is cancelled), then
        close it: the server owns the connection it serves, as Go's ttrpc server does."""
        try:
            await _Connection(self._services, stream, self.limits).run()
        finally:
            stream.close()


def _over_budget(what: str) -> str:
    return f"{what} would decode into over {MAX_DECODED_ITEMS} nested messages and list elements"


def _clip(name: str) -> str:
    return name if len(name) <= MAX_NAME_IN_ERROR else name[:MAX_NAME_IN_ERROR] + "..."


class _Connection:
    def __init__(
        self, services: Mapping[str, Mapping[str, Handler]], stream: ByteStream, limits: Limits
    ) -> None:
        self._services = services
        self._stream = stream
        self._limits = limits
        self._last_stream_id = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight_bytes = 0
        self._closed = False

    async def run(self) -> None:
        decoder = FrameDecoder()
        try:
            while True:
                chunk = await self._stream.read()
                if not chunk or self._closed:
                    return
                for frame in decoder.feed(chunk):
                    if isinstance(frame, OversizedFrame):
                        self._send_status(
                            frame.stream_id,
                            Code.RESOURCE_EXHAUSTED,
                            f"message length {frame.length} exceeds maximum message size",
                        )
                        continue
                    if frame.stream_id % 2 != 1:
                        self._send_status(
                            frame.stream_id,
                            Code.INVALID_ARGUMENT,
                            "StreamID must be odd for client initiated streams",
                        )
                        continue
                    if frame.type == MessageType.REQUEST:
                        self._on_request(frame.stream_id, frame.data)
                    elif frame.type == MessageType.DATA:
                        self._send_status(
                            frame.stream_id, Code.INVALID_ARGUMENT, "StreamID is no longer active"
                        )
                    # any other type is ignored, for compatibility with future versions
        finally:
            self._closed = True
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)

    def _on_request(self, stream_id: int, data: bytes) -> None:
        if stream_id <= self._last_stream_id:
            self._send_status(
                stream_id, Code.INVALID_ARGUMENT, "StreamID cannot be re-used and must increment"
            )
            return
        self._last_stream_id = stream_id
        if not within_budget(data, ttrpc_pb2.Request.DESCRIPTOR):
            self._send_status(stream_id, Code.RESOURCE_EXHAUSTED, _over_budget("Request"))
            return
        try:
            request = ttrpc_pb2.Request.FromString(data)
        except DecodeError as exc:
            self._send_status(stream_id, Code.INVALID_ARGUMENT, f"unmarshal request error: {exc}")
            return
        methods = self._services.get(request.service)
        if methods is None:
            self._send_status(stream_id, Code.UNIMPLEMENTED, f"service {_clip(request.service)}")
            return
        handler = methods.get(request.method)
        if handler is None:
            self._send_status(stream_id, Code.UNIMPLEMENTED, f"method {_clip(request.method)}")
            return
        limits = self._limits
        refusal = ""
        meta_bytes = sum(len(kv.key) + len(kv.value) for kv in request.metadata)
        if len(request.metadata) > limits.max_metadata_entries:
            refusal = (
                f"{len(request.metadata)} metadata entries, over {limits.max_metadata_entries}"
            )
        elif meta_bytes > limits.max_metadata_bytes:
            refusal = f"{meta_bytes} bytes of metadata, over {limits.max_metadata_bytes}"
        elif len(self._tasks) >= limits.max_in_flight:
            refusal = f"{len(self._tasks)} requests already in progress on this connection"
        elif self._in_flight_bytes + len(request.payload) > limits.max_in_flight_bytes:
            refusal = (
                f"{self._in_flight_bytes} request bytes already in progress on this "
                f"connection; {len(request.payload)} more would exceed "
                f"{limits.max_in_flight_bytes}"
            )
        if refusal:
            self._send_status(stream_id, Code.RESOURCE_EXHAUSTED, f"{request.method}: {refusal}")
            return
        ctx = CallContext(
            service=request.service,
            method=request.method,
            stream_id=stream_id,
            metadata=tuple((kv.key, kv.value) for kv in request.metadata),
            timeout=request.timeout_nano / 1e9 if request.timeout_nano > 0 else None,
        )
        size = len(request.payload)
        self._in_flight_bytes += size
        task = asyncio.get_running_loop().create_task(self._handle(handler, request.payload, ctx))
        self._tasks.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            self._in_flight_bytes -= size

        task.add_done_callback(done)

    async def _handle(self, handler: Handler, payload: bytes, ctx: CallContext) -> None:
        try:
            if ctx.timeout is None:
                result = await handler(payload, ctx)
            else:
                async with asyncio.timeout(ctx.timeout):
                    result = await handler(payload, ctx)
        except RpcError as exc:
            self._send_status(ctx.stream_id, exc.code, exc.message)
            return
        except TimeoutError:
            self._send_status(
                ctx.stream_id, Code.DEADLINE_EXCEEDED, f"{ctx.method}: deadline exceeded"
            )
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("ttrpc handler %s/%s failed", ctx.service, ctx.method)
            self._send_status(ctx.stream_id, Code.UNKNOWN, f"{type(exc).__name__}: {exc}")
            return
        # An OK response carries no status; with an empty payload the body is 0 bytes.
        self._send(ctx.stream_id, ttrpc_pb2.Response(payload=result).SerializeToString())
        await self._drain()

    def _send_status(self, stream_id: int, code: int, message: str) -> None:
        status = ttrpc_pb2.Status(code=int(code), message=message)
        self._send(stream_id, ttrpc_pb2.Response(status=status).SerializeToString())

    def _send(self, stream_id: int, body: bytes) -> None:
        if self._closed:
            return
        try:
            frame = encode_frame(stream_id, MessageType.RESPONSE, 0, body)
        except FrameTooLargeError as exc:
            status = ttrpc_pb2.Status(code=Code.RESOURCE_EXHAUSTED, message=str(exc))
            body = ttrpc_pb2.Response(status=status).SerializeToString()
            frame = encode_frame(stream_id, MessageType.RESPONSE, 0, body)
        try:
            self._stream.write(frame)
        except ConnectionError:
            self._closed = True

    async def _drain(self) -> None:
        try:
            await self._stream.drain()
        except ConnectionError:
            self._closed = True
