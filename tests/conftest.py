"""Fixtures for every test area."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """A command's main() configures the root logger; put it back for the tests that follow
    (and close the handlers it added: a log file stays open otherwise). For every test: a
    main() run in-process points the root logger at that test's captured stderr, which is
    closed once the test ends, and a later test's threads then log into a closed file."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port another socket listens on for the whole test."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield busy.getsockname()[1]
