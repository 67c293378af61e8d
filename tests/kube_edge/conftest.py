from collections.abc import Iterator

import pytest

from tessera_testbed.apiserver import FakeApiServer
from tests.kube_edge.helpers import StubServer, serve_stub


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    """An empty simulated API server, reached over real HTTP."""
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def server() -> Iterator[StubServer]:
    """A stub HTTP server that records requests and answers each path as told."""
    with serve_stub() as srv:
        yield srv
