"""ttrpc framing: the 10-byte header, the 4 MiB limit and an incremental frame reader.

A frame is `length(u32 BE) | stream id(u32 BE) | type(u8) | flags(u8) | data`. The length
counts the data only. A frame whose declared length is over the limit is never buffered:
the reader skips its bytes and reports it as an `OversizedFrame`, so that a server can
answer RESOURCE_EXHAUSTED on that stream and carry on, as the Go implementation does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from tessera_ttrpc.errors import TtrpcError

HEADER_LEN: Final = 10
MAX_DATA_LEN: Final = 4 << 20
"""Largest data length a frame may declare (4 MiB); larger frames are rejected."""

_HEADER: Final = struct.Struct(">IIBB")


class MessageType(IntEnum):
    REQUEST = 0x01
    RESPONSE = 0x02
    DATA = 0x03


FLAG_REMOTE_CLOSED: Final = 0x01
"""Request/Data: the sender will send no more data on this stream."""
FLAG_REMOTE_OPEN: Final = 0x02
"""Request: the sender will stream data after the request (0 on both means unary)."""
FLAG_NO_DATA: Final = 0x04
"""Data: the frame carries no data."""


class FrameTooLargeError(TtrpcError, ValueError):
    """Raised when asked to send more than MAX_DATA_LEN bytes in one frame."""

    def __init__(self, length: int) -> None:
        self.length = length
        super().__init__(f"message of {length} bytes exceeds the {MAX_DATA_LEN}-byte ttrpc limit")


@dataclass(frozen=True, slots=True)
class Frame:
    stream_id: int
    type: int
    """A MessageType value, or any other byte the peer sent (unknown types are kept)."""
    flags: int
    data: bytes


@dataclass(frozen=True, slots=True)
class OversizedFrame:
    """A frame whose declared length exceeded MAX_DATA_LEN; its data was skipped."""

    stream_id: int
    type: int
    flags: int
    length: int


def encode_header(length: int, stream_id: int, msg_type: int, flags: int = 0) -> bytes:
    return _HEADER.pack(length, stream_id, msg_type, flags)


def decode_header(header: bytes) -> tuple[int, int, int, int]:
    """(length, stream id, type, flags) of a 10-byte header."""
    length, stream_id, msg_type, flags = _HEADER.unpack(header)
    return length, stream_id, msg_type, flags


def encode_frame(stream_id: int, msg_type: int, flags: int, data: bytes) -> bytes:
    """One whole frame. Raises FrameTooLargeError above the 4 MiB limit."""
    if len(data) > MAX_DATA_LEN:
        raise FrameTooLargeError(len(data))
    return _HEADER.pack(len(data), stream_id, msg_type, flags) + data


class FrameDecoder:
    """Turns a byte stream, fed in arbitrary pieces, into frames.

    Never buffers more than one frame's worth of bytes (header + 4 MiB); an oversized
    frame is skipped as its bytes arrive.
    """

    __slots__ = ("_buf", "_skip")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._skip = 0

    @property
    def buffered(self) -> int:
        """Bytes held for a frame that is not complete yet."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame | OversizedFrame]:
        if self._skip:
            if len(data) <= self._skip:
                self._skip -= len(data)
                return []
            data = data[self._skip :]
            self._skip = 0
        buf = self._buf
        buf += data
        out: list[Frame | OversizedFrame] = []
        pos = 0
        end = len(buf)
        while end - pos >= HEADER_LEN:
            length, stream_id, msg_type, flags = _HEADER.unpack_from(buf, pos)
            if length > MAX_DATA_LEN:
                out.append(OversizedFrame(stream_id, msg_type, flags, length))
                available = end - pos - HEADER_LEN
                if available >= length:
                    pos += HEADER_LEN + length
                    continue
                self._skip = length - available
                pos = end
                break
            if end - pos - HEADER_LEN < length:
                break
            start = pos + HEADER_LEN
            out.append(Frame(stream_id, msg_type, flags, bytes(buf[start : start + length])))
            pos = start + length
        if pos:
            del buf[:pos]
        return out
