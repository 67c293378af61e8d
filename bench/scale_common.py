"""What both scale benchmarks share: the cluster's objects, the pods, process CPU and
memory, and the extender's latency histogram."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera import resources as rn

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = ROOT / "tessera_edge" / "topologies" / "h100-sxm-8x.yaml"
"""8x H100 80GB with 4 RDMA NICs, the node agent's fake backend: each node's NodeDevices is
what a real agent on such a node publishes, with GPU UUIDs of its own."""
PLAIN = "example.com/gpu"
"""The extended resource kube-scheduler places alone (no extender), 8 per node."""
NAMESPACE = "default"
LABEL = "tessera.dev/bench"

SHAPES: tuple[dict[str, str], ...] = (
    {rn.GPU_CORE: "30", rn.GPU_MEMORY_RATIO: "30"},
    {rn.GPU: "100"},
    {rn.GPU: "200", rn.RDMA: "100"},
    {rn.GPU_CORE: "50", rn.GPU_MEMORY: "20"},
)
"""Pod shapes in turn: a 30% share, a whole GPU, two GPUs with an RDMA NIC, a half-GPU
with 20 GiB."""


def agent_inventory() -> tuple[dict[str, Any], dict[str, int]]:
    """(NodeDevices spec, unit counts) of one node, as the node agent prints them."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "deviceplugin.cli",
            "--backend=fake",
            f"--topology={TOPOLOGY}",
            "--node-name=template",
            "--nvidia-gpu",
            "--print-inventory",
            "--no-inventory",
        ],
        capture_output=True,
        check=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    doc = json.loads(out.stdout)
    return doc["spec"], {k: int(v) for k, v in doc["units"].items()}


def node_name(i: int) -> str:
    return f"scale-node-{i:05d}"


def node_inventory(template: dict[str, Any], index: int) -> dict[str, Any]:
    """The template inventory for node `index`: its name, and GPU UUIDs unique in the
    cluster (the UUID's first group is the node's index)."""
    text = json.dumps(template).replace('"template"', json.dumps(node_name(index)))
    return dict(json.loads(re.sub(r"GPU-[0-9a-f]{8}", f"GPU-{index:08x}", text)))


def node_devices(template: dict[str, Any], index: int) -> dict[str, Any]:
    """The NodeDevices object of node `index`."""
    return {
        "apiVersion": rn.INVENTORY_API_VERSION,
        "kind": rn.INVENTORY_KIND,
        "metadata": {"name": node_name(index)},
        "spec": node_inventory(template, index),
    }


def node_capacity(units: dict[str, int]) -> dict[str, str]:
    counts = {k: str(v) for k, v in units.items()}
    return {**counts, PLAIN: "8", "cpu": "64", "memory": "512Gi", "pods": "110"}


def pod(name: str, run: str, index: int, tessera: bool) -> dict[str, Any]:
    """Pod `index` of a round: a tessera shape, or one unit of PLAIN for kube-scheduler alone."""
    limits = SHAPES[index % len(SHAPES)] if tessera else {PLAIN: "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {LABEL: run}},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": "pause", "resources": {"limits": limits}}],
        },
    }


def feasible_to_find(nodes: int) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops filtering (its
    adaptive percentageOfNodesToScore: 50% minus 1% per 125 nodes, at least 5%, at
    least 100 nodes): what it sends the extender."""
    if nodes < 100:
        return nodes
    pct = max(5, 50 - nodes // 125)
    return max(100, nodes * pct // 100)


# --- processes --------------------------------------------------------------------------------


def _stat_cpu(stat: Path) -> float:
    """utime + stime from a /proc stat file, in seconds."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (its threads included), in seconds."""
    return _stat_cpu(Path(f"/proc/{pid}/stat"))


def own_thread_cpu_seconds(native_id: int) -> float:
    """utime + stime of one thread of this process (`Thread.native_id`), in seconds."""
    return _stat_cpu(Path(f"/proc/self/task/{native_id}/stat"))


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """utime + stime of a process's threads by OS thread name (tessera names its threads as
    Python does, tessera_edge.threads), a pool's numbered threads together (`verb_0`,
    `verb_1`: `verb`). Threads that ended are not counted."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().rstrip("\n")
            seconds = _stat_cpu(task / "stat")
        except OSError:  # the thread ended while being read
            continue
        name = re.sub(r"_\d+$", "", name)
        out[name] = out.get(name, 0.0) + seconds
    return out


def cpu_delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def by_thread(threads: dict[str, float], pods: int, least_ms: float = 0.005) -> str:
    """`http-extender 2.10, watch-pods 0.40, ...`: CPU ms per pod, busiest first."""
    per_pod = sorted(((v * 1000 / pods, k) for k, v in threads.items()), reverse=True)
    return ", ".join(f"{k} {ms:.2f}" for ms, k in per_pod if ms >= least_ms) or "-"


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load_text() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} on {os.cpu_count()} CPUs"


# --- the extender's latency histogram ----------------------------------------------------------


@dataclass
class Histogram:
    """Cumulative bucket counts of one verb of tessera_scheduler_request_duration_seconds."""

    buckets: dict[float, float] = field(default_factory=dict)

    def minus(self, before: Histogram) -> Histogram:
        return Histogram({le: n - before.buckets.get(le, 0.0) for le, n in self.buckets.items()})

    @property
    def count(self) -> float:
        return self.buckets.get(float("inf"), 0.0)

    def quantile(self, q: float) -> float:
        """Seconds, interpolated inside the bucket as Prometheus' histogram_quantile does."""
        total = self.count
        if total <= 0:
            return float("nan")
        rank = q * total
        lower, below = 0.0, 0.0
        for le in sorted(self.buckets):
            n = self.buckets[le]
            if n >= rank:
                if le == float("inf"):
                    return lower
                return lower + (le - lower) * (rank - below) / max(n - below, 1e-9)
            lower, below = le, n
        return lower


BINDING_WRITE = "binding write"
"""`verb_histograms`' key for tessera_scheduler_binding_write_seconds: the Binding POSTs as
tessera-scheduler reads them."""


def verb_histograms(metrics_text: str) -> dict[str, Histogram]:
    """tessera_scheduler_request_duration_seconds by verb, and the Binding POSTs' histogram
    under BINDING_WRITE."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Histogram] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name not in (
            "tessera_scheduler_request_duration_seconds",
            "tessera_scheduler_binding_write_seconds",
        ):
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                verb = sample.labels.get("verb", BINDING_WRITE)
                le = float(sample.labels["le"])
                out.setdefault(verb, Histogram()).buckets[le] = sample.value
    return out


def bind_latencies(verbs: dict[str, Histogram], api_binding: Histogram) -> str:
    """A round's binds in one line: the extender's answer, its Binding POST as it read
    it, and the API server's own time for the round's Bindings (p50 / p99 each)."""

    def both(h: Histogram | None) -> str:
        if h is None or not h.count:
            return "-"
        return f"{ms(h.quantile(0.5))} / {ms(h.quantile(0.99))}"

    return (
        f"bind p50 / p99: {both(verbs.get('bind'))}; its Binding POST "
        f"{both(verbs.get(BINDING_WRITE))}; the API server's Binding {both(api_binding)}"
    )


def connections_opened(metrics_text: str) -> float:
    """Connections tessera-scheduler's extender port has accepted, every protocol
    (tessera_scheduler_connections_total)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics_text)
        if family.name == "tessera_scheduler_connections"
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def api_server_metrics(metrics_text: str) -> tuple[dict[str, float], Histogram]:
    """kube-apiserver's request counts by "VERB resource/subresource", and its latency
    histogram of Binding POSTs (apiserver_request_duration_seconds), from its /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[str, float] = {}
    binding = Histogram()
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            lab = sample.labels
            if sample.name == "apiserver_request_total":
                key = f"{lab.get('verb')} {lab.get('resource')}/{lab.get('subresource', '')}"
                counts[key] = counts.get(key, 0.0) + sample.value
            elif sample.name == "apiserver_request_duration_seconds_bucket" and (
                lab.get("verb"),
                lab.get("resource"),
                lab.get("subresource"),
            ) == ("POST", "pods", "binding"):
                le = float(lab["le"])
                binding.buckets[le] = binding.buckets.get(le, 0.0) + sample.value
    return counts, binding


def histogram_delta(after: str, before: str) -> dict[str, Histogram]:
    old = verb_histograms(before)
    return {v: h.minus(old.get(v, Histogram())) for v, h in verb_histograms(after).items()}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"
