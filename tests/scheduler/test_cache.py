"""The scheduler's state as an object: its fields are its own, what it hands out cannot
change it, and its one lock makes concurrent binds safe. (The state machine over its
whole API is tests/scheduler/test_isolation_properties.py.)"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from scheduler_plugin.state.cache import Cache
from scheduler_plugin.state.nodes import parse_inventory
from scheduler_plugin.state.values import Assumed, Holds, PodSeen, Refused
from tessera.model import NodeInventory
from tessera.request import parse_pod
from tessera.resources import UNITS_PER_DEVICE
from tessera_testbed.inventory import inventory_spec, make_spec
from tests.scheduler.helpers import (
    pod,
    share,
)

THREADS = 8
PODS_PER_THREAD = 40
SWITCH_INTERVAL = 1e-6
"""Seconds between thread switches during the concurrency test (default 5 ms, longer than
one assume: the threads would otherwise rarely interleave inside one)."""


def cache_with(node: str, gpus: int) -> Cache:
    cache = Cache("binpack", require_heartbeat=False)
    cache.nodes.upsert(node, inventory_spec(node, gpus=gpus))
    return cache


def test_nodes_of_one_make_share_their_nics_and_nvlink_peers() -> None:
    """What makes 5,000 nodes of 8 NVLinked GPUs and 4 NICs of 8 VFs fit the memory
    target (bench/bench_memory.py loads such nodes)."""
    a, b = (parse_inventory(node, make_spec(node)) for node in ("n1", "n2"))
    assert isinstance(a, NodeInventory) and isinstance(b, NodeInventory)
    assert a.nics and all(nic.vfs for nic in a.nics)
    assert all(x is y for x, y in zip(a.nics, b.nics, strict=True))
    assert all(x.nvlinks is y.nvlinks and x.nvlinks for x, y in zip(a.gpus, b.gpus, strict=True))
    assert a.gpus[0].uuid != b.gpus[0].uuid


PARTS = frozenset({"nodes", "leases", "problems", "pods", "reservations"})
"""The Cache's named parts: what callers reach, each keeping its own fields."""


def test_nothing_outside_can_reach_a_field() -> None:
    cache = cache_with("n", 1)
    assert not hasattr(cache, "__dict__")
    assert {name for name in Cache.__slots__ if not name.startswith("_")} == PARTS
    for name in PARTS:
        part = getattr(cache, name)
        assert not hasattr(part, "__dict__")
        assert all(field.startswith("_") for field in type(part).__slots__)
    with pytest.raises(AttributeError):
        cache.state = None  # type: ignore[attr-defined]  # the write the test expects refused


def test_what_readers_get_cannot_change_the_state_and_does_not_change_with_it() -> None:
    cache = cache_with("n", 1)
    cache.nodes.upsert("bad", {"gpus": "x"})
    before = cache.snapshot()
    problems = cache.problems.by_node()
    with pytest.raises(TypeError):
        problems["n"] = "x"  # type: ignore[index]  # a read-only mapping, as the test checks
    with pytest.raises(TypeError):
        before.allocations["u"] = None  # type: ignore[index]  # likewise read-only
    request = parse_pod(pod("a", share(50, 50), uid="uid-a"))
    outcome = cache.pods.assume(request, "n")
    assert isinstance(outcome, Assumed)
    cache.nodes.remove("bad")
    assert "bad" in problems and "bad" not in cache.problems.by_node()
    assert not before.allocations and before.gpus[0].free_core == UNITS_PER_DEVICE
    assert cache.snapshot().gpus[0].free_core == 50


@pytest.fixture
def fast_switching() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL)
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("fast_switching")
def test_concurrent_binds_on_one_node_never_overcommit_it() -> None:
    """Threads assume (and forget every other one) 10% shares of one GPU at once, switching
    every microsecond: at most ten are held, free + held == capacity, and no assume found
    the GPU changed between choosing and taking (with the cache's lock removed, that
    happened in about half the runs)."""
    cache = cache_with("n", 1)
    held: list[str] = []
    refused: list[str] = []
    start = threading.Barrier(THREADS)

    def binder(t: int) -> None:
        start.wait()
        for i in range(PODS_PER_THREAD):
            uid = f"uid-{t}-{i}"
            outcome = cache.pods.assume(parse_pod(pod(f"p{t}-{i}", share(10, 10), uid=uid)), "n")
            if isinstance(outcome, Refused):
                refused.append(outcome.reason)
                continue
            assert isinstance(outcome, Assumed)
            if i % 2:
                cache.pods.forget(uid, outcome.allocation)
            else:
                cache.pods.bind(uid)
                seen = PodSeen(uid, "default", f"p{t}-{i}", "n")
                cache.pods.observed(seen, Holds(outcome.allocation))
                held.append(uid)

    threads = [threading.Thread(target=binder, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    snapshot = cache.snapshot()
    assert set(snapshot.allocations) == set(held) and len(held) <= 10
    assert refused and not snapshot.assumed and not snapshot.inflight
    # place and add ran as one step: no assume saw the GPU change under it
    assert not [r for r in refused if r.startswith("internal conflict")], refused
    (gpu,) = snapshot.gpus
    assert gpu.free_core >= 0 and gpu.free_core + 10 * len(held) == UNITS_PER_DEVICE
