"""Fit every member of a gang at once, or say what is missing.

`plan_gang` places the members one by one on copies of the nodes they touch (largest
first, each on the node its policy scores best, as a single pod would be placed), so a
member sees the devices the members before it took; the live state is never changed.
With a required topology key it plans inside each domain (the nodes sharing one value of
that label) and keeps the plan that wastes least: the growth of the expected fragment
(the fragmentation measure of single pods) over the nodes it touches, then the fewest
nodes, then the domain's name. With a preferred key it does the same and, when no domain
holds the whole gang, spreads it over as few domains as it can, the roomiest first.
Members already holding devices (bound before a restart or a timeout) stay where they are
and pin the domain.

Greedy, not exhaustive: a gang that would fit only in an order this does not try waits
(docs/gangs.md, limits).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tessera.allocation import PodAllocation
from tessera.fragmentation.measure import FragmentMeasure
from tessera.fragmentation.policy import FragmentationPolicy
from tessera.fragmentation.workload import PodClass, Workload
from tessera.gang.spec import NO_MIN_RESOURCES, NO_TOPOLOGY, GangKey, GangTopology, MinResources
from tessera.node_placement import NoFit, Placement, place_pod
from tessera.node_state import NodeState
from tessera.request import PodRequest
from tessera.resources import UNITS_PER_DEVICE
from tessera.scoring_policy import Policy

_UNKNOWN = NoFit("node was not judged")
MAX_DOMAINS = 1024
"""Domains of one label key planned for one gang (more are not looked at)."""

PolicyFor = Callable[[PodRequest], Policy]
Evaluate = Callable[[PodRequest, Sequence[str]], tuple[Mapping[str, float], Mapping[str, NoFit]]]
"""(request, node names) -> (score of each node where it fits, why not elsewhere) on the
nodes as they are: the Decider's whole-cluster path (`Decider.evaluate`), which agrees
with `place_pod` on fit and score and is far cheaper on many nodes."""
LabelOf = Callable[[str, str], str | None]
"""(node, label key) -> the node's value of that label, or None."""


@dataclass(frozen=True)
class GangAsk:
    key: GangKey
    members: tuple[PodRequest, ...]
    """The members to place now (each its own request)."""
    placed: tuple[str, ...] = ()
    """Nodes of members that already hold devices (they pin a required domain)."""
    topology: GangTopology = NO_TOPOLOGY
    min_resources: MinResources = NO_MIN_RESOURCES
    """What must be free before any member is placed (the PodGroup's `minResources`, the
    resources the scheduler counts; the plan itself ignores it: the caller checks it)."""
    bound: tuple[str, ...] = ()
    """UIDs of the members that already hold devices: what they hold is free to the gang
    when `min_resources` is judged."""


@dataclass(frozen=True)
class GangPlan:
    key: GangKey
    allocations: tuple[PodAllocation, ...]
    """One per member of the ask, in the ask's order."""
    domain: str | None
    """`key=value` of the domain it lies in (None: no topology, or spread over several)."""
    waste: float


@dataclass(frozen=True)
class GangShortfall:
    key: GangKey
    reason: str
    """What is missing, for the members' Pending reason ("gang ns/name: ...")."""


def waste_measure(
    policy: Policy, members: Iterable[PodRequest], nodes: Iterable[NodeState] = ()
) -> FragmentMeasure:
    """The fragmentation measure plans are compared with: the policy's learned workload
    when it is the fragmentation policy, else the gang's own shapes beside whole nodes of
    the largest GPU count (so that cutting up a node that a whole-node pod could use counts
    as waste)."""
    if isinstance(policy, FragmentationPolicy) and policy.workload.classes:
        return policy.measure
    counts: Counter[PodClass] = Counter(PodClass.of(r) for r in members)
    largest = max((len(n.inventory.gpus) for n in nodes), default=0)
    if largest:
        counts[PodClass(largest)] += max(1, sum(counts.values()))
    return FragmentMeasure(Workload.from_counts(counts))


def _fragment(measure: FragmentMeasure, node: NodeState) -> float:
    return measure.fragment(node, node.gpu_free, node.cpu_free, node.mem_free)


class _Trial:
    """Copy-on-write view of the nodes, with fit results kept per (shape, node version).
    Untouched nodes are judged by `evaluate` once per shape when given (`base` holds those
    results across the trials of one plan)."""

    def __init__(
        self,
        nodes: Mapping[str, NodeState],
        policy_for: PolicyFor,
        evaluate: Evaluate | None = None,
        base: dict[object, tuple[Mapping[str, float], Mapping[str, NoFit]]] | None = None,
    ) -> None:
        self.base = nodes
        self.copies: dict[str, NodeState] = {}
        self.policy_for = policy_for
        self.evaluate = evaluate
        self._base = {} if base is None else base
        self._memo: dict[tuple[object, str, bool, int], float | NoFit] = {}

    def state(self, name: str) -> NodeState:
        return self.copies.get(name) or self.base[name]

    def fit(self, request: PodRequest, name: str) -> float | NoFit:
        if self.evaluate is not None and name not in self.copies:
            shape = request.shape()
            judged = self._base.get(shape)
            if judged is None:
                judged = self._base[shape] = self.evaluate(request, sorted(self.base))
            score = judged[0].get(name)
            if score is not None:
                return score
            return judged[1].get(name) or _UNKNOWN
        node = self.state(name)
        key = (request.shape(), name, name in self.copies, node.version)
        hit = self._memo.get(key)
        if hit is None:
            placed = place_pod(node, request, self.policy_for(request))
            hit = placed.score if isinstance(placed, Placement) else placed
            self._memo[key] = hit
        return hit

    def best(self, request: PodRequest, names: Sequence[str]) -> tuple[str | None, NoFit | None]:
        """The node of `names` the policy scores best for `request` (the first among equal
        scores), or None with the last reason it fitted nowhere."""
        best: str | None = None
        best_score = -1.0
        why: NoFit | None = None
        for name in names:
            result = self.fit(request, name)
            if isinstance(result, NoFit):
                why = result
            elif result > best_score:
                best, best_score = name, result
        return best, why

    def take(self, request: PodRequest, name: str) -> PodAllocation:
        node = self.copies.get(name)
        if node is None:
            node = self.copies[name] = self.base[name].copy()
        placed = place_pod(node, request, self.policy_for(request), scored=False)
        assert isinstance(placed, Placement), "a node that fitted the shape fits the member"
        node.apply(placed.allocation)
        return placed.allocation


@dataclass
class _Attempt:
    allocations: dict[str, PodAllocation]
    """Member UID -> its allocation, for the members placed."""
    trial: _Trial
    failed: PodRequest | None = None
    why: NoFit | None = None

    @property
    def whole(self) -> bool:
        return self.failed is None


def _order(members: Sequence[PodRequest]) -> list[PodRequest]:
    """Largest first: the members that need most room choose before it is cut up."""
    return sorted(members, key=lambda r: (-r.gpu_demand, -len(r.containers), r.uid))


@dataclass
class _Context:
    nodes: Mapping[str, NodeState]
    policy_for: PolicyFor
    measure: FragmentMeasure
    evaluate: Evaluate | None
    base: dict[object, tuple[Mapping[str, float], Mapping[str, NoFit]]]


def _place(
    members: Sequence[PodRequest], groups: Sequence[Sequence[str]], ctx: _Context
) -> _Attempt:
    """Each member on the best node of the first group where it fits (one group: the best
    node anywhere in it)."""
    attempt = _Attempt({}, _Trial(ctx.nodes, ctx.policy_for, ctx.evaluate, ctx.base))
    for request in _order(members):
        chosen = None
        for names in groups:
            chosen, why = attempt.trial.best(request, names)
            if chosen is not None:
                break
            attempt.why = why or attempt.why
        if chosen is None:
            attempt.failed = request
            return attempt
        attempt.allocations[request.uid] = attempt.trial.take(request, chosen)
    return attempt


def _waste(attempt: _Attempt, nodes: Mapping[str, NodeState], measure: FragmentMeasure) -> float:
    return sum(
        _fragment(measure, after) - _fragment(measure, nodes[name])
        for name, after in attempt.trial.copies.items()
    )


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:.1f}"


class _Demand:
    """What the members need against what the candidate nodes have free, for reasons."""

    def __init__(self, members: Sequence[PodRequest], nodes: Mapping[str, NodeState]) -> None:
        self.count = len(members)
        self.gpus = sum(r.gpu_demand for r in members)
        self.rdma = any(c.wants_rdma for r in members for c in r.containers)
        self.nodes = nodes

    def free(self, names: Iterable[str]) -> float:
        total = 0
        for name in names:
            node = self.nodes[name]
            if self.rdma and not node.inventory.nics:
                continue
            total += sum(
                core
                for core, gpu in zip(node.free_core, node.inventory.gpus, strict=True)
                if gpu.healthy
            )
        return total / UNITS_PER_DEVICE

    def need(self) -> str:
        what = f"{_number(self.gpus)} GPUs" if self.gpus else "devices"
        return f"{self.count} members need {what}{' with RDMA' if self.rdma else ''}"


def plan_gang(
    ask: GangAsk,
    nodes: Mapping[str, NodeState],
    *,
    label_of: LabelOf,
    policy_for: PolicyFor,
    measure: FragmentMeasure | None = None,
    evaluate: Evaluate | None = None,
) -> GangPlan | GangShortfall:
    """Place every member of `ask` on `nodes` (the usable candidates) at once, or say why
    not. Pure: `nodes` are read, never changed. `evaluate`, when given, judges nodes no
    member has touched yet (it must see `nodes` as they are)."""
    members = ask.members
    if not members:
        return GangPlan(ask.key, (), None, 0.0)
    if measure is None:
        measure = waste_measure(policy_for(members[0]), members, nodes.values())
    ctx = _Context(nodes, policy_for, measure, evaluate, {})
    names = sorted(nodes)
    demand = _Demand(members, nodes)
    topology = ask.topology
    label = topology.required or topology.preferred
    if label is None:
        return _whole(ask, [names], ctx, demand)
    domains: dict[str, list[str]] = {}
    for name in names:
        value = label_of(name, label)
        if value is not None:
            domains.setdefault(value, []).append(name)
    pinned = {label_of(node, label) for node in ask.placed}
    if topology.required is not None:
        if len(pinned) > 1 or None in pinned:
            return GangShortfall(
                ask.key,
                f"gang {ask.key}: members already placed are not in one {label} domain; "
                "delete them or the gang",
            )
        if pinned:
            (value,) = pinned
            domains = {value: domains[value]} if isinstance(value, str) and value in domains else {}
    plans = _per_domain(ask, domains, ctx, label)
    if plans:
        return min(plans, key=lambda p: (p.waste, len({a.node for a in p.allocations}), p.domain))
    if topology.required is not None:
        most = max((demand.free(d) for d in domains.values()), default=0.0)
        where = f"its {label} domain" if pinned else f"any one {label} domain"
        return GangShortfall(
            ask.key,
            f"gang {ask.key}: {demand.need()}, {_number(most)} free in {where}",
        )
    # preferred: as few domains as possible, those already used, then the roomiest first
    ranked = sorted(domains, key=lambda v: (v not in pinned, -demand.free(domains[v]), v))
    groups = [domains[v] for v in ranked]
    unlabelled = [n for n in names if label_of(n, label) is None]
    if unlabelled:
        groups.append(unlabelled)
    return _whole(ask, groups, ctx, demand)


def _per_domain(
    ask: GangAsk, domains: Mapping[str, list[str]], ctx: _Context, label: str
) -> list[GangPlan]:
    plans = []
    for value in sorted(domains)[:MAX_DOMAINS]:
        attempt = _place(ask.members, [domains[value]], ctx)
        if attempt.whole:
            waste = _waste(attempt, ctx.nodes, ctx.measure)
            plans.append(_plan(ask, attempt, f"{label}={value}", waste))
    return plans


def _plan(ask: GangAsk, attempt: _Attempt, domain: str | None, waste: float) -> GangPlan:
    allocations = tuple(attempt.allocations[r.uid] for r in ask.members)
    return GangPlan(ask.key, allocations, domain, waste)


def _whole(
    ask: GangAsk, groups: Sequence[Sequence[str]], ctx: _Context, demand: _Demand
) -> GangPlan | GangShortfall:
    attempt = _place(ask.members, groups, ctx)
    if attempt.whole:
        return _plan(ask, attempt, None, _waste(attempt, ctx.nodes, ctx.measure))
    free = demand.free(ctx.nodes)
    reason = f"gang {ask.key}: {demand.need()}, {_number(free)} free"
    if demand.gpus <= free and attempt.failed is not None:
        why = f": {attempt.why.reason}" if attempt.why is not None else ""
        reason += f", but not all fit together (no node left for {attempt.failed.key}{why})"
    return GangShortfall(ask.key, reason)
