"""The seams of the state's parts (scheduler_plugin/state/): one lock across every part, a
node's reason judged from the inventory, the fences and the heartbeat in that order, a
reservation taken only on its node, and a preemption trial that never touches the state."""

from __future__ import annotations

import threading
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_plugin.state.cache import DEFAULT_HEARTBEAT_GRACE, Cache
from scheduler_plugin.state.values import AlreadyHeld, Assumed, Holds, PodSeen, Refused
from tessera.gang.plan import GangAsk, GangPlan
from tessera.gang.spec import NO_TOPOLOGY, GangKey
from tessera.request import parse_pod
from tessera_testbed.inventory import heartbeat_lease, inventory_spec
from tests.scheduler.helpers import pod, share

NOW = 1_000_000.0
LEASE = 40


def cache_at(clock: list[float]) -> Cache:
    return Cache("binpack", clock=lambda: clock[0])


def test_every_part_waits_for_a_reader_of_the_whole_state() -> None:
    """One lock: while `Cache.reading` runs, a watch event for any part waits for it."""
    cache = Cache("binpack", require_heartbeat=False)
    cache.nodes.upsert("n", inventory_spec("n", gpus=1))
    reading = threading.Event()
    release = threading.Event()
    changes: list[str] = []

    def event() -> None:
        reading.wait(5)
        cache.nodes.upsert("m", inventory_spec("m", gpus=1))
        changes.append("nodes")
        cache.problems.distrust("default/x", "uid-x", "n", "record: forged")
        changes.append("problems")

    seen: list[frozenset[str]] = []

    def reader() -> None:
        def read(r: Any) -> frozenset[str]:
            reading.set()
            release.wait(5)
            return frozenset(r.fenced)

        seen.append(cache.reading(read))

    threads = [threading.Thread(target=reader), threading.Thread(target=event)]
    for t in threads:
        t.start()
    assert reading.wait(5)
    time.sleep(0.05)  # the event thread is blocked on the lock, not finished
    assert changes == []
    release.set()
    for t in threads:
        t.join(5)
    assert changes == ["nodes", "problems"]
    assert seen == [frozenset()]  # the reader saw the state before the fence
    assert cache.problems.fenced() == {"n"} and "m" in cache.node_names()


FACTS = st.fixed_dictionaries(
    {
        "inventory": st.sampled_from(["good", "bad", "none"]),
        "fenced": st.booleans(),
        "lease": st.sampled_from(["renewed", "silent", "gone"]),
    }
)


@settings(max_examples=60, deadline=None)
@given(st.lists(FACTS, min_size=1, max_size=6))
def test_a_nodes_reason_follows_its_facts_in_order(steps: list[dict[str, Any]]) -> None:
    """Whatever order the facts change in, the node's reason is the invalid inventory's,
    else the fence's, else the heartbeat's (for a node with an inventory: missing, or not
    renewed for longer than the Lease and the grace), else none; the once-a-second check
    notices a heartbeat that ran out."""
    clock = [NOW]
    cache = cache_at(clock)
    fenced = False
    for facts in steps:
        if facts["inventory"] == "good":
            cache.nodes.upsert("n", inventory_spec("n", gpus=1))
        elif facts["inventory"] == "bad":
            cache.nodes.upsert("n", {"gpus": "x"})
        else:
            cache.nodes.remove("n")
        if facts["fenced"] and not fenced:
            cache.problems.distrust("default/x", "uid-x", "n", "record: forged")
        elif not facts["fenced"] and fenced:
            cache.problems.trust("default/x", "uid-x")
        fenced = facts["fenced"]
        fresh = facts["lease"] == "renewed"
        if facts["lease"] == "renewed":
            cache.leases.seen(heartbeat_lease("n", clock[0], LEASE))
        elif facts["lease"] == "gone":
            cache.leases.gone(heartbeat_lease("n", clock[0], LEASE))
        else:  # no renewal for longer than the Lease and the grace
            clock[0] += LEASE + DEFAULT_HEARTBEAT_GRACE + 1
        cache.problems.check()
        reason = cache.problems.of("n")
        if facts["inventory"] == "bad":
            assert reason is not None and "device inventory" in reason
        elif fenced:
            assert reason is not None and reason.startswith("node is fenced")
        elif facts["inventory"] == "good" and not fresh:
            assert reason is not None and "heartbeat" in reason
        else:
            assert reason is None
        assert dict(cache.problems.by_node()) == ({"n": reason} if reason else {})
        clock[0] += 1


def _reserve(cache: Cache) -> GangPlan:
    key = GangKey("ml", "g")
    members = tuple(
        parse_pod(pod(f"m{i}", {"tessera.dev/gpu": "100"}, uid=f"uid-m{i}")) for i in range(2)
    )
    ask = GangAsk(key, members, (), NO_TOPOLOGY)
    plan = cache.reservations.reserve(ask, 60.0, label_of=lambda node, label: None)
    assert isinstance(plan, GangPlan), plan
    return plan


def test_a_reservation_is_taken_only_on_its_own_node() -> None:
    cache = Cache("binpack", require_heartbeat=False)
    for node in ("a", "b"):
        cache.nodes.upsert(node, inventory_spec(node, gpus=1))
    plan = _reserve(cache)
    first = plan.allocations[0]
    other = "b" if first.node == "a" else "a"
    request = parse_pod(pod(first.name, {"tessera.dev/gpu": "100"}, uid=first.pod_uid))
    refused = cache.pods.assume(request, other)
    assert isinstance(refused, Refused) and "reserved on node" in refused.reason
    assert cache.reservations.reserved_node(first.pod_uid) == first.node  # still reserved
    taken = cache.pods.assume(request, first.node)
    assert isinstance(taken, Assumed) and taken.allocation == first
    assert cache.reservations.reserved_node(first.pod_uid) is None
    again = cache.pods.assume(request, first.node)
    assert isinstance(again, Refused) and "already running" in again.reason
    cache.pods.bind(first.pod_uid)
    assert isinstance(cache.pods.assume(request, first.node), AlreadyHeld)


def test_a_preemption_trial_never_changes_the_state() -> None:
    cache = Cache("binpack", require_heartbeat=False)
    cache.nodes.upsert("n", inventory_spec("n", gpus=1))
    cache.nodes.upsert("m", inventory_spec("m", gpus=1))
    low = parse_pod(pod("low", share(50, 50), uid="uid-low"))
    placed = cache.pods.assume(low, "n")
    assert isinstance(placed, Assumed)
    cache.pods.bind("uid-low")
    cache.pods.observed(
        PodSeen("uid-low", "default", "low", "n", priority=1), Holds(placed.allocation)
    )
    before = cache.snapshot().accounts
    trial = cache.pods.without_lower(10, spare=(), closed=())
    # the node holding the lower-priority pod is a copy with its devices free ...
    assert trial["n"].free_core[0] == 100
    # ... and the state still holds them; an untouched node is the state's own object
    assert cache.snapshot().accounts == before
    assert cache.reading(lambda r: r.state.nodes["m"]) is trial["m"]
    assert cache.reading(lambda r: r.state.nodes["n"]) is not trial["n"]
    assert cache.pods.allocation("uid-low") == placed.allocation
    spared = cache.pods.without_lower(10, spare=("uid-low",), closed=())
    assert spared["n"].free_core[0] == 50
    assert "n" not in cache.pods.without_lower(10, spare=(), closed={"n"})
