"""The scheduler's threads share one malloc arena (scheduler_plugin/heap.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# four threads allocating at once, each kept alive until all have; then malloc_info's XML
# (one <heap> per arena) is counted
_ARENAS = """
import ctypes, sys, tempfile, threading
if sys.argv[1] == "service":
    from kube_edge.client import KubeClient
    from scheduler_plugin.service import Options, Service
    from tests.scheduler.helpers import KEYRING
    Service(Options(port=0), KubeClient.for_host("http://127.0.0.1:9"), KEYRING)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
libc.fclose.argtypes = (ctypes.c_void_p,)
together = threading.Barrier(4)
def work():
    together.wait()
    libc.malloc(4096)
    together.wait()
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with tempfile.NamedTemporaryFile() as f:
    out = libc.fopen(f.name.encode(), b"w")
    libc.malloc_info(0, out)
    libc.fclose(out)
    print(f.read().decode().count("<heap nr="))
"""


def arenas(how: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run(
        [sys.executable, "-c", _ARENAS, how], capture_output=True, text=True, env=env, check=True
    )
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
def test_a_scheduler_process_keeps_one_malloc_arena() -> None:
    assert arenas("plain") > 1  # the measure sees the arenas threads make
    assert arenas("service") == 1
