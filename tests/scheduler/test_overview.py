"""The allocation page's data calls over HTTP: the overview's rows and figures, the search,
the refused pods (`/debug/pending`) and the overview stream; hostile input gets 4xx and
stays bounded."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest

from scheduler_plugin.views.pending import MAX_TEXT, Refusals, scheduler_message
from tessera import resources as rn
from tessera_testbed.apiserver import FakeApiServer
from tests.scheduler.helpers import (
    Served,
    gang_member,
    pod,
    pod_group,
    populate,
    serving,
    share,
    wait_for,
)


def _get(served: Served, path: str) -> tuple[int, Any]:
    status, body = served.http.get(path)
    return status, json.loads(body)


def _cluster(fake: FakeApiServer) -> None:
    populate(fake, ["a", "b"], gpus=2)
    forged = pod("forged", {rn.GPU: 100}, annotations={rn.ALLOCATION_ANNOTATION: "{not"})
    forged["spec"]["nodeName"] = "b"
    forged["status"]["phase"] = "Running"
    fake.create("pods", forged)


def test_the_overview_has_a_row_per_node_and_the_figures_per_model(
    fake: FakeApiServer,
) -> None:
    _cluster(fake)
    with serving(fake) as served:
        assert served.schedule(pod("half", share(30, 60)), ["a"]) == "a"
        wait_for(lambda: "b" in served.cache.problems.by_node())
        status, doc = _get(served, "/debug/overview")
        assert status == 200
        rows = {r["n"]: r for r in doc["nodes"]}
        a, b = rows["a"], rows["b"]
        gpu = served.node_summary("a")["gpus"]
        slot = next(i for i, g in enumerate(gpu) if g["pods"])
        assert a["c"][slot] == 30 and a["g"][slot] == 60 and a["k"] == 1 and a["p"] is None
        assert a["c"][1 - slot] == 0 and a["h"] == 0 and a["m"] == gpu[0]["model"]
        assert b["p"].startswith("node is fenced") and b["f"] == 1
        (model,) = doc["models"]
        assert (model["nodes"], model["gpus"], model["coreUsed"]) == (2, 4, 30)
        # b takes no pods: its free GPUs are free but not placeable
        assert (model["wholeFree"], model["wholePlaceable"]) == (3, 1)
        assert model["mostWholeOnOneNode"] == 1
        assert model["shares"][0] == {"core": 100, "memoryMiB": gpu[0]["memoryMiB"]["total"]}
        assert doc["unusable"] == 1 and doc["pods"] == 1


def test_search_finds_pods_nodes_gpus_and_models(fake: FakeApiServer) -> None:
    _cluster(fake)
    with serving(fake) as served:
        assert served.schedule(pod("needle-7", share(30, 30), namespace="team"), ["a"]) == "a"
        status, doc = _get(served, "/debug/search?q=TEAM/needle")
        assert status == 200 and doc["total"] == 1
        (match,) = doc["matches"]
        assert match["kind"] == "pod" and match["pod"] == "team/needle-7"
        assert doc["nodes"] == {"a": match["gpus"]} and len(match["gpus"]) == 1
        uuid = served.node_summary("b")["gpus"][1]["uuid"]
        doc = _get(served, f"/debug/search?q={uuid}")[1]
        assert doc["nodes"] == {"b": [1]} and doc["matches"][0]["kind"] == "gpu"
        doc = _get(served, "/debug/search?q=b")[1]
        assert "b" in doc["nodes"] and any(
            m == {"kind": "node", "node": "b"} for m in doc["matches"]
        )
        model = served.node_summary("a")["gpus"][0]["model"]
        doc = _get(served, "/debug/search?q=" + model.split()[1])[1]
        assert set(doc["nodes"]) == {"a", "b"} and doc["nodes"]["a"] == [0, 1]
        assert _get(served, "/debug/search?q=")[1]["total"] == 0
        assert _get(served, "/debug/search?q=" + "x" * 257)[0] == 400
        assert served.http.get("/debug/search?" + "&".join(["q=1"] * 40))[0] == 400


def test_a_refused_pod_is_listed_with_kube_schedulers_message_until_bound(
    fake: FakeApiServer,
) -> None:
    populate(fake, ["a", "b"], gpus=2)
    with serving(fake) as served:
        assert served.schedule(pod("wide", {rn.GPU: 200}), ["a"]) == "a"
        big = fake.create("pods", pod("three", {rn.GPU: 300}))
        assert not served.filter(big, ["a", "b"])["NodeNames"]
        (entry,) = _get(served, "/debug/pending")[1]["pods"]
        assert entry["pod"] == "default/three" and entry["asks"] == ["main: 3 whole GPUs"]
        assert entry["scheduler"] == "" and entry["nodesAsked"] == 2 and entry["refusals"] == 1
        reasons = {r["reason"]: r["nodes"] for r in entry["tessera"]}
        assert sum(reasons.values()) == 2
        explain = entry["explain"]
        assert explain["fitsNowCount"] == 0 and explain["nearest"] == []
        assert explain["hopeless"] == 2  # 2-GPU nodes: waiting will not help
        # kube-scheduler's retry carries the condition it recorded
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/2 nodes are available: " + "x" * 5000,
        }
        big["status"]["conditions"] = [{"type": "Ready"}, condition]
        served.filter(big, ["a", "b"])
        (entry,) = _get(served, "/debug/pending")[1]["pods"]
        assert entry["refusals"] == 2
        assert entry["scheduler"].startswith("Unschedulable: 0/2 nodes are available: xxx")
        assert len(entry["scheduler"]) == MAX_TEXT
        # a pod that fits after a while: listed with its nearest fit, gone once bound
        two = fake.create("pods", pod("two", {rn.GPU: 200}))
        assert not served.filter(two, ["a"])["NodeNames"]
        listed = _get(served, "/debug/pending?pod=default/two")[1]["pods"]
        assert [p["pod"] for p in listed] == ["default/two"]
        (near,) = listed[0]["explain"]["nearest"]
        assert near["node"] == "a" and near["reason"] == "needs 2 whole GPUs, 0 free"
        assert listed[0]["explain"]["fitsNow"] == ["b"]
        assert served.bind(two, "b") == ""
        assert [p["pod"] for p in _get(served, "/debug/pending")[1]["pods"]] == ["default/three"]
        # a pod that asks for no devices, or nothing to filter, is never listed
        plain = fake.create("pods", pod("plain"))
        served.filter(plain, [])
        assert len(_get(served, "/debug/pending")[1]["pods"]) == 1


def test_a_bad_request_is_listed_with_its_rule() -> None:
    with FakeApiServer() as fake:
        populate(fake, ["a"], gpus=1)
        with serving(fake) as served:
            bad = fake.create("pods", pod("bad", {rn.GPU_CORE: "150"}))
            assert not served.filter(bad, ["a"])["NodeNames"]
            (entry,) = _get(served, "/debug/pending")[1]["pods"]
            assert entry["asks"] == [] and "explain" not in entry
            assert "invalid device request" in entry["tessera"][0]["reason"]


def test_waiting_gangs_are_listed_and_their_members_point_to_them(fake: FakeApiServer) -> None:
    """A gang short of members, one that does not fit, and one reserved: each with its
    counts, reason and reservation; a refused member names its gang, with no nearest fit
    of its own (it is placed whole with the others or not at all)."""
    populate(fake, ["a", "b"], gpus=2)
    fake.create("podgroups", pod_group("llama", 3))
    fake.create("podgroups", pod_group("huge", 2))
    fake.create("podgroups", pod_group("pair", 2))
    with serving(fake) as served:
        gangs = served.service.gangs
        assert gangs is not None
        wait_for(lambda: gangs.groups_synced.is_set() and gangs.members_synced.is_set())
        short = [fake.create("pods", gang_member(f"llama-{i}", "llama", 1)) for i in range(2)]
        big = [fake.create("pods", gang_member(f"huge-{i}", "huge", 2)) for i in range(2)]
        big.append(fake.create("pods", gang_member("huge-x", "huge", 1)))
        pair = [fake.create("pods", gang_member(f"pair-{i}", "pair", 1)) for i in range(2)]
        wait_for(lambda: gangs.key_of(pair[1]["metadata"]["uid"]) is not None)
        assert not served.filter(short[0], ["a", "b"])["NodeNames"]
        assert not served.filter(big[0], ["a", "b"])["NodeNames"]
        assert served.filter(pair[0], ["a", "b"])["NodeNames"]  # reserved: its node passes
        doc = _get(served, "/debug/pending")[1]
        listed = {g["gang"]: g for g in doc["gangs"]}
        assert sorted(listed) == ["ml/huge", "ml/llama", "ml/pair"] and doc["gangsWaiting"] == 3
        llama = listed["ml/llama"]
        assert llama["reason"] == "gang ml/llama: 2 of 3 members pending"
        assert (llama["minMember"], llama["members"], llama["pending"], llama["bound"]) == (
            3,
            2,
            2,
            0,
        )
        assert llama["pendingMembers"] == ["llama-0", "llama-1"]
        assert llama["reservation"] == {"state": "none", "seconds": None, "nodes": []}
        assert listed["ml/huge"]["reason"] == "gang ml/huge: 3 members need 5 GPUs, 4 free"
        reserved = listed["ml/pair"]
        assert reserved["reason"] == "gang ml/pair: reserved, waiting for its members to bind"
        assert reserved["reservation"]["state"] == "reserved"
        assert 0 < reserved["reservation"]["seconds"] <= reserved["timeoutS"] == 60
        assert reserved["reservation"]["nodes"]
        members = {p["pod"]: p for p in doc["pods"]}
        assert set(members) == {"ml/llama-0", "ml/huge-0"}
        for entry in members.values():
            assert "explain" not in entry  # no misleading nearest fit for one member
        assert members["ml/llama-0"]["gang"] == "ml/llama"
        assert members["ml/huge-0"]["tessera"] == [
            {"reason": "tessera: gang ml/huge: 3 members need 5 GPUs, 4 free", "nodes": 2}
        ]
        # asked about one member: its gang alone
        one = _get(served, "/debug/pending?pod=ml/huge-0")[1]
        assert [g["gang"] for g in one["gangs"]] == ["ml/huge"]
        # bound whole: the pair leaves the list
        node = served.filter(pair[0], ["a", "b"])["NodeNames"][0]
        assert served.bind(pair[0], node) == ""
        other = served.cache.reservations.reserved_node(pair[1]["metadata"]["uid"])
        assert other is not None and served.bind(pair[1], other) == ""
        wait_for(
            lambda: "ml/pair" not in {g["gang"] for g in _get(served, "/debug/pending")[1]["gangs"]}
        )


@pytest.mark.parametrize(
    "status",
    [
        None,
        "x",
        {"conditions": "x"},
        {"conditions": [1, None, {"type": "PodScheduled", "status": "False", "message": 7}]},
        {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "r" * 500}]},
    ],
)
def test_hostile_conditions_read_as_a_bounded_message_or_none(status: Any) -> None:
    text = scheduler_message({"status": status})
    assert isinstance(text, str) and len(text) <= MAX_TEXT


def test_refusals_are_bounded_and_forgotten_after_their_ttl() -> None:
    now = [1000.0]
    book = Refusals(limit=3, ttl=60, clock=lambda: now[0])
    for i in range(5):
        meta = {"uid": f"u{i}", "namespace": "n", "name": f"p{i}" * 200}
        book.note({"metadata": meta}, None, (("r", 1),), 1)
    book.note({"metadata": {"uid": 5, "name": "x"}}, None, (), 1)  # not a pod: ignored
    kept = book.current(lambda uids: set())
    assert [r.uid for r in kept] == ["u4", "u3", "u2"]
    assert all(len(r.pod) <= 320 for r in kept)
    assert [r.uid for r in book.current(lambda uids: {"u3"})] == ["u4", "u2"]
    now[0] += 61
    assert book.current(lambda uids: set()) == []


def test_the_overview_stream_starts_whole_then_sends_what_changed(fake: FakeApiServer) -> None:
    populate(fake, ["a", "b"], gpus=1)
    with serving(fake) as served:
        conn = http.client.HTTPConnection("127.0.0.1", served.service.server.port, timeout=10)
        conn.request("GET", "/debug/watch?view=overview")
        stream = conn.getresponse()
        first = json.loads(stream.readline())
        assert first["type"] == "OVERVIEW" and [r["n"] for r in first["nodes"]] == ["a", "b"]
        assert served.schedule(pod("p", share(40, 20)), ["b"]) == "b"
        while True:
            line = json.loads(stream.readline())
            if line["type"] == "ROWS" and line["rows"]:
                break
        (row,) = line["rows"]
        assert row["n"] == "b" and row["c"] == [40] and row["g"] == [20]
        assert line["models"][0]["coreUsed"] == 40 and "b" in line["touched"]
        conn.close()


@pytest.mark.parametrize("view", ["overview", "nodes"])
def test_a_stream_whose_reader_left_gives_up_its_place(fake: FakeApiServer, view: str) -> None:
    """A page reloaded again and again must not use up the 4 streams: each closed
    connection's stream ends (sends to it would be dropped silently)."""
    populate(fake, ["a"], gpus=1)
    with serving(fake) as served:
        path = "/debug/watch?view=overview" if view == "overview" else "/debug/watch"
        for _ in range(10):
            conn = http.client.HTTPConnection("127.0.0.1", served.service.server.port, timeout=10)
            conn.request("GET", path)
            answer = conn.getresponse()
            assert answer.status == 200
            assert json.loads(answer.readline())["type"] in ("OVERVIEW", "SYNC")
            answer.close()
            conn.close()
            wait_for(lambda: not served.service.views._feeds, timeout=10)
