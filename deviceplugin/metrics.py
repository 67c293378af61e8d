"""Prometheus metrics of the node agent, read from the agent when Prometheus scrapes.

Nothing is measured on the kubelet's request path: the collector reads the agent's current
inventory (devices, health), the units it advertises, the state of its API writes and the
counts GetPreferredAllocation's record chooser keeps, so a scrape always agrees with what
the kubelet and the NodeDevices object were last told.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from deviceplugin.agent import Agent
    from deviceplugin.usage_monitor import UsageMonitor
    from tessera.isolation import NodeIsolation

DEFAULT_METRICS_PORT = 9465
"""The agent's metrics port on the node (the DaemonSet runs in the host network); 9400 is
dcgm-exporter's, so tessera's components take 9465 (agent) and 9466 (NRI hook)."""

_MIB = 1 << 20


def _per_node(name: str, help: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    """A gauge family of the agent's node: every sample carries the `node` label first."""
    return GaugeMetricFamily(name, help, labels=["node", *labels])


class AgentCollector(Collector):
    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        agent = self._agent
        inventory = agent.inventory
        node = inventory.node_name
        gpu_info = _per_node(
            "tessera_node_gpu_info",
            "One per GPU the agent discovered (value 1), with what identifies it",
            ["gpu", "uuid", "model", "minor", "pci_bus_id"],
        )
        healthy = _per_node(
            "tessera_node_gpu_healthy",
            "1 while the GPU is healthy (advertised to the kubelet as usable), else 0",
            ["gpu", "uuid"],
        )
        memory = _per_node(
            "tessera_node_gpu_memory_bytes", "GPU memory of the device", ["gpu", "uuid"]
        )
        nic_healthy = _per_node(
            "tessera_node_rdma_device_healthy",
            "1 while every port of the RDMA device is active, else 0",
            ["device"],
        )
        units = _per_node(
            "tessera_device_plugin_units",
            "Units advertised to the kubelet, by resource and health",
            ["resource", "health"],
        )
        skipped = _per_node(
            "tessera_device_plugin_discovery_errors",
            "Devices discovery could not read (logged; the rest is served)",
        )
        api_ok = _per_node(
            "tessera_device_plugin_api_ok",
            "1 when the last write of this kind to the API server succeeded, else 0",
            ["write"],
        )
        for g in inventory.gpus:
            gpu = str(g.index)
            gpu_info.add_metric([node, gpu, g.uuid, g.model, str(g.minor), g.pci_bus_id], 1)
            healthy.add_metric([node, gpu, g.uuid], 1 if g.healthy else 0)
            memory.add_metric([node, gpu, g.uuid], g.memory_mib * _MIB)
        for nic in inventory.nics:
            nic_healthy.add_metric([node, nic.ibdev], 1 if nic.healthy else 0)
        for resource, advertised in sorted(agent.units.items()):
            good = advertised.healthy_count
            units.add_metric([node, resource, "healthy"], good)
            units.add_metric([node, resource, "unhealthy"], len(advertised.units) - good)
        skipped.add_metric([node], len(agent.errors))
        if agent.publisher is not None:
            api_ok.add_metric([node, "inventory"], 0 if agent.inventory_error else 1)
            api_ok.add_metric([node, "heartbeat"], 0 if agent.heartbeat_error else 1)
        registered = _per_node(
            "tessera_device_plugin_registered",
            "1 while every resource is registered with the node's kubelet, else 0",
        )
        registered.add_metric([node], 1 if agent.manager and agent.manager.registered else 0)
        yield from (gpu_info, healthy, memory, nic_healthy, units, skipped, api_ok, registered)
        if inventory.isolation is not None:
            yield from _isolation_families(node, inventory.isolation)
        if agent.chooser is not None:
            answers = CounterMetricFamily(
                "tessera_device_plugin_preferred_allocations",
                "GetPreferredAllocation answers: with the units of the admitted pod's record, "
                "or the default choice when that pod could not be told",
                labels=["node", "answer"],
            )
            answers.add_metric([node, "record"], agent.chooser.chosen)
            answers.add_metric([node, "default"], agent.chooser.fallbacks)
            yield answers
        if agent.usage is not None:
            yield from _usage_families(node, agent.usage)


def _isolation_families(node: str, layer: NodeIsolation) -> Iterator[GaugeMetricFamily]:
    """The node's GPU isolation layer: whether it is up, and which build it is."""
    up = _per_node(
        "tessera_node_isolation_layer_up",
        "1 while the node's GPU isolation layer is in place (no new GPU share is placed on "
        "a node where it is 0; the reason is in its NodeDevices spec.isolation)",
        ["layer"],
    )
    up.add_metric([node, layer.layer], 1 if layer.up else 0)
    info = _per_node(
        "tessera_node_isolation_layer_info",
        "The node's GPU isolation layer and its build (value 1)",
        ["layer", "version", "commit"],
    )
    info.add_metric([node, layer.layer, layer.version, layer.commit], 1)
    yield from (up, info)


_CONTAINER_GPU = ["namespace", "pod", "container", "gpu", "uuid"]


def _usage_families(
    node: str, usage: UsageMonitor
) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """Each tessera container's use of each GPU beside its grant, and what no tessera
    container owns, from the usage loop's last reading (docs/metrics.md)."""
    snapshot = usage.latest
    used = _per_node(
        "tessera_container_gpu_memory_used_bytes",
        "GPU memory the driver counts for the container's processes on the GPU",
        _CONTAINER_GPU,
    )
    granted = _per_node(
        "tessera_container_gpu_memory_granted_bytes",
        "GPU memory the container's allocation record grants it on the GPU",
        _CONTAINER_GPU,
    )
    sm = _per_node(
        "tessera_container_gpu_sm_used_ratio",
        "Share of the GPU's time the container's kernels ran, over the driver's last "
        "samples (0-1); absent where the driver samples none (MPS clients)",
        _CONTAINER_GPU,
    )
    core = _per_node(
        "tessera_container_gpu_core_granted_ratio",
        "Compute share of the GPU the container's record grants it (0-1)",
        _CONTAINER_GPU,
    )
    processes = _per_node(
        "tessera_container_gpu_processes",
        "The container's processes with a context on the GPU",
        _CONTAINER_GPU,
    )
    for u in snapshot.containers:
        labels = [node, u.namespace, u.pod, u.container, str(u.gpu_index), u.gpu]
        used.add_metric(labels, u.used_bytes)
        granted.add_metric(labels, u.granted_memory_mib * _MIB)
        core.add_metric(labels, u.granted_core / 100)
        processes.add_metric(labels, u.processes)
        if u.sm_percent is not None:
            sm.add_metric(labels, min(u.sm_percent, 100) / 100)
    other_used = _per_node(
        "tessera_gpu_unattributed_memory_used_bytes",
        "GPU memory of processes that are no tessera container's, by owner: host (outside "
        "any pod), other-pod (a pod without a tessera record), mps-server",
        ["gpu", "uuid", "owner"],
    )
    other_procs = _per_node(
        "tessera_gpu_unattributed_processes",
        "Processes on the GPU that are no tessera container's, by owner",
        ["gpu", "uuid", "owner"],
    )
    for o in snapshot.other:
        labels = [node, str(o.gpu_index), o.gpu, o.owner]
        other_used.add_metric(labels, o.used_bytes)
        other_procs.add_metric(labels, o.processes)
    over = CounterMetricFamily(
        "tessera_gpu_over_grant",
        "Containers found using more of a GPU than their record grants (each container, "
        "GPU and kind once; logged with pod, GPU and figures)",
        labels=["node", "kind"],
    )
    for kind, count in sorted(usage.watch.counts.items()):
        over.add_metric([node, kind], count)
    readings = CounterMetricFamily(
        "tessera_gpu_usage_readings", "Usage readings taken", labels=["node"]
    )
    readings.add_metric([node], usage.readings)
    cpu = CounterMetricFamily(
        "tessera_gpu_usage_cpu_seconds",
        "CPU time the usage readings took (NVML, /proc, attribution)",
        labels=["node"],
    )
    cpu.add_metric([node], usage.cpu_seconds)
    unreadable = _per_node(
        "tessera_gpu_usage_unreadable_gpus",
        "GPUs whose process list could not be read in the last reading",
    )
    unreadable.add_metric([node], len(snapshot.errors))
    yield from (used, granted, sm, core, processes, other_used, other_procs)
    yield from (over, readings, cpu, unreadable)


def agent_registry(agent: Agent) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(AgentCollector(agent))
    return registry
