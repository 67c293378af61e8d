"""`kubectl tessera gangs` and `explain` of a gang member, against the simulated API
server; the reason of a complete gang is the one the real tessera-scheduler gave."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from kubectl_tessera.cli import main
from kubectl_tessera.gangs import recorded_reason, render_rows, rows
from tessera import resources as rn
from tessera.gang.spec import GangKey
from tessera_testbed.apiserver import FakeApiServer
from tests.kubectl.conftest import add_node
from tests.kubectl.test_cli import run, run_json
from tests.scheduler.helpers import gang_member, pod_group, serving, wait_for


def _recorded(fake: FakeApiServer, obj: dict[str, Any], reply: dict[str, Any]) -> None:
    """Write the PodScheduled condition kube-scheduler records from a filter answer."""
    failed = reply["FailedNodes"] | reply["FailedAndUnresolvableNodes"]
    reasons = sorted(set(failed.values()))
    message = f"0/{len(failed)} nodes are available: " + ", ".join(
        f"{sum(1 for v in failed.values() if v == r)} {r}" for r in reasons
    )
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message + ". preemption: 0/1 nodes are available: 1 No preemption victims.",
    }
    name = obj["metadata"]["name"]
    fake.patch("pods", name, {"status": {"conditions": [condition]}}, namespace="ml", sub="status")


def _gangs(fake: FakeApiServer) -> None:
    add_node(fake, "t4", "t4-4x")  # 4 whole GPUs
    fake.create("podgroups", pod_group("llama", 3))
    fake.create("podgroups", pod_group("huge", 2))
    fake.create("podgroups", pod_group("bad", 2) | {"spec": {"minMember": "two"}})
    for i in range(2):
        fake.create("pods", gang_member(f"llama-{i}", "llama", 1))
        fake.create("pods", gang_member(f"huge-{i}", "huge", 3))
    fake.create("pods", gang_member("bad-0", "bad", 1))
    fake.create("pods", gang_member("orphan-0", "orphan", 1))
    fake.create("pods", gang_member("other-0", "llama", 1, namespace="team"))


def test_gangs_lists_each_gang_with_its_state_and_reason(
    fake: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _gangs(fake)
    with serving(fake) as served:
        gangs = served.service.gangs
        assert gangs is not None
        wait_for(lambda: gangs.key_of(fake.get("pods", "huge-1", "ml")["metadata"]["uid"]))
        huge = fake.get("pods", "huge-0", "ml")
        reply = served.filter(huge, ["t4"])
        assert not reply["NodeNames"]
    _recorded(fake, huge, reply)
    doc = run_json(capsys, "gangs", "-n", "ml", "--kubeconfig", kubeconfig)
    listed = {g["gang"]: g for g in doc["gangs"]}
    assert sorted(listed) == ["ml/bad", "ml/huge", "ml/llama", "ml/orphan"]
    llama = listed["ml/llama"]
    assert (llama["min_member"], llama["members"], llama["pending"], llama["bound"]) == (3, 2, 2, 0)
    assert (
        llama["state"] == "waiting" and llama["reason"] == "gang ml/llama: 2 of 3 members pending"
    )
    assert llama["pending_members"] == ["llama-0", "llama-1"]
    # complete: the scheduler's own words, as kube-scheduler recorded them
    assert listed["ml/huge"]["reason"] == "gang ml/huge: 2 members need 6 GPUs, 4 free"
    assert listed["ml/huge"]["state"] == "waiting"
    assert listed["ml/orphan"]["min_member"] is None
    assert listed["ml/orphan"]["reason"] == "gang ml/orphan: waiting for its PodGroup ml/orphan"
    assert "minMember must be an integer" in listed["ml/bad"]["reason"]
    code, out, _ = run(capsys, "gangs", "-n", "ml", "--kubeconfig", kubeconfig)
    assert code == 0
    header, *lines = out.splitlines()
    columns = "NAMESPACE GANG MIN PENDING BOUND STATE WAITED WAITING REASON"
    assert header.split() == columns.split()
    (huge_line,) = [line for line in lines if line.split()[1] == "huge"]
    assert huge_line.split()[2:6] == ["2", "2", "0", "waiting"]
    assert re.search(r"huge-0, huge-1\s{3,}2 members need 6 GPUs, 4 free$", huge_line)
    everywhere = run_json(capsys, "gangs", "-A", "--kubeconfig", kubeconfig)
    assert "team/llama" in {g["gang"] for g in everywhere["gangs"]}


def test_gangs_show_bound_and_reserved_gangs_and_print_without_the_crd(
    fake: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    add_node(fake, "t4", "t4-4x")
    fake.create("podgroups", pod_group("pair", 2))
    fake.create("podgroups", pod_group("trio", 2))
    members = [fake.create("pods", gang_member(f"pair-{i}", "pair", 1)) for i in range(2)]
    trio = [fake.create("pods", gang_member(f"trio-{i}", "trio", 1)) for i in range(2)]
    with serving(fake) as served:
        gangs = served.service.gangs
        assert gangs is not None
        wait_for(lambda: gangs.key_of(trio[1]["metadata"]["uid"]))
        for obj in members:
            (node,) = served.filter(obj, ["t4"])["NodeNames"]
            assert served.bind(obj, node) == ""
        # the other gang is reserved once one member's filter plans it
        assert served.filter(trio[0], ["t4"])["NodeNames"] == ["t4"]
        assert served.cache.reservations.reserved_node(trio[1]["metadata"]["uid"]) == "t4"
    # kube-scheduler recorded the reason a member heard while the gang was being reserved
    fake.patch(
        "pods",
        "trio-1",
        {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "message": "0/1 nodes are available: 1 tessera: gang ml/trio: "
                        "reserved, waiting for its members to bind.",
                    }
                ]
            }
        },
        namespace="ml",
        sub="status",
    )
    listed = {
        g["gang"]: g
        for g in run_json(capsys, "gangs", "-n", "ml", "--kubeconfig", kubeconfig)["gangs"]
    }
    assert listed["ml/pair"]["state"] == "bound" and listed["ml/pair"]["bound"] == 2
    assert listed["ml/pair"]["reason"] == ""
    assert listed["ml/trio"]["state"] == "reserved"
    # no PodGroup CRD (404): the members still print, each gang waiting for its PodGroup
    fake.fail("/podgroups", status=404)
    listed = {
        g["gang"]: g
        for g in run_json(capsys, "gangs", "-n", "ml", "--kubeconfig", kubeconfig)["gangs"]
    }
    assert listed["ml/trio"]["reason"] == "gang ml/trio: waiting for its PodGroup ml/trio"


def test_explain_of_a_member_says_it_waits_for_its_gang_and_why(
    fake: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _gangs(fake)
    code, out, _ = run(capsys, "explain", "llama-0", "-n", "ml", "--kubeconfig", kubeconfig)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "Pod ml/llama-0: 1 container(s) ask for tessera devices"
    assert lines[1] == (
        "Waits for its gang ml/llama (waiting; 2 pending, 0 bound, minMember 3): "
        "2 of 3 members pending"
    )
    assert "# a gang is placed whole or not at all" in out
    doc = run_json(capsys, "explain", "llama-0", "-n", "ml", "--kubeconfig", kubeconfig)
    assert doc["gang"]["reason"] == "gang ml/llama: 2 of 3 members pending"
    # a pod in no gang has none
    assert main(["explain", "other-0", "-n", "team", "--kubeconfig", kubeconfig]) == 0
    assert "Waits for its gang team/llama" in capsys.readouterr().out
    fake.create(
        "pods", gang_member("solo", "x", 1) | {"metadata": {"name": "solo", "namespace": "ml"}}
    )
    assert "gang" not in run(capsys, "explain", "solo", "-n", "ml", "--kubeconfig", kubeconfig)[1]


@pytest.mark.parametrize(
    "status",
    [
        None,
        {"conditions": "x"},
        {"conditions": [None, 7, {"type": "PodScheduled", "message": ["x"]}]},
        {"conditions": [{"type": "PodScheduled", "message": "gang ml/g: " + "y" * 9000}]},
        {"conditions": [{"type": "PodScheduled", "message": "gang ml/other: not ours"}]},
    ],
)
def test_a_hostile_condition_reads_as_a_bounded_reason_or_none(status: Any) -> None:
    reason = recorded_reason({"status": status}, GangKey("ml", "g"))
    assert len(reason) <= 512
    assert "not ours" not in reason


def test_hostile_gang_objects_are_skipped_or_explained() -> None:
    groups = [
        {"metadata": {"name": "Bad Name", "namespace": "ml"}},
        {"metadata": {"name": "g", "namespace": "ml"}, "spec": {"minMember": 10**9}},
        "not an object",
    ]
    pods = [
        gang_member("a", "g", 1),
        gang_member("b", "Not A Name", 1),  # names no PodGroup: not a member
        gang_member("c", "g", 1) | {"status": {"phase": "Succeeded"}},  # finished
    ]
    for obj in pods:
        obj["metadata"]["uid"] = "uid-" + obj["metadata"]["name"]
    (row,) = rows(groups, pods, nvidia_gpu=False, now=NOW)  # type: ignore[arg-type]
    assert row.key == "ml/g" and row.members == 1 and row.min_member is None
    assert "minMember" in row.reason


NOW = 1_800_000_000.0
"""A fixed reading of the clock for the wait tests (2027-01-15T08:00:00Z)."""


def _created(obj: dict[str, Any], seconds_ago: float | None, stamp: Any = None) -> dict[str, Any]:
    obj["metadata"]["uid"] = "uid-" + obj["metadata"]["name"]
    if seconds_ago is not None:
        when = datetime.fromtimestamp(NOW - seconds_ago, tz=UTC)
        stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    obj["metadata"]["creationTimestamp"] = stamp
    return obj


def test_each_gang_says_how_long_its_oldest_pending_member_waited_and_if_past_its_timeout() -> None:
    timed = {"spec": {"minMember": 2, "scheduleTimeoutSeconds": 30}}
    groups = [
        pod_group("late", 2) | timed,
        pod_group("young", 2) | timed,
        pod_group("done", 1),
        pod_group("defaulted", 3),
    ]
    bound = gang_member("done-0", "done", 1)
    bound["spec"]["nodeName"] = "t4"
    pods = [
        _created(gang_member("late-0", "late", 1), 45),
        _created(gang_member("late-1", "late", 1), 5),  # the oldest pending one counts
        _created(gang_member("young-0", "young", 1), 20),
        _created(bound, 3600),  # bound: not waiting, however old
        _created(gang_member("defaulted-0", "defaulted", 1), 61),  # the default 60 s
    ]
    listed = {r.key: r for r in rows(groups, pods, nvidia_gpu=False, now=NOW)}
    late, young, done = listed["ml/late"], listed["ml/young"], listed["ml/done"]
    assert (late.waited_seconds, late.timeout_seconds, late.past_timeout) == (45.0, 30, True)
    assert late.waited() == "45s (timeout 30s)"
    assert (young.waited_seconds, young.past_timeout, young.waited()) == (20.0, False, "20s")
    assert (done.waited_seconds, done.past_timeout, done.waited()) == (None, False, "-")
    defaulted = listed["ml/defaulted"]
    assert defaulted.timeout_seconds == rn.DEFAULT_GANG_TIMEOUT_SECONDS
    assert defaulted.past_timeout and defaulted.waited() == "61s (timeout 60s)"
    table = render_rows(list(listed.values()))
    (late_line,) = [line for line in table.splitlines() if line.split()[1] == "late"]
    assert "45s (timeout 30s)" in late_line


@pytest.mark.parametrize(
    "stamp",
    [None, "", "yesterday", 12, "2027-01-15T08:00:00", "9" * 100, "2999-01-01T00:00:00Z"],
    ids=["absent", "empty", "words", "number", "no-zone", "long", "future"],
)
def test_a_member_whose_creation_time_does_not_read_has_waited_nothing(stamp: Any) -> None:
    pods = [_created(gang_member("g-0", "g", 1), None, stamp)]
    (row,) = rows([pod_group("g", 2)], pods, nvidia_gpu=False, now=NOW)
    assert (row.waited_seconds, row.past_timeout, row.waited()) == (0.0, False, "0s")
