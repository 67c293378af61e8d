"""A stand-in for NVIDIA's nvidia-cuda-mps-control, as far as tessera's supervisor and node
agent see it:

- `-d` (optionally `-M`): daemonizes (the command returns 0 once the daemon runs), names the
  daemon's process `nvidia-cuda-mps` as Linux shows the real one, writes its pid to
  `nvidia-cuda-mps-control.pid` in $CUDA_MPS_PIPE_DIRECTORY, listens on `control` there, and
  logs to control.log in $CUDA_MPS_LOG_DIRECTORY;
- without `-d`: a client, sending each line of stdin to the daemon's control socket and
  printing the answer (`quit` stops the daemon, which removes its pid file);
- killed, it leaves its pid file behind, as the real daemon does.

Knobs for the tests (environment): FAKE_MPS_IGNORE_QUIT=1 (the daemon answers quit but
stays), FAKE_MPS_FAIL=1 (`-d` exits 1 saying why).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import time

PID_FILE = "nvidia-cuda-mps-control.pid"


def _log(line: str) -> None:
    log_dir = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
    with open(os.path.join(log_dir, "control.log"), "a", encoding="utf-8") as f:
        f.write(f"[{time.strftime('%H:%M:%S')} Control {os.getpid()}] {line}\n")


def _daemon(pipe_dir: str, multi_user: bool) -> None:
    ctypes.CDLL(None).prctl(15, b"nvidia-cuda-mps", 0, 0, 0)
    path = os.path.join(pipe_dir, "control")
    if os.path.exists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    with open(os.path.join(pipe_dir, PID_FILE), "w", encoding="ascii") as f:
        f.write(f"{os.getpid()}\n")
    _log(f"Starting control daemon using socket {path}" + (" (multi-user)" if multi_user else ""))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        conn, _ = server.accept()
        with conn:
            command = conn.recv(4096).decode().strip()
            _log(f"command: {command}")
            if command == "quit" and not os.environ.get("FAKE_MPS_IGNORE_QUIT"):
                conn.sendall(b"")
                os.unlink(os.path.join(pipe_dir, PID_FILE))
                os.unlink(path)
                _log("exit")
                os._exit(0)
            conn.sendall(b"ok\n")


def main(argv: list[str]) -> int:
    pipe_dir = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    if "-d" in argv:
        if os.environ.get("FAKE_MPS_FAIL"):
            print("An instance of this daemon is already running", file=sys.stderr)
            return 1
        if os.fork() != 0:
            # the real command returns once the daemon is up; give it its pid file first
            for _ in range(200):
                if os.path.exists(os.path.join(pipe_dir, PID_FILE)):
                    return 0
                time.sleep(0.01)
            return 0
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        _daemon(pipe_dir, "-M" in argv)
        return 0
    for line in sys.stdin:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            try:
                conn.connect(os.path.join(pipe_dir, "control"))
            except OSError as exc:
                print(f"Cannot find MPS control daemon process ({exc})", file=sys.stderr)
                return 1
            conn.sendall(line.encode())
            sys.stdout.write(conn.recv(4096).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
