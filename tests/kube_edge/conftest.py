from collections.abc import Iterator

import pytest

from tessera_testbed.apiserver import FakeApiServer


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    """An empty simulated API server, reached over real HTTP."""
    with FakeApiServer() as server:
        yield server
