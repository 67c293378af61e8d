from __future__ import annotations

import pytest

from tests.nri_hook.vectors import VECTORS, Session, all_sessions


@pytest.fixture(scope="session")
def sessions() -> list[Session]:
    found = all_sessions()
    if not found:
        pytest.skip(f"captured NRI sessions not found at {VECTORS}")
    return found
