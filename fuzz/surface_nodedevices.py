"""NodeDevices specs as node agents write them: the built-in topologies mutated as bytes and
as structures (any field replaced by any JSON value, huge numbers, long lists and strings),
parsed as the scheduler does (bounded JSON, NodeInventory.from_dict) and, when accepted,
put into the cluster state and its int64 index.

A crash is any exception but JsonLimitError/InventoryError, or a parse slower than
SLOW_SECONDS.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any, Final

from fuzz.common import Tally, mutate, watched
from tessera.boundedjson import JsonLimitError, loads
from tessera.cluster_index import ClusterIndex
from tessera.cluster_state import ClusterState
from tessera.errors import InventoryError
from tessera.isolation import NodeIsolation
from tessera.model import NodeInventory
from tessera_edge.topology_file import BUILTIN_TOPOLOGIES, load_topology

SLOW_SECONDS: Final = 1.0
"""A spec is at most 1 MiB; parsing one well over a second means unbounded work."""
MAX_SPEC_BYTES: Final = 1 << 20
MAX_SPEC_DEPTH: Final = 16

HOSTILE: list[Any] = [
    2**63 + 1,
    -(2**63) - 1,
    10**19,
    -1,
    1.5,
    float("1e308"),
    True,
    None,
    "",
    "x" * 100_000,
    "9" * 5000,
    [],
    {},
    [{}] * 5000,
    ["ACTIVE"] * 10_000,
    {"GPU-x": 2**70},
]


def paths(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON document, the root included."""
    found = [path]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += paths(value, (*path, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found += paths(value, (*path, i))
    return found


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def _structural(rng: random.Random, spec: dict[str, Any]) -> bytes:
    doc: Any = json.loads(json.dumps(spec))
    for _ in range(rng.randrange(1, 4)):
        every = paths(doc)
        numbers = [p for p in every if isinstance(_at(doc, p), int)]
        # numbers are where the reported overflow came from: aim at them half the time
        path = rng.choice(numbers if numbers and rng.random() < 0.5 else every)
        value = copy.deepcopy(rng.choice(HOSTILE))
        if not path:
            doc = value
            continue
        target = doc
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value
    return json.dumps(doc).encode()


def run(n: int, seed: int) -> Tally:
    rng = random.Random(seed)
    tally = Tally("nodedevices")
    specs = [load_topology(name, "n1").to_dict() for name in BUILTIN_TOPOLOGIES]
    # the isolation layer as agents report it, up and down, for the mutations to reach
    specs[0]["isolation"] = NodeIsolation(
        "hami-core", True, "8f3a89c+tessera.1", "8f3a" * 10
    ).to_dict()
    specs[-1]["isolation"] = NodeIsolation("mps", False, reason="no daemon").to_dict()
    raw_specs = [json.dumps(s).encode() for s in specs]
    for _ in range(n):
        i = rng.randrange(len(specs))
        if rng.random() < 0.5:
            data = raw_specs[i]
            for _ in range(rng.randrange(1, 5)):
                data = mutate(data, rng, max_len=MAX_SPEC_BYTES)
        else:
            data = _structural(rng, specs[i])
        with watched(tally, data, SLOW_SECONDS):
            try:
                doc = loads(data, what="nodedevices/n1", max_bytes=MAX_SPEC_BYTES, max_depth=16)
                inventory = NodeInventory.from_dict(doc, source="nodedevices/n1", node_name="n1")
                state = ClusterState()
                state.set_node(inventory)
                ClusterIndex(state)
            except (JsonLimitError, InventoryError):
                pass
    return tally
