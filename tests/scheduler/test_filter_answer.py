"""filter's `best` answer: the policy's one best node, or every fitting node when the pod
asks kube-scheduler to weigh nodes itself."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_plugin.extender import Extender, best_node, rank_priorities, states_preferences
from tessera import resources as rn
from tests.scheduler.helpers import pod, share
from tests.scheduler.test_extender import args, make_cache, occupy

NODES = {"a": {"gpus": 2}, "b": {"gpus": 2}, "c": {"gpus": 2}, "d": {"gpus": 1}}


def _cache() -> Any:
    cache = make_cache(NODES, policy="binpack")
    occupy(cache, "half-b", "b", share(60, 60))
    occupy(cache, "half-c", "c", share(30, 30))
    return cache


@pytest.mark.parametrize("names", [["a", "b", "c", "d"], ["d", "c", "b", "a"], ["a", "c"]])
def test_best_is_the_node_prioritize_ranks_first(names: list[str]) -> None:
    cache = _cache()
    request = pod("p", share(30, 30))
    everything = Extender(cache, answer="all").filter(args(request, names))
    scores = Extender(cache).prioritize(args(request, everything["NodeNames"]))
    top = max(s["Score"] for s in scores)
    first_top = next(s["Host"] for s in scores if s["Score"] == top)
    reply = Extender(cache, answer="best").filter(args(request, names))
    assert reply["NodeNames"] == [first_top]
    assert reply["FailedNodes"] == {} == reply["FailedAndUnresolvableNodes"]


def test_when_nothing_fits_best_gives_every_reason_as_all_does() -> None:
    cache = _cache()
    request = pod("big", {rn.GPU: 300})
    names = ["a", "b", "c", "d", "ghost"]
    best = Extender(cache, answer="best").filter(args(request, names))
    assert best == Extender(cache, answer="all").filter(args(request, names))
    assert best["NodeNames"] == []
    assert set(best["FailedNodes"]) | set(best["FailedAndUnresolvableNodes"]) == set(names)


PREFERENCES: list[dict[str, Any]] = [
    {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{}]}}},
    {"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{}]}}},
    {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{}]}}},
    {"topologySpreadConstraints": [{"whenUnsatisfiable": "ScheduleAnyway", "maxSkew": 1}]},
    {"affinity": "not an object"},
    {"topologySpreadConstraints": ["not an object"]},
]
HARD_ONLY: list[dict[str, Any]] = [
    {},
    {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}},
    {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
    {"topologySpreadConstraints": [{"whenUnsatisfiable": "DoNotSchedule", "maxSkew": 1}]},
]


@pytest.mark.parametrize("extra", PREFERENCES)
def test_a_pod_with_soft_preferences_gets_every_fitting_node(extra: dict[str, Any]) -> None:
    cache = _cache()
    request = pod("p", share(30, 30))
    request["spec"].update(extra)
    assert states_preferences(request)
    names = ["a", "b", "c", "d"]
    reply = Extender(cache, answer="best").filter(args(request, names))
    assert reply == Extender(cache, answer="all").filter(args(request, names))
    assert len(reply["NodeNames"]) > 1


@pytest.mark.parametrize("extra", HARD_ONLY)
def test_hard_constraints_alone_leave_the_choice_to_the_policy(extra: dict[str, Any]) -> None:
    request = pod("p", share(30, 30))
    request["spec"].update(extra)
    assert not states_preferences(request)
    reply = Extender(_cache(), answer="best").filter(args(request, ["a", "b", "c", "d"]))
    assert len(reply["NodeNames"]) == 1


def test_an_unknown_answer_is_refused() -> None:
    with pytest.raises(ValueError, match="best, all"):
        Extender(_cache(), answer="first")


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([f"n{i}" for i in range(12)]),
        st.sampled_from([0.0, 0.25, 0.5, 0.5 + 1e-12, 0.75, 1.0]),
        min_size=1,
    ),
    st.randoms(use_true_random=False),
)
def test_best_node_is_prioritizes_first_ten(scores: dict[str, float], rnd: Any) -> None:
    names = list(scores)
    rnd.shuffle(names)
    priorities = rank_priorities(scores, names)
    assert best_node(scores, names) == names[priorities.index(max(priorities))]
