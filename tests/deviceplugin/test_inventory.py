"""The node inventory against the in-process fake API server, through the kubernetes client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from deviceplugin.inventory import (
    InventoryConfig,
    InventoryPublisher,
    cr_path,
    lease_path,
    micro_time,
    sanitize_label_value,
)
from kube_edge.client import KubeClient
from kube_edge.errors import ApiError
from tessera.model import NodeInventory
from tessera.resources import (
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_MODEL_LABEL,
    INVENTORY_PLURAL,
)
from tessera_edge.topology_file import load_topology
from tessera_testbed.apiserver import FakeApiServer
from tests.deviceplugin.helpers import make_agent, running
from tests.waiting import wait_until

T = TypeVar("T")

NODE = "node-a"
CR = cr_path(NODE)
LEASE_NAMESPACE, LEASE_NAME = "tessera-system", "tessera-node-node-a"
LEASE = lease_path(LEASE_NAMESPACE, LEASE_NAME)


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.create(
            "nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": NODE, "labels": {"zone": "a"}},
            },
        )
        yield server


def _cr(server: FakeApiServer) -> dict[str, Any] | None:
    return server.find(INVENTORY_PLURAL, NODE)


def _lease(server: FakeApiServer) -> dict[str, Any] | None:
    return server.find("leases", LEASE_NAME, LEASE_NAMESPACE)


def _must(obj: dict[str, Any] | None) -> dict[str, Any]:
    assert obj is not None, "the object is not there"
    return obj


def _labels(server: FakeApiServer) -> dict[str, str]:
    return dict(server.get("nodes", NODE)["metadata"]["labels"])


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def _publisher(server: FakeApiServer, clock: Clock | None = None) -> InventoryPublisher:
    api = KubeClient.for_host(server.url, timeout=5)
    return InventoryPublisher(api, InventoryConfig(NODE), clock=clock or Clock())


@pytest.fixture(scope="module")
def h100() -> NodeInventory:
    return load_topology("h100-sxm-8x", NODE)


def _node_uid(server: FakeApiServer) -> str:
    return str(server.get("nodes", NODE)["metadata"]["uid"])


def test_creates_the_object_owned_by_the_node(
    apiserver: FakeApiServer, h100: NodeInventory
) -> None:
    assert _publisher(apiserver).publish(h100)
    obj = _cr(apiserver)
    assert obj is not None
    assert (obj["apiVersion"], obj["kind"], obj["metadata"]["name"]) == (
        "tessera.dev/v1alpha1",
        "NodeDevices",
        NODE,
    )
    assert "namespace" not in obj["metadata"]  # cluster-scoped
    (owner,) = obj["metadata"]["ownerReferences"]
    assert owner == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": _node_uid(apiserver)}
    spec = obj["spec"]
    assert spec["summary"] == {
        "gpuCount": 8,
        "healthyGpuCount": 8,
        "gpuModel": "NVIDIA H100 80GB HBM3",
        "rdmaCount": 4,
        "healthyRdmaCount": 4,
    }
    assert {k: v for k, v in spec.items() if k != "summary"} == h100.to_dict()
    assert NodeInventory.from_dict(spec, source="cr") == h100  # what the scheduler does
    assert "status" not in obj


def test_writes_only_when_something_changed(apiserver: FakeApiServer, h100: NodeInventory) -> None:
    publisher = _publisher(apiserver)
    publisher.publish(h100)
    assert len(apiserver.writes(path=CR.rsplit("/", 1)[0])) == 1
    assert not publisher.publish(h100)
    assert not _publisher(apiserver).publish(h100)  # a restarted agent compares first
    assert not publisher.publish(h100, force_check=True)
    assert len(apiserver.writes(path=CR.rsplit("/", 1)[0])) == 1
    sick = h100.with_gpu_health(h100.gpus[2].uuid, False, "XID 79")
    assert publisher.publish(sick)
    assert apiserver.writes("PUT", CR) == [("PUT", CR)]
    obj = _cr(apiserver)
    assert obj is not None and obj["spec"]["summary"]["healthyGpuCount"] == 7
    assert obj["spec"]["gpus"][2]["healthReason"] == "XID 79"


def test_conflict_is_retried_and_the_schedulers_status_kept(
    apiserver: FakeApiServer, h100: NodeInventory
) -> None:
    publisher = _publisher(apiserver)
    publisher.publish(h100)
    scheduler_writes: list[dict[str, Any]] = []

    def scheduler(method: str, path: str) -> None:
        # the scheduler writes its status between our GET and our PUT, once
        if method == "PUT" and path == CR and not scheduler_writes:
            current = _cr(apiserver)
            assert current is not None
            current["status"] = {"allocatedGpus": 3}
            scheduler_writes.append(apiserver.update(INVENTORY_PLURAL, current, "status"))

    apiserver.before = scheduler
    sick = h100.with_gpu_health(h100.gpus[0].uuid, False, "XID 79")
    assert publisher.publish(sick)
    assert apiserver.writes("PUT", CR) == [("PUT", CR), ("PUT", CR)]  # 409, then success
    obj = _cr(apiserver)
    assert obj is not None
    assert obj["status"] == {"allocatedGpus": 3}
    assert obj["spec"]["summary"]["healthyGpuCount"] == 7


def test_an_object_deleted_meanwhile_is_recreated(
    apiserver: FakeApiServer, h100: NodeInventory
) -> None:
    publisher = _publisher(apiserver)
    publisher.publish(h100)
    apiserver.delete(INVENTORY_PLURAL, NODE)
    assert publisher.publish(h100, force_check=True)
    assert _cr(apiserver) is not None


def test_api_errors_surface_and_the_next_attempt_works(
    apiserver: FakeApiServer, h100: NodeInventory
) -> None:
    publisher = _publisher(apiserver)
    apiserver.fail(CR, method="GET", status=500)
    with pytest.raises(ApiError) as err:
        publisher.publish(h100)
    assert err.value.status == 500
    assert publisher.publish(h100)
    apiserver.stop()
    with pytest.raises(ApiError) as err:
        publisher.publish(h100.with_gpu_health(h100.gpus[0].uuid, False, "x"))
    assert err.value.status == 0  # no answer at all


def test_node_labels(apiserver: FakeApiServer, h100: NodeInventory) -> None:
    publisher = _publisher(apiserver)
    assert publisher.update_labels(h100)
    labels = _labels(apiserver)
    assert labels == {
        "zone": "a",
        GPU_MODEL_LABEL: "NVIDIA-H100-80GB-HBM3",
        GPU_COUNT_LABEL: "8",
        GPU_MEMORY_LABEL: "81559",
    }
    assert not publisher.update_labels(h100)
    assert len(apiserver.writes("PATCH")) == 1
    assert publisher.update_labels(NodeInventory(NODE))  # no GPUs: our labels go away
    labels = _labels(apiserver)
    assert labels == {"zone": "a"}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("Tesla T4", "Tesla-T4"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("  (weird) name/with:stuff  ", "weird-name-with-stuff"),
        ("x" * 80, "x" * 63),
    ],
)
def test_label_values_are_sanitized(text: str, value: str) -> None:
    assert sanitize_label_value(text) == value


def test_heartbeat_lease(apiserver: FakeApiServer) -> None:
    clock = Clock()
    publisher = _publisher(apiserver, clock)
    publisher.node_uid()
    publisher.heartbeat()
    lease = _lease(apiserver)
    assert lease is not None
    spec = lease["spec"]
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"]) == (NODE, 40)
    assert spec["renewTime"] == spec["acquireTime"] == micro_time(clock.now)
    assert lease["metadata"]["ownerReferences"][0]["uid"] == _node_uid(apiserver)
    clock.now += 10
    publisher.heartbeat()
    spec = _must(_lease(apiserver))["spec"]
    assert spec["renewTime"] == micro_time(clock.now)
    assert spec["acquireTime"] == micro_time(clock.now - 10)
    # someone else touches the Lease: our cached resourceVersion is stale, we re-read
    other = _must(_lease(apiserver))
    other["metadata"]["labels"] = {"touched": "yes"}
    apiserver.update("leases", other)
    clock.now += 10
    publisher.heartbeat()
    lease = _lease(apiserver)
    assert lease is not None and lease["spec"]["renewTime"] == micro_time(clock.now)
    assert lease["metadata"]["labels"] == {"touched": "yes"}
    # first GET finds nothing (then a POST to the collection), a renew, a renew refused
    # with 409, the re-read, the renew again
    assert [m for m, p in apiserver.requests if p == LEASE] == ["GET", "PUT", "PUT", "GET", "PUT"]
    apiserver.delete("leases", LEASE_NAME, LEASE_NAMESPACE)
    clock.now += 10
    publisher.heartbeat()
    assert _must(_lease(apiserver))["spec"]["renewTime"] == micro_time(clock.now)


def test_micro_time_format() -> None:
    assert micro_time(1_700_000_000.25) == "2023-11-14T22:13:20.250000Z"


def test_the_agent_publishes_and_follows_health(apiserver: FakeApiServer, tmp_path: Path) -> None:
    agent, backend = make_agent(tmp_path, "t4-4x", quiet_period_s=600)
    agent.publisher = _publisher(apiserver, Clock())
    with running(agent):
        wait_until(lambda: _cr(apiserver))
        wait_until(lambda: _lease(apiserver))
        backend.inject_xid(backend.gpu(1).uuid, 79)

        def three_healthy() -> dict[str, Any] | None:
            o = _cr(apiserver)
            return o if o and o["spec"]["summary"]["healthyGpuCount"] == 3 else None

        obj = wait_until(three_healthy)
        assert obj is not None
        assert obj["spec"]["gpus"][1]["healthy"] is False
        labels = _labels(apiserver)
        assert labels[GPU_MODEL_LABEL] == "Tesla-T4"
    assert agent.inventory_error == ""


def test_the_agent_retries_after_api_failures(apiserver: FakeApiServer, tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path, "t4-4x", retry_interval_s=0.05)
    agent.publisher = _publisher(apiserver, Clock())
    apiserver.fail(CR, method="GET", status=500, times=2)
    apiserver.fail(LEASE, method="GET", status=503)
    with running(agent):
        wait_until(lambda: _cr(apiserver))
        wait_until(lambda: _lease(apiserver))
        wait_until(lambda: agent.inventory_error == "" and agent.heartbeat_error == "")
    assert [m for m, p in apiserver.requests if p == CR].count("GET") >= 3
