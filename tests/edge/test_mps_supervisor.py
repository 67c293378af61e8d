"""The MPS supervisor, as the tessera-mps DaemonSet runs it (the real console script), against
a stand-in for nvidia-cuda-mps-control that daemonizes, keeps a pid file and answers quit
on its control pipe: it starts the daemon, starts it again when it dies, stops it with quit
(and signals when quit is not enough), and says clearly when the driver has no daemon. The
node agent's probe reads the same files and agrees at every step."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from tessera.isolation import LAYER_MPS
from tessera_edge.layer_probe import LayerPaths, LayerProbe, daemon_alive
from tests.edge.layer_files import fake_mps_control, fake_nvidia_smi
from tests.waiting import wait_until

BIN = Path(sys.executable).parent
T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Node:
    """A node's MPS directories, the stand-in binaries and a running supervisor."""

    root: Path
    bin_dir: Path
    smi_calls: Path
    port: int = field(default_factory=_free_port)
    proc: subprocess.Popen[str] | None = None
    log_path: Path | None = None

    @property
    def pipe_dir(self) -> Path:
        return self.root / "tmp/nvidia-mps"

    @property
    def log_dir(self) -> Path:
        return self.root / "var/log/nvidia-mps"

    def start(
        self, *extra: str, env: dict[str, str] | None = None, with_binary: bool = True
    ) -> None:
        path = f"{self.bin_dir}:/usr/bin:/bin" if with_binary else "/usr/bin:/bin"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
        self.log_path = self.root / "supervisor.log"
        with open(self.log_path, "w") as out:
            self.proc = subprocess.Popen(
                [
                    str(BIN / "tessera-isolation"),
                    "mps",
                    f"--mps-pipe-dir={self.pipe_dir}",
                    f"--mps-log-dir={self.log_dir}",
                    f"--nvidia-smi={self.bin_dir / 'nvidia-smi'}",
                    "--check-interval=0.1",
                    "--node-name=gpu-1",
                    f"--metrics-port={self.port}",
                    "--metrics-address=127.0.0.1",
                    *extra,
                ],
                env={**clean, **(env or {}), "PATH": path},
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )

    def log(self) -> str:
        assert self.log_path is not None
        return self.log_path.read_text()

    def pid(self) -> int | None:
        try:
            return int((self.pipe_dir / "nvidia-cuda-mps-control.pid").read_text())
        except (OSError, ValueError):
            return None

    def live_pid(self) -> int | None:
        pid = self.pid()
        return pid if pid is not None and daemon_alive(pid) else None

    def metrics(self) -> dict[str, float]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        values = {}
        for line in text.splitlines():
            if line.startswith("tessera_mps_daemon"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def probe(self) -> tuple[bool, str]:
        found = LayerProbe(
            LayerPaths(LAYER_MPS, "", "/tmp/nvidia-mps", root=str(self.root))
        ).probe()
        assert found.layer == LAYER_MPS
        return found.up, found.reason

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    bin_dir = tmp_path / "bin"
    fake_mps_control(bin_dir)
    calls = tmp_path / "nvidia-smi.calls"
    fake_nvidia_smi(bin_dir, calls)
    n = Node(tmp_path, bin_dir, calls)
    try:
        yield n
    finally:
        if n.proc is not None and n.proc.poll() is None:
            n.proc.kill()
            n.proc.wait(timeout=30)
        pid = n.live_pid()  # never leave a stand-in daemon behind
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


UP = 'tessera_mps_daemon_up{node="gpu-1"}'
RESTARTS = 'tessera_mps_daemon_restarts_total{node="gpu-1"}'


def test_starts_the_daemon_and_stops_it_with_quit(node: Node) -> None:
    node.start()
    pid = wait_until(node.live_pid, "the daemon's pid file")
    assert wait_until(lambda: node.metrics().get(UP) == 1, "up=1")
    assert node.metrics()[RESTARTS] == 0
    assert node.probe() == (True, "")
    assert node.smi_calls.read_text().splitlines() == ["-c EXCLUSIVE_PROCESS"]
    assert "(multi-user)" not in (node.log_dir / "control.log").read_text()
    assert node.terminate() == 0
    assert not daemon_alive(pid)
    control = (node.log_dir / "control.log").read_text()
    assert "command: quit" in control and "exit" in control
    assert not (node.pipe_dir / "nvidia-cuda-mps-control.pid").exists()
    assert node.smi_calls.read_text().splitlines() == ["-c EXCLUSIVE_PROCESS", "-c DEFAULT"]
    assert "SIGTERM" not in node.log() and "SIGKILL" not in node.log()


def test_a_daemon_that_dies_is_started_again(node: Node) -> None:
    node.start()
    # once the supervisor has seen it run (a daemon killed before that is a failed start)
    assert wait_until(lambda: node.metrics().get(UP) == 1, "up=1")
    first = wait_until(node.live_pid, "the daemon")
    os.kill(first, signal.SIGKILL)  # its pid file stays behind, as the real daemon's does
    second = wait_until(lambda: (p := node.live_pid()) != first and p, "a new daemon")
    assert second != first and not daemon_alive(first)
    assert wait_until(lambda: node.metrics().get(RESTARTS) == 1, "one restart counted")
    assert node.metrics()[UP] == 1
    assert node.probe() == (True, "")
    assert "is gone; starting it again" in node.log()
    assert not (node.pipe_dir / "tessera-mps.error").exists()
    # a second crash: counted again (the backoff has doubled to 2 s)
    os.kill(second, signal.SIGKILL)
    # the probe sees it down at once (a dead pid), then with the supervisor's reason
    assert wait_until(lambda: "died" in node.probe()[1], "the probe reports why it is down")
    wait_until(lambda: (p := node.live_pid()) not in (None, second) and p, "a third daemon")
    assert wait_until(lambda: node.metrics().get(RESTARTS) == 2, "two restarts counted")
    assert node.terminate() == 0


def test_a_daemon_deaf_to_quit_is_signalled(node: Node) -> None:
    node.start("--stop-timeout=0.5", env={"FAKE_MPS_IGNORE_QUIT": "1"})
    pid = wait_until(node.live_pid, "the daemon")
    assert node.terminate() == 0
    assert not daemon_alive(pid)
    assert "command: quit" in (node.log_dir / "control.log").read_text()
    assert "is still running; sending SIGTERM" in node.log()


def test_no_driver_binary_says_so_and_takes_no_shares(node: Node) -> None:
    node.start(with_binary=False)
    assert wait_until((node.pipe_dir / "tessera-mps.error").exists, "the error file")
    reason = (node.pipe_dir / "tessera-mps.error").read_text().strip()
    assert reason.startswith("nvidia-cuda-mps-control not found")
    assert "this node takes no GPU shares" in reason
    assert node.probe() == (False, reason)
    assert wait_until(lambda: node.metrics().get(UP) == 0, "up=0")
    assert node.proc is not None and node.proc.poll() is None  # keeps looking, no crash loop
    assert node.log().count("nvidia-cuda-mps-control not found") == 1  # backoff: not a flood
    assert node.terminate() == 0


def test_a_failing_start_is_reported_with_the_daemon_s_words(node: Node) -> None:
    node.start(env={"FAKE_MPS_FAIL": "1"})
    assert wait_until((node.pipe_dir / "tessera-mps.error").exists, "the error file")
    reason = (node.pipe_dir / "tessera-mps.error").read_text()
    assert "-d exited with status 1: An instance of this daemon is already running" in reason
    assert node.probe()[0] is False
    assert node.terminate() == 0


def test_multi_user_mode_reaches_the_daemon(node: Node) -> None:
    node.start("--multi-user", "--keep-compute-mode")
    wait_until(node.live_pid, "the daemon")
    assert "(multi-user)" in (node.log_dir / "control.log").read_text()
    assert node.terminate() == 0
    assert not node.smi_calls.exists()  # the compute mode was left alone


def test_the_probe_refuses_a_stale_or_foreign_pid(tmp_path: Path) -> None:
    pipe = tmp_path / "tmp/nvidia-mps"
    pipe.mkdir(parents=True)
    probe = LayerProbe(LayerPaths(LAYER_MPS, "", "/tmp/nvidia-mps", root=str(tmp_path)))
    assert probe.probe().up is False and "no /tmp/nvidia-mps/" in probe.probe().reason
    for text in ("", "abc", "-5", "99999999999", "1" * 40):
        (pipe / "nvidia-cuda-mps-control.pid").write_text(text)
        assert "holds no process ID" in probe.probe().reason, text
    # a live process that is not the daemon (this test's own)
    (pipe / "nvidia-cuda-mps-control.pid").write_text(str(os.getpid()))
    assert "is not running" in probe.probe().reason
