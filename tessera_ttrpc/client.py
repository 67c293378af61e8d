"""The client role: unary ttrpc calls over one connection, any number in flight.

Stream IDs are odd, start at 1 and grow by 2; responses are routed to their call by
stream ID, so they may arrive in any order. A non-OK status raises RpcError. When the
connection ends, every pending call fails with ConnectionClosedError.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from protos.ttrpc import ttrpc_pb2
from tessera_ttrpc.frame import FrameDecoder, MessageType, OversizedFrame, encode_frame
from tessera_ttrpc.status import Code, ConnectionClosedError, RpcError
from tessera_ttrpc.stream import ByteStream

log = logging.getLogger(__name__)

MAX_STREAM_ID = 0xFFFFFFFF

Resp = TypeVar("Resp", bound=Message)


class Client:
    """Must be created inside a running event loop; it starts its own reader task."""

    def __init__(self, stream: ByteStream) -> None:
        self._stream = stream
        self._next_id = 1
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._closed_reason: str | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read_loop())

    @property
    def closed(self) -> bool:
        return self._closed_reason is not None

    async def wait_closed(self) -> None:
        """Return once the connection has ended."""
        await asyncio.shield(self._reader)

    async def call(
        self,
        service: str,
        method: str,
        payload: bytes,
        *,
        timeout: float | None = None,
        metadata: Iterable[tuple[str, str]] = (),
    ) -> bytes:
        """Send one request and wait for its response payload."""
        if self._closed_reason is not None:
            raise ConnectionClosedError(self._closed_reason)
        stream_id = self._next_id
        if stream_id > MAX_STREAM_ID:
            raise ConnectionClosedError("stream IDs exhausted on this connection")
        self._next_id += 2
        request = ttrpc_pb2.Request(
            service=service,
            method=method,
            payload=payload,
            timeout_nano=int(timeout * 1e9) if timeout else 0,
            metadata=[ttrpc_pb2.KeyValue(key=k, value=v) for k, v in metadata],
        )
        frame = encode_frame(stream_id, MessageType.REQUEST, 0, request.SerializeToString())
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = future
        try:
            try:
                self._stream.write(frame)
                await self._stream.drain()
            except ConnectionError as exc:
                raise ConnectionClosedError(f"cannot send {method}: {exc}") from None
            if timeout is None:
                return await future
            try:
                async with asyncio.timeout(timeout):
                    return await future
            except TimeoutError:
                raise RpcError(
                    Code.DEADLINE_EXCEEDED, f"{service}/{method}: no response in {timeout:g}s"
                ) from None
        finally:
            self._pending.pop(stream_id, None)

    async def call_message(
        self,
        service: str,
        method: str,
        request: Message,
        response_type: type[Resp],
        *,
        timeout: float | None = None,
        metadata: Iterable[tuple[str, str]] = (),
    ) -> Resp:
        payload = await self.call(
            service, method, request.SerializeToString(), timeout=timeout, metadata=metadata
        )
        try:
            return response_type.FromString(payload)
        except DecodeError as exc:
            raise RpcError(
                Code.INTERNAL, f"cannot decode {response_type.__name__} from {method}: {exc}"
            ) from None

    def close(self) -> None:
        self._stream.close()
        self._reader.cancel()
        self._fail_all("ttrpc client closed")

    async def _read_loop(self) -> None:
        decoder = FrameDecoder()
        reason = "connection closed by peer"
        try:
            while True:
                chunk = await self._stream.read()
                if not chunk:
                    break
                for frame in decoder.feed(chunk):
                    if isinstance(frame, OversizedFrame):
                        self._resolve_error(
                            frame.stream_id,
                            RpcError(
                                Code.RESOURCE_EXHAUSTED,
                                f"response of {frame.length} bytes exceeds the limit",
                            ),
                        )
                    elif frame.type == MessageType.RESPONSE:
                        self._on_response(frame.stream_id, frame.data)
                    # Data frames (streaming) and unknown types are not used by unary calls.
        except asyncio.CancelledError:
            reason = "ttrpc client closed"
            raise
        finally:
            self._fail_all(reason)

    def _on_response(self, stream_id: int, data: bytes) -> None:
        future = self._pending.get(stream_id)
        if future is None or future.done():
            log.debug("ttrpc response for unknown stream %d dropped", stream_id)
            return
        try:
            response = ttrpc_pb2.Response.FromString(data)
        except DecodeError as exc:
            future.set_exception(RpcError(Code.INTERNAL, f"undecodable response: {exc}"))
            return
        if response.HasField("status") and response.status.code != Code.OK:
            future.set_exception(RpcError.from_status(response.status))
        else:
            future.set_result(response.payload)

    def _resolve_error(self, stream_id: int, error: RpcError) -> None:
        future = self._pending.get(stream_id)
        if future is not None and not future.done():
            future.set_exception(error)

    def _fail_all(self, reason: str) -> None:
        if self._closed_reason is None:
            self._closed_reason = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionClosedError(self._closed_reason))
