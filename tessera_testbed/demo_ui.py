"""`make demo-ui` (`tessera-demo --ui`): the demo's cluster kept up, grown to a few hundred
nodes, with pods arriving and finishing, so that the allocation page has something to
show; the page's URL is printed, and it runs until interrupted (or for `seconds`).

The extra nodes publish what a node agent would (a Node, its NodeDevices, a heartbeat
Lease renewed here) without an agent of their own; the demo's three nodes keep theirs.
Pods go through the scheduler as kube-scheduler sends them (filter, prioritize, bind); a
pod that fits nowhere stays Pending with the condition kube-scheduler records (its
message, as kube-scheduler words it) and is retried now and then, as kube-scheduler
retries; some pods finish (are deleted) all the time, about as fast as others arrive.
"""

from __future__ import annotations

import json
import random
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from scheduler_plugin.decisions.binder import BindArgs
from scheduler_plugin.service import Service
from tessera import resources as rn
from tessera_testbed.apiserver import FakeApiServer
from tessera_testbed.inventory import heartbeat_lease, make_spec

MAKES = (("h100-sxm-8x", 5), ("a100-pcie-8x", 3), ("t4-4x", 2))
"""The extra nodes' makes, with their weights."""
NAMESPACES = ("ml", "research", "inference")
FULL = 0.7
"""Allocation the churn keeps the cluster near (of all GPU compute)."""
RETRY_S = 15.0
LEASE_S = 3600


def _post(url: str, body: Any) -> Any:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def add_nodes(api: FakeApiServer, count: int, seed: int = 7) -> list[str]:
    """`count` nodes of the MAKES, as their agents would publish them."""
    rng = random.Random(seed)
    names = []
    makes = [make for make, _ in MAKES]
    weights = [weight for _, weight in MAKES]
    for i in range(count):
        make = rng.choices(makes, weights)[0]
        name = f"{make.split('-')[0]}-{i:03d}"
        api.create("nodes", {"metadata": {"name": name}})
        api.create(
            "nodedevices",
            {
                "apiVersion": rn.INVENTORY_API_VERSION,
                "kind": rn.INVENTORY_KIND,
                "metadata": {"name": name},
                "spec": make_spec(name, make),
            },
        )
        api.create("leases", heartbeat_lease(name, duration_s=LEASE_S))
        names.append(name)
    return names


def _limits(rng: random.Random) -> tuple[dict[str, str], dict[str, str]]:
    """A pod's limits and annotations: mostly shares, some whole GPUs, a few too big."""
    roll = rng.random()
    if roll < 0.02:
        return {rn.GPU: "1600"}, {}
    if roll < 0.04:
        return {rn.GPU: "800"}, {rn.GPU_MODEL_ANNOTATION: "A100"}
    if roll < 0.35:
        return {rn.GPU: str(100 * rng.choice((1, 1, 2, 4, 8)))}, {}
    core = rng.choice((10, 20, 25, 30, 50))
    return {rn.GPU_CORE: str(core), rn.GPU_MEMORY_RATIO: str(core)}, {}


class Churn:
    def __init__(self, api: FakeApiServer, base: str, nodes: Sequence[str], seed: int) -> None:
        self.api, self.base, self.nodes = api, base, list(nodes)
        self.rng = random.Random(seed)
        self.running: list[tuple[str, str]] = []
        self.pending: dict[tuple[str, str], float] = {}
        self.made = 0

    def arrive(self) -> None:
        self.made += 1
        limits, annotations = _limits(self.rng)
        namespace = self.rng.choice(NAMESPACES)
        kind = "train" if rn.GPU in limits and int(limits[rn.GPU]) >= 100 else "serve"
        name = f"{kind}-{self.made:05d}"
        self.api.create(
            "pods",
            {
                "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
                "spec": {
                    "containers": [
                        {"name": "main", "resources": {"limits": limits, "requests": limits}}
                    ]
                },
                "status": {"phase": "Pending"},
            },
        )
        self.attempt(namespace, name)

    def attempt(self, namespace: str, name: str) -> None:
        pod = self.api.get("pods", name, namespace)
        args = {"Pod": pod, "Nodes": None, "NodeNames": self.nodes}
        answer = _post(f"{self.base}/filter", args)
        passed = answer.get("NodeNames") or []
        if not passed:
            self._unschedulable(pod, answer)
            self.pending[(namespace, name)] = time.monotonic()
            return
        node = passed[0]
        if len(passed) > 1:
            scores = _post(f"{self.base}/prioritize", {**args, "NodeNames": passed})
            node = max(scores, key=lambda s: s["Score"])["Host"]
        uid = pod["metadata"]["uid"]
        bound = _post(f"{self.base}/bind", BindArgs(name, namespace, uid, node).to_json())
        self.pending.pop((namespace, name), None)
        if not bound.get("Error"):
            self.running.append((namespace, name))

    def _unschedulable(self, pod: dict[str, Any], answer: dict[str, Any]) -> None:
        """The condition kube-scheduler writes on a pod no node took."""
        failed = {**answer.get("FailedNodes", {}), **answer.get("FailedAndUnresolvableNodes", {})}
        counts: dict[str, int] = {}
        for reason in failed.values():
            counts[reason] = counts.get(reason, 0) + 1
        parts = sorted(f"{n} {reason}" for reason, n in counts.items())
        message = f"0/{len(self.nodes)} nodes are available: {', '.join(parts)}."
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
        }
        meta = pod["metadata"]
        status = {"status": {"conditions": [condition]}}
        self.api.patch("pods", meta["name"], status, meta["namespace"], "status")

    def finish(self) -> None:
        if self.running:
            namespace, name = self.running.pop(self.rng.randrange(len(self.running)))
            self.api.delete("pods", name, namespace)

    def retry(self) -> None:
        now = time.monotonic()
        for (namespace, name), since in list(self.pending.items()):
            if now - since >= RETRY_S:
                self.attempt(namespace, name)


def serve(
    api: FakeApiServer,
    service: Service,
    nodes: Sequence[str],
    extra: Sequence[str],
    say: Callable[[str], None],
    *,
    url: str,
    seconds: float | None = None,
    seed: int = 1,
) -> int:
    """Keep pods arriving and finishing on `nodes` until interrupted (or `seconds` have
    passed), renewing the heartbeats of the `extra` nodes; the number of pods that came."""
    base = f"http://127.0.0.1:{service.server.port}"
    churn = Churn(api, base, nodes, seed)
    say(f"The allocation page: {url}")
    say("  (pods keep arriving and finishing; Ctrl-C stops the demo)")
    started = last_retry = last_lease = time.monotonic()
    try:
        while seconds is None or time.monotonic() - started < seconds:
            figures = service.views.overview()["models"]
            core = sum(m["coreUsed"] for m in figures)
            total = sum(m["gpus"] for m in figures) * 100 or 1
            if core / total < FULL or churn.rng.random() < 0.3:
                churn.arrive()
            if core / total >= FULL * 0.9 or churn.rng.random() < 0.2:
                churn.finish()
            now = time.monotonic()
            if now - last_retry >= RETRY_S / 3:
                last_retry = now
                churn.retry()
            if now - last_lease >= LEASE_S / 4:
                last_lease = now
                for name in extra:
                    renewed = heartbeat_lease(name, duration_s=LEASE_S)["spec"]
                    api.patch(
                        "leases",
                        rn.HEARTBEAT_LEASE_PREFIX + name,
                        {"spec": renewed},
                        rn.DEFAULT_HEARTBEAT_NAMESPACE,
                    )
            time.sleep(0.25 if core / total >= FULL * 0.9 else 0.02)
    except KeyboardInterrupt:
        say("stopped")
    return churn.made
