"""SharedValues: one kept copy per equal value, bounded; inventories of one make share
their NICs and NVLink peer lists."""

from __future__ import annotations

import pytest

from tessera.model import NodeInventory
from tessera.sharing import SharedValues, as_is
from tessera_testbed.inventory import make_spec


def test_equal_values_come_back_as_the_first_copy() -> None:
    shared = SharedValues()
    first = tuple([(1, 18), (2, 18)])
    again = tuple([(1, 18), (2, 18)])
    assert first is not again
    assert shared(first) is first
    assert shared(again) is first
    assert shared((3, 18)) == (3, 18)
    assert len(shared) == 2


def test_equal_values_of_other_types_are_not_mixed() -> None:
    shared = SharedValues()
    assert shared(1) == 1
    assert type(shared(1.0)) is float
    assert shared(True) is True
    assert len(shared) == 3


def test_a_full_table_starts_over() -> None:
    shared = SharedValues(limit=2)
    a, b = ("a",), ("b",)
    shared(a), shared(b)
    c = ("c",)
    assert shared(c) is c  # the table was full: cleared, then c kept
    assert len(shared) == 1
    fresh_a = ("a",)
    assert shared(fresh_a) is fresh_a  # a was forgotten: its new copy is kept
    with pytest.raises(ValueError, match="at least 1"):
        SharedValues(limit=0)
    assert as_is(a) is a


def test_nodes_of_one_make_share_their_nics_and_nvlink_peers() -> None:
    shared = SharedValues()
    a = NodeInventory.from_dict(make_spec("a"), shared=shared)
    b = NodeInventory.from_dict(make_spec("b"), shared=shared)
    assert a.nics and all(nic.vfs for nic in a.nics), "the make has NICs with VFs"
    assert [g.uuid for g in a.gpus] != [g.uuid for g in b.gpus]
    assert all(x is y for x, y in zip(a.nics, b.nics, strict=True))
    assert all(x.nvlinks is y.nvlinks for x, y in zip(a.gpus, b.gpus, strict=True))
    assert all(g.nvlinks for g in a.gpus), "the make's GPUs are NVLinked"
    # the same inventories as parsed alone
    assert a == NodeInventory.from_dict(make_spec("a"))
    assert b == NodeInventory.from_dict(make_spec("b"))
