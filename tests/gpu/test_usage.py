"""Every share's real use, on a real GPU: the driver's process lists name the processes the
check starts itself, with their memory and their share of the GPU's time, and a process
placed in a container's cgroup (as the kubelet and containerd lay them out) is told apart
from a host process."""

from __future__ import annotations

import logging
import os
import time
import uuid as uuidlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.nvml_backend import NvmlBackend
from deviceplugin.usage import PodView
from deviceplugin.usage_monitor import UsageMonitor
from nri_hook.adjust import ISOLATION_HAMI_CORE, Settings
from tessera.allocation import GpuGrant
from tessera.model import Gpu
from tests.deviceplugin.helpers import StaticPods
from tests.gpu import containers
from tests.gpu.containers import Share

pytestmark = pytest.mark.gpu

CGROUP_ROOT = Path("/sys/fs/cgroup")
MIB = 1 << 20


@contextmanager
def container_cgroup(pod_uid: str, container_id: str) -> Iterator[Path | None]:
    """A cgroup v2 directory laid out as the kubelet's systemd driver and containerd name a
    container's (None where this host's cgroup tree cannot take one); removed afterwards."""
    if not (CGROUP_ROOT / "cgroup.controllers").exists():
        yield None
        return
    pod = f"kubepods-besteffort-pod{pod_uid.replace('-', '_')}.slice"
    parts = [
        "kubepods.slice",
        "kubepods-besteffort.slice",
        pod,
        f"cri-containerd-{container_id}.scope",
    ]
    made: list[Path] = []
    path = CGROUP_ROOT
    try:
        for part in parts:
            path = path / part
            if not path.exists():
                path.mkdir()
                made.append(path)
    except OSError:
        path = Path()
    try:
        yield path if path != Path() else None
    finally:
        for directory in reversed(made):
            for _ in range(50):  # a process leaves its cgroup a moment after it exits
                try:
                    directory.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def test_the_driver_lists_each_process_with_its_memory_and_time(
    gpus: list[Gpu], nvml: NvmlBackend, report: dict[str, Any]
) -> None:
    gpu = gpus[-1]
    plan = containers.plan([Share(gpu, 100, gpu.memory_mib)], Settings())
    holds = (3072, 5120)
    pod_uid, container_id = str(uuidlib.uuid4()), os.urandom(32).hex()
    observed: dict[str, Any] = {"pod_uid": pod_uid, "container_id": container_id}
    with container_cgroup(pod_uid, container_id) as cgroup:
        procs = [
            containers.start(
                containers.argv(
                    plan,
                    *("--hold-mib", str(hold), "--compute", "4", "--warmup", "2"),
                    *("--linger", "2"),
                )
            )
            for hold in holds
        ]
        if cgroup is not None:
            try:
                (cgroup / "cgroup.procs").write_text(str(procs[0].pid))
                observed["moved"] = True
            except OSError as exc:
                observed["moved"] = f"{exc}"
        observed["cgroups"] = {str(p.pid): _read(f"/proc/{p.pid}/cgroup") for p in procs}
        samples: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            for entry in nvml.processes():
                if entry.uuid == gpu.uuid:
                    samples.append(
                        {
                            "error": entry.error,
                            "processes": {
                                str(p.pid): [p.used_bytes, p.sm_percent, p.mps_client]
                                for p in entry.processes
                            },
                        }
                    )
            time.sleep(1.0)
        answers = [containers.finish(p) for p in procs]
    observed["samples"] = samples
    observed["answers"] = [{k: v for k, v in a.items() if k != "dev"} for a in answers]
    report["usage"] = observed
    pids = [str(p.pid) for p in procs]
    for pid, hold in zip(pids, holds, strict=True):
        memory = [s["processes"][pid][0] for s in samples if pid in s["processes"]]
        assert memory, f"process {pid} was never listed on the GPU: {samples}"
        assert max(m or 0 for m in memory) >= hold * MIB, (pid, memory)
    shares = [s["processes"][pid][1] for s in samples for pid in pids if pid in s["processes"]]
    assert any(share is not None and share > 0 for share in shares), samples


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        return f"unreadable: {exc}"


def _in_cgroup(proc: Any, cgroup: Path | None) -> None:
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text(str(proc.pid))


def test_the_agent_puts_each_process_on_its_container_beside_its_grant(
    gpus: list[Gpu],
    nvml: NvmlBackend,
    hami_core_library: str,
    report: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Four processes the check starts itself: a share's container (a tessera record of
    30 % and 2 GiB, no layer, holding 4 GiB), a pod with no tessera record, a host process,
    and a HAMi-core container that fills its 4 GiB. The agent's usage loop, on NVML and
    this host's /proc, puts the first on its pod and container beside its grant and warns
    once that it is over it; the others are not put on any pod; the HAMi-core container's
    driver-reported memory is recorded beside its limit."""
    if not (CGROUP_ROOT / "cgroup.controllers").exists():
        pytest.skip("no cgroup v2 tree to lay containers out in")
    gpu = gpus[-1]
    share = (str(uuidlib.uuid4()), os.urandom(32).hex())
    stranger = (str(uuidlib.uuid4()), os.urandom(32).hex())
    hami = (str(uuidlib.uuid4()), os.urandom(32).hex())
    plain = containers.plan([Share(gpu, 100, gpu.memory_mib)], Settings())
    layered = containers.plan(
        [Share(gpu, 40, 4096)],
        Settings(isolation=ISOLATION_HAMI_CORE, hami_core_library=hami_core_library),
    )
    grant = GpuGrant(gpu.uuid, gpu.index, gpu.minor, 30, 2048)
    pods = StaticPods(
        [
            PodView(share[0], "ml", "trainer-3", {share[1]: "main"}, {"main": {gpu.uuid: grant}}),
            PodView(stranger[0], "other", "their-pod", {stranger[1]: "app"}, None),
            PodView(
                hami[0],
                "ml",
                "filler",
                {hami[1]: "main"},
                {"main": {gpu.uuid: GpuGrant(gpu.uuid, gpu.index, gpu.minor, 40, 4096)}},
            ),
        ]
    )
    busy = ("--hold-mib", "4096", "--compute", "8", "--warmup", "3", "--linger", "2")
    with (
        container_cgroup(*share) as share_cg,
        container_cgroup(*stranger) as stranger_cg,
        container_cgroup(*hami) as hami_cg,
    ):
        procs = {
            "share": containers.start(containers.argv(plain, *busy)),
            "stranger": containers.start(
                containers.argv(plain, "--hold-mib", "1024", "--linger", "14")
            ),
            "host": containers.start(containers.argv(None, "--hold-mib", "512", "--linger", "14")),
            "hami": containers.start(
                containers.argv(layered, "--largest", "6144", "--fill", "--linger", "14")
            ),
        }
        _in_cgroup(procs["share"], share_cg)
        _in_cgroup(procs["stranger"], stranger_cg)
        _in_cgroup(procs["hami"], hami_cg)
        monitor = UsageMonitor(nvml, lambda: {g.uuid: g.index for g in gpus}, pods)
        readings = []
        time.sleep(8)  # the programs start CUDA and take their memory
        with caplog.at_level(logging.WARNING, logger="deviceplugin.usage_monitor"):
            for _ in range(5):
                readings.append(monitor.read_once())
                time.sleep(1.0)
        answers = {name: containers.finish(p) for name, p in procs.items()}
    report["usage-agent"] = {
        "pids": {name: p.pid for name, p in procs.items()},
        "readings": [
            {
                "containers": [asdict(u) for u in r.containers],
                "other": [asdict(o) for o in r.other],
                "errors": list(r.errors),
            }
            for r in readings
        ],
        "warnings": [rec.getMessage() for rec in caplog.records],
        "answers": {
            k: {f: v for f, v in a.items() if f not in ("dev", "dev-after")}
            for k, a in answers.items()
        },
        "annotation": monitor.annotation(),
        "cpu_ms_per_reading": 1000 * monitor.cpu_seconds / max(1, monitor.readings),
    }
    last = readings[-1]
    mine = {(u.pod, u.container): u for u in last.containers}
    trainer = mine.get(("trainer-3", "main"))
    assert trainer is not None, last
    assert trainer.used_bytes >= 4096 * MIB and trainer.granted_memory_mib == 2048
    assert trainer.granted_core == 30 and trainer.gpu == gpu.uuid
    assert any(u.sm_percent for r in readings for u in r.containers if u.pod == "trainer-3"), (
        "no SM sample for a container running kernels"
    )
    assert ("filler", "main") in mine, last
    assert {u.pod for u in last.containers} == {"trainer-3", "filler"}
    owners = {o.owner for o in last.other}
    assert {"other-pod", "host"} <= owners, last.other
    over = [m for m in report["usage-agent"]["warnings"] if "over its grant" in m]
    assert len([m for m in over if "trainer-3" in m and "memory" in m]) == 1, over
    assert monitor.watch.counts["memory"] >= 1
