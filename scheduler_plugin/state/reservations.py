"""Gangs planned whole: each member's devices held (as assumed allocations in the state)
until it binds, the reservation times out, or the gang changes (tessera.gang.book)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from scheduler_plugin.state.part import Part, Shared
from scheduler_plugin.state.problems import Problems
from tessera.allocation import PodAllocation
from tessera.errors import StateError
from tessera.gang.book import Reservation, ReservationBook, Standing
from tessera.gang.min_resources import FreeTotals, min_resources_gap
from tessera.gang.plan import GangAsk, GangPlan, GangShortfall, LabelOf, plan_gang
from tessera.gang.spec import GangKey
from tessera.isolation import share_refusal
from tessera.node_placement import NoFit
from tessera.node_state import NodeState
from tessera.request import PodRequest


class Reservations(Part):
    """The reservation book, and the free totals a gang's minResources is judged against
    (one part of the state: state/cache.py says the lock rule)."""

    __slots__ = ("_book", "_free", "_problems")

    def __init__(self, shared: Shared, problems: Problems) -> None:
        super().__init__(shared)
        self._problems = problems
        self._book = ReservationBook()
        self._free = FreeTotals(self._cluster)

    def now(self) -> float:
        """The clock of reservations and of how long gang members wait (monotonic)."""
        return self._monotonic()

    def min_resources_gap(
        self, ask: GangAsk, trial: Mapping[str, NodeState] | None = None
    ) -> str | None:
        """Why the gang's `min_resources` are not free ("gang ns/name: minResources not
        free: ..."), or None: summed over the nodes that take pods (as they are, or as in
        `trial`, the usable nodes with some pods gone), with what the gang's own bound
        members hold counted free to it, as coscheduling counts it. Costs the nodes that
        changed since the last question, not every node."""
        if not ask.min_resources:
            return None
        with self._lock:
            nodes = self._cluster.nodes
            closed = self._problems.by_node()
            replaced = {
                name: node for name, node in (trial or {}).items() if node is not nodes.get(name)
            }
            released: dict[str, NodeState] = {}
            for uid in ask.bound:
                alloc = self._cluster.pods.get(uid)
                if alloc is None or alloc.node in closed:
                    continue
                node = released.get(alloc.node)
                if node is None:
                    node = released[alloc.node] = replaced.get(alloc.node, nodes[alloc.node]).copy()
                node.release(alloc)
            free = self._free.totals(
                leave_out=closed, replaced={**replaced, **released}, nvidia_gpu=True
            )
            gap = min_resources_gap(ask.min_resources, free)
            return None if gap is None else f"gang {ask.key}: {gap}"

    def reserve(
        self,
        ask: GangAsk,
        timeout: float,
        *,
        names: Collection[str] | None = None,
        label_of: LabelOf,
    ) -> GangPlan | GangShortfall:
        """Plan `ask` on the usable nodes (of `names`, when given) and hold the plan's
        devices for its members, all at once, or say what is missing: its minResources
        first (over every usable node, whatever `names`), then room for each member.
        Nothing is held unless every member fits."""
        with self._lock:
            if self._book.get(ask.key) is not None:
                return GangShortfall(ask.key, f"gang {ask.key} is already reserved")
            gap = self.min_resources_gap(ask)
            if gap is not None:
                return GangShortfall(ask.key, gap)
            problems = self._problems.by_node()
            usable = {
                n: s
                for n, s in self._cluster.nodes.items()
                if n not in problems and (names is None or n in names)
            }
            result = plan_gang(
                ask,
                usable,
                label_of=label_of,
                policy_for=self._decider.policy_for,
                evaluate=self._evaluate,
            )
            if isinstance(result, GangShortfall):
                return result
            added: list[str] = []
            try:
                for alloc in result.allocations:
                    self._cluster.add(alloc, assumed=True)
                    added.append(alloc.pod_uid)
            except StateError as exc:  # a member already holds devices: plan void
                for uid in added:
                    self._cluster.remove(uid)
                return GangShortfall(ask.key, f"gang {ask.key}: {exc}")
            self._book.reserve(result, self._monotonic(), timeout)
            return result

    def _evaluate(
        self, request: PodRequest, names: Sequence[str]
    ) -> tuple[Mapping[str, float], Mapping[str, NoFit]]:
        evaluation = self._decider.evaluate(request, names)
        return evaluation.scores, evaluation.failures

    def holds(self, uid: str) -> bool:
        """Whether a reservation holds devices for the pod."""
        with self._lock:
            return self._book.reserved(uid)

    def take(self, uid: str, node: str) -> PodAllocation | None:
        """The member's reserved allocation, or None; taken out of its reservation (its bind
        starts) when it is on `node`."""
        with self._lock:
            reserved = self._book.allocation(uid)
            if reserved is not None and reserved.node == node:
                self._book.taken(uid)
            return reserved

    def release(self, key: GangKey, now: float | None = None) -> list[PodAllocation]:
        """End a gang's reservation; the allocations its members held (the caller frees
        them in the state: Cache.release_gang)."""
        with self._lock:
            return self._book.release(key, self._monotonic() if now is None else now)

    def layer_refusal(self, uid: str) -> str | None:
        """Why the member's reserved devices may not be bound now: they give a GPU share on
        a node whose isolation layer went down since the gang was planned (None: they may;
        the plan itself puts no share on such a node)."""
        with self._lock:
            alloc = self._book.allocation(uid)
            node = None if alloc is None else self._cluster.nodes.get(alloc.node)
            if alloc is None or node is None or not any(c.shares for c in alloc.containers):
                return None
            return share_refusal(node.inventory.isolation)

    def reserved_node(self, uid: str) -> str | None:
        """The node a gang member's reservation keeps for it, or None."""
        with self._lock:
            alloc = self._book.allocation(uid)
            return None if alloc is None else alloc.node

    def reservation(self, key: GangKey) -> Reservation | None:
        with self._lock:
            return self._book.get(key)

    def standing(self, key: GangKey) -> Standing:
        with self._lock:
            return self._book.standing(key, self._monotonic())

    def may_plan(self, key: GangKey, now: float | None = None) -> bool:
        """Not reserved, and not released too recently (ReservationBook.may_plan)."""
        with self._lock:
            return self._book.may_plan(key, self._monotonic() if now is None else now)

    def expired(self, now: float | None = None) -> list[GangKey]:
        with self._lock:
            return self._book.expired(self._monotonic() if now is None else now)

    def all(self) -> list[Reservation]:
        with self._lock:
            return self._book.gangs()
