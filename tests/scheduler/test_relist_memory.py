"""A pod relist waits for its sort in a compact form (docs/scheduler.md, "Performance"):
what it accounts is what a rebuild accounts, in the rebuild's order."""

from __future__ import annotations

from scheduler_plugin.state.values import Holds, Invalid
from scheduler_plugin.watches import reconciler
from scheduler_plugin.watches.recovery import judge
from tessera.allocation import PodAllocation
from tests.scheduler.helpers import KEYRING
from tests.scheduler.test_isolation import cache_with, running_pod, signed


def test_a_relist_accounts_the_oldest_pod_first_whatever_the_list_order() -> None:
    cache, reconciler = cache_with(["n"])
    old = running_pod("old", "n", signed("old", "n", core=60))
    new = running_pod("new", "n", signed("new", "n", core=60))
    new["metadata"]["creationTimestamp"] = "2026-01-02T00:00:00Z"
    new["spec"]["priority"] = 7
    reconciler.replace([new, old])
    assert cache.pods.allocation("uid-old") is not None
    assert cache.pods.allocation("uid-new") is None  # 60% + 60% of one GPU: the newer loses
    cache2, reconciler2 = cache_with(["n"])
    reconciler2.replace([old, new])
    assert cache2.pods.allocation("uid-old") == cache.pods.allocation("uid-old")


def test_a_waiting_pod_keeps_the_allocation_bare_and_shares_its_creation_stamp() -> None:
    stamps: dict[str, str] = {}
    entries = []
    for name in ("a", "b"):
        obj = running_pod(name, "n", signed(name, "n"))
        # equal stamps that are distinct objects, as two decoded pods hold them
        obj["metadata"]["creationTimestamp"] = "".join(["2026-01-01", "T00:00:00Z"])
        verdict = judge(obj, KEYRING)
        assert isinstance(verdict, Holds)
        entries.append(reconciler._waiting(obj, f"uid-{name}", verdict, stamps))
    assert entries[0][0] is entries[1][0]
    assert isinstance(entries[0][7], PodAllocation)
    assert entries[0][1:7] == ("uid-a", "default", "a", "n", 0, False)
    invalid = Invalid("bad", "n")
    obj = running_pod("c", "n", "{")
    assert reconciler._waiting(obj, "uid-c", invalid, stamps)[7] is invalid
