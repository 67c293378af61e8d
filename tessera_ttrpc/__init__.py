"""ttrpc (containerd's lightweight RPC protocol) on asyncio: framing, client and server.

Generic: nothing here knows about NRI. A client or server runs on any ByteStream (a unix
socket via AsyncioStream, or a multiplexed connection). Unary calls only, which is all
that NRI uses; streaming frames are answered or ignored as the Go implementation does.
"""

from tessera_ttrpc.client import Client
from tessera_ttrpc.errors import TtrpcError
from tessera_ttrpc.frame import (
    FLAG_NO_DATA,
    FLAG_REMOTE_CLOSED,
    FLAG_REMOTE_OPEN,
    HEADER_LEN,
    MAX_DATA_LEN,
    Frame,
    FrameDecoder,
    FrameTooLargeError,
    MessageType,
    OversizedFrame,
    encode_frame,
)
from tessera_ttrpc.server import CallContext, Handler, Limits, Server, unary
from tessera_ttrpc.status import Code, ConnectionClosedError, RpcError
from tessera_ttrpc.stream import AsyncioStream, ByteStream

__all__ = [
    "FLAG_NO_DATA",
    "FLAG_REMOTE_CLOSED",
    "FLAG_REMOTE_OPEN",
    "HEADER_LEN",
    "MAX_DATA_LEN",
    "AsyncioStream",
    "ByteStream",
    "CallContext",
    "Client",
    "Code",
    "ConnectionClosedError",
    "Frame",
    "FrameDecoder",
    "FrameTooLargeError",
    "Handler",
    "Limits",
    "MessageType",
    "OversizedFrame",
    "RpcError",
    "Server",
    "TtrpcError",
    "encode_frame",
    "unary",
]
