"""The byte-stream interface that ttrpc endpoints run on.

A ttrpc endpoint needs only: read some bytes, write one whole frame, wait for the write
buffer to drain, close. A plain socket (AsyncioStream) and one connection of the NRI
multiplexer (nri_hook.mux.MuxConn) both provide it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

READ_CHUNK = 64 * 1024


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

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self) -> bytes:
        try:
            return await self._reader.read(READ_CHUNK)
        except (ConnectionError, OSError):
            return b""

    def write(self, data: bytes) -> None:
        if self._writer.is_closing():
            raise ConnectionResetError("stream is closed")
        self._writer.write(data)

    async def drain(self) -> None:
        await self._writer.drain()

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop may already be closed
            self._writer.close()
