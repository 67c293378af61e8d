"""What `make hami-core` built (build/hami-core/<arch>/): an ELF file of its architecture,
needing no glibc newer than the one it was linked against, exporting the hooks, naming the
driver's libraries, with a stamp that matches it. Skipped where nothing was built (the
HAMi-core source is not part of this repository; CI has none)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from tools import hami_core

BUILT = hami_core.ROOT / "build" / "hami-core"


def _library(arch: str) -> Path:
    path = BUILT / arch / "libvgpu.so"
    if not path.is_file():
        pytest.skip(f"no {path} (make hami-core HAMI_CORE_SRC=...): library checks skipped")
    return path


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


@pytest.mark.parametrize("arch", sorted(hami_core.ARCHES))
def test_the_library_is_an_elf_file_of_its_architecture(arch: str) -> None:
    assert hami_core.elf_machine(_library(arch)) == hami_core.ARCHES[arch]


@pytest.mark.parametrize("arch", sorted(hami_core.ARCHES))
def test_it_needs_no_glibc_newer_than_the_one_it_was_built_for(arch: str) -> None:
    needed = hami_core.glibc_needed(_library(arch))
    assert needed, "no GLIBC version needs at all: not linked against glibc"
    assert _version(needed) <= _version(hami_core.GLIBC_TARGET)


@pytest.mark.parametrize("arch", sorted(hami_core.ARCHES))
def test_it_exports_the_hooks_and_names_the_drivers_libraries(arch: str) -> None:
    library = _library(arch)
    exported = hami_core.exported_functions(library)
    hooks = {*hami_core.HOOKS, "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuMemFree_v2"}
    hooks |= {"nvmlDeviceGetMemoryInfo_v2", "cuGetProcAddress", "cuGetProcAddress_v2"}
    assert hooks - exported == set()
    # tessera's patch: the graph launch charge lives in the library
    assert "rate_limiter_whole_gpu" in exported
    assert set(hami_core.DRIVER_LIBRARIES.values()) <= set(hami_core.needed_libraries(library))


@pytest.mark.parametrize("arch", sorted(hami_core.ARCHES))
def test_the_stamp_describes_the_library_beside_it(arch: str) -> None:
    library = _library(arch)
    stamp = json.loads((BUILT / arch / "libvgpu.json").read_text())
    assert stamp == {
        "layer": "hami-core",
        "upstream": "Project-HAMi/HAMi-core",
        "commit": hami_core.COMMIT,
        "version": f"{hami_core.COMMIT[:7]}+tessera.{hami_core.PATCH_LEVEL}",
        "arch": arch,
        "glibc": hami_core.glibc_needed(library),
        "sha256": hami_core.sha256(library),
    }


def test_a_process_starts_with_the_library_preloaded() -> None:
    """On an x86_64 machine: a program starts with the library preloaded (its glibc
    versions resolve here), the driver's libraries stood in for by the build's own empty
    ones under their sonames."""
    if platform.machine() != "x86_64":
        pytest.skip("the preload check runs on x86_64 machines")
    library = _library("x86_64")
    stand_ins = BUILT / "work" / "x86_64"
    if not (stand_ins / "libcuda.so").is_file():
        pytest.skip("no build folder with the stand-in driver libraries")
    lib_dir = BUILT / "work" / "preload-check"
    lib_dir.mkdir(exist_ok=True)
    for name, soname in hami_core.DRIVER_LIBRARIES.items():
        shutil.copyfile(stand_ins / f"lib{name}.so", lib_dir / soname)
    env = dict(os.environ, LD_PRELOAD=str(library), LD_LIBRARY_PATH=str(lib_dir))
    done = subprocess.run(
        ["/bin/sh", "-c", "echo started"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "started\n"), done.stderr
