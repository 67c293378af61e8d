"""The extender verbs as pure functions over a Cache (no HTTP, no API server)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

import pytest

from scheduler_plugin.decisions.extender import BadArgsError, Extender, rank_priorities
from scheduler_plugin.state.cache import Cache
from scheduler_plugin.state.heartbeats import HeartbeatTracker
from scheduler_plugin.state.values import Assumed, Holds, PodSeen
from scheduler_plugin.views.metrics import Metrics
from tessera import resources as rn
from tessera.allocation import PodAllocation
from tessera.request import PodRequest, parse_pod
from tessera_testbed.inventory import inventory_spec
from tests.scheduler import godecode as go
from tests.scheduler.helpers import (
    heartbeat,
    pod,
    share,
)


def make_cache(nodes: dict[str, dict[str, Any]], policy: str = "binpack") -> Cache:
    cache = Cache(policy)
    for name, kw in nodes.items():
        cache.nodes.upsert(name, inventory_spec(name, **kw))
        cache.leases.seen(heartbeat(name))
    return cache


def occupy(
    cache: Cache,
    name: str,
    node: str,
    resources: dict[str, Any],
    uid: str | None = None,
    priority: int = 0,
) -> PodAllocation:
    """A pod bound by us (assume, bind) and then seen by the watch (confirmed)."""
    request = parse_pod(pod(name, resources, uid=uid or f"uid-{name}"))
    outcome = cache.pods.assume(request, node)
    assert isinstance(outcome, Assumed), outcome
    cache.pods.bind(request.uid)
    seen = PodSeen(request.uid, request.namespace, request.name, node, priority)
    cache.pods.observed(seen, Holds(outcome.allocation))
    return outcome.allocation


def args(obj: dict[str, Any], names: list[str] | None) -> dict[str, Any]:
    return {"Pod": obj, "Nodes": None, "NodeNames": names}


def test_a_pod_without_tessera_resources_passes_everywhere_untouched() -> None:
    ext = Extender(make_cache({"a": {"gpus": 1}}))
    names = ["a", "unknown-node"]
    reply = ext.filter(args(pod("plain", {"cpu": "1"}), names))
    assert reply["NodeNames"] == names
    assert reply["FailedNodes"] == {} == reply["FailedAndUnresolvableNodes"]


def test_filter_sorts_nodes_into_fit_failed_and_unresolvable() -> None:
    cache = make_cache(
        {"full": {"gpus": 1}, "free": {"gpus": 1}, "small": {"gpus": 1, "mem": 8192}}
    )
    occupy(cache, "hog", "full", {rn.GPU: 100})
    ext = Extender(cache)
    reply = ext.filter(
        args(pod("p", {rn.GPU_CORE: 50, rn.GPU_MEMORY: 16}), ["full", "free", "small", "ghost"])
    )
    assert reply["NodeNames"] == ["free"]
    assert set(reply["FailedNodes"]) == {"full"}
    assert set(reply["FailedAndUnresolvableNodes"]) == {"small", "ghost"}
    assert "largest GPU here has 8.0 GiB" in reply["FailedAndUnresolvableNodes"]["small"]


def test_after_a_filter_its_shape_catches_up_once_on_the_nodes_that_changed() -> None:
    cache = make_cache({"a": {"gpus": 2}, "b": {"gpus": 2}, "c": {"gpus": 2}})
    ext = Extender(cache, answer="best")
    assert ext.catch_up() == 0  # no filter yet
    ext.filter(args(pod("p1", {rn.GPU: 100}), ["a", "b", "c"]))
    occupy(cache, "hog", "b", {rn.GPU: 100})
    assert ext.catch_up() == 1  # b changed since p1's shape was judged there
    assert ext.catch_up() == 0  # done once per filter
    ext.filter(args(pod("p2", {rn.GPU: 100}), ["a", "b", "c"]))
    assert ext.catch_up() == 0  # p2 judged every change itself
    # a pod without devices judges nothing, so there is nothing to catch up on
    ext.filter(args(pod("plain", {"cpu": "1"}), ["a"]))
    occupy(cache, "hog2", "c", {rn.GPU: 100})
    assert ext.catch_up() == 0


def test_a_broken_request_fails_every_node_with_the_rule() -> None:
    ext = Extender(make_cache({"a": {"gpus": 1}}))
    reply = ext.filter(args(pod("p", {rn.GPU_CORE: 50}), ["a"]))
    assert reply["NodeNames"] == []
    message = reply["FailedAndUnresolvableNodes"]["a"]
    assert "compute share needs a memory bound" in message and 'container "main"' in message


def test_gpu_model_hint_is_unresolvable_elsewhere() -> None:
    cache = make_cache({"h100": {"gpus": 2}, "t4": {"gpus": 2, "model": "Tesla T4", "mem": 15360}})
    ext = Extender(cache)
    obj = pod("p", {rn.GPU: 100}, annotations={rn.GPU_MODEL_ANNOTATION: "T4"})
    reply = ext.filter(args(obj, ["h100", "t4"]))
    assert reply["NodeNames"] == ["t4"]
    assert "no GPU of model T4" in reply["FailedAndUnresolvableNodes"]["h100"]


def test_silent_agent_and_bad_inventory_are_resolvable_failures() -> None:
    cache = make_cache({"ok": {"gpus": 1}})
    cache.nodes.upsert("silent", inventory_spec("silent", gpus=1))
    # a first sighting of an old renewTime counts from that renewTime
    cache.leases.seen(heartbeat("silent", offset=-120, duration=40))
    cache.nodes.upsert("broken", {"gpus": [{"uuid": "x"}]})
    ext = Extender(cache)
    reply = ext.filter(args(pod("p", share(10, 10)), ["ok", "silent", "broken"]))
    assert reply["NodeNames"] == ["ok"]
    assert "silent" in reply["FailedNodes"]["silent"]
    assert "nodedevices/broken is invalid" in reply["FailedNodes"]["broken"]


def test_a_heartbeat_counts_from_when_we_see_it_change() -> None:
    clock = [time.time()]
    cache = Cache("binpack", clock=lambda: clock[0])
    cache.nodes.upsert("n", inventory_spec("n", gpus=1))
    lease = heartbeat("n", duration=10)
    lease["spec"]["renewTime"] = "2000-01-01T00:00:00.000000Z"  # a skewed node clock
    cache.leases.seen(lease)
    assert "silent" in cache.problems.by_node()["n"]
    lease["spec"]["renewTime"] = "2000-01-01T00:00:05.000000Z"  # renewed: seen now
    cache.leases.seen(lease)
    assert "n" not in cache.problems.by_node()
    clock[0] += 14.0  # within duration + grace
    cache.problems.check()
    assert "n" not in cache.problems.by_node()
    clock[0] += 2.0
    cache.problems.check()
    assert "not renewed" in cache.problems.by_node()["n"]
    cache.leases.gone(lease)
    assert "missing" in cache.problems.by_node()["n"]


def test_only_heartbeats_that_ran_out_are_checked_again() -> None:
    tracker = HeartbeatTracker("tessera-system", grace=5.0)
    now = 1_000.0

    def renew(node: str, at: float, duration: int = 10) -> None:
        lease = heartbeat(node, duration=duration)
        lease["spec"]["renewTime"] = (
            f"2000-01-01T00:00:{int(at) % 60:02d}.{int(at * 1e6) % 10**6:06d}Z"
        )
        tracker.observe(lease, at)

    for node in ("a", "b", "c"):
        renew(node, now)
    assert tracker.expired(now + 14.0) == []
    renew("b", now + 10.0)  # renewed: its first deadline no longer counts
    tracker.forget_node("c")  # gone: nothing to check
    assert tracker.expired(now + 16.0) == ["a"]
    assert tracker.expired(now + 17.0) == []  # once
    assert tracker.problem("a", now + 17.0) is not None
    assert tracker.expired(now + 26.0) == ["b"]
    renew("a", now + 30.0, duration=40)
    assert tracker.expired(now + 50.0) == []
    assert tracker.expired(now + 76.0) == ["a"]


def test_prioritize_follows_the_policy_in_integers_0_to_10() -> None:
    cache = make_cache({"busy": {"gpus": 2}, "idle": {"gpus": 2}})
    occupy(cache, "x", "busy", {rn.GPU: 100})
    obj = pod("p", share(50, 50))
    binpack = Extender(cache).prioritize(args(obj, ["busy", "idle", "ghost"]))
    by_host = {s["Host"]: s["Score"] for s in binpack}
    assert by_host["busy"] > by_host["idle"] and by_host["ghost"] == 0
    assert all(isinstance(s["Score"], int) and 0 <= s["Score"] <= 10 for s in binpack)
    spread_cache = make_cache({"busy": {"gpus": 2}, "idle": {"gpus": 2}}, policy="spread")
    occupy(spread_cache, "x", "busy", {rn.GPU: 100})
    spread = {
        s["Host"]: s["Score"]
        for s in Extender(spread_cache).prioritize(args(obj, ["busy", "idle"]))
    }
    assert spread["idle"] > spread["busy"]


def test_prioritize_reflects_changes_after_filter() -> None:
    cache = make_cache({"a": {"gpus": 1}, "b": {"gpus": 1}})
    ext = Extender(cache)
    obj = pod("p", share(10, 10), uid="same")
    ext.filter(args(obj, ["a", "b"]))
    first = {s["Host"]: s["Score"] for s in ext.prioritize(args(obj, ["a", "b"]))}
    assert first["a"] == first["b"]
    occupy(cache, "other", "a", share(80, 80))
    second = {s["Host"]: s["Score"] for s in ext.prioritize(args(obj, ["a", "b"]))}
    assert second["a"] > second["b"]


def test_the_same_pod_asked_about_the_same_nodes_or_fewer_reuses_the_judgement() -> None:
    cache = make_cache({"a": {"gpus": 1}, "b": {"gpus": 1}, "c": {"gpus": 1}})
    request = parse_pod(pod("p", share(10, 10), uid="same"))
    first = cache.assess(request, ["a", "b"]).judgement
    assert cache.assess(request, ["b"]).judgement is first
    assert cache.assess(request, ["b", "a"]).judgement is first
    wider = cache.assess(request, ["a", "c"]).judgement  # c was not asked about
    assert wider is not first
    other = parse_pod(pod("q", share(10, 10), uid="other"))
    kept = cache.assess(other, ["a", "c"]).judgement
    assert kept is not wider  # another pod
    assert cache.assess(other, ["c"]).judgement is kept
    occupy(cache, "hog", "b", share(50, 50))  # any change: judged again
    assert cache.assess(other, ["c"]).judgement is not kept


def test_priorities_keep_the_policys_order_of_the_best_nodes() -> None:
    scores = {"a": 0.5001, "b": 0.5003, "c": 0.5002, "d": 0.5003 + 1e-12, "x": 0.9}
    names = ["a", "b", "c", "d", "e", "x"]
    got = dict(zip(names, rank_priorities(scores, names), strict=True))
    assert got["x"] == 10  # the best node
    assert got["b"] == got["d"] == 9  # equal up to float noise: one level
    assert got["c"] == 8 and got["a"] == 7
    assert got["e"] == 0  # does not fit
    many = {f"n{i}": i / 100 for i in range(30)}
    floor = rank_priorities(many, list(many))
    assert floor[-1] == 10 and floor[-10] == 1 and floor[0] == 1  # at least 1 when it fits


def test_priorities_do_not_import_numpy_ma() -> None:
    """np.unique asks numpy.ma whether its array is masked, importing it (about 1 MB of a
    scheduler's resident memory) on the first prioritize call."""
    code = (
        "import sys\n"
        "from scheduler_plugin.decisions.extender import rank_priorities\n"
        "assert rank_priorities({'a': 0.5, 'b': 0.7, 'c': 0.5}, ['a', 'b', 'c', 'd'])"
        " == [9, 10, 9, 0]\n"
        "print('numpy.ma' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_pods_placement_hint_picks_its_policy() -> None:
    cache = make_cache({"a": {"gpus": 2}, "b": {"gpus": 2}})
    occupy(cache, "busy", "a", share(50, 50))
    packed = pod("p", share(10, 10), annotations={rn.PLACEMENT_ANNOTATION: rn.POLICY_BINPACK})
    spread = pod("q", share(10, 10), annotations={rn.PLACEMENT_ANNOTATION: rn.POLICY_SPREAD})
    best = {}
    for obj in (packed, spread):
        scores = {s["Host"]: s["Score"] for s in Extender(cache).prioritize(args(obj, ["a", "b"]))}
        best[obj["metadata"]["name"]] = max(scores, key=scores.__getitem__)
    assert best == {"p": "a", "q": "b"}


def test_bad_shapes_are_refused() -> None:
    ext = Extender(make_cache({"a": {"gpus": 1}}))
    bad: Any  # JSON of any shape, as a caller may send
    for bad in (
        [],
        {"Pod": "x"},
        {"Pod": {}, "NodeNames": "a"},
        {"Pod": {}, "Nodes": {"items": [{}]}},
    ):
        with pytest.raises(BadArgsError):
            ext.filter(bad)


# --- preempt ------------------------------------------------------------------------------


def test_preempt_returns_the_smallest_helpful_set_and_drops_hopeless_nodes() -> None:
    cache = make_cache({"n": {"gpus": 1}, "tiny": {"gpus": 1}, "roomy": {"gpus": 2}})
    occupy(cache, "small", "n", share(30, 30))
    occupy(cache, "big", "n", share(70, 70))
    occupy(cache, "t", "tiny", share(90, 90))
    occupy(cache, "r", "roomy", {rn.GPU: 100})
    ext = Extender(cache)
    incoming = pod("p", share(60, 60))
    body = {
        "Pod": incoming,
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            "n": {
                "Pods": [{"UID": "uid-small"}, {"UID": "uid-big"}, {"UID": "cpu-hog"}],
                "NumPDBViolations": 1,
            },
            "tiny": {"Pods": [{"UID": "cpu-hog-2"}], "NumPDBViolations": 0},
            "roomy": {"Pods": [{"UID": "uid-r"}, {"UID": "other"}], "NumPDBViolations": 0},
        },
    }
    reply = ext.preempt(body)
    decoded, unknown = go.decode(go.ExtenderPreemptionResult, json.dumps(reply).encode())
    assert unknown == []
    victims = decoded["NodeNameToMetaVictims"]
    # n: keep the non-device victim, and only "big" (removing "small" alone is not enough)
    assert [p["UID"] for p in victims["n"]["Pods"]] == ["cpu-hog", "uid-big"]
    # tiny: removing the offered victims frees no GPU share: dropped
    assert "tiny" not in victims
    # roomy: the pod's devices fit already; kube-scheduler's victims stand as they were
    assert [p["UID"] for p in victims["roomy"]["Pods"]] == ["uid-r", "other"]


def test_preempt_with_full_victim_pods_and_priorities() -> None:
    cache = make_cache({"n": {"gpus": 1}})
    occupy(cache, "a", "n", share(50, 50), priority=100)
    occupy(cache, "b", "n", share(50, 50), priority=5)
    ext = Extender(cache)
    full = [pod("a", uid="uid-a"), pod("b", uid="uid-b")]
    reply = ext.preempt(
        {
            "Pod": pod("p", share(50, 50)),
            "NodeNameToVictims": {"n": {"Pods": full, "NumPDBViolations": 2}},
            "NodeNameToMetaVictims": None,
        }
    )
    # either victim frees enough; the lower-priority one is chosen
    assert reply["NodeNameToMetaVictims"]["n"] == {
        "Pods": [{"UID": "uid-b"}],
        "NumPDBViolations": 1,
    }


def test_prioritize_json_equals_prioritize_for_small_and_large_lists() -> None:
    nodes = {f"n{i}": {"gpus": 1} for i in range(70)}
    cache = make_cache(nodes)
    for i in range(0, 70, 3):
        occupy(cache, f"x{i}", f"n{i}", share(10 * (i % 9), 10 * (i % 9)))
    ext = Extender(cache)
    obj = pod("p", share(10, 10))
    for names in (list(nodes)[:5], list(nodes), [*list(nodes)[:3], 'we"ird\\name']):
        body = args(obj, names)
        fast, _ = go.decode(go.HostPriorityList, ext.prioritize_json(body))
        assert fast == ext.prioritize(body)
        assert len({s["Score"] for s in fast}) > 1 or len(names) < 10


def test_a_pod_version_is_parsed_once_across_filter_and_prioritize(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ext = Extender(make_cache({"a": {"gpus": 1}, "b": {"gpus": 1}}))
    parsed: list[str] = []
    real_parse = ext.parse

    def counting_parse(obj: Mapping[str, Any]) -> PodRequest:
        parsed.append(obj["metadata"].get("resourceVersion", ""))
        return real_parse(obj)

    monkeypatch.setattr(ext, "parse", counting_parse)
    obj = pod("p", share(30, 30), uid="u1")
    obj["metadata"]["resourceVersion"] = "7"
    ext.filter(args(obj, ["a", "b"]))
    ext.prioritize(args(obj, ["a", "b"]))
    ext.prioritize_json(args(obj, ["a", "b"]))
    ext.filter(args(obj, ["a", "b"]))  # kube-scheduler retrying the same version
    assert parsed == ["7"]


def test_a_new_pod_version_or_none_is_parsed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    ext = Extender(make_cache({"a": {"gpus": 2}}))
    obj = pod("p", share(30, 30), uid="u1")
    obj["metadata"]["resourceVersion"] = "7"
    ext.filter(args(obj, ["a"]))
    # the same uid at a new version asks for more: the new request is what counts
    bigger = pod("p", {rn.GPU: 300}, uid="u1")
    bigger["metadata"]["resourceVersion"] = "8"
    reply = ext.filter(args(bigger, ["a"]))
    assert reply["NodeNames"] == []
    remembered = ext.remembered("u1")
    assert remembered is not None and remembered.wants_devices
    # without a version nothing is reused: each call parses what it was sent
    unversioned = pod("p", {rn.GPU: 300}, uid="u2")
    assert ext.filter(args(unversioned, ["a"]))["NodeNames"] == []
    smaller = pod("p", share(10, 10), uid="u2")
    assert ext.filter(args(smaller, ["a"]))["NodeNames"] == ["a"]


@pytest.mark.parametrize(
    ("resources", "fits_elsewhere"),
    [({rn.GPU: 300}, False), ({rn.GPU: 100}, True), (share(30, 30), True)],
)
def test_each_refused_node_is_counted_once_under_one_reason(
    resources: dict[str, Any], fits_elsewhere: bool
) -> None:
    """A node with a problem (no heartbeat) that would also fail on capacity, or pass, is
    one failure in the metric, not two, whatever its shown reason."""
    cache = make_cache({"ok": {"gpus": 1}, "busy": {"gpus": 1}, "quiet-busy": {"gpus": 1}})
    cache.nodes.upsert("quiet", inventory_spec("quiet", gpus=1))  # no heartbeat Lease
    occupy(cache, "hog", "busy", {rn.GPU: 100})
    occupy(cache, "hog2", "quiet-busy", {rn.GPU: 100})
    cache.leases.gone(heartbeat("quiet-busy"))  # its agent's heartbeat Lease is deleted
    names = ["ok", "busy", "quiet", "quiet-busy", "ghost"]
    metrics = Metrics()
    reply = Extender(cache, metrics, answer="all").filter(args(pod("p", resources), names))
    refused = {**reply["FailedNodes"], **reply["FailedAndUnresolvableNodes"]}
    assert set(refused) | set(reply["NodeNames"]) == set(names)
    assert ("ok" in reply["NodeNames"]) is fits_elsewhere
    if fits_elsewhere:
        assert "heartbeat" in refused["quiet"]
    assert _failures_counted(metrics) == len(refused)
    # the best answer writes no reasons when a node fits, yet counts the same failures
    best = Metrics()
    extender = Extender(cache, best, answer="best")
    extender.filter(args(pod("p", resources), names))
    extender.catch_up()  # as the service does once the answer is out
    assert _failures_counted(best) == len(refused)
    assert _failure_labels(best) == _failure_labels(metrics)


def _failure_samples(metrics: Metrics) -> list[Any]:
    return [
        s
        for family in metrics.registry.collect()
        if family.name == "tessera_scheduler_node_failures"
        for s in family.samples
        if s.name.endswith("_total")
    ]


def _failures_counted(metrics: Metrics) -> float:
    return float(sum(s.value for s in _failure_samples(metrics)))


def _failure_labels(metrics: Metrics) -> dict[str, float]:
    return {s.labels["reason"]: s.value for s in _failure_samples(metrics)}
