"""The root of this library's errors."""

from __future__ import annotations


class TtrpcError(Exception):
    """Root of every error this library raises (`RpcError`, `ConnectionClosedError`,
    `FrameTooLargeError`). The library is usable without tessera and imports nothing of
    it, so it has its own root; a program using it maps these at its own edge."""
