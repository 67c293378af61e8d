import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.boundedjson import MAX_INT_DIGITS, JsonLimitError, loads


@pytest.mark.parametrize(
    "raw",
    [
        "[" * 100_000,
        "{" * 5000,
        "9" * (MAX_INT_DIGITS + 1),
        "-" + "9" * (MAX_INT_DIGITS + 1),
        "1." + "0" * 100,
        "NaN",
        "[Infinity]",
        "-Infinity",
        b"\xff\xfe",
        '"\\ud800',
        "",
        "nul",
    ],
)
def test_bad_documents_raise_the_typed_error(raw: str | bytes) -> None:
    with pytest.raises(JsonLimitError):
        loads(raw, what="doc", max_bytes=1 << 20)


def test_size_is_checked_before_parsing() -> None:
    with pytest.raises(JsonLimitError, match="over the 10-byte limit"):
        loads("[" + "1," * 10 + "1]", what="doc", max_bytes=10)


def test_depth_limit() -> None:
    assert loads("[[1]]", what="d", max_bytes=100, max_depth=2) == [[1]]
    with pytest.raises(JsonLimitError, match="deeper than 2"):
        loads("[[[1]]]", what="d", max_bytes=100, max_depth=2)
    with pytest.raises(JsonLimitError, match="deeper than 2"):
        loads('{"a": {"b": {"c": 1}}}', what="d", max_bytes=100, max_depth=2)


def test_uint64_and_ordinary_floats_pass() -> None:
    assert loads("18446744073709551615", what="d", max_bytes=100) == 2**64 - 1
    assert loads("[1.5e300, -0.25]", what="d", max_bytes=100) == [1.5e300, -0.25]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_round_trip_of_ordinary_documents(value: object) -> None:
    assert loads(json.dumps(value), what="d", max_bytes=1 << 20) == value


@given(st.binary(max_size=200))
def test_arbitrary_bytes_parse_or_raise_the_typed_error(raw: bytes) -> None:
    with contextlib.suppress(JsonLimitError):
        loads(raw, what="d", max_bytes=1 << 20, max_depth=8)


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


@given(json_values, st.integers(0, 6), st.booleans())
def test_the_depth_limit_holds_for_any_document_however_it_is_written(
    value: object, limit: int, as_bytes: bool
) -> None:
    """The bracket count that lets shallow bodies skip the walk never lets a deep one by."""
    raw = json.dumps(value)
    deep = _depth(value) > limit
    try:
        loads(raw.encode() if as_bytes else raw, what="d", max_bytes=1 << 20, max_depth=limit)
    except JsonLimitError:
        assert deep
    else:
        assert not deep
