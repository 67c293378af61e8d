from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.vectors import DEVICEPLUGIN, require

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def vectors() -> Path:
    return require(DEVICEPLUGIN)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for unix sockets (their paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
