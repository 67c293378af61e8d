"""Attack surface: tessera's NRI plugin on a real unix socket, reached as containerd reaches it.

The plugin runs as in production (NriPlugin.run dialing the runtime's socket and
reconnecting, the real Enforcer with an integrity key, device nodes under a scratch root, a
VF mover that records instead of moving). This module plays the runtime: it accepts each
connection, answers RegisterPlugin, then writes one hostile input on the trunk, reads
what comes back, closes the trunk and checks liveness on the plugin's next connection
(register, configure, synchronize, then a valid CreateContainer must get its device).

Inputs (seeded): the captured containerd sessions mutated as a whole; crafted mux frames
(huge, zero and unknown-ID frames, frames cut short); crafted ttrpc frames inside valid mux
frames (huge and zero lengths, even, zero and reused stream IDs, any type and flags,
truncated envelopes); and captured NRI requests mutated inside valid frames, some carrying
a correctly signed record.

Counted: crashes (the plugin stopped, raised, or failed the liveness check),
server errors (UNKNOWN, INTERNAL or DATA_LOSS answered to client bytes) and forgeries
(a device granted to a container its pod's signed record does not name).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import shutil
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from fuzz.common import Tally, mutate
from nri_hook.adjust import Settings
from nri_hook.devices import HostDevices
from nri_hook.enforce import Enforcer, EnforcerConfig
from nri_hook.mux import HEADER_LEN as MUX_HEADER_LEN
from nri_hook.mux import MAX_PAYLOAD, Mux, MuxDecoder, MuxError, encode_frames
from nri_hook.netdev import NetdevMove
from nri_hook.plugin import PLUGIN_SERVICE, RUNTIME_SERVICE, Backoff, NriPlugin
from protos.nri import api_pb2 as api
from protos.ttrpc import ttrpc_pb2
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.record import Keyring, decode, encode
from tessera.resources import ALLOCATION_ANNOTATION
from tessera_edge.keyfiles import KeyringSource
from tessera_ttrpc import (
    HEADER_LEN,
    MAX_DATA_LEN,
    CallContext,
    Client,
    Code,
    Frame,
    FrameDecoder,
    MessageType,
    RpcError,
    Server,
    encode_frame,
    unary,
)

VECTORS = Path(__file__).resolve().parent.parent / "tests" / "vectors" / "nri-wire"
NODE = "fuzz-node"
KEY = Keyring.generate("fuzz")
GPU = GpuGrant("GPU-0f0f0f0f-0000-0000-0000-000000000000", 0, 0, 100, 1024)
SERVER_ERROR_CODES = frozenset({Code.UNKNOWN, Code.INTERNAL, Code.DATA_LOSS})
SETTLE = 5.0
"""Seconds to wait for the sentinel's answer before calling the plugin hung."""
QUIET = 0.02
"""Seconds to keep collecting answers after the sentinel's (calls that went through a
thread finish later), or in all when the input leaves connection 1 unable to carry a
sentinel (a declared frame of gigabytes that the reader skips)."""
MAX_PAD = 8 << 20
"""Most padding sent to complete a frame the input left open."""
SENTINEL_STREAM = 0x7FFFFFFF
"""Stream ID of the marker call sent after each input: its answer means every whole
request before it has been read (its code does not matter)."""

log = logging.getLogger(__name__)


class RecordingMover:
    """Stands in for NetdevMover: remembers the moves asked, touches nothing."""

    def __init__(self) -> None:
        self.moves = 0

    def move_in(self, netns_path: str, moves: list[NetdevMove]) -> None:
        self.moves += 1

    def move_out(self, netns_path: str, moves: list[NetdevMove]) -> list[str]:
        self.moves += 1
        return []


@dataclass
class Target:
    """The plugin under attack, and the runtime socket it dials."""

    enforcer: Enforcer
    plugin: NriPlugin
    task: asyncio.Task[None]
    stop: asyncio.Event
    server: asyncio.base_events.Server
    accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
    root: Path

    async def close(self) -> None:
        self.stop.set()
        self.server.close()
        while not self.accepted.empty():
            self.accepted.get_nowait()[1].close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.task, 5)
        shutil.rmtree(self.root, ignore_errors=True)


async def start_target() -> Target:
    root = Path(tempfile.mkdtemp(prefix="nri-fuzz-", dir="/tmp"))
    dev = root / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidiactl"):
        (dev / name).symlink_to("/dev/null")  # a character device whatever the privileges
    enforcer = Enforcer(
        EnforcerConfig(node_name=NODE, settings=Settings()),
        KeyringSource.fixed(KEY.verifier()),
        HostDevices(str(root)),
        RecordingMover(),  # type: ignore[arg-type]
    )
    accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()

    async def on_accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put((reader, writer))

    path = str(root / "nri.sock")
    server = await asyncio.start_unix_server(on_accept, path)
    plugin = NriPlugin(
        enforcer,
        name="tessera",
        index="50",
        socket_path=path,
        backoff=Backoff(initial=0.001, maximum=0.002, jitter=0.0),
    )
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(plugin.run(stop))
    return Target(enforcer, plugin, task, stop, server, accepted, root)


@dataclass
class RuntimeSide:
    """One accepted plugin connection after RegisterPlugin was answered."""

    mux: Mux
    writer: asyncio.StreamWriter
    serving: asyncio.Task[None]

    async def close(self) -> None:
        self.mux.close()
        self.serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.serving


async def accept_registered(target: Target) -> RuntimeSide:
    reader, writer = await asyncio.wait_for(target.accepted.get(), 5)
    mux = Mux(reader, writer)
    registered = asyncio.get_running_loop().create_future()

    async def register(req: api.RegisterPluginRequest, ctx: CallContext) -> api.Empty:
        if not registered.done():
            registered.set_result(req)
        return api.Empty()

    server = Server()
    server.register(RUNTIME_SERVICE, {"RegisterPlugin": unary(api.RegisterPluginRequest, register)})
    serving = asyncio.get_running_loop().create_task(server.serve(mux.open(2)))
    side = RuntimeSide(mux, writer, serving)
    try:
        await asyncio.wait_for(registered, 5)
    except BaseException:
        await side.close()
        raise
    return side


def signed_pod(pod: api.PodSandbox, container: str) -> str:
    alloc = PodAllocation(
        pod.uid, pod.namespace, pod.name, NODE, (ContainerAllocation(container, gpus=(GPU,)),)
    )
    text = encode(alloc, KEY)
    pod.annotations[ALLOCATION_ANNOTATION] = text
    return text


async def liveness(target: Target) -> str:
    """'' when the plugin, on a fresh connection, serves a valid CreateContainer."""
    side = await accept_registered(target)
    client = Client(side.mux.open(1))
    try:
        configure = api.ConfigureRequest(
            runtime_name="containerd", runtime_version="v2.3.4", NRI_version="v0.12.0"
        )
        await client.call_message(
            PLUGIN_SERVICE, "Configure", configure, api.ConfigureResponse, timeout=5
        )
        await client.call_message(
            PLUGIN_SERVICE,
            "Synchronize",
            api.SynchronizeRequest(),
            api.SynchronizeResponse,
            timeout=5,
        )
        pod = api.PodSandbox(
            id="f" * 64, name="live", namespace="fuzz", uid="0c5e3a52-7d0f-4a53-9a54-0d7f2b7b1c11"
        )
        signed_pod(pod, "main")
        container = api.Container(id="c" * 64, pod_sandbox_id=pod.id, name="main")
        response = await client.call_message(
            PLUGIN_SERVICE,
            "CreateContainer",
            api.CreateContainerRequest(pod=pod, container=container),
            api.CreateContainerResponse,
            timeout=5,
        )
        paths = [d.path for d in response.adjust.linux.devices]
        if "/dev/nvidia0" not in paths:
            return f"liveness: CreateContainer answered without the device: {paths}"
        return ""
    except (RpcError, TimeoutError) as exc:
        return f"liveness: {type(exc).__name__}: {exc}"
    finally:
        client.close()
        await side.close()


# --- inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Captured:
    r2p: tuple[bytes, ...]
    """The runtime -> plugin byte stream of each captured session."""
    requests: tuple[tuple[str, bytes], ...]
    """(method, NRI request payload) of every request containerd sent the plugin."""


@cache
def captured() -> Captured:
    streams: list[bytes] = []
    requests: list[tuple[str, bytes]] = []
    for session in sorted(VECTORS.glob("*/session-*")):
        streams.append((session / "r2p.bin").read_bytes())
        index: dict[str, Any] = json.loads((session / "index.json").read_text())
        for m in index["messages"]:
            if m["dir"] == "r2p" and m["ttrpc_type"] == "request":
                payload = (session / "messages" / m["nri_file"]).read_bytes()
                requests.append((m["method"], payload))
    if not streams:
        raise FileNotFoundError(f"no captured NRI sessions under {VECTORS}")
    return Captured(tuple(streams), tuple(requests))


def ttrpc_request(
    stream_id: int, method: str, payload: bytes, *, service: str = PLUGIN_SERVICE
) -> bytes:
    body = ttrpc_pb2.Request(
        service=service,
        method=method,
        payload=payload,
        timeout_nano=2_000_000_000,
        metadata=[ttrpc_pb2.KeyValue(key="containerd-namespace-ttrpc", value="k8s.io")],
    )
    return encode_frame(stream_id, MessageType.REQUEST, 0, body.SerializeToString())


@dataclass
class Attack:
    kind: str
    wire: bytes
    """Bytes written on the trunk as they are."""
    signed: dict[int, tuple[api.CreateContainerRequest, bytes]] = field(default_factory=dict)
    """Stream ID -> (the request as signed, the bytes sent) of requests given a record."""


def mux_attack(rng: random.Random) -> Attack:
    """Crafted mux frames: unknown IDs, zero and huge lengths, frames cut short."""
    parts: list[bytes] = []
    for _ in range(rng.randrange(1, 6)):
        conn_id = rng.choice([0, 1, 2, 3, 0xFFFFFFFF, rng.randrange(1 << 32)])
        choice = rng.randrange(5)
        if choice == 0:
            parts.append(struct.pack(">II", conn_id, 0))
        elif choice == 1:
            length = rng.choice([MAX_PAYLOAD + 1, 0xFFFFFFFF, rng.randrange(MAX_PAYLOAD, 1 << 32)])
            parts.append(struct.pack(">II", conn_id, length) + rng.randbytes(rng.randrange(64)))
        elif choice == 2:
            data = rng.randbytes(rng.randrange(200))
            parts.append(struct.pack(">II", conn_id, len(data) + rng.randrange(1, 5000)) + data)
        elif choice == 3:
            parts.append(encode_frames(conn_id, rng.randbytes(rng.randrange(300))))
        else:
            parts.append(rng.randbytes(rng.randrange(1, 12)))
    return Attack("mux", b"".join(parts))


def ttrpc_attack(rng: random.Random) -> Attack:
    """Crafted ttrpc frames inside valid mux frames on connection 1."""
    method, payload = rng.choice(captured().requests)
    parts: list[bytes] = []
    for _ in range(rng.randrange(1, 5)):
        stream_id = rng.choice([0, 1, 2, 3, 0xFFFFFFFF, rng.randrange(1 << 32)])
        choice = rng.randrange(5)
        if choice == 0:
            length = rng.choice([MAX_DATA_LEN + 1, 0xFFFFFFFF, rng.randrange(1 << 32)])
            frame = struct.pack(">IIBB", length, stream_id, MessageType.REQUEST, 0)
            frame += rng.randbytes(rng.randrange(100))
        elif choice == 1:
            frame = struct.pack(">IIBB", 0, stream_id, rng.randrange(256), rng.randrange(256))
        elif choice == 2:
            whole = ttrpc_request(stream_id, method, payload)
            frame = whole[: rng.randrange(len(whole))]  # truncated
        elif choice == 3:
            body = ttrpc_pb2.Request(
                service=PLUGIN_SERVICE, method=method, payload=payload
            ).SerializeToString()
            body = body[: rng.randrange(len(body) + 1)]  # truncated protobuf, whole frame
            frame = encode_frame(stream_id, rng.choice([1, 2, 3, rng.randrange(256)]), 0, body)
        else:
            frame = encode_frame(
                stream_id, MessageType.REQUEST, rng.randrange(256), mutate(payload, rng)
            )
        parts.append(encode_frames(1, frame))
    return Attack("ttrpc", b"".join(parts))


def nri_attack(rng: random.Random) -> Attack:
    """Captured NRI requests, mutated, inside valid envelopes and frames."""
    attack = Attack("nri", b"")
    stream_id = 1
    parts: list[bytes] = []
    creates = [r for r in captured().requests if r[0] == "CreateContainer"]
    for _ in range(rng.randrange(1, 4)):
        method, payload = rng.choice(creates if rng.random() < 0.5 else captured().requests)
        original: api.CreateContainerRequest | None = None
        if method == "CreateContainer" and rng.random() < 0.7:
            original = api.CreateContainerRequest.FromString(payload)
            signed_pod(original.pod, original.container.name)
            if rng.random() < 0.2:  # the record copied to another pod or container
                if rng.random() < 0.5:
                    original.pod.name += "-copy"
                else:
                    original.container.name += "-copy"
                if rng.random() < 0.5:
                    original.pod.uid = "0c5e3a52-7d0f-4a53-9a54-0d7f2b7b1c99"
                    original.pod.name = original.pod.name.removesuffix("-copy")
            payload = original.SerializeToString()
        for _ in range(rng.randrange(0, 3)):
            payload = mutate(payload, rng, max_len=1 << 20)
        if original is not None:
            attack.signed[stream_id] = (original, payload)
        if rng.random() < 0.1:
            method = rng.choice(["StateChange", "Synchronize", "RunPodSandbox", "NoSuchMethod"])
        parts.append(encode_frames(1, ttrpc_request(stream_id, method, payload)))
        stream_id += 2
    attack.wire = b"".join(parts)
    return attack


def trunk_attack(rng: random.Random) -> Attack:
    """A whole captured session (runtime side), mutated."""
    data = rng.choice(captured().r2p)
    for _ in range(rng.randrange(1, 6)):
        data = mutate(data, rng, max_len=1 << 20)
    return Attack("trunk", data)


GENERATORS: tuple[Callable[[random.Random], Attack], ...] = (
    mux_attack,
    ttrpc_attack,
    nri_attack,
    trunk_attack,
)


# --- one input --------------------------------------------------------------------------------


def _forged(attack: Attack, stream_id: int, response: api.CreateContainerResponse) -> str:
    """Why a device grant was not deserved, or ''."""
    if not response.adjust.linux.devices:
        return ""
    entry = attack.signed.get(stream_id)
    if entry is None:
        return "devices granted to a request that carried no signed record"
    _, sent = entry
    try:
        request = api.CreateContainerRequest.FromString(sent)
    except Exception:
        return "devices granted to bytes that are not a CreateContainerRequest"
    pod = request.pod
    try:
        alloc = decode(
            pod.annotations.get(ALLOCATION_ANNOTATION, ""),
            KEY.verifier(),
            require_integrity=True,
            pod_uid=pod.uid,
            node=NODE,
            namespace=pod.namespace,
            name=pod.name,
        )
    except Exception as exc:
        return f"devices granted to pod {pod.namespace}/{pod.name} whose record fails: {exc}"
    if request.container.name not in [c.name for c in alloc.containers]:
        return (
            f"devices granted to container {request.container.name}, which its record does not name"
        )
    return ""


def completion(wire: bytes) -> tuple[str, bytes]:
    """What the plugin's readers make of `wire`, and the padding that brings its mux and
    connection-1 ttrpc readers back to a frame boundary (so that a sentinel call after it
    is read as a call). ("eof", pad): the plugin closes the trunk once it has read the
    pad; ("answer", pad): the sentinel will be answered; ("quiet", b""): connection 1
    skips gigabytes, nothing after the input is read as a call."""
    mux = MuxDecoder()
    ttrpc = FrameDecoder()
    try:
        for conn_id, payload in mux.feed(wire):
            if conn_id == 1:
                ttrpc.feed(payload)
    except MuxError:
        return "eof", b""
    pad = b""
    partial = bytes(mux._buf)
    if partial:
        header = partial[:MUX_HEADER_LEN].ljust(MUX_HEADER_LEN, b"\0")
        conn_id, length = struct.unpack(">II", header)
        pad += header[len(partial) :]
        if length > MAX_PAYLOAD:
            return "eof", pad
        body = partial[MUX_HEADER_LEN:] if len(partial) > MUX_HEADER_LEN else b""
        pad += bytes(length - len(body))
        if conn_id == 1:
            ttrpc.feed(body + bytes(length - len(body)))
    need = ttrpc._skip
    if not need and ttrpc.buffered:
        held = bytes(ttrpc._buf)
        header = held[:HEADER_LEN].ljust(HEADER_LEN, b"\0")
        declared = int.from_bytes(header[:4], "big")
        need = max(0, HEADER_LEN - len(held)) + declared - max(0, len(held) - HEADER_LEN)
    if need > MAX_PAD:
        return "quiet", pad
    if need:
        pad += encode_frames(1, bytes(need))
    return "answer", pad


async def hit(target: Target, attack: Attack, tally: Tally) -> None:
    """Send one input on a fresh connection, judge the answers, then check liveness."""
    tally.inputs += 1
    side = await accept_registered(target)
    conn = side.mux.open(1)
    decoder = FrameDecoder()
    expect, pad = completion(attack.wire)
    try:
        # a call served by a handler task, like the input's calls, so that it is answered
        # after them (answers that need a thread hop may still come later: see QUIET)
        sentinel = encode_frames(1, ttrpc_request(SENTINEL_STREAM, "UpdatePodSandbox", b""))
        side.writer.write(attack.wire + pad + (sentinel if expect == "answer" else b""))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (QUIET if expect == "quiet" else SETTLE)
        answered = False
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                if expect != "quiet" and not answered:
                    tally.fail("crashes", f"{attack.kind}: hung; input {attack.wire[:80].hex()}")
                break
            try:
                chunk = await asyncio.wait_for(conn.read(), remaining)
            except TimeoutError:
                continue
            if not chunk:
                break  # the plugin closed the trunk
            for frame in decoder.feed(chunk):
                if not isinstance(frame, Frame) or frame.type != MessageType.RESPONSE:
                    continue
                if frame.stream_id == SENTINEL_STREAM:
                    answered = True
                    deadline = loop.time() + QUIET  # stragglers
                    continue
                if answered:
                    deadline = loop.time() + QUIET
                _judge(attack, frame, tally)
    finally:
        await side.close()
    if target.task.done():
        tally.fail("crashes", f"{attack.kind}: the plugin stopped: {target.task!r}")
        return
    problem = await liveness(target)
    if problem:
        tally.fail("crashes", f"{attack.kind}: {problem}; input {attack.wire[:80].hex()}")


def _judge(attack: Attack, frame: Frame, tally: Tally) -> None:
    try:
        response = ttrpc_pb2.Response.FromString(frame.data)
    except Exception:
        tally.fail("crashes", f"{attack.kind}: undecodable response {frame.data[:40].hex()}")
        return
    code = response.status.code if response.HasField("status") else Code.OK
    if code in SERVER_ERROR_CODES:
        tally.fail(
            "server_errors",
            f"{attack.kind}: {Code(code).name} {response.status.message[:120]}; "
            f"input {attack.wire[:80].hex()}",
        )
        return
    if code == Code.OK and attack.kind == "nri":
        with contextlib.suppress(Exception):
            created = api.CreateContainerResponse.FromString(response.payload)
            why = _forged(attack, frame.stream_id, created)
            if why:
                tally.fail("forgeries", f"{why}; input {attack.wire[:80].hex()}")


LANES = 8
"""Plugins attacked at once, each on its own socket with its own seeded inputs. An input
spends most of its time waiting (for the sentinel's answer, QUIET for stragglers, a fresh
connection for the liveness check), so lanes overlap those waits."""


async def run_async(n: int, seed: int, lanes: int = LANES) -> Tally:
    tally = Tally("nri")
    left = [n]

    async def lane(number: int) -> None:
        rng = random.Random(seed * 1_000 + number)
        target = await start_target()
        try:
            while left[0] > 0:
                left[0] -= 1
                attack = rng.choice(GENERATORS)(rng)
                try:
                    await hit(target, attack, tally)
                except Exception as exc:  # the harness itself could not reach the plugin
                    tally.fail("crashes", f"{attack.kind}: {type(exc).__name__}: {exc}")
                    await target.close()
                    target = await start_target()
        finally:
            await target.close()

    await asyncio.gather(*(lane(i) for i in range(max(1, min(lanes, n)))))
    return tally


def run(n: int, seed: int) -> Tally:
    logging.getLogger("nri_hook").setLevel(logging.CRITICAL)  # expected refusals, by the 1000
    return asyncio.run(run_async(n, seed))
