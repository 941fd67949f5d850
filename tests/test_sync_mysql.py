"""leasekit.sync on MySQL/MariaDB: the native blocking provider on PyMySQL.

That the native path is taken (no loop thread), that it keeps the contract (server
clock, owner-checked writes, fencing tokens), that 16 threads on one key make one
owner, that a paused server or a row lock is a typed timeout within timeout_s, that a
killed connection is replaced, that bad input is refused before any I/O, and that sync
and async providers share one table. fork() is ``tests/test_fork.py``'s.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
from servers import MariaDBServer, missing_extra, with_options

import leasekit
import leasekit.sync
from leasekit import (
    InvalidLeaseArgument,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
    LeaseProviderClosed,
)
from leasekit.backend import SyncBackendProvider, parse_url, sync_factory

try:
    import pymysql
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("mysql", "the MySQL tests")

from leasekit_mysql import MySQLLeaseProvider, MySQLSyncLeaseProvider
from leasekit_mysql._sql import SCHEMA_VERSION

LONG_TTL_MS = 60_000
THREADS = 16
SLACK_S = 5.0  # how much later than its timeout a call may fail, on a loaded machine


@pytest.fixture
def url(mysql_url: str, mysql_table: str) -> str:
    return with_options(mysql_url, table=mysql_table)


@pytest.fixture
def leases(url: str) -> Iterator[leasekit.sync.SyncLeaseProvider]:
    with leasekit.sync.connect(url) as facade:
        yield facade


def admin(url: str) -> Any:
    """A PyMySQL connection of the test's own, outside the code under test."""
    parsed = parse_url(url, schemes=("mysql", "mariadb"), default_port=3306)
    endpoint = parsed.endpoints[0]
    return pymysql.connect(
        host=endpoint.host,
        port=endpoint.port or 3306,
        user=parsed.username or "root",
        password=parsed.password or "",
        autocommit=True,
    )


def quoted(table: str) -> str:
    return ".".join(f"`{part}`" for part in table.split("."))


def loop_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("leasekit-sync")}


def create_schema(url: str) -> None:
    """Create the table with the default timeout_s: DDL takes longer on a loaded machine."""
    MySQLLeaseProvider.sync_from_url(url).open().close()


def eventually(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# -- the native path and the contract -------------------------------------------------------


def test_mysql_offers_a_native_provider(url: str) -> None:
    assert sync_factory(MySQLLeaseProvider) == MySQLLeaseProvider.sync_from_url
    assert issubclass(MySQLSyncLeaseProvider, SyncBackendProvider)
    assert MySQLSyncLeaseProvider.capabilities == MySQLLeaseProvider.capabilities
    before = loop_threads()
    with leasekit.sync.connect(url) as leases:
        assert leases.native
        assert leases.acquire_lease("k", "a", LONG_TTL_MS).acquired
        assert leases.get_lease_owner("k") == "a"
        assert leases.renew_lease("k", "a", LONG_TTL_MS)
        assert leases.transfer_lease("k", "a", "b", LONG_TTL_MS)
        leases.release_lease("k", "b")
        assert leases.get_lease_owner("k") is None
        assert loop_threads() == before
        assert "MySQLSyncLeaseProvider" in repr(leases)


def test_the_contract_holds_on_the_blocking_provider(
    leases: leasekit.sync.SyncLeaseProvider,
) -> None:
    first = leases.acquire_lease("k", "a", LONG_TTL_MS)
    assert first.acquired
    assert first.owner == "a"
    assert first.token is not None
    again = leases.acquire_lease("k", "a", LONG_TTL_MS)
    assert (again.acquired, again.token) == (True, first.token)  # idempotent, same token
    denied = leases.acquire_lease("k", "b", LONG_TTL_MS)
    assert (denied.acquired, denied.owner, denied.token) == (False, "a", None)
    leases.release_lease("k", "b")  # not the holder: no-op
    assert not leases.renew_lease("k", "b", LONG_TTL_MS)
    assert not leases.transfer_lease("k", "b", "c", LONG_TTL_MS)
    assert leases.get_lease_owner("k") == "a"
    assert leases.transfer_lease("k", "a", "a", LONG_TTL_MS)  # to oneself: a renew
    assert leases.transfer_lease("k", "a", "b", LONG_TTL_MS)
    moved = leases.acquire_lease("k", "b", LONG_TTL_MS)
    assert moved.token is not None
    assert moved.token > first.token
    leases.release_lease("k", "b")
    assert leases.get_lease_owner("k") is None
    after = leases.acquire_lease("k", "c", LONG_TTL_MS)
    assert after.token is not None
    assert after.token > moved.token


def test_expiry_is_the_servers_and_tokens_increase_after_it(
    leases: leasekit.sync.SyncLeaseProvider,
) -> None:
    short = leases.acquire_lease("k", "a", 50)
    assert short.acquired
    assert short.token is not None
    eventually(lambda: leases.get_lease_owner("k") is None, "the lease to expire")
    assert not leases.renew_lease("k", "a", LONG_TTL_MS)
    assert not leases.transfer_lease("k", "a", "b", LONG_TTL_MS)
    taken = leases.acquire_lease("k", "b", LONG_TTL_MS)
    assert taken.acquired
    assert taken.token is not None
    assert taken.token > short.token


@pytest.mark.parametrize("key", ["resource\0thread", "ключ-🔑", "A", "a "])
def test_awkward_keys_and_owners_round_trip(
    leases: leasekit.sync.SyncLeaseProvider, key: str
) -> None:
    owner = f"{key}\0owner"
    assert leases.acquire_lease(key, owner, LONG_TTL_MS).acquired
    assert leases.get_lease_owner(key) == owner
    assert leases.get_lease_owner(key.upper() + "x") is None


def test_sixteen_threads_on_one_key_make_one_owner(url: str) -> None:
    with leasekit.sync.connect(url, pool_max_size=THREADS) as leases:
        for round_no in range(3):
            key = f"race-{round_no}"
            start = threading.Barrier(THREADS)

            def contend(index: int, key: str = key, start: threading.Barrier = start) -> Any:
                start.wait()
                return leases.acquire_lease(key, f"worker-{index}", LONG_TTL_MS)

            with ThreadPoolExecutor(THREADS) as pool:
                results = list(pool.map(contend, range(THREADS)))
            winners = [r.owner for r in results if r.acquired]
            assert len(winners) == 1, results
            assert {r.owner for r in results} == set(winners)
            assert leases.get_lease_owner(key) == winners[0]


def test_more_threads_than_connections_all_progress(url: str) -> None:
    with leasekit.sync.connect(url, pool_max_size=2) as leases:

        def cycle(index: int) -> None:
            for round_no in range(5):
                key = f"k{index}-{round_no}"
                assert leases.acquire_lease(key, "a", LONG_TTL_MS).acquired
                leases.release_lease(key, "a")

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(cycle, range(8)))


def test_sync_and_async_providers_share_one_table(url: str) -> None:
    async def check() -> None:
        async with leasekit.connect(url) as provider:
            assert await provider.get_lease_owner("shared") == "sync-owner"
            assert await provider.transfer_lease("shared", "sync-owner", "async", LONG_TTL_MS)

    with leasekit.sync.connect(url) as leases:
        assert leases.acquire_lease("shared", "sync-owner", LONG_TTL_MS).acquired
        asyncio.run(check())
        assert leases.get_lease_owner("shared") == "async"


def test_migrate_inspect_and_closing(url: str, mysql_table: str) -> None:
    provider = MySQLLeaseProvider.sync_from_url(url, create_schema=False)
    assert isinstance(provider, MySQLSyncLeaseProvider)
    try:
        assert provider.migrate() == SCHEMA_VERSION
        assert provider.acquire_lease("p/1", "a", LONG_TTL_MS, metadata=b"a:1").acquired
        assert provider.acquire_lease("q/1", "a", LONG_TTL_MS).acquired
        [record] = provider.inspect("p/")
        assert (record.key, record.owner, record.metadata) == ("p/1", "a", b"a:1")
    finally:
        provider.close()
    provider.close()  # idempotent
    with pytest.raises(LeaseProviderClosed):
        provider.get_lease_owner("p/1")


# -- faults ---------------------------------------------------------------------------------


@contextmanager
def row_locked(url: str, table: str, key: bytes = b"k") -> Iterator[Any]:
    """``key``'s row locked by a transaction of the test's own until the block ends."""
    conn = admin(url)
    try:
        with conn.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(f"SELECT * FROM {quoted(table)} WHERE lease_key = %s FOR UPDATE", (key,))
            yield cursor
            cursor.execute("COMMIT")
    finally:
        conn.close()


def test_a_statement_stalled_by_a_row_lock_is_a_timeout_and_the_pool_recovers(
    url: str, mysql_table: str
) -> None:
    # Long enough to open on a loaded machine (the schema read, a fresh connection);
    # the statement stalled by the row lock runs into it all the same.
    timeout_s = 2.0
    create_schema(url)
    with leasekit.sync.connect(url, timeout_s=timeout_s, pool_max_size=1) as leases:
        assert leases.acquire_lease("k", "a", LONG_TTL_MS).acquired
        with row_locked(url, mysql_table):
            started = time.monotonic()
            with pytest.raises(LeaseBackendTimeout) as info:
                leases.renew_lease("k", "a", LONG_TTL_MS)
            assert time.monotonic() - started < timeout_s + SLACK_S
            assert (info.value.key, info.value.backend) == ("k", "mysql")
        assert leases.renew_lease("k", "a", LONG_TTL_MS)
        assert leases.get_lease_owner("k") == "a"


def test_killed_connections_are_replaced_without_surfacing(url: str) -> None:
    with leasekit.sync.connect(url, pool_max_size=1) as leases:
        assert leases.acquire_lease("k", "a", LONG_TTL_MS).acquired
        conn = admin(url)
        try:
            with conn.cursor() as cursor:
                cursor.execute(
                    "SELECT id FROM information_schema.processlist"
                    " WHERE id <> CONNECTION_ID() AND user = CURRENT_USER()"
                    " AND command = 'Sleep'"
                )
                for (thread_id,) in cursor.fetchall():
                    cursor.execute(f"KILL CONNECTION {int(thread_id)}")
        finally:
            conn.close()
        assert leases.get_lease_owner("k") == "a"  # retried once, on a fresh connection
        assert leases.renew_lease("k", "a", LONG_TTL_MS)


@pytest.mark.slow
def test_a_paused_server_is_a_typed_timeout_within_the_timeout_then_recovers(
    private_mariadb_server: MariaDBServer,
) -> None:
    server = private_mariadb_server
    timeout_s = 0.5
    create_schema(server.url)
    with leasekit.sync.connect(with_options(server.url, timeout_s=timeout_s)) as leases:
        assert leases.native
        assert leases.acquire_lease("k", "a", LONG_TTL_MS).acquired
        server.pause()
        try:
            for call in (
                lambda: leases.acquire_lease("k", "a", LONG_TTL_MS),
                lambda: leases.get_lease_owner("k"),
                lambda: leases.renew_lease("k", "a", LONG_TTL_MS),
                lambda: leases.transfer_lease("k", "a", "b", LONG_TTL_MS),
            ):
                started = time.monotonic()
                with pytest.raises(LeaseBackendTimeout) as info:
                    call()
                assert time.monotonic() - started < timeout_s + SLACK_S
                assert (info.value.key, info.value.backend) == ("k", "mysql")
        finally:
            server.resume()
        assert leases.get_lease_owner("k") in ("a", "b")
        server.pause()
        try:
            started = time.monotonic()
            leases.close()  # bounded even with the server frozen
            assert time.monotonic() - started < timeout_s + SLACK_S
        finally:
            server.resume()


def test_a_refused_connection_is_unreachable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(LeaseBackendUnreachable) as caught:
        leasekit.sync.connect(f"mysql://nobody@127.0.0.1:{port}/db?timeout_s=1").open()
    assert caught.value.backend == "mysql"
    assert time.monotonic() - started < 1 + SLACK_S


def test_bad_options_and_input_raise_before_any_io() -> None:
    with socket.socket() as probe:  # nothing listens here: any I/O would fail otherwise
        probe.bind(("127.0.0.1", 0))
        dead = f"mysql://root@127.0.0.1:{probe.getsockname()[1]}/db"
    with pytest.raises(InvalidLeaseArgument, match="table"):
        leasekit.sync.connect(dead, table="a;drop")
    with pytest.raises(InvalidLeaseArgument, match="sweep_grace_s"):
        leasekit.sync.connect(dead, sweep_grace_s=1, timeout_s=5)
    with pytest.raises(InvalidLeaseArgument, match="pool_max_size"):
        leasekit.sync.connect(dead, pool_min_size=3, pool_max_size=2)
    provider = MySQLLeaseProvider.sync_from_url(dead)
    try:
        for call, argument in (
            (lambda: provider.acquire_lease("k", "a", 0), "ttl_ms"),
            (lambda: provider.acquire_lease("", "a", 1), "key"),
            (lambda: provider.renew_lease("k", "a", True), "ttl_ms"),
            (lambda: provider.transfer_lease("k", "a", "", 1), "to_owner"),
            (lambda: provider.release_lease("k", "x" * 1025), "owner"),
            (lambda: provider.inspect(limit=0), "limit"),
        ):
            with pytest.raises(InvalidLeaseArgument) as caught:
                call()
            assert caught.value.argument == argument
    finally:
        provider.close()
