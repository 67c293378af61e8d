"""Test material for the isolation layer's files: an ELF shared object's header with a body,
its stamp, an image folder holding both, and stand-ins for the NVIDIA binaries."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path

from tessera_edge.hami_core import Stamp

FAKE_MPS = Path(__file__).with_name("fake_mps_control.py")
COMMITS = {"v1": "8f3a89c" + "0" * 33, "v2": "1234abc" + "1" * 33}
MACHINES = {"x86_64": 62, "aarch64": 183}


def elf_library(arch: str, body: bytes, e_type: int = 3) -> bytes:
    """A 64-bit little-endian ELF header for `arch` (a shared object unless `e_type` says
    otherwise), then `body`: enough for every check tessera makes of a library."""
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    header = ident + e_type.to_bytes(2, "little") + MACHINES[arch].to_bytes(2, "little")
    return header + bytes(44) + body


def stamp_for(library: bytes, arch: str, version: str = "v1") -> Stamp:
    return Stamp(
        version=f"8f3a89c+tessera.{version}",
        commit=COMMITS[version],
        arch=arch,
        sha256=hashlib.sha256(library).hexdigest(),
        upstream="Project-HAMi/HAMi-core",
        glibc="2.28",
    )


def image_folder(
    folder: Path, arch: str, version: str = "v1", size: int = 2 << 20
) -> tuple[Path, bytes, Stamp]:
    """The image's /opt/tessera/hami-core: libvgpu.so (`size` bytes of a given version)
    and libvgpu.json."""
    folder.mkdir(parents=True, exist_ok=True)
    body = (version.encode() * (size // len(version) + 1))[:size]
    library = elf_library(arch, body)
    stamp = stamp_for(library, arch, version)
    (folder / "libvgpu.so").write_bytes(library)
    (folder / "libvgpu.json").write_bytes(stamp.to_json())
    return folder, library, stamp


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def fake_mps_control(bin_dir: Path) -> Path:
    """`nvidia-cuda-mps-control` in `bin_dir`: the stand-in daemon, run by this Python."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    return executable(
        bin_dir / "nvidia-cuda-mps-control",
        f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_MPS}" "$@"\n',
    )


def fake_nvidia_smi(bin_dir: Path, record: Path, status: int = 0) -> Path:
    """`nvidia-smi` in `bin_dir` that appends its arguments to `record`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    return executable(
        bin_dir / "nvidia-smi", f'#!/bin/sh\necho "$@" >> "{record}"\nexit {status}\n'
    )


def other_arch() -> str:
    machine = os.uname().machine
    return "aarch64" if machine in ("x86_64", "amd64") else "x86_64"
