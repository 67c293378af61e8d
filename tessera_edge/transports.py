"""Socket options for asyncio transports, shared by tessera's servers and clients."""

from __future__ import annotations

import asyncio
import contextlib
import socket


def no_delay(transport: asyncio.BaseTransport) -> None:
    """TCP_NODELAY on a TCP transport (others are left as they are): a short request or
    reply must not wait for the peer's delayed ACK of the one before."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
