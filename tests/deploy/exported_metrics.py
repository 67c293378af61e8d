"""The metric names tessera's components export, collected from their own metric
definitions (not from a list kept by hand): what the Grafana dashboard and the alerting
rules may query."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry

METRIC = re.compile(r"\btessera_[a-z0-9_]+")
"""A tessera metric name inside a PromQL expression."""


def _registries() -> dict[str, CollectorRegistry]:
    from deviceplugin.agent import Agent, AgentConfig
    from deviceplugin.fake_backend import FakeBackend
    from deviceplugin.metrics import agent_registry
    from deviceplugin.usage_monitor import UsageMonitor
    from nri_hook.enforce import Metrics as HookMetrics
    from scheduler_plugin.views.metrics import Metrics as SchedulerMetrics
    from tessera_edge.isolation_cli import mps_registry
    from tessera_edge.layer_probe import LayerPaths, LayerProbe
    from tessera_edge.mps_supervisor import MpsSettings, MpsSupervisor

    backend = FakeBackend.from_topology("h100-sxm-8x")
    agent = Agent(AgentConfig("node-a"), backend, backend)
    # as the shipped agent runs: with its isolation layer (here a library it cannot find)
    agent.layer = LayerProbe(LayerPaths("hami-core", "/nonexistent/libvgpu.so", "/nonexistent"))
    agent.discover()  # reads the fake devices only; nothing is served
    agent.usage = UsageMonitor(backend, agent.gpu_indexes)  # as the shipped agent runs
    supervisor = MpsSupervisor(MpsSettings(pipe_dir="/nonexistent", log_dir="/nonexistent"))
    return {
        "scheduler": SchedulerMetrics().registry,
        "nri-hook": HookMetrics("node-a").registry,
        "node agent": agent_registry(agent),
        "MPS supervisor": mps_registry(supervisor, "node-a"),
    }


def families() -> list[tuple[str, str, str]]:
    """(component, family name, type) of every metric family the components register, and
    the scheduler's per-GPU gauges (rendered outside its registry, in batches of nodes)."""
    from scheduler_plugin.views.metrics import GPU_FAMILIES

    return [
        (component, family.name, family.type)
        for component, registry in _registries().items()
        for family in registry.collect()
    ] + [("scheduler", name, "gauge") for name, _, _ in GPU_FAMILIES]


def exported_series() -> set[str]:
    """The series names the components expose (counters as `_total`, histograms as
    `_bucket`/`_sum`/`_count`)."""
    names: set[str] = set()
    for _, name, kind in families():
        if kind == "counter":
            names.add(f"{name}_total")
        elif kind == "histogram":
            names.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(name)
    return names
