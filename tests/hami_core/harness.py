"""HAMi-core's SM limiter against a simulated GPU (limiter_harness.c), pinned and patched.

`make hami-core` leaves the pinned source (build/hami-core/work/upstream) and tessera's
patched one (work/src) beside the libraries; the harness is compiled against each, on
this machine, and run for several SM counts, workloads and shares. Without a build there
is nothing to compile (the HAMi-core source is not part of this repository).

    python -m tests.hami_core.harness     # the table in deploy/hami-core/README.md
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tools import hami_core

HARNESS = Path(__file__).with_name("limiter_harness.c")
WORK = hami_core.ROOT / "build" / "hami-core" / "work"
TREES = {"pinned": WORK / "upstream", "patched": WORK / "src"}
SM_COUNTS = (46, 108, 132, 148, 188)
GEMM_US_TIMES_SMS = 220_000
"""A bf16 8192 x 8192 x 8192 product's time in microseconds times the SM count: 1.67 ms on
132 SMs (the H200's rate in docs/isolation.md), the same work per SM on any GPU."""


@dataclass(frozen=True)
class Workload:
    name: str
    grid: int  # blocks per launch; 0: one per SM (a persistent kernel)
    kernels_per_launch: int = 1
    graph: bool = False

    def args(self, sms: int) -> list[str]:
        kernel_us = GEMM_US_TIMES_SMS * self.kernels_per_launch / sms
        args = ["--sms", str(sms), "--grid", str(self.grid or sms), "--kernel-us", f"{kernel_us}"]
        return [*args, "--graph"] if self.graph else args


WORKLOADS = (
    Workload("tiled GEMM (2,048 blocks)", 2048),
    Workload("persistent GEMM (a block per SM)", 0),
    Workload("CUDA graph of 10 GEMMs", 2048, kernels_per_launch=10, graph=True),
)


def built() -> bool:
    return (
        all((tree / "src" / "multiprocess").is_dir() for tree in TREES.values())
        and (WORK / "config" / "static_config.h").is_file()
    )


@functools.cache
def compiled(which: str) -> Path:
    """The harness compiled against the pinned or the patched source."""
    tree = TREES[which]
    out = WORK / f"limiter-{which}"
    compiler = ["cc"] if shutil.which("cc") else [sys.executable, "-m", "ziglang", "cc"]
    defines = ["-DHAVE_WHOLE_GPU_CHARGE"] if which == "patched" else []
    command = [*compiler, "-O1", "-w", *defines, "-I", str(hami_core.cuda_include())]
    command += ["-I", str(tree / "src"), "-I", str(WORK / "config"), str(HARNESS), "-o", str(out)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    return out


def run(which: str, workload: Workload, sms: int, limit: int) -> dict[str, object]:
    """One simulated run: the busy fraction under `limit` against the unlimited one."""
    command = [str(compiled(which)), *workload.args(sms), "--limit", str(limit)]
    command += ["--seconds", "40", "--settle", "10"]
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
    answer: dict[str, object] = json.loads(done.stdout)
    busy, unlimited = float(str(answer["busy"])), float(str(answer["unlimited_busy"]))
    answer["ratio"] = busy / unlimited
    return answer


def table() -> str:
    lines = [
        "| workload | share | source | " + " | ".join(f"{s} SMs" for s in SM_COUNTS) + " |",
        "|---|---|---|" + "---|" * len(SM_COUNTS),
    ]
    for workload in WORKLOADS:
        for limit in (20, 30, 50):
            for which in TREES:
                cells = []
                for sms in SM_COUNTS:
                    seen = run(which, workload, sms, limit)
                    windows = [float(w) for w in seen["windows"]]  # type: ignore[attr-defined]
                    cells.append(
                        f"{float(str(seen['ratio'])):.2f} ({min(windows):.2f}-{max(windows):.2f})"
                    )
                row = [workload.name, f"{limit}%", which, *cells]
                lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    if not built():
        print("no build/hami-core/work: run make hami-core HAMI_CORE_SRC=... first")
        sys.exit(1)
    print(table())
