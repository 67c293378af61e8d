"""Replay what real containerd sent, byte for byte, into our plugin over a socket.

The runtime side here is a tape: it writes the captured runtime->plugin frames exactly as
recorded, each request only after our plugin answered the previous one (as the runtime
would), and checks every reply: a well-formed Response on the right connection and stream,
an OK status, a payload of the method's response type, and byte-identical to what NRI's Go
stub answered wherever both plugins mean the same (all but Configure, where the masks differ,
and CreateContainer, where the stub injected its example device and we leave pods without
an allocation record untouched).
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from google.protobuf import message_factory
from google.protobuf.message import Message

from nri_hook.devices import HostDevices
from nri_hook.enforce import Enforcer, EnforcerConfig
from nri_hook.mux import MuxDecoder
from nri_hook.plugin import NriPlugin, valid_events_for
from protos.nri import api_pb2 as api
from protos.ttrpc import ttrpc_pb2
from tessera_edge.keyfiles import KeyringSource
from tessera_ttrpc import Frame, FrameDecoder, MessageType
from tests.nri_hook.vectors import Session


class Tape:
    """The runtime end of the socket, reading our plugin's frames per connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.mux = MuxDecoder()
        self.ttrpc = {1: FrameDecoder(), 2: FrameDecoder()}
        self.frames: list[tuple[int, Frame]] = []
        self.raw: dict[tuple[int, int], bytes] = {}

    async def next_frame(self) -> tuple[int, Frame]:
        while not self.frames:
            chunk = await asyncio.wait_for(self.reader.read(65536), 5)
            assert chunk, "plugin closed the connection"
            for conn_id, payload in self.mux.feed(chunk):
                assert conn_id in (1, 2)
                for frame in self.ttrpc[conn_id].feed(payload):
                    assert isinstance(frame, Frame)
                    self.frames.append((conn_id, frame))
        return self.frames.pop(0)


def _response_type(method: str) -> type[Message]:
    descriptor = api.DESCRIPTOR.services_by_name["Plugin"].methods_by_name[method].output_type
    return message_factory.GetMessageClass(descriptor)


async def _replay(session: Session, tmp_path: Path) -> list[str]:
    runtime_end, plugin_end = socket.socketpair()
    enforcer = Enforcer(
        EnforcerConfig(node_name="peer-kubelet-0", require_integrity=False),
        KeyringSource.fixed(None),
        HostDevices(tmp_path),
    )
    plugin = NriPlugin(enforcer, name="tessera", index="50")
    reader, writer = await asyncio.open_unix_connection(sock=plugin_end)
    serving = asyncio.create_task(plugin.serve_connection(reader, writer))
    tape = Tape(*await asyncio.open_unix_connection(sock=runtime_end))

    # Our registration: connection 2, stream 1, the Runtime service.
    conn_id, frame = await tape.next_frame()
    assert (conn_id, frame.stream_id, frame.type) == (2, 1, MessageType.REQUEST)
    register = ttrpc_pb2.Request.FromString(frame.data)
    assert (register.service, register.method) == ("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin")
    assert api.RegisterPluginRequest.FromString(register.payload).plugin_idx == "50"

    r2p = session.stream("r2p")
    frames = session.index["frames"]
    captured_replies = {
        (m["conn_id"], m["stream_id"]): session.body(m) for m in session.messages("p2r")
    }
    answered: list[str] = []
    for m in session.messages("r2p"):
        first, last = frames[m["frames"][0]], frames[m["frames"][-1]]
        tape.writer.write(r2p[first["offset"] : last["payload_offset"] + last["length"]])
        await tape.writer.drain()
        if m["ttrpc_type"] != "request":
            continue  # the runtime's answer to our RegisterPlugin
        conn_id, frame = await tape.next_frame()
        assert (conn_id, frame.stream_id, frame.type, frame.flags) == (
            1,
            m["stream_id"],
            MessageType.RESPONSE,
            0,
        )
        response = ttrpc_pb2.Response.FromString(frame.data)
        assert not response.HasField("status") or response.status.code == 0, response.status
        decoded = _response_type(m["method"]).FromString(response.payload)
        if m["method"] == "Configure":
            nri_version = api.ConfigureRequest.FromString(session.nri_payload(m)).NRI_version
            configured = api.ConfigureResponse.FromString(response.payload)
            assert configured.events == 0x60F
            assert configured.events & ~valid_events_for(nri_version) == 0
        elif m["method"] == "CreateContainer":
            # these pods carry no allocation record: left untouched (the Go stub injected
            # its example device and env here, so its reply differs)
            assert decoded == api.CreateContainerResponse()
        else:
            assert frame.data == captured_replies[(1, m["stream_id"])], m["file"]
        answered.append(m["method"])
    tape.writer.close()
    await asyncio.wait_for(serving, 5)
    return answered


def test_replayed_sessions_get_well_formed_replies(sessions: list[Session], tmp_path: Path) -> None:
    replayed = {}
    for session in sessions:
        replayed[session.name] = asyncio.run(asyncio.wait_for(_replay(session, tmp_path), 30))
    # both generations were exercised: dedicated event methods and StateChange
    methods = {method for answered in replayed.values() for method in answered}
    assert {"Configure", "Synchronize", "CreateContainer", "StopContainer"} <= methods
    assert "RunPodSandbox" in methods and "StateChange" in methods
