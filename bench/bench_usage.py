"""The node agent's usage loop: the CPU one reading takes on a busy 8-GPU node, and what
that costs at the default interval.

The node: 8x H100 (the fake backend) with 64 processes, 8 per GPU, each in a container of
its own (32 pods of two containers, every container with a grant), laid out in a /proc tree
the way the kubelet's systemd driver and containerd name cgroups. One reading is what the
agent does every interval: the backend's process lists, each process's `comm` and `cgroup`
read from /proc, the join with the pods and their grants, the over-grant watch, and the
heartbeat's annotation. The pods are known after the first reading (no listing in the
steady state). The fake backend answers from memory, so NVML's own calls are not in the
figure; on an H200, a reading with NVML took 3.7 ms for one GPU and four processes
(docs/deviceplugin.md).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.common import BenchContext, Result
from deviceplugin.backend import GpuProcess
from deviceplugin.fake_backend import FakeBackend
from deviceplugin.usage import PodView
from deviceplugin.usage_monitor import DEFAULT_USAGE_INTERVAL_S, UsageMonitor
from tessera.allocation import GpuGrant
from tests.deviceplugin.helpers import StaticPods

MIB = 1 << 20
PER_GPU = 8


def _node(proc: Path) -> tuple[UsageMonitor, int]:
    backend = FakeBackend.from_topology("h100-sxm-8x")
    gpus = backend.discover().gpus
    containers: dict[str, dict[str, str]] = {}
    grants: dict[str, dict[str, dict[str, GpuGrant]]] = {}
    pid = 1000
    for g in gpus:
        procs = []
        for k in range(PER_GPU):
            pid += 1
            n = g.index * PER_GPU + k
            uid = f"00000000-0000-4000-8000-{n // 2:012d}"
            cid = f"{n:064x}"
            name = f"c{n % 2}"
            containers.setdefault(uid, {})[cid] = name
            grant = GpuGrant(g.uuid, g.index, g.minor, 10, 8192)
            grants.setdefault(uid, {})[name] = {g.uuid: grant}
            folder = proc / str(pid)
            folder.mkdir()
            (folder / "comm").write_text("python\n")
            (folder / "cgroup").write_text(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                f"{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n"
            )
            procs.append(GpuProcess(pid, 6000 * MIB, 9))
        backend.set_processes(g.uuid, tuple(procs))
    views = [
        PodView(uid, "ml", f"job-{uid[-4:]}", containers[uid], grants[uid]) for uid in containers
    ]
    index = {g.uuid: g.index for g in gpus}
    return UsageMonitor(backend, lambda: index, StaticPods(views), proc_root=proc), pid - 1000


def run(ctx: BenchContext) -> list[Result]:
    readings = ctx.sized(50, 500)
    with tempfile.TemporaryDirectory(prefix="usage-bench-") as tmp:
        monitor, processes = _node(Path(tmp))
        for _ in range(5):
            monitor.read_once()
        cpu0 = time.thread_time()
        for _ in range(readings):
            monitor.read_once()
            monitor.annotation()
        per_reading = (time.thread_time() - cpu0) / readings
        rows = len(monitor.latest.containers)
    assert rows == processes, (rows, processes)
    share = per_reading / DEFAULT_USAGE_INTERVAL_S * 100
    return [
        Result(
            f"usage reading CPU, 8 GPUs, {processes} processes",
            per_reading * 1000,
            "ms",
            note=f"mean of {readings} readings (thread CPU time), the heartbeat's annotation "
            "included; the fake backend answers from memory (no NVML calls)",
        ),
        Result(
            f"usage loop CPU at the default interval ({DEFAULT_USAGE_INTERVAL_S:g} s)",
            share,
            "% of a core",
            target=1.0,
        ),
    ]
