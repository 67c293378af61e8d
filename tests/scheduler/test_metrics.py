"""The per-GPU series /metrics renders itself (in batches of nodes) are what the Prometheus
client library writes for the same samples, and they parse."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from scheduler_plugin.state.cache import Cache
from scheduler_plugin.views import metrics as m
from scheduler_plugin.views.metrics import GPU_FAMILIES, Metrics, gpu_chunks, sample
from tessera_testbed.inventory import heartbeat_lease, inventory_spec


def cache_of(nodes: int, model: str) -> Cache:
    cache = Cache("binpack", require_heartbeat=False)
    for n in range(nodes):
        name = f"node-{n}"
        cache.nodes.upsert(name, inventory_spec(name, 2, model=model))
    return cache


class _Reference(Collector):
    """The same families, through the client library."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    def collect(self) -> list[GaugeMetricFamily]:
        rows = self.cache.gpu_usage(self.cache.node_names())
        families = []
        for name, documentation, value in GPU_FAMILIES:
            family = GaugeMetricFamily(name, documentation, labels=["node", "gpu", "uuid", "model"])
            for g in rows:
                family.add_metric([g.node, str(g.index), g.uuid, g.model], value(g))
            families.append(family)
        return families


def test_gpu_series_are_what_the_client_library_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = cache_of(5, 'H100 "80GB" \\ SXM\nrev2')
    registry = CollectorRegistry()
    registry.register(_Reference(cache))
    monkeypatch.setattr(m, "GPU_BATCH", 2)  # several chunks per family
    assert b"".join(gpu_chunks(cache)) == generate_latest(registry)


def test_a_scrape_parses_and_sample_finds_a_gpu() -> None:
    metrics = Metrics()
    metrics.attach(cache_of(3, "NVIDIA H100 80GB HBM3"))
    families = {f.name for f in text_string_to_metric_families(metrics.render().decode())}
    assert {"tessera_gpu_core_allocated_ratio", "tessera_nodes_unusable"} <= families
    labels = {
        "node": "node-2",
        "gpu": "1",
        "uuid": "GPU-node-2-1",
        "model": "NVIDIA H100 80GB HBM3",
    }
    assert sample(metrics, "tessera_gpu_memory_total_bytes", labels) == 81920 << 20
    assert sample(metrics, "tessera_gpu_core_allocated_ratio", labels) == 0.0


UNUSABLE = "tessera_scheduler_node_unusable"


def _unusable_series(metrics: Metrics) -> dict[str, str]:
    """node -> reason of every tessera_scheduler_node_unusable series (each worth 1)."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == UNUSABLE:
                assert s.value == 1.0
                out[s.labels["node"]] = s.labels["reason"]
    return out


def test_each_unusable_node_has_a_series_naming_why_and_no_other_node_has_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = Cache("binpack", require_heartbeat=True)
    for name in ("good", "silent", "fenced", "broken"):
        cache.nodes.upsert(name, inventory_spec(name, 2))
        if name != "silent":
            cache.leases.seen(heartbeat_lease(name))
    cache.nodes.upsert("broken", {"gpus": "garbage"})
    cache.problems.distrust("ml/poisoned", "uid-p", "fenced", "signature does not verify")
    metrics = Metrics()
    metrics.attach(cache)
    assert _unusable_series(metrics) == {
        "broken": "invalid_inventory",
        "fenced": "untrusted_record",
        "silent": "agent_silent",
    }
    assert sample(metrics, "tessera_nodes_unusable") == 3.0
    # the fenced nodes' count is the per-node series' of the fence reasons
    for reason in ("untrusted_record", "invalid_inventory"):
        assert sample(metrics, "tessera_scheduler_fenced_nodes", {"reason": reason}) == 1.0
    # bounded: the first nodes by name; the count still counts all
    monkeypatch.setattr(m, "MAX_UNUSABLE_SERIES", 2)
    first_two = {"broken": "invalid_inventory", "fenced": "untrusted_record"}
    assert _unusable_series(metrics) == first_two
    assert sample(metrics, "tessera_nodes_unusable") == 3.0
    # back to usable: the series goes
    monkeypatch.undo()
    cache.problems.trust("ml/poisoned", "uid-p")
    cache.leases.seen(heartbeat_lease("silent"))
    assert _unusable_series(metrics) == {"broken": "invalid_inventory"}


def test_a_registry_without_a_state_lists_every_family_without_samples() -> None:
    """What the alert tests read as exported (tests/deploy/exported_metrics.py)."""
    names = {f.name for f in Metrics().registry.collect()}
    assert {name for name, _, _ in m.STATE_FAMILIES} <= names
    assert {"tessera_scheduler_leader", "tessera_scheduler_decisions"} <= names
