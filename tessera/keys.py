"""Loading the integrity keys that sign and verify allocation records.

The key material comes from a Kubernetes Secret mounted as files, shared by the scheduler
(which signs) and the node agents (which verify):
- a file: one key, id "default";
- a directory: one key per file, id = file name; the key named in a file called
  `signing-key-id` signs (else the first by name); all verify, which allows rotation.
Hidden files (Secret volumes contain `..data` links) are skipped. Surrounding whitespace
is stripped, so a key written with `echo` works.
"""

from __future__ import annotations

from pathlib import Path

from tessera.record import MIN_KEY_BYTES, Keyring

SIGNING_ID_FILE = "signing-key-id"


class KeyFileError(ValueError):
    pass


def _read_key(path: Path) -> bytes:
    try:
        key = path.read_bytes().strip()
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read integrity key: {exc.strerror}") from None
    if len(key) < MIN_KEY_BYTES:
        raise KeyFileError(
            f"{path}: integrity key is {len(key)} bytes; use at least {MIN_KEY_BYTES}"
        )
    return key


def load_keyring(path: str | Path) -> Keyring:
    """Read a key file or key directory (see module doc). Raises KeyFileError."""
    p = Path(path)
    if p.is_dir():
        files = sorted(
            f
            for f in p.iterdir()
            if not f.name.startswith(".") and f.name != SIGNING_ID_FILE and f.is_file()
        )
        if not files:
            raise KeyFileError(f"{p}: the integrity key directory holds no key files")
        keys = {f.name: _read_key(f) for f in files}
        marker = p / SIGNING_ID_FILE
        if marker.is_file():
            signing = marker.read_text().strip()
            if signing not in keys:
                raise KeyFileError(f"{marker}: names key {signing!r}, which is not in {p}")
            keys = {signing: keys[signing]} | {k: v for k, v in keys.items() if k != signing}
        return Keyring(keys)
    if not p.exists():
        raise KeyFileError(f"{p}: integrity key file does not exist")
    return Keyring.single(_read_key(p))
