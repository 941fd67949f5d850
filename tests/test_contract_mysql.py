"""The conformance suite, unchanged, against MariaDB (or MySQL): a fresh table per test.

Through the async driver three times: on the provider's own pool (as
``leasekit.connect`` builds it), with the ``clock`` token source that MySQL uses (on
the same server), and on a caller's pool of one connection that every task of the test
shares; and through the blocking driver, on what ``leasekit.sync.connect`` opens (the
backend's native blocking provider where it has one, otherwise the facade running the
async provider on its loop thread).

The server is this run's own (``tests/servers.py``) or ``$LEASEKIT_TEST_MYSQL_URL``;
tables live in a database of the run's own, dropped at the end.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable

import pytest
from servers import missing_extra

import leasekit
import leasekit.sync

try:
    import asyncmy
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("mysql", "the MySQL tests")

from leasekit_contract import BlockingLeaseProviderContract, LeaseProviderContract
from leasekit_mysql import MySQLLeaseProvider

from leasekit.backend import parse_url


class TestMySQLContract(LeaseProviderContract):
    """The whole suite, multi-process checks included, one table per test."""

    @pytest.fixture
    async def provider(
        self, mysql_url: str, mysql_table: str
    ) -> AsyncIterator[leasekit.ManagedLeaseProvider]:
        async with leasekit.connect(mysql_url, table=mysql_table) as provider:
            yield provider

    @pytest.fixture
    def provider_factory(
        self, mysql_url: str, mysql_table: str
    ) -> Callable[[], leasekit.ManagedLeaseProvider]:
        return functools.partial(leasekit.connect, mysql_url, table=mysql_table)


class TestMySQLContractBlocking(BlockingLeaseProviderContract):
    """The whole suite through ``leasekit.sync.connect``, one table per test.

    A call's deadline is 15 s here, not the default 5: in the racing-processes slot
    check 64 blocking callers queue for one key's row lock, each for a whole
    procedure, and at a load average of 15-20 on two cores one call in a few runs
    waited past 5 s. What a deadline does is tested on its own (test_sync_mysql.py).
    """

    @pytest.fixture
    def blocking_factory(
        self, mysql_url: str, mysql_table: str
    ) -> Callable[[], leasekit.sync.SyncLeaseProvider]:
        return functools.partial(leasekit.sync.connect, mysql_url, table=mysql_table, timeout_s=15)


class TestMySQLContractClockTokens(LeaseProviderContract):
    """The suite with fencing tokens from the server's clock, MySQL's source."""

    @pytest.fixture
    async def provider(
        self, mysql_url: str, mysql_table: str
    ) -> AsyncIterator[leasekit.ManagedLeaseProvider]:
        async with leasekit.connect(mysql_url, table=mysql_table, tokens="clock") as provider:
            yield provider

    @pytest.fixture
    def provider_factory(
        self, mysql_url: str, mysql_table: str
    ) -> Callable[[], leasekit.ManagedLeaseProvider]:
        return functools.partial(leasekit.connect, mysql_url, table=mysql_table, tokens="clock")


class TestMySQLContractOnACallersPool(LeaseProviderContract):
    """The suite on a caller's asyncmy pool of one connection, shared by every task."""

    # These race fresh providers (from the factory, on their own pools) in spawned
    # processes; they already run in TestMySQLContract.
    test_racing_processes_get_exactly_one_winner_per_round = None
    test_churning_processes_never_overlap_as_holders = None

    @pytest.fixture
    async def provider(self, mysql_url: str, mysql_table: str) -> AsyncIterator[MySQLLeaseProvider]:
        parsed = parse_url(mysql_url, schemes=("mysql", "mariadb"), default_port=3306)
        endpoint = parsed.endpoints[0]
        pool = await asyncmy.create_pool(
            minsize=1,
            maxsize=1,
            host=endpoint.host,
            port=endpoint.port or 3306,
            user=parsed.username or "root",
            password=parsed.password or "",
            autocommit=True,
        )
        async with MySQLLeaseProvider(pool, table=mysql_table) as provider:
            yield provider
        pool.close()
        await pool.wait_closed()

    @pytest.fixture
    def provider_factory(
        self, mysql_url: str, mysql_table: str
    ) -> Callable[[], leasekit.ManagedLeaseProvider]:
        return functools.partial(leasekit.connect, mysql_url, table=mysql_table)
