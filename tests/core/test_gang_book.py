"""Reservations and the roster: pure bookkeeping of gangs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera import resources as rn
from tessera.allocation import PodAllocation
from tessera.gang.book import ReservationBook, Standing
from tessera.gang.plan import GangPlan
from tessera.gang.roster import GangRoster, Member, Ready, Waiting
from tessera.gang.spec import GangKey, GangSpec, GangTopology
from tessera.request import PodRequest, parse_pod
from tests.core.builders import pod

A = GangKey("ml", "a")
B = GangKey("ml", "b")


def alloc(uid: str, node: str = "n0") -> PodAllocation:
    return PodAllocation(pod_uid=uid, namespace="ml", name=uid, node=node, containers=())


def plan(key: GangKey, *uids: str) -> GangPlan:
    return GangPlan(key, tuple(alloc(u) for u in uids), None, 0.0)


def test_a_reservation_holds_each_member_until_it_binds() -> None:
    book = ReservationBook(retry_after=5)
    book.reserve(plan(A, "a0", "a1"), now=0, timeout=60)
    assert book.allocation("a0") == alloc("a0")
    assert book.reserved("a1") and not book.reserved("zz")
    assert book.taken("a0") == alloc("a0")
    assert book.taken("a0") is None
    assert not book.reserved("a0")
    assert book.get(A) is not None
    book.taken("a1")
    assert book.get(A) is None  # used up: nothing left to release
    assert book.release(A, now=1) == []
    assert book.may_plan(A, now=1)


def test_an_expired_reservation_is_released_and_the_gang_waits_before_retrying() -> None:
    book = ReservationBook(retry_after=5)
    book.reserve(plan(A, "a0", "a1"), now=0, timeout=60)
    book.reserve(plan(B, "b0"), now=10, timeout=60)
    assert book.expired(59.9) == []
    assert book.expired(60) == [A]
    book.taken("a0")
    assert book.release(A, now=60) == [alloc("a1")]
    assert not book.reserved("a1")
    assert not book.may_plan(A, now=64)
    assert book.may_plan(A, now=65)
    assert not book.may_plan(B, now=65)  # still reserved


def test_one_reservation_per_gang_and_per_pod() -> None:
    book = ReservationBook()
    book.reserve(plan(A, "a0"), now=0, timeout=1)
    with pytest.raises(ValueError, match="already reserved"):
        book.reserve(plan(A, "a1"), now=0, timeout=1)
    with pytest.raises(ValueError, match="already reserved"):
        book.reserve(plan(B, "a0"), now=0, timeout=1)


@given(st.lists(st.tuples(st.sampled_from("rtxe"), st.integers(0, 5)), max_size=40))
def test_the_book_never_loses_or_duplicates_a_member(ops: list[tuple[str, int]]) -> None:
    book = ReservationBook(retry_after=1)
    held: dict[str, GangKey] = {}
    now = 0.0
    for op, i in ops:
        key = GangKey("ml", f"g{i % 3}")
        now += 1
        if op == "r" and book.may_plan(key, now):
            uids = [f"{key.name}-{now}-{k}" for k in range(i % 3 + 1)]
            book.reserve(plan(key, *uids), now, timeout=3)
            held.update(dict.fromkeys(uids, key))
        elif op == "t" and held:
            uid = sorted(held)[i % len(held)]
            assert book.taken(uid) is not None
            del held[uid]
        elif op == "x":
            for a in book.release(key, now):
                assert held.pop(a.pod_uid) == key
        elif op == "e":
            for k in book.expired(now):
                for a in book.release(k, now):
                    assert held.pop(a.pod_uid) == k
        assert {u for u in held if book.reserved(u)} == set(held)
        assert sum(len(r.members) for r in book.gangs()) == len(held)


def request(name: str) -> PodRequest:
    return parse_pod(pod(name, {"main": {rn.GPU: "800"}}))


def member(name: str, key: GangKey = A, node: str = "", **kw: object) -> Member:
    fields: dict[str, object] = {"request": request(name), "topology": GangTopology()}
    fields.update(kw)
    return Member(f"uid-{name}", name, key, node, **fields)  # type: ignore[arg-type]


def test_readiness_names_what_the_gang_waits_for() -> None:
    roster = GangRoster()
    roster.member_seen(member("p0"), now=0.0)
    assert roster.readiness(A) == Waiting("gang ml/a: waiting for its PodGroup ml/a")
    roster.spec_seen(A, "PodGroup ml/a: spec.minMember must be an integer, got str")
    assert "minMember must be an integer" in roster.readiness(A).reason  # type: ignore[union-attr]
    roster.spec_seen(A, GangSpec(A, 3, 60))
    assert roster.readiness(A) == Waiting("gang ml/a: 1 of 3 members pending")
    roster.member_seen(member("p1"), now=0.0)
    roster.member_seen(member("p2", node="n1"), now=0.0)
    ready = roster.readiness(A)
    assert isinstance(ready, Ready)
    assert [r.name for r in ready.pending] == ["p0", "p1"]
    assert ready.placed == ("n1",)
    roster.member_seen(member("p1", problem="invalid device request: bad"), now=0.0)
    assert roster.readiness(A) == Waiting("gang ml/a: member ml/p1: invalid device request: bad")
    roster.member_seen(member("p1", topology=GangTopology("rack")), now=0.0)
    assert "disagree" in roster.readiness(A).reason  # type: ignore[union-attr]
    assert roster.member_gone("uid-p1") == A
    assert roster.readiness(A) == Waiting("gang ml/a: 2 of 3 members pending")


def test_members_without_devices_count_but_are_not_placed() -> None:
    roster = GangRoster()
    roster.spec_seen(A, GangSpec(A, 2, 60))
    roster.member_seen(member("launcher", request=None), now=0.0)
    roster.member_seen(member("worker"), now=0.0)
    ready = roster.readiness(A)
    assert isinstance(ready, Ready)
    assert [r.name for r in ready.pending] == ["worker"]


def test_a_member_that_moves_gangs_leaves_the_first() -> None:
    roster = GangRoster()
    roster.member_seen(member("p0"), now=0.0)
    roster.member_seen(member("p0", key=B), now=0.0)
    assert roster.members(A) == []
    assert roster.key_of("uid-p0") == B
    changed = roster.members_replaced([member("p1")], now=0.0)
    assert changed == {A, B}
    assert roster.keys() == [A]


def test_standing_says_reserved_with_time_left_released_with_retry_or_none() -> None:
    book = ReservationBook(retry_after=5)
    assert book.standing(A, now=0) == Standing("none")
    book.reserve(GangPlan(A, (alloc("a0", "n1"), alloc("a1", "n0")), None, 0.0), 0, 60)
    assert book.standing(A, now=20) == Standing("reserved", 40.0, ("n0", "n1"))
    assert book.standing(A, now=70).seconds == 0.0  # past due, not yet released
    book.taken("a0")
    assert book.standing(A, now=21).nodes == ("n0",)
    book.release(A, now=30)
    assert book.standing(A, now=32) == Standing("released", 3.0)
    assert book.standing(A, now=35) == Standing("none")
    assert book.standing(B, now=32) == Standing("none")


# --- how long members wait -------------------------------------------------------------------


def test_a_gang_is_past_its_timeout_once_a_member_waited_unbound_longer() -> None:
    roster = GangRoster()
    roster.spec_seen(A, GangSpec(A, 2, 60))
    roster.member_seen(member("p0"), now=100.0)
    roster.member_seen(member("p1"), now=130.0)
    roster.member_seen(member("p0"), now=150.0)  # seen again: still waiting since 100
    assert roster.waiting_since(A) == 100.0
    assert roster.past_timeout(160.0, default_timeout=10) == []  # 60 s exactly: not past
    assert roster.past_timeout(160.5, default_timeout=10) == [A]
    roster.member_seen(member("p0", node="n1"), now=170.0)  # p0 bound: p1 waits since 130
    assert roster.waiting_since(A) == 130.0
    assert roster.past_timeout(190.0, default_timeout=10) == []
    assert roster.past_timeout(190.5, default_timeout=10) == [A]
    roster.member_seen(member("p1", node="n2"), now=200.0)  # all bound
    assert roster.waiting_since(A) is None
    assert roster.past_timeout(10_000.0, default_timeout=10) == []
    roster.member_gone("uid-p1")
    roster.member_seen(member("p2"), now=300.0)  # a member created again waits afresh
    assert roster.waiting_since(A) == 300.0
    roster.member_gone("uid-p2")
    assert roster.past_timeout(10_000.0, default_timeout=10) == []


def test_a_gang_without_a_usable_podgroup_is_judged_by_the_default_timeout() -> None:
    roster = GangRoster()
    roster.member_seen(member("p0"), now=0.0)  # no PodGroup
    roster.member_seen(member("q0", key=B), now=0.0)
    roster.spec_seen(B, "PodGroup ml/b: spec.minMember must be an integer, got str")
    assert roster.past_timeout(30.0, default_timeout=30) == []
    assert roster.past_timeout(31.0, default_timeout=30) == [A, B]


def test_a_relist_keeps_the_wait_of_members_still_pending() -> None:
    roster = GangRoster()
    roster.member_seen(member("p0"), now=0.0)
    roster.member_seen(member("p1"), now=5.0)
    roster.members_replaced([member("p1"), member("p2")], now=50.0)
    assert roster.waiting_since(A) == 5.0
    roster.members_replaced([member("p2")], now=60.0)
    assert roster.waiting_since(A) == 50.0
    roster.members_replaced([member("p2", node="n1")], now=70.0)
    assert roster.waiting_since(A) is None


_EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["pending", "bound", "gone", "relist"]),
        st.sampled_from(["p0", "p1", "p2", "q0"]),
        st.floats(0, 50),
    ),
    max_size=30,
)


@given(_EVENTS, st.floats(0, 2000))
def test_past_timeout_is_what_the_history_of_each_member_says(
    events: list[tuple[str, str, float]], extra: float
) -> None:
    """Against a model kept from the whole history: a member waits since the first time it
    was shown pending after last being bound, gone or never seen; a gang is past its
    timeout when one of its waiting members waited longer."""
    roster = GangRoster()
    roster.spec_seen(A, GangSpec(A, 1, 100))  # B has no PodGroup: the default, 40
    live: dict[str, bool] = {}  # name -> pending
    since: dict[str, float] = {}
    now = 0.0
    for kind, name, step in events:
        now += step
        key = B if name.startswith("q") else A
        if kind == "gone":
            roster.member_gone(f"uid-{name}")
            live.pop(name, None)
            since.pop(name, None)
        elif kind == "relist":
            roster.members_replaced(
                [
                    member(n, B if n.startswith("q") else A, "" if p else "n")
                    for n, p in live.items()
                ],
                now=now,
            )
        else:
            pending = kind == "pending"
            roster.member_seen(member(name, key, "" if pending else "n"), now=now)
            live[name] = pending
            if pending:
                since.setdefault(name, now)
            else:
                since.pop(name, None)
    now += extra
    timeouts = {A: 100, B: 40}
    expected = sorted(
        {
            key
            for name, t in since.items()
            if now - t > timeouts[key := B if name.startswith("q") else A]
        }
    )
    assert roster.past_timeout(now, default_timeout=40) == expected
