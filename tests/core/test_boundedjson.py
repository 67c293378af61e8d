import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera import boundedjson
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
    _assert_refused_exactly_when_deep(value, json.dumps(value), limit, as_bytes)


def _assert_refused_exactly_when_deep(value: object, raw: str, limit: int, as_bytes: bool) -> None:
    deep = _depth(value) > limit
    try:
        loads(raw.encode() if as_bytes else raw, what="d", max_bytes=1 << 20, max_depth=limit)
    except JsonLimitError:
        assert deep
    else:
        assert not deep


bracket_values = st.recursive(
    st.none() | st.integers(0, 9) | st.text(alphabet='{}[]"\\a', max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(alphabet="{}[]a", max_size=4), inner, max_size=4)
    ),
    max_leaves=24,
)


@given(bracket_values, st.integers(0, 8), st.booleans(), st.booleans())
def test_brackets_and_empty_pairs_inside_strings_never_hide_depth(
    value: object, limit: int, compact: bool, as_bytes: bool
) -> None:
    """Strings full of brackets and `{}`/`[]` pairs, keys too, written with and without
    spaces: the bracket bound that spares the walk never lets a deep document by."""
    raw = json.dumps(value, separators=(",", ":") if compact else None)
    _assert_refused_exactly_when_deep(value, raw, limit, as_bytes)


def test_a_pod_whose_brackets_are_mostly_empty_pairs_is_not_walked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Pod's managedFields hold dozens of `{}`: more opening brackets than the limit,
    yet the bound shows it shallow without walking the parsed document."""
    fields: dict[str, dict[str, str]] = {f"f:field{k}": {} for k in range(80)}
    pod = {"metadata": {"managedFields": [{"fieldsV1": {"f:spec": fields}}]}, "spec": {}}
    raw = json.dumps({"Pod": pod, "NodeNames": ["n1", "n2"]}, separators=(",", ":"))
    assert raw.count("{") > 64

    def walked(*args: object) -> None:
        raise AssertionError("walked")

    monkeypatch.setattr(boundedjson, "check_depth", walked)
    assert loads(raw, what="d", max_bytes=1 << 20, max_depth=64)["NodeNames"] == ["n1", "n2"]
    deep = "[" * 70 + "]" * 70  # no empty pair but the innermost: the walk runs
    with pytest.raises(AssertionError, match="walked"):
        loads(deep, what="d", max_bytes=1 << 20, max_depth=64)
