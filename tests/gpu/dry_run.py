"""`make gpu-check`'s preparation, on a machine without a GPU: everything up to the first
CUDA call.

For a GPU of the fake backend (an H100 of tessera_edge's topologies), with the
HAMi-core library `make hami-core` built and a stand-in MPS pipe directory: every plan the
GPU checks make (each share, each layer) through the NRI plugin's planner, the probe's
command for each, and, as root with util-linux's unshare, a few of those commands run for
real: the probe becomes the container (its own mount namespace, a read-only /dev with the
plan's nodes, the plan's environment, HAMi-core preloaded with stand-ins for the driver's
libraries) and stops where it imports PyTorch. Prints what it did; exit status 1 on the
first thing that would stop the real run.

    python -m tests.gpu.dry_run [--library build/hami-core/x86_64/libvgpu.so]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deviceplugin.fake_backend import FakeBackend
from nri_hook.adjust import ISOLATION_HAMI_CORE, ISOLATION_MPS, DeviceNode, Settings
from tests.gpu import containers
from tests.gpu.containers import Share
from tests.gpu.test_layers import PATHS
from tests.gpu.test_sharing import GIB, PAIR, TRIPLE
from tools import hami_core

TOPOLOGY = hami_core.ROOT / "tessera_edge" / "topologies" / "h100-sxm-8x.yaml"


class StandInHost:
    """The GPU node as the planner asks about it: the driver's device nodes (the NVIDIA
    majors), the GPU's minor, and every layer file present."""

    def __init__(self, minors: Mapping[str, int]) -> None:
        self.minors = dict(minors)

    def device(self, path: str) -> DeviceNode | None:
        if not path.startswith("/dev/nvidia"):
            return None
        name = path.removeprefix("/dev/")
        fixed = {"nvidiactl": (195, 255), "nvidia-uvm": (510, 0), "nvidia-uvm-tools": (510, 1)}
        major, minor = fixed.get(name, (195, int(name[6:]) if name[6:].isdigit() else 254))
        return DeviceNode(path, "c", major, minor, 0o666)

    def gpu_minors(self) -> Mapping[str, int] | None:
        return self.minors

    def exists(self, path: str) -> bool:
        return True


def plans(library: str, pipe: str) -> list[tuple[str, str, Any]]:
    """(layer, what, plan) for every share the GPU checks give a container."""
    gpu = FakeBackend.from_topology(str(TOPOLOGY)).gpu(0)
    host = StandInHost({gpu.uuid: gpu.minor})
    layers = {
        "none": Settings(),
        ISOLATION_HAMI_CORE: Settings(isolation=ISOLATION_HAMI_CORE, hami_core_library=library),
        ISOLATION_MPS: Settings(isolation=ISOLATION_MPS, mps_pipe_dir=pipe),
    }
    shares = [(30, 10 * GIB), (100, gpu.memory_mib), (40, 4 * GIB), *PAIR, *TRIPLE]
    out = []
    for name, settings in layers.items():
        for core, memory in shares:
            share = [Share(gpu, core, memory)]
            out.append(
                (
                    name,
                    f"{core}% / {memory / GIB:g} GiB",
                    containers.plan(share, settings, host=host),
                )
            )
    return out


def run_probe(plan: Any, stand_ins: Path, extra: Sequence[str]) -> dict[str, Any]:
    """The probe as the plan's container, here: it must get as far as importing PyTorch."""
    command = containers.argv(plan, *extra)
    return containers.run(command, {"LD_LIBRARY_PATH": str(stand_ins)}, timeout_s=120)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu.dry_run", description=__doc__)
    parser.add_argument(
        "--library", default=str(hami_core.ROOT / "build/hami-core/x86_64/libvgpu.so")
    )
    args = parser.parse_args(argv)
    library = Path(args.library).resolve()
    stamp_path = library.with_suffix(".json")
    if not library.is_file() or not stamp_path.is_file():
        print(f"dry run: no {library} and stamp: run make hami-core first", file=sys.stderr)
        return 1
    stamp = json.loads(stamp_path.read_text())
    if stamp.get("sha256") != hami_core.sha256(library):
        print(f"dry run: {stamp_path} does not match {library}", file=sys.stderr)
        return 1
    print(f"library: {library} ({stamp['version']}, {stamp['arch']}, glibc >= {stamp['glibc']})")
    containers.torch_python = lambda: sys.executable  # type: ignore[assignment]
    pipe = tempfile.mkdtemp(prefix="tessera-mps-dry-", dir="/var/tmp")
    stand_ins = Path(tempfile.mkdtemp(prefix="tessera-driver-"))
    try:
        made = plans(str(library), pipe)
        for layer, share, plan in made:
            env = dict(plan.env)
            layer_env = {k: v for k, v in env.items() if k.startswith(("CUDA_", "LD_PRELOAD"))}
            print(f"plan {layer:9} {share:18} devices={len(plan.devices)} env={layer_env}")
        for name, soname in hami_core.DRIVER_LIBRARIES.items():
            built = library.parent.parent / "work" / "x86_64" / f"lib{name}.so"
            if built.is_file():
                shutil.copyfile(built, stand_ins / soname)
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            print("dry run: not root or no unshare: the probes were not run as containers")
            return 0
        picks = {
            (ISOLATION_HAMI_CORE, "30% / 10 GiB"): ["--paths", ",".join(PATHS), "--costs", "1"],
            (ISOLATION_MPS, "50% / 20 GiB"): ["--largest", "22528", "--compute", "6"],
            ("none", "30% / 10 GiB"): ["--compute", "6", "--start-at", "1"],
        }
        failed = 0
        for layer, share, plan in made:
            extra = picks.pop((layer, share), None)
            if extra is None:
                continue
            seen = run_probe(plan, stand_ins, extra)
            ok = "No module named 'torch'" in str(seen.get("error", ""))
            ok = ok and {
                n["path"].removeprefix("/dev/") for n in containers.device_nodes(plan)
            } <= set(seen.get("dev", []))
            failed += not ok
            print(
                f"probe {layer:9} {share:18} {'stopped at the CUDA step' if ok else 'FAILED'}: "
                f"dev={seen.get('dev')} preload={seen.get('env', {}).get('LD_PRELOAD', '-')} "
                f"error={seen.get('error', '')[:80]} {seen.get('stderr-tail', '')[-300:]}"
            )
        return 1 if failed else 0
    finally:
        shutil.rmtree(pipe, ignore_errors=True)
        shutil.rmtree(stand_ins, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
