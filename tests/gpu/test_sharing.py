"""A share held on a real GPU by the isolation layer the NRI plugin configures.

Each check runs CUDA programs as containers given exactly the plan's devices, environment
and mounts (containers.py), and measures what they could take:
- memory: the largest single buffer a share of N MiB can allocate (just under N), and
  the error past it (CUDA's out-of-memory, the process carrying on);
- compute: the rate of a compute-bound loop under a share against the same loop given the
  whole GPU without a layer, per one-second window;
- two and three shares on one GPU at once, each held to its own limits while the others
  run; the limit landing on the device the container sees (device 0 is the host's GPU by
  UUID; with several GPUs, a container given only the last one, and a two-GPU share).

Every figure becomes a row of the "measured on a real GPU" table in docs/isolation.md
(`report["sharing"]`, rendered by tools/gpu_table.py); a row records whether the limit
held, and the check fails on any that did not, after recording them all.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.nvml_backend import NvmlBackend
from nri_hook.adjust import ISOLATION_HAMI_CORE, ISOLATION_MPS, Settings
from tessera.model import Gpu
from tests.gpu import containers
from tests.gpu.conftest import write_report
from tests.gpu.containers import Share

pytestmark = pytest.mark.gpu

GIB = 1024
WINDOWS = 6
"""One-second windows per compute figure."""
STAGGER_S = 2.5
"""Between the starts of concurrent containers: HAMi-core finds a process's host PID by
comparing the driver's process list before and after it opens its context, so two
containers opening theirs in the same instant can take each other's."""
START_S = 12.0
"""From a container's start to its measured windows: PyTorch's import, CUDA's start, the
memory check and the warm-up (the layer's throttle settles in well under the warm-up)."""
MEMORY_SLACK_MIB = 1024
"""How far under its limit a share's largest buffer may stay (the CUDA context and the
framework's own buffers count against the limit too)."""
COMPUTE_SLACK = 0.10
"""How far above its share a throttled rate may run, as a fraction of the whole GPU's."""
WHOLE_AT_LEAST = 0.90
"""A share of 100 under a layer keeps at least this much of the unlimited rate."""


class Clocks:
    """The GPU's SM clock and power, sampled four times a second while a check measures:
    the unlimited loop is power-bound on an H100 or H200, so fewer busy SMs (an MPS share)
    run at a higher clock, and a rate is compared per clock cycle as well."""

    def __init__(self, index: int) -> None:
        import pynvml

        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.samples: list[tuple[float, int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        nv = self._nvml
        while not self._stop.wait(0.25):
            try:
                mhz = int(nv.nvmlDeviceGetClockInfo(self._handle, nv.NVML_CLOCK_SM))
                watts = nv.nvmlDeviceGetPowerUsage(self._handle) / 1000
            except nv.NVMLError:
                continue
            self.samples.append((time.time(), mhz, watts))

    def __enter__(self) -> Clocks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def during(self, start: float, seconds: float) -> tuple[float, float]:
        """Median SM clock (MHz) and power (W) over [start, start + seconds]."""
        inside = [(m, w) for t, m, w in self.samples if start <= t <= start + seconds]
        if not inside:
            return 0.0, 0.0
        return _median([m for m, _ in inside]), _median([w for _, w in inside])


@dataclass(frozen=True)
class Baseline:
    tflops: float
    mhz: float


class Rows:
    """The table rows a check produces; `verify` fails on any row that did not hold,
    after all were recorded."""

    def __init__(self, report: dict[str, Any], layer: str, check: str) -> None:
        self.report, self.layer, self.check = report, layer, check
        self.rows: list[dict[str, Any]] = []

    def add(self, share: str, limit: str, measured: str, held: bool, **figures: Any) -> None:
        row = {
            "layer": self.layer,
            "check": self.check,
            "share": share,
            "limit": limit,
            "measured": measured,
            "held": bool(held),
            "figures": figures,
        }
        self.rows.append(row)
        self.report.setdefault("sharing", []).append(row)
        write_report(self.report)

    def verify(self) -> None:
        failed = [r for r in self.rows if not r["held"]]
        assert not failed, failed


def _share_text(core: int, memory_mib: int) -> str:
    return f"{core}% / {memory_mib / GIB:g} GiB"


def _mib(value: Any) -> str:
    return f"{value:,} MiB" if isinstance(value, int) else "? MiB"


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _settings(layer: str, library: str = "", pipe: Path | None = None) -> Settings:
    if layer == ISOLATION_HAMI_CORE:
        return Settings(isolation=layer, hami_core_library=library)
    if layer == ISOLATION_MPS:
        assert pipe is not None
        return Settings(isolation=layer, mps_pipe_dir=str(pipe))
    return Settings()


def _is_oom(error: str) -> bool:
    text = error.lower()
    return "outofmemory" in text.replace(" ", "") or "out of memory" in text


def _memory_row(rows: Rows, seen: dict[str, Any], gpu: Gpu, core: int, limit_mib: int) -> None:
    """The memory figures of one container given `limit_mib` of `gpu` (its device 0)."""
    largest = (seen.get("largest") or [{}])[0]
    biggest = int(largest.get("largest_mib", -1))
    refused = str(largest.get("refused_with", ""))
    total = (seen.get("memory_mib") or [[0, 0]])[0][1]
    sees_its_gpu = len(seen.get("uuids", [])) == 1 and gpu.uuid.endswith(seen["uuids"][0])
    held = (
        sees_its_gpu
        and limit_mib - MEMORY_SLACK_MIB <= biggest <= limit_mib
        and _is_oom(refused)
        and largest.get("small_after") == "ok"
    )
    rows.add(
        _share_text(core, limit_mib),
        f"{limit_mib:,} MiB",
        f"largest buffer {_mib(biggest)}; {_mib(largest.get('refused_mib'))} refused "
        f"({'out of memory' if _is_oom(refused) else refused or 'not refused'}), then "
        f"256 MiB {largest.get('small_after', '?')}; CUDA reports {_mib(total)} total",
        held,
        largest_mib=biggest,
        refused=largest,
        reported_total_mib=total,
        device0_is_the_gpu=sees_its_gpu,
        error=seen.get("error", ""),
        stderr=seen.get("stderr-tail", "")[-600:],
    )


def _compute_row(
    rows: Rows,
    seen: dict[str, Any],
    core: int,
    memory_mib: int,
    base: Baseline,
    clock: tuple[float, float],
    alone: bool,
) -> None:
    """A compute figure: the rate against the unlimited one, and per clock cycle (the SM
    clock sampled over the same windows), which is what a share of SMs or of time bounds."""
    windows = list((seen.get("compute") or {}).get("tflops", []))
    ratios = [w / base.tflops for w in windows] if base.tflops else []
    ratio = _median(ratios)
    mhz, watts = clock
    per_clock = ratio * base.mhz / mhz if mhz and base.mhz else ratio
    if core >= 100:
        held = bool(ratios) and ratio >= WHOLE_AT_LEAST
        limit = f">= {WHOLE_AT_LEAST:.0%} of the unlimited rate"
    else:
        held = bool(ratios) and 0 < per_clock <= core / 100 + COMPUTE_SLACK
        limit = f"<= {core}% of the unlimited rate per clock cycle (+{COMPUTE_SLACK:.0%})"
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
    rows.add(
        _share_text(core, memory_mib),
        limit,
        f"{ratio:.2f} of the unlimited rate (windows {spread}; {_median(windows):.0f} against "
        f"{base.tflops:.0f} TFLOP/s); {per_clock:.2f} per clock (SM {mhz:.0f} against "
        f"{base.mhz:.0f} MHz){'' if alone else ', beside the others'}",
        held,
        ratio=ratio,
        ratios=ratios,
        per_clock=per_clock,
        sm_mhz=mhz,
        watts=watts,
        tflops=windows,
        baseline_tflops=base.tflops,
        baseline_mhz=base.mhz,
        sms=seen.get("sms"),
        error=seen.get("error", ""),
        stderr=seen.get("stderr-tail", "")[-600:],
    )


# --- the unlimited rate -----------------------------------------------------------------------


def _timed(
    plan: Any, gpu: Gpu, *extra: str, env: dict[str, str] | None = None
) -> tuple[dict[str, Any], tuple[float, float]]:
    """One container's compute figures and the clock over its measured windows."""
    start_at = time.time() + START_S
    command = containers.argv(plan, *extra, "--compute", str(WINDOWS), "--start-at", str(start_at))
    with Clocks(gpu.index) as clocks:
        seen = containers.run(command, env, timeout_s=START_S + WINDOWS + 60)
    return seen, clocks.during(start_at + 0.5, WINDOWS - 0.5)


@pytest.fixture(scope="session")
def unlimited(gpus: list[Gpu], report: dict[str, Any]) -> Baseline:
    """The loop's rate in a container given the whole GPU and no layer."""
    gpu = gpus[-1]
    plan = containers.plan([Share(gpu, 100, gpu.memory_mib)], Settings())
    seen, (mhz, watts) = _timed(plan, gpu)
    windows = list((seen.get("compute") or {}).get("tflops", []))
    report["unlimited"] = {
        "tflops": windows,
        "sm_mhz": mhz,
        "watts": watts,
        "error": seen.get("error", ""),
    }
    assert windows, seen
    return Baseline(_median(windows), mhz)


# --- one share at a time ----------------------------------------------------------------------


@pytest.fixture(params=[ISOLATION_HAMI_CORE, ISOLATION_MPS])
def layer(request: pytest.FixtureRequest) -> Iterator[Settings]:
    if request.param == ISOLATION_HAMI_CORE:
        yield _settings(request.param, library=request.getfixturevalue("hami_core_library"))
    else:
        yield _settings(request.param, pipe=request.getfixturevalue("mps_daemon"))


def test_a_share_gets_its_memory_and_no_more(
    gpus: list[Gpu], layer: Settings, report: dict[str, Any]
) -> None:
    """30 % with 10 GiB: the container's device 0 is the GPU, a buffer just under 10 GiB
    allocates, one past it is refused with CUDA's out-of-memory error, and the process
    carries on."""
    gpu = gpus[-1]
    core, limit = 30, 10 * GIB
    plan = containers.plan([Share(gpu, core, limit)], layer)
    seen = containers.run(containers.argv(plan, "--largest", str(limit + 2 * GIB)))
    rows = Rows(report, layer.isolation, "memory, alone")
    _memory_row(rows, seen, gpu, core, limit)
    rows.verify()


def test_a_share_gets_its_compute_and_no_more(
    gpus: list[Gpu], layer: Settings, unlimited: Baseline, report: dict[str, Any]
) -> None:
    """30 % runs a compute-bound loop at no more than about 30 % of the rate the whole GPU
    gives it, per clock cycle; 100 % under the same layer runs at the unlimited rate."""
    gpu = gpus[-1]
    rows = Rows(report, layer.isolation, "compute, alone")
    for core, memory in ((30, 10 * GIB), (100, gpu.memory_mib)):
        plan = containers.plan([Share(gpu, core, memory)], layer)
        seen, clock = _timed(plan, gpu)
        _compute_row(rows, seen, core, memory, unlimited, clock, alone=True)
    rows.verify()


# --- several shares at once -------------------------------------------------------------------

PAIR = ((30, 10 * GIB), (50, 20 * GIB))
TRIPLE = ((20, 5 * GIB), (30, 10 * GIB), (40, 15 * GIB))


@pytest.mark.parametrize("shares", [PAIR, TRIPLE], ids=["two", "three"])
def test_shares_on_one_gpu_each_keep_to_their_own(
    gpus: list[Gpu],
    layer: Settings,
    shares: tuple[tuple[int, int], ...],
    unlimited: Baseline,
    nvml: NvmlBackend,
    report: dict[str, Any],
) -> None:
    """Two and three containers share the GPU at once: each finds its own memory limit
    while the others hold theirs, then all run the loop over the same seconds, each at no
    more than its share."""
    gpu = gpus[-1]
    rows = Rows(report, layer.isolation, f"{len(shares)} at once")
    start_at = time.time() + START_S + 2 + STAGGER_S * len(shares)
    procs = []
    with Clocks(gpu.index) as clocks:
        for core, limit in shares:
            plan = containers.plan([Share(gpu, core, limit)], layer)
            command = containers.argv(
                plan,
                *("--largest", str(limit + 2 * GIB), "--hold-mib", str(limit // 2)),
                *("--compute", str(WINDOWS), "--start-at", str(start_at)),
            )
            procs.append(containers.start(command))
            time.sleep(STAGGER_S)
        samples = _sample_while(nvml, gpu.uuid, procs, start_at)
        deadline = start_at + WINDOWS + 60
        seen = [containers.finish(p, max(5.0, deadline - time.time())) for p in procs]
    clock = clocks.during(start_at + 0.5, WINDOWS - 0.5)
    report.setdefault("concurrent-processes", []).append(
        {"layer": layer.isolation, "pids": [s.get("pid") for s in seen], "samples": samples}
    )
    for (core, limit), answer in zip(shares, seen, strict=True):
        _memory_row(rows, answer, gpu, core, limit)
    for (core, limit), answer in zip(shares, seen, strict=True):
        _compute_row(rows, answer, core, limit, unlimited, clock, alone=False)
    rows.verify()


def _sample_while(
    nvml: NvmlBackend, uuid: str, procs: Sequence[Any], start_at: float
) -> list[dict[str, Any]]:
    """What NVML lists on the GPU, every second of the measured windows."""
    samples: list[dict[str, Any]] = []
    while time.time() < start_at + 1:
        time.sleep(0.2)
    while any(p.poll() is None for p in procs) and len(samples) < WINDOWS:
        for entry in nvml.processes():
            if entry.uuid == uuid:
                samples.append(
                    {
                        "t": round(time.time() - start_at, 1),
                        "error": entry.error,
                        "processes": [
                            [p.pid, p.used_bytes, p.sm_percent, p.mps_client]
                            for p in entry.processes
                        ],
                    }
                )
        time.sleep(1.0)
    return samples


# --- the device the container sees ------------------------------------------------------------


def test_the_limit_lands_on_the_device_the_container_sees(
    gpus: list[Gpu], layer: Settings, report: dict[str, Any]
) -> None:
    """With several GPUs on the host: a container given only the last GPU sees it as its
    device 0 with that GPU's limit; a container given two GPUs with different limits sees
    each limit on the right one (by UUID). One GPU: the memory check above covers device
    0."""
    if len(gpus) < 2:
        pytest.skip("one GPU on this host: device 0 is checked by the memory check")
    rows = Rows(report, layer.isolation, "renumbered")
    last = gpus[-1]
    plan = containers.plan([Share(last, 40, 6 * GIB)], layer)
    seen = containers.run(containers.argv(plan, "--largest", str(8 * GIB)))
    _memory_row(rows, seen, last, 40, 6 * GIB)
    pair = [Share(gpus[0], 30, 4 * GIB), Share(gpus[1], 60, 8 * GIB)]
    plan = containers.plan(list(reversed(pair)), layer)  # the record's order is not CUDA's
    seen = containers.run(containers.argv(plan, "--largest", str(10 * GIB)))
    by_uuid = dict(zip(seen.get("uuids", []), seen.get("largest", []), strict=False))
    for share in pair:
        got: dict[str, Any] = next(
            (v for k, v in by_uuid.items() if share.gpu.uuid.endswith(k)), {}
        )
        biggest = int(got.get("largest_mib", -1))
        rows.add(
            _share_text(share.core, share.memory_mib) + f" on GPU {share.gpu.index} of two",
            f"{share.memory_mib:,} MiB",
            f"largest buffer {_mib(biggest)}",
            share.memory_mib - MEMORY_SLACK_MIB <= biggest <= share.memory_mib,
            largest=got,
        )
    rows.verify()


# --- HAMi-core's region -----------------------------------------------------------------------


def test_each_hami_core_container_keeps_its_own_limits_where_tmp_is_shared(
    gpus: list[Gpu], hami_core_library: str, report: dict[str, Any]
) -> None:
    """HAMi-core keeps a container's limits and usage in a file, /tmp/cudevshr.cache unless
    told otherwise, and a process that finds the file takes the limits written there. The
    plan puts it in a tmpfs of the container's own; here every container shares the host's
    /tmp, as containers of one pod sharing an emptyDir at /tmp would. One after the other,
    4 GiB then 8 GiB: with the plan each reports its own limit. Without the plan's region
    (as the hook wrote it before) the second is recorded with what it saw."""
    gpu = gpus[-1]
    settings = _settings(ISOLATION_HAMI_CORE, library=hami_core_library)
    rows = Rows(report, ISOLATION_HAMI_CORE, "one after the other, shared /tmp")
    for core, limit in ((40, 4 * GIB), (60, 8 * GIB)):
        plan = containers.plan([Share(gpu, core, limit)], settings)
        seen = containers.run(containers.argv(plan, "--largest", str(limit + 2 * GIB)))
        _memory_row(rows, seen, gpu, core, limit)
    cache = Path("/tmp/cudevshr.cache")
    cache.unlink(missing_ok=True)
    without: list[dict[str, Any]] = []
    for core, limit in ((40, 4 * GIB), (60, 8 * GIB)):
        plan = containers.plan([Share(gpu, core, limit)], settings)
        env = {k: v for k, v in plan.env if k != "CUDA_DEVICE_MEMORY_SHARED_CACHE"}
        mounts = tuple(m for m in plan.mounts if m.type != "tmpfs")
        old = replace(plan, env=tuple(env.items()), mounts=mounts)
        seen = containers.run(containers.argv(old, "--alloc-mib", "64"))
        without.append(
            {"limit_mib": limit, "reported_mib": (seen.get("memory_mib") or [[0, 0]])[0][1]}
        )
    cache.unlink(missing_ok=True)
    report["hami-core-without-region"] = without
    rows.verify()
