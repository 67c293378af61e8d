"""Value checks for flags (argparse types), shared by every tessera program.

Each raises `argparse.ArgumentTypeError` with what is wrong; `CliParser` names the flag, or
its `TESSERA_*` variable, in front of it. The same check runs for both.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
from collections.abc import Callable

from tessera.nri_required import valid_plugin_name

MAX_INTERVAL_S = 86400.0
"""Longest accepted duration (one day): longer ones are typos for health checks, heartbeats
or timeouts, and `threading.Event.wait` overflows on huge timeouts."""
MAX_NUMBER_CHARS = 32
"""A number's text is parsed only up to this length (no 5000-digit integers)."""
MAX_PORT = 65535
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_LABEL = re.compile(_DNS1123_LABEL)


def _number_text(text: str) -> str:
    if len(text) > MAX_NUMBER_CHARS:
        raise argparse.ArgumentTypeError(f"{text[:MAX_NUMBER_CHARS]!r}... is not a number")
    return text.strip()


def whole(low: int, high: int) -> Callable[[str], int]:
    """A whole number in [low, high]."""

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


port = whole(0, MAX_PORT)
"""A TCP port; 0 asks the kernel for a free one (or turns a server off, as the flag says)."""


def seconds(
    low: float = 0.0, high: float = MAX_INTERVAL_S, allow_zero: bool = False
) -> Callable[[str], float]:
    """A finite number of seconds in (low, high], or 0 when `allow_zero`."""

    def parse(text: str) -> float:
        try:
            value = float(_number_text(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text!r}")
        if allow_zero and value == 0:
            return 0.0
        if not low < value <= high:
            zero = "0 or " if allow_zero else ""
            raise argparse.ArgumentTypeError(
                f"must be {zero}above {low:g} and at most {high:g} seconds, got {value:g}"
            )
        return value

    parse.__name__ = "seconds"
    return parse


def listen_address(text: str) -> tuple[str, int]:
    """HOST:PORT to listen on: an IP address ([v6] or bare), localhost, or empty for all."""
    host, sep, number = text.rpartition(":")
    if not sep or not number.isdigit() or len(number) > MAX_NUMBER_CHARS:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text[:80]!r}")
    if int(number) > MAX_PORT:
        raise argparse.ArgumentTypeError(f"port {number} is not in 0..{MAX_PORT}")
    host = host.strip("[]") or "0.0.0.0"
    if host == "localhost":
        return "127.0.0.1", int(number)
    return ip_address(host), int(number)


def ip_address(text: str) -> str:
    """An IPv4 or IPv6 address (no names: they would resolve differently later)."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an IP address or localhost, got {text[:80]!r}"
        ) from None


def _dns_name(text: str, pattern: re.Pattern[str], longest: int, what: str, rule: str) -> str:
    if not text or len(text) > longest or not pattern.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r} is not a valid {what} ({rule}, at most {longest} characters)"
        )
    return text


def node_name(text: str) -> str:
    """A Kubernetes node name: a DNS-1123 subdomain (it goes into API paths and the Lease)."""
    return _dns_name(
        text, _DNS1123_SUBDOMAIN, 253, "node name", "lowercase letters, digits, '-' and '.'"
    )


def namespace(text: str) -> str:
    """A Kubernetes namespace: a DNS-1123 label."""
    rule = "a DNS-1123 label: lowercase letters, digits and '-'"
    return _dns_name(text, _LABEL, 63, "namespace", rule)


def nri_plugin_name(text: str) -> str:
    """An NRI plugin's name, as containerd accepts it at registration."""
    if not valid_plugin_name(text):
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r} is not an NRI plugin name: use letters, digits, '_', '.', '+' and '-'"
        )
    return text


def non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("may not be empty")
    return text


def absolute_path(text: str) -> str:
    """A host path that is mounted or handed to another process: it must be absolute."""
    if text and not text.startswith("/"):
        raise argparse.ArgumentTypeError(f"{text[:80]} must be an absolute host path")
    return text
