"""The Grafana dashboard in deploy/ queries only metrics the components really export, and
every exported metric follows Prometheus naming rules (base units, `tessera_` prefix)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.deploy.exported_metrics import METRIC, exported_series, families

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "tessera-dashboard.json"
# units Prometheus asks to be given in base units instead (bytes, seconds, ratios 0-1)
_NOT_BASE_UNITS = ("_percent", "_mib", "_kib", "_gib", "_mb", "_ms", "_milliseconds", "_minutes")


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
        used = {m for t in targets for m in METRIC.findall(t["expr"])}
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
        "tessera_node_isolation_layer_up",
        "tessera_device_plugin_registered",
        "tessera_nri_connected",
        "tessera_mps_daemon_up",
        "tessera_scheduler_gangs_waiting_past_timeout",
    ):
        assert metric in text


REPLICATED = (
    "tessera_gpu_core_allocated_ratio",
    "tessera_gpu_memory_allocated_bytes",
    "tessera_gpu_memory_total_bytes",
    "tessera_scheduler_fenced_nodes",
    "tessera_nodes_unusable",
    "tessera_invalid_allocation_records",
    "tessera_pods_allocated",
    "tessera_scheduler_node_unusable",
    "tessera_scheduler_gangs_waiting_past_timeout",
)
"""The cluster's state as tessera-scheduler exports it: every replica does (the standby
keeps its watches in sync), so a sum over the replicas scraped counts it once per replica."""
READY_ONLY = re.compile(
    rf"\(({'|'.join(REPLICATED)}) and on \(instance\) tessera_scheduler_ready == 1\)"
)


def test_the_cluster_state_is_read_from_the_ready_replica_alone() -> None:
    """Both shipped replicas are scraped (the metrics Service publishes unready pods too):
    each read of the replicated state keeps the ready replica's series only."""
    for panel in _panels():
        for target in panel["targets"]:  # type: ignore[attr-defined]
            expr = str(target["expr"])
            reads = [m for m in METRIC.findall(expr) if m in REPLICATED]
            assert len(READY_ONLY.findall(expr)) == len(reads), (panel["title"], expr)


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
    assert set(METRIC.findall(bogus)) - exported_series() == {"tessera_gpu_core_allocated_percent"}


@pytest.mark.parametrize(("component", "name", "kind"), families())
def test_metric_names_follow_prometheus_rules(component: str, name: str, kind: str) -> None:
    assert re.fullmatch(r"tessera_[a-z][a-z0-9_]*", name), (component, name)
    assert not name.endswith(_NOT_BASE_UNITS), f"{component}: {name} is not in base units"
    assert not name.endswith("_total"), f"{component}: {name} (the client adds _total)"
    if kind == "histogram":
        assert name.endswith(("_seconds", "_bytes")), f"{component}: {name} has no unit"
