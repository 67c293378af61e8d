"""Hostile kubelet-side requests, sent over the real unix sockets to real PluginServers.

Every answer is OK or INVALID_ARGUMENT with a reason (RESOURCE_EXHAUSTED from gRPC itself for
an oversized message), never INTERNAL/UNKNOWN; a refused request leaves the server's unit
accounting as it was, and the server keeps answering honest requests.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceplugin.request_bounds import (
    MAX_CONTAINER_REQUESTS,
    MAX_ID_LENGTH,
    MAX_IDS_PER_LIST,
    MAX_IDS_PER_REQUEST,
    MAX_RECEIVE_MESSAGE_BYTES,
)
from fuzz.common import Tally, mutate
from fuzz.surface_deviceplugin import (
    METHODS,
    Target,
    captured_requests,
    check,
    crafted,
    hostile_ids,
    target,
)
from protos.kubelet.deviceplugin.v1beta1 import api_pb2 as pb
from tessera.resources import GPU_CORE, GPU_MEMORY
from tests.deviceplugin.helpers import captured_request

OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def node() -> Iterator[Target]:
    with target() as t:
        yield t


def _allocate(*lists: list[str]) -> bytes:
    request = pb.AllocateRequest()
    for ids in lists:
        request.container_requests.add(devices_ids=ids)
    return request.SerializeToString()


def _preferred(available: list[str], must: list[str], size: int, containers: int = 1) -> bytes:
    request = pb.PreferredAllocationRequest()
    for _ in range(containers):
        request.container_requests.add(
            available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
        )
    return request.SerializeToString()


def test_the_captured_requests_are_rebuilt_byte_for_byte(vectors: Path) -> None:
    ours = captured_requests()
    for method in METHODS:
        assert ours[method] == captured_request(vectors, method), method


def test_the_captured_requests_with_our_ids_are_answered(node: Target) -> None:
    """The captured kubelet named its units `gpu0-core-<n>`; renamed to this node's IDs for
    those units the requests are honest and answered, as captured they name unknown IDs."""
    renamed = captured_requests(node.rename)
    assert node.rename("gpu0-core-3") == f"{node.units[GPU_CORE].devices[0]}::3"
    for method, raw in renamed.items():
        assert node.call(GPU_CORE, method, raw).code == OK, method
    for method, raw in captured_requests().items():
        answer = node.call(GPU_CORE, method, raw)
        if method in ("GetPreferredAllocation", "Allocate", "PreStartContainer"):
            assert answer.code == INVALID and "unknown device ID 'gpu0-core-" in answer.details
        else:
            assert answer.code == OK


def test_100k_unknown_ids_are_refused_at_once(node: Target) -> None:
    """Reported: GetPreferredAllocation with 100k unknown IDs never finished (each unknown ID
    was its own device, and the device choice was quadratic). The deadline guards a hang."""
    unknown = [f"x{n}" for n in range(100_000)]
    answer = node.call(GPU_CORE, "GetPreferredAllocation", _preferred(unknown, [], 50_000), 60)
    assert answer.code == INVALID
    assert f"100000 device IDs in one call; at most {MAX_IDS_PER_REQUEST}" in answer.details
    # the bound is not the only guard: just under it, unknown IDs are named
    unknown = unknown[:MAX_IDS_PER_LIST]
    answer = node.call(GPU_CORE, "GetPreferredAllocation", _preferred(unknown, [], 20_000), 60)
    assert answer.code == INVALID and "unknown device ID 'x0'" in answer.details


def test_preferred_allocation_over_every_advertised_unit(node: Target) -> None:
    ids = node.ids(GPU_MEMORY)
    answer = node.call(GPU_MEMORY, "GetPreferredAllocation", _preferred(ids, ids[:5], len(ids)))
    assert answer.code == OK and answer.body is not None
    (chosen,) = pb.PreferredAllocationResponse.FromString(answer.body).container_responses
    assert sorted(chosen.deviceIDs) == sorted(ids)


def _bad_requests(core: list[str]) -> list[tuple[str, bytes, str]]:
    long_id = "g" * (MAX_ID_LENGTH + 1)
    gpu0 = core[0].split("::")[0]
    return [
        ("Allocate", _allocate([core[1], "GPU-9::1"]), "unknown device ID 'GPU-9::1'"),
        ("Allocate", _allocate([core[1], core[1]]), "appears more than once"),
        ("Allocate", _allocate([long_id]), f"longer than {MAX_ID_LENGTH} characters"),
        ("Allocate", _allocate([""]), "an empty device ID"),
        ("Allocate", _allocate([f"{gpu0}::\u0661"]), "unknown device ID"),
        ("Allocate", _allocate([f"{gpu0}::1\x00"]), "unknown device ID"),
        ("Allocate", _allocate([f"{gpu0}::01"]), "unknown device ID"),
        ("Allocate", _allocate(["gpu0-core-1"]), "unknown device ID 'gpu0-core-1'"),
        ("Allocate", _allocate(), "no container requests"),
        (
            "Allocate",
            _allocate(*[[i] for i in core[: MAX_CONTAINER_REQUESTS + 1]]),
            f"{MAX_CONTAINER_REQUESTS + 1} container requests",
        ),
        ("Allocate", _allocate(core * 41), f"at most {MAX_IDS_PER_LIST}"),
        ("Allocate", b"\x0a\x05\x0a\x03\xff\xfe\xfd", "not a valid AllocateRequest"),
        ("Allocate", b"\x0a\x7f\x0a", "not a valid AllocateRequest"),
        ("GetPreferredAllocation", _preferred(core, [], -1), "allocation_size -1 is negative"),
        ("GetPreferredAllocation", _preferred(core[:5], [core[9]], 3), "not among the available"),
        (
            "GetPreferredAllocation",
            _preferred(core[:1] * 25_000, [], 1, 3),
            "75000 device IDs in one call",
        ),
        ("GetPreferredAllocation", _preferred([], [], 1, 0), "no container requests"),
        (
            "PreStartContainer",
            pb.PreStartContainerRequest(devices_ids=["nope"]).SerializeToString(),
            "unknown device ID 'nope'",
        ),
        ("GetDevicePluginOptions", b"\x0a\x80", "not a valid Empty"),
        ("ListAndWatch", b"\xff", "not a valid Empty"),
    ]


def test_bad_requests_are_invalid_argument_and_change_nothing(node: Target) -> None:
    core = node.ids(GPU_CORE)
    for method, raw, reason in _bad_requests(core):
        before = node.accounting()
        answer = node.call(GPU_CORE, method, raw)
        assert answer.code == INVALID, (method, reason, answer)
        assert reason in answer.details and answer.details.startswith(method + ": ")
        assert len(answer.details) < 500  # an over-long ID is quoted cut short
        assert node.accounting() == before
    answer = node.call(GPU_CORE, "Allocate", _allocate(core[:3]))
    assert answer.code == OK


def test_a_message_over_the_limit_is_refused_by_grpc(node: Target) -> None:
    before = node.accounting()
    huge = _allocate(["a" * 1000] * (MAX_RECEIVE_MESSAGE_BYTES // 1000 + 1))
    assert len(huge) > MAX_RECEIVE_MESSAGE_BYTES
    answer = node.call(GPU_CORE, "Allocate", huge)
    assert answer.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert node.accounting() == before


def test_honest_calls_count_once_each(node: Target) -> None:
    core = node.ids(GPU_CORE)
    allocations = node.servers[GPU_CORE].servicer.allocations
    answer = node.call(GPU_CORE, "Allocate", _allocate(core[100:250]))
    assert answer.code == OK and answer.body is not None
    (container,) = pb.AllocateResponse.FromString(answer.body).container_responses
    gpu1, gpu2 = node.units[GPU_CORE].devices[1:3]
    assert container.annotations["tessera.dev/dp-units-gpu-core"] == f"{gpu1}:100,{gpu2}:50"
    assert node.servers[GPU_CORE].servicer.allocations == allocations + 1


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    method=st.sampled_from(METHODS),
    seed=st.integers(0, 2**32 - 1),
    mutations=st.integers(0, 4),
    resource=st.sampled_from([GPU_CORE, GPU_MEMORY, "tessera.dev/rdma"]),
)
def test_mutated_and_crafted_requests(
    node: Target, method: str, seed: int, mutations: int, resource: str
) -> None:
    rng = random.Random(seed)
    if mutations:
        raw = captured_requests(node.rename)[method]
        for _ in range(mutations):
            raw = mutate(raw, rng)
    else:
        raw = crafted(rng, method, node.ids(resource)).SerializeToString()
    tally = Tally("test")
    check(tally, node, resource, method, raw, "hypothesis")
    assert (tally.crashes, tally.server_errors, tally.forgeries) == (0, 0, 0), tally.examples


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ids=st.lists(st.text(max_size=70), max_size=20), known=st.integers(0, 5))
def test_arbitrary_unicode_ids(node: Target, ids: list[str], known: int) -> None:
    core = node.ids(GPU_CORE)
    raw = _allocate(core[:known] + ids)
    tally = Tally("test")
    check(tally, node, GPU_CORE, "Allocate", raw, "unicode")
    assert (tally.crashes, tally.server_errors, tally.forgeries) == (0, 0, 0), tally.examples


def test_hostile_id_lists_cover_the_kinds(node: Target) -> None:
    """The generator the fuzz run shares produces each kind of hostile list."""
    rng = random.Random(7)
    known = node.ids(GPU_CORE)
    lists = [hostile_ids(rng, known) for _ in range(400)]
    assert any(len(x) > MAX_IDS_PER_LIST for x in lists)
    assert any(len(x) != len(set(x)) for x in lists)
    assert any(any(i not in set(known) for i in x) for x in lists)
    assert any(x and set(x) <= set(known) and len(x) == len(set(x)) for x in lists)


def test_honest_calls_are_answered_during_a_flood_of_hostile_ones(node: Target) -> None:
    """Eight callers keep sending the largest refused requests and undecodable bytes while
    the kubelet's calls go on: each honest call gets its answer, each hostile one its
    refusal, and only the honest Allocates are counted."""
    core = node.ids(GPU_CORE)
    flood = [
        ("GetPreferredAllocation", _preferred([f"x{n}" for n in range(MAX_IDS_PER_LIST)], [], 9)),
        ("Allocate", _allocate(core * 40)),
        ("Allocate", b"\x0a\x05\x0a\x03\xff\xfe\xfd"),
    ]
    stop = threading.Event()
    codes: list[grpc.StatusCode] = []

    def hostile(i: int) -> None:
        method, raw = flood[i % len(flood)]
        while not stop.is_set():
            codes.append(node.call(GPU_CORE, method, raw, 60).code)

    allocations = node.servers[GPU_CORE].servicer.allocations
    threads = [threading.Thread(target=hostile, args=(i,), daemon=True) for i in range(8)]
    for thread in threads:
        thread.start()
    try:
        for n in range(20):
            answer = node.call(GPU_CORE, "Allocate", _allocate(core[n : n + 3]), 60)
            assert answer.code == OK, answer
            answer = node.call(GPU_CORE, "GetPreferredAllocation", _preferred(core, [], 150), 60)
            assert answer.code == OK, answer
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert codes and set(codes) <= {INVALID, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert node.servers[GPU_CORE].servicer.allocations == allocations + 20
