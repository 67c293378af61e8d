"""The isolation layer's node programs (tessera-isolation, docs/isolation.md):

- what installing HAMi-core adds to a node's start: the init container's command, run as
  its own process (Python's start included) on a fresh node, and again with the same
  version in place (nothing written), with a library of 4 MiB (HAMi-core's own build is
  a few MiB with its debug information);
- the node agent's resident memory with the layer probe on (--isolation hami-core with an
  installed, stamped library; the inventory published as deployed);
- the MPS supervisor's CPU while the daemon runs and nothing happens (the stand-in daemon
  of the tests, tests/edge/fake_mps_control.py, whose own CPU is not counted), at the
  shipped check interval;
- one probe of the layer, as the agent's health tick runs it.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.bench_deviceplugin import can_run_in_a_pod, rss_with_inventory
from bench.common import BenchContext, Result
from tessera.isolation import LAYER_HAMI_CORE
from tessera_edge.hami_core import install, load_source, node_arch
from tessera_edge.layer_probe import LayerPaths, LayerProbe
from tests.edge.layer_files import fake_mps_control, fake_nvidia_smi, image_folder

BIN = Path(sys.executable).parent
LIBRARY = "/usr/local/vgpu/libvgpu.so"
LIBRARY_BYTES = 4 << 20


def _install(source: Path, host: Path) -> float:
    """Seconds `tessera-isolation install` takes, start to exit, as the init container."""
    argv = [
        str(BIN / "tessera-isolation"),
        "install",
        f"--source={source}",
        f"--hami-core-library={LIBRARY}",
        f"--host-root={host}",
        "--log-level=error",
    ]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    took = time.perf_counter() - started
    if done.returncode != 0 or done.stderr.strip():
        raise RuntimeError(f"install failed: {done.stderr.strip()}")
    return took


def _install_results(ctx: BenchContext) -> list[Result]:
    rounds = ctx.sized(3, 10)
    fresh, again = [], []
    with tempfile.TemporaryDirectory(prefix="isob-") as tmp:
        folder = Path(tmp)
        source = image_folder(folder / "image", node_arch(), size=LIBRARY_BYTES)[0]
        for i in range(rounds):
            host = folder / f"node-{i}"
            fresh.append(_install(source, host))
            again.append(_install(source, host))
    note = (
        f"median of {rounds}; a {LIBRARY_BYTES >> 20} MiB library checked (ELF, sha256) and "
        "written with fsync and rename; Python's start is most of it"
    )
    return [
        Result(
            "HAMi-core install, fresh node (init container, wall)",
            statistics.median(fresh),
            "s",
            target=2.0,
            note=note,
        ),
        Result(
            "HAMi-core install, same version in place (nothing written)",
            statistics.median(again),
            "s",
            target=2.0,
        ),
    ]


def _agent_rss() -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="isob-") as tmp:
        folder = Path(tmp)
        source = load_source(str(image_folder(folder / "image", node_arch())[0]), node_arch())
        host = folder / "host"
        install(source, str(host) + LIBRARY)
        flags = ("--isolation=hami-core", f"--host-root={host}", "--health-query-interval=1")
        in_pod = can_run_in_a_pod()
        rss = rss_with_inventory(in_pod, flags)
    how = "in-cluster auth, HTTPS" if in_pod else "kubeconfig auth, plain HTTP"
    return [
        Result(
            "agent RSS, 8x H100, with inventory and the layer probe (hami-core)",
            rss,
            "MB",
            target=60.0,
            note=f"as the agent's own RSS row ({how}), with --isolation hami-core and a "
            "stamped library probed every second",
        )
    ]


def _cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid` so far, in ns (the scheduler's own count: the
    clock-tick figures of /proc/PID/stat would read 0 for an idle minute)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total


def _supervisor_idle(ctx: BenchContext) -> list[Result]:
    seconds = ctx.sized(5.0, 60.0)
    with tempfile.TemporaryDirectory(prefix="isob-") as tmp:
        folder = Path(tmp)
        bin_dir = folder / "bin"
        fake_mps_control(bin_dir)
        fake_nvidia_smi(bin_dir, folder / "smi.calls")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
        env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
        proc = subprocess.Popen(
            [
                str(BIN / "tessera-isolation"),
                "mps",
                f"--mps-pipe-dir={folder / 'pipes'}",
                f"--mps-log-dir={folder / 'logs'}",
                f"--nvidia-smi={bin_dir / 'nvidia-smi'}",
                "--metrics-port=0",
                "--log-level=warning",
            ],
            env=env,
        )
        try:
            deadline = time.monotonic() + 30
            while not (folder / "pipes" / "nvidia-cuda-mps-control.pid").exists():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the supervisor did not start the stand-in daemon")
                time.sleep(0.05)
            time.sleep(1.0)  # the start is behind it
            before = _cpu_ns(proc.pid)
            time.sleep(seconds)
            cpu = (_cpu_ns(proc.pid) - before) / 1e9
            rss = psutil.Process(proc.pid).memory_info().rss / 1e6
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    return [
        Result(
            "MPS supervisor, idle (daemon running, 5 s checks)",
            100 * cpu / seconds,
            "% of a core",
            target=0.1,
            note=f"CPU time over {seconds:g} s (the scheduler's per-thread count), the "
            f"supervisor process alone with its metrics server; resident memory {rss:.1f} MB",
        )
    ]


def _probe_cost(ctx: BenchContext) -> list[Result]:
    rounds = ctx.sized(200, 5000)
    with tempfile.TemporaryDirectory(prefix="isob-") as tmp:
        folder = Path(tmp)
        source = load_source(str(image_folder(folder / "image", node_arch())[0]), node_arch())
        install(source, str(folder) + LIBRARY)
        probe = LayerProbe(LayerPaths(LAYER_HAMI_CORE, LIBRARY, "/tmp/nvidia-mps", str(folder)))
        assert probe.probe().up  # the first one hashes the library
        started = time.process_time()
        for _ in range(rounds):
            probe.probe()
        took = (time.process_time() - started) / rounds
    return [
        Result(
            "one layer probe, hami-core (the agent's health tick)",
            took * 1e6,
            "us of CPU",
            note="stat, the ELF header and the stamp; the library is hashed again only "
            "when its size, inode or mtime changes",
        )
    ]


def run(ctx: BenchContext) -> list[Result]:
    return [
        *_install_results(ctx),
        *_supervisor_idle(ctx),
        *_probe_cost(ctx),
        *_agent_rss(),
    ]
