"""Golden vectors: real containerd 2.3.4 and 1.7.34 sessions, byte for byte.

Every check here compares our codecs with bytes a real runtime (and NRI's own Go stub)
produced: message decoding against upstream's Go decoding, ttrpc headers, multiplexer
framing including the split of large messages, and reassembly from the recorded reads.
"""

from __future__ import annotations

import collections

from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from nri_hook.mux import MuxDecoder, encode_frames
from protos.nri import api_pb2
from protos.ttrpc import ttrpc_pb2
from tessera_ttrpc import MAX_DATA_LEN, Frame, FrameDecoder, Limits, MessageType, encode_frame
from tessera_ttrpc.frame import decode_header
from tests.nri_hook.vectors import Session


def _nri_type(message: dict[str, object]) -> type[Message]:
    service = api_pb2.DESCRIPTOR.services_by_name[str(message["service"]).rsplit(".", 1)[1]]
    method = service.methods_by_name[str(message["method"])]
    descriptor = method.input_type if message["ttrpc_type"] == "request" else method.output_type
    return message_factory.GetMessageClass(descriptor)


def test_every_captured_message_decodes_like_upstream(sessions: list[Session]) -> None:
    checked = 0
    for session in sessions:
        for m in session.messages():
            oracle = session.oracle(m)
            nri = _nri_type(m).FromString(session.nri_payload(m))
            assert MessageToDict(nri, preserving_proto_field_name=True) == oracle["nri"], (
                f"{session.name} {m['file']}"
            )
            envelope_type = (
                ttrpc_pb2.Request if m["ttrpc_type"] == "request" else ttrpc_pb2.Response
            )
            envelope = envelope_type.FromString(session.body(m))
            assert envelope.payload == session.nri_payload(m)
            as_dict = MessageToDict(envelope, preserving_proto_field_name=True)
            as_dict.pop("payload", None)
            assert as_dict == oracle["ttrpc_envelope_without_payload"], m["file"]
            checked += 1
    assert checked >= 88


def test_messages_without_maps_reencode_to_the_same_bytes(sessions: list[Session]) -> None:
    # Go writes maps in random order, so only messages without maps can be compared as bytes.
    compared = 0
    for session in sessions:
        for m in session.messages():
            raw = session.nri_payload(m)
            nri = _nri_type(m).FromString(raw)
            if any(d.message_type and d.message_type.GetOptions().map_entry for d in _fields(nri)):
                continue
            assert nri.SerializeToString() == raw, m["file"]
            compared += 1
    assert compared > 10


def _fields(msg: Message) -> list[FieldDescriptor]:
    """Every field descriptor set anywhere in the message (recursively)."""
    found = []
    for field, value in msg.ListFields():
        found.append(field)
        if field.message_type is not None and not field.message_type.GetOptions().map_entry:
            for item in value if field.is_repeated else [value]:
                found.extend(_fields(item))
    return found


def test_ttrpc_headers_match_the_capture(sessions: list[Session]) -> None:
    for session in sessions:
        for m in session.messages():
            length, stream_id, msg_type, flags = decode_header(bytes.fromhex(m["ttrpc_header_hex"]))
            assert length == m["ttrpc_length"] == len(session.body(m))
            assert stream_id == m["stream_id"]
            assert msg_type == (MessageType.REQUEST if m["ttrpc_type"] == "request" else 2)
            assert flags == m["flags"]
            assert encode_frame(stream_id, msg_type, flags, session.body(m)) == session.ttrpc_frame(
                m
            )


def test_mux_decoder_finds_every_captured_frame(sessions: list[Session]) -> None:
    for session in sessions:
        for direction in ("p2r", "r2p"):
            frames = MuxDecoder().feed(session.stream(direction))
            expected = [f for f in session.index["frames"] if f["dir"] == direction]
            assert [(c, len(p)) for c, p in frames] == [
                (f["conn_id"], f["length"]) for f in expected
            ]


def test_reassembly_from_the_recorded_socket_reads(sessions: list[Session]) -> None:
    """Reads start mid-frame, hold bare headers or frames of both connections: feed them
    exactly as recorded and get every ttrpc message back, in order, per connection."""
    for session in sessions:
        for direction in ("p2r", "r2p"):
            mux = MuxDecoder()
            per_conn: dict[int, FrameDecoder] = collections.defaultdict(FrameDecoder)
            got: dict[int, list[Frame]] = collections.defaultdict(list)
            for chunk in session.chunks(direction):
                for conn_id, payload in mux.feed(chunk):
                    for frame in per_conn[conn_id].feed(payload):
                        assert isinstance(frame, Frame)
                        got[conn_id].append(frame)
            assert mux.buffered == 0
            for conn_id in (1, 2):
                expected = [m for m in session.messages(direction) if m["conn_id"] == conn_id]
                assert [(f.stream_id, f.type, f.data) for f in got[conn_id]] == [
                    (
                        m["stream_id"],
                        MessageType.REQUEST if m["ttrpc_type"] == "request" else 2,
                        session.body(m),
                    )
                    for m in expected
                ]


def test_our_mux_framing_reproduces_the_captured_trunk_bytes(sessions: list[Session]) -> None:
    """Sending each captured ttrpc message through our multiplexer gives exactly the bytes
    containerd (and the Go stub) put on the wire, including the 4096 + rest split."""
    split_seen = 0
    for session in sessions:
        frames = session.index["frames"]
        for direction in ("p2r", "r2p"):
            stream = session.stream(direction)
            for m in session.messages(direction):
                first = frames[m["frames"][0]]
                last = frames[m["frames"][-1]]
                captured = stream[first["offset"] : last["payload_offset"] + last["length"]]
                assert encode_frames(m["conn_id"], session.ttrpc_frame(m)) == captured, m["file"]
                split_seen += len(m["frames"]) > 1
    assert split_seen >= 8  # the captures do contain split messages


def test_split_messages_in_the_capture_are_4096_then_rest(sessions: list[Session]) -> None:
    for session in sessions:
        frames = session.index["frames"]
        for m in session.messages():
            lengths = [frames[i]["length"] for i in m["frames"]]
            total = m["ttrpc_length"] + 10
            if total <= 4096:
                assert lengths == [total]
            else:
                assert lengths == [4096, total - 4096]


def test_the_default_limits_admit_what_containerd_sends(sessions: list[Session]) -> None:
    """Every request in the captured sessions is within every default limit."""
    limits = Limits()
    for session in sessions:
        for m in session.messages("r2p"):
            if m["ttrpc_type"] != "request":
                continue
            request = ttrpc_pb2.Request.FromString(session.body(m))
            assert len(request.metadata) <= limits.max_metadata_entries
            assert sum(len(kv.key) + len(kv.value) for kv in request.metadata) <= (
                limits.max_metadata_bytes
            )
            assert len(session.body(m)) <= MAX_DATA_LEN
