"""The node programs' threads: named in the OS, and the loops that repeat on them.

Threads are named in the OS as they are in Python, so `top -H`, `ps -T` and
/proc/PID/task/TID/comm tell an operator which of a program's threads uses the CPU.
Python 3.11 names its threads only for itself. `name_os_threads` installs a one-shot
profile hook (threading.setprofile, called in each new thread before its target runs)
that names the thread with prctl(PR_SET_NAME) and removes itself, so it costs nothing
after a thread's first call. Linux keeps 15 bytes of a name.

`Repeating` is a piece of work done again every so many seconds on a daemon thread of its
own until it is stopped, surviving whatever the work raises.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

PR_SET_NAME = 15
OS_NAME_BYTES = 15


def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None  # names stay Python's own
    try:
        # the process's own symbols, libc's among them (find_library would run ldconfig)
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def os_thread_name(name: str) -> bytes:
    """What the OS keeps of a name: its first 15 bytes, cut at a whole character."""
    return name.encode("utf-8")[:OS_NAME_BYTES].decode("utf-8", "ignore").encode("utf-8")


def set_os_thread_name(name: str) -> bool:
    """Name the calling thread in the OS; False where the OS does not allow it."""
    if _PRCTL is None:
        return False
    return int(_PRCTL(PR_SET_NAME, ctypes.c_char_p(os_thread_name(name)), 0, 0, 0)) == 0


def _name_then_stop(frame: FrameType, event: str, arg: object) -> None:
    sys.setprofile(None)
    set_os_thread_name(threading.current_thread().name)


def name_os_threads() -> None:
    """Name every thread started from now on in the OS (the main thread keeps the
    program's name: ps and pgrep show it as the process's)."""
    threading.setprofile(_name_then_stop)


@dataclass(eq=False)
class Repeating:
    """`work()` on a daemon thread named `name`, then again every `interval_s` seconds,
    from `start()` until `stop()`; with `wait_first`, the first call too comes one interval
    after `start()`. What `work` raises is logged on `log` (`what`, and the traceback) and
    the next call comes as planned: a program's loops must survive anything."""

    name: str
    interval_s: float
    work: Callable[[], None]
    log: logging.Logger
    what: str
    wait_first: bool = False
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    @property
    def stopping(self) -> bool:
        """`stop()` was called (long work may check it and return early)."""
        return self._stop.is_set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, join_s: float = 5.0) -> None:
        """Stop, and wait up to `join_s` for the call under way to return."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(join_s)

    def _run(self) -> None:
        if self.wait_first and self._stop.wait(self.interval_s):
            return
        while not self._stop.is_set():
            try:
                self.work()
            except Exception:
                self.log.exception("%s", self.what)
            self._stop.wait(self.interval_s)
