"""The Grafana dashboard in deploy/ queries only metrics the components really export, and
every exported metric follows Prometheus naming rules (base units, `tessera_` prefix)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "tessera-dashboard.json"
_METRIC = re.compile(r"\btessera_[a-z0-9_]+")
# units Prometheus asks to be given in base units instead (bytes, seconds, ratios 0-1)
_NOT_BASE_UNITS = ("_percent", "_mib", "_kib", "_gib", "_mb", "_ms", "_milliseconds", "_minutes")


def _registries() -> dict[str, CollectorRegistry]:
    from deviceplugin.agent import Agent, AgentConfig
    from deviceplugin.fake_backend import FakeBackend
    from deviceplugin.metrics import agent_registry
    from deviceplugin.usage_monitor import UsageMonitor
    from nri_hook.enforce import Metrics as HookMetrics
    from scheduler_plugin.views.metrics import Metrics as SchedulerMetrics

    backend = FakeBackend.from_topology("h100-sxm-8x")
    agent = Agent(AgentConfig("node-a"), backend, backend)
    agent.discover()  # reads the fake devices only; nothing is served
    agent.usage = UsageMonitor(backend, agent.gpu_indexes)  # as the shipped agent runs
    return {
        "scheduler": SchedulerMetrics().registry,
        "nri-hook": HookMetrics().registry,
        "node agent": agent_registry(agent),
    }


def _families() -> list[tuple[str, str, str]]:
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
    for _, name, kind in _families():
        if kind == "counter":
            names.add(f"{name}_total")
        elif kind == "histogram":
            names.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(name)
    return names


def _panels() -> list[dict[str, object]]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert isinstance(panels, list) and panels
    return panels


def test_every_panel_queries_only_exported_metrics() -> None:
    exported = exported_series()
    for panel in _panels():
        targets = panel["targets"]
        assert isinstance(targets, list) and targets, panel["title"]
        used = {m for t in targets for m in _METRIC.findall(t["expr"])}
        assert used, f"panel {panel['title']!r} queries no tessera metric"
        missing = used - exported
        assert not missing, f"panel {panel['title']!r} queries {sorted(missing)}, not exported"


def test_the_dashboard_covers_what_operators_watch() -> None:
    text = " ".join(
        t["expr"]
        for p in _panels()
        for t in p["targets"]  # type: ignore[attr-defined]
    )
    for metric in (
        "tessera_gpu_core_allocated_ratio",
        "tessera_gpu_memory_allocated_bytes",
        "tessera_scheduler_request_duration_seconds_bucket",
        "tessera_scheduler_node_failures_total",
        "tessera_scheduler_fenced_nodes",
        "tessera_nri_unisolated_gpu_shares_total",
        "tessera_container_gpu_memory_used_bytes",
        "tessera_container_gpu_memory_granted_bytes",
        "tessera_gpu_over_grant_total",
    ):
        assert metric in text


def test_panels_do_not_overlap_and_fit_the_grid() -> None:
    cells: set[tuple[int, int]] = set()
    for panel in _panels():
        g = panel["gridPos"]
        assert isinstance(g, dict)
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panel {panel['title']!r} overlaps another"
                cells.add((x, y))


def test_the_checker_sees_a_panel_that_queries_a_missing_metric() -> None:
    bogus = "sum(tessera_gpu_core_allocated_percent)"
    assert set(_METRIC.findall(bogus)) - exported_series() == {"tessera_gpu_core_allocated_percent"}


@pytest.mark.parametrize(("component", "name", "kind"), _families())
def test_metric_names_follow_prometheus_rules(component: str, name: str, kind: str) -> None:
    assert re.fullmatch(r"tessera_[a-z][a-z0-9_]*", name), (component, name)
    assert not name.endswith(_NOT_BASE_UNITS), f"{component}: {name} is not in base units"
    assert not name.endswith("_total"), f"{component}: {name} (the client adds _total)"
    if kind == "histogram":
        assert name.endswith(("_seconds", "_bytes")), f"{component}: {name} has no unit"
