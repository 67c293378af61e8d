"""`kubectl tessera` on a big cluster: wall time of each command, end to end.

A fake API server (another process) holds nodes with NodeDevices and heartbeat Leases and
signed pods on every node; each command runs in this process through the real client
configuration (a kubeconfig), lists page by page, and renders its table. `explain` rebuilds
the whole cluster's state from the records and evaluates a pending pod on every node.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import time
from pathlib import Path

from bench.bench_scheduler import create_nodes, create_signed_pods, fake_api
from bench.common import BenchContext, Result
from tessera_testbed.apiserver import write_kubeconfig

TARGET_S = 10.0
"""An operator waits for this command at a terminal: ten seconds on a 500-node cluster."""


def _kubeconfig(url: str, directory: str) -> str:
    return write_kubeconfig(Path(directory) / "kubeconfig", url)


def timings(nodes: int, pods_per_node: int) -> dict[str, float]:
    from kube_edge.client import KubeClient
    from kubectl_tessera.cli import main
    from tessera import resources as rn
    from tessera.record import Keyring

    keyring = Keyring.generate("bench")
    with fake_api() as url:
        setup = KubeClient.for_host(url)
        names = create_nodes(setup, nodes)
        create_signed_pods(setup, names, pods_per_node, keyring)
        setup.create(
            "/api/v1/namespaces/default/pods",
            {
                "metadata": {"name": "wants-9", "namespace": "default", "uid": "uid-wants-9"},
                "spec": {
                    "containers": [{"name": "main", "resources": {"limits": {rn.GPU: "900"}}}]
                },
            },
        )
        result = {}
        with tempfile.TemporaryDirectory() as tmp:
            config = _kubeconfig(url, tmp)
            for label, argv in (
                ("nodes", ["nodes"]),
                ("explain", ["explain", "wants-9"]),
                ("pods -A", ["pods", "-A"]),
            ):
                out = io.StringIO()
                started = time.perf_counter()
                with contextlib.redirect_stdout(out):
                    code = main([*argv, "--kubeconfig", config])
                result[label] = time.perf_counter() - started
                assert code == 0, (label, out.getvalue()[-500:])
        return result


def run(ctx: BenchContext) -> list[Result]:
    nodes, per_node = ctx.sized(quick=(50, 4), full=(500, 8))
    measured = timings(nodes, per_node)
    return [
        Result(
            f"kubectl tessera {label} ({nodes} nodes, {nodes * per_node} pods)",
            seconds,
            "s",
            TARGET_S,
            note=""
            if label != "explain"
            else "rebuilds the state from every record and evaluates the pod on every node",
        )
        for label, seconds in measured.items()
    ]
