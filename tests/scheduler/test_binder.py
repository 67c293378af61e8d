"""Bind against the fake API server: order of writes, failures, parallel binds."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kube_edge.client import KubeClient
from kube_edge.loop_client import LoopClient
from scheduler_plugin.service import Service
from tessera import resources as rn
from tessera.record import decode
from tessera_testbed.apiserver import FakeApiServer
from tests.scheduler.helpers import (
    KEYRING,
    bind_body,
    pod,
    populate,
    serving,
    serving_nodes,
    share,
    wait_for,
)


@pytest.fixture(autouse=True, params=["loop", "pool"])
def bind_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here binds both ways: its API calls awaited on the extender's event loop
    (the default), and on the blocking pool (where the API client needs a proxy)."""
    if request.param == "pool":
        monkeypatch.setattr(LoopClient, "of", classmethod(lambda cls, client, **kw: None))
    return str(request.param)


def record_of(fake: FakeApiServer, name: str) -> tuple[str | None, dict[str, Any]]:
    obj = fake.get("pods", name, "default")
    return obj["metadata"].get("annotations", {}).get(rn.ALLOCATION_ANNOTATION), obj


def test_a_bind_is_one_api_write_the_binding_carrying_the_record(fake: FakeApiServer) -> None:
    with serving_nodes(fake, ["n"], gpus=1) as served:
        created = fake.create("pods", pod("p", share(100, 100)))
        before = len(fake.writes())
        assert served.bind(created, "n") == ""  # with status 200
        writes = fake.writes()[before:]
        assert [m for m, _ in writes] == ["POST"] and writes[0][1].endswith("/pods/p/binding")
        text, obj = record_of(fake, "p")
        assert text is not None
        assert obj["spec"]["nodeName"] == "n"
        assert decode(text, KEYRING, pod_uid=created["metadata"]["uid"], node="n")


def test_the_binding_write_is_timed_as_the_scheduler_reads_it(fake: FakeApiServer) -> None:
    # one observation per Binding sent, on /metrics beside the bind's whole time
    with serving_nodes(fake, ["n"], gpus=2) as served:
        for name in ("p", "q"):
            created = fake.create("pods", pod(name, share(30, 30)))
            assert served.bind(created, "n") == ""
        status, text = served.http.get("/metrics")
        assert status == 200
        samples = {
            s.name: s.value
            for family in text_string_to_metric_families(text.decode())
            if family.name == "tessera_scheduler_binding_write_seconds"
            for s in family.samples
        }
        assert samples["tessera_scheduler_binding_write_seconds_count"] == 2
        assert 0 < samples["tessera_scheduler_binding_write_seconds_sum"] < 10


def test_a_failed_binding_leaves_no_record_and_nothing_allocated(fake: FakeApiServer) -> None:
    with serving_nodes(fake, ["n"], gpus=1) as served:
        created = fake.create("pods", pod("p", share(100, 100)))
        fake.fail("/pods/p/binding", status=500, times=1)
        assert "creating the Binding failed" in served.bind(created, "n")
        assert served.cache.pods.allocation(created["metadata"]["uid"]) is None
        text, obj = record_of(fake, "p")
        assert text is None and not obj["spec"].get("nodeName")
        assert served.used_core("n") == 0
        # the devices are free again: the retry gets them
        assert served.bind(created, "n") == ""
        assert fake.get("pods", "p", "default")["spec"]["nodeName"] == "n"


def test_a_lost_binding_answer_is_checked_by_reading_the_pod(fake: FakeApiServer) -> None:
    with serving_nodes(fake, ["n"], gpus=1) as served:
        created = fake.create("pods", pod("p", share(50, 50)))
        fake.fail("/pods/p/binding", status=504, after_apply=True)
        assert served.bind(created, "n") == ""
        text, obj = record_of(fake, "p")
        assert text is not None
        assert obj["spec"]["nodeName"] == "n"
        assert decode(text, KEYRING, pod_uid=created["metadata"]["uid"], node="n")
        assert served.cache.pods.allocation(created["metadata"]["uid"]) is not None


def test_a_bind_without_a_preceding_filter_reads_the_pod(fake: FakeApiServer) -> None:
    with serving_nodes(fake, ["n"], gpus=2) as served:
        created = fake.create("pods", pod("p", {rn.GPU: 200}))
        assert served.bind(created, "n") == ""
        text, _ = record_of(fake, "p")
        assert text is not None
        alloc = decode(text, KEYRING)
        assert sorted(g.index for g in alloc.containers[0].gpus) == [0, 1]


def test_bind_refuses_a_wrong_uid_a_silent_node_and_a_full_node(fake: FakeApiServer) -> None:
    with serving_nodes(fake, ["n", "quiet"], gpus=1) as served:
        created = fake.create("pods", pod("p", {rn.GPU: 100}))
        wrong = bind_body(created, "n") | {"PodUID": "not-the-uid"}
        assert "is not UID" in served.http.post("/bind", wrong)[1]["Error"]
        # the node agent of "quiet" goes away with its heartbeat Lease
        fake.delete("leases", rn.HEARTBEAT_LEASE_PREFIX + "quiet", rn.DEFAULT_HEARTBEAT_NAMESPACE)
        wait_for(lambda: "quiet" in served.cache.problems.by_node())
        assert "heartbeat Lease" in served.bind(created, "quiet")
        assert served.bind(created, "n") == ""
        other = fake.create("pods", pod("q", {rn.GPU: 100}))
        assert "whole GPUs" in served.bind(other, "n")
        assert record_of(fake, "q")[0] is None


def test_parallel_binds_on_one_node_never_share_a_device(fake: FakeApiServer) -> None:
    populate(fake, ["n"], gpus=2)
    fake.latency = 0.01  # every API call takes a while, so binds overlap
    with serving(fake) as served:
        pods = [fake.create("pods", pod(f"p{i}", share(30, 30))) for i in range(12)]
        results: dict[str, str] = {}

        def bind(created: dict[str, Any]) -> None:
            results[created["metadata"]["name"]] = served.reconnect().bind(created, "n")

        threads = [threading.Thread(target=bind, args=(p,)) for p in pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        bound = [name for name, err in results.items() if not err]
        assert len(bound) == 6  # three 30% shares per GPU, two GPUs
        used: dict[str, int] = defaultdict(int)
        for name in bound:
            text, obj = record_of(fake, name)
            assert text is not None
            assert obj["spec"]["nodeName"] == "n"
            for grant in decode(text, KEYRING).containers[0].gpus:
                used[grant.uuid] += grant.core
        assert sorted(used.values()) == [90, 90]
        for name in set(results) - set(bound):
            assert record_of(fake, name)[0] is None


def test_kube_scheduler_flow_spreads_over_nodes_when_full(fake: FakeApiServer) -> None:
    with serving_nodes(fake, ["a", "b"], gpus=1) as served:
        placed = [served.schedule(pod(f"w{i}", {rn.GPU: 100}), ["a", "b"]) for i in range(3)]
        assert sorted(p or "" for p in placed[:2]) == ["a", "b"] and placed[2] is None


def test_a_retried_bind_of_a_bound_pod_succeeds_and_changes_nothing(fake: FakeApiServer) -> None:
    with serving_nodes(fake, ["n", "m"], gpus=1) as served:
        created = fake.create("pods", pod("p", share(50, 50)))
        assert served.bind(created, "n") == ""
        text, _ = record_of(fake, "p")
        assert served.bind(created, "n") == ""
        assert record_of(fake, "p")[0] == text
        refused = served.bind(created, "m")
        assert "already holds devices on n" in refused
        assert served.used_core("n") == 50
        assert served.used_core("m") == 0


def test_a_burst_of_binds_never_overflows_the_api_connection_pool(
    fake: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    """kube-scheduler sends binds in parallel: the verb pool bounds how many run at once,
    and the API client's pool is sized for them plus the watches, so no connection is
    opened beyond it and thrown away (urllib3 logs each such one)."""
    import logging
    from concurrent.futures import ThreadPoolExecutor

    from kube_edge.client import KubeClient
    from scheduler_plugin.service import Service
    from scheduler_plugin.serving import limits
    from tests.scheduler.helpers import Served, options

    populate(fake, [f"n{i}" for i in range(8)], gpus=8)
    pods = [fake.create("pods", pod(f"b{i}", share(10, 10))) for i in range(200)]
    client = KubeClient.for_host(fake.url, timeout=10, pool_size=limits.API_CONNECTIONS)
    service = Service(options(), client, KEYRING).start()
    caplog.set_level(logging.WARNING, logger="urllib3.connectionpool")
    try:
        assert service.wait_ready(10)

        def bind(i: int) -> str:
            return Served.over(fake, service).bind(pods[i], f"n{i % 8}")  # a connection each

        with ThreadPoolExecutor(64) as burst:
            errors = list(burst.map(bind, range(200)))
    finally:
        service.stop()
    assert errors == [""] * 200
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]


def test_the_watch_takes_our_own_bind_without_verifying_it_again(
    fake: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record a bind signs is remembered as the verdict for exactly that text: the
    watch event of our own Binding is not verified again, and any other text still is."""
    from scheduler_plugin.watches.recovery import judge as real_judge

    judged: list[str] = []

    def counting_judge(obj: dict[str, Any], keyring: Any) -> Any:
        if rn.ALLOCATION_ANNOTATION in (obj["metadata"].get("annotations") or {}):
            judged.append(obj["metadata"]["name"])  # a record to decode and verify
        return real_judge(obj, keyring)

    monkeypatch.setattr("scheduler_plugin.watches.reconciler.judge", counting_judge)
    with serving_nodes(fake, ["n"], gpus=2) as served:
        created = fake.create("pods", pod("p", share(40, 40)))
        assert served.bind(created, "n") == ""
        uid = created["metadata"]["uid"]
        served.wait_settled()
        assert served.cache.pods.allocation(uid) is not None
        assert "p" not in judged
        # the same pod with another record (here: another pod's) is judged, and refused
        other = fake.create("pods", pod("q", share(10, 10)))
        assert served.bind(other, "n") == ""
        text_q, _ = record_of(fake, "q")
        fake.patch("pods", "p", {"metadata": {"annotations": {rn.ALLOCATION_ANNOTATION: text_q}}})
        wait_for(lambda: "p" in judged)
        wait_for(lambda: "n" in served.cache.snapshot().record_fenced_nodes)


REQUIRED = rn.NRI_REQUIRED_PLUGINS_POD_ANNOTATION


def test_the_binding_requires_the_nri_hook_of_record_pods_only(fake: FakeApiServer) -> None:
    """The record's Binding also names the hook in NRI's required-plugins annotation (one
    write), so containerd 2.2+ refuses the pod's containers while the hook is away; a pod
    without devices gets no record and no requirement."""
    with serving_nodes(fake, ["n"], gpus=1) as served:
        created = fake.create("pods", pod("p", share(50, 50)))
        plain = fake.create("pods", pod("plain"))
        before = len(fake.writes())
        assert served.bind(created, "n") == ""
        assert len(fake.writes()) == before + 1
        annotations = record_of(fake, "p")[1]["metadata"]["annotations"]
        assert annotations[REQUIRED] == '["tessera"]'
        assert rn.ALLOCATION_ANNOTATION in annotations
        assert served.bind(plain, "n") == ""
        obj = fake.get("pods", "plain", "default")
        assert obj["spec"]["nodeName"] == "n"
        assert not obj["metadata"].get("annotations")


def test_the_pods_own_required_plugins_are_kept_beside_the_hook(fake: FakeApiServer) -> None:
    """A tenant's pod-scope requirement (the /pod key, else the bare key, as containerd
    reads them) is merged, never dropped; container-scope keys are left as written."""
    container_key = f"{rn.NRI_REQUIRED_PLUGINS_ANNOTATION}/container.main"
    cases = {
        "own-pod": ({REQUIRED: "[policy, tessera]"}, '["tessera", "policy"]'),
        "own-bare": ({rn.NRI_REQUIRED_PLUGINS_ANNOTATION: "- policy\n"}, '["tessera", "policy"]'),
        "own-both": (
            {REQUIRED: "['a']", rn.NRI_REQUIRED_PLUGINS_ANNOTATION: "[b]"},
            '["tessera", "a"]',
        ),
        "own-container": ({container_key: "[]"}, '["tessera"]'),
    }
    with serving_nodes(fake, ["n"], gpus=1) as served:
        for name, (annotations, _) in cases.items():
            created = fake.create("pods", pod(name, share(10, 10), annotations=annotations))
            assert served.schedule(created, ["n"]) == "n"
        for name, (annotations, want) in cases.items():
            written = record_of(fake, name)[1]["metadata"]["annotations"]
            assert written[REQUIRED] == want, name
            for key, value in annotations.items():
                if key != REQUIRED:
                    assert written[key] == value, (name, key)


def test_an_unreadable_required_plugins_value_is_refused_at_filter(fake: FakeApiServer) -> None:
    """tessera would have to drop it to write its own: the pod is refused, saying why,
    instead of losing a requirement it asked for. Other pods are placed as usual."""
    with serving_nodes(fake, ["n"], gpus=1) as served:
        bad = fake.create("pods", pod("bad", share(10, 10), annotations={REQUIRED: "{a: b}"}))
        answer = served.filter(bad, ["n"])
        assert not answer["NodeNames"]
        why = answer["FailedAndUnresolvableNodes"]["n"]
        assert REQUIRED in why and "list of NRI plugin names" in why, why
        good = fake.create("pods", pod("good", share(10, 10)))
        assert served.schedule(good, ["n"]) == "n"


def test_with_the_requirement_off_nothing_is_written_or_read(fake: FakeApiServer) -> None:
    populate(fake, ["n"], gpus=1)
    with serving(fake, nri_plugin=None) as served:
        odd = fake.create("pods", pod("odd", share(10, 10), annotations={REQUIRED: "{a: b}"}))
        created = fake.create("pods", pod("p", share(10, 10)))
        assert served.schedule(odd, ["n"]) == "n"
        assert served.schedule(created, ["n"]) == "n"
        assert record_of(fake, "odd")[1]["metadata"]["annotations"][REQUIRED] == "{a: b}"
        assert REQUIRED not in record_of(fake, "p")[1]["metadata"]["annotations"]


def test_the_requirement_names_the_configured_hook(fake: FakeApiServer) -> None:
    populate(fake, ["n"], gpus=1)
    with serving(fake, nri_plugin="gpu-hook") as served:
        created = fake.create("pods", pod("p", {rn.GPU: 100}))
        assert served.bind(created, "n") == ""
        assert record_of(fake, "p")[1]["metadata"]["annotations"][REQUIRED] == '["gpu-hook"]'


def test_the_bind_takes_the_path_asked_for(
    fake: FakeApiServer, bind_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Binding goes through the blocking client only on the pool path."""
    blocking: list[str] = []
    real = KubeClient.create

    def counted(self: KubeClient, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        blocking.append(path)
        return real(self, path, obj)

    monkeypatch.setattr(KubeClient, "create", counted)
    with serving_nodes(fake, ["n"], gpus=1) as served:
        created = fake.create("pods", pod("p", share(10, 10)))
        assert served.bind(created, "n") == ""
        assert fake.get("pods", "p", "default")["spec"]["nodeName"] == "n"
    bindings = [p for p in blocking if p.endswith("/binding")]
    assert len(bindings) == (0 if bind_path == "loop" else 1)


class _SlowApi:
    """The blocking client behind BindApi, each call after a pause on the loop."""

    def __init__(self, client: KubeClient, pause: float) -> None:
        self.client = client
        self.pause = pause
        self.created = 0

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(self.pause)
        self.created += 1
        return self.client.create(path, body)

    async def get(self, path: str) -> dict[str, Any]:
        await asyncio.sleep(self.pause)
        return self.client.get(path)


def _bind_cancelled_midway(service: Service, created: dict[str, Any], api: _SlowApi) -> None:
    """Bind `created` to node "n" on a fresh loop, cancel the request 50 ms in, and give
    the shielded bind half a second to go on."""

    async def cancel_midway() -> None:
        task = asyncio.ensure_future(service.verbs.bind_on_loop(bind_body(created, "n"), api))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.5)  # the shielded bind goes on meanwhile

    asyncio.run(cancel_midway())


def test_a_cancelled_bind_on_the_loop_still_runs_to_its_end(
    fake: FakeApiServer, bind_path: str
) -> None:
    """Cancelling the request (the loop shutting down, a lost caller) must neither leave the
    devices assumed nor free them while the Binding may yet land: the bind finishes."""
    if bind_path == "pool":
        pytest.skip("the loop path only")
    with serving_nodes(fake, ["n"], gpus=1) as served:
        created = fake.create("pods", pod("p", share(30, 30)))
        uid = created["metadata"]["uid"]
        served.filter(created, ["n"])  # remembered, as before a real bind
        api = _SlowApi(served.service.client, 0.2)
        _bind_cancelled_midway(served.service, created, api)
        assert api.created == 1
        assert fake.get("pods", "p", "default")["spec"]["nodeName"] == "n"
        assert served.cache.pods.allocation(uid) is not None


class _FailingApi(_SlowApi):
    """Fails reading the pod with an unexpected error (not an ApiError) after the pause."""

    async def get(self, path: str) -> dict[str, Any]:
        await asyncio.sleep(self.pause)
        raise RuntimeError("the client broke")


def test_a_cancelled_bind_that_fails_is_logged_not_lost(
    fake: FakeApiServer, bind_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    if bind_path == "pool":
        pytest.skip("the loop path only")
    with serving_nodes(fake, ["n"], gpus=1) as served:
        created = fake.create("pods", pod("p", share(30, 30)))
        # not filtered first: the bind reads the pod, and that read fails past the binder
        api = _FailingApi(served.service.client, 0.2)
        with caplog.at_level(logging.ERROR, logger="scheduler_plugin.service"):
            _bind_cancelled_midway(served.service, created, api)
        failures = [r for r in caplog.records if "request was cancelled failed" in r.getMessage()]
        assert len(failures) == 1 and "the client broke" in failures[0].getMessage()
