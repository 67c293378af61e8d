"""HAMi-core's library on a node: its version stamp, the checks before it is used, and the
installer that puts the image's copy onto the host.

The image carries `libvgpu.so` for its own CPU architecture and its stamp `libvgpu.json`
(one JSON object: layer, upstream, commit, version, arch, glibc, sha256 of the library).
`install` copies both onto the host path the NRI hook mounts into containers:

- nothing is written before the source passed every check: the stamp parses, names this
  node's architecture, and the library is a shared object for this CPU whose sha256 is the
  stamp's. The library is read once into memory and those same bytes are written, so what
  was checked is what lands;
- the library is written beside the old one under a temporary name, fsynced and renamed
  over it (an atomic replace), then the stamp likewise. A process that mapped or opened the
  old file keeps its inode, whole; a container created after the rename opens the new file,
  whole, and never a half-written one;
- the same version already in place (stamp equal, installed file matching it) is left
  untouched: no write and no rename, so a restart churns nothing;
- a failure leaves the host's library as it was and writes the reason, one line, to
  `libvgpu.install-error` beside it (removed by the next install that succeeds), where the
  node agent reads it and reports the layer down with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
from dataclasses import dataclass
from typing import Final

from tessera.errors import TesseraError
from tessera.isolation import LAYER_HAMI_CORE, MAX_VERSION_CHARS
from tessera_edge.host_paths import (
    HAMI_CORE_LIBRARY_NAME,
    hami_core_install_error,
    hami_core_stamp,
)

MAX_STAMP_BYTES: Final = 4096
"""A stamp is a few hundred bytes; anything longer is not one."""
MAX_LIBRARY_BYTES: Final = 64 << 20
"""HAMi-core's library is a few MiB (with debug information); it is read whole into memory
to check it, so a source file larger than this is refused."""
MAX_ERROR_CHARS: Final = 240
"""The reason written for the node agent (it reports at most 256 characters)."""

ELF_MACHINES: Final = {62: "x86_64", 183: "aarch64"}
"""ELF e_machine -> architecture (EM_X86_64, EM_AARCH64): the two tessera builds for."""
ARCH_ALIASES: Final = {"amd64": "x86_64", "arm64": "aarch64"}
_ET_DYN: Final = 3
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HASH_CHUNK: Final = 1 << 20


class LibraryError(TesseraError):
    """The library or its stamp cannot be used on this node; str() is one line."""


@dataclass(frozen=True, slots=True)
class Stamp:
    """What a build of the library says about itself (the `libvgpu.json` beside it)."""

    version: str
    commit: str
    arch: str
    sha256: str
    upstream: str = ""
    glibc: str = ""

    def to_json(self) -> bytes:
        doc = {
            "layer": LAYER_HAMI_CORE,
            "upstream": self.upstream,
            "commit": self.commit,
            "version": self.version,
            "arch": self.arch,
            "glibc": self.glibc,
            "sha256": self.sha256,
        }
        return (json.dumps(doc, indent=2) + "\n").encode()


def node_arch(machine: str | None = None) -> str:
    """This node's CPU architecture as the stamps name it (x86_64 or aarch64)."""
    name = (machine if machine is not None else platform.machine()).lower()
    return ARCH_ALIASES.get(name, name)


def parse_stamp(raw: bytes, source: str) -> Stamp:
    """A stamp's bytes; LibraryError naming `source` and the field when they are not one."""
    if len(raw) > MAX_STAMP_BYTES:
        raise LibraryError(f"{source}: {len(raw)} bytes, not a stamp (at most {MAX_STAMP_BYTES})")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise LibraryError(f"{source}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise LibraryError(f"{source}: not a JSON object")

    def field(key: str, pattern: re.Pattern[str] | None = None, required: bool = True) -> str:
        value = doc.get(key, None if required else "")
        if not isinstance(value, str) or len(value) > MAX_VERSION_CHARS or not value.isprintable():
            raise LibraryError(f"{source}: {key}: missing or not a short printable string")
        if pattern is not None and not pattern.match(value):
            raise LibraryError(f"{source}: {key}: {value[:70]!r} is malformed")
        return value

    if doc.get("layer") != LAYER_HAMI_CORE:
        raise LibraryError(f"{source}: layer: not {LAYER_HAMI_CORE!r}")
    arch = field("arch")
    if arch not in ELF_MACHINES.values():
        raise LibraryError(f"{source}: arch: {arch!r} is neither x86_64 nor aarch64")
    return Stamp(
        version=field("version"),
        commit=field("commit", _HEX40),
        arch=arch,
        sha256=field("sha256", _HEX64),
        upstream=field("upstream", required=False),
        glibc=field("glibc", required=False),
    )


def elf_problem(head: bytes, arch: str) -> str | None:
    """Why these first bytes are not a 64-bit little-endian shared object for `arch`; None
    when they are."""
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return "not an ELF file"
    if head[4] != 2 or head[5] != 1:
        return "not a 64-bit little-endian ELF file"
    e_type = int.from_bytes(head[16:18], "little")
    machine = ELF_MACHINES.get(int.from_bytes(head[18:20], "little"))
    if e_type != _ET_DYN:
        return "not a shared library"
    if machine != arch:
        return f"built for {machine or 'another CPU'}, not this node's {arch}"
    return None


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def read_stamp(path: str) -> Stamp:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_STAMP_BYTES + 1)
    except OSError as exc:
        raise LibraryError(f"{path}: {exc.strerror or exc}") from None
    return parse_stamp(raw, path)


def read_install_error(library: str) -> str | None:
    """The installer's last error for this library (one line), or None."""
    try:
        with open(hami_core_install_error(library), "rb") as f:
            raw = f.read(MAX_ERROR_CHARS * 4)
    except OSError:
        return None
    text = raw.decode("utf-8", "replace").splitlines()[0] if raw.strip() else "(empty)"
    return "".join(c if c.isprintable() else "?" for c in text)[:MAX_ERROR_CHARS]


# --- the source in the image -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Source:
    """The image's library, checked: its stamp and its exact bytes."""

    stamp: Stamp
    library: bytes


def load_source(directory: str, arch: str) -> Source:
    """The image's library and stamp, every check passed; LibraryError (one line) else."""
    stamp = read_stamp(f"{directory}/{hami_core_stamp(HAMI_CORE_LIBRARY_NAME)}")
    library_path = f"{directory}/{HAMI_CORE_LIBRARY_NAME}"
    if stamp.arch != arch:
        raise LibraryError(
            f"{library_path}: the image's HAMi-core is built for {stamp.arch}, this node is "
            f"{arch} (use the image of this node's architecture)"
        )
    try:
        with open(library_path, "rb") as f:
            data = f.read(MAX_LIBRARY_BYTES + 1)
    except OSError as exc:
        raise LibraryError(f"{library_path}: {exc.strerror or exc}") from None
    if len(data) > MAX_LIBRARY_BYTES:
        raise LibraryError(f"{library_path}: larger than {MAX_LIBRARY_BYTES >> 20} MiB")
    problem = elf_problem(data[:64], arch)
    if problem is not None:
        raise LibraryError(f"{library_path}: {problem}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != stamp.sha256:
        raise LibraryError(
            f"{library_path}: sha256 {digest[:12]}... is not the stamp's {stamp.sha256[:12]}... "
            f"(a corrupt or truncated file, {len(data)} bytes)"
        )
    return Source(stamp, data)


# --- the host ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Installed:
    """What `install` did."""

    stamp: Stamp
    changed: bool
    """False when the same version was already in place (nothing written)."""
    replaced: str = ""
    """The version it replaced, when it replaced one."""


def installed_stamp(library: str) -> Stamp | None:
    """The stamp of the library in place when the file matches it; None otherwise (no
    library, no stamp, or a library that is not the stamp's: truncated or replaced)."""
    try:
        stamp = read_stamp(hami_core_stamp(library))
        return stamp if file_sha256(library) == stamp.sha256 else None
    except (LibraryError, OSError):
        return None


def install(source: Source, library: str) -> Installed:
    """Put `source` at `library` (a path as seen here) with its stamp beside it; see the
    module doc. OSError when the host directory cannot be written."""
    current = installed_stamp(library)
    if current is not None and current == source.stamp:
        _clear_error(library)
        return Installed(current, changed=False)
    previous = _version_in_place(library)
    _replace(library, source.library, mode=0o644)
    _replace(hami_core_stamp(library), source.stamp.to_json(), mode=0o644)
    _clear_error(library)
    return Installed(source.stamp, changed=True, replaced=previous)


def record_error(library: str, message: str) -> bool:
    """Keep the reason the last install failed beside the library, for the node agent;
    False when even that cannot be written (the agent then reports what it finds)."""
    text = " ".join(message.split())[:MAX_ERROR_CHARS] + "\n"
    try:
        _replace(hami_core_install_error(library), text.encode(), mode=0o644)
    except OSError:
        return False
    return True


def _clear_error(library: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(hami_core_install_error(library))


def _version_in_place(library: str) -> str:
    if not os.path.exists(library):
        return ""
    try:
        return read_stamp(hami_core_stamp(library)).version
    except LibraryError:
        return "an unstamped library"


def _replace(path: str, data: bytes, mode: int) -> None:
    """Write `data` to `path` atomically: a temporary file in the same directory (the
    rename must not cross file systems), fsynced, renamed over `path`, then the directory
    fsynced so the rename itself survives a crash."""
    directory, name = os.path.split(path)
    os.makedirs(directory or ".", mode=0o755, exist_ok=True)
    temporary = os.path.join(directory, f".{name}.tessera-{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    os.close(fd)
    try:
        os.rename(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    dir_fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
