"""Reading pod objects as the API server sends them (decoded JSON) without trusting their
shape: a field of the wrong type reads as absent."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.resources import TESSERA_RESOURCES


def section(obj: Any, name: str) -> Mapping[str, Any]:
    """obj[name] when both are objects, else {}."""
    value = obj.get(name) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def requests_devices(pod: Any) -> bool:
    """Whether any container asks for a tessera resource (a non-zero quantity)."""
    spec = section(pod, "spec")
    for group in ("containers", "initContainers"):
        containers = spec.get(group)
        for container in containers if isinstance(containers, list) else []:
            resources = section(container, "resources")
            for part in ("limits", "requests"):
                amounts = section(resources, part)
                if any(amounts.get(r) not in (None, 0, "0") for r in TESSERA_RESOURCES):
                    return True
    return False


FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def text(value: Any) -> str:
    """A string field's value; "" for anything else."""
    return value if isinstance(value, str) else ""


def pod_identity(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    """(uid, namespace, name) of a pod dict."""
    meta = section(pod, "metadata")
    return (
        text(meta.get("uid")),
        text(meta.get("namespace")) or "default",
        text(meta.get("name")),
    )


def pod_node(pod: Mapping[str, Any]) -> str:
    """The node the pod is bound to, or ""."""
    return text(section(pod, "spec").get("nodeName"))


def is_finished(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's phase is Succeeded or Failed."""
    return section(pod, "status").get("phase") in FINISHED_PHASES
