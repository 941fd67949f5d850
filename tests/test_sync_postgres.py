"""leasekit.sync on PostgreSQL: the native blocking provider on psycopg's pool.

That the native path is taken (no loop thread), that 16 threads on one key make one
owner, that a stopped server is a typed timeout within timeout_s (the watchdog cuts the
connection), that errors map, and that sync and async providers share one table.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from servers import PostgresServer, require_module, with_options

import leasekit
import leasekit.sync
from leasekit import InvalidLeaseArgument, LeaseBackendTimeout, LeaseBackendUnreachable
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
