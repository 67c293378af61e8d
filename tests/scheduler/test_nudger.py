"""The gang nudger against the simulated API server: every nudge changes the member, also
when it names the node the last one named (a patch that changes nothing would send
kube-scheduler no event, and the member would wait for its periodic flush)."""

from __future__ import annotations

from itertools import count

from scheduler_plugin.decisions.nudger import Nudger
from tessera import resources as rn
from tessera_testbed.apiserver import FakeApiServer
from tests.scheduler.helpers import client_for, gang_member


def test_a_second_nudge_to_the_same_node_still_changes_the_member(fake: FakeApiServer) -> None:
    created = fake.create("pods", gang_member("m-0", "g", 1))
    uid = created["metadata"]["uid"]
    ticks = count()
    nudger = Nudger(client_for(fake), clock=lambda: f"2026-11-29T12:00:0{next(ticks)}.000000+00:00")
    versions = [created["metadata"]["resourceVersion"]]
    for _ in range(2):  # the gang reserved on n1, timed out, reserved on n1 again
        nudger.send(("ml", "m-0", uid, "n1"))
        seen = fake.get("pods", "m-0", "ml")["metadata"]
        versions.append(seen["resourceVersion"])
        assert seen["annotations"][rn.GANG_RESERVED_ANNOTATION] == "n1"
    assert len(set(versions)) == 3, versions  # each nudge is an update kube-scheduler sees
    assert seen["annotations"][rn.GANG_NUDGED_ANNOTATION] == "2026-11-29T12:00:01.000000+00:00"
    assert (nudger.sent, nudger.failed) == (2, 0)


def test_a_nudge_for_a_member_replaced_under_the_same_name_is_refused(
    fake: FakeApiServer,
) -> None:
    fake.create("pods", gang_member("m-0", "g", 1))
    nudger = Nudger(client_for(fake))
    nudger.send(("ml", "m-0", "uid-of-an-older-pod", "n1"))  # the uid precondition holds
    assert (nudger.sent, nudger.failed) == (0, 1)
    annotations = fake.get("pods", "m-0", "ml")["metadata"].get("annotations") or {}
    assert rn.GANG_RESERVED_ANNOTATION not in annotations
