"""The usage annotation a node agent writes on its heartbeat Lease: what it encodes, that it
decodes back, and that whatever a Lease writer puts there decodes to a bounded report or
fails with UsageError, never another exception."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fuzz.common import mutate
from tessera.errors import InputError
from tessera.usage import (
    MAX_MIB,
    MAX_TEXT,
    MAX_USAGE_BYTES,
    MAX_USAGE_ROWS,
    OWNER_HOST,
    OWNER_MPS_SERVER,
    OWNER_OTHER_POD,
    OWNERS,
    USAGE_SCHEMA_VERSION,
    ContainerUsage,
    NodeUsage,
    UnattributedUsage,
    UsageError,
    decode_usage,
    encode_usage,
)

AT = "2026-11-26T19:00:00Z"
UID = "8f3c2a4e-1b2d-4c5e-9f0a-1b2c3d4e5f60"
GPU = "GPU-5a1c7b3e-0d2f-4e6a-8b9c-0a1b2c3d4e5f"
ROW = [UID, "default", "trainer-0", "main", GPU, 4096, 40]
OTHER = [GPU, OWNER_HOST, 300, 2]


def doc(**fields: Any) -> str:
    """A version-1 document with one container row and one other row, `fields` replacing
    its top-level fields (None-valued keys are dropped)."""
    base: dict[str, Any] = {"v": USAGE_SCHEMA_VERSION, "at": AT, "c": [ROW], "o": [OTHER]}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not None})


def with_row(index: int, value: Any) -> str:
    row = list(ROW)
    row[index] = value
    return doc(c=[row])


def with_other(index: int, value: Any) -> str:
    row = list(OTHER)
    row[index] = value
    return doc(o=[row])


def assert_bounded(usage: NodeUsage) -> None:
    """What every decoded report satisfies, whatever text it came from."""
    texts = [usage.observed]
    for c in usage.containers:
        texts += [c.pod_uid, c.namespace, c.pod, c.container, c.gpu]
        assert type(c.memory_mib) is int and 0 <= c.memory_mib <= MAX_MIB
        assert c.sm_percent is None or (type(c.sm_percent) is int and 0 <= c.sm_percent <= 100)
    for o in usage.unattributed:
        texts.append(o.gpu)
        assert o.owner in OWNERS
        assert type(o.memory_mib) is int and 0 <= o.memory_mib <= MAX_MIB
        assert type(o.processes) is int and 0 <= o.processes <= 1 << 20
    assert all(type(t) is str and 0 < len(t) <= MAX_TEXT for t in texts)
    assert len(usage.containers) + len(usage.unattributed) <= MAX_USAGE_ROWS


# -- the wire form -----------------------------------------------------------------------


def test_the_wire_form_is_compact_json_with_positional_rows() -> None:
    usage = NodeUsage(
        AT,
        (ContainerUsage(UID, "default", "trainer-0", "main", GPU, 4096, 40),),
        (UnattributedUsage(GPU, OWNER_MPS_SERVER, 25, 1),),
    )
    assert encode_usage(usage) == (
        '{"v":1,"at":"2026-11-26T19:00:00Z",'
        '"c":[["8f3c2a4e-1b2d-4c5e-9f0a-1b2c3d4e5f60","default","trainer-0","main",'
        '"GPU-5a1c7b3e-0d2f-4e6a-8b9c-0a1b2c3d4e5f",4096,40]],'
        '"o":[["GPU-5a1c7b3e-0d2f-4e6a-8b9c-0a1b2c3d4e5f","mps-server",25,1]]}'
    )


def test_an_empty_report_keeps_both_lists() -> None:
    assert encode_usage(NodeUsage(AT)) == '{"v":1,"at":"2026-11-26T19:00:00Z","c":[],"o":[]}'


def test_an_unsampled_sm_share_is_null_and_one_over_100_is_capped() -> None:
    usage = NodeUsage(
        AT,
        (
            ContainerUsage("u1", "n", "p", "a", "g", 2, None),
            ContainerUsage("u2", "n", "p", "b", "g", 1, 250),
        ),
    )
    assert encode_usage(usage) == (
        '{"v":1,"at":"2026-11-26T19:00:00Z",'
        '"c":[["u1","n","p","a","g",2,null],["u2","n","p","b","g",1,100]],"o":[]}'
    )


def test_rows_are_written_largest_memory_first() -> None:
    usage = NodeUsage(
        AT,
        tuple(ContainerUsage(f"u{m}", "n", "p", "c", "g", m, 0) for m in (5, 50, 0, 7)),
        tuple(UnattributedUsage("g", OWNER_HOST, m, 1) for m in (1, 9, 3)),
    )
    wire = json.loads(encode_usage(usage))
    assert [row[5] for row in wire["c"]] == [50, 7, 5, 0]
    assert [row[2] for row in wire["o"]] == [9, 3, 1]


def test_the_compact_example_decodes_field_by_field() -> None:
    text = (
        '{"v":1,"at":"2026-11-26T19:00:00Z","c":[["u","ns","p","c","GPU-1",0,null],'
        '["u","ns","p","d","GPU-1",1073741824,100]],"o":[["GPU-1","other-pod",7,3]]}'
    )
    assert decode_usage(text) == NodeUsage(
        AT,
        (
            ContainerUsage("u", "ns", "p", "c", "GPU-1", 0, None),
            ContainerUsage("u", "ns", "p", "d", "GPU-1", MAX_MIB, 100),
        ),
        (UnattributedUsage("GPU-1", OWNER_OTHER_POD, 7, 3),),
    )


def test_missing_row_lists_are_an_empty_report() -> None:
    assert decode_usage('{"v":1,"at":"t"}') == NodeUsage("t")


def test_unknown_top_level_keys_are_ignored() -> None:
    assert decode_usage(doc(extra={"a": 1}, later=[1, 2])) == decode_usage(doc())


def test_of_pod_picks_that_pods_rows() -> None:
    rows = (
        ContainerUsage("a", "n", "p", "c", "g0", 1, None),
        ContainerUsage("b", "n", "q", "c", "g0", 2, None),
        ContainerUsage("a", "n", "p", "d", "g1", 3, 5),
    )
    usage = NodeUsage(AT, rows)
    assert usage.of_pod("a") == (rows[0], rows[2])
    assert usage.of_pod("c") == ()


def test_the_error_is_an_input_error() -> None:
    with pytest.raises(InputError):
        decode_usage("{}")


# -- the row limit -----------------------------------------------------------------------


def small_rows(count: int, memory: int = 0) -> tuple[ContainerUsage, ...]:
    return tuple(
        ContainerUsage(f"u{i}", "n", "p", "c", "g", memory + i, None) for i in range(count)
    )


def test_container_rows_beyond_the_limit_are_dropped_smallest_first() -> None:
    usage = NodeUsage(
        AT,
        small_rows(MAX_USAGE_ROWS + 40),
        (UnattributedUsage("g", OWNER_HOST, 10**6, 1),),
    )
    back = decode_usage(encode_usage(usage))
    assert len(back.containers) == MAX_USAGE_ROWS
    assert back.unattributed == ()  # the containers' rows come first
    assert {c.memory_mib for c in back.containers} == set(range(40, MAX_USAGE_ROWS + 40))


def test_other_rows_fill_what_the_containers_leave() -> None:
    others = tuple(UnattributedUsage(f"g{i}", OWNER_HOST, i, 1) for i in range(30))
    usage = NodeUsage(AT, small_rows(MAX_USAGE_ROWS - 12), others)
    back = decode_usage(encode_usage(usage))
    assert len(back.containers) == MAX_USAGE_ROWS - 12
    assert [o.memory_mib for o in back.unattributed] == list(range(29, 17, -1))


def test_exactly_the_limit_is_written_whole() -> None:
    usage = NodeUsage(
        AT,
        small_rows(MAX_USAGE_ROWS - 1),
        (UnattributedUsage("g", OWNER_HOST, 0, 1),),
    )
    back = decode_usage(encode_usage(usage))
    assert len(back.containers) + len(back.unattributed) == MAX_USAGE_ROWS
    assert len(back.unattributed) == 1


def test_a_full_report_with_ordinary_names_still_decodes() -> None:
    rows = tuple(
        ContainerUsage(
            str(uuid.UUID(int=i + 1)),
            "ml-training",
            f"trainer-7d9f8b6c5-{i:05d}",
            "worker",
            f"GPU-{uuid.UUID(int=i % 8)}",
            40960,
            55,
        )
        for i in range(MAX_USAGE_ROWS)
    )
    text = encode_usage(NodeUsage(AT, rows))
    back = decode_usage(text)  # raises UsageError: the text is over MAX_USAGE_BYTES
    assert 0 < len(back.containers) <= MAX_USAGE_ROWS  # all, or as many as fit
    assert set(back.containers) <= set(rows)


# -- round trips -------------------------------------------------------------------------

texts = st.text(min_size=1, max_size=MAX_TEXT)
short_texts = st.text(min_size=1, max_size=40)
mib = st.integers(0, MAX_MIB)
container_rows = st.builds(
    ContainerUsage,
    short_texts,
    short_texts,
    short_texts,
    short_texts,
    short_texts,
    mib,
    st.none() | st.integers(0, 400),
)
other_rows = st.builds(
    UnattributedUsage, short_texts, st.sampled_from(OWNERS), mib, st.integers(0, 1 << 20)
)
reports = st.builds(
    NodeUsage,
    texts,
    st.lists(container_rows, max_size=12).map(tuple),
    st.lists(other_rows, max_size=12).map(tuple),
)


def capped(c: ContainerUsage) -> ContainerUsage:
    sm = None if c.sm_percent is None else min(100, c.sm_percent)
    return ContainerUsage(c.pod_uid, c.namespace, c.pod, c.container, c.gpu, c.memory_mib, sm)


@settings(max_examples=300, deadline=None)
@given(reports)
def test_every_report_within_bounds_round_trips(usage: NodeUsage) -> None:
    text = encode_usage(usage)
    assume(len(text.encode()) <= MAX_USAGE_BYTES)
    back = decode_usage(text)
    assert back.observed == usage.observed
    assert Counter(back.containers) == Counter(map(capped, usage.containers))
    assert Counter(back.unattributed) == Counter(usage.unattributed)
    for rows in (back.containers, back.unattributed):
        memory = [r.memory_mib for r in rows]
        assert memory == sorted(memory, reverse=True)
    assert encode_usage(back) == text


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text(min_size=MAX_TEXT - 3, max_size=MAX_TEXT), min_size=5, max_size=5),
    mib,
    st.none() | st.integers(0, 100),
)
def test_the_longest_strings_round_trip(fields: list[str], memory: int, sm: int | None) -> None:
    uid, namespace, pod, container, gpu = fields
    row = ContainerUsage(uid, namespace, pod, container, gpu, memory, sm)
    usage = NodeUsage(uid, (row,), (UnattributedUsage(gpu, OWNER_HOST, memory, 1),))
    assert decode_usage(encode_usage(usage)) == usage


@settings(max_examples=100, deadline=None)
@given(
    st.integers(MAX_USAGE_ROWS - 20, MAX_USAGE_ROWS + 20),
    st.integers(0, 2**32),
    st.lists(st.tuples(st.sampled_from(OWNERS), st.integers(0, 40)), max_size=30),
)
def test_the_kept_rows_are_the_largest(
    count: int, seed: int, other_memory: list[tuple[str, int]]
) -> None:
    rng = random.Random(seed)
    containers = [
        ContainerUsage(f"u{i}", "n", "p", "c", "g", rng.randint(0, 40), rng.randint(0, 200))
        for i in range(count)
    ]
    others = [UnattributedUsage("g", owner, m, 1) for owner, m in other_memory]
    back = decode_usage(encode_usage(NodeUsage(AT, tuple(containers), tuple(others))))
    kept_c = min(len(containers), MAX_USAGE_ROWS)
    kept_o = min(len(others), MAX_USAGE_ROWS - kept_c)
    assert len(back.containers) == kept_c
    assert len(back.unattributed) == kept_o
    dropped_c = Counter(map(capped, containers)) - Counter(back.containers)
    dropped_o = Counter(others) - Counter(back.unattributed)
    assert sum(dropped_c.values()) == len(containers) - kept_c
    if dropped_c:
        assert max(c.memory_mib for c in dropped_c) <= min(c.memory_mib for c in back.containers)
    if dropped_o and back.unattributed:
        assert max(o.memory_mib for o in dropped_o) <= min(o.memory_mib for o in back.unattributed)


# -- what a Lease writer can put there ---------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        doc(v=2),
        doc(v=0),
        doc(v="1"),
        doc(v=[1]),
        doc(v={"v": 1}),
        json.dumps({"at": AT, "c": [], "o": []}),
        '{"v":null,"at":"t"}',
    ],
)
def test_another_schema_version_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="schema version"):
        decode_usage(text)


@pytest.mark.parametrize("version", ["true", "1.0", "1e0"])
def test_a_version_that_only_compares_equal_to_1_is_refused(version: str) -> None:
    with pytest.raises(UsageError):
        decode_usage('{"v":' + version + ',"at":"t"}')


@pytest.mark.parametrize("text", ["[]", "[1]", '"usage"', "1", "null", "true", "1.5"])
def test_a_document_that_is_not_an_object_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="JSON object"):
        decode_usage(text)


@pytest.mark.parametrize(
    "text",
    ["", " ", "{", '{"v":1,', "{'v': 1}", "v=1", '{"v":1}}', "\ufeff" + doc(), "\x00"],
)
def test_text_that_is_not_json_is_refused(text: str) -> None:
    with pytest.raises(UsageError):
        decode_usage(text)


def test_a_document_at_the_size_limit_decodes_and_one_byte_more_does_not() -> None:
    body = doc()
    exact = body + " " * (MAX_USAGE_BYTES - len(body))
    assert len(exact.encode()) == MAX_USAGE_BYTES
    assert decode_usage(exact) == decode_usage(body)
    with pytest.raises(UsageError, match="over the"):
        decode_usage(exact + " ")


def test_the_size_limit_counts_utf8_bytes_not_characters() -> None:
    padding = "é" * (MAX_USAGE_BYTES // 2)
    text = doc(pad=padding).replace("\\u00e9", "é")
    assert len(text) < MAX_USAGE_BYTES < len(text.encode())
    with pytest.raises(UsageError, match="over the"):
        decode_usage(text)


def test_a_huge_document_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(UsageError, match="over the"):
        decode_usage("[" * (10 * MAX_USAGE_BYTES))


def rows_doc(containers: int, others: int) -> str:
    c = [["u", "n", "p", f"c{i}", "g", 0, None] for i in range(containers)]
    o = [["g", OWNER_HOST, 0, 1] for _ in range(others)]
    return json.dumps({"v": 1, "at": "t", "c": c, "o": o}, separators=(",", ":"))


@pytest.mark.parametrize(
    ("containers", "others"),
    [(MAX_USAGE_ROWS + 1, 0), (0, MAX_USAGE_ROWS + 1), (300, MAX_USAGE_ROWS - 299)],
)
def test_too_many_rows_are_refused(containers: int, others: int) -> None:
    with pytest.raises(UsageError, match="rows"):
        decode_usage(rows_doc(containers, others))


def test_exactly_the_row_limit_is_accepted() -> None:
    usage = decode_usage(rows_doc(300, MAX_USAGE_ROWS - 300))
    assert (len(usage.containers), len(usage.unattributed)) == (300, MAX_USAGE_ROWS - 300)


@pytest.mark.parametrize(
    "text",
    [
        "[" * 30_000 + "]" * 30_000,
        '{"v":1,"at":"t","c":[[[[1]]]]}',
        '{"v":1,"at":"t","x":[[[]]]}',
        '{"v":1,"at":"t","x":{"y":{"z":{}}}}',
        with_row(5, [1]),
        with_row(6, {"sm": 1}),
        with_other(3, []),
        doc(at=["t"]),
    ],
)
def test_nesting_deeper_than_the_schema_is_refused(text: str) -> None:
    with pytest.raises(UsageError):
        decode_usage(text)


@pytest.mark.parametrize(
    "text",
    [
        with_row(5, MAX_MIB + 1),
        with_row(5, 2**63),
        with_row(5, -1),
        with_row(6, 101),
        with_row(6, -1),
        with_other(2, MAX_MIB + 1),
        with_other(2, -5),
        with_other(3, (1 << 20) + 1),
        with_other(3, -1),
        doc().replace("4096", "9" * 21),
        doc().replace("4096", "9" * 5000),
        doc().replace("4096", "-" + "9" * 21),
        doc().replace("300", "1" + "0" * 400),
    ],
)
def test_numbers_out_of_range_are_refused(text: str) -> None:
    with pytest.raises(UsageError):
        decode_usage(text)


def test_the_largest_numbers_in_range_are_accepted() -> None:
    row = [*ROW[:5], MAX_MIB, 100]
    other = [GPU, OWNER_HOST, MAX_MIB, 1 << 20]
    usage = decode_usage(doc(c=[row], o=[other]))
    assert usage.containers[0].memory_mib == MAX_MIB
    assert usage.containers[0].sm_percent == 100
    assert usage.unattributed[0] == UnattributedUsage(GPU, OWNER_HOST, MAX_MIB, 1 << 20)


@pytest.mark.parametrize(
    "text",
    [
        with_row(5, True),
        with_row(5, False),
        with_row(6, True),
        with_row(6, False),
        with_other(2, True),
        with_other(3, False),
        with_row(5, 1.0),
        with_row(5, 1e3),
        with_row(6, 50.5),
        with_other(3, 2.0),
        with_row(5, "4096"),
        with_row(6, "40"),
        with_other(2, None),
        with_row(5, None),
    ],
)
def test_numbers_of_the_wrong_type_are_refused(text: str) -> None:
    with pytest.raises(UsageError):
        decode_usage(text)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
@pytest.mark.parametrize("field", [5, 6])
def test_nan_and_infinities_are_refused(constant: str, field: int) -> None:
    text = with_row(field, "HOLE").replace('"HOLE"', constant)
    with pytest.raises(UsageError):
        decode_usage(text)


@pytest.mark.parametrize("width", [0, 1, 6, 8, 20])
def test_a_container_row_of_another_width_is_refused(width: int) -> None:
    row = (ROW * 3)[:width]
    with pytest.raises(UsageError, match=r"c\[0\]: expected a list of 7"):
        decode_usage(doc(c=[row]))


@pytest.mark.parametrize("width", [0, 3, 5, 7])
def test_an_other_row_of_another_width_is_refused(width: int) -> None:
    row = (OTHER * 2)[:width]
    with pytest.raises(UsageError, match=r"o\[0\]: expected a list of 4"):
        decode_usage(doc(o=[row]))


@pytest.mark.parametrize(
    "text",
    [
        doc(c=[{"pod": "p"}]),
        doc(c=["row"]),
        doc(c=[7]),
        doc(o=[{"gpu": GPU}]),
        doc(o=[None]),
        '{"v":1,"at":"t","c":{}}',
        '{"v":1,"at":"t","o":"host"}',
        '{"v":1,"at":"t","c":null}',
        '{"v":1,"at":"t","o":1}',
    ],
)
def test_rows_that_are_not_lists_are_refused(text: str) -> None:
    with pytest.raises(UsageError):
        decode_usage(text)


@pytest.mark.parametrize("owner", ["container", "HOST", "Host ", "", None, 1, True])
def test_an_unknown_owner_is_refused(owner: Any) -> None:
    with pytest.raises(UsageError, match="owner"):
        decode_usage(with_other(1, owner))


@pytest.mark.parametrize("owner", OWNERS)
def test_every_known_owner_is_accepted(owner: str) -> None:
    assert decode_usage(with_other(1, owner)).unattributed[0].owner == owner


@pytest.mark.parametrize("field", range(5))
@pytest.mark.parametrize("value", ["", "x" * (MAX_TEXT + 1), "é" * (MAX_TEXT + 1), None, 7])
def test_a_container_rows_strings_must_be_1_to_253_characters(field: int, value: Any) -> None:
    with pytest.raises(UsageError, match="string of 1 to 253"):
        decode_usage(with_row(field, value))


@pytest.mark.parametrize("value", ["", "g" * (MAX_TEXT + 1), None, False])
def test_an_other_rows_gpu_must_be_1_to_253_characters(value: Any) -> None:
    with pytest.raises(UsageError, match="string of 1 to 253"):
        decode_usage(with_other(0, value))


@pytest.mark.parametrize("value", ["", "t" * (MAX_TEXT + 1), None, 1700000000])
def test_the_reading_time_must_be_1_to_253_characters(value: Any) -> None:
    with pytest.raises(UsageError, match=r"usage\.at"):
        decode_usage(doc(at=value) if value is not None else '{"v":1}')


def test_strings_of_exactly_253_characters_are_accepted() -> None:
    longest = "x" * MAX_TEXT
    usage = decode_usage(doc(at=longest, c=[[longest] * 5 + [0, None]]))
    assert usage.observed == longest
    assert usage.containers[0].pod == longest


def test_the_error_names_the_bad_row_and_field() -> None:
    rows = [ROW, [*ROW[:5], -3, None]]
    with pytest.raises(UsageError, match=r"usage\.c\[1\]\.memoryMiB"):
        decode_usage(doc(c=rows))
    with pytest.raises(UsageError, match=r"usage\.o\[0\]\.processes"):
        decode_usage(with_other(3, -1))


@pytest.mark.parametrize(
    "text",
    [
        '{"v":1,"at":"\x01"}',  # a raw control character inside a string
        '{"v":1,"at":"t\\x"}',  # an invalid escape
        '{"v":1,"at":"t\\u12"}',  # a short \u escape
        '{"v":1,"at":"t"}'.replace(":", "\ufffd", 1),  # an invalid byte, decoded as U+FFFD
    ],
)
def test_strings_that_are_not_json_strings_are_refused(text: str) -> None:
    with pytest.raises(UsageError):
        decode_usage(text)


def test_escaped_unicode_decodes_to_its_characters() -> None:
    usage = decode_usage('{"v":1,"at":"\\u00e9\\ud83d\\ude00"}')
    assert usage.observed == "é\U0001f600"


@pytest.mark.parametrize("text", ["\ud800", '{"v":1,"at":"\udcff"}', doc() + "\udfff"])
def test_a_lone_surrogate_in_the_text_decodes_or_is_a_usage_error(text: str) -> None:
    """A str need not be encodable (json.loads makes one from "\\ud800"); the reader must
    still answer with a report or UsageError."""
    decodes_or_refuses(text)


# -- properties: only UsageError, and only bounded reports -------------------------------


def decodes_or_refuses(text: str) -> None:
    try:
        usage = decode_usage(text)
    except UsageError:
        return
    assert isinstance(usage, NodeUsage)
    assert_bounded(usage)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_decodes_or_raises_usage_error(text: str) -> None:
    decodes_or_refuses(text)


json_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=300)
    | st.sampled_from(OWNERS)
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=30,
)


@settings(max_examples=500, deadline=None)
@given(json_values)
def test_arbitrary_json_decodes_or_raises_usage_error(value: Any) -> None:
    decodes_or_refuses(json.dumps(value))


row_fields = st.one_of(json_leaves, st.lists(json_leaves, max_size=2))


@settings(max_examples=500, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["v", "at", "c", "o", "x"]), json_values, max_size=5),
    st.lists(st.lists(row_fields, min_size=6, max_size=8), max_size=4),
    st.lists(st.lists(row_fields, min_size=3, max_size=5), max_size=4),
)
def test_documents_shaped_like_a_report_decode_or_raise_usage_error(
    top: dict[str, Any], containers: list[list[Any]], others: list[list[Any]]
) -> None:
    document = {"v": 1, "at": AT, "c": containers, "o": others} | top
    decodes_or_refuses(json.dumps(document))


@settings(max_examples=300, deadline=None)
@given(reports, st.integers(0, 2**32), st.integers(1, 4))
def test_a_mutated_report_decodes_or_raises_usage_error(
    usage: NodeUsage, seed: int, edits: int
) -> None:
    rng = random.Random(seed)
    data = encode_usage(usage).encode()
    for _ in range(edits):
        data = mutate(data, rng)
    decodes_or_refuses(data.decode("utf-8", "replace"))
