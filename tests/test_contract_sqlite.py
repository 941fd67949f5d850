"""The conformance suite, unchanged, against the SQLite backend on a fresh file per test.

Through both drivers: the async provider, and the native blocking one that
``leasekit.sync.connect`` opens.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from leasekit_contract import BlockingLeaseProviderContract, LeaseProviderContract

import leasekit
import leasekit.sync


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'contract.db'}"


class TestSQLiteBackend(LeaseProviderContract):
    @pytest.fixture
    async def provider(self, url: str) -> AsyncIterator[leasekit.ManagedLeaseProvider]:
        async with leasekit.connect(url) as provider:
            yield provider

    @pytest.fixture
    def provider_factory(self, url: str) -> Callable[[], leasekit.ManagedLeaseProvider]:
        return functools.partial(leasekit.connect, url)


class TestSQLiteBackendBlocking(BlockingLeaseProviderContract):
    @pytest.fixture
    def blocking_factory(self, url: str) -> Callable[[], leasekit.sync.SyncLeaseProvider]:
        return functools.partial(leasekit.sync.connect, url)
