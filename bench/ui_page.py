"""The allocation page on a big cluster: a running tessera-scheduler (its HTTP server, its
state) holding N half-full 8-GPU nodes, some of them not ready or fenced, with a testbed
API server behind it for binds, and headless Chromium on its /debug/ui. Used by the page's
benchmark (bench/bench_ui.py) and its test at 5,000 nodes (tests/scheduler).

The state is filled directly, as the watches would fill it (the benchmark's half-full
cluster, bench_scheduler.half_full_cache): listing 5,000 NodeDevices through an API server
takes most of a minute here and is not what is measured. Binds go the whole way: filter,
prioritize and bind over HTTP, the Binding and the record written to the API server.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.bench_scheduler import half_full_cache
from kube_edge.client import KubeClient
from scheduler_plugin.service import Options, Service
from tessera import resources as rn
from tessera.record import Keyring
from tessera_testbed.apiserver import FakeApiServer
from tessera_testbed.browser import Browser, wait_for
from tessera_testbed.inventory import heartbeat_lease

NOT_READY = 7
"""Nodes whose heartbeat Lease is gone (every 700th node, from the 5th)."""
FENCED = 2
"""Nodes fenced by a pod with an untrusted record (every 2,500th, from the 11th)."""
FIRST_PAINT_JS = "window.tessera && window.tessera.firstPaint"


@dataclass
class PageCluster:
    fake: FakeApiServer
    service: Service
    names: list[str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.service.server.port}/debug/ui"

    def bind(self, name: str, limits: dict[str, str], nodes: list[str]) -> str | None:
        """Create pod `name` asking for `limits` and schedule it as kube-scheduler would
        over `nodes`: the node it was bound to, or None."""
        import http.client
        import json

        from scheduler_plugin.decisions.binder import BindArgs

        created = self.fake.create(
            "pods",
            {
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "containers": [
                        {"name": "main", "resources": {"limits": limits, "requests": limits}}
                    ]
                },
                "status": {"phase": "Pending"},
            },
        )
        conn = http.client.HTTPConnection("127.0.0.1", self.service.server.port, timeout=60)

        def post(path: str, body: Any) -> Any:
            conn.request("POST", path, body=json.dumps(body).encode())
            answer = conn.getresponse()
            return json.loads(answer.read())

        try:
            passed = post("/filter", {"Pod": created, "NodeNames": nodes})["NodeNames"]
            if not passed:
                return None
            node = passed[0]
            if len(passed) > 1:
                scores = post("/prioritize", {"Pod": created, "NodeNames": passed})
                node = max(scores, key=lambda s: s["Score"])["Host"]
            meta = created["metadata"]
            args = BindArgs(meta["name"], meta["namespace"], meta["uid"], node).to_json()
            return None if post("/bind", args)["Error"] else node
        finally:
            conn.close()


@contextlib.contextmanager
def page_cluster(nodes: int, seed: int = 1) -> Iterator[PageCluster]:
    with FakeApiServer() as fake:
        options = Options(
            host="127.0.0.1",
            port=0,
            leader_elect=False,
            write_status=False,
            open_debug=True,
            filter_answer="all",
        )
        service = Service(options, KubeClient.for_host(fake.url), Keyring.generate("page"))
        try:
            half_full_cache(nodes, seed, cache=service.cache)
            names = service.cache.node_names()
            for name in names[5::700][:NOT_READY]:
                service.cache.leases.gone(heartbeat_lease(name))
            for name in names[11::2500][:FENCED]:
                key = f"research/forged-{name}"
                service.cache.problems.distrust(key, f"uid-{key}", name, "record: not valid JSON")
            for informer in service.informers:  # filled above, as the watches would
                informer.synced.set()
            service.settle_memory()
            service.server.start()
            yield PageCluster(fake, service, names)
        finally:
            service.stop(release=False)


@contextlib.contextmanager
def chromium(size: tuple[int, int] = (1440, 1000)) -> Iterator[Browser]:
    with tempfile.TemporaryDirectory() as profile:
        browser = Browser(Path(profile), size)
        try:
            browser.call("Page.enable")
            yield browser
        finally:
            browser.close()


def open_page(browser: Browser, url: str, timeout: float = 60) -> float:
    """Navigate to the page; its first paint (ms after navigation started, as the page
    records it once the canvas holds every node)."""
    browser.call("Page.navigate", url=url)
    return float(wait_for(lambda: browser.evaluate(FIRST_PAINT_JS), timeout, 0.02))


def thread_cpu(prefixes: tuple[str, ...]) -> float:
    """CPU seconds used so far by this process's threads whose name starts with one of
    `prefixes` (Linux: /proc/self/task/*/stat, in clock ticks)."""
    ticks = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    total = 0
    for tid, name in names.items():
        if not name.startswith(prefixes):
            continue
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


GPU_LIMIT = {rn.GPU: "100"}
