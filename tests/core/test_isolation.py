"""The node's isolation layer in the inventory (NodeDevices spec.isolation): what an agent
writes parses back to what it meant, and whatever a broken or hostile agent writes there is
the layer or an InventoryError naming the field, never another exception; the scheduler's
answer for a node follows from `up` alone."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.errors import InventoryError
from tessera.isolation import (
    LAYERS,
    MAX_LAYER_REASON_CHARS,
    MAX_VERSION_CHARS,
    NodeIsolation,
    parse_isolation,
    share_refusal,
)
from tessera.model import NodeInventory
from tessera_edge.topology_file import load_topology

printable = st.text(
    st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Co", "Cn", "Cf", "Zs"))
    | st.just(" "),
    max_size=20,
)
layers = st.builds(
    NodeIsolation,
    st.sampled_from(LAYERS),
    st.just(True),
    printable.map(lambda s: s[:MAX_VERSION_CHARS]),
    printable.map(lambda s: s[:MAX_VERSION_CHARS]),
) | st.builds(
    NodeIsolation,
    st.sampled_from(LAYERS),
    st.just(False),
    printable,
    printable,
    printable.map(lambda s: s[:MAX_LAYER_REASON_CHARS]),
)


@settings(max_examples=200, deadline=None)
@given(layers)
def test_every_layer_round_trips_through_the_spec(layer: NodeIsolation) -> None:
    spec = load_topology("t4-4x", "n1").to_dict()
    spec["isolation"] = json.loads(json.dumps(layer.to_dict()))
    parsed = NodeInventory.from_dict(spec, source="nodedevices/n1")
    assert parsed.isolation == layer
    assert NodeInventory.from_dict(parsed.to_dict(), source="again") == parsed
    assert (share_refusal(layer) is None) == layer.up


def test_an_absent_layer_is_unknown_and_takes_shares() -> None:
    spec = load_topology("t4-4x", "n1").to_dict()
    assert "isolation" not in spec  # older readers never see the key
    inventory = NodeInventory.from_dict(spec, source="x")
    assert inventory.isolation is None and share_refusal(inventory.isolation) is None
    spec["isolation"] = None
    assert NodeInventory.from_dict(spec, source="x").isolation is None


def test_a_down_layer_refuses_shares_naming_the_layer_and_why() -> None:
    down = NodeIsolation("mps", False, reason="the MPS control daemon is not running")
    assert down.refusal() == ("isolation layer mps is down: the MPS control daemon is not running")
    assert not down.takes_shares
    assert NodeIsolation("hami-core", False).refusal() == (
        "isolation layer hami-core is down: no reason given"
    )


@pytest.mark.parametrize(
    ("value", "field", "problem"),
    [
        ("hami-core", "isolation", "expected a mapping"),
        ([], "isolation", "expected a mapping"),
        ({}, "isolation.layer", "required field is missing"),
        ({"layer": "vgpu", "up": True}, "isolation.layer", "must be one of none, mps, hami-core"),
        ({"layer": "x" * 100_000, "up": True}, "isolation.layer", "more than the limit of 64"),
        ({"layer": 7, "up": True}, "isolation.layer", "expected a string"),
        ({"layer": "mps"}, "isolation.up", "required field is missing"),
        ({"layer": "mps", "up": "true"}, "isolation.up", "expected true or false"),
        ({"layer": "mps", "up": 1}, "isolation.up", "expected true or false"),
        ({"layer": "mps", "up": True, "version": "v" * 65}, "isolation.version", "limit of 64"),
        ({"layer": "mps", "up": True, "commit": ["a"]}, "isolation.commit", "expected a string"),
        ({"layer": "mps", "up": True, "version": "1\n2"}, "isolation.version", "cannot be printed"),
        ({"layer": "mps", "up": False, "reason": "r" * 257}, "isolation.reason", "limit of 256"),
        ({"layer": "mps", "up": False, "reason": "a\x1b[2Jb"}, "isolation.reason", "printed"),
        ({"layer": "mps", "up": True, "reason": "stale"}, "isolation.reason", "must be empty"),
    ],
)
def test_a_bad_value_is_an_inventory_error_naming_the_field(
    value: Any, field: str, problem: str
) -> None:
    spec = load_topology("t4-4x", "n1").to_dict()
    spec["isolation"] = value
    with pytest.raises(InventoryError) as exc:
        NodeInventory.from_dict(spec, source="nodedevices/n1")
    assert (exc.value.source, exc.value.field) == ("nodedevices/n1", field)
    assert problem in exc.value.problem, exc.value.problem


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=300),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=20,
)
fields = st.fixed_dictionaries(
    {},
    optional={
        "layer": st.sampled_from(LAYERS) | json_values,
        "up": st.booleans() | json_values,
        "version": json_values,
        "commit": json_values,
        "reason": json_values,
    },
)


@settings(max_examples=400, deadline=None)
@given(fields | json_values)
def test_anything_an_agent_writes_is_a_layer_or_an_inventory_error(value: Any) -> None:
    try:
        found = parse_isolation(value, "nodedevices/n1")
    except InventoryError as exc:
        assert exc.field.startswith("isolation")
        assert len(str(exc)) < 400  # a hostile value is never echoed whole
        return
    if found is None:
        assert value is None
        return
    assert found.layer in LAYERS and isinstance(found.up, bool)
    assert len(found.version) <= MAX_VERSION_CHARS and len(found.commit) <= MAX_VERSION_CHARS
    assert len(found.reason) <= MAX_LAYER_REASON_CHARS
    assert not (found.up and found.reason)
    assert all(s.isprintable() for s in (found.version, found.commit, found.reason))


def test_the_parser_shares_the_strings_it_keeps() -> None:
    kept: list[str] = []

    def share(text: str) -> str:
        kept.append(text)
        return text

    parse_isolation(
        {"layer": "hami-core", "up": True, "version": "v1", "commit": "c"}, "x", share=share
    )
    assert {"hami-core", "v1", "c"} <= set(kept)
