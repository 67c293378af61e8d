"""Ed25519 record keys as bytes: PEM in and out, fingerprints, the key ID rule.

Pure: the key files themselves (a file, or a mounted Secret directory; rotation) are read by
tessera_edge.keyfiles, which hands the bytes of each file here. The PEM loaders come from
cryptography's `serialization.base`: the package's `__init__` also imports the SSH key
formats, which the node agent defers (deviceplugin/__init__.py).
"""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Final

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization.base import (
    load_pem_private_key,
    load_pem_public_key,
)

from tessera.errors import InputError

PLACEHOLDER_FINGERPRINTS: Final = frozenset({"SHA256:sNeoALxZGu+8MbHWsm0bv+eNqc65dLfFMaYgSiaBoXY"})
"""The example key pair shipped in deploy/ (its private half is public knowledge): refused
wherever it is found, so an install cannot run on it by mistake."""
_KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
"""Secret keys are [-._a-zA-Z0-9]{1,253}; a leading dot would be a hidden file."""


class KeyFileError(InputError, ValueError):
    """A key file or directory cannot be used; the message names the file and the fix."""


def valid_key_id(key_id: str) -> bool:
    return _KEY_ID.match(key_id) is not None


def fingerprint(key: Ed25519PublicKey) -> str:
    """SHA256:<base64 of SHA-256 over the raw public key>, as ssh-keygen shows keys."""
    raw = key.public_bytes_raw()
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


def parse_pem(source: str, data: bytes) -> Ed25519PrivateKey | Ed25519PublicKey:
    """The Ed25519 key in PEM `data` (private PKCS#8 or public SubjectPublicKeyInfo);
    KeyFileError names `source` (the file the bytes came from) and the fix."""
    text = data.strip()
    if not text.startswith(b"-----BEGIN "):
        raise KeyFileError(
            f"{source}: not a PEM key (an HMAC key from an older release? it goes to the "
            "scheduler's --legacy-hmac-key-file; make record keys with tessera-keys generate)"
        )
    try:
        if b"PRIVATE KEY-----" in text.split(b"\n", 1)[0]:
            key: object = load_pem_private_key(text, password=None)
        else:
            key = load_pem_public_key(text)
    except TypeError:
        raise KeyFileError(
            f"{source}: the private key is encrypted; store it unencrypted"
        ) from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "cannot be parsed"
        raise KeyFileError(f"{source}: malformed PEM key: {reason}") from None
    if not isinstance(key, Ed25519PrivateKey | Ed25519PublicKey):
        kind = type(key).__name__.removeprefix("_").replace("PrivateKey", " private key")
        kind = kind.replace("PublicKey", " public key")
        raise KeyFileError(f"{source}: is a {kind}; tessera record keys are Ed25519")
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    if fingerprint(public) in PLACEHOLDER_FINGERPRINTS:
        raise KeyFileError(
            f"{source}: is the example key shipped with tessera, which anyone can sign with; "
            "make your own with tessera-keys generate (see deploy/README.md)"
        )
    return key


def private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
