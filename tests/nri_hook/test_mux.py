"""The NRI multiplexer: framing rules, queue semantics, and ttrpc on top of it."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_hook.mux import (
    GO_READ_BUFFER,
    MAX_PAYLOAD,
    Mux,
    MuxConn,
    MuxDecoder,
    MuxError,
    MuxLimits,
    encode_frames,
    split_payload,
)
from protos.nri import api_pb2
from protos.ttrpc import ttrpc_pb2
from tessera_ttrpc import (
    HEADER_LEN,
    CallContext,
    Client,
    MessageType,
    Server,
    encode_frame,
    unary,
)


def test_split_rule_whole_up_to_4096_then_4096_and_the_rest() -> None:
    assert split_payload(b"a" * 4096) == [b"a" * 4096]
    data = bytes(range(256)) * 40  # 10240 bytes
    parts = split_payload(data)
    assert [len(p) for p in parts] == [4096, 10240 - 4096]
    assert b"".join(parts) == data


def test_split_rule_respects_the_payload_limit() -> None:
    data = bytes(GO_READ_BUFFER + 2 * MAX_PAYLOAD + 7)
    assert [len(p) for p in split_payload(data)] == [GO_READ_BUFFER, MAX_PAYLOAD, MAX_PAYLOAD, 7]


def test_frame_layout() -> None:
    assert encode_frames(2, b"hello") == struct.pack(">II", 2, 5) + b"hello"


def test_decoder_refuses_a_payload_over_the_limit() -> None:
    with pytest.raises(MuxError):
        MuxDecoder().feed(struct.pack(">II", 1, MAX_PAYLOAD + 1))


@given(
    st.lists(st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=9000)), max_size=6),
    st.lists(st.integers(1, 5000), max_size=12),
)
def test_any_writes_come_back_in_order_whatever_the_read_boundaries(
    writes: list[tuple[int, bytes]], cuts: list[int]
) -> None:
    wire = b"".join(encode_frames(c, d) for c, d in writes)
    decoder = MuxDecoder()
    got: dict[int, bytes] = {}
    pos = 0
    for cut in [*cuts, len(wire)]:
        for conn_id, payload in decoder.feed(wire[pos : pos + cut]):
            got[conn_id] = got.get(conn_id, b"") + payload
        pos += cut
    expected: dict[int, bytes] = {}
    for conn_id, data in writes:
        expected[conn_id] = expected.get(conn_id, b"") + data
    assert {c: d for c, d in got.items() if d} == {c: d for c, d in expected.items() if d}


@given(st.lists(st.binary(max_size=40), max_size=20))
def test_arbitrary_trunk_bytes_give_frames_or_a_mux_error(chunks: list[bytes]) -> None:
    decoder = MuxDecoder()
    try:
        for chunk in chunks:
            decoder.feed(chunk)
    except MuxError:
        pass


async def _pair(**kwargs: int) -> tuple[Mux, Mux]:
    a, b = socket.socketpair()
    ra, wa = await asyncio.open_unix_connection(sock=a)
    rb, wb = await asyncio.open_unix_connection(sock=b)
    return Mux(ra, wa, MuxLimits(**kwargs)), Mux(rb, wb)


Echo = Callable[[api_pb2.KeyValue, CallContext], Awaitable[api_pb2.KeyValue]]


@asynccontextmanager
async def _echo_service(echo: Echo) -> AsyncIterator[tuple[MuxConn, asyncio.Task[None]]]:
    """A ttrpc server answering t.S/Echo with `echo` on conn 1 of one side of a mux pair;
    yields conn 1 of the other side and the serving task. On leaving, both sides close and
    the server must finish."""
    left, right = await _pair()
    server = Server()
    server.register("t.S", {"Echo": unary(api_pb2.KeyValue, echo)})
    serving = asyncio.create_task(server.serve(left.open(1)))
    yield right.open(1), serving
    left.close()
    right.close()
    await asyncio.wait_for(serving, 2)


def test_connections_are_independent_and_unopened_ids_are_dropped() -> None:
    async def body() -> None:
        left, right = await _pair()
        one, two = left.open(1), left.open(2)
        right.open(1).write(b"for one")
        right.open(3).write(b"nobody listens on 3")
        right.open(2).write(b"for two")
        assert await asyncio.wait_for(two.read(), 2) == b"for two"
        assert await asyncio.wait_for(one.read(), 2) == b"for one"
        left.close()
        assert await asyncio.wait_for(one.read(), 2) == b""  # closed: end of stream
        await asyncio.wait_for(right.wait_closed(), 2)  # the peer sees the trunk close

    asyncio.run(body())


@pytest.mark.parametrize(
    ("bound", "sent", "readable"),
    [
        ({"queue_len": 4}, [b"x%d" % i for i in range(5)], [b"x0", b"x1", b"x2", b"x3"]),
        ({"max_queued_bytes": 1000}, [b"a" * 600, b"b" * 600], [b"a" * 600]),  # 1200 unread
    ],
    ids=["queued frames", "unread bytes"],
)
def test_unread_data_over_a_bound_closes_the_whole_trunk(
    bound: dict[str, int], sent: list[bytes], readable: list[bytes]
) -> None:
    async def body() -> None:
        left, right = await _pair(**bound)
        unread = left.open(1)
        other = left.open(2)
        sender = right.open(1)
        for data in sent:
            sender.write(data)
        await asyncio.wait_for(left.wait_closed(), 2)
        assert isinstance(left.error, MuxError)
        assert await other.read() == b""
        # what was queued within the bound is still readable, then end of stream
        assert [await unread.read() for _ in range(len(readable) + 1)] == [*readable, b""]
        right.close()

    asyncio.run(body())


def test_conn_id_zero_is_reserved() -> None:
    async def body() -> None:
        left, right = await _pair()
        with pytest.raises(ValueError):
            left.open(0)
        left.close()
        right.close()

    asyncio.run(body())


def test_ttrpc_over_the_mux_with_large_concurrent_messages() -> None:
    """Messages of every size class (one frame, 4096 + rest, rest above 4096) in both
    directions, many in flight: each arrives whole, none interleaved."""

    async def echo(req: api_pb2.KeyValue, ctx: CallContext) -> api_pb2.KeyValue:
        await asyncio.sleep(0)
        return api_pb2.KeyValue(key=req.key, value=req.value[::-1])

    async def body() -> None:
        async with _echo_service(echo) as (conn, _serving):
            client = Client(conn)
            sizes = [10, 4000, 4086, 4087, 5000, 9000, 70000, 300000]
            requests = [
                api_pb2.KeyValue(key=str(i), value=chr(65 + i % 26) * n + "#" * i)
                for i, n in enumerate(sizes * 3)
            ]
            replies = await asyncio.gather(
                *(client.call_message("t.S", "Echo", r, api_pb2.KeyValue) for r in requests)
            )
            assert [r.value for r in replies] == [r.value[::-1] for r in requests]
            client.close()

    asyncio.run(body())


def test_a_zero_length_frame_does_not_end_the_connection() -> None:
    """A 0-byte mux frame carries nothing; the ttrpc server behind it keeps answering."""

    async def echo(req: api_pb2.KeyValue, ctx: CallContext) -> api_pb2.KeyValue:
        return req

    async def body() -> None:
        async with _echo_service(echo) as (sender, serving):
            sender.write(b"")  # one frame header, length 0
            client = Client(sender)
            reply = await asyncio.wait_for(
                client.call_message("t.S", "Echo", api_pb2.KeyValue(key="k"), api_pb2.KeyValue), 5
            )
            assert reply.key == "k"
            assert not serving.done()
            client.close()

    asyncio.run(body())


def test_a_peer_that_stops_reading_gets_the_trunk_closed() -> None:
    async def body() -> None:
        a, b = socket.socketpair()
        ra, wa = await asyncio.open_unix_connection(sock=a)
        left = Mux(ra, wa, MuxLimits(max_write_buffer=256 << 10))
        _peer = await asyncio.open_unix_connection(sock=b)  # never reads
        conn = left.open(1)
        with pytest.raises(ConnectionResetError):
            for _ in range(1000):
                conn.write(b"x" * (64 << 10))
        assert left.closed and isinstance(left.error, MuxError)
        assert wa.transport.get_write_buffer_size() <= 256 << 10
        _peer[1].close()

    asyncio.run(body())


JUNK_FRAME = st.one_of(
    st.tuples(st.sampled_from([0, 3, 7, 2**32 - 1]), st.binary(max_size=300)),  # unopened
    st.tuples(st.sampled_from([1, 2]), st.just(b"")),  # zero-length frames
)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(JUNK_FRAME, max_size=12),
    st.lists(st.integers(1, 700), max_size=20),
    st.integers(0, 12),
)
def test_junk_frames_and_any_read_boundaries_leave_the_connections_working(
    junk: list[tuple[int, bytes]], cuts: list[int], at: int
) -> None:
    """Frames for unopened IDs and empty frames, interleaved with a real call cut into
    pieces, and all of it cut at arbitrary read boundaries: the call is answered."""

    async def body() -> None:
        a, b = socket.socketpair()
        ra, wa = await asyncio.open_unix_connection(sock=a)
        left = Mux(ra, wa)
        server = Server()

        async def echo(req: api_pb2.KeyValue, ctx: CallContext) -> api_pb2.KeyValue:
            return req

        server.register("t.S", {"Echo": unary(api_pb2.KeyValue, echo)})
        serving = asyncio.create_task(server.serve(left.open(1)))
        request = ttrpc_pb2.Request(
            service="t.S",
            method="Echo",
            payload=api_pb2.KeyValue(key="k", value="v" * 5000).SerializeToString(),
        ).SerializeToString()
        message = encode_frame(1, MessageType.REQUEST, 0, request)
        halves = [(1, message[:1000]), (1, message[1000:])]  # one message over two frames
        frames = [*junk[:at], halves[0], *junk[at:], halves[1], *junk]
        wire = b"".join(encode_frames(c, d) for c, d in frames)
        pieces, pos = [], 0
        for cut in [*cuts, len(wire)]:
            pieces.append(wire[pos : pos + cut])
            pos += cut
        rb, wb = await asyncio.open_unix_connection(sock=b)
        for piece in pieces:
            wb.write(piece)
            await wb.drain()
        decoder = MuxDecoder()
        got = b""
        while len(got) < HEADER_LEN or len(got) < HEADER_LEN + int.from_bytes(got[:4], "big"):
            chunk = await asyncio.wait_for(rb.read(65536), 5)
            assert chunk
            got += b"".join(p for c, p in decoder.feed(chunk) if c == 1)
        response = ttrpc_pb2.Response.FromString(got[HEADER_LEN:])
        assert api_pb2.KeyValue.FromString(response.payload).value == "v" * 5000
        wb.close()
        await asyncio.wait_for(left.wait_closed(), 5)
        await asyncio.wait_for(serving, 5)

    asyncio.run(body())
