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
        yield from (gpu_info, healthy, memory, nic_healthy, units, skipped, api_ok)
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


def agent_registry(agent: Agent) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(AgentCollector(agent))
    return registry
