from decimal import Decimal

import pytest

from tessera.keys import KeyFileError, load_keyring
from tessera.quantity import cpu_millis, memory_mib, parse_quantity, whole_count


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("100m", Decimal("0.1")),
        ("2", Decimal(2)),
        ("1.5Gi", Decimal(1.5 * 2**30)),
        ("1e3", Decimal(1000)),
        (3, Decimal(3)),
    ],
)
def test_parse_quantity(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "1.2.3", "5 Gi", "Gi", None, True, [1]])
def test_bad_quantities(bad):
    with pytest.raises(ValueError):
        parse_quantity(bad)


def test_conversions_round_up():
    assert cpu_millis("0.0001") == 1
    assert cpu_millis("250m") == 250
    assert memory_mib("1G") == 954
    assert memory_mib("64Mi") == 64
    assert whole_count("7") == 7
    with pytest.raises(ValueError):
        whole_count("7.5")


def test_key_file_and_directory(tmp_path):
    key = tmp_path / "key"
    key.write_bytes(b"s" * 32 + b"\n")
    ring = load_keyring(key)
    assert ring.signing_id == "default" and ring.key("default") == b"s" * 32

    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "a").write_bytes(b"a" * 32)
    (keys / "b").write_bytes(b"b" * 32)
    (keys / "..data").mkdir()  # what a Secret volume contains
    assert load_keyring(keys).signing_id == "a"
    (keys / "signing-key-id").write_text("b\n")
    ring = load_keyring(keys)
    assert ring.signing_id == "b" and ring.key("a") == b"a" * 32


def test_key_errors(tmp_path):
    with pytest.raises(KeyFileError, match="does not exist"):
        load_keyring(tmp_path / "nope")
    short = tmp_path / "short"
    short.write_bytes(b"abc")
    with pytest.raises(KeyFileError, match="use at least 16"):
        load_keyring(short)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(KeyFileError, match="no key files"):
        load_keyring(empty)
    (empty / "k").write_bytes(b"k" * 32)
    (empty / "signing-key-id").write_text("zz")
    with pytest.raises(KeyFileError, match="names key 'zz'"):
        load_keyring(empty)
