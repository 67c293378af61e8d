"""filter's `best` answer: the policy's one best node, or every fitting node when the pod
asks kube-scheduler to weigh nodes itself."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from scheduler_plugin.decisions.extender import (
    Extender,
    best_node,
    rank_priorities,
    states_preferences,
)
from scheduler_plugin.state.values import Assumed
from scheduler_plugin.views.metrics import Metrics
from tessera import resources as rn
from tessera.cluster_decision import RowVerdicts
from tessera.node_placement import NoFit
from tessera.request import parse_pod
from tessera.row_verdicts import FITS
from tests.scheduler.helpers import heartbeat, pod, share
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


class _Counted(Metrics):
    def __init__(self) -> None:
        super().__init__()
        self.counted: Counter[str] = Counter()

    def node_failures(self, reasons: Mapping[str, int]) -> None:
        self.counted.update(reasons)


class _DictsOnly(Extender):
    """filter answering from the Evaluation's dicts only (the general path)."""

    def _best_of(self, *args: Any) -> str | None:
        return None


SHAPES: list[dict[str, Any]] = [
    share(30, 30),
    share(60, 60),
    {rn.GPU: 100},
    {rn.GPU: 200},
    {rn.GPU_CORE: 20, rn.GPU_MEMORY: 4},
]


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from(["binpack", "fragmentation"]),
    st.sampled_from(range(len(SHAPES))),
    st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f", "ghost"]), min_size=1, max_size=9),
    st.sets(st.sampled_from(["a", "b", "c", "d", "e", "f", "ghost"])),
    st.lists(st.tuples(st.sampled_from(range(len(SHAPES))), st.sampled_from("abcdef"))),
)
@example("binpack", 3, list("abcdef"), set(), [])
@example("fragmentation", 0, ["ghost", "a", "b", "c", "d"], {"a", "c", "ghost"}, [(2, "b")])
@example("binpack", 2, ["a", "b", "a", "c"], {"b"}, [])
def test_the_array_answer_is_the_dict_answer(
    policy: str, shape: int, names: list[str], silent: set[str], pods: list[tuple[int, str]]
) -> None:
    """The best node and the failure counts read from the verdict arrays are those the
    dicts give, with repeated and unknown names and nodes closed for a problem."""
    cache = make_cache(
        {n: {"gpus": g} for n, g in zip("abcdef", (1, 1, 2, 2, 4, 8), strict=True)}, policy
    )
    for k, (s, node) in enumerate(pods):
        request = parse_pod(pod(f"o{k}", SHAPES[s], uid=f"uid-o{k}"))
        if isinstance(cache.pods.assume(request, node), Assumed):
            cache.pods.bind(request.uid)
    for node in silent:  # no heartbeat: the node takes no new pods
        cache.leases.gone(heartbeat(node))
    fast, slow = _Counted(), _Counted()
    asked = pod("p", SHAPES[shape], uid="uid-p")
    arrays, dicts = Extender(cache, fast, answer="best"), _DictsOnly(cache, slow, answer="best")
    got = arrays.filter(args(asked, names))
    want = dicts.filter(args(asked, names))
    assert got == want
    arrays.catch_up()  # the array answer's failures are counted once it is out
    dicts.catch_up()
    assert fast.counted == slow.counted


def test_the_best_answers_failures_are_counted_after_it_and_never_lost() -> None:
    cache = make_cache({n: {"gpus": g} for n, g in zip("abc", (1, 2, 8), strict=True)}, "binpack")
    counted = _Counted()
    extender = Extender(cache, counted, answer="best")
    names = ["a", "b", "c", "ghost"]
    wide = args(pod("p", {rn.GPU: 400}, uid="uid-p"), names)
    assert extender.filter(wide)["NodeNames"] == ["c"]
    assert not counted.counted  # counted once the answer is out
    extender.catch_up()
    after_one = Counter(counted.counted)
    assert sum(after_one.values()) == 3  # a, b too small; ghost unknown
    extender.catch_up()  # nothing counted twice
    assert counted.counted == after_one
    extender.filter(wide)  # no catch_up after it: the next filter counts it first
    extender.filter(wide)
    assert sum(counted.counted.values()) == 3 + 3
    extender.catch_up()
    assert counted.counted == after_one + after_one + after_one


@pytest.mark.parametrize(
    ("fits", "scores", "best"),
    [
        ([True, True, False], [0.5, 0.7, 0.9], "b"),  # the best of those that fit
        ([True, True, True], [0.7, 0.2, 0.7], "a"),  # the first of equal levels
        ([True, True, False], [0.5, float("nan"), 0.0], None),  # a candidate's NaN
        ([True, False, False], [0.5, float("nan"), 0.0], "a"),  # a NaN where it fails
        ([False, False, False], [0.0, 0.0, 0.0], None),  # nothing fits
    ],
)
def test_the_array_answer_reads_only_candidates_scores(
    fits: list[bool], scores: list[float], best: str | None
) -> None:
    """The array answer leaves the choice to the dicts (None) where a candidate's score is
    NaN or nothing fits; a NaN score where the pod does not fit changes nothing."""
    verdicts = RowVerdicts(
        ["a", "b", "c"],
        np.array([0, 1, 2]),
        [],
        np.array(fits),
        np.array(scores),
        np.array([FITS if f else 0 for f in fits], dtype=np.int32),
        [NoFit("no room")],
        "binpack",
    )
    extender = Extender(_cache(), Metrics(), answer="best")
    assert extender._best_of(verdicts, ["a", "b", "c"], {}) == best
