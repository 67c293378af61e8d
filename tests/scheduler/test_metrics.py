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
from tessera_testbed.inventory import inventory_spec


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
