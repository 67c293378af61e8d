"""Prometheus metrics of the extender.

Counters and histograms are updated on the request path (cheap: a dict lookup and an add).
Per-GPU gauges are not kept at all: a collector reads them from the cluster state when
Prometheus scrapes, so 40,000 GPUs cost nothing between scrapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tessera.resources import UNITS_PER_DEVICE

if TYPE_CHECKING:
    from scheduler_plugin.cache import Cache

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_MIB = 1 << 20  # metrics are in base units: bytes, not the MiB the model counts in

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)

_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("node is fenced", "fenced"),
    ("no tessera device inventory", "no_inventory"),
    ("device inventory", "inventory_invalid"),
    ("heartbeat", "agent_silent"),
    ("invalid device request", "invalid_request"),
    ("node has no GPUs", "no_gpu"),
    ("of model", "gpu_model"),
    ("UUID", "gpu_uuid_hint"),
    ("unhealthy", "gpu_unhealthy"),
    ("insufficient cpu", "host_resources"),
    ("insufficient memory", "host_resources"),
    ("largest GPU here", "gpu_too_small"),
    ("whole GPUs", "whole_gpus"),
    ("no GPU has", "gpu_share"),
    ("RDMA", "rdma"),
    (" share ", "topology"),
)


def reason_category(reason: str) -> str:
    """A small, fixed label for a free-text failure reason (bounded label cardinality)."""
    for needle, label in _CATEGORIES:
        if needle in reason:
            return label
    return "other"


def _per_gpu(name: str, documentation: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=["node", "gpu", "uuid", "model"])


class _GpuCollector(Collector):
    def __init__(self, source: Callable[[], Cache | None]) -> None:
        self._source = source

    def collect(self) -> Iterator[GaugeMetricFamily]:
        cache = self._source()
        core = _per_gpu(
            "tessera_gpu_core_allocated_ratio",
            "Compute share of the GPU allocated to pods, from 0 (none) to 1 (all of it)",
        )
        mem = _per_gpu("tessera_gpu_memory_allocated_bytes", "GPU memory allocated to pods")
        total = _per_gpu("tessera_gpu_memory_total_bytes", "GPU memory of the device")
        unusable = GaugeMetricFamily(
            "tessera_nodes_unusable",
            "Nodes that take no new tessera pods (bad inventory or silent node agent)",
        )
        invalid = GaugeMetricFamily(
            "tessera_invalid_allocation_records",
            "Pods whose allocation record does not count (forged, corrupt or conflicting)",
        )
        fenced = GaugeMetricFamily(
            "tessera_scheduler_fenced_nodes",
            "Nodes fenced for new tessera pods, by reason: a running pod with an untrusted "
            "allocation record, or a NodeDevices that does not parse or index",
            labels=["reason"],
        )
        pods = GaugeMetricFamily(
            "tessera_pods_allocated", "Pods holding tessera devices", labels=["state"]
        )
        if cache is not None:
            stats = cache.stats()
            for g in stats.gpus:
                labels = [g.node, str(g.index), g.uuid, g.model]
                core.add_metric(labels, (UNITS_PER_DEVICE - g.free_core) / UNITS_PER_DEVICE)
                mem.add_metric(labels, (g.memory_mib - g.free_memory_mib) * _MIB)
                total.add_metric(labels, g.memory_mib * _MIB)
            unusable.add_metric([], stats.unusable)
            invalid.add_metric([], stats.invalid_records)
            fenced.add_metric(["untrusted_record"], stats.fenced_untrusted)
            fenced.add_metric(["invalid_inventory"], stats.fenced_inventory)
            pods.add_metric(["assumed"], stats.assumed)
            pods.add_metric(["confirmed"], stats.confirmed)
            pods.add_metric(["pending_node"], stats.pending_node)
        yield from (core, mem, total, unusable, invalid, fenced, pods)


class Metrics:
    """Everything /metrics shows; one registry per service (tests run several)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._cache: Cache | None = None
        self._latency: dict[str, Any] = {}
        self._decided: dict[tuple[str, str], Any] = {}
        r = self.registry
        self.requests = Histogram(
            "tessera_scheduler_request_duration_seconds",
            "Time to answer an extender call, by verb",
            ["verb"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.decisions = Counter(
            "tessera_scheduler_decisions",
            "Extender decisions by verb and outcome",
            ["verb", "outcome"],
            registry=r,
        )
        self.failures = Counter(
            "tessera_scheduler_node_failures",
            "Nodes rejected by filter, by reason",
            ["reason"],
            registry=r,
        )
        self.bind_failures = Counter(
            "tessera_scheduler_bind_failures",
            "Binds that failed, by step",
            ["step"],
            registry=r,
        )
        self.watch_relists = Counter(
            "tessera_scheduler_watch_relists",
            "Full relists of a watched resource (start, 410 Gone, errors)",
            ["resource"],
            registry=r,
        )
        self.leader = Gauge(
            "tessera_scheduler_leader", "1 when this replica is the leader", registry=r
        )
        self.ready = Gauge(
            "tessera_scheduler_ready", "1 when this replica answers extender calls", registry=r
        )
        self.status_writes = Counter(
            "tessera_scheduler_status_writes",
            "NodeDevices status updates, by outcome",
            ["outcome"],
            registry=r,
        )
        r.register(_GpuCollector(lambda: self._cache))

    def attach(self, cache: Cache) -> None:
        self._cache = cache

    def observe(self, verb: str, seconds: float, outcome: str) -> None:
        # the labelled children are looked up once (labels() costs a lock and a tuple)
        latency = self._latency.get(verb)
        if latency is None:
            latency = self._latency[verb] = self.requests.labels(verb)
        counter = self._decided.get((verb, outcome))
        if counter is None:
            counter = self._decided[(verb, outcome)] = self.decisions.labels(verb, outcome)
        latency.observe(seconds)
        counter.inc()

    def node_failures(self, reasons: Mapping[str, int]) -> None:
        for reason, count in reasons.items():
            self.failures.labels(reason).inc(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def sample(metrics: Metrics, name: str, labels: Mapping[str, str] | None = None) -> Any:
    """A metric's current value (tests and the debug API)."""
    return metrics.registry.get_sample_value(name, dict(labels or {}))
