"""Record key pairs for tests: a Keyring and its PEM files as a Secret would hold them."""

from __future__ import annotations

from pathlib import Path

from tessera.record import Keyring
from tessera.record_keys import private_pem, public_pem


def write_public(ring: Keyring, directory: Path) -> Path:
    """The verification keys of `ring`, one `<id>.pem` each (what nodes mount)."""
    directory.mkdir(parents=True, exist_ok=True)
    for key_id in ring.key_ids:
        key = ring.public_key(key_id)
        assert key is not None
        (directory / f"{key_id}.pem").write_bytes(public_pem(key))
    return directory


def write_private(ring: Keyring, directory: Path) -> Path:
    """The signing key of `ring` as `<id>.pem` (what the scheduler mounts)."""
    assert ring.signing_id is not None and ring.signing_key is not None
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{ring.signing_id}.pem").write_bytes(private_pem(ring.signing_key))
    return directory
