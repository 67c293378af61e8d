"""Threads named in the OS as they are in Python, so `top -H`, `ps -T` and
/proc/PID/task/TID/comm tell an operator which of a program's threads uses the CPU.

Python 3.11 names its threads only for itself. `name_os_threads` installs a one-shot
profile hook (threading.setprofile, called in each new thread before its target runs)
that names the thread with prctl(PR_SET_NAME) and removes itself, so it costs nothing
after a thread's first call. Linux keeps 15 bytes of a name.
"""

from __future__ import annotations

import ctypes
import sys
import threading
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
