"""Checks on the paths flags name, run once parsing is done: each problem is one
`ConfigError` naming the flag, before anything starts."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

from tessera_cli.parser import ConfigError

MAX_SOCKET_PATH_BYTES = 107
"""A unix socket path holds at most 107 bytes (sun_path is 108 with the final NUL)."""


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


def check_socket_path(flag: str, path: Path, *, directory_must_exist: bool = False) -> None:
    """A socket we will dial: short enough, and not something else when it exists (the peer
    may start later: a missing socket is fine)."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise ConfigError(flag, f"{path} is longer than {MAX_SOCKET_PATH_BYTES} bytes")
    if directory_must_exist and not path.parent.is_dir():
        raise ConfigError(flag, f"{path}: directory {path.parent} does not exist")
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(flag, f"cannot read {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise ConfigError(flag, f"{path} exists and is not a socket")


def check_readable_file(flag: str, path: Path) -> None:
    """A regular file we can open and read."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ConfigError(flag, f"{path} does not exist") from None
    except OSError as exc:
        raise ConfigError(flag, f"{path}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(flag, f"{path} is not a regular file")
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as exc:
        raise ConfigError(flag, f"cannot read {path}: {exc.strerror}") from None


def check_directory(flag: str, path: Path) -> None:
    if not path.is_dir():
        raise ConfigError(flag, f"{path} is not a directory")
