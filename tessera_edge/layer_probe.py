"""What the node's GPU isolation layer is right now, as the node agent reports it
(tessera.isolation.NodeIsolation): read from the host's files, never by running anything.

- hami-core: the library is at its host path, a shared object for this CPU; when tessera
  installed it, its stamp names the version and commit and the file still matches the
  stamp's sha256 (a truncated or replaced file is down). A library without a stamp is the
  operator's own: up, version `unknown`. The installer's last error, when it left one,
  makes the layer down with that reason.
- mps: the control daemon's pid file is in the pipe directory and names a live
  `nvidia-cuda-mps-control` process (read in the host's /proc). The supervisor's error
  file, when it left one, gives the reason the daemon is not running.
- none: always up (nothing to be down).

Hashing the library is the one costly step (a few ms for a few MiB); it is done again only
when the file's identity (device, inode, size, mtime) changes, so the agent's health tick
costs a few `stat` calls.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Final

from tessera.isolation import (
    LAYER_HAMI_CORE,
    LAYER_MPS,
    LAYER_NONE,
    MAX_LAYER_REASON_CHARS,
    UNKNOWN_VERSION,
    NodeIsolation,
)
from tessera_edge.hami_core import (
    LibraryError,
    elf_problem,
    file_sha256,
    node_arch,
    read_install_error,
    read_stamp,
)
from tessera_edge.host_paths import (
    hami_core_stamp,
    mps_error_file,
    mps_pid_file,
    under,
)

MPS_DAEMON_COMM: Final = "nvidia-cuda-mps"
"""What Linux keeps of the control daemon's name (15 bytes of nvidia-cuda-mps-control)."""
MAX_PID_FILE_BYTES: Final = 32


@dataclass(frozen=True, slots=True)
class LayerPaths:
    """Where the layer's files are: host paths, seen under `root` (the agent's /host)."""

    layer: str
    hami_core_library: str
    mps_pipe_dir: str
    root: str = "/"
    proc_root: str = "/proc"
    """The host's /proc, where the MPS daemon's pid is looked up."""


@dataclass
class LayerProbe:
    """Probes one node's layer; keeps the last library hash it computed (see module doc)."""

    paths: LayerPaths
    arch: str = field(default_factory=node_arch)
    _hashed: tuple[tuple[int, int, int, int], str] | None = None

    def probe(self) -> NodeIsolation:
        layer = self.paths.layer
        if layer == LAYER_HAMI_CORE:
            return self._hami_core()
        if layer == LAYER_MPS:
            return self._mps()
        return NodeIsolation(LAYER_NONE, up=True)

    # --- hami-core -------------------------------------------------------------------------

    def _hami_core(self) -> NodeIsolation:
        library = self.paths.hami_core_library
        here = under(self.paths.root, library)
        failed = read_install_error(here)

        def down(reason: str, version: str = "", commit: str = "") -> NodeIsolation:
            if failed is not None:
                reason = f"the last install failed: {failed}"
            return NodeIsolation(LAYER_HAMI_CORE, False, version, commit, _short(reason))

        try:
            st = os.stat(here)
            with open(here, "rb") as f:
                head = f.read(64)
        except FileNotFoundError:
            return down(f"the HAMi-core library {library} is missing")
        except OSError as exc:
            return down(f"the HAMi-core library {library} cannot be read: {exc.strerror or exc}")
        problem = elf_problem(head, self.arch)
        if problem is not None:
            return down(f"the HAMi-core library {library}: {problem}")
        stamp_path = hami_core_stamp(here)
        if not os.path.exists(stamp_path):
            # the operator's own library: nothing says which it is
            if failed is not None:
                return down("")
            return NodeIsolation(LAYER_HAMI_CORE, True, UNKNOWN_VERSION)
        try:
            stamp = read_stamp(stamp_path)
        except LibraryError as exc:
            return down(f"its stamp cannot be read: {exc}")
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if self._hashed is None or self._hashed[0] != identity:
            try:
                self._hashed = (identity, file_sha256(here))
            except OSError as exc:
                return down(f"the HAMi-core library {library} cannot be read: {exc}")
        if self._hashed[1] != stamp.sha256:
            return down(
                f"the HAMi-core library {library} does not match its stamp (truncated or "
                f"replaced; {st.st_size} bytes)",
                stamp.version,
                stamp.commit,
            )
        if failed is not None:
            return down("", stamp.version, stamp.commit)
        return NodeIsolation(LAYER_HAMI_CORE, True, stamp.version, stamp.commit)

    # --- mps ---------------------------------------------------------------------------------

    def _mps(self) -> NodeIsolation:
        pipe_dir = self.paths.mps_pipe_dir
        pid_file = mps_pid_file(pipe_dir)
        why = _read_line(under(self.paths.root, mps_error_file(pipe_dir)))

        def down(reason: str) -> NodeIsolation:
            return NodeIsolation(LAYER_MPS, False, reason=_short(why or reason))

        try:
            with open(under(self.paths.root, pid_file), "rb") as f:
                raw = f.read(MAX_PID_FILE_BYTES + 1)
        except FileNotFoundError:
            return down(f"the MPS control daemon is not running (no {pid_file})")
        except OSError as exc:
            return down(f"the MPS control daemon's {pid_file} cannot be read: {exc.strerror}")
        pid = _pid(raw)
        if pid is None:
            return down(f"the MPS control daemon's {pid_file} holds no process ID")
        if not daemon_alive(pid, self.paths.proc_root):
            return down(f"the MPS control daemon (pid {pid} in {pid_file}) is not running")
        return NodeIsolation(LAYER_MPS, True)


def daemon_alive(pid: int, proc_root: str = "/proc") -> bool:
    """Whether `pid` is a live (not zombie) MPS control daemon."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            stat = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return False
    comm_start, comm_end = stat.find("("), stat.rfind(")")
    if comm_start < 0 or comm_end < comm_start:
        return False
    state = stat[comm_end + 1 :].split(maxsplit=1)[:1]
    comm = stat[comm_start + 1 : comm_end]
    return comm.startswith(MPS_DAEMON_COMM) and state not in (["Z"], ["X"], [])


def _pid(raw: bytes) -> int | None:
    text = raw.decode("ascii", "replace").strip()
    if len(raw) > MAX_PID_FILE_BYTES or not text.isdigit() or len(text) > 10:
        return None
    pid = int(text)
    return pid if 0 < pid < 2**31 else None


def _read_line(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_LAYER_REASON_CHARS * 4)
    except OSError:
        return None
    lines = raw.decode("utf-8", "replace").splitlines()
    return lines[0] if lines and lines[0].strip() else None


def _short(reason: str) -> str:
    """A reason as the inventory takes it: printable, at most MAX_LAYER_REASON_CHARS."""
    text = "".join(c if c.isprintable() else "?" for c in " ".join(reason.split()))
    if len(text) <= MAX_LAYER_REASON_CHARS:
        return text
    return text[: MAX_LAYER_REASON_CHARS - 3] + "..."
