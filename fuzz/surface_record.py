"""The allocation record as a node verifies it: signed records mutated at random, and
crafted ones (another key, another pod, HMAC with a guessed key, spliced signatures, parser
tricks), through tessera.record.decode with the node's public keys and the pod/node binding.

A crash is any exception but RecordError, or a decode slower than SLOW_SECONDS; a forgery is
an accepted record whose allocation is not exactly the one the scheduler signed for that pod.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
from typing import Any, Final

from fuzz.common import INTERESTING, Tally, mutate, watched
from tessera import record
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation, RdmaGrant, VfGrant
from tessera.errors import RecordError

SLOW_SECONDS: Final = 1.0
"""A record is at most 64 KiB; any decode slower than this is a hang in the making."""

SIGNER = record.Keyring.generate("k1")
NODE_KEYS = SIGNER.verifier()
ATTACKER = record.Keyring.generate("k1")  # same key ID, another key


def _allocation(rng: random.Random, i: int) -> PodAllocation:
    gpus = tuple(
        GpuGrant(f"GPU-{i}-{g}", g, g, rng.choice([0, 25, 50, 100]), rng.randrange(1, 81920))
        for g in range(rng.randrange(0, 4))
    )
    rdma = tuple(
        RdmaGrant(
            f"0000:{r + 12:02x}:00.0",
            f"mlx5_{r}",
            r,
            rng.randrange(1, 101),
            (VfGrant(f"0000:{r + 12:02x}:00.1", f"mlx5_{r + 8}", r + 8, "ib0v0"),),
        )
        for r in range(rng.randrange(0, 2))
    )
    return PodAllocation(
        f"uid-{i:04d}-{rng.getrandbits(32):08x}",
        "team",
        f"pod-{i}",
        f"node-{i % 3}",
        (ContainerAllocation("main", gpus, rdma), ContainerAllocation("side", gpus[:1])),
        cpu_milli=rng.randrange(0, 64000),
    )


def _doc(text: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(text)
    return doc


def _dump(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _crafted(rng: random.Random, alloc: PodAllocation, other: PodAllocation) -> bytes:
    signed = _doc(record.encode(alloc, SIGNER))
    attack = rng.randrange(10)
    if attack == 0:  # another key with the same key ID
        return record.encode(other, ATTACKER).encode()
    if attack == 1:  # a genuine record of another pod, presented for this one
        return record.encode(other, SIGNER).encode()
    if attack == 2:  # this pod's signature over another pod's allocation
        doc = _doc(record.encode(other, SIGNER))
        doc.update({k: signed[k] for k in ("podUID", "namespace", "pod", "node")})
        doc["integrity"] = signed["integrity"]
        return _dump(doc)
    if attack == 3:  # downgrade to HMAC with a guessed key
        doc = _doc(record.encode(alloc))
        body = _dump(doc)
        key = rng.choice([b"", b"default", b"0" * 32, b"tessera" * 4])
        mac = base64.b64encode(hmac.new(key, body, hashlib.sha256).digest()).decode()
        doc["integrity"] = {"alg": "HMAC-SHA256", "keyId": "default", "mac": mac}
        return _dump(doc)
    if attack == 4:  # no signature, or a made-up algorithm
        doc = dict(signed)
        doc["integrity"] = rng.choice(
            [None, {}, {"alg": "none"}, {"alg": "Ed25519", "keyId": "k1", "sig": ""}]
        )
        return _dump(doc)
    if attack == 5:  # a grown grant, same signature
        doc = _doc(record.encode(alloc, SIGNER))
        for c in doc["containers"]:
            for g in c.get("gpus", []):
                g["core"] = 100
        return _dump(doc)
    if attack == 6:  # duplicate keys: a parser that kept the first would see the forgery
        text = record.encode(alloc, SIGNER)
        return text.replace('{"containers":', '{"node":"evil-node","containers":', 1).encode()
    if attack == 7:  # signature bytes flipped, re-encoded, padded or in URL-safe base64
        sig = base64.b64decode(signed["integrity"]["sig"])
        variants = [
            base64.b64encode(bytes([sig[0] ^ 1]) + sig[1:]).decode(),
            base64.urlsafe_b64encode(sig).decode(),
            signed["integrity"]["sig"] + "==",
            " " + signed["integrity"]["sig"],
            base64.b64encode(sig + b"\x00").decode(),
        ]
        signed["integrity"]["sig"] = rng.choice(variants)
        return _dump(signed)
    if attack == 8:  # hostile structure in or around the proof
        return rng.choice(
            [
                b"[" * rng.randrange(10, 100_000),
                b'{"v":1,"integrity":' * 500,
                _dump(signed)[:-1] + b',"integrity":{"alg":"Ed25519"}}',
                _dump(signed).replace(b'"keyId":"k1"', b'"keyId":"\\u00e9"'),
                _dump(signed).replace(b'"v":1', b'"v":1e999999'),
                _dump(signed).replace(b'"cpuMilli":', b'"cpuMilli":' + b"9" * 5000 + b","),
            ]
        )
    return mutate(_dump(signed), rng) + rng.choice(INTERESTING)


def run(n: int, seed: int) -> Tally:
    rng = random.Random(seed)
    tally = Tally("record")
    pool = [_allocation(rng, i) for i in range(64)]
    texts = [record.encode(a, SIGNER).encode() for a in pool]
    for _ in range(n):
        i = rng.randrange(len(pool))
        alloc = pool[i]
        if rng.random() < 0.5:
            data = texts[i]
            for _ in range(rng.randrange(1, 5)):
                data = mutate(data, rng)
        else:
            data = _crafted(rng, alloc, pool[(i + 1 + rng.randrange(len(pool) - 1)) % len(pool)])
        _check(tally, data, alloc)
    return tally


def _check(tally: Tally, data: bytes, alloc: PodAllocation) -> None:
    got = None
    with watched(tally, data, SLOW_SECONDS):
        try:
            got = record.decode(
                data,
                NODE_KEYS,
                pod_uid=alloc.pod_uid,
                node=alloc.node,
                namespace=alloc.namespace,
                name=alloc.name,
            )
        except RecordError:
            got = None  # refused: what a forged or broken record must get
    if got is not None and got != alloc:
        tally.fail("forgeries", f"accepted a record granting {got} on {data[:120]!r}")
