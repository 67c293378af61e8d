"""`make bench-scale`'s pure parts: its section of docs/benchmarks.md (that `make bench`
keeps it: tests/test_bench_runner.py), the latency quantile it reads from tessera's
histogram, the node names it sends the extender, and the nodes' inventories."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import scale
from bench import scale_common as sc


def test_the_scale_section_is_appended_then_replaced(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n| a | b |\n")
    scale.write_section(["first figures"], doc)
    scale.write_section(["second figures"], doc)
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\n| a | b |\n")
    assert "second figures" in text and "first figures" not in text
    assert text.count(scale.SECTION_START) == 1 and text.count(scale.SECTION_END) == 1


def test_histogram_quantile_interpolates_inside_the_bucket() -> None:
    h = sc.Histogram({0.001: 0.0, 0.005: 50.0, 0.01: 100.0, float("inf"): 100.0})
    assert h.quantile(0.5) == pytest.approx(0.005)
    assert h.quantile(0.99) == pytest.approx(0.0099)
    before = sc.Histogram({0.001: 0.0, 0.005: 50.0, 0.01: 50.0, float("inf"): 50.0})
    assert h.minus(before).count == 50.0
    assert h.minus(before).quantile(0.5) == pytest.approx(0.0075)


def test_histograms_are_read_per_verb_from_the_metrics_text() -> None:
    text = (
        "# HELP tessera_scheduler_request_duration_seconds Time\n"
        "# TYPE tessera_scheduler_request_duration_seconds histogram\n"
        'tessera_scheduler_request_duration_seconds_bucket{verb="bind",le="0.01"} 3.0\n'
        'tessera_scheduler_request_duration_seconds_bucket{verb="bind",le="+Inf"} 4.0\n'
        'tessera_scheduler_request_duration_seconds_count{verb="bind"} 4.0\n'
        'tessera_scheduler_request_duration_seconds_sum{verb="bind"} 0.5\n'
    )
    (verb,) = sc.verb_histograms(text).items()
    assert verb[0] == "bind" and verb[1].count == 4.0


def test_the_binding_writes_are_read_beside_the_verbs() -> None:
    from scheduler_plugin.views.metrics import Metrics

    metrics = Metrics()
    metrics.observe("bind", 0.02, "bound")
    for seconds in (0.004, 0.006, 0.03):
        metrics.binding_writes.observe(seconds)
    verbs = sc.verb_histograms(b"".join(metrics.chunks()).decode())
    assert verbs["bind"].count == 1.0 and verbs[sc.BINDING_WRITE].count == 3.0
    assert 0.0025 < verbs[sc.BINDING_WRITE].quantile(0.5) <= 0.0075


def test_a_rounds_bind_line_names_each_histograms_quantiles() -> None:
    verbs = {"bind": sc.Histogram({0.01: 2.0, 0.05: 4.0, float("inf"): 4.0})}
    api = sc.Histogram({0.005: 3.0, 0.025: 4.0, float("inf"): 4.0})
    line = sc.bind_latencies(verbs, api)
    # bind: p50 at rank 2 ends the 10 ms bucket, p99 (rank 3.96) inside 10-50 ms
    assert line.startswith("bind p50 / p99: 10.0 ms / 49.2 ms;")
    assert "its Binding POST -;" in line  # no write histogram in this round
    assert line.endswith("the API server's Binding 3.3 ms / 24.2 ms")


def test_connections_are_counted_from_the_schedulers_own_metrics() -> None:
    from scheduler_plugin.views.metrics import Metrics

    metrics = Metrics()
    metrics.connections.labels("http/1.1").inc(3)
    metrics.connections.labels("h2").inc()
    assert sc.connections_opened(b"".join(metrics.chunks()).decode()) == 4.0


@pytest.mark.parametrize(("nodes", "sent"), [(50, 50), (500, 230), (5000, 500), (20000, 1000)])
def test_node_names_sent_follow_kube_schedulers_adaptive_percentage(nodes: int, sent: int) -> None:
    assert sc.feasible_to_find(nodes) == sent


def test_each_node_has_its_own_name_and_gpu_uuids() -> None:
    template = {
        "nodeName": "template",
        "gpus": [{"uuid": f"GPU-8f4c3a0e-0000-4000-8000-00000000000{i}"} for i in range(8)],
    }
    specs = [sc.node_inventory(template, i) for i in range(300)]
    assert [s["nodeName"] for s in specs[:2]] == [sc.node_name(0), sc.node_name(1)]
    uuids = [g["uuid"] for s in specs for g in s["gpus"]]
    assert len(set(uuids)) == len(uuids) == 300 * 8


@pytest.mark.parametrize(
    ("requested", "asked_real", "missing", "mode"),
    [
        ("auto", False, "", "real"),
        ("auto", True, "", "real"),
        ("auto", False, "e2e needs kube-scheduler", "testbed"),
        ("testbed", True, "", "testbed"),
        ("real", False, "", "real"),
    ],
)
def test_the_mode_follows_what_was_given(
    requested: str, asked_real: bool, missing: str, mode: str
) -> None:
    assert scale.choose_mode(requested, asked_real, missing) == mode


@pytest.mark.parametrize(("requested", "asked_real"), [("auto", True), ("real", False)])
def test_a_named_binary_folder_that_lacks_one_is_an_error_not_a_testbed_run(
    requested: str, asked_real: bool
) -> None:
    with pytest.raises(ValueError, match="kube-scheduler"):
        scale.choose_mode(requested, asked_real, "e2e needs kube-scheduler")


def test_the_api_servers_counts_and_binding_latency_are_read_from_its_metrics() -> None:
    binding = 'resource="pods",subresource="binding",verb="POST"'
    text = "\n".join(
        [
            "# TYPE apiserver_request_total counter",
            f'apiserver_request_total{{code="201",{binding}}} 7',
            f'apiserver_request_total{{code="409",{binding}}} 1',
            'apiserver_request_total{code="200",resource="pods",subresource="",verb="GET"} 3',
            "# TYPE apiserver_request_duration_seconds histogram",
            f'apiserver_request_duration_seconds_bucket{{{binding},le="0.025"}} 2',
            f'apiserver_request_duration_seconds_bucket{{{binding},le="0.05"}} 8',
            f'apiserver_request_duration_seconds_bucket{{{binding},le="+Inf"}} 8',
            'apiserver_request_duration_seconds_bucket{resource="pods",subresource="",'
            'verb="POST",le="0.025"} 5',
            'apiserver_request_duration_seconds_bucket{resource="pods",subresource="",'
            'verb="POST",le="+Inf"} 5',
            f"apiserver_request_duration_seconds_sum{{{binding}}} 0.2",
            f"apiserver_request_duration_seconds_count{{{binding}}} 8",
            "",
        ]
    )
    counts, latency = sc.api_server_metrics(text)
    assert counts == {"POST pods/binding": 8.0, "GET pods/": 3.0}
    assert latency.count == 8
    assert 0.025 < latency.quantile(0.5) < 0.05


def test_thread_cpu_is_read_per_named_thread_and_pools_are_summed() -> None:
    import os
    import threading
    import time

    from tessera_edge.threads import name_os_threads

    stop = threading.Event()

    def spin() -> None:
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        stop.wait(5)

    name_os_threads()
    try:
        threads = [threading.Thread(target=spin, name=f"spinner_{i}") for i in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        seen = sc.thread_cpu_seconds(os.getpid())
    finally:
        stop.set()
        threading.setprofile(None)
        for t in threads:
            t.join(5)
    # both numbered threads land under one name, with at least most of their 0.1 s of CPU
    assert "spinner" in seen and "spinner_0" not in seen
    assert seen["spinner"] >= 0.07


def test_cpu_by_thread_reads_busiest_first_in_ms_per_pod() -> None:
    text = sc.by_thread({"watch-pods": 0.4, "http-extender": 2.0, "idle": 0.0}, pods=1000)
    assert text == "http-extender 2.00, watch-pods 0.40"
    assert sc.cpu_delta({"a": 3.0, "b": 1.0}, {"a": 1.0}) == {"a": 2.0, "b": 1.0}
