"""Replay request bodies captured from a real kube-scheduler over HTTP and decode the
replies as kube-scheduler does (Go encoding/json into extender/v1 structs)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler_plugin.decisions.binder import BindArgs
from tessera import resources as rn
from tessera.record import decode as decode_record
from tessera_testbed.apiserver import FakeApiServer
from tessera_testbed.inventory import nodedevices
from tests.scheduler import godecode as go
from tests.scheduler.helpers import KEYRING, VECTORS, heartbeat, serving, wait_for
from tests.vectors import require

NODES = ["peer-node-0", "peer-node-1", "peer-node-2"]
CAPTURED = b"example.com/gpu-core"
OURS = rn.GPU.encode()
"""The captured pods ask for example.com/gpu-core alone (50 or 30); tessera.dev/gpu at the
same value is the tessera request with that meaning (a share of one GPU)."""


def vector(name: str) -> bytes:
    """A captured body with tessera's resource name; every other byte as captured."""
    raw = (require(VECTORS) / name).read_bytes()
    if b'"Pod"' in raw:
        assert CAPTURED in raw, name
    return raw.replace(CAPTURED, OURS)


def _cluster(fake: FakeApiServer, nodes: list[str] = NODES) -> None:
    for node in nodes:
        fake.create("nodes", {"metadata": {"name": node}})
        fake.create("nodedevices", nodedevices(node, gpus=2))
        fake.create("leases", heartbeat(node))


def _create_captured_pod(fake: FakeApiServer, body: bytes) -> dict[str, Any]:
    pod = json.loads(body)["Pod"]
    meta = pod["metadata"]
    fresh = {
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "annotations": meta.get("annotations") or {},
        },
        "spec": pod["spec"],
        "status": pod["status"],
    }
    return fake.create("pods", fresh)


def test_filter_and_prioritize_with_node_cache(fake: FakeApiServer) -> None:
    _cluster(fake)
    body = vector("filter-001.json")
    with serving(fake, filter_answer="all") as served:
        status, data = served.http.post_raw("/filter", body)
        assert status == 200, data
        result, unknown = go.decode(go.ExtenderFilterResult, data)
        assert unknown == []
        assert go.filter_survivors(result, node_cache_capable=True) == json.loads(body)["NodeNames"]
        assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}
        assert json.loads(data)["Nodes"] is None

        status, data = served.http.post_raw("/prioritize", vector("prioritize-001.json"))
        assert status == 200
        scores, unknown = go.decode(go.HostPriorityList, data)
        assert unknown == []
        assert [s["Host"] for s in scores] == json.loads(body)["NodeNames"]
        assert all(0 <= s["Score"] <= 10 for s in scores)


@pytest.mark.parametrize("node_cache", [True, False])
def test_the_best_answer_is_one_survivor_in_the_form_it_came(
    fake: FakeApiServer, node_cache: bool
) -> None:
    # the shipped answer: kube-scheduler binds a lone survivor without scoring
    _cluster(fake)
    body = vector("filter-001.json" if node_cache else "nodecache-false/filter-002.json")
    if not node_cache:
        _create_captured_pod(fake, body)
    with serving(fake) as served:
        status, data = served.http.post_raw("/filter", body)
    assert status == 200, data
    result, unknown = go.decode(go.ExtenderFilterResult, data)
    assert unknown == []
    sent = json.loads(body)
    names = (
        sent["NodeNames"] if node_cache else [n["metadata"]["name"] for n in sent["Nodes"]["items"]]
    )
    (survivor,) = go.filter_survivors(result, node_cache_capable=node_cache)
    assert survivor in names
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}
    if not node_cache:
        (item,) = result["Nodes"]["items"]
        assert item == next(n for n in sent["Nodes"]["items"] if n["metadata"]["name"] == survivor)


def test_bind_vector_binds_with_a_verifiable_record_in_one_write(fake: FakeApiServer) -> None:
    _cluster(fake)
    filter_body = vector("filter-001.json")
    created = _create_captured_pod(fake, filter_body)
    with serving(fake) as served:
        assert served.http.post_raw("/filter", filter_body)[0] == 200
        status, data = served.http.post_raw("/bind", vector("bind-001.json"))
        assert status == 200
        result, unknown = go.decode(go.ExtenderBindingResult, data)
        assert unknown == [] and result["Error"] == ""
    stored = fake.get("pods", created["metadata"]["name"], "default")
    assert stored["spec"]["nodeName"] == "peer-node-2"
    record = decode_record(
        stored["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION],
        KEYRING,
        pod_uid=created["metadata"]["uid"],
        node="peer-node-2",
    )
    (container,) = record.containers
    (grant,) = container.gpus
    assert (container.name, grant.core, grant.memory_mib) == ("main", 50, 81920 // 2)
    # one write: the Binding, carrying the record
    writes = [(m, p) for m, p in fake.requests if m in ("PATCH", "POST") and "/pods/" in p]
    assert [m for m, _ in writes] == ["POST"]
    assert writes[0][1].endswith("/binding")


def test_without_node_cache_the_full_nodes_come_back(fake: FakeApiServer) -> None:
    _cluster(fake)
    body = vector("nodecache-false/filter-002.json")
    created = _create_captured_pod(fake, body)
    with serving(fake, filter_answer="all") as served:
        status, data = served.http.post_raw("/filter", body)
        assert status == 200
        result, unknown = go.decode(go.ExtenderFilterResult, data)
        assert unknown == []
        assert json.loads(data)["NodeNames"] is None
        sent = json.loads(body)["Nodes"]["items"]
        assert result["Nodes"]["items"] == sent  # the same Node objects, untouched
        assert go.filter_survivors(result, node_cache_capable=False) == [
            n["metadata"]["name"] for n in sent
        ]

        status, data = served.http.post_raw(
            "/prioritize", vector("nodecache-false/prioritize-001.json")
        )
        scores, _ = go.decode(go.HostPriorityList, data)
        assert sorted(s["Host"] for s in scores) == sorted(NODES)

        status, data = served.http.post_raw("/bind", vector("nodecache-false/bind-001.json"))
        result, _ = go.decode(go.ExtenderBindingResult, data)
        assert result["Error"] == ""
    stored = fake.get("pods", created["metadata"]["name"], "default")
    assert stored["spec"]["nodeName"] == "peer-node-0"
    assert rn.ALLOCATION_ANNOTATION in stored["metadata"]["annotations"]


def test_failed_and_unresolvable_nodes_decode_with_reasons(fake: FakeApiServer) -> None:
    # peer-node-0: no inventory (unresolvable); peer-node-1: silent node agent (resolvable)
    fake.create("nodes", {"metadata": {"name": "peer-node-0"}})
    _cluster(fake, ["peer-node-2"])
    fake.create("nodes", {"metadata": {"name": "peer-node-1"}})
    fake.create("nodedevices", nodedevices("peer-node-1", gpus=2))
    fake.create("leases", heartbeat("peer-node-1", offset=-600))
    for body in (
        vector("nodecache-false/filter-001.json"),
        vector("nodecache-false/filter-003.json"),
    ):
        with serving(fake, filter_answer="all") as served:
            _status, data = served.http.post_raw("/filter", body)
            result, unknown = go.decode(go.ExtenderFilterResult, data)
            assert unknown == []
            assert go.filter_survivors(result, node_cache_capable=False) == ["peer-node-2"]
            assert set(result["FailedAndUnresolvableNodes"]) == {"peer-node-0"}
            assert (
                "no tessera device inventory" in result["FailedAndUnresolvableNodes"]["peer-node-0"]
            )
            assert set(result["FailedNodes"]) == {"peer-node-1"}
            assert "silent" in result["FailedNodes"]["peer-node-1"]
            assert all(v.startswith("tessera: ") for v in result["FailedNodes"].values())


def test_keys_are_matched_case_insensitively_like_go(fake: FakeApiServer) -> None:
    _cluster(fake)
    doc = json.loads(vector("filter-001.json"))
    lowered = {"pod": doc["Pod"], "nodes": None, "nodenames": doc["NodeNames"]}
    with serving(fake, filter_answer="all") as served:
        _status, data = served.http.post_raw("/filter", json.dumps(lowered).encode())
        result, _ = go.decode(go.ExtenderFilterResult, data)
        assert go.filter_survivors(result, True) == doc["NodeNames"]


def test_the_go_decoder_model_rejects_what_go_rejects() -> None:
    # the checks above are only as good as this model of Go's decoder
    with pytest.raises(go.GoDecodeError):
        go.decode(go.HostPriorityList, b'[{"Host":"a","Score":7.0}]')
    with pytest.raises(go.GoDecodeError):
        go.decode(go.HostPriorityList, b'[{"Host":"a","Score":"7"}]')
    result, unknown = go.decode(go.ExtenderFilterResult, b'{"nodenames":["a"],"Bogus":1}')
    assert result["NodeNames"] == ["a"] and unknown == ["$.Bogus"]
    decoded, _ = go.decode(go.ExtenderFilterResult, b'{"NodeNames":null}')
    assert go.filter_survivors(decoded, True) == []


def test_status_summary_reaches_the_custom_resource(fake: FakeApiServer) -> None:
    _cluster(fake)
    filter_body = vector("filter-001.json")
    _create_captured_pod(fake, filter_body)
    with serving(fake) as served:
        served.http.post_raw("/filter", filter_body)
        served.http.post_raw("/bind", vector("bind-001.json"))

        def written() -> list[dict[str, Any]]:
            status = fake.get("nodedevices", "peer-node-2").get("status") or {}
            gpus = (status.get("allocation") or {}).get("gpus") or []
            return [g for g in gpus if g["pods"]]

        (gpu,) = wait_for(written)
        assert gpu["core"] == {"total": 100, "used": 50, "free": 50}
        assert gpu["pods"][0]["name"] == "gpu-pod-1"


@pytest.mark.parametrize("name", ["bind-001.json", "nodecache-false/bind-001.json"])
def test_bind_args_write_what_kube_scheduler_sends(name: str) -> None:
    """The testbed and benchmarks send BindArgs.to_json(): it must be kube-scheduler's
    body, key for key and in the same order."""
    raw = vector(name)
    assert json.dumps(BindArgs.parse(json.loads(raw)).to_json(), separators=(",", ":")) == (
        raw.decode().strip()
    )
