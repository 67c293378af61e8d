from __future__ import annotations

import pytest

from deviceplugin.health import DEFAULT_IGNORED_XIDS, HealthTracker, XidPolicy, parse_xid_list


def test_unhealthy_until_a_quiet_period_of_normal_answers() -> None:
    t = HealthTracker(quiet_period_s=10)
    assert t.mark_unhealthy("g", "XID 79", now=0)
    assert t.status("g") == (False, "XID 79")
    assert not t.observe_ok("g", now=9.9)
    assert t.status("g")[0] is False
    assert t.observe_ok("g", now=10)
    assert t.status("g") == (True, "")


def test_a_bad_answer_during_the_quiet_period_restarts_it() -> None:
    t = HealthTracker(quiet_period_s=10)
    t.mark_unhealthy("g", "XID 79", now=0)
    assert not t.mark_unhealthy("g", "NVML query failed: GPU is lost", now=7)
    assert t.status("g") == (False, "XID 79")  # the first cause is kept
    assert not t.observe_ok("g", now=12)
    assert t.observe_ok("g", now=17)


def test_zero_quiet_period_never_recovers() -> None:
    t = HealthTracker(quiet_period_s=0)
    t.mark_unhealthy("g", "XID 48", now=0)
    assert not t.observe_ok("g", now=1e9)
    assert t.status("g")[0] is False


def test_healthy_devices_stay_healthy_and_unknown_ones_are_healthy() -> None:
    t = HealthTracker(quiet_period_s=5)
    t.track(["a", "b"])
    assert not t.observe_ok("a", now=1)
    assert t.status("zzz") == (True, "")
    t.mark_unhealthy("b", "x", now=0)
    assert t.unhealthy() == {"b": "x"}


def test_negative_quiet_period_is_refused() -> None:
    with pytest.raises(ValueError):
        HealthTracker(quiet_period_s=-1)


def test_default_policy_skips_application_xids() -> None:
    policy = XidPolicy()
    for xid in (13, 31, 43, 45, 68, 109):
        assert not policy.is_critical(xid)
    for xid in (48, 62, 64, 74, 79, 94, 95, 0):
        assert policy.is_critical(xid)
    assert frozenset({13, 31, 43, 45, 68, 109}) == DEFAULT_IGNORED_XIDS
    assert not XidPolicy(enabled=False).is_critical(79)
    assert XidPolicy(ignored=frozenset()).is_critical(13)


def test_xid_lists() -> None:
    assert parse_xid_list("13, 31,43") == {13, 31, 43}
    assert parse_xid_list("none") == frozenset()
    assert parse_xid_list("") == frozenset()
    with pytest.raises(ValueError, match="not an XID"):
        parse_xid_list("13,abc")
