"""Record key files: load them, watch them for rotation, make new ones.

Only tessera-scheduler holds private keys; node agents hold public keys (docs/record.md):
- a file: one PEM key, private (PKCS#8) or public (SubjectPublicKeyInfo); its key ID is the
  file name without a trailing `.pem`;
- a directory (a mounted Kubernetes Secret): one PEM key per file, key ID as above. Hidden
  entries (`..data` and the timestamped directories of a Secret volume) are skipped. A
  private key also verifies. With several private keys a file `signing-key-id` names the one
  that signs; every public key verifies, which is how keys rotate.
Every problem is a one-line KeyFileError naming the file. The keys themselves (PEM,
fingerprints, key IDs) are tessera.record_keys; this module only reads and writes files.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from tessera.record import MIN_LEGACY_KEY_BYTES, Keyring
from tessera.record_keys import KeyFileError, parse_pem, private_pem, public_pem, valid_key_id

log = logging.getLogger(__name__)

SIGNING_ID_FILE: Final = "signing-key-id"
KEY_RELOAD_INTERVAL: Final = 10.0
"""Seconds between checks of the key files for a rotation. The kubelet itself takes about a
minute to project a changed Secret, so checking more often buys nothing."""
MAX_KEY_FILE_BYTES: Final = 16 * 1024
"""A PEM Ed25519 key is about 120 bytes; a larger file is not a key."""
MAX_KEY_FILES: Final = 64
"""Keys in one directory: rotation needs two or three at a time."""
Role = Literal["sign", "verify"]


def key_id_of(path: Path) -> str:
    return path.name.removesuffix(".pem")


def _read(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read key file: {exc.strerror}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"{path}: larger than {MAX_KEY_FILE_BYTES} bytes; not a key file")
    return data


def _key_files(directory: Path) -> list[Path]:
    try:
        entries = sorted(
            p
            for p in directory.iterdir()
            if not p.name.startswith(".") and p.name != SIGNING_ID_FILE and p.is_file()
        )
    except OSError as exc:
        raise KeyFileError(f"{directory}: cannot list the key directory: {exc.strerror}") from None
    if not entries:
        raise KeyFileError(f"{directory}: the key directory holds no key files")
    if len(entries) > MAX_KEY_FILES:
        raise KeyFileError(f"{directory}: more than {MAX_KEY_FILES} key files")
    return entries


def load_keyring(path: str | Path, role: Role = "verify") -> Keyring:
    """Read a key file or directory (module doc). `role` "sign" needs a private key to sign
    with (the scheduler); "verify" refuses private keys (a node must hold none)."""
    p = Path(path)
    if not p.exists():
        raise KeyFileError(f"{p}: key file or directory does not exist")
    files = _key_files(p) if p.is_dir() else [p]
    private: dict[str, Ed25519PrivateKey] = {}
    public: dict[str, Ed25519PublicKey] = {}
    for f in files:
        key_id = key_id_of(f)
        if not valid_key_id(key_id):
            raise KeyFileError(f"{f}: {key_id!r} is not a usable key ID ([A-Za-z0-9._-])")
        if key_id in public:
            raise KeyFileError(f"{f}: a second file for key ID {key_id!r}")
        key = parse_pem(str(f), _read(f))
        if isinstance(key, Ed25519PrivateKey):
            if role == "verify":
                raise KeyFileError(
                    f"{f}: is a private key; nodes get only public keys "
                    "(tessera-keys public turns a private key file into its public key)"
                )
            private[key_id] = key
            public[key_id] = key.public_key()
        else:
            public[key_id] = key
    signing = _signing_id(p, private, public) if role == "sign" else None
    return Keyring(public, (signing, private[signing]) if signing else None)


def _signing_id(
    directory: Path, private: Mapping[str, object], public: Mapping[str, object]
) -> str:
    marker = directory / SIGNING_ID_FILE
    if directory.is_dir() and marker.is_file():
        named = _read(marker).decode(errors="replace").strip()
        if named in private:
            return named
        if named in public:
            raise KeyFileError(
                f"{marker}: names key {named!r}, but {directory} holds only its public key"
            )
        raise KeyFileError(f"{marker}: names key {named!r}, which is not in {directory}")
    if not private:
        raise KeyFileError(f"{directory}: holds no private key to sign records with")
    if len(private) > 1:
        raise KeyFileError(
            f"{directory}: holds {len(private)} private keys; a file {SIGNING_ID_FILE} must "
            "name the one that signs"
        )
    return next(iter(private))


def load_legacy_hmac_keys(path: str | Path) -> dict[str, bytes]:
    """HMAC keys of releases before Ed25519 (a file: key ID "default"; a directory: one per
    file, ID = file name). Only tessera-scheduler reads them, to trust old records once."""
    p = Path(path)
    if not p.exists():
        raise KeyFileError(f"{p}: legacy HMAC key file does not exist")
    files = _key_files(p) if p.is_dir() else [p]
    keys: dict[str, bytes] = {}
    for f in files:
        key = _read(f).strip()
        if len(key) < MIN_LEGACY_KEY_BYTES:
            raise KeyFileError(
                f"{f}: legacy HMAC key is {len(key)} bytes; they were at least "
                f"{MIN_LEGACY_KEY_BYTES}"
            )
        keys[f.name if p.is_dir() else "default"] = key
    return keys


# --- rotation --------------------------------------------------------------------------------


def _stamp(path: Path) -> tuple[object, ...]:
    """What changes when the key files change: Kubernetes swaps a Secret volume's `..data`
    link atomically, which changes the inode each visible entry resolves to."""
    entries = [path] if not path.is_dir() else [path / n for n in sorted(os.listdir(path))]
    stamp: list[object] = []
    for e in entries:
        try:
            st = e.stat()
        except OSError:
            stamp.append((e.name, None))
            continue
        stamp.append((e.name, st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(stamp)


@dataclass
class _Loaded:
    keyring: Keyring | None
    stamp: tuple[object, ...] = ()


class KeyringSource:
    """The current keyring, re-read when its files change (checked at most every `interval`
    seconds), so a rotated Secret takes effect without a restart. A failed re-read keeps the
    last good keys and logs the problem once. Used by the scheduler (role "sign") and the NRI
    hook (role "verify"). Concurrent get() calls may both re-read; each then installs a whole
    keyring, so the race is harmless."""

    def __init__(
        self,
        path: str | Path | None,
        role: Role = "verify",
        interval: float = KEY_RELOAD_INTERVAL,
        legacy_hmac: dict[str, bytes] | None = None,
    ) -> None:
        self.path = Path(path) if path else None
        self.role: Role = role
        self.interval = interval
        self.legacy_hmac = legacy_hmac or {}
        self._checked_at = float("-inf")
        self._last_error = ""
        self._loaded = _Loaded(None)
        if self.path is not None:
            self._loaded = self._load()  # fail fast at start-up
            self._checked_at = time.monotonic()

    @classmethod
    def fixed(cls, keyring: Keyring | None) -> KeyringSource:
        source = cls(None)
        source._loaded = _Loaded(keyring)
        return source

    def _load(self) -> _Loaded:
        assert self.path is not None
        try:
            stamp = _stamp(self.path)
        except OSError as exc:
            raise KeyFileError(f"{self.path}: cannot read: {exc.strerror}") from None
        ring = load_keyring(self.path, self.role)
        if self.legacy_hmac:
            ring = ring.with_legacy_hmac(self.legacy_hmac)
        return _Loaded(ring, stamp)

    def get(self) -> Keyring | None:
        if self.path is None or time.monotonic() - self._checked_at < self.interval:
            return self._loaded.keyring
        self._checked_at = time.monotonic()
        try:
            if _stamp(self.path) == self._loaded.stamp:
                return self._loaded.keyring
            self._loaded = self._load()
            if self._last_error:
                log.info("record keys in %s are usable again", self.path)
            self._last_error = ""
            log.info("record keys reloaded from %s: %s", self.path, describe(self._loaded))
        except (KeyFileError, OSError) as exc:
            if str(exc) != self._last_error:
                log.error("cannot reload the record keys, keeping the previous ones: %s", exc)
                self._last_error = str(exc)
        return self._loaded.keyring


def describe(loaded: _Loaded) -> str:
    ring = loaded.keyring
    if ring is None:
        return "none"
    signs = f"signs with {ring.signing_id}, " if ring.signing_id else ""
    return f"{signs}verifies {', '.join(ring.key_ids)}"


# --- making keys ---------------------------------------------------------------------------


def generate_key_files(out: str | Path, key_id: str) -> tuple[Path, Path]:
    """Write out/private/<id>.pem (mode 0600) and out/public/<id>.pem; never overwrite.
    The first private key in out/private is also named in out/private/signing-key-id."""
    if not valid_key_id(key_id):
        raise KeyFileError(f"{key_id!r} is not a usable key ID (letters, digits, '.', '_', '-')")
    root = Path(out)
    private_dir, public_dir = root / "private", root / "public"
    private_file, public_file = private_dir / f"{key_id}.pem", public_dir / f"{key_id}.pem"
    for f in (private_file, public_file):
        if f.exists():
            raise KeyFileError(f"{f}: already exists; choose another --key-id")
    key = Ed25519PrivateKey.generate()
    try:
        private_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        public_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(private_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out_file:
            out_file.write(private_pem(key))
        public_file.write_bytes(public_pem(key.public_key()))
        marker = private_dir / SIGNING_ID_FILE
        if not marker.exists():
            marker.write_text(key_id + "\n")
    except OSError as exc:
        raise KeyFileError(f"{root}: cannot write keys: {exc.strerror}") from None
    return private_file, public_file


def public_key_of(path: str | Path) -> Ed25519PublicKey:
    """The public key of a private key file (or of a public key file, unchanged)."""
    p = Path(path)
    key = parse_pem(str(p), _read(p))
    return key.public_key() if isinstance(key, Ed25519PrivateKey) else key
