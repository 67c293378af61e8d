"""The helpers that put a real Prometheus into `make e2e` and `make bench`
(tests/e2e/prometheus.py) and send the dashboard's queries as Grafana does
(tests/e2e/grafana.py): the scrape configuration, the heartbeat alert's twin with a shorter
`for:`, Grafana's variable substitution, and the runner against the real binary.

The runner's case needs Debian's `prometheus` package, as the promtool tests do
(tests/deploy/test_alerts.py): without it, it fails saying how to install it, unless
TESSERA_SKIP_PROMTOOL=1 leaves the package's tests out.
"""

from __future__ import annotations

import copy
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, start_http_server

from tests.e2e import grafana
from tests.e2e import prometheus as prom
from tests.e2e.controlplane import free_port

DASHBOARD = prom.ROOT / "deploy" / "grafana" / "tessera-dashboard.json"
SHIPPED = yaml.safe_load(prom.RULES.read_text())
SKIP_VAR = "TESSERA_SKIP_PROMTOOL"


# --- the scrape configuration ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"), [(2.0, "2s"), (30, "30s"), (0.5, "500ms"), (1.25, "1250ms")]
)
def test_durations_are_written_as_prometheus_reads_them(seconds: float, text: str) -> None:
    assert prom.duration(seconds) == text


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf")])
def test_a_duration_must_be_positive_and_finite(seconds: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        prom.duration(seconds)


def test_the_scrape_configuration_has_one_plain_http_job_per_program() -> None:
    config = prom.scrape_config(
        {
            prom.SCHEDULER_JOB: ["10.0.0.5:8081", "10.0.0.6:8081"],
            prom.AGENT_JOB: ["10.0.1.7:9465"],
            prom.HOOK_JOB: ["10.0.1.7:9466"],
        },
        scrape_interval=30,
        evaluation_interval=15,
        rule_files=[prom.RULES],
    )
    assert config["global"] == {
        "scrape_interval": "30s",
        "scrape_timeout": "30s",
        "evaluation_interval": "15s",
    }
    assert config["rule_files"] == [str(prom.RULES)]
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert list(jobs) == [prom.SCHEDULER_JOB, prom.AGENT_JOB, prom.HOOK_JOB]
    for job in jobs.values():
        assert job["scheme"] == "http" and job["metrics_path"] == "/metrics"
    assert jobs[prom.SCHEDULER_JOB]["static_configs"] == [
        {"targets": ["10.0.0.5:8081", "10.0.0.6:8081"]}
    ]


def test_the_job_names_are_the_ones_the_rule_tests_scrape() -> None:
    """The promtool cases give each series the job of its program: the e2e and bench jobs
    carry the same names."""
    cases = "".join(p.read_text() for p in (prom.RULES.parent / "tests").glob("*.yaml"))
    for job in (prom.SCHEDULER_JOB, prom.AGENT_JOB, prom.HOOK_JOB):
        assert f'job="{job}"' in cases


def test_a_scrape_timeout_longer_than_the_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="longer than the interval"):
        prom.scrape_config(
            {"a": ["h:1"]}, scrape_interval=2, evaluation_interval=1, scrape_timeout=3
        )


def test_a_job_without_targets_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a target"):
        prom.scrape_config({"a": []}, scrape_interval=2, evaluation_interval=1)


# --- the heartbeat alert's twin ------------------------------------------------------------------


def test_the_twin_holds_the_one_alert_with_only_its_for_changed() -> None:
    twin = prom.with_shorter_for(SHIPPED, "TesseraNodeAgentSilent", "20s")
    group, rule = prom.find_alert(SHIPPED, "TesseraNodeAgentSilent")
    ((twin_group,),) = [twin["groups"]]
    assert twin_group["name"] == group["name"]
    ((twin_rule,),) = [twin_group["rules"]]
    assert twin_rule == {**rule, "for": "20s"} and rule["for"] == "10m"
    assert prom.changed_fields(SHIPPED, twin) == [f"{group['name']}/TesseraNodeAgentSilent: for"]
    assert prom.find_alert(SHIPPED, "TesseraNodeAgentSilent")[1]["for"] == "10m"  # untouched


def test_any_other_difference_in_the_twin_is_found() -> None:
    twin = prom.with_shorter_for(SHIPPED, "TesseraNodeAgentSilent", "20s")
    tampered = copy.deepcopy(twin)
    tampered["groups"][0]["rules"][0]["expr"] += " > 1"
    tampered["groups"][0]["rules"][0]["labels"]["severity"] = "critical"
    tampered["groups"][0]["interval"] = "1s"
    name = tampered["groups"][0]["name"]
    assert prom.changed_fields(SHIPPED, tampered) == [
        f"{name}/TesseraNodeAgentSilent: group interval",
        f"{name}/TesseraNodeAgentSilent: expr",
        f"{name}/TesseraNodeAgentSilent: for",
        f"{name}/TesseraNodeAgentSilent: labels",
    ]


def test_an_alert_without_a_for_or_missing_has_no_twin() -> None:
    with pytest.raises(ValueError, match="no for:"):
        prom.with_shorter_for(SHIPPED, "TesseraGpuSharesWithoutIsolation", "20s")
    with pytest.raises(KeyError, match="TesseraNoSuchAlert"):
        prom.with_shorter_for(SHIPPED, "TesseraNoSuchAlert", "20s")


# --- Grafana's variables -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw_ms", "step_ms"),
    [
        (5, 1),
        (10, 10),
        (14.9, 10),
        (15, 20),
        (1_499, 1_000),
        (1_500, 2_000),
        (21_600, 20_000),
        (600_000, 600_000),
        (4_000_000_000, 31_536_000_000),
    ],
)
def test_intervals_round_to_grafanas_steps(raw_ms: float, step_ms: int) -> None:
    assert grafana.round_interval(raw_ms) == step_ms


@pytest.mark.parametrize(
    ("ms", "text"),
    [(500, "500ms"), (20_000, "20s"), (60_000, "1m"), (90_000, "1m"), (3_600_000, "1h")],
)
def test_intervals_are_written_in_their_largest_whole_unit(ms: int, text: str) -> None:
    assert grafana.hms(ms) == text


def _query(expr: str, min_interval: str | None = None) -> grafana.PanelQuery:
    return grafana.PanelQuery("panel", "A", expr, min_interval)


SIX_HOURS = grafana.View(range_s=21_600, max_data_points=1000, scrape_interval_s=2)


def test_builtins_follow_the_range_the_width_and_the_scrape_interval() -> None:
    assert grafana.builtins(SIX_HOURS, None) == {
        "__interval": "20s",
        "__interval_ms": "20000",
        "__rate_interval": "22s",
        "__range": "21600s",
        "__range_s": "21600",
        "__range_ms": "21600000",
    }
    default_scrape = grafana.View(range_s=3600, max_data_points=1000, scrape_interval_s=15)
    assert grafana.builtins(default_scrape, None)["__interval"] == "15s"  # 3.6 s -> floor
    assert grafana.builtins(default_scrape, None)["__rate_interval"] == "60s"
    assert grafana.builtins(SIX_HOURS, "1m")["__interval"] == "1m"
    assert grafana.builtins(SIX_HOURS, "1m")["__rate_interval"] == "240s"


@pytest.mark.parametrize(
    ("expr", "sent"),
    [
        ("rate(x[$__rate_interval])", "rate(x[22s])"),
        ("rate(x[${__interval}])", "rate(x[20s])"),
        ("increase(x[[[__range]]])", "increase(x[21600s])"),
        ('x{node="$node"}', 'x{node="gpu\\\\\'7"}'),
        ('x{gpu=~"$gpu"}', 'x{gpu=~"(0|1\\\\.5)"}'),
        ('x{le="+Inf"} and y{a=~"b$"}', 'x{le="+Inf"} and y{a=~"b$"}'),
    ],
)
def test_variables_are_replaced_as_grafanas_prometheus_source_does(expr: str, sent: str) -> None:
    view = grafana.View(
        range_s=21_600,
        max_data_points=1000,
        scrape_interval_s=2,
        variables={
            "node": grafana.Variable(("gpu'7",)),
            "gpu": grafana.Variable(("0", "1.5"), multi=True),
        },
    )
    assert grafana.substitute(_query(expr), view) == sent


@pytest.mark.parametrize("expr", ['x{node="$node"}', "x[${__interval:text}]"])
def test_a_variable_without_a_value_or_a_format_is_an_error(expr: str) -> None:
    with pytest.raises(grafana.VariableError, match="panel/A"):
        grafana.substitute(_query(expr), SIX_HOURS)


def test_panel_queries_come_from_rows_too_and_skip_hidden_ones() -> None:
    dashboard = {
        "panels": [
            {"title": "a", "interval": "30s", "targets": [{"refId": "A", "expr": "x"}]},
            {
                "title": "row",
                "type": "row",
                "panels": [
                    {
                        "title": "b",
                        "targets": [
                            {"refId": "A", "expr": "y", "interval": "1m"},
                            {"refId": "B", "expr": "z", "hide": True},
                        ],
                    }
                ],
            },
        ]
    }
    assert grafana.panel_queries(dashboard) == [
        grafana.PanelQuery("a", "A", "x", "30s"),
        grafana.PanelQuery("b", "A", "y", "1m"),
    ]


def test_the_time_range_is_read_from_the_dashboard() -> None:
    assert grafana.default_range_s({"time": {"from": "now-6h", "to": "now"}}) == 21_600
    with pytest.raises(ValueError, match="relative"):
        grafana.default_range_s({"time": {"from": "2026-01-01T00:00:00Z", "to": "now"}})


def test_every_shipped_panel_query_can_be_sent() -> None:
    """The dashboard uses no variable the e2e case has no value for (it would fail there)."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = grafana.panel_queries(dashboard)
    assert len(queries) >= 20
    view = grafana.View(grafana.default_range_s(dashboard), 1000, 2)
    assert all(grafana.substitute(q, view) for q in queries)


# --- the runner, with the real binary ------------------------------------------------------------


def _executable() -> Path:
    found = prom.binary()
    if found is not None:
        return found
    if os.environ.get(SKIP_VAR) == "1":
        pytest.skip(f"Prometheus is not installed ({SKIP_VAR}=1 leaves these tests out)")
    pytest.fail(
        f"{prom.missing('this test')}; or set {SKIP_VAR}=1 to leave the Prometheus package's "
        "tests out",
        pytrace=False,
    )


@pytest.fixture
def exporter() -> Iterator[tuple[int, Counter]]:
    """A /metrics endpoint with one counter, on a loopback port."""
    registry = CollectorRegistry()
    counter = Counter("tessera_probe", "A counter for the runner's test", registry=registry)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield port, counter
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_the_real_prometheus_scrapes_answers_and_loads_the_rules(
    tmp_path: Path, exporter: tuple[int, Counter]
) -> None:
    port, counter = exporter
    counter.inc(3)
    shipped_alerts = [r["alert"] for g in SHIPPED["groups"] for r in g["rules"]]
    twin = tmp_path / "twin.yaml"
    twin.write_text(yaml.safe_dump(prom.with_shorter_for(SHIPPED, "TesseraNodeAgentSilent", "5s")))
    config = prom.scrape_config(
        {"probe": [f"127.0.0.1:{port}"]},
        scrape_interval=0.5,
        evaluation_interval=0.5,
        rule_files=[prom.RULES, twin],
    )
    with prom.running(_executable(), tmp_path / "prometheus", config, free_port()) as p:
        deadline = time.monotonic() + 30
        while not p.targets_up():
            assert time.monotonic() < deadline, p.tail()
            time.sleep(0.2)
        assert p.targets_up() == {f"probe/127.0.0.1:{port}": True}
        (sample,) = p.query("tessera_probe_total")
        assert sample["metric"]["job"] == "probe" and sample["value"][1] == "3"
        assert prom.finite(p.query("scalar(tessera_probe_total) / 0 * 0")) == []
        with pytest.raises(prom.PrometheusError, match="bad_data"):
            p.query("sum(rate(tessera_probe_total[5m]")
        while any(r["health"] == "unknown" for r in p.alert_rules()):
            assert time.monotonic() < deadline, p.tail()
            time.sleep(0.2)
        rules = p.alert_rules()
        assert sorted(r["name"] for r in rules if r["file"] == str(prom.RULES)) == sorted(
            shipped_alerts
        )
        assert all(r["health"] == "ok" for r in rules), rules
        (short,) = [r for r in rules if r["file"] == str(twin)]
        assert short["name"] == "TesseraNodeAgentSilent" and short["duration"] == 5
        # no tessera-scheduler is scraped: the one alert that says so is pending
        assert [(a["labels"]["alertname"], a["state"]) for a in p.alerts()] == [
            ("TesseraSchedulerNoLeader", "pending")
        ]
