"""Shared fixtures for leasekit's own tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio, the loop every backend targets."""
    return "asyncio"
