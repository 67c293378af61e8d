"""Reservations: a planned gang's devices, held for its members until they bind.

A reservation keeps, per member not bound yet, the node and allocation its plan chose;
the scheduler holds those allocations in its state (so no other pod takes them) and
answers each member's filter with its node. A member that binds leaves the reservation
(its allocation is then an ordinary bind's); the reservation ends when none is left. One
not used up by its deadline is released, and the gang is not planned again until
`retry_after` seconds later, so that a gang whose members cannot bind (kube-scheduler
refusing the node for reasons of its own) does not hold devices for ever.

Pure bookkeeping: the caller passes the time, and applies what these methods return to
its state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.allocation import PodAllocation
from tessera.gang.plan import GangPlan
from tessera.gang.spec import GangKey

DEFAULT_RETRY_AFTER = 10.0


@dataclass(frozen=True, slots=True)
class Standing:
    """Where a gang stands in the book, for display: reserved (and for how long yet),
    released (and when it may be planned again), or neither."""

    state: str
    """"reserved", "released" or "none"."""
    seconds: float | None = None
    """Reserved: until the deadline; released: until it may be planned again."""
    nodes: tuple[str, ...] = ()
    """Reserved: the nodes held for members not bound yet."""


@dataclass
class Reservation:
    key: GangKey
    deadline: float
    members: dict[str, PodAllocation] = field(default_factory=dict)
    """Member UID -> its reserved allocation, for members not bound yet."""


class ReservationBook:
    def __init__(self, retry_after: float = DEFAULT_RETRY_AFTER) -> None:
        self.retry_after = retry_after
        self._gangs: dict[GangKey, Reservation] = {}
        self._of_member: dict[str, GangKey] = {}
        self._retry_at: dict[GangKey, float] = {}

    def __len__(self) -> int:
        return len(self._gangs)

    def reserve(self, plan: GangPlan, now: float, timeout: float) -> Reservation:
        """Book a plan (the caller has applied its allocations). A gang holds at most one."""
        if plan.key in self._gangs:
            raise ValueError(f"gang {plan.key} is already reserved")
        taken = [a.pod_uid for a in plan.allocations if a.pod_uid in self._of_member]
        if taken:
            raise ValueError(f"pods {taken} are already reserved")
        reservation = Reservation(plan.key, now + timeout)
        for alloc in plan.allocations:
            reservation.members[alloc.pod_uid] = alloc
            self._of_member[alloc.pod_uid] = plan.key
        self._gangs[plan.key] = reservation
        self._retry_at.pop(plan.key, None)
        return reservation

    def get(self, key: GangKey) -> Reservation | None:
        return self._gangs.get(key)

    def allocation(self, uid: str) -> PodAllocation | None:
        """The reserved allocation of a member not bound yet."""
        key = self._of_member.get(uid)
        return None if key is None else self._gangs[key].members[uid]

    def reserved(self, uid: str) -> bool:
        return uid in self._of_member

    def taken(self, uid: str) -> PodAllocation | None:
        """A member's bind starts on its reserved node: it leaves the reservation (its
        allocation stays in the caller's state as the bind's)."""
        key = self._of_member.pop(uid, None)
        if key is None:
            return None
        reservation = self._gangs[key]
        alloc = reservation.members.pop(uid)
        if not reservation.members:
            del self._gangs[key]
        return alloc

    def release(self, key: GangKey, now: float) -> list[PodAllocation]:
        """End a gang's reservation (timeout, a member gone): the allocations to free. The
        gang may be planned again `retry_after` seconds from `now`."""
        reservation = self._gangs.pop(key, None)
        if reservation is None:
            return []
        for uid in reservation.members:
            del self._of_member[uid]
        self._retry_at[key] = now + self.retry_after
        return list(reservation.members.values())

    def expired(self, now: float) -> list[GangKey]:
        return sorted(k for k, r in self._gangs.items() if r.deadline <= now)

    def may_plan(self, key: GangKey, now: float) -> bool:
        """Not reserved, and not released less than `retry_after` ago."""
        if key in self._gangs:
            return False
        retry = self._retry_at.get(key)
        if retry is None:
            return True
        if now >= retry:
            del self._retry_at[key]
            return True
        return False

    def standing(self, key: GangKey, now: float) -> Standing:
        reservation = self._gangs.get(key)
        if reservation is not None:
            nodes = tuple(sorted({a.node for a in reservation.members.values()}))
            return Standing("reserved", max(reservation.deadline - now, 0.0), nodes)
        retry = self._retry_at.get(key)
        if retry is not None and retry > now:
            return Standing("released", retry - now)
        return Standing("none")

    def forget(self, key: GangKey) -> None:
        """The gang is gone: no retry time is kept for it (release its reservation first)."""
        self._retry_at.pop(key, None)

    def gangs(self) -> list[Reservation]:
        return [self._gangs[k] for k in sorted(self._gangs)]
