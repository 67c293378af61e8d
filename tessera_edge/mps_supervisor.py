"""Keeps NVIDIA's MPS control daemon running on a node, so `--isolation=mps` needs no hand
work (docs/isolation.md).

What the supervisor does, in order:
1. finds the host driver's `nvidia-cuda-mps-control` (the NVIDIA container toolkit puts it
   in the container with NVIDIA_DRIVER_CAPABILITIES=compute); without it the node cannot
   run MPS: one clear error line, kept in the pipe directory (`tessera-mps.error`) where
   the node agent reads it and reports the layer down, and the binary is looked for again
   later (a driver upgrade may bring it);
2. puts the GPUs in EXCLUSIVE_PROCESS compute mode (`nvidia-smi -c`), so no process uses
   them except through MPS (a failure is a warning: MPS still limits its clients);
3. starts the daemon with `-d` and the pipe and log directories in its environment, and
   waits for its pid file;
4. checks the daemon every few seconds (its pid file names a live process); when it died
   it is started again after a backoff that doubles up to a minute, and the restart is
   counted (`tessera_mps_daemon_restarts_total`);
5. on SIGTERM (the pod goes): `quit` on the daemon's control pipe (what
   `echo quit | nvidia-cuda-mps-control` does, with the same pipe directory), a wait, then
   SIGTERM and SIGKILL if it is still there; the compute mode goes back to DEFAULT.

The supervisor makes itself a child subreaper, so the daemon (which forks away from the
command that starts it) stays its child: a daemon that dies is reaped here at once, and a
zombie never passes for a live daemon.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from tessera.errors import TesseraError
from tessera_edge.host_paths import mps_error_file, mps_pid_file
from tessera_edge.layer_probe import MAX_PID_FILE_BYTES, daemon_alive

log = logging.getLogger("tessera.mps")

MPS_CONTROL: Final = "nvidia-cuda-mps-control"
NVIDIA_SMI: Final = "nvidia-smi"
PIPE_ENV: Final = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV: Final = "CUDA_MPS_LOG_DIRECTORY"
MULTI_USER_FLAG: Final = "-M"
"""The control daemon's multi-user mode (Volta and later GPUs): clients of every Linux user
are served by one server, as if they were root's."""
PR_SET_CHILD_SUBREAPER: Final = 36
COMMAND_TIMEOUT_S: Final = 30.0
"""The longest a command of the daemon's (`-d`, `quit`) or nvidia-smi may take."""
PID_FILE_WAIT_S: Final = 10.0
"""How long a started daemon may take to write its pid file."""


@dataclass(frozen=True, slots=True)
class MpsSettings:
    pipe_dir: str
    log_dir: str
    control: str = MPS_CONTROL
    """The daemon's binary: a name looked up on PATH, or a path."""
    nvidia_smi: str = NVIDIA_SMI
    multi_user: bool = False
    set_compute_mode: bool = True
    check_interval_s: float = 5.0
    stop_timeout_s: float = 20.0
    """After `quit`, how long the daemon may take to go before it is signalled."""
    backoff_start_s: float = 1.0
    backoff_max_s: float = 60.0
    steady_s: float = 60.0
    """A daemon up this long resets the backoff."""
    proc_root: str = "/proc"


class MpsSupervisor:
    """One node's MPS control daemon, kept running (see the module doc)."""

    def __init__(
        self,
        settings: MpsSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.pid: int | None = None
        """The daemon's process ID while it runs."""
        self.up = False
        self.restarts = 0
        """Daemons started again after one that ran had died."""
        self.error = ""
        """Why the daemon is not running (empty while it runs)."""
        self._ran = False
        self._reaping = False
        """Whether this process is a subreaper that collects the daemon when it dies (set
        by `run`; a supervisor driven by `check` alone leaves other children alone)."""
        self._backoff = settings.backoff_start_s
        self._next_start = 0.0
        self._started_at = 0.0
        self._compute_mode_set = False

    # --- the loop ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Keep the daemon running until `stop`, then stop it."""
        self._reaping = become_subreaper()
        try:
            while not stop.is_set():
                self.check()
                stop.wait(self.settings.check_interval_s)
        finally:
            self.stop()

    def check(self) -> None:
        """One look at the daemon: start it when it is not running and its backoff is
        over."""
        self._reap()
        if self.pid is not None:
            if self._alive(self.pid):
                if self.clock() - self._started_at >= self.settings.steady_s:
                    self._backoff = self.settings.backoff_start_s
                return
            log.error(
                "the MPS control daemon (pid %d) is gone; starting it again in %.0f s",
                self.pid,
                self._backoff,
            )
            self.pid, self.up = None, False
            self._fail("the MPS control daemon died; tessera's supervisor starts it again")
            self._defer()
        if self.clock() < self._next_start:
            return
        self.start()

    def _defer(self) -> None:
        """The next start waits the backoff, which doubles up to its maximum."""
        self._next_start = self.clock() + self._backoff
        self._backoff = min(self._backoff * 2, self.settings.backoff_max_s)

    def _reap(self) -> None:
        if self._reaping:
            reap_children()

    # --- start ---------------------------------------------------------------------------

    def start(self) -> bool:
        """Start the daemon; True when it runs. A failure is recorded (`error`, the error
        file) and retried after the backoff."""
        try:
            pid = self._start()
        except _StartError as exc:
            log.error("%s", exc)
            self._fail(str(exc))
            self._defer()
            return False
        if self._ran:
            self.restarts += 1
        self._ran = True
        self.pid, self.up, self.error = pid, True, ""
        self._started_at = self.clock()
        _remove(mps_error_file(self.settings.pipe_dir))
        log.info(
            "the MPS control daemon runs (pid %d, pipes in %s, logs in %s%s)",
            pid,
            self.settings.pipe_dir,
            self.settings.log_dir,
            ", every user's clients" if self.settings.multi_user else "",
        )
        return True

    def _start(self) -> int:
        s = self.settings
        # first: the pipe directory also carries the reason when the daemon cannot run
        for directory in (s.pipe_dir, s.log_dir):
            try:
                os.makedirs(directory, mode=0o755, exist_ok=True)
            except OSError as exc:
                raise _StartError(f"cannot create {directory}: {exc.strerror or exc}") from None
        control = find_binary(s.control)
        if control is None:
            # short: the reason travels to the inventory (at most 256 characters)
            raise _StartError(
                f"{s.control} not found: the host driver has no MPS daemon, or the NVIDIA "
                "container toolkit did not mount it (NVIDIA_DRIVER_CAPABILITIES=compute); "
                "this node takes no GPU shares"
            )
        existing = self._pid_from_file()
        if existing is not None and self._alive(existing):
            log.info("an MPS control daemon already runs (pid %d); supervising it", existing)
            return existing
        self._set_compute_mode("EXCLUSIVE_PROCESS")
        argv = [control, "-d", *([MULTI_USER_FLAG] if s.multi_user else [])]
        done = _run(argv, self._env())
        if done.returncode != 0:
            raise _StartError(
                f"{' '.join(argv)} exited with status {done.returncode}: {_tail(done.output)}"
            )
        deadline = self.clock() + PID_FILE_WAIT_S
        while True:
            pid = self._pid_from_file()
            if pid is not None and self._alive(pid):
                return pid
            if self.clock() >= deadline:
                named = "no pid" if pid is None else f"pid {pid}, not a running daemon"
                raise _StartError(
                    f"{' '.join(argv)} started, but {mps_pid_file(s.pipe_dir)} names {named} "
                    f"after {PID_FILE_WAIT_S:g} s (see {s.log_dir}/control.log)"
                )
            time.sleep(0.05)

    def _set_compute_mode(self, mode: str) -> None:
        if not self.settings.set_compute_mode:
            return
        smi = find_binary(self.settings.nvidia_smi)
        if smi is None:
            log.warning(
                "%s not found: the GPUs' compute mode stays as it is (MPS still limits its "
                "clients; processes outside MPS can use the GPUs too)",
                self.settings.nvidia_smi,
            )
            return
        try:
            done = _run([smi, "-c", mode], None)
        except _StartError as exc:
            log.warning("%s", exc)
            return
        if done.returncode != 0:
            log.warning(
                "%s -c %s exited with status %d: %s",
                smi,
                mode,
                done.returncode,
                _tail(done.output),
            )
            return
        self._compute_mode_set = mode != "DEFAULT"
        log.info("GPU compute mode %s", mode)

    # --- stop ----------------------------------------------------------------------------

    def stop(self) -> None:
        """`quit` to the daemon, wait, then signals; the compute mode back to DEFAULT."""
        pid = self.pid if self.pid is not None else self._pid_from_file()
        if pid is not None and self._alive(pid):
            self._quit(pid)
        self.pid, self.up = None, False
        if self._compute_mode_set:
            self._set_compute_mode("DEFAULT")

    def _quit(self, pid: int) -> None:
        control = find_binary(self.settings.control)
        if control is not None:
            log.info("stopping the MPS control daemon (pid %d): quit", pid)
            try:
                _run([control], self._env(), stdin="quit\n")
            except _StartError as exc:
                log.warning("%s", exc)
        if self._wait_gone(pid, self.settings.stop_timeout_s):
            log.info("the MPS control daemon stopped")
            return
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            log.warning(
                "the MPS control daemon (pid %d) is still running; sending %s", pid, sig.name
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            if self._wait_gone(pid, wait):
                return
        log.error("the MPS control daemon (pid %d) did not stop", pid)

    def _wait_gone(self, pid: int, seconds: float) -> bool:
        deadline = self.clock() + seconds
        while True:
            self._reap()
            if not self._alive(pid):
                return True
            if self.clock() >= deadline:
                return False
            time.sleep(0.05)

    # --- helpers -------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            PIPE_ENV: self.settings.pipe_dir,
            LOG_ENV: self.settings.log_dir,
        }

    def _alive(self, pid: int) -> bool:
        return daemon_alive(pid, self.settings.proc_root)

    def _pid_from_file(self) -> int | None:
        try:
            with open(mps_pid_file(self.settings.pipe_dir), "rb") as f:
                text = f.read(MAX_PID_FILE_BYTES).decode("ascii", "replace").strip()
        except OSError:
            return None
        return int(text) if text.isdigit() and 0 < len(text) <= 10 else None

    def _fail(self, reason: str) -> None:
        self.error = reason
        write_line(mps_error_file(self.settings.pipe_dir), reason)


class _StartError(TesseraError):
    """A step of starting or stopping the daemon failed; the message is one line."""


@dataclass(frozen=True, slots=True)
class _Done:
    returncode: int
    output: str


def _run(argv: list[str], env: dict[str, str] | None, stdin: str = "") -> _Done:
    try:
        done = subprocess.run(
            argv,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise _StartError(f"{' '.join(argv)} did not finish in {COMMAND_TIMEOUT_S:g} s") from None
    except OSError as exc:
        raise _StartError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    return _Done(done.returncode, (done.stdout or "") + (done.stderr or ""))


def _tail(output: str) -> str:
    text = " ".join(output.split())
    return text[-200:] if text else "(no output)"


def find_binary(name: str) -> str | None:
    """`name` if it is an executable path, else where PATH has it; None when neither."""
    if "/" in name:
        return name if os.access(name, os.X_OK) and os.path.isfile(name) else None
    return shutil.which(name)


def write_line(path: str, text: str) -> None:
    """Replace `path` with one line, atomically; problems are logged, never raised (the
    file only carries a reason to the node agent)."""
    temporary = f"{path}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(" ".join(text.split())[:240] + "\n")
        os.replace(temporary, path)
    except OSError as exc:
        log.warning("cannot write %s: %s", path, exc.strerror or exc)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def become_subreaper() -> bool:
    """Orphans of our children (the daemon, after `-d` forks) become ours to reap."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def reap_children() -> None:
    """Collect every child that has exited (never blocks)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
