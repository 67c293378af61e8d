"""Preempt: per node, the smallest set of the victims kube-scheduler offers whose removal
lets the pod's devices fit.

The victims that hold no tessera devices on a node are kept as kube-scheduler chose them
(its in-tree checks wanted them); among those that do, the smallest set that frees room
(lowest priority first among equals; exhaustive up to PREEMPT_BUDGET subsets per node,
then a greedy minimal set). A node where removing every offered victim does not free room
is left out. A gang member's victims are those its whole gang's plan needs on its node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import combinations
from typing import Any

from scheduler_plugin.state.cache import Cache
from tessera.node_placement import Placement, place_pod
from tessera.node_state import NodeState
from tessera.request import PodRequest

PREEMPT_BUDGET = 512
"""Subset evaluations per node before preempt falls back to a greedy minimal set."""

Together = Mapping[str, Mapping[str, PodRequest]]
"""For a gang member: node -> the members its gang's plan puts there."""


def chosen_victims(
    cache: Cache,
    request: PodRequest,
    offered: Mapping[str, tuple[list[str], int]],
    gang: Together | None,
) -> dict[str, Any]:
    """NodeNameToMetaVictims for `request`: per node of `offered` (victim UIDs and their
    NumPDBViolations), the victims chosen; nodes where none helps are left out."""
    result: dict[str, Any] = {}
    for node, (uids, pdb) in offered.items():
        if not request.wants_devices:
            chosen: list[str] | None = uids
        elif gang is not None:
            # the gang's plan: victims on this member's planned node only, for every
            # member planned there, or none anywhere
            together = gang.get(node)
            chosen = None if together is None else victims_on(cache, request, node, uids, together)
        else:
            chosen = victims_on(cache, request, node, uids)
        if chosen:
            result[node] = {
                "Pods": [{"UID": uid} for uid in chosen],
                "NumPDBViolations": pdb if chosen == uids else min(pdb, len(chosen)),
            }
    return result


def victims_on(
    cache: Cache,
    request: PodRequest,
    node: str,
    uids: list[str],
    together: Mapping[str, PodRequest] | None = None,
) -> list[str] | None:
    """The smallest set of the offered victims on `node` whose removal lets the pod
    (and the gang members `together` planned there with it) fit."""
    view = cache.preemption_view(node, request, uids)
    if view is None:
        return None
    held, priorities = view.held, view.priorities
    device_victims = sorted(
        (u for u in dict.fromkeys(uids) if u in held), key=lambda u: (priorities[u], u)
    )
    others = [u for u in uids if u not in held]

    def fits(removed: Iterable[str]) -> bool:
        gone = set(removed)
        trial = NodeState(view.inventory)
        for uid, alloc in held.items():
            if uid not in gone:
                trial.apply(alloc)
        for other in (together or {request.uid: request}).values():
            placed = place_pod(trial, other, view.policy)
            if not isinstance(placed, Placement):
                return False
            trial.apply(placed.allocation)
        return True

    if fits(()):
        return uids  # the devices fit already: the victims were chosen for other reasons
    if not device_victims or not fits(device_victims):
        return None
    chosen = _smallest_subset(device_victims, fits)
    return others + chosen


def _smallest_subset(candidates: list[str], fits: Any) -> list[str]:
    """The smallest subset (lowest priority first among equals) for which `fits` holds;
    past the evaluation budget, a greedy minimal one instead."""
    budget = PREEMPT_BUDGET
    for k in range(1, len(candidates) + 1):
        for combo in combinations(candidates, k):
            budget -= 1
            if budget < 0:
                return _greedy_subset(candidates, fits)
            if fits(combo):
                return list(combo)
    return list(candidates)


def _greedy_subset(candidates: list[str], fits: Any) -> list[str]:
    """Start from all, then spare victims (highest priority first) while the pod fits."""
    chosen = list(candidates)
    for uid in reversed(candidates):
        trial = [u for u in chosen if u != uid]
        if fits(trial):
            chosen = trial
    return chosen
