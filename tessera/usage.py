"""What each container really uses of its GPUs, as the node agent reports it: the codec of
the usage annotation (`tessera.resources.USAGE_ANNOTATION`) on the agent's heartbeat Lease.

The agent writes it; the scheduler (the allocation page) and `kubectl tessera pods` read it
and set it beside what the allocation records grant. Whoever can write a node agent's Lease
writes this text, so `decode_usage` is bounded (size, entries, string lengths, numbers) and
fails with one typed error; a reader shows such a node's use as unknown and carries on.

Schema (version 1), compact because it rides on every renewal:

    {"v": 1, "at": "<RFC 3339 time of the reading>",
     "c": [[pod UID, namespace, pod, container, GPU UUID, memory MiB, SM % or null], ...],
     "o": [[GPU UUID, owner, memory MiB, processes], ...]}

`c` holds every tessera container seen on a GPU; `o` what no tessera container owns, by
owner: `host` (a process outside any pod), `other-pod` (a pod with no tessera record, as
another device plugin's) or `mps-server` (the MPS server, whose compute is its clients').
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from tessera.boundedjson import JsonLimitError, loads
from tessera.errors import InputError

USAGE_SCHEMA_VERSION: Final = 1
MAX_USAGE_BYTES: Final = 64 * 1024
"""Keeps a Lease far below etcd's 1.5 MiB object limit; with ordinary names a row takes
120-150 bytes, so about 450 rows fit (the encoder leaves out the smallest beyond that)."""
MAX_USAGE_ROWS: Final = 512
MAX_TEXT: Final = 253
"""Longest string in a row: a DNS subdomain name (pod), also enough for a UUID."""
MAX_MIB: Final = 1 << 30
"""A GiB-scale figure in MiB; 2^30 MiB is an exbibyte, past any GPU."""

OWNER_HOST: Final = "host"
OWNER_OTHER_POD: Final = "other-pod"
OWNER_MPS_SERVER: Final = "mps-server"
OWNERS: Final = (OWNER_HOST, OWNER_OTHER_POD, OWNER_MPS_SERVER)


class UsageError(InputError):
    """A usage report that is not one: malformed, of another schema, or out of bounds."""


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    """One tessera container's use of one GPU."""

    pod_uid: str
    namespace: str
    pod: str
    container: str
    gpu: str
    """The GPU's UUID."""
    memory_mib: int
    sm_percent: int | None
    """Its processes' share of the GPU's time running kernels; None where the driver does
    not sample it (MPS clients: their kernels run in the MPS server)."""


@dataclass(frozen=True, slots=True)
class UnattributedUsage:
    """GPU use that belongs to no tessera container."""

    gpu: str
    owner: str
    """One of OWNERS."""
    memory_mib: int
    processes: int


@dataclass(frozen=True, slots=True)
class NodeUsage:
    observed: str
    """When the agent read it (RFC 3339, UTC)."""
    containers: tuple[ContainerUsage, ...] = ()
    unattributed: tuple[UnattributedUsage, ...] = ()

    def of_pod(self, pod_uid: str) -> tuple[ContainerUsage, ...]:
        return tuple(c for c in self.containers if c.pod_uid == pod_uid)


def encode_usage(usage: NodeUsage) -> str:
    """The annotation text, within MAX_USAGE_ROWS rows and MAX_USAGE_BYTES bytes: the
    containers' rows first, then what no tessera container owns, each largest memory first;
    what does not fit is left out."""
    containers = [
        [
            *(c.pod_uid, c.namespace, c.pod, c.container, c.gpu, c.memory_mib),
            None if c.sm_percent is None else min(100, c.sm_percent),
        ]
        for c in sorted(usage.containers, key=lambda c: -c.memory_mib)
    ]
    other = [
        [o.gpu, o.owner, o.memory_mib, o.processes]
        for o in sorted(usage.unattributed, key=lambda o: -o.memory_mib)
    ]
    head = json.dumps({"v": USAGE_SCHEMA_VERSION, "at": usage.observed}, separators=(",", ":"))
    budget = MAX_USAGE_BYTES - len(head.encode()) - len(',"c":[],"o":[]')
    rows = MAX_USAGE_ROWS
    kept: dict[str, list[str]] = {"c": [], "o": []}
    for kind, entries in (("c", containers), ("o", other)):
        for row in entries:
            text = json.dumps(row, separators=(",", ":"))
            cost = len(text.encode()) + 1  # and its comma
            if rows == 0 or cost > budget:
                break
            budget -= cost
            rows -= 1
            kept[kind].append(text)
    return f'{head[:-1]},"c":[{",".join(kept["c"])}],"o":[{",".join(kept["o"])}]}}'


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT:
        raise UsageError(f"{where}: expected a string of 1 to {MAX_TEXT} characters")
    return value


def _count(value: Any, where: str, upper: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= upper:
        raise UsageError(f"{where}: expected an integer from 0 to {upper}")
    return value


def _row(value: Any, where: str, width: int) -> list[Any]:
    if not isinstance(value, list) or len(value) != width:
        raise UsageError(f"{where}: expected a list of {width} fields")
    return value


def decode_usage(text: str) -> NodeUsage:
    """Parse an annotation; raises UsageError saying what is wrong."""
    try:
        doc = loads(text, what="usage", max_bytes=MAX_USAGE_BYTES, max_depth=3)
    except JsonLimitError as exc:
        raise UsageError(str(exc)) from None
    if not isinstance(doc, dict):
        raise UsageError("usage: expected a JSON object")
    version = doc.get("v")
    if type(version) is not int or version != USAGE_SCHEMA_VERSION:  # not true, not 1.0
        raise UsageError(f"usage: schema version {version!r} (this reader knows 1)")
    observed = _text(doc.get("at"), "usage.at")
    rows, other = doc.get("c", []), doc.get("o", [])
    if not isinstance(rows, list) or not isinstance(other, list):
        raise UsageError("usage: c and o must be lists")
    if len(rows) + len(other) > MAX_USAGE_ROWS:
        raise UsageError(f"usage: {len(rows) + len(other)} rows (at most {MAX_USAGE_ROWS})")
    containers = []
    for i, raw in enumerate(rows):
        where = f"usage.c[{i}]"
        uid, ns, pod, container, gpu, memory, sm = _row(raw, where, 7)
        containers.append(
            ContainerUsage(
                _text(uid, f"{where}.podUID"),
                _text(ns, f"{where}.namespace"),
                _text(pod, f"{where}.pod"),
                _text(container, f"{where}.container"),
                _text(gpu, f"{where}.gpu"),
                _count(memory, f"{where}.memoryMiB", MAX_MIB),
                None if sm is None else _count(sm, f"{where}.smPercent", 100),
            )
        )
    unattributed = []
    for i, raw in enumerate(other):
        where = f"usage.o[{i}]"
        gpu, owner, memory, processes = _row(raw, where, 4)
        if owner not in OWNERS:
            raise UsageError(f"{where}.owner: expected one of {', '.join(OWNERS)}")
        unattributed.append(
            UnattributedUsage(
                _text(gpu, f"{where}.gpu"),
                owner,
                _count(memory, f"{where}.memoryMiB", MAX_MIB),
                _count(processes, f"{where}.processes", 1 << 20),
            )
        )
    return NodeUsage(observed, tuple(containers), tuple(unattributed))
