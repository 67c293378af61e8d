"""Hostile bytes on the NRI socket, sent to the running plugin as containerd would send
them (fuzz/surface_nri.py is the harness; `make fuzz` runs it at length).

After every input the plugin must still serve a valid CreateContainer on a fresh
connection, must never answer client bytes with UNKNOWN or INTERNAL, never grant a device
without a signed record, and must not keep tasks or buffers from the connections it lost.
"""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.common import Tally
from fuzz.surface_nri import (
    GENERATORS,
    Attack,
    Target,
    hit,
    mux_attack,
    nri_attack,
    start_target,
    trunk_attack,
    ttrpc_attack,
)
from nri_hook.mux import MAX_PAYLOAD, encode_frames
from tessera_ttrpc import MAX_DATA_LEN

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _clean(tally: Tally) -> None:
    assert (tally.crashes, tally.server_errors, tally.forgeries) == (0, 0, 0), tally.examples


def _against_plugin(body: Callable[[Target, Tally], Awaitable[None]]) -> Tally:
    async def go() -> Tally:
        tally = Tally("nri")
        target = await start_target()
        try:
            await body(target, tally)
        finally:
            await target.close()
        return tally

    return asyncio.run(asyncio.wait_for(go(), 60))


def _one(attack: Attack) -> None:
    async def body(target: Target, tally: Tally) -> None:
        await hit(target, attack, tally)

    _clean(_against_plugin(body))


@pytest.mark.parametrize(
    "attack",
    [trunk_attack, nri_attack, ttrpc_attack, mux_attack],
    ids=["mutated captured sessions", "mutated NRI requests", "crafted ttrpc", "crafted mux"],
)
@FAST
@given(seed=st.integers(0, 2**32))
def test_attacks_of_each_kind(attack: Callable[[random.Random], Attack], seed: int) -> None:
    _one(attack(random.Random(seed)))


MUX_FRAME = st.tuples(
    st.sampled_from([0, 1, 2, 3, 2**32 - 1]),
    st.one_of(st.none(), st.sampled_from([0, 1, MAX_PAYLOAD, MAX_PAYLOAD + 1, 2**32 - 1])),
    st.binary(max_size=64),
)
TTRPC_HEADER = st.builds(
    lambda length, stream_id, msg_type, flags, data: (
        struct.pack(">IIBB", length, stream_id, msg_type, flags) + data
    ),
    st.sampled_from([0, 2, 10, MAX_DATA_LEN, MAX_DATA_LEN + 1, 2**32 - 1]),
    st.sampled_from([0, 1, 2, 3, 2**31 - 1, 2**32 - 1]),
    st.integers(0, 255),
    st.integers(0, 255),
    st.binary(max_size=32),
)


@FAST
@given(st.lists(st.one_of(MUX_FRAME, TTRPC_HEADER), min_size=1, max_size=6))
def test_any_mix_of_crafted_headers(parts: list[tuple[int, int | None, bytes] | bytes]) -> None:
    """Mux frames with a declared length that lies (None: honest), and ttrpc headers in
    honest mux frames on connection 1, in any order."""
    wire = b""
    for part in parts:
        if isinstance(part, bytes):
            wire += encode_frames(1, part)
        else:
            conn_id, declared, payload = part
            length = len(payload) if declared is None else declared
            wire += struct.pack(">II", conn_id, length) + payload
    _one(Attack("mixed", wire))


def test_the_plugin_keeps_nothing_from_the_connections_it_lost() -> None:
    """Many inputs against one plugin: afterwards no task, buffer or pod state of theirs
    is left (the count of tasks is back to where it started)."""

    async def body(target: Target, tally: Tally) -> None:
        rng = random.Random(1234)
        await hit(target, Attack("none", b""), tally)
        baseline = len(asyncio.all_tasks())
        for _ in range(60):
            await hit(target, rng.choice(GENERATORS)(rng), tally)
        await asyncio.sleep(0.05)
        assert len(asyncio.all_tasks()) <= baseline
        assert len(target.enforcer.injected) <= 1  # liveness containers, never stopped
        assert len(target.enforcer.pod_netdevs) == 0
        assert len(target.enforcer._warned) <= 4096

    _clean(_against_plugin(body))
