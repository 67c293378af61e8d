"""Scheduler restart with poison pods present: time until it is ready.

A fake API server (another process) holds nodes with valid, signed pods on every node and
poison pods bound to one node (records nested past the JSON parser's recursion limit,
non-ASCII MACs, copies of other pods' records, truncated JSON, a removed record). A
tessera-scheduler Service starts against it; the figure is the time from start until it
answers extender calls (every informer listed, the pod rebuild done). The poisoned node
must be the only one fenced.
"""

from __future__ import annotations

import json
import time

from bench.bench_scheduler import (
    create_nodes,
    create_running_pod,
    create_signed_pods,
    fake_api,
)
from bench.common import BenchContext, Result

POISONS = [
    "[" * 100_000,
    json.dumps(
        {"v": 1, "integrity": {"alg": "HMAC-SHA256", "keyId": "default", "mac": "\u00e9" * 64}}
    ),
    '{"v": 1, "pod": ',
    "\x00" * 1000,
]


def restart_time(nodes: int, pods_per_node: int, poison: int) -> tuple[float, set[str]]:
    """(seconds from start to ready, fenced nodes)."""
    from kube_edge.client import KubeClient
    from scheduler_plugin.service import Options, Service
    from tessera.record import Keyring

    keyring = Keyring.generate("bench")
    with fake_api() as url:
        setup = KubeClient.for_host(url)
        names = create_nodes(setup, nodes)
        records = create_signed_pods(setup, names, pods_per_node, keyring)
        for i in range(poison):
            kind = i % (len(POISONS) + 2)
            record = (
                POISONS[kind]
                if kind < len(POISONS)
                else (records[i % len(records)] if kind == len(POISONS) else None)
            )
            create_running_pod(setup, f"poison-{i}", names[0], record)
        started = time.monotonic()
        service = Service(
            Options(host="127.0.0.1", port=0, leader_elect=False, write_status=False),
            KubeClient.for_host(url),
            keyring,
        ).start()
        try:
            assert service.wait_ready(120), service.readiness()
            ready = time.monotonic() - started
            fenced = set(service.cache.snapshot().record_fenced_nodes)
        finally:
            service.stop()
        return ready, fenced


def run(ctx: BenchContext) -> list[Result]:
    nodes, per_node, poison = ctx.sized(quick=(50, 4, 60), full=(500, 8, 600))
    ready, fenced = restart_time(nodes, per_node, poison)
    assert fenced == {"node-0000"}, fenced
    return [
        Result(
            "ready after a restart with poison pods",
            ready,
            "s",
            10.0,
            note=(
                f"{nodes} nodes, {nodes * per_node} signed pods, {poison} poison pods on one "
                "node (deep nesting, non-ASCII MACs, copied, truncated, removed records); "
                "that node alone fenced"
            ),
        )
    ]
