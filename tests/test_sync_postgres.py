"""leasekit.sync on PostgreSQL: the native blocking provider on psycopg's pool.

That the native path is taken (no loop thread), that 16 threads on one key make one
owner, that a stopped server is a typed timeout within timeout_s (the watchdog cuts the
connection), that errors map, and that sync and async providers share one table.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from servers import PostgresServer, require_module, with_options

import leasekit
import leasekit.sync
from leasekit import (
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
)
from leasekit.backend import SyncBackendProvider, sync_factory

require_module("psycopg_pool", extra="postgres")
leasekit_postgres = require_module("leasekit_postgres", extra="postgres")

LONG_TTL_MS = 60_000
THREADS = 16


@pytest.fixture
def url(postgres_url: str, postgres_table: str) -> str:
    return with_options(postgres_url, table=postgres_table)


def loop_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("leasekit-sync")}


def test_postgres_offers_a_native_provider(url: str) -> None:
    backend = leasekit_postgres.PostgresLeaseProvider
    assert sync_factory(backend) == backend.sync_from_url
    assert issubclass(leasekit_postgres.PostgresSyncLeaseProvider, SyncBackendProvider)
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
        assert "PostgresSyncLeaseProvider" in repr(leases)


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


def test_sync_and_async_providers_share_one_table(url: str) -> None:
    async def check() -> None:
        async with leasekit.connect(url) as provider:
            assert await provider.get_lease_owner("shared") == "sync-owner"
            assert await provider.transfer_lease("shared", "sync-owner", "async", LONG_TTL_MS)

    with leasekit.sync.connect(url) as leases:
        assert leases.acquire_lease("shared", "sync-owner", LONG_TTL_MS).acquired
        asyncio.run(check())
        assert leases.get_lease_owner("shared") == "async"


def test_a_stopped_server_is_a_typed_timeout_then_recovers(
    private_postgres_server: PostgresServer,
) -> None:
    # server_timeout=false: no statement_timeout either, so only the watchdog bounds it.
    url = with_options(private_postgres_server.url, timeout_s=0.5, server_timeout="false")
    with leasekit.sync.connect(url) as leases:
        assert leases.native
        assert leases.acquire_lease("k", "a", LONG_TTL_MS).acquired
        private_postgres_server.pause()
        try:
            for call in (
                lambda: leases.get_lease_owner("k"),
                lambda: leases.renew_lease("k", "a", LONG_TTL_MS),
                lambda: leases.transfer_lease("k", "a", "b", LONG_TTL_MS),
            ):
                with pytest.raises(LeaseBackendTimeout) as caught:
                    call()
                assert caught.value.backend == "postgresql"
        finally:
            private_postgres_server.resume()
        assert leases.get_lease_owner("k") in ("a", "b")


def test_an_idempotent_call_on_a_connection_ended_since_runs_again_a_transfer_does_not(
    postgres_url: str, postgres_table: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The async provider's one retry on a fresh connection (``_ops.attempts``), through
    the blocking transport: the pool's only connection is ended between two calls."""
    import psycopg  # noqa: PLC0415

    app_name = f"leasekit-test-{uuid.uuid4().hex[:8]}"
    url = with_options(
        postgres_url, table=postgres_table, application_name=app_name, pool_max_size=1
    )

    def terminate() -> None:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            rows = admin.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (app_name,),
            ).fetchall()
        assert [ended for (ended,) in rows] == [True]

    with leasekit_postgres.PostgresSyncLeaseProvider.from_url(url) as leases:
        assert leases.acquire_lease("k", "a", LONG_TTL_MS).acquired
        terminate()
        with caplog.at_level(logging.INFO, logger="leasekit.postgres"):
            assert leases.get_lease_owner("k") == "a"  # on a fresh connection
        assert "retrying once on a fresh one" in caplog.text
        terminate()
        with pytest.raises(LeaseBackendError) as failed:
            leases.transfer_lease("k", "a", "b", LONG_TTL_MS)
        assert isinstance(failed.value.__cause__, psycopg.OperationalError)
        assert leases.get_lease_owner("k") == "a"  # not run twice, nor once


def test_a_refused_connection_is_unreachable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(LeaseBackendUnreachable) as caught:
        leasekit.sync.connect(f"postgresql://nobody@127.0.0.1:{port}/db").open()
    assert caught.value.backend == "postgresql"


def test_bad_options_and_input_raise_before_any_io(url: str) -> None:
    with pytest.raises(InvalidLeaseArgument, match="table"):
        leasekit.sync.connect(url, table="a;drop")
    with pytest.raises(InvalidLeaseArgument, match="sweep_grace_s"):
        leasekit.sync.connect(url, sweep_grace_s=1, timeout_s=5)
    with leasekit.sync.connect(url) as leases:
        with pytest.raises(InvalidLeaseArgument) as caught:
            leases.acquire_lease("k", "a", 0)
        assert caught.value.argument == "ttl_ms"
