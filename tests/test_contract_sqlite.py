"""The conformance suite, unchanged, against the SQLite backend on a fresh file per test."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from leasekit_contract import LeaseProviderContract

import leasekit


class TestSQLiteBackend(LeaseProviderContract):
    @pytest.fixture
    def url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'contract.db'}"

    @pytest.fixture
    async def provider(self, url: str) -> AsyncIterator[leasekit.ManagedLeaseProvider]:
        async with leasekit.connect(url) as provider:
            yield provider

    @pytest.fixture
    def provider_factory(self, url: str) -> Callable[[], leasekit.ManagedLeaseProvider]:
        return functools.partial(leasekit.connect, url)
