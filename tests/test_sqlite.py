"""The SQLite backend beyond the shared suite: files, URLs, contention, sweeps, faults."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from leasekit_sqlite import SQLiteLeaseProvider

import leasekit

pytestmark = pytest.mark.anyio


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "leases.db"


@pytest.fixture
async def provider(db_path: Path) -> AsyncIterator[SQLiteLeaseProvider]:
    async with SQLiteLeaseProvider(db_path, timeout_s=2.0) as p:
        yield p


# -- URLs and options -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///leases.db", "leases.db"),
        ("sqlite:////tmp/x/leases.db", "/tmp/x/leases.db"),
        ("sqlite://", "leasekit.db"),
        ("sqlite:///", "leasekit.db"),
        ("sqlite:///my%20leases.db", "my leases.db"),
    ],
)
def test_url_maps_to_path_like_sqlalchemy(url: str, expected: str) -> None:
    provider = leasekit.connect(url)
    assert isinstance(provider, SQLiteLeaseProvider)
    assert provider.path == expected


def test_url_query_sets_options() -> None:
    provider = leasekit.connect("sqlite:///x.db?timeout_s=0.5&synchronous=normal")
    assert isinstance(provider, SQLiteLeaseProvider)
    assert provider.timeout_s == 0.5


@pytest.mark.parametrize(
    "url",
    ["sqlite:///:memory:", "sqlite:///:memory:?timeout_s=1"],
)
def test_in_memory_database_is_refused_pointing_at_memory_scheme(url: str) -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument, match=r"memory://"):
        leasekit.connect(url)


@pytest.mark.parametrize(
    ("url", "argument"),
    [
        ("sqlite://host/x.db", "url"),
        ("sqlite:///x.db?timeout_s=abc", "timeout_s"),
        ("sqlite:///x.db?timeout_s=0", "timeout_s"),
        ("sqlite:///x.db?synchronous=sometimes", "synchronous"),
        ("sqlite:///x.db?colour=blue", "options"),
        ("sqlite:///x.db?sweep_batch=0", "sweep_batch"),
    ],
)
def test_bad_urls_and_options_name_the_problem(url: str, argument: str) -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument) as info:
        leasekit.connect(url)
    assert info.value.argument == argument


def test_connect_does_no_io(tmp_path: Path) -> None:
    path = tmp_path / "never.db"
    leasekit.connect(f"sqlite:///{path}")
    assert not path.exists()


async def test_unwritable_path_is_a_backend_error(tmp_path: Path) -> None:
    with pytest.raises(leasekit.LeaseBackendError) as info:
        async with SQLiteLeaseProvider(tmp_path / "missing-dir" / "x.db"):
            pass
    assert info.value.backend == "sqlite"
    assert isinstance(info.value.__cause__, sqlite3.Error)


# -- the file --------------------------------------------------------------------------


async def test_file_uses_wal_and_records_schema_version(
    provider: SQLiteLeaseProvider, db_path: Path
) -> None:
    await provider.acquire_lease("k", "a", 1000)
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        version = conn.execute(
            "SELECT value FROM leasekit_meta WHERE name = 'schema_version'"
        ).fetchone()[0]
    assert version == 1


async def test_tokens_and_leases_survive_a_new_provider_on_the_same_file(db_path: Path) -> None:
    async with SQLiteLeaseProvider(db_path) as first:
        a = await first.acquire_lease("k", "a", 60_000)
        await first.release_lease("k", "a")
        b = await first.acquire_lease("k", "b", 60_000)
    async with SQLiteLeaseProvider(db_path) as second:
        assert await second.get_lease_owner("k") == "b"
        assert await second.transfer_lease("k", "b", "c", 60_000)
        c = await second.acquire_lease("k", "c", 60_000)
    assert a.token is not None
    assert b.token is not None
    assert c.token is not None
    assert a.token < b.token < c.token


async def test_schema_creation_is_idempotent_across_many_providers(db_path: Path) -> None:
    providers = [SQLiteLeaseProvider(db_path) for _ in range(8)]
    results = await asyncio.gather(
        *(p.acquire_lease("k", f"o{i}", 60_000) for i, p in enumerate(providers))
    )
    assert sum(r.acquired for r in results) == 1
    winner = next(r.owner for r in results if r.acquired)
    assert all(r.owner == winner for r in results)
    for p in providers:
        await p.aclose()


# -- sweeping ----------------------------------------------------------------------------


@pytest.mark.slow  # 100,000 acquires
async def test_table_stays_proportional_to_live_keys_after_100k_churned_keys(
    db_path: Path,
) -> None:
    async with SQLiteLeaseProvider(db_path, synchronous="off") as provider:
        live = [f"live-{i}" for i in range(10)]
        for key in live:
            assert (await provider.acquire_lease(key, "keeper", 600_000)).acquired
        first = None
        for i in range(100_000):
            # Each key is used once and left to expire, the way thread keys churn.
            result = await provider.acquire_lease(f"churn-{i}", "worker", 1)
            assert result.acquired
            first = result.token if first is None else first
        rows = await provider.row_count()
        # Live keys plus at most a couple of sweep batches of not-yet-reclaimed tombstones.
        assert rows <= len(live) + 2 * 256, rows
        for key in live:
            assert await provider.get_lease_owner(key) == "keeper"
        # A swept key starts again above every token it ever had.
        again = await provider.acquire_lease("churn-0", "worker", 60_000)
        assert first is not None
        assert again.token is not None
        assert again.token > first


async def test_sweep_keeps_tokens_increasing_for_reclaimed_keys(db_path: Path) -> None:
    async with SQLiteLeaseProvider(db_path, sweep_every=1_000_000) as provider:
        tokens = []
        for _ in range(5):
            result = await provider.acquire_lease("k", "a", 1)
            tokens.append(result.token)
            await asyncio.sleep(0.005)
            assert await provider.sweep() >= 1
            assert await provider.row_count() == 0
        assert tokens == sorted(set(tokens)), tokens


async def test_inspect_lists_live_leases_with_prefix(provider: SQLiteLeaseProvider) -> None:
    await provider.acquire_lease("job/1", "a", 60_000)
    await provider.acquire_lease("job/2", "b", 60_000)
    await provider.acquire_lease("other", "c", 60_000)
    await provider.acquire_lease("job/3", "d", 60_000)
    await provider.release_lease("job/3", "d")
    records = await provider.inspect("job/")
    assert [(r.key, r.owner) for r in records] == [("job/1", "a"), ("job/2", "b")]
    assert all(0 < r.remaining_ms <= 60_000 for r in records)
    assert len(await provider.inspect()) == 3
    with pytest.raises(leasekit.InvalidLeaseArgument):
        await provider.inspect("")


# -- contention and faults -----------------------------------------------------------------


async def test_many_providers_hammering_one_file_never_see_database_is_locked(
    db_path: Path,
) -> None:
    providers = [SQLiteLeaseProvider(db_path, timeout_s=10.0) for _ in range(6)]

    async def churn(p: SQLiteLeaseProvider, owner: str) -> int:
        wins = 0
        successor = owner + "-next"
        for i in range(150):
            key = f"k{i % 3}"
            # Long TTLs: every lease ends by its release, never by a stall of this run.
            if (await p.acquire_lease(key, owner, 60_000)).acquired:
                wins += 1
                assert await p.transfer_lease(key, owner, successor, 60_000) is True
                assert await p.get_lease_owner(key) == successor
                await p.release_lease(key, successor)
                assert await p.get_lease_owner(key) not in (owner, successor)
        return wins

    wins = await asyncio.gather(*(churn(p, f"o{i}") for i, p in enumerate(providers)))
    assert sum(wins) > 0
    for p in providers:
        await p.aclose()


class ForeignWriteLock:
    """Another connection (as another process would) holding the file's write lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.release = threading.Event()
        self.thread: threading.Thread | None = None

    def take(self) -> None:
        locked = threading.Event()

        def hold() -> None:
            conn = sqlite3.connect(self.path, isolation_level=None)
            conn.execute("BEGIN EXCLUSIVE")
            locked.set()
            self.release.wait(30)
            conn.execute("ROLLBACK")
            conn.close()

        self.thread = threading.Thread(target=hold)
        self.thread.start()
        assert locked.wait(10)

    def drop(self) -> None:
        self.release.set()
        if self.thread is not None:
            self.thread.join()


@pytest.fixture
def foreign_lock(db_path: Path) -> Iterator[ForeignWriteLock]:
    lock = ForeignWriteLock(db_path)
    yield lock
    lock.drop()


async def test_a_stalled_file_lock_becomes_a_backend_error_within_the_timeout(
    db_path: Path, foreign_lock: ForeignWriteLock
) -> None:
    provider = SQLiteLeaseProvider(db_path, timeout_s=0.5)
    assert (await provider.acquire_lease("other", "a", 60_000)).acquired
    foreign_lock.take()
    assert await provider.get_lease_owner("other") == "a"  # WAL: reads go on under a writer
    started = time.monotonic()
    with pytest.raises(leasekit.LeaseBackendError) as info:
        await provider.acquire_lease("k", "a", 1000)
    elapsed = time.monotonic() - started
    assert "timed out" in str(info.value)
    assert info.value.key == "k"
    assert elapsed < 30  # bounded: never a hang (the precise bound is a benchmark matter)
    foreign_lock.drop()
    assert (await provider.acquire_lease("k", "a", 1000)).acquired
    await provider.aclose()


async def test_operations_after_close_raise_provider_closed(db_path: Path) -> None:
    provider = SQLiteLeaseProvider(db_path)
    await provider.acquire_lease("k", "a", 1000)
    await provider.aclose()
    with pytest.raises(leasekit.LeaseProviderClosed):
        await provider.get_lease_owner("k")
    await provider.aclose()  # idempotent
