from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT.parent / "shared" / "vectors" / "deviceplugin"


@pytest.fixture
def vectors() -> Path:
    if not VECTORS.is_dir():
        pytest.skip(f"no kubelet vectors at {VECTORS}")
    return VECTORS


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for unix sockets (their paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
