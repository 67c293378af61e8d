"""NRI hook: CreateContainer round trip, sustained creation rate, resident memory.

The plugin runs as its own process (`python -m nri_hook.cli`, default log level, one log
line per injected container to a file) against the runtime simulator in this process,
over a real unix socket. Every request is a full CreateContainer for a container named in
a signed allocation record (two GPUs, an RDMA VF, hami-core limits), so each one decodes
and verifies a record, stats device nodes and builds an adjustment. The request messages
are the ones real containerd 2.3.4 sent (from tests/vectors when present), else
simulator-made ones of the same shape.

The round trip is measured from the runtime side (send to reply decoded), one call at a
time; the sustained rate with 32 calls in flight on the one connection.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.common import BenchContext, Result, mean, percentile
from protos.nri import api_pb2 as api
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation, RdmaGrant, VfGrant
from tessera.record import Keyring, encode
from tessera.record_keys import public_pem
from tessera.resources import ALLOCATION_ANNOTATION
from tessera_testbed.containerd import (
    CONTAINERD_2_3,
    PluginConnection,
    RuntimeSimulator,
    make_container,
    make_pod,
)
from tessera_testbed.devnodes import device_numbers, make_device_nodes

ROOT = Path(__file__).resolve().parent.parent
CAPTURED = (
    ROOT
    / "tests/vectors/nri-wire/v2.3.4/session-001/messages"
    / "025-r2p-nri.pkg.api.v1alpha1.Plugin.CreateContainer-request.nri.bin"
)
NODE = "bench-node"
KEY = Keyring.generate("bench")
DEVICES = device_numbers(gpus=(0, 1), uverbs=(4,), uvm_tools=True)
IN_FLIGHT = 32


def _device_root(base: Path) -> Path:
    return make_device_nodes(base / "host", DEVICES)


def _requests(count: int) -> tuple[list[tuple[api.PodSandbox, api.Container]], str]:
    """`count` distinct pods (distinct UIDs, so distinct signed records)."""
    template: api.CreateContainerRequest | None = None
    if CAPTURED.is_file():
        template = api.CreateContainerRequest.FromString(CAPTURED.read_bytes())
    keyring = KEY
    out = []
    for i in range(count):
        uid = f"6a1f0c2e-0000-4000-8000-{i:012d}"
        if template is not None:
            pod = api.PodSandbox()
            pod.CopyFrom(template.pod)
            pod.uid = uid
            container = api.Container()
            container.CopyFrom(template.container)
            container.id = f"{i:064x}"
        else:
            pod = make_pod(f"bench-{i}", uid=uid)
            container = make_container(pod, "main", container_id=f"{i:064x}")
        vf = VfGrant("0000:3b:00.4", "mlx5_4", 4, "ens1f0v4")
        alloc = PodAllocation(
            uid,
            pod.namespace,
            pod.name,
            NODE,
            (
                ContainerAllocation(
                    container.name,
                    gpus=(
                        GpuGrant("GPU-00000000-1111-2222-3333-444444444444", 0, 0, 100, 81920),
                        GpuGrant("GPU-11111111-1111-2222-3333-444444444444", 1, 1, 100, 81920),
                    ),
                    rdma=(RdmaGrant("0000:3b:00.0", "mlx5_0", 0, 50, (vf,)),),
                ),
            ),
        )
        pod.annotations[ALLOCATION_ANNOTATION] = encode(alloc, keyring)
        out.append((pod, container))
    return out, "captured containerd 2.3.4 messages" if template else "simulator messages"


async def _latency(
    conn: PluginConnection, work: list[tuple[api.PodSandbox, api.Container]]
) -> list[float]:
    samples = []
    for pod, container in work:
        start = time.perf_counter()
        response = await conn.create_container(pod, container)
        samples.append(time.perf_counter() - start)
        if len(response.adjust.linux.devices) != len(DEVICES):
            raise RuntimeError(f"unexpected adjustment: {response}")
    return samples


async def _throughput(
    conn: PluginConnection, work: list[tuple[api.PodSandbox, api.Container]], seconds: float
) -> tuple[float, int]:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(offset: int) -> None:
        nonlocal done
        i = offset
        while time.perf_counter() < deadline:
            pod, container = work[i % len(work)]
            await conn.create_container(pod, container)
            done += 1
            i += IN_FLIGHT

    start = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(IN_FLIGHT)))
    return done / (time.perf_counter() - start), done


async def _bench(ctx: BenchContext) -> list[Result]:
    sequential = ctx.sized(quick=300, full=3000)
    seconds = ctx.sized(quick=2.0, full=8.0)
    with tempfile.TemporaryDirectory(prefix="nri-bench-", dir="/tmp") as scratch:
        base = Path(scratch)
        root = _device_root(base)
        key = base / "bench.pem"  # the key ID is the file name
        public = KEY.public_key("bench")
        assert public is not None
        key.write_bytes(public_pem(public))
        sock = str(base / "nri.sock")
        sim = RuntimeSimulator(sock, version=CONTAINERD_2_3)
        await sim.start()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "nri_hook.cli",
            "--socket",
            sock,
            "--device-root",
            str(root),
            "--integrity-key-file",
            str(key),
            "--node-name",
            NODE,
            "--isolation",
            "hami-core",
            "--log-file",
            str(base / "plugin.log"),
            cwd=str(ROOT),
        )
        try:
            conn = await sim.next_plugin(timeout=30)
            work, source = _requests(1000)
            await _latency(conn, work[:200])  # warm up
            samples = await _latency(conn, (work * (sequential // len(work) + 1))[:sequential])
            rate, total = await _throughput(conn, work, seconds)
            rss = psutil.Process(process.pid).memory_info().rss / 2**20
        finally:
            process.terminate()
            await process.wait()
            await sim.stop()
    ms = [s * 1000 for s in samples]
    machine = f"{os.cpu_count()} CPUs, shared"
    return [
        Result(
            "CreateContainer round trip p99",
            percentile(ms, 99),
            "ms",
            target=2.0,
            note=f"{len(ms)} sequential calls over the socket, {source}; p50 "
            f"{percentile(ms, 50):.3f} ms, mean {mean(ms):.3f} ms, max {max(ms):.2f} ms; "
            f"{machine}",
        ),
        Result("CreateContainer round trip p50", percentile(ms, 50), "ms", note="same calls"),
        Result(
            "sustained creations per second, one connection",
            rate,
            "1/s",
            target=1000.0,
            lower_is_better=False,
            note=f"{total} calls in {seconds:g} s with {IN_FLIGHT} in flight; the runtime "
            "simulator shares the machine",
        ),
        Result(
            "plugin resident memory",
            rss,
            "MiB",
            target=60.0,
            note="RSS of the plugin process after the load",
        ),
    ]


def run(ctx: BenchContext) -> list[Result]:
    return asyncio.run(_bench(ctx))
