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
