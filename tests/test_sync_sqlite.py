"""leasekit.sync on SQLite: the provider's own operations, run in the calling thread."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from leasekit_sqlite import SQLiteLeaseProvider, SQLiteSyncLeaseProvider

import leasekit
import leasekit.sync
from leasekit import BackendLacksCapability, LeaseBackendTimeout
from leasekit.backend import sync_factory

LONG_TTL_MS = 60_000


def leasekit_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("leasekit")}


def test_operations_run_in_the_calling_thread(tmp_path: Path) -> None:
    assert sync_factory(SQLiteLeaseProvider) == SQLiteLeaseProvider.sync_from_url
    before = leasekit_threads()
    with leasekit.sync.connect(f"sqlite:///{tmp_path}/leases.db") as leases:
        assert leases.native
        assert leases.acquire_lease("k", "a", LONG_TTL_MS).acquired
        assert leases.get_lease_owner("k") == "a"
        assert leases.transfer_lease("k", "a", "b", LONG_TTL_MS)
        leases.release_lease("k", "b")
        assert leases.get_lease_owner("k") is None
        # Neither a loop thread nor the async provider's own SQLite thread.
        assert leasekit_threads() == before


def test_a_write_lock_held_past_timeout_s_is_a_typed_timeout(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    with leasekit.sync.connect(f"sqlite:///{path}", timeout_s=0.2) as leases:
        assert leases.acquire_lease("k", "a", LONG_TTL_MS).acquired
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process holding the write lock
        try:
            with pytest.raises(LeaseBackendTimeout) as caught:
                leases.renew_lease("k", "a", LONG_TTL_MS)
            assert caught.value.backend == "sqlite"
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert leases.renew_lease("k", "a", LONG_TTL_MS)


def test_sync_and_async_providers_share_one_file(tmp_path: Path) -> None:
    import asyncio  # noqa: PLC0415

    url = f"sqlite:///{tmp_path}/leases.db"

    async def check() -> None:
        async with leasekit.connect(url) as provider:
            assert await provider.get_lease_owner("shared") == "sync-owner"

    with leasekit.sync.connect(url) as leases:
        assert leases.acquire_lease("shared", "sync-owner", LONG_TTL_MS).acquired
        asyncio.run(check())


def test_required_capabilities_are_checked_on_the_native_path(tmp_path: Path) -> None:
    with pytest.raises(BackendLacksCapability) as caught:
        leasekit.sync.connect(f"sqlite:///{tmp_path}/leases.db", require="shared_across_hosts")
    assert caught.value.missing == ("shared_across_hosts",)


def test_the_blocking_provider_takes_the_same_path_and_options(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    with SQLiteSyncLeaseProvider(path, synchronous="normal", sweep_every=1) as leases:
        assert leases.migrate() == 2
        assert leases.acquire_lease("k", "a", LONG_TTL_MS).acquired
        leases.release_lease("k", "a")  # and a sweep after it
        assert leases.acquire_lease("k", "b", LONG_TTL_MS).acquired
        assert repr(leases) == f"SQLiteSyncLeaseProvider({str(path)!r})"
    with pytest.raises(leasekit.InvalidLeaseArgument):
        SQLiteSyncLeaseProvider(":memory:")
    typo = SQLiteSyncLeaseProvider(tmp_path / "typo.db", create=False)
    with pytest.raises(leasekit.LeaseBackendUnreachable, match="no SQLite file"):
        typo.open()
    assert not (tmp_path / "typo.db").exists()
