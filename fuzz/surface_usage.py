"""The usage report a node agent writes on its heartbeat Lease, as the scheduler's page and
kubectl tessera read it (tessera.usage.decode_usage), and the cgroup text the agent reads
for every GPU process (deviceplugin.cgroups.container_of), where a container may name the
cgroups it makes below its own: mutated valid reports and crafted ones (deep nesting, huge
numbers and lists, wrong shapes, overlong strings), and cgroup files with look-alike pod
and container segments.

A crash is any exception but UsageError from the decoder, any exception from the cgroup
parser, a cgroup path whose first pod segment is not the one the parser names (a container
must not pass for another by the cgroups it makes), or a parse slower than SLOW_SECONDS.
"""

from __future__ import annotations

import json
import random
import uuid
from typing import Final

from deviceplugin.cgroups import container_of
from fuzz.common import INTERESTING, Tally, mutate, watched
from tessera.usage import (
    ContainerUsage,
    NodeUsage,
    UnattributedUsage,
    UsageError,
    decode_usage,
    encode_usage,
)

SLOW_SECONDS: Final = 1.0
"""A report is at most 64 KiB; any decode slower than this is a hang in the making."""

CRAFTED: list[str] = [
    "[" * 100_000,
    '{"v":1,"at":"x","c":' + "[" * 50 + "]" * 50 + "}",
    '{"v":1,"at":"x","c":[' + ",".join(['["u","n","p","c","g",1,1]'] * 600) + "]}",
    '{"v":1,"at":"x","c":[["u","n","p","c","g",' + "9" * 5000 + ",1]]}",
    '{"v":1,"at":"x","c":[["u","n","p","c","g",1e999,1]]}',
    '{"v":1,"at":"x","c":[["u","n","p","c","g",NaN,1]]}',
    '{"v":1,"at":"x","c":[["u","n","p","c","g",true,1]]}',
    '{"v":1,"at":"x","o":[["g","root",1,1]]}',
    '{"v":1,"at":"' + "a" * 300 + '"}',
    '{"v":2,"at":"x"}',
    '{"v":1}',
    "",
    "null",
    '"v"',
    "\ud800",
]


def _valid(rng: random.Random) -> str:
    rows = [
        ContainerUsage(
            str(uuid.UUID(int=rng.getrandbits(128))),
            "ml",
            f"job-{i}",
            "main",
            f"GPU-{uuid.UUID(int=rng.getrandbits(128))}",
            rng.randrange(0, 1 << 20),
            rng.choice([None, rng.randrange(0, 101)]),
        )
        for i in range(rng.randrange(0, 20))
    ]
    other = [UnattributedUsage("GPU-x", "host", rng.randrange(0, 1 << 20), 1)]
    return encode_usage(NodeUsage("2026-11-27T14:10:03Z", tuple(rows), tuple(other)))


def _report(rng: random.Random, tally: Tally) -> None:
    if rng.random() < 0.2:
        text = rng.choice(CRAFTED)
    else:
        raw = _valid(rng).encode()
        for _ in range(rng.randrange(1, 4)):
            raw = mutate(raw, rng) if rng.random() < 0.8 else raw + rng.choice(INTERESTING)
        text = raw.decode("utf-8", errors="replace")
    with watched(tally, text, SLOW_SECONDS):
        try:
            decoded = decode_usage(text)
        except UsageError:
            return
        json.dumps(encode_usage(decoded))  # what was accepted encodes again


def _cgroup(rng: random.Random, tally: Tally) -> None:
    real = uuid.UUID(int=rng.getrandbits(128))
    fake = uuid.UUID(int=rng.getrandbits(128))
    cid = f"{rng.getrandbits(256):064x}"
    path = (
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
        f"{str(real).replace('-', '_')}.slice/cri-containerd-{cid}.scope"
    )
    # what the container may make below its own: a look-alike pod and container
    below = f"/kubepods-pod{str(fake).replace('-', '_')}.slice/docker-{'f' * 64}.scope"
    text = f"0::{path}{below if rng.random() < 0.5 else ''}\n"
    if rng.random() < 0.5:
        raw = mutate(text.encode(), rng)
        text = raw.decode("utf-8", errors="replace")
    with watched(tally, text, SLOW_SECONDS):
        ref = container_of(text)
        # the kubelet's and the runtime's own segments, as the kernel shows them, come first
        if ref is not None and ref.pod_uid == str(fake) and path in text:
            tally.fail("crashes", f"a nested look-alike passed for the container: {text!r}")


def run(n: int, seed: int) -> Tally:
    rng = random.Random(seed)
    tally = Tally("usage")
    for i in range(n):
        (_report if i % 2 == 0 else _cgroup)(rng, tally)
    return tally
