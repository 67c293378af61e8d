"""Reading API objects without trusting their shape: a field of the wrong type reads as
absent, never as an exception."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from tessera.pod_fields import section
from tessera.resources import ALLOCATION_ANNOTATION, HEARTBEAT_LEASE_PREFIX, USAGE_ANNOTATION
from tessera.usage import NodeUsage, UsageError, decode_usage

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


def heartbeat_leases(leases: Iterable[Any] | None) -> dict[str, Mapping[str, Any]]:
    """Node name -> its agent's heartbeat Lease (other Leases are left out)."""
    return {
        name_of(lease)[len(HEARTBEAT_LEASE_PREFIX) :]: lease
        for lease in leases or ()
        if isinstance(lease, Mapping) and name_of(lease).startswith(HEARTBEAT_LEASE_PREFIX)
    }


LEASES_UNREADABLE = "the heartbeat Leases cannot be read"


def usage_of(lease: Mapping[str, Any] | None) -> NodeUsage | str:
    """What the node agent last read its GPUs' processes use (the usage annotation on its
    heartbeat Lease), or why that is unknown. The agent writes it: anything that does not
    decode is a reason, never an exception."""
    if lease is None:
        return "no heartbeat Lease"
    value = section(section(lease, "metadata"), "annotations").get(USAGE_ANNOTATION)
    if not isinstance(value, str):
        return f"no {USAGE_ANNOTATION} annotation on the heartbeat Lease"
    try:
        return decode_usage(value)
    except UsageError as exc:
        return f"usage annotation does not parse: {exc}"
