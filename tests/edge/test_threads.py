"""OS thread names: what `top -H` and /proc show for tessera's threads."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera_edge.threads import OS_NAME_BYTES, Repeating, name_os_threads, os_thread_name

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="prctl and /proc are Linux's")


def _comm(native_id: int) -> str:
    return Path(f"/proc/self/task/{native_id}/comm").read_text().rstrip("\n")


@pytest.fixture
def hook() -> Iterator[None]:
    name_os_threads()
    try:
        yield
    finally:
        threading.setprofile(None)


def _seen_in(name: str) -> tuple[str, object]:
    """Start a thread called `name`; what the OS calls it, and its profile function after
    its first call."""
    seen: dict[str, object] = {}
    ready = threading.Event()

    def body() -> None:
        seen["comm"] = _comm(threading.get_native_id())
        seen["profile"] = sys.getprofile()
        ready.set()

    thread = threading.Thread(target=body, name=name)
    thread.start()
    thread.join(5)
    assert ready.is_set()
    return str(seen["comm"]), seen["profile"]


def test_threads_started_after_the_hook_carry_their_python_name(hook: None) -> None:
    comm, profile = _seen_in("watch-pods")
    assert comm == "watch-pods"
    assert profile is None  # the hook removed itself: no cost after the first call


def test_long_names_are_cut_to_what_linux_keeps(hook: None) -> None:
    comm, _ = _seen_in("watch-nodedevices")
    assert comm == "watch-nodedevic"


def test_the_main_thread_keeps_the_program_name(hook: None) -> None:
    before = _comm(threading.main_thread().native_id or 0)
    name_os_threads()
    assert _comm(threading.main_thread().native_id or 0) == before


def test_without_the_hook_threads_keep_the_program_name() -> None:
    comm, _ = _seen_in("unnamed-here")
    assert comm != "unnamed-here"


def test_pool_threads_are_named_too(hook: None) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="verb") as pool:
        comm = pool.submit(lambda: _comm(threading.get_native_id())).result(5)
    assert comm == "verb_0"


@given(st.text(max_size=40))
def test_os_names_fit_and_are_whole_characters(name: str) -> None:
    cut = os_thread_name(name)
    assert len(cut) <= OS_NAME_BYTES
    assert name.encode().startswith(cut)
    cut.decode("utf-8")  # never half a character


def _calls_until(
    count: int, fail_first: bool = False
) -> tuple[list[str], threading.Event, Callable[[], None]]:
    calls: list[str] = []
    done = threading.Event()

    def work() -> None:
        calls.append(threading.current_thread().name)
        if len(calls) >= count:
            done.set()
        if fail_first and len(calls) == 1:
            raise RuntimeError("first call breaks")

    return calls, done, work


def test_repeating_work_runs_at_once_then_again_on_its_own_thread() -> None:
    calls, done, work = _calls_until(3)
    loop = Repeating("again", 0.001, work, logging.getLogger("t"), "again")
    loop.start()
    assert done.wait(5)
    loop.stop()
    assert not loop._thread.is_alive()  # type: ignore[union-attr]
    assert loop.stopping and set(calls) == {"again"} and len(calls) >= 3


def test_repeating_work_survives_what_it_raises(caplog: pytest.LogCaptureFixture) -> None:
    _, done, work = _calls_until(2, fail_first=True)
    loop = Repeating("sturdy", 0.001, work, logging.getLogger("t"), "sturdy round")
    with caplog.at_level(logging.ERROR):
        loop.start()
        assert done.wait(5)
        loop.stop()
    assert any(r.getMessage() == "sturdy round" and r.exc_info for r in caplog.records)


def test_repeating_work_may_wait_one_interval_first() -> None:
    calls, _, work = _calls_until(1)
    loop = Repeating("later", 3600.0, work, logging.getLogger("t"), "later", wait_first=True)
    loop.start()
    loop.stop()  # long before the first interval is over
    assert calls == []
