"""Gangs planned whole: each member's devices held (as assumed allocations in the state)
until it binds, the reservation times out, or the gang changes (tessera.gang.book)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from scheduler_plugin.state.part import Part, Shared
from scheduler_plugin.state.problems import Problems
from tessera.allocation import PodAllocation
from tessera.errors import StateError
from tessera.gang.book import Reservation, ReservationBook, Standing
from tessera.gang.plan import GangAsk, GangPlan, GangShortfall, LabelOf, plan_gang
from tessera.gang.spec import GangKey
from tessera.node_placement import NoFit
from tessera.request import PodRequest


class Reservations(Part):
    """The reservation book (one part of the state: state/cache.py says the lock rule)."""

    __slots__ = ("_book", "_problems")

    def __init__(self, shared: Shared, problems: Problems) -> None:
        super().__init__(shared)
        self._problems = problems
        self._book = ReservationBook()

    def reserve(
        self,
        ask: GangAsk,
        timeout: float,
        *,
        names: Collection[str] | None = None,
        label_of: LabelOf,
    ) -> GangPlan | GangShortfall:
        """Plan `ask` on the usable nodes (of `names`, when given) and hold the plan's
        devices for its members, all at once, or say what is missing. Nothing is held
        unless every member fits."""
        with self._lock:
            if self._book.get(ask.key) is not None:
                return GangShortfall(ask.key, f"gang {ask.key} is already reserved")
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
