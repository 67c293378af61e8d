"""Leader election on a coordination.k8s.io/v1 Lease, against the simulated API server."""

from __future__ import annotations

from typing import Any

import pytest

from kube_edge.client import KubeClient
from kube_edge.leader import LeaderElector
from tessera_testbed.apiserver import FakeApiServer


def client_for(fake: FakeApiServer) -> KubeClient:
    return KubeClient.for_host(fake.url, timeout=5)


def elector(fake: FakeApiServer, identity: str, clock: list[float], **kw: Any) -> LeaderElector:
    return LeaderElector(
        client_for(fake),
        "tessera-system",
        "tessera-scheduler",
        identity,
        lease_duration=10,
        renew_deadline=6,
        retry_period=1,
        clock=lambda: clock[0],
        **kw,
    )


def test_one_leader_takeover_after_expiry_and_on_release(fake: FakeApiServer) -> None:
    clock = [100.0]
    a, b = elector(fake, "a", clock), elector(fake, "b", clock)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    clock[0] += 5
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    # a stops renewing; b takes over only once the lease has not changed for its duration
    clock[0] += 9
    assert not b.try_acquire_or_renew()
    assert not a.leading  # a's renew deadline has passed: it stopped answering first
    clock[0] += 2
    assert b.try_acquire_or_renew() and b.leading
    lease = fake.get("leases", "tessera-scheduler", "tessera-system")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew() and not a.is_leader
    # release hands over at once
    b.release()
    assert a.try_acquire_or_renew()


def test_a_lost_update_race_makes_no_second_leader(fake: FakeApiServer) -> None:
    clock = [0.0]
    a, b = elector(fake, "a", clock), elector(fake, "b", clock)
    assert a.try_acquire_or_renew()
    a.release()
    fake.fail("/leases/tessera-scheduler", method="PUT", status=409)
    assert not b.try_acquire_or_renew()
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()


def test_the_lease_is_a_coordination_v1_lease_with_client_go_fields(fake: FakeApiServer) -> None:
    clock = [0.0]
    changes: list[bool] = []
    a = elector(fake, "a", clock, on_change=changes.append)
    assert a.try_acquire_or_renew()
    lease = fake.get("leases", "tessera-scheduler", "tessera-system")
    assert lease["apiVersion"] == "coordination.k8s.io/v1" and lease["kind"] == "Lease"
    spec = lease["spec"]
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 10
    assert spec["acquireTime"].endswith("Z") and spec["renewTime"].endswith("Z")
    a.release()
    spec = fake.get("leases", "tessera-scheduler", "tessera-system")["spec"]
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
    assert changes == [True, False]


def test_an_unreachable_api_server_ends_leadership_only_after_the_renew_deadline(
    fake: FakeApiServer,
) -> None:
    clock = [0.0]
    a = elector(fake, "a", clock)
    assert a.try_acquire_or_renew()
    fake.fail("/leases/tessera-scheduler", method="GET", status=500, times=100)
    clock[0] += 5
    assert a.try_acquire_or_renew() and a.leading  # within the renew deadline (6 s)
    clock[0] += 2
    assert not a.try_acquire_or_renew() and not a.leading


def test_renew_deadline_must_be_shorter_than_the_lease(fake: FakeApiServer) -> None:
    with pytest.raises(ValueError, match="renew_deadline"):
        LeaderElector(client_for(fake), "ns", "l", "a", lease_duration=5, renew_deadline=5)
