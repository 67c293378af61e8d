"""Prometheus metrics of the extender.

Counters and histograms are updated on the request path (cheap: a dict lookup and an add).
Per-GPU gauges are not kept at all: they are read from the cluster state when Prometheus
scrapes, so 40,000 GPUs cost nothing between scrapes. A scrape renders them itself, a few
hundred nodes at a time, as chunks of text the server streams out: through the client
library's sample objects, 120,000 series took 50 MiB and a second of CPU per scrape. (A
family's chunks are read one after the other, so two GPUs' values may be a few
milliseconds apart.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from scheduler_plugin.state.problems import INVALID_INVENTORY, UNTRUSTED_RECORD
from tessera.resources import UNITS_PER_DEVICE

if TYPE_CHECKING:
    from scheduler_plugin.state.cache import Cache
    from scheduler_plugin.state.values import GpuUsage

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_MIB = 1 << 20  # metrics are in base units: bytes, not the MiB the model counts in
GPU_BATCH: Final = 250
"""Nodes read (and rendered) per chunk of the per-GPU series."""

LATENCY_BUCKETS = (
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
"""Buckets of the extender's call durations (bench.floor_extender uses them too, so the
two compare quantile for quantile)."""


def _core_ratio(g: GpuUsage) -> float:
    return (UNITS_PER_DEVICE - g.free_core) / UNITS_PER_DEVICE


def _memory_allocated(g: GpuUsage) -> float:
    return float((g.memory_mib - g.free_memory_mib) * _MIB)


def _memory_total(g: GpuUsage) -> float:
    return float(g.memory_mib * _MIB)


GPU_FAMILIES: Final[tuple[tuple[str, str, Callable[[GpuUsage], float]], ...]] = (
    (
        "tessera_gpu_core_allocated_ratio",
        "Compute share of the GPU allocated to pods, from 0 (none) to 1 (all of it)",
        _core_ratio,
    ),
    ("tessera_gpu_memory_allocated_bytes", "GPU memory allocated to pods", _memory_allocated),
    ("tessera_gpu_memory_total_bytes", "GPU memory of the device", _memory_total),
)
"""The per-GPU gauges, labelled {gpu, model, node, uuid}."""


def _number(value: float) -> str:
    """A sample value as the client library writes it (Go's float formatting)."""
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


def _label(value: str) -> str:
    """A label value as the text format writes it (backslash, quote and newline escaped)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def gpu_chunks(cache: Cache) -> Iterator[bytes]:
    """The per-GPU families in the text exposition format, `GPU_BATCH` nodes per chunk."""
    names = cache.node_names()
    for name, documentation, value in GPU_FAMILIES:
        yield f"# HELP {name} {documentation}\n# TYPE {name} gauge\n".encode()
        for first in range(0, len(names), GPU_BATCH):
            rows = cache.gpu_usage(names[first : first + GPU_BATCH])
            yield "".join(
                f'{name}{{gpu="{g.index}",model="{_label(g.model)}",node="{_label(g.node)}",'
                f'uuid="{_label(g.uuid)}"}} {_number(value(g))}\n'
                for g in rows
            ).encode()


MAX_UNUSABLE_SERIES: Final = 1000
"""Nodes `tessera_scheduler_node_unusable` names at most, the first by name (every one is
counted in `tessera_nodes_unusable`): a fifth of a 5,000-node cluster, past which a single
cause (a heartbeat namespace changed, an API server outage) is at work, not node faults."""

STATE_FAMILIES: Final[tuple[tuple[str, str, tuple[str, ...]], ...]] = (
    (
        "tessera_nodes_unusable",
        "Nodes that take no new tessera pods (bad inventory or silent node agent)",
        (),
    ),
    (
        "tessera_scheduler_node_unusable",
        "1 for each node that takes no new tessera pods, by reason: invalid_inventory (its "
        "NodeDevices does not parse or index), untrusted_record (fenced: a running pod's "
        "allocation record does not count), agent_silent (its heartbeat Lease is missing or "
        f"stale); nodes that take pods have no series; at most {MAX_UNUSABLE_SERIES} nodes, "
        "the first by name",
        ("node", "reason"),
    ),
    (
        "tessera_invalid_allocation_records",
        "Pods whose allocation record does not count (forged, corrupt or conflicting)",
        (),
    ),
    (
        "tessera_scheduler_fenced_nodes",
        "Nodes fenced for new tessera pods, by reason: a running pod with an untrusted "
        "allocation record, or a NodeDevices that does not parse or index",
        ("reason",),
    ),
    ("tessera_pods_allocated", "Pods holding tessera devices", ("state",)),
    (
        "tessera_scheduler_gangs_waiting_past_timeout",
        "Gangs with a member that has waited unbound longer than its PodGroup's "
        "scheduleTimeoutSeconds, counted from when this scheduler first saw the member pending",
        (),
    ),
)
"""The gauges read from the state when Prometheus scrapes: (name, help, labels)."""


class GangCounts(Protocol):
    """What /metrics reads of the gangs (decisions/gangs.py)."""

    def past_timeout(self) -> int: ...


Sample = tuple[str, tuple[str, ...], float]
"""(family name, label values, value)."""


def state_samples(cache: Cache, gangs: GangCounts | None) -> Iterator[Sample]:
    """The samples of STATE_FAMILIES, as the state and the gangs are now."""
    stats = cache.stats()
    yield "tessera_nodes_unusable", (), stats.unusable
    for node, kind in cache.problems.kinds(MAX_UNUSABLE_SERIES):
        yield "tessera_scheduler_node_unusable", (node, kind), 1
    yield "tessera_invalid_allocation_records", (), stats.invalid_records
    yield "tessera_scheduler_fenced_nodes", (UNTRUSTED_RECORD,), stats.fenced_untrusted
    yield "tessera_scheduler_fenced_nodes", (INVALID_INVENTORY,), stats.fenced_inventory
    yield "tessera_pods_allocated", ("assumed",), stats.assumed
    yield "tessera_pods_allocated", ("confirmed",), stats.confirmed
    yield "tessera_pods_allocated", ("pending_node",), stats.pending_node
    waiting = 0 if gangs is None else gangs.past_timeout()
    yield "tessera_scheduler_gangs_waiting_past_timeout", (), waiting


class _StateCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {
            name: GaugeMetricFamily(name, documentation, labels=list(labels))
            for name, documentation, labels in STATE_FAMILIES
        }
        cache = self._metrics.cache
        if cache is not None:
            for name, labels, value in state_samples(cache, self._metrics.gangs):
                families[name].add_metric(list(labels), value)
        yield from families.values()


class Metrics:
    """Everything /metrics shows; one registry per service (tests run several)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.cache: Cache | None = None
        self.gangs: GangCounts | None = None
        self._latency: dict[str, Any] = {}
        self._decided: dict[tuple[str, str], Any] = {}
        self._failed: dict[str, Any] = {}

        def counter(name: str, documentation: str, *labels: str) -> Counter:
            return Counter(name, documentation, labels, registry=r)

        def gauge(name: str, documentation: str, *labels: str) -> Gauge:
            return Gauge(name, documentation, labels, registry=r)

        def histogram(name: str, documentation: str, *labels: str) -> Histogram:
            return Histogram(name, documentation, labels, buckets=LATENCY_BUCKETS, registry=r)

        self.requests = histogram(
            "tessera_scheduler_request_duration_seconds",
            "Time to answer an extender call, by verb",
            "verb",
        )
        self.decisions = counter(
            "tessera_scheduler_decisions",
            "Extender decisions by verb and outcome",
            "verb",
            "outcome",
        )
        self.failures = counter(
            "tessera_scheduler_node_failures", "Nodes rejected by filter, by reason", "reason"
        )
        self.binding_writes = histogram(
            "tessera_scheduler_binding_write_seconds",
            "Time from sending a bind's Binding to the API server's answer, as "
            "tessera-scheduler reads it (beside the API server's own time for it, the "
            "difference is the wait on the way and for this process's event loop)",
        )
        self.bind_failures = counter(
            "tessera_scheduler_bind_failures", "Binds that failed, by step", "step"
        )
        self.watch_relists = counter(
            "tessera_scheduler_watch_relists",
            "Full relists of a watched resource (start, 410 Gone, errors)",
            "resource",
        )
        self.leader = gauge(
            "tessera_scheduler_leader",
            "1 when this replica is the leader (always, run without leader election)",
        )
        self.ready = gauge("tessera_scheduler_ready", "1 when this replica answers extender calls")
        self.stranded = gauge(
            "tessera_scheduler_stranded_grants",
            "Container grants on a GPU or RDMA NIC that its node now reports unhealthy or no "
            "longer lists, by state (unhealthy, missing); the pods have a Warning Event",
            "state",
        )
        self.status_writes = counter(
            "tessera_scheduler_status_writes", "NodeDevices status updates, by outcome", "outcome"
        )
        self.connections = counter(
            "tessera_scheduler_connections",
            "Client connections accepted on the extender port, by protocol (h2, http/1.1): "
            "kube-scheduler on HTTP/2 keeps one connection, on HTTP/1.1 it opens one per "
            "overlapping call",
            "protocol",
        )
        r.register(_StateCollector(self))

    def attach(self, cache: Cache, gangs: GangCounts | None = None) -> None:
        self.cache = cache
        self.gangs = gangs

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
        # the reasons are a few labels (decisions/extender.py, reason_category)
        for reason, count in reasons.items():
            counter = self._failed.get(reason)
            if counter is None:
                counter = self._failed[reason] = self.failures.labels(reason)
            counter.inc(count)

    def chunks(self) -> Iterator[bytes]:
        """The whole exposition, in chunks (the per-GPU series last, read in batches)."""
        yield generate_latest(self.registry)
        if self.cache is not None:
            yield from gpu_chunks(self.cache)

    def render(self) -> bytes:
        return b"".join(self.chunks())


def sample(metrics: Metrics, name: str, labels: Mapping[str, str] | None = None) -> Any:
    """A metric's current value, or None (tests and the debug API; a per-GPU value is
    looked up in a full rendering)."""
    wanted = dict(labels or {})
    value = metrics.registry.get_sample_value(name, wanted)
    if value is not None or not name.startswith("tessera_gpu_"):
        return value
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == name and s.labels == wanted:
                return s.value
    return None
