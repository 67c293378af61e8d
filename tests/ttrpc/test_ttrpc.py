"""The generic ttrpc library: framing, server and client behaviour over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protos.nri import api_pb2
from protos.ttrpc import ttrpc_pb2
from tessera_ttrpc import (
    HEADER_LEN,
    MAX_DATA_LEN,
    AsyncioStream,
    CallContext,
    Client,
    Code,
    ConnectionClosedError,
    Frame,
    FrameDecoder,
    FrameTooLargeError,
    Limits,
    MessageType,
    OversizedFrame,
    RpcError,
    Server,
    encode_frame,
    unary,
)
from tessera_ttrpc.budget import within_budget

SERVICE = "test.Echo"

# --- framing -----------------------------------------------------------------------------------


def test_header_layout_is_big_endian_length_stream_type_flags() -> None:
    frame = encode_frame(0x01020304, MessageType.RESPONSE, 0x05, b"xyz")
    assert frame == bytes.fromhex("00000003010203040205") + b"xyz"


def test_encode_refuses_more_than_4_mib() -> None:
    encode_frame(1, MessageType.REQUEST, 0, bytes(MAX_DATA_LEN))
    with pytest.raises(FrameTooLargeError):
        encode_frame(1, MessageType.REQUEST, 0, bytes(MAX_DATA_LEN + 1))


def test_decoder_skips_an_oversized_frame_and_keeps_going() -> None:
    big = MAX_DATA_LEN + 5
    header = struct.pack(">IIBB", big, 7, MessageType.REQUEST, 0)
    after = encode_frame(9, MessageType.REQUEST, 0, b"ok")
    decoder = FrameDecoder()
    out = decoder.feed(header + bytes(1000))
    assert out == [OversizedFrame(7, MessageType.REQUEST, 0, big)]
    assert decoder.buffered == 0  # nothing of the oversized frame is kept
    out = decoder.feed(bytes(big - 1000) + after)
    assert out == [Frame(9, MessageType.REQUEST, 0, b"ok")]


frames_strategy = st.lists(
    st.builds(
        Frame,
        stream_id=st.integers(0, 2**32 - 1),
        type=st.integers(0, 255),
        flags=st.integers(0, 255),
        data=st.binary(max_size=300),
    ),
    max_size=8,
)


@given(frames_strategy, st.lists(st.integers(1, 400), max_size=20))
def test_frames_survive_any_chunking(frames: list[Frame], cuts: list[int]) -> None:
    wire = b"".join(encode_frame(f.stream_id, f.type, f.flags, f.data) for f in frames)
    decoder = FrameDecoder()
    got: list[Frame | OversizedFrame] = []
    pos = 0
    for cut in cuts:
        got += decoder.feed(wire[pos : pos + cut])
        pos += cut
    got += decoder.feed(wire[pos:])
    assert got == frames
    assert decoder.buffered == 0


@given(st.lists(st.binary(max_size=64), max_size=30))
def test_arbitrary_bytes_never_crash_the_frame_reader(chunks: list[bytes]) -> None:
    decoder = FrameDecoder()
    for chunk in chunks:
        for item in decoder.feed(chunk):
            assert isinstance(item, Frame | OversizedFrame)
        assert decoder.buffered <= HEADER_LEN + MAX_DATA_LEN


# --- server and client over a socket ------------------------------------------------------------


async def _socket_streams() -> tuple[AsyncioStream, AsyncioStream]:
    a, b = socket.socketpair()
    ra, wa = await asyncio.open_unix_connection(sock=a)
    rb, wb = await asyncio.open_unix_connection(sock=b)
    return AsyncioStream(ra, wa), AsyncioStream(rb, wb)


def _echo_server(delays: dict[str, float] | None = None) -> Server:
    delays = delays or {}

    async def echo(req: api_pb2.KeyValue, ctx: CallContext) -> api_pb2.KeyValue:
        await asyncio.sleep(delays.get(req.key, 0))
        if req.key == "fail":
            raise RpcError(Code.FAILED_PRECONDITION, "asked to fail")
        if req.key == "crash":
            raise ValueError("boom")
        meta = ",".join(f"{k}={v}" for k, v in ctx.metadata)
        return api_pb2.KeyValue(key=req.key, value=f"{req.value}|{meta}|{ctx.stream_id}")

    server = Server()
    server.register(SERVICE, {"Echo": unary(api_pb2.KeyValue, echo)})
    return server


@asynccontextmanager
async def _running(server: Server) -> AsyncIterator[Client]:
    server_side, client_side = await _socket_streams()
    task = asyncio.create_task(server.serve(server_side))
    client = Client(client_side)
    try:
        yield client
    finally:
        client.close()
        server_side.close()
        await asyncio.wait_for(task, 5)


def _run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 20))


def test_concurrent_calls_are_routed_by_stream_id_even_out_of_order() -> None:
    async def body() -> None:
        async with _running(_echo_server({"slow": 0.05})) as client:

            async def call(key: str) -> api_pb2.KeyValue:
                return await client.call_message(
                    SERVICE,
                    "Echo",
                    api_pb2.KeyValue(key=key, value=key.upper()),
                    api_pb2.KeyValue,
                    metadata=[("ns", key)],
                )

            slow = asyncio.create_task(call("slow"))
            await asyncio.sleep(0.01)
            fast = await asyncio.gather(*(call(f"k{i}") for i in range(5)))
            assert not slow.done()  # the fast ones overtook it
            slow_result = await slow
        assert slow_result.value == "SLOW|ns=slow|1"
        assert [r.value for r in fast] == [f"K{i}|ns=k{i}|{3 + 2 * i}" for i in range(5)]

    _run(body)


def test_status_errors_reach_the_caller() -> None:
    async def body() -> None:
        async with _running(_echo_server()) as client:
            with pytest.raises(RpcError) as failed:
                await client.call(SERVICE, "Echo", api_pb2.KeyValue(key="fail").SerializeToString())
            assert failed.value.code == Code.FAILED_PRECONDITION
            assert failed.value.message == "asked to fail"
            with pytest.raises(RpcError) as crashed:
                await client.call(
                    SERVICE, "Echo", api_pb2.KeyValue(key="crash").SerializeToString()
                )
            assert crashed.value.code == Code.UNKNOWN and "boom" in crashed.value.message
            with pytest.raises(RpcError) as method:
                await client.call(SERVICE, "Nope", b"")
            assert (method.value.code, method.value.message) == (Code.UNIMPLEMENTED, "method Nope")
            with pytest.raises(RpcError) as service:
                await client.call("no.Such", "Echo", b"")
            assert (service.value.code, service.value.message) == (
                Code.UNIMPLEMENTED,
                "service no.Such",
            )
            with pytest.raises(RpcError) as payload:
                await client.call(SERVICE, "Echo", b"\xff\xff\xff")
            assert payload.value.code == Code.INVALID_ARGUMENT
            # the connection is still fine after all of that
            ok = await client.call(SERVICE, "Echo", api_pb2.KeyValue(key="a").SerializeToString())
            assert api_pb2.KeyValue.FromString(ok).key == "a"

    _run(body)


def test_server_bounds_a_handler_by_the_request_timeout() -> None:
    async def body() -> None:
        payload = api_pb2.KeyValue(key="slow").SerializeToString()
        request = ttrpc_pb2.Request(
            service=SERVICE, method="Echo", payload=payload, timeout_nano=50_000_000
        )
        server_side, peer = await _socket_streams()
        task = asyncio.create_task(_echo_server({"slow": 5.0}).serve(server_side))
        peer.write(encode_frame(1, MessageType.REQUEST, 0, request.SerializeToString()))
        decoder = FrameDecoder()
        frames: list[Frame | OversizedFrame] = []
        while not frames:
            frames = decoder.feed(await peer.read())
        assert isinstance(frames[0], Frame)
        assert ttrpc_pb2.Response.FromString(frames[0].data).status.code == Code.DEADLINE_EXCEEDED
        peer.close()
        await asyncio.wait_for(task, 5)

    _run(body)


def test_client_gives_up_after_its_timeout() -> None:
    async def body() -> None:
        silent_peer, client_side = await _socket_streams()  # reads nothing, answers nothing
        client = Client(client_side)
        with pytest.raises(RpcError) as late:
            await client.call(SERVICE, "Echo", b"", timeout=0.05)
        assert late.value.code == Code.DEADLINE_EXCEEDED
        client.close()
        silent_peer.close()

    _run(body)


def test_pending_calls_fail_when_the_connection_ends() -> None:
    async def body() -> None:
        server_side, client_side = await _socket_streams()
        client = Client(client_side)
        call = asyncio.create_task(client.call(SERVICE, "Echo", b""))
        await asyncio.sleep(0.02)
        server_side.close()
        with pytest.raises(ConnectionClosedError):
            await call
        with pytest.raises(ConnectionClosedError):
            await client.call(SERVICE, "Echo", b"")
        client.close()

    _run(body)


# --- the server's answers to misbehaving clients, frame by frame --------------------------------


async def _raw_exchange(frames: bytes, expect: int) -> list[tuple[int, int, ttrpc_pb2.Response]]:
    """Write raw bytes to a served connection, return the first `expect` response frames."""
    server_side, peer = await _socket_streams()
    task = asyncio.create_task(_echo_server().serve(server_side))
    peer.write(frames)
    decoder = FrameDecoder()
    got: list[tuple[int, int, ttrpc_pb2.Response]] = []
    while len(got) < expect:
        chunk = await peer.read()
        assert chunk, "server closed the connection"
        for f in decoder.feed(chunk):
            assert isinstance(f, Frame)
            got.append((f.stream_id, f.type, ttrpc_pb2.Response.FromString(f.data)))
    peer.close()
    await asyncio.wait_for(task, 5)
    return got


def _request(stream_id: int, key: str = "x", method: str = "Echo") -> bytes:
    payload = api_pb2.KeyValue(key=key).SerializeToString()
    body = ttrpc_pb2.Request(service=SERVICE, method=method, payload=payload)
    return encode_frame(stream_id, MessageType.REQUEST, 0, body.SerializeToString())


def test_server_enforces_odd_increasing_stream_ids_like_go() -> None:
    async def body() -> None:
        wire = (
            _request(2)  # even
            + _request(5)
            + _request(3)  # decreasing
            + _request(5)  # reused
            + _request(7)
        )
        got = await _raw_exchange(wire, 5)
        by_id: dict[int, list[int]] = {}
        for stream_id, msg_type, response in got:
            assert msg_type == MessageType.RESPONSE
            by_id.setdefault(stream_id, []).append(response.status.code)
        assert by_id[2] == [Code.INVALID_ARGUMENT]
        assert by_id[3] == [Code.INVALID_ARGUMENT]
        assert sorted(by_id[5]) == [Code.OK, Code.INVALID_ARGUMENT]
        assert by_id[7] == [Code.OK]

    _run(body)


def test_server_answers_oversized_frames_and_data_frames_and_ignores_unknown_types() -> None:
    async def body() -> None:
        oversized = struct.pack(">IIBB", MAX_DATA_LEN + 1, 1, MessageType.REQUEST, 0)
        wire = (
            oversized
            + bytes(MAX_DATA_LEN + 1)
            + encode_frame(3, 0x7F, 0, b"future")  # unknown type: ignored
            + encode_frame(5, MessageType.DATA, 0, b"")
            + encode_frame(7, MessageType.REQUEST, 0, b"\xff")  # undecodable envelope
            + _request(9)
        )
        got = await _raw_exchange(wire, 4)
        codes = {stream_id: response.status.code for stream_id, _, response in got}
        assert codes == {
            1: Code.RESOURCE_EXHAUSTED,
            5: Code.INVALID_ARGUMENT,
            7: Code.INVALID_ARGUMENT,
            9: Code.OK,
        }

    _run(body)


def test_ok_response_with_empty_payload_is_a_zero_byte_body() -> None:
    """As on the wire from Go: no status field, and an empty reply encodes to nothing."""

    async def body() -> None:
        server = Server()

        async def empty(req: api_pb2.Empty, ctx: CallContext) -> api_pb2.Empty:
            return api_pb2.Empty()

        server.register(SERVICE, {"Empty": unary(api_pb2.Empty, empty)})
        server_side, peer = await _socket_streams()
        task = asyncio.create_task(server.serve(server_side))
        request = ttrpc_pb2.Request(service=SERVICE, method="Empty").SerializeToString()
        peer.write(encode_frame(1, MessageType.REQUEST, 0, request))
        data = b""
        while len(data) < HEADER_LEN:
            data += await peer.read()
        assert data == encode_frame(1, MessageType.RESPONSE, 0, b"")
        peer.close()
        await asyncio.wait_for(task, 5)

    _run(body)


async def _send_then_eof(data: list[bytes]) -> None:
    """Send `data` to an echo server, then end the stream: the server must return normally
    (no exception escapes) once it reads EOF."""
    server_side, peer = await _socket_streams()
    task = asyncio.create_task(_echo_server().serve(server_side))
    for chunk in data:
        peer.write(chunk)
    await peer.drain()
    peer.close()
    await asyncio.wait_for(task, 5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=80), min_size=1, max_size=10))
def test_arbitrary_bytes_never_crash_the_server(chunks: list[bytes]) -> None:
    _run(lambda: _send_then_eof(chunks))


# --- limits ---------------------------------------------------------------------------------------


def _gated_server(gate: asyncio.Event, limits: Limits) -> Server:
    """Echo, but a request whose key is "wait" holds its slot until `gate` opens."""

    async def echo(req: api_pb2.KeyValue, ctx: CallContext) -> api_pb2.KeyValue:
        if req.key == "wait":
            await gate.wait()
        return req

    server = Server(limits)
    server.register(SERVICE, {"Echo": unary(api_pb2.KeyValue, echo)})
    return server


def _call_frame(
    stream_id: int, key: str, value: str = "", metadata: list[tuple[str, str]] | None = None
) -> bytes:
    payload = api_pb2.KeyValue(key=key, value=value).SerializeToString()
    body = ttrpc_pb2.Request(
        service=SERVICE,
        method="Echo",
        payload=payload,
        metadata=[ttrpc_pb2.KeyValue(key=k, value=v) for k, v in metadata or []],
    )
    return encode_frame(stream_id, MessageType.REQUEST, 0, body.SerializeToString())


async def _responses(peer: AsyncioStream, decoder: FrameDecoder, n: int) -> dict[int, int]:
    codes: dict[int, int] = {}
    while len(codes) < n:
        chunk = await peer.read()
        assert chunk, "server closed the connection"
        for f in decoder.feed(chunk):
            assert isinstance(f, Frame)
            codes[f.stream_id] = ttrpc_pb2.Response.FromString(f.data).status.code
    return codes


def test_requests_over_the_in_flight_limits_are_refused_on_their_own_stream() -> None:
    async def body() -> None:
        gate = asyncio.Event()
        limits = Limits(max_in_flight=2, max_in_flight_bytes=1000)
        server_side, peer = await _socket_streams()
        task = asyncio.create_task(_gated_server(gate, limits).serve(server_side))
        decoder = FrameDecoder()
        # two waiting requests fill the count; a third is refused, the connection lives
        peer.write(_call_frame(1, "wait") + _call_frame(3, "wait") + _call_frame(5, "x"))
        assert await _responses(peer, decoder, 1) == {5: Code.RESOURCE_EXHAUSTED}
        gate.set()
        assert await _responses(peer, decoder, 2) == {1: Code.OK, 3: Code.OK}
        # bytes: one waiting request of 900 bytes leaves no room for another 200
        gate.clear()
        peer.write(_call_frame(7, "wait", "v" * 900) + _call_frame(9, "x", "v" * 200))
        assert await _responses(peer, decoder, 1) == {9: Code.RESOURCE_EXHAUSTED}
        gate.set()
        assert await _responses(peer, decoder, 1) == {7: Code.OK}
        # and with the slots free again, the same request passes
        peer.write(_call_frame(11, "x", "v" * 200))
        assert await _responses(peer, decoder, 1) == {11: Code.OK}
        peer.close()
        await asyncio.wait_for(task, 5)

    _run(body)


def test_metadata_over_the_limits_is_refused() -> None:
    async def body() -> None:
        limits = Limits(max_metadata_entries=3, max_metadata_bytes=100)
        server_side, peer = await _socket_streams()
        task = asyncio.create_task(_gated_server(asyncio.Event(), limits).serve(server_side))
        decoder = FrameDecoder()
        peer.write(
            _call_frame(1, "x", metadata=[("k", "v")] * 3)  # at the limit
            + _call_frame(3, "x", metadata=[("k", "v")] * 4)
            + _call_frame(5, "x", metadata=[("k", "v" * 99)])  # exactly 100 bytes
            + _call_frame(7, "x", metadata=[("k", "v" * 100)])
        )
        assert await _responses(peer, decoder, 4) == {
            1: Code.OK,
            3: Code.RESOURCE_EXHAUSTED,
            5: Code.OK,
            7: Code.RESOURCE_EXHAUSTED,
        }
        peer.close()
        await asyncio.wait_for(task, 5)

    _run(body)


def test_a_peer_that_stops_reading_is_disconnected_not_buffered_without_end() -> None:
    async def body() -> None:
        a, b = socket.socketpair()
        ra, wa = await asyncio.open_unix_connection(sock=a)
        server_side = AsyncioStream(ra, wa, max_write_buffer=256 << 10)
        _, peer_writer = await asyncio.open_unix_connection(sock=b)
        task = asyncio.create_task(_echo_server().serve(server_side))
        # 64 answers of 64 KiB each, none of them read: far over the 256 KiB bound
        sent = 0
        with contextlib.suppress(ConnectionResetError):
            for i in range(64):
                peer_writer.write(_call_frame(2 * i + 1, "big", "v" * (64 << 10)))
                await peer_writer.drain()
                sent += 1
        await asyncio.wait_for(task, 10)  # the server gave up on this peer and returned
        assert wa.transport.is_closing()
        peer_writer.close()

    _run(body)


def test_a_peer_that_vanishes_mid_message_ends_the_connection_cleanly() -> None:
    async def body() -> None:
        gate = asyncio.Event()
        server_side, peer = await _socket_streams()
        task = asyncio.create_task(_gated_server(gate, Limits()).serve(server_side))
        whole = _call_frame(3, "x", "v" * 10000)
        peer.write(_call_frame(1, "wait") + whole[: len(whole) // 2])
        await peer.drain()
        peer.close()
        await asyncio.wait_for(task, 5)  # returns, the waiting handler is cancelled

    _run(body)


CRAFTED_HEADERS = st.builds(
    lambda length, stream_id, msg_type, flags, body: (
        struct.pack(">IIBB", length, stream_id, msg_type, flags) + body
    ),
    st.sampled_from([0, 1, 10, MAX_DATA_LEN, MAX_DATA_LEN + 1, 2**32 - 1]),
    st.sampled_from([0, 1, 2, 3, 2**31, 2**32 - 1, 2**32 - 2]),
    st.integers(0, 255),
    st.integers(0, 255),
    st.binary(max_size=30),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(CRAFTED_HEADERS, min_size=1, max_size=5))
def test_crafted_headers_get_answers_or_are_skipped_and_the_server_lives(
    frames: list[bytes],
) -> None:
    """Huge and zero lengths, bad stream IDs, types and flags; the connection still serves
    whatever whole frames follow, then ends cleanly at EOF."""

    _run(lambda: _send_then_eof(frames))


# --- decode budget ------------------------------------------------------------------------------


def test_the_decode_budget_counts_nested_messages_and_list_elements() -> None:
    desc = api_pb2.SynchronizeRequest.DESCRIPTOR
    empty_pods = b"\x0a\x00" * 100  # 100 empty PodSandbox messages
    assert within_budget(empty_pods, desc, budget=100)
    assert not within_budget(empty_pods, desc, budget=99)
    # singular strings cost nothing extra: one pod with a long id is one item
    one = api_pb2.SynchronizeRequest(pods=[api_pb2.PodSandbox(id="x" * 1000)]).SerializeToString()
    assert within_budget(one, desc, budget=1)
    # malformed bytes are left to the decoder
    assert within_budget(b"\x0a\xff\xff\xff\xff\x0f" + bytes(400), desc, budget=1)


def test_a_message_that_would_decode_into_too_much_is_refused_before_decoding() -> None:
    async def body() -> None:
        server_side, peer = await _socket_streams()
        task = asyncio.create_task(_echo_server().serve(server_side))
        decoder = FrameDecoder()
        # an envelope of 300,000 empty metadata entries (600 KB on the wire)
        envelope = b"\x2a\x00" * 300_000
        peer.write(encode_frame(1, MessageType.REQUEST, 0, envelope))
        frames: list[Frame | OversizedFrame] = []
        while not frames:
            frames = decoder.feed(await peer.read())
        assert isinstance(frames[0], Frame)
        status = ttrpc_pb2.Response.FromString(frames[0].data).status
        assert status.code == Code.RESOURCE_EXHAUSTED
        assert "would decode into over" in status.message
        peer.write(_call_frame(3, "x"))
        assert await _responses(peer, decoder, 1) == {3: Code.OK}
        peer.close()
        await asyncio.wait_for(task, 5)

    _run(body)
