"""Checks on the node agent's flags: each bad value is one `ConfigError` naming the flag and
what is wrong, which the command prints as one line before exiting with status 2.

Value checks run while parsing (argparse types); checks that need the file system (the socket
directory, files) or several flags together run once parsing is done.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import socket
import stat
from collections.abc import Callable
from pathlib import Path

MAX_INTERVAL_S = 86400.0
"""Longest accepted interval or period (one day): longer ones make no sense for health or
heartbeats, and `threading.Event.wait` overflows on huge timeouts."""
MAX_MEMORY_UNIT_MIB = 1 << 20
"""Largest gpu-memory unit (1 TiB); the real check is against the smallest GPU, later."""
MAX_NUMBER_CHARS = 32
"""A number flag's text is parsed only up to this length (no 5000-digit integers)."""
MAX_SOCKET_PATH_BYTES = 107
"""A unix socket path holds at most 107 bytes (sun_path is 108 with the final NUL)."""
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_LABEL = re.compile(_DNS1123_LABEL)


class ConfigError(Exception):
    """A flag whose value cannot work; str() is the one line to print."""

    def __init__(self, flag: str, problem: str) -> None:
        super().__init__(f"{flag}: {problem}")
        self.flag = flag
        self.problem = problem


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (status 2), not usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _number_text(text: str) -> str:
    if len(text) > MAX_NUMBER_CHARS:
        raise argparse.ArgumentTypeError(f"{text[:MAX_NUMBER_CHARS]!r}... is not a number")
    return text.strip()


def whole(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(_number_text(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low}..{high}, got {value}")
        return value

    parse.__name__ = "whole number"
    return parse


def seconds(low: float, allow_zero: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds in (low, MAX_INTERVAL_S] (or 0)."""

    def parse(text: str) -> float:
        try:
            value = float(_number_text(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text!r}")
        if allow_zero and value == 0:
            return 0.0
        if not low < value <= MAX_INTERVAL_S:
            zero = "0 or " if allow_zero else ""
            raise argparse.ArgumentTypeError(
                f"must be {zero}above {low:g} and at most {MAX_INTERVAL_S:g} seconds, got {value:g}"
            )
        return value

    parse.__name__ = "seconds"
    return parse


def node_name(text: str) -> str:
    """A Kubernetes node name: a DNS-1123 subdomain (it goes into API paths and the Lease)."""
    if not text or len(text) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r} is not a valid node name (lowercase letters, digits, '-' and '.', "
            "at most 253 characters)"
        )
    return text


def namespace(text: str) -> str:
    if not text or len(text) > 63 or not _LABEL.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r} is not a valid namespace (a DNS-1123 label: lowercase letters, "
            "digits and '-', at most 63 characters)"
        )
    return text


def non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("may not be empty")
    return text


# --- file system --------------------------------------------------------------------------


def check_socket_dir(flag: str, directory: Path, longest_name: str) -> None:
    """`directory` can hold our sockets: it exists (or is created), is a directory, and a
    unix socket can be bound in it (a probe socket, removed at once; this refuses /proc,
    read-only mounts and directories we may not write)."""
    longest = len(os.fsencode(directory / longest_name))
    if longest > MAX_SOCKET_PATH_BYTES:
        raise ConfigError(
            flag,
            f"{directory} is too long: socket paths in it would be {longest} bytes, over the "
            f"{MAX_SOCKET_PATH_BYTES}-byte unix socket limit",
        )
    if directory.exists() and not directory.is_dir():
        raise ConfigError(flag, f"{directory} exists and is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(flag, f"cannot create {directory}: {exc.strerror}") from None
    probe = directory / f".tessera-probe-{os.getpid()}.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(probe))
    except OSError as exc:
        raise ConfigError(
            flag, f"cannot create a unix socket in {directory}: {exc.strerror}"
        ) from None
    finally:
        sock.close()
    with contextlib.suppress(OSError):
        probe.unlink()


def check_socket_path(flag: str, path: Path) -> None:
    """A socket we will dial: short enough, and not something else when it exists."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise ConfigError(flag, f"{path} is longer than {MAX_SOCKET_PATH_BYTES} bytes")
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return  # the kubelet may start later; the agent waits for its socket
    except OSError as exc:
        raise ConfigError(flag, f"cannot read {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise ConfigError(flag, f"{path} exists and is not a socket")


def check_readable_file(flag: str, path: Path) -> None:
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(flag, f"{path}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(flag, f"{path} is not a regular file")
    if not os.access(path, os.R_OK):
        raise ConfigError(flag, f"{path} is not readable")


def check_directory(flag: str, path: Path) -> None:
    if not path.is_dir():
        raise ConfigError(flag, f"{path} is not a directory")
