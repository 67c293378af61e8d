"""The byte-stream interface that ttrpc endpoints run on.

A ttrpc endpoint needs only: read some bytes, write one whole frame, wait for the write
buffer to drain, close. A plain socket (AsyncioStream) and one connection of the NRI
multiplexer (nri_hook.mux.MuxConn) both provide it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final, Protocol

from tessera_ttrpc.frame import HEADER_LEN, MAX_DATA_LEN

READ_CHUNK: Final = 64 * 1024
MAX_WRITE_BUFFER: Final = 4 * (HEADER_LEN + MAX_DATA_LEN)
"""Bytes written but not yet taken by the peer before the stream is closed (16 MiB + 40).
A live peer reads what it asked for; one that stops reading while requests keep coming
would otherwise make every answer pile up in memory. Four of the largest frames leave
ample room for a burst of replies to a peer that is merely slow."""


def abort_if_unread(writer: asyncio.StreamWriter, pending: int, limit: int) -> bool:
    """Abort the connection when `pending` more bytes would leave over `limit` unsent: the
    peer has stopped reading. True when it did. (A graceful close would wait for the peer
    to read.)"""
    if writer.transport.get_write_buffer_size() + pending <= limit:
        return False
    writer.transport.abort()
    return True


class ByteStream(Protocol):
    async def read(self) -> bytes:
        """The next bytes from the peer; b"" once the stream has ended."""
        ...

    def write(self, data: bytes) -> None:
        """Queue `data` (one or more whole frames) to be sent, never interleaved with
        another write. Raises ConnectionError when the stream is closed."""
        ...

    async def drain(self) -> None:
        """Wait until the write buffer is below its high-water mark."""
        ...

    def close(self) -> None: ...


class AsyncioStream:
    """ByteStream over an asyncio StreamReader/StreamWriter pair (e.g. a unix socket)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        max_write_buffer: int = MAX_WRITE_BUFFER,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._max_write_buffer = max_write_buffer

    async def read(self) -> bytes:
        try:
            return await self._reader.read(READ_CHUNK)
        except (ConnectionError, OSError):
            return b""

    def write(self, data: bytes) -> None:
        if self._writer.is_closing():
            raise ConnectionResetError("stream is closed")
        if abort_if_unread(self._writer, len(data), self._max_write_buffer):
            raise ConnectionResetError(
                f"peer is not reading: over {self._max_write_buffer} bytes unsent; closed"
            )
        self._writer.write(data)

    async def drain(self) -> None:
        await self._writer.drain()

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop may already be closed
            self._writer.close()
