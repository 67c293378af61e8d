from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nri_hook.vectors import Session, all_sessions


@pytest.fixture(scope="session")
def sessions() -> list[Session]:
    return all_sessions()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for unix sockets (their paths are limited to 107 bytes, and
    pytest's tmp_path can be longer than that)."""
    path = Path(tempfile.mkdtemp(prefix="nri-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
