"""NRI's connection multiplexer: several byte streams over one unix-socket trunk.

Wire format (containerd/nri pkg/net/multiplex): each frame is `conn id(u32 BE) |
payload length(u32 BE) | payload`. There is no signalling: both ends simply use the same
IDs (1: the Plugin service, where the runtime is the ttrpc client; 2: the Runtime
service, where the plugin is the client). Frames for an ID nobody opened are dropped.

Rules this implementation keeps:
- Writes are whole frames and one `write()` is never interleaved with another.
- The frame-size rule that Go's reader needs: the Go side reads a connection through a
  4096-byte buffer and fails (ENOMEM) on a frame that does not fit, so a write of more
  than 4096 bytes goes out as the first 4096 bytes, then the rest (split again only at
  the 4 MiB + 10 payload limit). This is exactly how containerd itself sends (see the
  captures in tests/vectors/nri-wire).
- Receiving, a connection is a byte stream: messages may span frames and are reassembled
  by the reader on top (ttrpc's FrameDecoder).
- Zero-length frames carry nothing and are skipped; frames for an ID nobody opened
  (0 included) are dropped.
- Each connection queues at most 256 frames and MAX_QUEUED_BYTES unread bytes; an
  overflow closes the whole trunk, as upstream does for frames. A declared payload over
  the limit is a protocol error and closes it too. The runtime reconnects a closed trunk.
- A peer that stops reading: once MAX_WRITE_BUFFER bytes wait unsent, the trunk closes.
- The decoder never holds more than one frame (header + MAX_PAYLOAD) of a connection
  that is being reassembled, and nothing once the trunk ends mid-frame.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import struct
from dataclasses import dataclass
from typing import Final

from tessera.errors import TesseraError
from tessera_ttrpc.stream import MAX_WRITE_BUFFER, READ_CHUNK, abort_if_unread

log = logging.getLogger(__name__)

HEADER_LEN: Final = 8
MAX_PAYLOAD: Final = (4 << 20) + 10
"""Largest payload of one mux frame: a whole ttrpc frame (10-byte header + 4 MiB)."""
GO_READ_BUFFER: Final = 4096
"""Frames sent to a Go peer must fit in its 4096-byte read buffer (see module doc)."""
QUEUE_LEN: Final = 256
"""Frames a connection may hold unread before the trunk is closed (upstream's value)."""
MAX_QUEUED_BYTES: Final = 2 * MAX_PAYLOAD
"""Payload bytes a connection may hold unread before the trunk is closed. The reader on
top (ttrpc) takes frames as fast as they come; the most a live peer leaves waiting is a
whole largest message (it arrives as 4096 bytes plus the rest) and the start of the next."""

RESERVED_CONN: Final = 0
PLUGIN_SERVICE_CONN: Final = 1
RUNTIME_SERVICE_CONN: Final = 2

_HEADER: Final = struct.Struct(">II")


class MuxError(TesseraError, ConnectionError):
    """The trunk broke the protocol or overflowed a queue; the mux is closed."""


@dataclass(frozen=True, slots=True)
class MuxLimits:
    """What a mux lets wait before it closes the trunk, and how it cuts writes (tests
    shrink them)."""

    queue_len: int = QUEUE_LEN
    """Frames one connection may hold unread."""
    max_queued_bytes: int = MAX_QUEUED_BYTES
    """Payload bytes one connection may hold unread."""
    max_write_buffer: int = MAX_WRITE_BUFFER
    """Bytes that may wait unsent for a peer that stops reading."""
    first_frame_limit: int = GO_READ_BUFFER
    """Bytes of a write's first frame (the Go peer's read buffer)."""


_LIMITS: Final = MuxLimits()


def split_payload(
    data: bytes, first: int = GO_READ_BUFFER, limit: int = MAX_PAYLOAD
) -> list[bytes]:
    """How one write is cut into frame payloads (see module doc for the rule)."""
    if len(data) <= first:
        return [data]
    parts = [data[:first]]
    rest = data[first:]
    while len(rest) > limit:
        parts.append(rest[:limit])
        rest = rest[limit:]
    parts.append(rest)
    return parts


def encode_frames(conn_id: int, data: bytes, first: int = GO_READ_BUFFER) -> bytes:
    """The bytes on the trunk for one write of `data` on `conn_id`."""
    return b"".join(_HEADER.pack(conn_id, len(part)) + part for part in split_payload(data, first))


class MuxDecoder:
    """Turns trunk bytes, fed in arbitrary pieces, into (conn id, payload) frames."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buf
        buf += data
        out: list[tuple[int, bytes]] = []
        pos = 0
        end = len(buf)
        while end - pos >= HEADER_LEN:
            conn_id, length = _HEADER.unpack_from(buf, pos)
            if length > MAX_PAYLOAD:
                raise MuxError(
                    f"mux frame for connection {conn_id} declares {length} bytes, "
                    f"over the {MAX_PAYLOAD}-byte limit"
                )
            if end - pos - HEADER_LEN < length:
                break
            start = pos + HEADER_LEN
            out.append((conn_id, bytes(buf[start : start + length])))
            pos = start + length
        if pos:
            del buf[:pos]
        return out


class Mux:
    """A multiplexer over one stream connection. Create it inside a running loop."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        limits: MuxLimits = _LIMITS,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.limits = limits
        self._conns: dict[int, MuxConn] = {}
        self._error: Exception | None = None
        self._closed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @property
    def error(self) -> Exception | None:
        """Why the mux closed, when it was not a plain end of stream."""
        return self._error

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def open(self, conn_id: int) -> MuxConn:
        if conn_id == RESERVED_CONN:
            raise ValueError("mux connection ID 0 is reserved")
        if self._closed.is_set():
            raise MuxError("mux is closed")
        conn = self._conns.get(conn_id)
        if conn is None:
            conn = MuxConn(self, conn_id)
            self._conns[conn_id] = conn
        return conn

    async def wait_closed(self) -> None:
        await self._closed.wait()

    def close(self, error: Exception | None = None) -> None:
        if self._closed.is_set():
            return
        if error is not None and self._error is None:
            self._error = error
        self._closed.set()
        for conn in list(self._conns.values()):
            conn._end()
        self._conns.clear()
        with contextlib.suppress(RuntimeError):
            self._writer.close()
        if asyncio.current_task() is not self._task:
            self._task.cancel()

    def _forget(self, conn: MuxConn) -> None:
        if self._conns.get(conn.conn_id) is conn:
            del self._conns[conn.conn_id]

    def _write(self, conn_id: int, data: bytes) -> None:
        if self._closed.is_set() or self._writer.is_closing():
            raise ConnectionResetError("mux is closed")
        limits = self.limits
        frames = encode_frames(conn_id, data, limits.first_frame_limit)
        if abort_if_unread(self._writer, len(frames), limits.max_write_buffer):
            error = MuxError(
                f"the peer is not reading: over {limits.max_write_buffer} bytes unsent; "
                "closing the trunk"
            )
            log.warning("%s", error)
            self.close(error)
            raise ConnectionResetError(str(error))
        self._writer.write(frames)

    async def _drain(self) -> None:
        if self._closed.is_set():
            raise ConnectionResetError("mux is closed")
        await self._writer.drain()

    async def _read_loop(self) -> None:
        decoder = MuxDecoder()
        try:
            while True:
                chunk = await self._reader.read(READ_CHUNK)
                if not chunk:
                    break
                for conn_id, payload in decoder.feed(chunk):
                    if not payload:
                        continue  # carries nothing; b"" from MuxConn.read means end of stream
                    conn = self._conns.get(conn_id)
                    if conn is None:
                        log.debug("mux frame for unopened connection %d dropped", conn_id)
                        continue
                    if not conn._deliver(payload):
                        raise MuxError(
                            f"mux connection {conn_id} has {len(conn._queue)} unread frames "
                            f"({conn._queued_bytes} bytes); closing the trunk"
                        )
        except MuxError as exc:
            log.warning("%s", exc)
            self.close(exc)
        except (ConnectionError, OSError) as exc:
            self.close(exc)
        except asyncio.CancelledError:
            self.close()
            raise
        else:
            self.close()


class MuxConn:
    """One multiplexed connection; a ttrpc ByteStream."""

    def __init__(self, mux: Mux, conn_id: int) -> None:
        self._mux = mux
        self.conn_id = conn_id
        self._queue: collections.deque[bytes] = collections.deque()
        self._queued_bytes = 0
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False

    def _deliver(self, payload: bytes) -> bool:
        limits = self._mux.limits
        if (
            len(self._queue) >= limits.queue_len
            or self._queued_bytes + len(payload) > limits.max_queued_bytes
        ):
            return False
        self._queue.append(payload)
        self._queued_bytes += len(payload)
        self._wake()
        return True

    def _end(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read(self) -> bytes:
        """The next frame's payload; b"" once the connection or the mux has ended."""
        while not self._queue:
            if self._ended:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        payload = self._queue.popleft()
        self._queued_bytes -= len(payload)
        return payload

    def write(self, data: bytes) -> None:
        if self._ended:
            raise ConnectionResetError(f"mux connection {self.conn_id} is closed")
        self._mux._write(self.conn_id, data)

    async def drain(self) -> None:
        await self._mux._drain()

    def close(self) -> None:
        """Detach this ID; later frames for it are dropped. The trunk stays open."""
        self._mux._forget(self)
        self._end()
