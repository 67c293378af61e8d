"""The node's GPU isolation layer as its node agent reports it (NodeDevices `spec.isolation`).

A GPU share is a limit only where a layer enforces it: HAMi-core's library preloaded into
each container, or NVIDIA's MPS control daemon. The node agent probes its node's layer and
publishes what it found; the scheduler gives no new GPU share to a node whose layer is down
(`NodeIsolation.refusal`), and whole GPUs, which need no limit, are not affected. A node
whose agent publishes nothing (an older agent) is `None` here: unknown, treated as before.

Parsed bounded like the rest of the inventory (tessera.model): a value that breaks a rule
is an InventoryError for that one node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

from tessera.errors import InventoryError

LAYER_HAMI_CORE: Final = "hami-core"
LAYER_MPS: Final = "mps"
LAYER_NONE: Final = "none"
"""No layer: shares are bookkeeping only (the NRI hook demands that this be accepted)."""
LAYERS: Final = (LAYER_NONE, LAYER_MPS, LAYER_HAMI_CORE)

UNKNOWN_VERSION: Final = "unknown"
"""The version of a HAMi-core library tessera did not install (no stamp beside it)."""
MAX_VERSION_CHARS: Final = 64
"""A version or commit: an upstream short commit with tessera's patch level, or 40 hex."""
MAX_LAYER_REASON_CHARS: Final = 256
"""Why a layer is down: one sentence for an operator (it travels in filter reasons)."""


@dataclass(frozen=True, slots=True)
class NodeIsolation:
    """What enforces GPU shares on one node, and whether it does right now."""

    layer: str
    """One of `LAYERS`."""
    up: bool
    """The layer is in place: the library is installed whole, or the MPS daemon runs."""
    version: str = ""
    """HAMi-core: the installed library's version (`UNKNOWN_VERSION` for one the operator
    brought); MPS: empty."""
    commit: str = ""
    """HAMi-core: the upstream commit the library was built from, when known."""
    reason: str = ""
    """Why the layer is down; empty while it is up."""

    def to_dict(self) -> dict[str, Any]:
        """`spec.isolation` of the NodeDevices object: the fields by their own names."""
        return asdict(self)

    @property
    def takes_shares(self) -> bool:
        """Whether a new GPU share may be placed on the node (whole GPUs always may)."""
        return self.up

    def refusal(self) -> str | None:
        """Why the node takes no new GPU share, naming the layer and what is missing; None
        while the layer is up. Meant for a filter reason."""
        if self.up:
            return None
        why = self.reason or "no reason given"
        return f"isolation layer {self.layer} is down: {why}"


def share_refusal(isolation: NodeIsolation | None) -> str | None:
    """Why a node with this layer report takes no new GPU share; None when it takes them,
    including when the report is missing (an agent that does not report: unknown)."""
    return None if isolation is None else isolation.refusal()


def parse_isolation(
    value: Any, source: str, path: str = "isolation", share: Callable[[str], str] | None = None
) -> NodeIsolation | None:
    """`spec.isolation` of a NodeDevices object; None when absent (unknown). Every problem
    is an InventoryError naming `source` and the field."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InventoryError(source, path, f"expected a mapping, got {type(value).__name__}")
    keep = share or (lambda s: s)
    layer = _text(value, "layer", source, path, MAX_VERSION_CHARS, required=True)
    if layer not in LAYERS:
        raise InventoryError(
            source, f"{path}.layer", f"must be one of {', '.join(LAYERS)}, got {layer[:40]!r}"
        )
    up = value.get("up")
    if not isinstance(up, bool):
        problem = "required field is missing" if up is None else "expected true or false"
        raise InventoryError(source, f"{path}.up", problem)
    reason = _text(value, "reason", source, path, MAX_LAYER_REASON_CHARS)
    if up and reason:
        raise InventoryError(source, f"{path}.reason", "must be empty while the layer is up")
    return NodeIsolation(
        layer=keep(layer),
        up=up,
        version=keep(_text(value, "version", source, path, MAX_VERSION_CHARS)),
        commit=keep(_text(value, "commit", source, path, MAX_VERSION_CHARS)),
        reason=reason,
    )


def _text(
    doc: Mapping[str, Any],
    key: str,
    source: str,
    path: str,
    limit: int,
    *,
    required: bool = False,
) -> str:
    """A bounded, printable string field ("" when absent and not required): these values
    end up in labels, metrics, logs and filter reasons."""
    value = doc.get(key)
    where = f"{path}.{key}"
    if value is None:
        if required:
            raise InventoryError(source, where, "required field is missing")
        return ""
    if not isinstance(value, str):
        raise InventoryError(source, where, f"expected a string, got {type(value).__name__}")
    if len(value) > limit:
        raise InventoryError(
            source, where, f"{len(value)} characters, more than the limit of {limit}"
        )
    if not value.isprintable():
        raise InventoryError(source, where, "contains characters that cannot be printed")
    return value
