"""The Kubernetes edge at scale: a full list of 150,000 pods (5,000 nodes x 30) and a stream
of watch events, through kube_edge's informer and through the official client's typed API
(`CoreV1Api` list pages and `kubernetes.watch.Watch`, which decode every object into models).

A child process serves the pages (one pre-encoded page of realistic pods, renamed per page)
so that the server costs nothing measurable; each client runs in a fresh child process and
reports its CPU seconds and peak RSS.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.common import BenchContext, Result, serving_child

ROOT = Path(__file__).resolve().parent.parent
PAGE = 500


def pod(i: int, page: int) -> dict[str, Any]:
    """A running pod as the API server returns it, with a tessera allocation record."""
    name = f"job-{page:05d}-{i:03d}"
    node = f"node-{(page * PAGE + i) % 5000:04d}"
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"{page:08d}-{i:04d}-4000-8000-000000000000",
            "resourceVersion": str(1000 + page * PAGE + i),
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "trainer", "team": "vision", "job": f"job-{page}"},
            "annotations": {"tessera.dev/allocation": "v2." + "A" * 380},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": f"job-{page}", "uid": "x"}
            ],
        },
        "spec": {
            "nodeName": node,
            "priority": 0,
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/trainer:1.0",
                    "command": ["python", "train.py"],
                    "env": [{"name": "EPOCHS", "value": "10"}],
                    "resources": {
                        "limits": {"tessera.dev/gpu-core": "50", "tessera.dev/gpu-memory": "50"},
                        "requests": {"cpu": "4", "memory": "16Gi"},
                    },
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/data"},
                        {
                            "name": "kube-api-access",
                            "mountPath": "/var/run/secrets",
                            "readOnly": True,
                        },
                    ],
                }
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": "10.1.2.3",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.example/trainer:1.0",
                    "imageID": "sha256:" + "0" * 64,
                    "containerID": "containerd://" + "1" * 64,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:02Z"}},
                }
            ],
        },
    }


# --- the page server (child process) ---------------------------------------------------------


def serve(pods: int, events: int) -> None:
    pages = (pods + PAGE - 1) // PAGE
    items = [pod(i, 0) for i in range(PAGE)]
    template = json.dumps(items, separators=(",", ":")).encode()
    lines = b"".join(
        json.dumps({"type": "MODIFIED", "object": pod(i % PAGE, 7)}, separators=(",", ":")).encode()
        + b"\n"
        for i in range(min(events, 2000))
    )

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if "watch=" in self.path:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                sent = 0
                while sent < events:
                    chunk = (
                        lines if events - sent >= 2000 else lines[: _prefix(lines, events - sent)]
                    )
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    sent += min(2000, events - sent)
                self.wfile.write(b"0\r\n\r\n")
                return
            page = 0
            if "continue=" in self.path:
                page = int(self.path.split("continue=")[1].split("&")[0])
            body_items = template.replace(b"job-00000-", b"job-%05d-" % page).replace(
                b'"uid":"00000000-', b'"uid":"%08d-' % page
            )
            meta: dict[str, Any] = {"resourceVersion": "999999"}
            if page + 1 < pages:
                meta["continue"] = str(page + 1)
            body = b'{"kind":"PodList","apiVersion":"v1","metadata":%s,"items":%s}' % (
                json.dumps(meta).encode(),
                body_items,
            )
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


def _prefix(lines: bytes, count: int) -> int:
    end = 0
    for _ in range(count):
        end = lines.index(b"\n", end) + 1
    return end


# --- the clients (each in its own child process) ----------------------------------------------


def ours(url: str) -> dict[str, float]:
    from kube_edge.client import KubeClient
    from kube_edge.informer import Handler, Informer

    class Keep(Handler):
        """Keeps what the scheduler's pod handler keeps of each pod: its name and node."""

        def __init__(self) -> None:
            self.seen: dict[str, str] = {}

        def replace(self, items: Any) -> None:
            self.seen = {i["metadata"]["uid"]: i["spec"].get("nodeName", "") for i in items}

        def event(self, kind: str, obj: dict[str, Any]) -> None:
            self.seen[obj["metadata"]["uid"]] = obj["spec"].get("nodeName", "")

    rss0 = _rss_mb()
    handler = Keep()
    informer = Informer(KubeClient.for_host(url), "/api/v1/pods", handler, name="pods")
    cpu = time.process_time()
    informer.list_once()
    listed = time.process_time() - cpu
    cpu = time.process_time()
    informer.watch_once()
    return _figures(listed, time.process_time() - cpu, rss0, len(handler.seen))


def official(url: str) -> dict[str, float]:
    from kubernetes import client, watch

    rss0 = _rss_mb()
    cfg = client.Configuration()
    cfg.host = url
    api: Any = client.CoreV1Api(client.ApiClient(cfg))  # typed models, read loosely here
    seen: dict[str, str] = {}
    cpu = time.process_time()
    token = None
    while True:
        page = api.list_pod_for_all_namespaces(limit=PAGE, _continue=token)
        for item in page.items:
            seen[item.metadata.uid] = item.spec.node_name or ""
        token = page.metadata._continue
        if not token:
            break
    listed = time.process_time() - cpu
    cpu = time.process_time()
    watch_class: Any = watch.Watch  # untyped in the package
    watcher = watch_class()
    for event in watcher.stream(
        api.list_pod_for_all_namespaces, resource_version="999999", timeout_seconds=60
    ):
        obj = event["object"]
        seen[obj.metadata.uid] = obj.spec.node_name or ""
    return _figures(listed, time.process_time() - cpu, rss0, len(seen))


def _figures(listed: float, watched: float, rss0: float, pods: int) -> dict[str, float]:
    """What each client reports: CPU seconds to list and to watch, peak and starting memory
    (MB), and how many pods it ended up holding."""
    return {
        "list_cpu_s": listed,
        "watch_cpu_s": watched,
        "peak_mb": _peak_mb(),
        "rss0": rss0,
        "pods": pods,
    }


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def _child(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "bench.bench_kube_edge", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return out.stdout.strip().splitlines()[-1]


def compare(pods: int, events: int) -> dict[str, dict[str, float]]:
    with serving_child("bench.bench_kube_edge", "--serve", str(pods), str(events)) as url:
        return {which: json.loads(_child(f"--{which}", url)) for which in ("ours", "official")}


def run(ctx: BenchContext) -> list[Result]:
    pods, events = ctx.sized(quick=(15_000, 2_000), full=(150_000, 20_000))
    figures = compare(pods, events)
    results = []
    for which, label in (
        ("ours", "kube_edge informer"),
        ("official", "kubernetes CoreV1Api + Watch"),
    ):
        f = figures[which]
        results += [
            Result(
                f"list {pods:,} pods, {label}",
                f["list_cpu_s"],
                "s CPU",
                note="pages of 500; each pod kept as uid -> node",
            ),
            Result(
                f"{events:,} watch events, {label}", f["watch_cpu_s"] * 1e6 / events, "us CPU/event"
            ),
            Result(
                f"peak RSS listing {pods:,} pods, {label}",
                f["peak_mb"],
                "MB",
                note=f"{f['rss0']:.0f} MB after imports",
            ),
        ]
    return results


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "--serve":
        serve(int(sys.argv[2]), int(sys.argv[3]))
    elif mode == "--ours":
        print(json.dumps(ours(sys.argv[2])))
    elif mode == "--official":
        print(json.dumps(official(sys.argv[2])))
    else:
        for r in run(BenchContext(openb=Path("."), quick="--quick" in sys.argv)):
            print(f"{r.name}: {r.measured_text()}  {r.note}")
