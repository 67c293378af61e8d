"""A node back with a GPU unhealthy and one gone: the pods on them are told (an Event each,
the gauge, the NodeDevices status), new pods go to the good GPUs only, and nothing is
handed out twice when the devices return."""

from __future__ import annotations

import copy

from prometheus_client import CollectorRegistry, Gauge

from scheduler_plugin.state.cache import Cache
from scheduler_plugin.state.values import Assumed
from scheduler_plugin.views.events import DEVICE_MISSING, DEVICE_UNHEALTHY, PodEvent
from scheduler_plugin.views.stranded_reporter import StrandedReporter
from tessera import resources as rn
from tessera.request import parse_pod
from tessera_testbed.inventory import inventory_spec
from tests.scheduler.helpers import pod


def _place(cache: Cache, name: str, limits: dict[str, int]) -> Assumed | None:
    request = parse_pod(pod(name, limits, uid=f"uid-{name}"))
    result = cache.pods.assume(request, "n")
    if not isinstance(result, Assumed):
        return None
    cache.pods.bind(request.uid)
    return result


def _gauge(gauge: Gauge, registry: CollectorRegistry, state: str) -> float | None:
    return registry.get_sample_value("tessera_scheduler_stranded_grants", {"state": state})


def test_pods_on_a_gpu_gone_bad_or_missing_are_reported_and_nothing_is_given_twice() -> None:
    cache = Cache("binpack", require_heartbeat=False)
    spec = inventory_spec("n", gpus=4)
    cache.nodes.upsert("n", spec)
    placed = [_place(cache, f"p{i}", {rn.GPU: 100}) for i in range(3)]
    assert all(placed)
    on = {a.allocation.containers[0].gpus[0].index: a.allocation.name for a in placed if a}
    registry = CollectorRegistry()
    gauge = Gauge("tessera_scheduler_stranded_grants", "-", ["state"], registry=registry)
    events: list[PodEvent] = []
    reporter = StrandedReporter(cache, events.append, gauge)
    cache.subscribe(reporter.mark)

    # the node comes back: GPU 0 unhealthy, GPU 1 not found any more
    changed = copy.deepcopy(spec)
    changed["gpus"][0]["healthy"] = False
    changed["gpus"][0]["healthReason"] = "XID 79"
    gone = changed["gpus"].pop(1)
    cache.nodes.upsert("n", changed)
    reporter.flush()
    assert sorted((e.name, e.reason) for e in events) == sorted(
        [(on[0], DEVICE_UNHEALTHY), (on[1], DEVICE_MISSING)]
    )
    assert all(e.uid == f"uid-{e.name}" and "'main'" in e.message for e in events)
    assert _gauge(gauge, registry, "unhealthy") == 1 and _gauge(gauge, registry, "missing") == 1
    summary = cache.node_summary("n")
    assert summary is not None
    assert {(s["name"], s["state"]) for s in summary["stranded"]} == {
        (on[0], "unhealthy"),
        (on[1], "missing"),
    }
    # told once: later changes to the node repeat nothing
    assert _place(cache, "p3", {rn.GPU: 100}) is not None  # the last good GPU
    reporter.flush()
    assert len(events) == 2
    # new pods avoid the bad GPUs: nothing fits any more
    assert _place(cache, "p4", {rn.GPU: 10}) is None
    # the GPUs come back: their pods still hold them, so nothing is handed out twice
    changed["gpus"][0]["healthy"] = True
    changed["gpus"].insert(1, gone)
    cache.nodes.upsert("n", changed)
    reporter.flush()
    assert _gauge(gauge, registry, "unhealthy") == 0 and _gauge(gauge, registry, "missing") == 0
    assert _place(cache, "p5", {rn.GPU: 10}) is None
