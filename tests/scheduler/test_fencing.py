"""Fencing against the simulated API server and the real service: what an operator sees
(Event, NodeDevices status, metric, filter reason) and a restart with poison pods."""

from __future__ import annotations

import time

from scheduler_plugin.views.events import UNTRUSTED_RECORD
from scheduler_plugin.views.metrics import sample
from tessera import resources as rn
from tessera_testbed.apiserver import FakeApiServer
from tests.scheduler.helpers import pod, serving, serving_nodes, share, wait_for
from tests.scheduler.test_isolation import POISON_DEEP, POISON_MAC

FENCED = "tessera_scheduler_fenced_nodes"


def poison(fake: FakeApiServer, name: str, node: str, record: str) -> None:
    """A pod bound to `node` (created with spec.nodeName, as a user may) with a record."""
    obj = pod(name, share(10, 10), annotations={rn.ALLOCATION_ANNOTATION: record})
    obj["spec"]["nodeName"] = node
    fake.create("pods", obj)
    fake.patch("pods", name, {"status": {"phase": "Running"}}, sub="status")


def test_a_poisoned_running_pod_fences_its_node_visibly_and_unfences_when_fixed(
    fake: FakeApiServer,
) -> None:
    with serving_nodes(fake, ["n", "m"], gpus=1) as served:
        assert served.schedule(pod("a", share(40, 40)), ["n"]) == "n"
        served.wait_settled()
        good = fake.get("pods", "a")["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION]
        fake.patch("pods", "a", {"metadata": {"annotations": {rn.ALLOCATION_ANNOTATION: "["}}})
        wait_for(lambda: "n" in served.cache.snapshot().record_fenced_nodes)
        # filter says why (kube-scheduler shows it when no node is left); other nodes keep
        # taking pods
        b = fake.create("pods", pod("b", share(10, 10)))
        reply = served.filter(b, ["n"])
        assert reply["NodeNames"] == []
        assert "default/a" in reply["FailedNodes"]["n"] and "fenced" in reply["FailedNodes"]["n"]
        reply = served.filter(b, ["n", "m"])
        assert reply["NodeNames"] == ["m"]
        assert sample(served.service.metrics, FENCED, {"reason": "untrusted_record"}) == 1.0
        assert sample(
            served.service.metrics, "tessera_scheduler_node_failures_total", {"reason": "fenced"}
        )
        # a Warning Event on the pod, once, however often the pod is seen again
        event = wait_for(lambda: fake.items("events"))[0]
        assert event["reason"] == UNTRUSTED_RECORD and event["type"] == "Warning"
        assert event["involvedObject"]["name"] == "a" and "fenced" in event["message"]
        for phase in ("Running", "Running"):
            fake.patch("pods", "a", {"status": {"phase": phase, "message": "x"}}, sub="status")
        pods_informer = served.informer("pods")
        pods_informer.list_once()  # a relist repeats nothing
        served.service.events.flush()
        assert len(fake.items("events")) == 1
        # the NodeDevices status names the pod
        status = wait_for(lambda: fake.get("nodedevices", "n").get("status", {}).get("allocation"))
        wait_for(lambda: fake.get("nodedevices", "n")["status"]["allocation"]["fenced"])
        status = fake.get("nodedevices", "n")["status"]["allocation"]
        assert status["usable"] is False and status["fenced"][0]["pod"] == "default/a"
        # the record restored: unfenced, and "a" holds its devices again
        fake.patch("pods", "a", {"metadata": {"annotations": {rn.ALLOCATION_ANNOTATION: good}}})
        wait_for(lambda: "n" not in served.cache.problems.by_node())
        assert sample(served.service.metrics, FENCED, {"reason": "untrusted_record"}) == 0.0
        wait_for(lambda: not fake.get("nodedevices", "n")["status"]["allocation"]["fenced"])
        assert served.schedule(fake.get("pods", "b"), ["n"]) == "n"


def test_a_pending_pod_with_a_garbage_record_is_scheduled_and_its_record_replaced(
    fake: FakeApiServer,
) -> None:
    with serving_nodes(fake, ["n"], gpus=1) as served:
        obj = pod("g", share(30, 30), annotations={rn.ALLOCATION_ANNOTATION: POISON_DEEP})
        assert served.schedule(obj, ["n"]) == "n"
        served.wait_settled()
        assert (
            not served.cache.snapshot().record_fenced_nodes
            and not served.cache.problems.invalid_records()
        )
        assert served.used_core("n") == 30


def test_restart_with_poison_pods_becomes_ready_places_elsewhere_and_fences_one_node(
    fake: FakeApiServer,
) -> None:
    nodes = ["n1", "n2", "n3"]
    with serving_nodes(fake, nodes, gpus=2) as served:
        for i, node in enumerate(nodes * 2):
            assert served.schedule(pod(f"v{i}", share(30, 30)), [node]) == node
        served.wait_settled()
    # while the scheduler is down, users poison pods on n1
    fake.patch("pods", "v0", {"metadata": {"annotations": {rn.ALLOCATION_ANNOTATION: POISON_MAC}}})
    for i, record in enumerate([POISON_DEEP, POISON_MAC, "{", "\x00" * 1000]):
        poison(fake, f"poison{i}", "n1", record)
    started = time.monotonic()
    with serving(fake) as served:
        ready_after = time.monotonic() - started
        print(f"ready {ready_after:.2f}s after a restart with poison pods")  # the figure
        assert served.cache.snapshot().record_fenced_nodes == {"n1"}
        assert {k for k in served.cache.problems.invalid_records()} == {
            "default/v0",
            *(f"default/poison{i}" for i in range(4)),
        }
        # valid pods elsewhere keep their devices; new pods go to the other nodes
        assert served.cache.pods.allocation(fake.get("pods", "v1")["metadata"]["uid"])
        assert served.schedule(pod("new", share(30, 30)), nodes) in ("n2", "n3")
        for name in ("v0", *(f"poison{i}" for i in range(4))):
            fake.delete("pods", name)
        wait_for(lambda: "n1" not in served.cache.problems.by_node())
        assert served.schedule(pod("after", share(30, 30)), ["n1"]) == "n1"
