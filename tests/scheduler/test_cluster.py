"""The Kubernetes side against the fake API server: watches, records, debug API, metrics."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest

from scheduler_plugin.views.metrics import sample
from tessera import resources as rn
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.record import Keyring, encode
from tessera_testbed.apiserver import FakeApiServer
from tessera_testbed.inventory import nodedevices
from tests.scheduler.helpers import (
    KEYRING,
    pod,
    populate,
    running,
    serving,
    serving_nodes,
    share,
    wait_for,
)


def forged_pod(
    fake: FakeApiServer,
    name: str,
    node: str,
    key: Keyring | None,
    *,
    record_node: str | None = None,
    record_uid: str | None = None,
) -> dict[str, Any]:
    created = fake.create("pods", pod(name, {rn.GPU: 100}))
    uid = created["metadata"]["uid"]
    alloc = PodAllocation(
        pod_uid=record_uid or uid,
        namespace="default",
        name=name,
        node=record_node or node,
        containers=(ContainerAllocation("main", (GpuGrant(f"GPU-{node}-0", 0, 0, 100, 81920),)),),
    )
    text = encode(alloc, key)
    fake.patch("pods", name, {"metadata": {"annotations": {rn.ALLOCATION_ANNOTATION: text}}})
    fake.bind("default", name, {"target": {"name": node}})
    return created


def test_deleted_and_finished_pods_release_their_devices(fake: FakeApiServer) -> None:
    with serving_nodes(fake, ["n"], gpus=1) as served:
        assert served.schedule(pod("a", share(40, 40)), ["n"]) == "n"
        assert served.schedule(pod("b", share(40, 40)), ["n"]) == "n"
        served.wait_settled()
        assert served.used_core("n") == 80
        fake.delete("pods", "a")
        wait_for(lambda: served.used_core("n") == 40)
        fake.patch("pods", "b", {"status": {"phase": "Succeeded"}}, sub="status")
        wait_for(lambda: served.used_core("n") == 0)


def test_forged_and_copied_records_never_hold_devices(fake: FakeApiServer) -> None:
    populate(fake, ["n"], gpus=1)
    forged_pod(fake, "unsigned", "n", None)
    forged_pod(fake, "wrong-key", "n", Keyring.generate("k1"))
    forged_pod(fake, "copied", "n", KEYRING, record_uid="someone-else")
    with serving(fake) as served:
        invalid = wait_for(
            lambda: (
                len(served.cache.problems.invalid_records()) == 3 and served.service.views.pods()
            )
        )
        problems = {i["pod"]: i["problem"] for i in invalid["invalidRecords"]}
        assert "no integrity proof" in problems["default/unsigned"]
        assert "does not verify" in problems["default/wrong-key"]
        assert "is for pod UID 'someone-else'" in problems["default/copied"]
        assert served.used_core("n") == 0
        status, body = served.http.get("/debug/pods")
        assert status == 200 and len(json.loads(body)["invalidRecords"]) == 3
        assert sample(served.service.metrics, "tessera_invalid_allocation_records") == 3.0
        # the forged pods are bound and running: what they really use is unknown, so their
        # node is fenced (docs/scheduler.md "Fencing") and the service keeps serving
        reply = served.filter(fake.create("pods", pod("real", {rn.GPU: 100})), ["n"])
        assert "untrusted allocation record" in reply["FailedNodes"]["n"]
        for name in ("unsigned", "wrong-key", "copied"):
            fake.delete("pods", name)
        wait_for(lambda: "n" not in served.cache.problems.by_node())
        # the whole GPU is free for a real pod
        assert served.schedule(fake.get("pods", "real"), ["n"]) == "n"
        fake.delete("pods", "real")
        wait_for(lambda: served.used_core("n") == 0)


def test_a_signed_record_for_another_node_does_not_count(fake: FakeApiServer) -> None:
    populate(fake, ["n", "m"], gpus=1)
    forged_pod(fake, "moved", "n", None, record_node="m")
    with serving(fake) as served:
        wait_for(lambda: "default/moved" in served.cache.problems.invalid_records())
        assert served.used_core("n") == 0 and served.used_core("m") == 0


def test_watch_expiry_relists_and_catches_up(fake: FakeApiServer) -> None:
    with serving_nodes(fake, ["n"], gpus=1) as served:
        assert served.schedule(pod("a", share(50, 50)), ["n"]) == "n"
        served.wait_settled()
        pods_informer = served.informer("pods")
        before = pods_informer.relists
        fake.stop()  # the API server goes away; the pod goes while we cannot watch,
        fake.delete("pods", "a")  # and the history with that event is compacted: a
        fake.compact()  # watch from our resourceVersion gets 410 Gone
        fake.start()
        wait_for(lambda: pods_informer.relists > before, timeout=15)
        wait_for(lambda: served.used_core("n") == 0)
        assert served.schedule(pod("b", {rn.GPU: 100}), ["n"]) == "n"


def test_a_bad_inventory_blocks_its_node_and_keeps_what_it_holds(fake: FakeApiServer) -> None:
    with serving_nodes(fake, ["n"], gpus=2) as served:
        assert served.schedule(pod("a", {rn.GPU: 100}), ["n"]) == "n"
        broken = fake.get("nodedevices", "n")
        broken["spec"]["gpus"][1]["memoryMiB"] = "lots"
        fake.update("nodedevices", broken)
        wait_for(lambda: "n" in served.cache.problems.by_node())
        reply = served.filter(fake.create("pods", pod("b", share(10, 10))), ["n"])
        assert "gpus[1].memoryMiB" in reply["FailedNodes"]["n"]
        assert served.used_core("n") == 100  # what "a" holds stays accounted
        fake.update("nodedevices", nodedevices("n", gpus=2) | {"metadata": {"name": "n"}})
        wait_for(lambda: "n" not in served.cache.problems.by_node())
        fake.delete("nodedevices", "n")
        wait_for(lambda: "n" not in served.cache.snapshot().nodes)
        reply = served.filter(fake.get("pods", "b"), ["n"])
        assert "no tessera device inventory" in reply["FailedAndUnresolvableNodes"]["n"]


def test_a_deleted_node_takes_no_pods(fake: FakeApiServer) -> None:
    populate(fake, ["n", "m"], gpus=1)
    with running(fake) as service:
        fake.delete("nodes", "m")
        wait_for(lambda: "m" not in service.cache.snapshot().nodes)
        reply = service.extender.filter({"Pod": pod("p", share(5, 5)), "NodeNames": ["n", "m"]})
        assert reply["NodeNames"] == ["n"]


def test_records_seen_before_their_node_wait_for_it(fake: FakeApiServer) -> None:
    with serving_nodes(fake, ["n"], gpus=1) as served:
        assert served.schedule(pod("a", {rn.GPU: 100}), ["n"]) == "n"
    fake.delete("nodedevices", "n")
    with serving(fake) as served:
        assert served.service.views.pods()["waitingForNode"] == ["default/a -> n"]
        fake.create("nodedevices", nodedevices("n", gpus=1))
        wait_for(lambda: "n" in served.cache.snapshot().nodes)
        assert served.used_core("n") == 100


def test_debug_api_and_its_watch_stream(fake: FakeApiServer) -> None:
    with serving_nodes(fake, ["n"], gpus=1) as served:
        conn = http.client.HTTPConnection("127.0.0.1", served.service.server.port, timeout=10)
        conn.request("GET", "/debug/watch?node=n")
        stream = conn.getresponse()
        assert json.loads(stream.readline()) == {"type": "SYNC", "nodes": ["n"]}
        assert served.schedule(pod("a", share(25, 25)), ["n"]) == "n"
        while True:
            event = json.loads(stream.readline())
            if event["type"] == "MODIFIED" and event["node"]["gpus"][0]["pods"]:
                break
        gpu = event["node"]["gpus"][0]
        assert gpu["core"] == {"total": 100, "used": 25, "free": 75}
        assert gpu["pods"][0]["name"] == "a"
        conn.close()
        status, body = served.http.get("/debug/nodes")
        assert status == 200 and json.loads(body)["nodes"][0]["node"] == "n"
        status, body = served.http.get("/debug/nodes/n")
        assert json.loads(body)["gpus"][0]["memoryMiB"]["used"] == 81920 // 4
        assert served.http.get("/debug/nodes/nope")[0] == 404


def test_metrics_count_decisions_failures_and_gpu_use(fake: FakeApiServer) -> None:
    with serving_nodes(fake, ["n"], gpus=1) as served:
        assert served.schedule(pod("a", {rn.GPU: 100}), ["n"]) == "n"
        assert served.schedule(pod("b", share(10, 10)), ["n"]) is None
        status, text = served.http.get("/metrics")
        body = text.decode()
        assert status == 200
        assert 'tessera_scheduler_decisions_total{outcome="bound",verb="bind"} 1.0' in body
        assert 'tessera_scheduler_node_failures_total{reason="gpu_share"} 1.0' in body
        assert 'tessera_gpu_core_allocated_ratio{gpu="0",model="NVIDIA H100 80GB HBM3"' in body
        assert "tessera_scheduler_request_duration_seconds_bucket" in body
        labels = {"node": "n", "gpu": "0", "uuid": "GPU-n-0", "model": "NVIDIA H100 80GB HBM3"}
        assert sample(served.service.metrics, "tessera_gpu_core_allocated_ratio", labels) == 1.0
        assert (
            sample(served.service.metrics, "tessera_gpu_memory_allocated_bytes", labels) == 80 << 30
        )


def test_lists_are_paged(fake: FakeApiServer) -> None:
    populate(fake, ["n"], gpus=4)
    for i in range(7):
        plain = pod(f"plain-{i}", {"cpu": "1"})
        plain["spec"]["nodeName"] = "n"
        fake.create("pods", plain)
    for i in range(5):  # pending pods are not listed: they hold nothing
        fake.create("pods", pod(f"pending-{i}", {"cpu": "1"}))
    with serving(fake) as served:
        assert served.schedule(pod("a", {rn.GPU: 100}), ["n"]) == "n"
        assert served.schedule(pod("b", {rn.GPU: 100}), ["n"]) == "n"
        pods_informer = served.informer("pods")
        pods_informer.page_size = 3
        before = fake.list_calls
        pods_informer.list_once()  # a relist in pages of 3: 9 bound pods -> 3 requests
        assert fake.list_calls - before == 3
        assert served.used_core("n") == 100 and served.used_core("n", 1) == 100
        assert served.cache.stats().pods_known == 9


def test_status_writes_are_batched_skip_unchanged_and_retry_failures(fake: FakeApiServer) -> None:
    from scheduler_plugin.state.cache import Cache
    from scheduler_plugin.views.status_writer import StatusWriter
    from tessera_testbed.inventory import inventory_spec
    from tests.scheduler.helpers import client_for

    populate(fake, ["a", "b", "c"], gpus=1)
    cache = Cache("binpack")
    for name in ("a", "b", "c", "gone"):
        cache.nodes.upsert(name, inventory_spec(name, gpus=1))
    writer = StatusWriter(cache, client_for(fake), max_per_flush=2)
    writer.mark_all()
    assert writer.flush() == 2  # at most two per round
    fake.fail("/nodedevices/c/status", method="PATCH", status=500)
    assert writer.flush() == 0  # "c" failed, "gone" has no NodeDevices (404): skipped
    assert writer.flush() == 1  # "c" again, after its failure
    writer.mark_all()
    assert writer.flush() + writer.flush() == 0  # nothing changed: nothing written
    fake.requests.clear()
    from scheduler_plugin.state.values import Holds, PodSeen
    from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation

    grant = GpuGrant("GPU-b-0", 0, 0, 10, 8192)
    alloc = PodAllocation("ux", "default", "x", "b", (ContainerAllocation("main", (grant,)),))
    cache.pods.observed(PodSeen("ux", "default", "x", "b"), Holds(alloc))
    assert writer.flush() == 1
    assert fake.requests == [("PATCH", "/apis/tessera.dev/v1alpha1/nodedevices/b/status")]
    status = fake.get("nodedevices", "b")["status"]["allocation"]
    assert status["gpus"][0]["pods"][0]["name"] == "x" and status["usable"] is False
    assert "heartbeat" in status["problem"]  # this cache never saw a Lease for "b"


def test_a_record_altered_after_binding_stops_counting_and_counts_again_when_restored(
    fake: FakeApiServer,
) -> None:
    with serving_nodes(fake, ["n"], gpus=1) as served:
        assert served.schedule(pod("a", share(40, 40)), ["n"]) == "n"
        served.wait_settled()
        good = fake.get("pods", "a")["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION]
        doc = json.loads(good)
        doc["containers"][0]["gpus"][0]["core"] = 100  # the pod's author asks for more
        fake.patch(
            "pods", "a", {"metadata": {"annotations": {rn.ALLOCATION_ANNOTATION: json.dumps(doc)}}}
        )
        wait_for(lambda: "default/a" in served.cache.problems.invalid_records())
        assert served.used_core("n") == 0
        fake.patch("pods", "a", {"status": {"phase": "Running"}}, sub="status")  # an update
        fake.patch("pods", "a", {"metadata": {"annotations": {rn.ALLOCATION_ANNOTATION: good}}})
        wait_for(lambda: served.used_core("n") == 40)
        assert "default/a" not in served.cache.problems.invalid_records()


def test_the_pod_watch_sees_bound_pods_only(
    fake: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pending pods hold nothing: neither the list nor the watch hands them over (an
    unschedulable pod's status updates cost nothing), and a pod arrives when it is bound."""
    from scheduler_plugin.watches.recovery import judge as real_judge

    judged: list[str] = []

    def counting_judge(obj: dict[str, Any], keyring: Any) -> Any:
        judged.append(obj["metadata"]["name"])
        return real_judge(obj, keyring)

    monkeypatch.setattr("scheduler_plugin.watches.reconciler.judge", counting_judge)
    populate(fake, ["n"], gpus=1)
    fake.create("pods", pod("listed-pending", share(10, 10)))
    with serving(fake) as served:
        fake.create("pods", pod("watched-pending", share(10, 10)))
        fake.patch(
            "pods", "watched-pending", {"status": {"conditions": [{"type": "x"}]}}, sub="status"
        )
        fake.create(
            "pods", pod("marker", share(10, 10)) | {"spec": {"nodeName": "n", "containers": []}}
        )
        wait_for(lambda: "marker" in judged)
        assert "listed-pending" not in judged and "watched-pending" not in judged
        fake.bind("default", "watched-pending", {"target": {"name": "n"}})
        wait_for(lambda: "watched-pending" in judged)
        assert served.cache.stats().pods_known == 2
