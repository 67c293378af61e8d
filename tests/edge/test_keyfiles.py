"""Record key files: loading, refusals, rotation through a Secret volume, tessera-keys."""

import contextlib
import logging
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera import record
from tessera.errors import IntegrityError, TesseraError
from tessera.record_keys import KeyFileError, private_pem, public_pem
from tessera_edge import keys_cli
from tessera_edge.keyfiles import KeyringSource, generate_key_files, load_keyring
from tests.core.test_record import ALLOC

ROOT = Path(__file__).resolve().parents[2]


def pair(tmp_path: Path, key_id: str = "k1") -> tuple[Path, Path]:
    private, public = generate_key_files(tmp_path / "keys", key_id)
    return private, public


def test_generate_writes_a_pair_that_signs_and_verifies(tmp_path: Path) -> None:
    private, public = pair(tmp_path)
    assert private == tmp_path / "keys" / "private" / "k1.pem"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert (private.parent / "signing-key-id").read_text().strip() == "k1"
    scheduler = load_keyring(private.parent, "sign")
    node = load_keyring(public.parent)
    assert scheduler.signing_id == "k1" and node.signing_id is None
    assert record.decode(record.encode(ALLOC, scheduler), node) == ALLOC
    # a single file works too; its key ID is the file name without .pem
    assert load_keyring(public).key_ids == ("k1",)
    assert load_keyring(private, "sign").signing_id == "k1"


def test_generate_never_overwrites(tmp_path: Path) -> None:
    pair(tmp_path)
    with pytest.raises(KeyFileError, match="already exists"):
        pair(tmp_path)
    with pytest.raises(KeyFileError, match="not a usable key ID"):
        generate_key_files(tmp_path / "keys", "../evil")


def test_secret_volume_hidden_entries_are_skipped(tmp_path: Path) -> None:
    _, public = pair(tmp_path)
    (public.parent / "..data").mkdir()
    (public.parent / "..2026_01_01_00_00_00.1").mkdir()
    assert load_keyring(public.parent).key_ids == ("k1",)


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"s" * 32 + b"\n", "not a PEM key"),
        (b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", "malformed PEM"),
        (b"-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n", "malformed PEM"),
        (b"", "not a PEM key"),
        (b"x" * 20_000, "larger than"),
    ],
)
def test_bad_key_files_are_refused_in_one_line(tmp_path: Path, data: bytes, needle: str) -> None:
    f = _write(tmp_path / "d" / "k1", data)
    with pytest.raises(KeyFileError, match=needle) as info:
        load_keyring(f.parent)
    assert "\n" not in str(info.value) and str(f) in str(info.value)
    assert isinstance(info.value, TesseraError)


@pytest.mark.parametrize(
    "key",
    [rsa.generate_private_key(65537, 2048), ec.generate_private_key(ec.SECP256R1())],
    ids=["rsa", "ec"],
)
def test_keys_of_another_type_are_refused(
    tmp_path: Path, key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
) -> None:
    pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(KeyFileError, match="record keys are Ed25519"):
        load_keyring(_write(tmp_path / "k1.pem", pem))
    priv = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(KeyFileError, match="record keys are Ed25519"):
        load_keyring(_write(tmp_path / "k2.pem", priv), "sign")


def test_encrypted_private_keys_are_refused(tmp_path: Path) -> None:
    ring = record.Keyring.generate("k1")
    assert ring.signing_key is not None
    pem = ring.signing_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    with pytest.raises(KeyFileError, match="encrypted"):
        load_keyring(_write(tmp_path / "k1.pem", pem), "sign")


@pytest.mark.parametrize(
    "path",
    [
        "deploy/scheduler/record-signing-secret.example.yaml",
        "deploy/nri-hook/record-verify-secret.example.yaml",
    ],
)
def test_the_shipped_example_keys_are_refused(tmp_path: Path, path: str) -> None:
    import yaml

    secret = yaml.safe_load((ROOT / path).read_text())
    for name, text in secret["stringData"].items():
        if name == "signing-key-id":
            continue
        f = _write(tmp_path / name, text.encode())
        with pytest.raises(KeyFileError, match="example key"):
            load_keyring(f, "sign")


def test_nodes_refuse_private_keys(tmp_path: Path) -> None:
    private, _ = pair(tmp_path)
    with pytest.raises(KeyFileError, match="nodes get only public keys"):
        load_keyring(private.parent)


def test_directory_problems(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="does not exist"):
        load_keyring(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "..data").mkdir()
    with pytest.raises(KeyFileError, match="no key files"):
        load_keyring(empty)
    private, public = pair(tmp_path)
    with pytest.raises(KeyFileError, match="no private key"):
        load_keyring(public.parent, "sign")
    generate_key_files(tmp_path / "keys", "k2")
    (private.parent / "signing-key-id").write_text("zz\n")
    with pytest.raises(KeyFileError, match="names key 'zz'"):
        load_keyring(private.parent, "sign")
    (private.parent / "signing-key-id").unlink()
    with pytest.raises(KeyFileError, match="must name the one that signs"):
        load_keyring(private.parent, "sign")
    (private.parent / "k2.pem").unlink()
    _write(private.parent / "k2.pem", (public.parent / "k2.pem").read_bytes())
    (private.parent / "signing-key-id").write_text("k2")
    with pytest.raises(KeyFileError, match="holds only its public key"):
        load_keyring(private.parent, "sign")
    _write(public.parent / "k1", (public.parent / "k1.pem").read_bytes())
    with pytest.raises(KeyFileError, match="a second file for key ID 'k1'"):
        load_keyring(public.parent)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_in_a_key_file_are_a_key_file_error(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    f = tmp_path_factory.mktemp("k") / "k1.pem"
    f.write_bytes(b"-----BEGIN PUBLIC KEY-----\n" + data if data[:1] == b"M" else data)
    with contextlib.suppress(KeyFileError):
        load_keyring(f)


# --- rotation through a Secret volume -----------------------------------------------------


class SecretVolume:
    """A directory laid out as the kubelet lays out a Secret volume: visible names are links
    to ..data/<name>, and ..data is a link to a timestamped directory swapped atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.version = 0
        path.mkdir()

    def publish(self, files: dict[str, bytes]) -> None:
        self.version += 1
        stamp = self.path / f"..2026_01_01_00_00_0{self.version}"
        stamp.mkdir()
        for name, data in files.items():
            (stamp / name).write_bytes(data)
        tmp = self.path / "..data_tmp"
        tmp.symlink_to(stamp.name)
        os.replace(tmp, self.path / "..data")
        for entry in self.path.iterdir():
            if not entry.name.startswith(".") and entry.name not in files:
                entry.unlink()
        for name in files:
            link = self.path / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")


def _pems(ring: record.Keyring) -> tuple[bytes, bytes]:
    assert ring.signing_key is not None
    return private_pem(ring.signing_key), public_pem(ring.signing_key.public_key())


def test_rotation_reaches_signer_and_verifier_without_restart(tmp_path: Path) -> None:
    k1, k2 = record.Keyring.generate("k1"), record.Keyring.generate("k2")
    (k1_priv, k1_pub), (k2_priv, k2_pub) = _pems(k1), _pems(k2)
    scheduler_dir = SecretVolume(tmp_path / "signing")
    node_dir = SecretVolume(tmp_path / "verify")
    scheduler_dir.publish({"k1.pem": k1_priv})
    node_dir.publish({"k1.pem": k1_pub})
    signer = KeyringSource(scheduler_dir.path, "sign", interval=0.0)
    verifier = KeyringSource(node_dir.path, "verify", interval=0.0)
    old = record.encode(ALLOC, signer)
    assert record.decode(old, verifier) == ALLOC

    # step 1: nodes learn the new public key; step 2: the scheduler signs with it
    node_dir.publish({"k1.pem": k1_pub, "k2.pem": k2_pub})
    scheduler_dir.publish({"k1.pem": k1_priv, "k2.pem": k2_priv, "signing-key-id": b"k2\n"})
    new = record.encode(ALLOC, signer)
    assert record.signature_algorithm(new) == "Ed25519"
    assert '"keyId":"k2"' in new
    assert record.decode(new, verifier) == ALLOC
    assert record.decode(old, verifier) == ALLOC  # old records verify while k1 is present

    # step 3: k1 retired
    node_dir.publish({"k2.pem": k2_pub})
    with pytest.raises(IntegrityError, match="unknown key id 'k1'"):
        record.decode(old, verifier)
    assert record.decode(new, verifier) == ALLOC


def test_a_failed_reload_keeps_the_last_good_keys_and_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    k1 = record.Keyring.generate("k1")
    _, k1_pub = _pems(k1)
    volume = SecretVolume(tmp_path / "verify")
    volume.publish({"k1.pem": k1_pub})
    source = KeyringSource(volume.path, interval=0.0)
    text = record.encode(ALLOC, k1)
    volume.publish({"k1.pem": b"garbage"})
    with caplog.at_level(logging.ERROR, logger="tessera_edge.keyfiles"):
        for _ in range(3):
            assert record.decode(text, source) == ALLOC
    assert len([r for r in caplog.records if "keeping the previous" in r.message]) == 1
    volume.publish({"k1.pem": k1_pub, "k2.pem": b"still garbage"})
    assert record.decode(text, source) == ALLOC


def test_a_source_checks_the_files_at_most_every_interval(tmp_path: Path) -> None:
    _, public = pair(tmp_path)
    source = KeyringSource(public.parent, interval=3600.0)
    first = source.get()
    public.unlink()
    generate_key_files(tmp_path / "other", "k9")
    assert source.get() is first


# --- tessera-keys ------------------------------------------------------------------------


def test_tessera_keys_generate_and_public(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert keys_cli.main(["generate", "--out", str(tmp_path / "k"), "--key-id", "r1"]) == 0
    out = capsys.readouterr().out
    assert "private/r1.pem" in out and "fingerprint SHA256:" in out
    assert keys_cli.main(["public", str(tmp_path / "k" / "private" / "r1.pem")]) == 0
    pem = capsys.readouterr().out
    assert pem == (tmp_path / "k" / "public" / "r1.pem").read_text()


@pytest.mark.parametrize(
    "argv",
    [
        ["public", "/nonexistent/key.pem"],
        ["generate", "--out", "{tmp}", "--key-id", "bad/id"],
        ["generate"],
        [],
        ["frobnicate"],
    ],
)
def test_tessera_keys_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code: str | int | None
    try:
        code = keys_cli.main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err


def test_tessera_keys_help_explains(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        keys_cli.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "generate" in out and "public" in out and "Secret" in out
