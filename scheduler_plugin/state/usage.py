"""Used beside granted: the node agents' usage readings on the allocation page.

Every node agent publishes what the processes on its GPUs use as an annotation on its
heartbeat Lease (`tessera.usage`, about every 10 s). The Lease watch only keeps that text
(`UsageTexts.keep`: a dict lookup, a length check and a string compare per event, whatever
the text holds: 5,000 nodes renew every 10 s). It is decoded when a view asks
(`Reading.decoded`), once per text, and set beside the grants in that node's summary
(`with_usage`). The text is written by node agents, so it is hostile input: one that is
missing, oversized, malformed or of another schema makes that node's use unknown, with the
reason, and touches nothing else.

Grants and use meet on (pod UID, container, GPU UUID). Use by owners that are no tessera
container (`host`, `other-pod`, `mps-server`) is listed per GPU as `unattributed`, never
under a pod; a tessera container the reading shows on a GPU where the state holds no
grant for it (its record does not count, or the watch has not caught up) is listed per GPU
as `ungranted`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.pod_fields import section
from tessera.resources import USAGE_ANNOTATION
from tessera.usage import MAX_USAGE_BYTES, ContainerUsage, NodeUsage, UsageError, decode_usage

log = logging.getLogger(__name__)

MEMO_NODES = 512
"""Nodes whose decoded reading is kept (the most recently viewed). A decoded reading is
about 8 KB for 16 containers, four times its text; kept for every node it would hold some
40 MB at 5,000 nodes, for as long as a silent agent's Lease stays unchanged."""


@dataclass(frozen=True, slots=True)
class Unknown:
    """Why a node's use is unknown; `invalid` when the agent wrote something unreadable
    (as opposed to writing nothing)."""

    reason: str
    invalid: bool = False


Decoded = NodeUsage | Unknown


class Reading:
    """One node's usage annotation as the Lease carried it, decoded on first ask.

    `decoded` may run on two view threads at once for one text: both get equal values and
    the last write wins, so the memo needs no lock."""

    __slots__ = ("_memo", "text")

    def __init__(self, text: str | None, unknown: Unknown | None = None) -> None:
        self.text = text
        self._memo: Decoded | None = unknown

    def same(self, other: Reading) -> bool:
        """Whether the Lease still says the same (a text compare, bounded by the size cap)."""
        if self.text is not None or other.text is not None:
            return self.text == other.text
        return self._memo == other._memo

    def decoded(self) -> Decoded:
        memo = self._memo
        if memo is None:
            memo = self._memo = _decode(self.text or "")
        return memo

    def forget(self) -> None:
        """Drop the decoded value (a text decodes again when next asked)."""
        if self.text is not None:
            self._memo = None


def _decode(text: str) -> Decoded:
    try:
        return decode_usage(text)
    except UsageError as exc:
        return Unknown(f"usage annotation does not parse: {exc}", invalid=True)
    except Exception as exc:  # a decoder bug must not take the view down with it
        log.exception("bug: decoding a usage annotation raised")
        return Unknown(f"usage annotation cannot be read ({type(exc).__name__})", invalid=True)


NO_LEASE = Reading(None, Unknown("no heartbeat Lease"))
NO_ANNOTATION = Reading(
    None,
    Unknown(
        f"the heartbeat Lease carries no {USAGE_ANNOTATION} annotation (a node agent that "
        "does not read usage)"
    ),
)


def reading_of(lease: Mapping[str, Any]) -> Reading:
    """What the watch keeps of a Lease's usage annotation: O(1), nothing is parsed. An
    oversized text is not kept (a reason is), so a hostile agent cannot make the scheduler
    hold more than MAX_USAGE_BYTES a node."""
    text = section(section(lease, "metadata"), "annotations").get(USAGE_ANNOTATION)
    if text is None:
        return NO_ANNOTATION
    if not isinstance(text, str):
        return Reading(None, Unknown("usage annotation is not a string", invalid=True))
    if len(text) > MAX_USAGE_BYTES:  # characters: at least as many bytes
        reason = f"usage annotation of {len(text)} characters, over {MAX_USAGE_BYTES} bytes"
        return Reading(None, Unknown(reason, invalid=True))
    return Reading(text)


class UsageTexts:
    """Per node, the Reading of its heartbeat Lease. Not thread-safe: the state's Leases
    part calls it under the state's lock."""

    __slots__ = ("_invalid", "_memos", "_readings")

    def __init__(self) -> None:
        self._readings: dict[str, Reading] = {}
        self._invalid: set[str] = set()
        """Nodes whose last decoded reading was invalid, so that each is logged once."""
        self._memos: dict[str, None] = {}
        """Nodes whose reading holds its decoded value, least recently viewed first."""

    def keep(self, node: str, lease: Mapping[str, Any]) -> bool:
        """Keep the Lease's text; True when it differs from what the node had."""
        new = reading_of(lease)
        old = self._readings.get(node)
        if old is not None and old.same(new):
            return False
        self._readings[node] = new
        return True

    def drop(self, node: str) -> bool:
        self._invalid.discard(node)
        self._memos.pop(node, None)
        return self._readings.pop(node, None) is not None

    def nodes(self) -> list[str]:
        return list(self._readings)

    def reading(self, node: str) -> Reading:
        return self._readings.get(node, NO_LEASE)

    def note(self, node: str, decoded: Decoded) -> None:
        """After a view decoded `node`'s reading: keep at most MEMO_NODES decoded, and log
        an unreadable annotation once a node, until it reads again."""
        self._memos.pop(node, None)
        self._memos[node] = None
        while len(self._memos) > MEMO_NODES:
            oldest = next(iter(self._memos))
            del self._memos[oldest]
            self.reading(oldest).forget()
        if not isinstance(decoded, Unknown) or not decoded.invalid:
            self._invalid.discard(node)
        elif node not in self._invalid:
            self._invalid.add(node)
            log.warning("node %s: usage unknown: %s", node, decoded.reason)


# --- the view ------------------------------------------------------------------------------

_Key = tuple[str, str, str]
"""(pod UID, container, GPU UUID)."""


def _by_key(rows: Iterable[ContainerUsage]) -> dict[_Key, tuple[int, int | None, ContainerUsage]]:
    """Rows by key; rows the agent repeated are added up (SM capped at 100)."""
    result: dict[_Key, tuple[int, int | None, ContainerUsage]] = {}
    for c in rows:
        key = (c.pod_uid, c.container, c.gpu)
        memory, sm, _ = result.get(key, (0, None, c))
        if c.sm_percent is not None:
            sm = min(100, (sm or 0) + c.sm_percent)
        result[key] = (memory + c.memory_mib, sm, c)
    return result


def _unknown(summary: dict[str, Any], why: Unknown) -> dict[str, Any]:
    summary["usage"] = {
        "known": False,
        "observed": None,
        "reason": why.reason,
        "invalid": why.invalid,
        "elsewhere": 0,
    }
    for gpu in summary["gpus"]:
        gpu["inUse"] = None
        gpu["unattributed"] = []
        gpu["ungranted"] = []
        for holder in gpu["pods"]:
            holder["usage"] = None
    return summary


def _gpu(gpu: dict[str, Any], reading: NodeUsage, used: dict[_Key, Any]) -> None:
    """Set one GPU's use beside its grants; takes the keys it matched out of `used`."""
    uuid = gpu["uuid"]
    for holder in gpu["pods"]:
        # granted but absent from the reading: no process of it runs on this GPU
        memory, sm, _ = used.pop((holder["uid"], holder["container"], uuid), (0, 0, None))
        holder["usage"] = {"memoryMiB": memory, "smPercent": sm}
    others = [o for o in reading.unattributed if o.gpu == uuid]
    gpu["unattributed"] = [
        {"owner": o.owner, "memoryMiB": o.memory_mib, "processes": o.processes} for o in others
    ]
    ungranted = [(k, v) for k, v in used.items() if k[2] == uuid]
    gpu["ungranted"] = [
        {
            "namespace": c.namespace,
            "name": c.pod,
            "uid": c.pod_uid,
            "container": c.container,
            "memoryMiB": memory,
            "smPercent": sm,
        }
        for _, (memory, sm, c) in ungranted
    ]
    for key, _ in ungranted:
        del used[key]
    gpu["inUse"] = {
        "memoryMiB": sum(h["usage"]["memoryMiB"] for h in gpu["pods"])
        + sum(o.memory_mib for o in others)
        + sum(u["memoryMiB"] for u in gpu["ungranted"])
    }


def with_usage(summary: dict[str, Any], decoded: Decoded) -> dict[str, Any]:
    """The node summary (Cache.node_summary, a fresh value) with the reading set beside the
    grants: per pod holder `usage: {memoryMiB, smPercent}` (null when unknown), per GPU
    `inUse`, `unattributed` and `ungranted`, per node `usage: {known, observed, reason,
    invalid, elsewhere}`. Rows naming a GPU the inventory lacks are counted in `elsewhere`."""
    if isinstance(decoded, Unknown):
        return _unknown(summary, decoded)
    used = _by_key(decoded.containers)
    for gpu in summary["gpus"]:
        _gpu(gpu, decoded, used)
    known = {gpu["uuid"] for gpu in summary["gpus"]}
    summary["usage"] = {
        "known": True,
        "observed": decoded.observed,
        "reason": None,
        "invalid": False,
        "elsewhere": len(used) + sum(1 for o in decoded.unattributed if o.gpu not in known),
    }
    return summary
