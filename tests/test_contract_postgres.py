"""The conformance suite, unchanged, against PostgreSQL: a fresh table per test.

Through the async driver twice: on the provider's own pool (as ``leasekit.connect``
builds it), and on a caller's single connection that every task of the test shares;
and through the blocking driver, on the native blocking provider that
``leasekit.sync.connect`` opens (``PostgresSyncLeaseProvider``).

The server is this run's own (``tests/servers.py``) or ``$LEASEKIT_TEST_POSTGRES_URL``;
tables live in a schema of the run's own, dropped at the end.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from servers import missing_extra

import leasekit
import leasekit.sync

try:
    import psycopg
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("postgres", "the PostgreSQL tests")

from leasekit_contract import BlockingLeaseProviderContract, LeaseProviderContract
from leasekit_postgres import PostgresLeaseProvider


class TestPostgresContract(LeaseProviderContract):
    """The whole suite, multi-process checks included, one table per test."""

    @pytest.fixture
    async def provider(
        self, postgres_url: str, postgres_table: str
    ) -> AsyncIterator[leasekit.ManagedLeaseProvider]:
        async with leasekit.connect(postgres_url, table=postgres_table) as provider:
            yield provider

    @pytest.fixture
    def provider_factory(
        self, postgres_url: str, postgres_table: str
    ) -> Callable[[], leasekit.ManagedLeaseProvider]:
        return functools.partial(leasekit.connect, postgres_url, table=postgres_table)

    @pytest.fixture
    def break_notifications(self) -> Callable[[PostgresLeaseProvider], Awaitable[None]]:
        async def cut(provider: PostgresLeaseProvider) -> None:
            await provider.break_notifications()

        return cut


class TestPostgresContractBlocking(BlockingLeaseProviderContract):
    """The whole suite through ``leasekit.sync.connect``, one table per test."""

    @pytest.fixture
    def blocking_factory(
        self, postgres_url: str, postgres_table: str
    ) -> Callable[[], leasekit.sync.SyncLeaseProvider]:
        return functools.partial(leasekit.sync.connect, postgres_url, table=postgres_table)


class TestPostgresContractOnOneConnection(LeaseProviderContract):
    """The suite on a caller's single autocommit connection, shared by every task."""

    # These race fresh providers (from the factory, on their own pools) in spawned
    # processes; they already run in TestPostgresContract.
    test_racing_processes_get_exactly_one_winner_per_round = None
    test_churning_processes_never_overlap_as_holders = None

    @pytest.fixture
    async def provider(
        self, postgres_url: str, postgres_table: str
    ) -> AsyncIterator[PostgresLeaseProvider]:
        conn = await psycopg.AsyncConnection.connect(postgres_url, autocommit=True)
        async with PostgresLeaseProvider(conn, table=postgres_table) as provider:
            yield provider
        await conn.close()

    @pytest.fixture
    def provider_factory(
        self, postgres_url: str, postgres_table: str
    ) -> Callable[[], leasekit.ManagedLeaseProvider]:
        return functools.partial(leasekit.connect, postgres_url, table=postgres_table)

    @pytest.fixture
    def break_notifications(self) -> Callable[[PostgresLeaseProvider], Awaitable[None]]:
        async def cut(provider: PostgresLeaseProvider) -> None:
            await provider.break_notifications()

        return cut
