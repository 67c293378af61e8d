"""Attack surface: the device plugin's gRPC servers, called over their unix sockets as the
kubelet calls them.

The target is the real `PluginServer` of every resource of an 8x H100 node (fake backend),
each on its own socket; requests are raw bytes, so broken protobuf reaches the server too.
Inputs are the captured kubelet requests mutated byte-wise, plus crafted ID lists (unknown,
duplicated, over-long, odd Unicode, huge counts, many containers, negative sizes).

Counted: a call that hangs or finds the server gone (crash), INTERNAL/UNKNOWN or any code but
OK, INVALID_ARGUMENT and RESOURCE_EXHAUSTED (server error), an honest request refused
(server error), and a request naming an unknown or duplicated ID that is answered OK
(forgery). After every refused call the server's unit accounting must be as before.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from deviceplugin.agent import Agent, AgentConfig
from deviceplugin.fake_backend import FakeBackend
from deviceplugin.request_bounds import (
    MAX_CONTAINER_REQUESTS,
    MAX_ID_LENGTH,
    MAX_IDS_PER_LIST,
    MAX_IDS_PER_REQUEST,
)
from deviceplugin.server import SERVICE, PluginServer
from deviceplugin.units import unit_id
from fuzz.common import Tally, mutate
from protos.kubelet.deviceplugin.v1beta1 import api_pb2 as pb
from tessera.resources import GPU_CORE

METHODS = (
    "GetDevicePluginOptions",
    "ListAndWatch",
    "GetPreferredAllocation",
    "Allocate",
    "PreStartContainer",
)
ACCEPTABLE = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # gRPC's own refusal of an oversized message
}
CALL_TIMEOUT_S = 20.0
"""A call that takes longer than this is counted as a hang."""


CAPTURED_ID_PREFIX = "gpu0-core-"
"""The captured kubelet advertised `example.com/gpu-core` units named `gpu0-core-<n>`."""


def captured_id(unit: str, device: str) -> str:
    """A captured unit ID (`gpu0-core-<n>`) as this plugin names unit n of `device`."""
    number = unit.removeprefix(CAPTURED_ID_PREFIX)
    if number == unit or not number.isascii() or not number.isdigit():
        raise ValueError(f"not a captured unit ID: {unit!r}")
    return unit_id(device, GPU_CORE, int(number))


def captured_requests(rename: Callable[[str], str] | None = None) -> dict[str, bytes]:
    """The requests a real kubelet sent (its captured bytes, rebuilt field for field); with
    `rename`, the same requests with each captured ID renamed (to IDs a target advertises)."""

    def ids(numbers: tuple[int, ...]) -> list[str]:
        captured = [f"{CAPTURED_ID_PREFIX}{n}" for n in numbers]
        return [rename(u) for u in captured] if rename else captured

    preferred = pb.PreferredAllocationRequest()
    preferred.container_requests.add(
        available_deviceIDs=ids((2, 3, 4, 5, 6, 7, 0, 1)), allocation_size=3
    )
    allocate = pb.AllocateRequest()
    allocate.container_requests.add(devices_ids=ids((3, 4, 2)))
    prestart = pb.PreStartContainerRequest(devices_ids=ids((4, 2, 3)))
    return {
        "GetDevicePluginOptions": b"",
        "ListAndWatch": b"",
        "GetPreferredAllocation": preferred.SerializeToString(),
        "Allocate": allocate.SerializeToString(),
        "PreStartContainer": prestart.SerializeToString(),
    }


@dataclass(frozen=True)
class Answer:
    code: grpc.StatusCode
    details: str
    body: bytes | None


class Target:
    """Every resource's real PluginServer on a unix socket, and a raw client to each."""

    def __init__(self, plugin_dir: Path, topology: str = "h100-sxm-8x") -> None:
        backend = FakeBackend.from_topology(topology)
        agent = Agent(AgentConfig("fuzz-node", plugin_dir=plugin_dir), backend, backend)
        agent.discover()
        backend.close()
        self.units = agent.units
        gpu0 = self.units[GPU_CORE].devices[0]
        self.rename: Callable[[str], str] = lambda unit: captured_id(unit, gpu0)
        """Maps the captured requests' IDs to the units this node advertises for them."""
        self.servers: dict[str, PluginServer] = {}
        self.channels: dict[str, grpc.Channel] = {}
        for resource, units in self.units.items():
            server = PluginServer(resource, plugin_dir)
            server.state.update(units)
            server.start()
            self.servers[resource] = server
            self.channels[resource] = grpc.insecure_channel(
                f"unix://{server.socket_path}",
                options=[("grpc.max_receive_message_length", 64 << 20)],
            )

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        for server in self.servers.values():
            server.stop(0)

    def ids(self, resource: str) -> list[str]:
        return [u.id for u in self.units[resource].units]

    def call(
        self, resource: str, method: str, raw: bytes, timeout_s: float = CALL_TIMEOUT_S
    ) -> Answer:
        """One call with raw request bytes; ListAndWatch reads the first snapshot only."""
        channel: Any = self.channels[resource]  # raw bytes: the typed stubs do not fit
        path = f"/{SERVICE}/{method}"
        try:
            if method == "ListAndWatch":
                stream = channel.unary_stream(path)(raw, timeout=timeout_s)
                try:
                    first: bytes = next(stream)
                finally:
                    stream.cancel()
                return Answer(grpc.StatusCode.OK, "", first)
            body: bytes = channel.unary_unary(path)(raw, timeout=timeout_s)
            return Answer(grpc.StatusCode.OK, "", body)
        except grpc.RpcError as exc:
            assert isinstance(exc, grpc.Call)
            return Answer(exc.code(), exc.details() or "", None)

    def accounting(self) -> tuple[tuple[str, int, int, int, int, int], ...]:
        """What a refused request must leave as it was, per resource."""
        return tuple(
            (
                r,
                s.servicer.allocations,
                s.state.version,
                len(s.state.known),
                s.state.healthy,
                s.state.total,
            )
            for r, s in sorted(self.servers.items())
        )


@contextmanager
def target(topology: str = "h100-sxm-8x") -> Iterator[Target]:
    plugin_dir = Path(tempfile.mkdtemp(prefix="dpf-", dir="/tmp"))  # short: socket paths
    t = Target(plugin_dir, topology)
    try:
        yield t
    finally:
        t.close()
        shutil.rmtree(plugin_dir, ignore_errors=True)


# --- hostile inputs ------------------------------------------------------------------------

_GPU0 = "GPU-8f4c3a0e-0000-4000-8000-000000000000"
"""GPU 0's UUID in the built-in h100-sxm-8x topology: near misses of its unit IDs."""

ODD = (
    "",
    "\x00",
    f"{_GPU0}::1\x00",
    f"{_GPU0}::\u0661",
    f"{_GPU0}::\uff11",
    f"{_GPU0}\u200b::1",
    f"{_GPU0}::01",
    f"{_GPU0}::-1",
    f"{_GPU0}:1",
    f"{_GPU0}:::1",
    f"{_GPU0}::1::1",
    f"{_GPU0.lower()}::1",
    f"{_GPU0}::99999999999999999999999",
    "::1",
    _GPU0,
    "gpu0-core-1\x00",
    "gpu0-core-\u0661",  # Arabic-Indic digit one: isdigit() but not ASCII
    "gpu0-core-\uff11",  # fullwidth digit one
    "gpu0\u200b-core-1",  # zero-width space
    "\u202egpu0-core-1",  # right-to-left override
    "gpu0-core-1\u0301",  # combining accent
    "🙂" * 20,
    "gpu0-core-01",
    "gpu0-core--1",
    "gpu0-CORE-1",
    "gpu0-core-99999999999999999999999",
    "-",
    "gpu0",
    "gpu99-core-0",
    "x" * (MAX_ID_LENGTH + 1),
    "y" * 5000,
)


def hostile_ids(rng: random.Random, known: list[str]) -> list[str]:
    """A list of IDs mixing advertised ones with unknown, duplicate, odd and long ones."""
    roll = rng.random()
    if roll < 0.03:  # huge: over the per-list bound, or just under it with a bad ID
        count = MAX_IDS_PER_LIST + rng.choice((1, 100)) if rng.random() < 0.5 else len(known)
        ids = [known[i % len(known)] if i < len(known) else f"GPU-{i}::0" for i in range(count)]
        if rng.random() < 0.5:
            ids[rng.randrange(len(ids))] = rng.choice(ODD)
        return ids
    size = rng.choice((0, 1, 2, 3, 8, 50, 150))
    ids = rng.sample(known, min(size, len(known)))
    for _ in range(rng.choice((0, 0, 1, 2))):
        kind = rng.randrange(4)
        if kind == 0 and ids:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(ids))  # duplicate
        elif kind == 1:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(ODD))
        elif kind == 2 and ids:
            i = rng.randrange(len(ids))
            ids[i] = ids[i] + rng.choice(("0", "-0", "x", " ", ":", "::0"))
        else:
            ids.append(f"GPU-{rng.randrange(20)}::{rng.randrange(200)}")
    return ids


def crafted(rng: random.Random, method: str, known: list[str]) -> Message:
    containers = rng.choice((0, 1, 1, 1, 2, MAX_CONTAINER_REQUESTS, MAX_CONTAINER_REQUESTS + 1))
    if method == "Allocate":
        allocate = pb.AllocateRequest()
        for _ in range(containers):
            allocate.container_requests.add(devices_ids=hostile_ids(rng, known))
        return allocate
    if method == "GetPreferredAllocation":
        preferred = pb.PreferredAllocationRequest()
        for _ in range(containers):
            available = hostile_ids(rng, known)
            must = rng.sample(available, min(len(available), rng.choice((0, 0, 1, 3))))
            if rng.random() < 0.1:
                must.append(rng.choice(known))
            preferred.container_requests.add(
                available_deviceIDs=available,
                must_include_deviceIDs=must,
                allocation_size=rng.choice((0, 1, 3, 100, -1, 2**31 - 1, -(2**31))),
            )
        return preferred
    if method == "PreStartContainer":
        return pb.PreStartContainerRequest(devices_ids=hostile_ids(rng, known))
    return pb.Empty()


# --- the oracle ----------------------------------------------------------------------------


def _lists(method: str, raw: bytes) -> tuple[list[list[str]], int, list[str]] | None:
    """(every ID list, container count, problems) of a decodable request, else None."""
    try:
        if method == "Allocate":
            a = pb.AllocateRequest.FromString(raw)
            return (
                [list(c.devices_ids) for c in a.container_requests],
                len(a.container_requests),
                [],
            )
        if method == "GetPreferredAllocation":
            p = pb.PreferredAllocationRequest.FromString(raw)
            lists, problems = [], []
            for c in p.container_requests:
                lists += [list(c.available_deviceIDs), list(c.must_include_deviceIDs)]
                if c.allocation_size < 0:
                    problems.append("negative size")
                if not set(c.must_include_deviceIDs) <= set(c.available_deviceIDs):
                    problems.append("must-include not available")
            return lists, len(p.container_requests), problems
        if method == "PreStartContainer":
            return [list(pb.PreStartContainerRequest.FromString(raw).devices_ids)], 1, []
        pb.Empty.FromString(raw)
        return [], 1, []
    except Exception:
        return None


def honest(method: str, raw: bytes, known: AbstractSet[str]) -> bool | None:
    """Whether the kubelet could have sent this request; None when it does not decode."""
    parsed = _lists(method, raw)
    if parsed is None:
        return None
    lists, containers, problems = parsed
    if problems or not 1 <= containers <= MAX_CONTAINER_REQUESTS:
        return False
    if sum(len(ids) for ids in lists) > MAX_IDS_PER_REQUEST:
        return False
    return all(len(ids) == len(set(ids)) and set(ids) <= known for ids in lists)


def check(tally: Tally, t: Target, resource: str, method: str, raw: bytes, label: str) -> Answer:
    """Send one request, judge the answer, and check the accounting."""
    before = t.accounting()
    answer = t.call(resource, method, raw)
    tally.inputs += 1
    what = f"{label} {method} on {resource} ({len(raw)} bytes)"
    if answer.code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
        tally.fail("crashes", f"{what}: {answer.code.name} {answer.details}")
        return answer
    if answer.code not in ACCEPTABLE:
        tally.fail("server_errors", f"{what}: {answer.code.name} {answer.details}")
        return answer
    expected = honest(method, raw, t.servers[resource].state.known)
    ok = answer.code == grpc.StatusCode.OK
    if ok and expected is not True:
        tally.fail("forgeries", f"{what}: accepted a request the kubelet never sends")
    if not ok and expected is True and len(raw) < (4 << 20):
        tally.fail("server_errors", f"{what}: refused an honest request: {answer.details}")
    if not ok and t.accounting() != before:
        tally.fail("server_errors", f"{what}: a refused request changed the accounting")
    return answer


def run(n: int, seed: int) -> Tally:
    tally = Tally("deviceplugin")
    rng = random.Random(seed)
    with target() as t:
        seeds = captured_requests(t.rename)
        resources = sorted(t.units)
        known_by_resource = {r: t.ids(r) for r in resources}
        for i in range(n):
            method = rng.choice(METHODS)
            resource = GPU_CORE if rng.random() < 0.5 else rng.choice(resources)
            known = known_by_resource[resource]
            if rng.random() < 0.5:
                raw = seeds[method]
                for _ in range(rng.randrange(1, 4)):
                    raw = mutate(raw, rng)
                label = f"#{i} mutated"
            else:
                raw = crafted(rng, method, known).SerializeToString()
                label = f"#{i} crafted"
            check(tally, t, resource, method, raw, label)
        # still serving honestly after all that
        honest_ids = known_by_resource[GPU_CORE][:3]
        request = pb.AllocateRequest()
        request.container_requests.add(devices_ids=honest_ids)
        answer = check(tally, t, GPU_CORE, "Allocate", request.SerializeToString(), "final")
        if answer.code != grpc.StatusCode.OK:
            tally.fail("crashes", "the server no longer answers an honest Allocate")
    return tally
