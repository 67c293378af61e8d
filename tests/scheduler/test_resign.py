"""Upgrade from HMAC records (docs/record.md): with the old key the scheduler trusts old
records while rebuilding and re-signs each running pod's record with Ed25519, once."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path

from scheduler_plugin.service import Service
from tessera import resources as rn
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.record import decode, encode, signature_algorithm, to_document
from tessera_edge.keyfiles import KeyringSource
from tessera_testbed.apiserver import FakeApiServer
from tests.keyfiles import write_private
from tests.scheduler.helpers import KEYRING, Served, client_for, options, pod, populate, wait_for

OLD_KEY = b"the-integrity-key-of-an-older-release"


def hmac_record(alloc: PodAllocation, key: bytes) -> str:
    """A record as releases before Ed25519 wrote it."""
    doc = to_document(alloc)
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    mac = base64.b64encode(hmac.new(key, body, hashlib.sha256).digest()).decode()
    doc["integrity"] = {"alg": "HMAC-SHA256", "keyId": "default", "mac": mac}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def old_pod(fake: FakeApiServer, name: str, key: bytes, core: int = 40) -> PodAllocation:
    created = fake.create("pods", pod(name, {rn.GPU: core}))
    alloc = PodAllocation(
        created["metadata"]["uid"],
        "default",
        name,
        "n",
        (ContainerAllocation("main", (GpuGrant("GPU-n-0", 0, 0, core, 81920 * core // 100),)),),
    )
    text = hmac_record(alloc, key)
    fake.patch("pods", name, {"metadata": {"annotations": {rn.ALLOCATION_ANNOTATION: text}}})
    fake.bind("default", name, {"target": {"name": "n"}})
    fake.patch("pods", name, {"status": {"phase": "Running"}}, sub="status")
    return alloc


def record_of(fake: FakeApiServer, name: str) -> str:
    return str(fake.get("pods", name)["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION])


def test_old_records_count_and_are_re_signed_once_with_the_legacy_key(
    fake: FakeApiServer, tmp_path: Path
) -> None:
    populate(fake, ["n"], gpus=1)
    good = old_pod(fake, "old", OLD_KEY)
    old_pod(fake, "forged", b"an-attacker-key-of-sufficient-size")
    keys = KeyringSource(
        write_private(KEYRING, tmp_path / "keys"), "sign", legacy_hmac={"default": OLD_KEY}
    )
    service = Service(options(), client_for(fake), keys).start()
    served = Served.over(fake, service)
    try:
        assert service.wait_ready(10)
        assert served.used_core("n") == 40  # the valid old record holds its devices
        wait_for(lambda: signature_algorithm(record_of(fake, "old")) == "Ed25519")
        # the new record verifies on a node, which holds only public keys
        assert decode(record_of(fake, "old"), KEYRING.verifier()) == good
        assert signature_algorithm(record_of(fake, "forged")) == "HMAC-SHA256"
        assert "default/forged" in service.cache.problems.invalid_records()
        assert served.used_core("n") == 40
    finally:
        service.stop()


def test_without_the_legacy_key_old_records_are_untrusted(fake: FakeApiServer) -> None:
    populate(fake, ["n"], gpus=1)
    old_pod(fake, "old", OLD_KEY)
    service = Service(options(), client_for(fake), KEYRING).start()
    try:
        assert service.wait_ready(10)
        problems = wait_for(service.cache.problems.invalid_records)
        assert "default/old" in problems
        assert Served.over(fake, service).used_core("n") == 0
        assert signature_algorithm(record_of(fake, "old")) == "HMAC-SHA256"
    finally:
        service.stop()


def test_a_re_signed_record_is_what_the_scheduler_would_write() -> None:
    alloc = PodAllocation("u", "default", "x", "n", (ContainerAllocation("main"),))
    assert decode(hmac_record(alloc, OLD_KEY), KEYRING.with_legacy_hmac({"default": OLD_KEY}))
    assert signature_algorithm(encode(alloc, KEYRING)) == "Ed25519"
