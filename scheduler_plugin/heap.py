"""One malloc arena for the scheduler's threads (glibc).

glibc gives each thread that allocates an arena of its own (up to 8 per core) the first time
two threads allocate at once. Python's small objects come from its own pools, shared by all
threads; what goes to malloc is the larger blocks: big dicts and lists, numpy arrays,
request bodies, decoded pages. With an arena per thread, space the watch threads freed
cannot serve the HTTP thread's decisions, and each arena keeps free space of its own. The
scheduler's threads take turns under the GIL, so sharing one arena costs no contention worth
counting; at 5,000 nodes and 50,000 pods it lowers the peak resident memory by about 3 MiB
(`bench/bench_memory.py`). `MALLOC_ARENA_MAX` in the environment, when set, wins.
"""

from __future__ import annotations

import ctypes
import os

M_ARENA_MAX = -8
"""mallopt's parameter number for the arena limit (glibc malloc.h)."""


def limit_arenas(count: int = 1) -> bool:
    """Limit malloc to `count` arenas; True when the C library took the setting. Call before
    threads start: an arena, once made, is kept."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False  # no mallopt (musl): nothing to tune
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, count))
