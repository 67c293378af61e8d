"""A connection's deadline: one pending timeout, replaced when armed again, gone when
disarmed, fired at most once per arming."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from scheduler_plugin.serving.deadline import Deadline


class _Handle:
    def __init__(self, seconds: float, fire: Callable[[], None]) -> None:
        self.seconds, self.fire, self.cancelled = seconds, fire, False

    def cancel(self) -> None:
        self.cancelled = True


class _Loop:
    """call_later's calls, fired by hand."""

    def __init__(self) -> None:
        self.handles: list[_Handle] = []

    def call_later(self, seconds: float, fire: Callable[[], None]) -> _Handle:
        self.handles.append(_Handle(seconds, fire))
        return self.handles[-1]

    def pending(self) -> list[float]:
        return [h.seconds for h in self.handles if not h.cancelled]


def _deadline() -> tuple[Deadline, _Loop, list[int]]:
    loop, fired = _Loop(), []
    return Deadline(cast(Any, loop), lambda: fired.append(1)), loop, fired


def test_arming_again_replaces_the_pending_timeout() -> None:
    deadline, loop, fired = _deadline()
    assert not deadline.armed
    deadline.arm(30.0)
    deadline.arm(5.0)
    assert deadline.armed and loop.pending() == [5.0]
    loop.handles[-1].fire()
    assert fired == [1] and not deadline.armed
    deadline.disarm()  # nothing pending: nothing to cancel
    assert loop.pending() == [5.0] and not loop.handles[-1].cancelled


def test_a_disarmed_deadline_leaves_nothing_pending() -> None:
    deadline, loop, fired = _deadline()
    deadline.arm(5.0)
    deadline.disarm()
    assert not deadline.armed and loop.pending() == [] and fired == []


def test_it_fires_on_a_real_loop() -> None:
    async def main() -> list[int]:
        fired: list[int] = []
        deadline = Deadline(asyncio.get_running_loop(), lambda: fired.append(1))
        deadline.arm(3600.0)
        deadline.arm(0.0)
        await asyncio.sleep(0.05)
        return fired

    assert asyncio.run(main()) == [1]
