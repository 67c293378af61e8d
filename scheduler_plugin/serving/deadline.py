"""A connection's one pending timeout (the head's, the body's, the idle keep-alive's): armed
again, a new delay replaces the old; disarmed, nothing fires."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Deadline:
    """`expire` called once `arm`'s seconds pass without another `arm` or a `disarm`."""

    __slots__ = ("_expire", "_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, expire: Callable[[], None]) -> None:
        self._loop = loop
        self._expire = expire
        self._handle: asyncio.TimerHandle | None = None

    @property
    def armed(self) -> bool:
        return self._handle is not None

    def arm(self, seconds: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._loop.call_later(seconds, self._fire)

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self._expire()
