"""One copy of equal immutable values (hash-consing), within a bound.

Thousands of nodes of one make describe the same RDMA NICs (bus IDs, device names,
virtual functions) and the same NVLink wiring; parsed separately, each node would hold its
own equal copies. A `SharedValues` hands back the first copy it saw of each value, so the
scheduler keeps one per make. The table is bounded: a cluster has a handful of makes, and
when hostile or merely varied inventories fill it, it starts over (what was shared stays
shared; later values are kept once again from then on).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol, TypeVar

_V = TypeVar("_V", bound=Hashable)

DEFAULT_LIMIT = 4096
"""Distinct values kept: a make contributes a few dozen (its NICs and each GPU's links)."""


class Share(Protocol):
    """Maps a value to the one equal copy the caller keeps."""

    def __call__(self, value: _V, /) -> _V: ...


def as_is(value: _V) -> _V:
    """The `Share` that keeps every value as it is."""
    return value


class SharedValues:
    """A bounded table of values, each standing for every equal value (see module doc)."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self._values: dict[tuple[type, Hashable], Hashable] = {}

    def __call__(self, value: _V) -> _V:
        # keyed by type too: 1 == 1.0 == True, but they are not interchangeable
        key = (type(value), value)
        kept = self._values.get(key)
        if kept is None:
            if len(self._values) >= self.limit:
                self._values.clear()
            self._values[key] = kept = value
        return kept  # type: ignore[return-value]  # the key holds its type

    def __len__(self) -> int:
        return len(self._values)
