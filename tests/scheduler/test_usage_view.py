"""Used beside granted on the debug API and the allocation page: the node agents' usage
readings (tessera.usage, an annotation on each heartbeat Lease) set beside the grants.
The Lease watch only keeps the text; a view decodes it, once per text; a hostile text
makes that node's use unknown and nothing else."""

from __future__ import annotations

import http.client
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_plugin.state import usage as usage_view
from scheduler_plugin.state.cache import Cache
from tessera import resources as rn
from tessera.usage import (
    MAX_USAGE_BYTES,
    ContainerUsage,
    NodeUsage,
    UnattributedUsage,
    decode_usage,
    encode_usage,
)
from tessera_testbed.apiserver import FakeApiServer
from tessera_testbed.inventory import inventory_spec
from tests.scheduler.helpers import Served, heartbeat, pod, populate, serving, share, wait_for

AT = "2026-11-22T04:20:00Z"
HOSTILE = {
    "malformed": "{not json",
    "oversized": "x" * (MAX_USAGE_BYTES + 1),
    "version": json.dumps({"v": 2, "at": AT, "c": [], "o": []}),
}


def annotate(fake: FakeApiServer, node: str, text: str) -> None:
    """The node agent renews its Lease with a new usage reading."""
    patch = {"metadata": {"annotations": {rn.USAGE_ANNOTATION: text}}}
    fake.patch(
        "leases", rn.HEARTBEAT_LEASE_PREFIX + node, patch, namespace=rn.DEFAULT_HEARTBEAT_NAMESPACE
    )


def reading(*rows: ContainerUsage, other: tuple[UnattributedUsage, ...] = ()) -> str:
    return encode_usage(NodeUsage(AT, rows, other))


def view(served: Served, node: str) -> dict[str, Any]:
    status, body = served.http.get(f"/debug/nodes/{node}")
    assert status == 200, body
    result: dict[str, Any] = json.loads(body)
    return result


@pytest.fixture
def cluster() -> Iterator[tuple[Served, dict[str, tuple[str, str]]]]:
    """Five one-GPU nodes, each running one pod of 25% and 25% memory; node -> (pod UID,
    GPU UUID)."""
    nodes = ["good", "malformed", "oversized", "version", "silent"]
    with FakeApiServer() as fake:
        populate(fake, nodes, gpus=1)
        with serving(fake) as served:
            placed = {}
            for node in nodes:
                assert served.schedule(pod(f"p-{node}", share(25, 25)), [node]) == node
                uid = fake.get("pods", f"p-{node}")["metadata"]["uid"]
                placed[node] = (uid, served.node_summary(node)["gpus"][0]["uuid"])
            served.wait_settled()
            yield served, placed


def test_use_appears_beside_the_grant_and_hostile_readings_stay_on_their_node(
    cluster: tuple[Served, dict[str, tuple[str, str]]],
) -> None:
    served, placed = cluster
    uid, gpu = placed["good"]
    good = reading(
        ContainerUsage(uid, "default", "p-good", "main", gpu, 3000, 40),
        ContainerUsage("uid-ghost", "default", "ghost", "main", gpu, 700, None),
        ContainerUsage(uid, "default", "p-good", "main", "GPU-elsewhere", 5, 1),
        other=(
            UnattributedUsage(gpu, "host", 512, 2),
            UnattributedUsage(gpu, "mps-server", 30, 1),
        ),
    )
    annotate(served.fake, "good", good)
    for name, text in HOSTILE.items():
        annotate(served.fake, name, text)
    wait_for(lambda: view(served, "good")["usage"]["known"])
    # the hostile readings were written after the good one: wait until the watch has
    # brought every one of them too (seeing the good one says nothing of the later ones)
    wait_for(lambda: json.loads(served.http.get("/debug/nodes")[1])["usageInvalid"] == len(HOSTILE))

    node = view(served, "good")
    assert node["usage"] == {
        "known": True,
        "observed": AT,
        "reason": None,
        "invalid": False,
        "elsewhere": 1,
    }
    (g,) = node["gpus"]
    (holder,) = g["pods"]
    assert (holder["name"], holder["core"]) == ("p-good", 25)  # the grant, unchanged
    assert holder["usage"] == {"memoryMiB": 3000, "smPercent": 40}
    assert g["unattributed"] == [
        {"owner": "host", "memoryMiB": 512, "processes": 2},
        {"owner": "mps-server", "memoryMiB": 30, "processes": 1},
    ]
    # a tessera container the scheduler holds no grant for: its own list, not a pod's
    assert [(u["name"], u["memoryMiB"], u["smPercent"]) for u in g["ungranted"]] == [
        ("ghost", 700, None)
    ]
    assert g["inUse"] == {"memoryMiB": 3000 + 700 + 512 + 30}

    everything = json.loads(served.http.get("/debug/nodes")[1])
    nodes = {n["node"]: n for n in everything["nodes"]}
    assert everything["usageInvalid"] == len(HOSTILE)
    assert nodes["good"]["gpus"][0]["pods"][0]["usage"]["memoryMiB"] == 3000
    for name in HOSTILE:
        usage = nodes[name]["usage"]
        assert usage["known"] is False and usage["invalid"] is True, name
        assert usage["observed"] is None and usage["reason"]
        (g,) = nodes[name]["gpus"]
        assert g["core"]["used"] == 25 and g["pods"][0]["name"] == f"p-{name}"  # grants stay
        assert g["pods"][0]["usage"] is None and g["inUse"] is None
        assert g["unattributed"] == [] and g["ungranted"] == []
    assert "does not parse" in nodes["malformed"]["usage"]["reason"]
    assert "over 65536 bytes" in nodes["oversized"]["usage"]["reason"]
    assert "schema version 2" in nodes["version"]["usage"]["reason"]
    silent = nodes["silent"]["usage"]
    assert silent["known"] is False and silent["invalid"] is False
    assert rn.USAGE_ANNOTATION in silent["reason"] and nodes["silent"]["usable"]


def test_unattributed_use_is_never_shown_under_a_pod(
    cluster: tuple[Served, dict[str, tuple[str, str]]],
) -> None:
    """Not even one that names the pod's GPU and nothing else: only tessera rows with the
    pod's UID and container land beside its grant."""
    served, placed = cluster
    _, gpu = placed["good"]
    annotate(served.fake, "good", reading(other=(UnattributedUsage(gpu, "other-pod", 9000, 3),)))
    wait_for(lambda: view(served, "good")["usage"]["known"])
    (g,) = view(served, "good")["gpus"]
    assert g["pods"][0]["usage"] == {"memoryMiB": 0, "smPercent": 0}  # runs nothing there
    assert g["unattributed"] == [{"owner": "other-pod", "memoryMiB": 9000, "processes": 3}]
    assert all(9000 not in (p["usage"] or {}).values() for p in g["pods"])


def test_the_watch_stream_redraws_a_node_when_its_reading_changes(
    cluster: tuple[Served, dict[str, tuple[str, str]]],
) -> None:
    served, placed = cluster
    uid, gpu = placed["good"]
    conn = http.client.HTTPConnection("127.0.0.1", served.service.server.port, timeout=10)
    conn.request("GET", "/debug/watch?node=good")
    stream = conn.getresponse()
    assert json.loads(stream.readline())["type"] == "SYNC"
    annotate(served.fake, "good", reading(ContainerUsage(uid, "d", "p", "main", gpu, 42, 7)))
    while True:
        event = json.loads(stream.readline())
        if event["type"] == "MODIFIED" and event["node"]["usage"]["known"]:
            break
    assert event["node"]["gpus"][0]["pods"][0]["usage"] == {"memoryMiB": 42, "smPercent": 7}
    conn.close()
    # the NodeDevices status (written by the leader) carries grants only: a reading every
    # 10 s on every node must not rewrite 5,000 statuses
    status = wait_for(
        lambda: served.fake.get("nodedevices", "good").get("status", {}).get("allocation")
    )
    assert status["gpus"][0]["pods"] and "usage" not in status
    assert all("inUse" not in g and "usage" not in g["pods"][0] for g in status["gpus"])


# --- the state alone ------------------------------------------------------------------------


def lease(node: str, text: str | None) -> dict[str, Any]:
    obj = heartbeat(node)
    if text is not None:
        obj["metadata"]["annotations"] = {rn.USAGE_ANNOTATION: text}
    return obj


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every text the views decode."""
    seen: list[str] = []

    def counting(text: str) -> NodeUsage:
        seen.append(text)
        return decode_usage(text)

    monkeypatch.setattr(usage_view, "decode_usage", counting)
    return seen


def cache_with(*nodes: str) -> Cache:
    cache = Cache("binpack")
    for node in nodes:
        cache.nodes.upsert(node, inventory_spec(node, gpus=1))
    return cache


def test_the_lease_watch_only_keeps_the_text_and_a_view_decodes_it_once(
    decodes: list[str],
) -> None:
    cache = cache_with("n")
    status_changes: list[str] = []
    use_changes: list[str] = []
    cache.leases.seen(lease("n", reading()))
    cache.subscribe(status_changes.append)
    cache.leases.subscribe_usage(use_changes.append)
    for i in range(50):  # renewals, each with a new reading: kept, never decoded
        cache.leases.seen(lease("n", encode_usage(NodeUsage(f"2026-01-01T00:00:{i:02}Z"))))
    assert decodes == [] and use_changes == ["n"] * 50
    assert status_changes == []  # the status writer hears nothing of readings
    cache.leases.seen(lease("n", encode_usage(NodeUsage("2026-01-01T00:00:49Z"))))  # same text
    assert len(use_changes) == 50
    for _ in range(3):
        node = cache.node_view("n")
        assert node is not None and node["usage"]["observed"] == "2026-01-01T00:00:49Z"
    assert len(decodes) == 1  # once per text
    summary = cache.node_summary("n")
    assert summary is not None and "usage" not in summary


def test_decoded_readings_are_kept_for_the_most_recently_viewed_nodes_only(
    decodes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(usage_view, "MEMO_NODES", 2)
    cache = cache_with("a", "b", "c")
    cache.leases.replace([lease(n, encode_usage(NodeUsage(f"{n}-at"))) for n in "abc"])
    for node in "abca":  # a's decoded reading was dropped for c's
        cache.node_view(node)
    assert len(decodes) == 4
    cache.node_view("c")  # c is among the last two: still decoded
    assert len(decodes) == 4


def test_a_reading_goes_with_its_lease(decodes: list[str]) -> None:
    cache = cache_with("a", "b")
    cache.leases.replace([lease("a", reading()), lease("b", reading())])
    a, b = cache.node_view("a"), cache.node_view("b")
    assert a is not None and b is not None and a["usage"]["known"] and b["usage"]["known"]
    cache.leases.gone(lease("a", None))
    cache.leases.replace([lease("a", None)])  # b's Lease is gone; a's has no reading
    a, b = cache.node_view("a"), cache.node_view("b")
    assert a is not None and b is not None
    assert rn.USAGE_ANNOTATION in a["usage"]["reason"]
    assert b["usage"]["reason"] == "no heartbeat Lease"


def test_an_unreadable_reading_is_logged_once_per_node_until_it_reads_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = cache_with("n", "m")
    caplog.set_level(logging.WARNING, logger="scheduler_plugin.state.usage")

    def show(node: str, text: str) -> None:
        cache.leases.seen(lease(node, text))
        cache.node_view(node)
        cache.node_view(node)

    for text in ("{", "[]", "{", "nope"):  # a hostile agent rewrites it every renewal
        show("n", text)
    show("m", "{")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["node n", "node m"]
    show("n", reading())
    show("n", "{")
    assert len(caplog.records) == 3


ANNOTATION_VALUES = st.one_of(
    st.text(max_size=64),
    st.integers(),
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=3), inner),
        max_leaves=20,
    ).map(json.dumps),
    st.builds(
        lambda rows: json.dumps({"v": 1, "at": AT, "c": rows, "o": []}),
        st.lists(st.lists(st.integers(-1, 2) | st.text(max_size=3) | st.none(), max_size=8)),
    ),
)


@settings(max_examples=150, deadline=None)
@given(ANNOTATION_VALUES)
def test_any_annotation_gives_a_view_and_leaves_the_other_nodes_alone(value: Any) -> None:
    cache = cache_with("hostile", "fine")
    hostile = heartbeat("hostile")
    hostile["metadata"]["annotations"] = {rn.USAGE_ANNOTATION: value}
    cache.leases.replace([hostile, lease("fine", reading())])
    node = cache.node_view("hostile")
    assert node is not None and isinstance(node["usage"]["known"], bool)
    assert node["usage"]["known"] or node["usage"]["reason"]
    json.dumps(node)
    fine = cache.node_view("fine")
    assert fine is not None and fine["usage"]["known"]
    assert not cache.problems.by_node()  # a reading never makes a node unusable
