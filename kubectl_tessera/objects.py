"""Reading API objects without trusting their shape: a field of the wrong type reads as
absent, never as an exception."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tessera.pod_fields import section
from tessera.resources import ALLOCATION_ANNOTATION

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def name_of(obj: Any) -> str:
    return text(section(obj, "metadata").get("name"))


def namespace_of(obj: Any) -> str:
    return text(section(obj, "metadata").get("namespace")) or "default"


def uid_of(obj: Any) -> str:
    return text(section(obj, "metadata").get("uid"))


def node_of(pod: Any) -> str:
    return text(section(pod, "spec").get("nodeName"))


def phase_of(pod: Any) -> str:
    return text(section(pod, "status").get("phase"))


def record_of(pod: Any) -> str | None:
    value = section(section(pod, "metadata"), "annotations").get(ALLOCATION_ANNOTATION)
    return value if isinstance(value, str) else None


def holds_devices(pod: Any) -> bool:
    """The rebuild rule's preconditions: a record, bound, not finished (the record itself
    is judged separately)."""
    return (
        record_of(pod) is not None and bool(node_of(pod)) and phase_of(pod) not in (FINISHED_PHASES)
    )


def parse_time(value: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 time (Time or MicroTime), else None."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return parsed.timestamp()


def age(seconds: float) -> str:
    """kubectl's short age: 45s, 3m, 2h, 5d."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 2 * 3600:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def mib(value: int) -> str:
    return f"{value / 1024:.1f}GiB" if value >= 1024 else f"{value}MiB"
