"""Every captured vector is in the checkout, byte for byte as listed in SHA256SUMS."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.vectors import DEVICEPLUGIN, EXTENDER, NRI_WIRE, ROOT, MissingVectorsError, require


def _listed() -> dict[str, str]:
    sums = (ROOT / "SHA256SUMS").read_text().splitlines()
    return {
        name.removeprefix("./"): digest for digest, name in (line.split(None, 1) for line in sums)
    }


def test_every_listed_vector_is_present_and_unchanged() -> None:
    listed = _listed()
    assert len(listed) > 300  # the three captures, not an emptied list
    for name, digest in listed.items():
        path = ROOT / name
        assert path.is_file(), f"missing captured vector {name}"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, f"{name} changed"


def test_every_vector_file_is_listed() -> None:
    listed = set(_listed())
    on_disk = {
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*")
        if p.is_file()
        and p.name not in ("SHA256SUMS", "README.md", "__init__.py")
        and "__pycache__" not in p.parts
    }
    on_disk |= {n for n in listed if n.endswith("README.md")}
    assert on_disk == listed


@pytest.mark.parametrize("folder", [EXTENDER, DEVICEPLUGIN, NRI_WIRE])
def test_each_capture_folder_is_required(folder: Path) -> None:
    assert require(folder) == folder


def test_a_missing_folder_fails_rather_than_skips(tmp_path: Path) -> None:
    with pytest.raises(MissingVectorsError, match="captured vectors missing"):
        require(tmp_path / "absent")
