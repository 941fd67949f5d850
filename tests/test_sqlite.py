"""The SQLite backend beyond the shared suite: files, URLs, contention, sweeps, faults."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
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
        ("sqlite:///x.db?colour=blue", "url"),
        ("sqlite:///x.db?sweep_batch=0", "sweep_batch"),
        ("sqlite:///x.db?create=maybe", "create"),
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


def test_options_are_coerced_the_toolkit_way() -> None:
    provider = leasekit.connect("sqlite:///x.db?synchronous=NORMAL&create=off&sweep_every=8")
    assert isinstance(provider, SQLiteLeaseProvider)
    assert provider.create is False
    assert "x.db" in repr(provider)


@pytest.mark.parametrize("create", [True, False])
async def test_a_missing_directory_is_unreachable_naming_it(tmp_path: Path, create: bool) -> None:
    missing = tmp_path / "missing-dir"
    with pytest.raises(leasekit.LeaseBackendUnreachable) as info:
        async with SQLiteLeaseProvider(missing / "x.db", create=create):
            pass
    assert info.value.backend == "sqlite"
    assert f"directory {str(missing)!r} does not exist" in str(info.value)
    assert not missing.exists()


def _entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def test_create_false_never_creates_the_file_and_names_it(tmp_path: Path) -> None:
    """``leasekit owner``/``inspect`` on a typo: an error naming the path, no new file."""
    typo = tmp_path / "typo.db"
    provider = leasekit.connect(f"sqlite:///{typo}", create=False)
    assert isinstance(provider, SQLiteLeaseProvider)
    with pytest.raises(leasekit.LeaseBackendUnreachable) as info:
        await provider.get_lease_owner("k")
    assert f"no SQLite file at {str(typo)!r}" in str(info.value)
    with pytest.raises(leasekit.LeaseBackendUnreachable):
        await provider.inspect()
    with pytest.raises(leasekit.LeaseBackendUnreachable):
        await provider.__aenter__()
    assert _entries(tmp_path) == []


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leasekit", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("command", [("owner", "k"), ("inspect",)])
def test_read_only_cli_commands_never_create_a_file(tmp_path: Path, command: tuple[str]) -> None:
    typo = tmp_path / "typo.db"
    name, *rest = command
    run = _cli(name, f"sqlite:///{typo}", *rest)
    assert run.returncode == 3, run.stdout + run.stderr
    assert f"no SQLite file at {str(typo)!r}" in run.stderr
    assert _entries(tmp_path) == []
    missing = tmp_path / "no-such-dir"
    run = _cli(name, f"sqlite:///{missing / 'x.db'}", *rest)
    assert run.returncode == 3, run.stdout + run.stderr
    assert f"directory {str(missing)!r} does not exist" in run.stderr


def test_read_only_cli_commands_read_an_existing_file(db_path: Path) -> None:
    url = f"sqlite:///{db_path}"
    assert _cli("acquire", url, "k", "alice", "--ttl-ms", "60000").returncode == 0
    owner = _cli("owner", url, "k")
    assert (owner.returncode, owner.stdout.strip()) == (0, "alice")
    listed = _cli("inspect", url)
    assert listed.returncode == 0
    assert listed.stdout.startswith("k\talice\t")


async def test_create_false_reads_an_existing_file(db_path: Path) -> None:
    async with SQLiteLeaseProvider(db_path) as writer:
        await writer.acquire_lease("k", "a", 60_000)
    async with SQLiteLeaseProvider(db_path, create=False) as reader:
        assert await reader.get_lease_owner("k") == "a"
        assert [r.key for r in await reader.inspect()] == ["k"]


async def test_create_false_on_a_file_without_our_tables_says_so(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    sqlite3.connect(other).close()
    other.write_bytes(b"")  # an empty file is a valid, empty SQLite database
    with pytest.raises(leasekit.LeaseBackendUnreachable, match="no leasekit tables"):
        async with SQLiteLeaseProvider(other, create=False):
            pass


async def test_create_schema_is_the_other_sql_backends_name_for_create(tmp_path: Path) -> None:
    typo = tmp_path / "typo.db"
    with pytest.raises(leasekit.LeaseBackendUnreachable, match="no SQLite file"):
        async with SQLiteLeaseProvider(typo, create_schema=False):
            pass
    assert _entries(tmp_path) == []
    provider = leasekit.connect(f"sqlite:///{typo}?create_schema=off")
    assert isinstance(provider, SQLiteLeaseProvider)
    assert provider.create is False
    with pytest.raises(leasekit.InvalidLeaseArgument) as info:
        SQLiteLeaseProvider(typo, create=True, create_schema=False)
    assert info.value.argument == "create_schema"


async def test_migrate_creates_the_tables_idempotently(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    async with SQLiteLeaseProvider(path) as provider:
        assert await provider.migrate() == 2
        assert await provider.migrate() == 2
    run = _cli("migrate", f"sqlite:///{path}")
    assert run.returncode == 0, run.stdout + run.stderr
    async with SQLiteLeaseProvider(path, create=False) as reader:
        assert await reader.get_lease_owner("k") is None


# The tables as the first schema version made them (no metadata column).
_SCHEMA_1 = """
CREATE TABLE leasekit_leases (
    key BLOB PRIMARY KEY NOT NULL, owner BLOB NOT NULL, token INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE leasekit_meta (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL);
INSERT INTO leasekit_meta VALUES ('token_floor', 0), ('schema_version', 1);
INSERT INTO leasekit_leases VALUES (
    CAST('held' AS BLOB), CAST('old-owner' AS BLOB), 41,
    CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + 600000
);
"""


def _schema_1_file(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.executescript(_SCHEMA_1)
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize("kind", ["async", "blocking"])
def test_a_file_of_the_first_schema_is_upgraded_and_keeps_its_leases(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "old.db"
    _schema_1_file(path)
    url = f"sqlite:///{path}"

    # Reading without create writes nothing, and says how to upgrade.
    reader = leasekit.sync.connect(url, create=False)
    with pytest.raises(leasekit.LeaseBackendUnreachable, match=r"schema version 1.*migrate"):
        reader.get_lease_owner("held")
    reader.close()

    def use(leases: leasekit.sync.SyncLeaseProvider) -> None:
        denied = leases.acquire_lease("held", "new", 60_000, metadata=b"m")
        assert denied == leasekit.LeaseResult(False, "old-owner", None)  # kept, no metadata
        granted = leases.acquire_lease("fresh", "new", 60_000, metadata=b"10.0.0.9:80")
        assert granted == leasekit.LeaseResult(True, "new", 1, b"10.0.0.9:80")
        record = leases.get_lease_record("fresh")
        assert record is not None
        assert (record.owner, record.token, record.metadata) == ("new", 1, b"10.0.0.9:80")
        leases.release_lease("held", "old-owner")
        assert leases.acquire_lease("held", "new", 60_000).token == 42  # the token goes on
        # The counting leases' tables came with the upgrade.
        assert leases.acquire_slot("pool", "new", 60_000, limit=2).acquired
        assert [r.owner for r in leases.get_slot_holders("pool")] == ["new"]

    # The async provider through a facade over it, or the native blocking one.
    made = (
        leasekit.sync.wrap(SQLiteLeaseProvider(path), close=True)
        if kind == "async"
        else leasekit.sync.connect(url)
    )
    with made as leases:
        assert leases.native is (kind == "blocking")
        use(leases)
    with sqlite3.connect(path) as conn:
        version = conn.execute(
            "SELECT value FROM leasekit_meta WHERE name = 'schema_version'"
        ).fetchone()[0]
    assert version == 2


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
    assert version == 2


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


async def test_a_sweep_reads_one_window_of_keys_and_a_pass_reaches_every_expired_row(
    db_path: Path,
) -> None:
    # No index on the expiry: each sweep walks the next sweep_batch keys in key order,
    # deletes the expired ones among them (live ones stay), and the next pass starts
    # over from the first key.
    async with SQLiteLeaseProvider(db_path, sweep_every=1_000_000, sweep_batch=4) as provider:
        for i in range(10):
            assert (await provider.acquire_lease(f"k{i}", "a", 60_000)).acquired
        for i in (0, 1, 2, 5, 6, 8):
            await provider.release_lease(f"k{i}", "a")  # a tombstone, expired at once
        # Windows k0-k3, k4-k7, k8-k9; none all expired, so no write sweeps meanwhile.
        assert [await provider.sweep() for _ in range(3)] == [3, 2, 1]
        assert await provider.row_count() == 4
        assert [r.key for r in await provider.inspect()] == ["k3", "k4", "k7", "k9"]
        assert (await provider.acquire_lease("k0", "b", 60_000)).acquired
        await provider.release_lease("k4", "a")
        # The next pass, from the first key again: k0 is live now, k4 expired.
        assert await provider.sweep() == 1
        assert [r.key for r in await provider.inspect()] == ["k0", "k3", "k7", "k9"]
        assert await provider.row_count() == 4


async def test_each_lease_write_changes_one_page(db_path: Path) -> None:
    # One B-tree page per acquire and per release: the WAL gains one frame per write.
    # An index on the expiry, which every write changes, made it two.
    async with SQLiteLeaseProvider(db_path, sweep_every=1_000_000) as provider:
        for i in range(8):
            assert (await provider.acquire_lease(f"k{i}", "a", 60_000)).acquired
        with sqlite3.connect(db_path) as reader:
            reader.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for i in range(8):
            await provider.release_lease(f"k{i}", "a")
            assert (await provider.acquire_lease(f"k{i}", "b", 60_000)).acquired
        with sqlite3.connect(db_path) as reader:
            busy, frames, _ = reader.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert (busy, frames) == (0, 16)


async def test_the_sweep_after_writes_leaves_a_table_smaller_than_one_window_alone(
    db_path: Path,
) -> None:
    # Keys in use, released and taken again: their tombstones stay (the tokens go on
    # rising from them) and no sweep writes a transaction of its own: one WAL frame
    # per write, though a sweep follows every write.
    async with SQLiteLeaseProvider(db_path, sweep_every=1, sweep_batch=16) as provider:
        tokens = []
        for i in range(8):
            assert (await provider.acquire_lease(f"k{i}", "a", 60_000)).acquired
        with sqlite3.connect(db_path) as reader:
            reader.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for _ in range(3):
            for i in range(8):
                await provider.release_lease(f"k{i}", "a")
                result = await provider.acquire_lease(f"k{i}", "a", 60_000)
                tokens.append(result.token)
        with sqlite3.connect(db_path) as reader:
            busy, frames, _ = reader.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert (busy, frames) == (0, 48)
        assert await provider.row_count() == 8
        # Asked for, a sweep still reclaims them.
        for i in range(8):
            await provider.release_lease(f"k{i}", "a")
        assert await provider.sweep() == 8
        assert await provider.row_count() == 0
        # A table of a full window is swept after writes again.
    async with SQLiteLeaseProvider(db_path, sweep_every=1, sweep_batch=4) as provider:
        for i in range(4):
            assert (await provider.acquire_lease(f"k{i}", "a", 60_000)).acquired
            await provider.release_lease(f"k{i}", "a")
        assert await provider.row_count() < 4


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


async def test_a_stalled_file_lock_becomes_a_timeout_and_then_clears(
    db_path: Path, foreign_lock: ForeignWriteLock
) -> None:
    provider = SQLiteLeaseProvider(db_path, timeout_s=0.5)
    assert (await provider.acquire_lease("other", "a", 60_000)).acquired
    foreign_lock.take()
    assert await provider.get_lease_owner("other") == "a"  # WAL: reads go on under a writer
    with pytest.raises(leasekit.LeaseBackendTimeout) as info:
        await provider.acquire_lease("k", "a", 1000)
    assert info.value.key == "k"
    assert info.value.backend == "sqlite"
    foreign_lock.drop()
    assert (await provider.acquire_lease("k", "a", 1000)).acquired
    await provider.aclose()


# Another process that takes the file's write lock and keeps it until its stdin closes.
_HOLD_WRITE_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
"""


@pytest.fixture
def foreign_process_lock(db_path: Path) -> Iterator[Callable[[], None]]:
    """Call it to make another process hold ``db_path``'s write lock until the test ends."""
    procs: list[subprocess.Popen[str]] = []

    def take() -> None:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLD_WRITE_LOCK, str(db_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "locked"

    yield take
    for proc in procs:
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.close()
        proc.wait(30)
        proc.stdout.close()


async def test_every_call_queued_behind_another_process_lock_ends_at_its_deadline(
    db_path: Path, foreign_process_lock: Callable[[], None]
) -> None:
    """20 writes on one provider's single thread: queued ones too end at their own deadline."""
    timeout_s = 0.5
    async with SQLiteLeaseProvider(db_path, timeout_s=timeout_s) as provider:
        await provider.acquire_lease("warm", "a", 60_000)
        foreign_process_lock()
        loop = asyncio.get_running_loop()

        async def write(i: int) -> tuple[float, float, BaseException | None]:
            started = loop.time()
            try:
                await provider.acquire_lease(f"k{i}", "a", 60_000)
            except leasekit.LeaseBackendTimeout as exc:
                return started, loop.time(), exc
            return started, loop.time(), None

        spans = await asyncio.gather(*(write(i) for i in range(20)))
        # Opening another provider on the prepared file needs no write lock.
        async with SQLiteLeaseProvider(db_path, timeout_s=timeout_s) as other:
            assert await other.get_lease_owner("warm") == "a"
    for i, (started, ended, error) in enumerate(spans):
        assert error is not None, f"write {i} did not time out"
        assert ended <= started + timeout_s + 0.1, (i, ended - started)


async def test_operations_after_close_raise_provider_closed(db_path: Path) -> None:
    provider = SQLiteLeaseProvider(db_path)
    await provider.acquire_lease("k", "a", 1000)
    await provider.aclose()
    with pytest.raises(leasekit.LeaseProviderClosed):
        await provider.get_lease_owner("k")
    await provider.aclose()  # idempotent


# -- statements per operation -------------------------------------------------------------


async def test_each_operation_runs_one_statement_and_a_denial_two(db_path: Path) -> None:
    # The deciding statement alone, in autocommit (it takes the write lock as BEGIN
    # IMMEDIATE would): no BEGIN/COMMIT around it and no busy_timeout PRAGMA before it
    # while the one already set still fits the call's deadline. That is while calls start
    # within 1% of timeout_s of each other's pace: a long timeout_s keeps a loaded
    # machine's thread hops (CI saw one over the 50 ms of the default) inside it.
    async with SQLiteLeaseProvider(db_path, sweep_every=1_000_000, timeout_s=600) as provider:
        assert (await provider.acquire_lease("warm", "a", 60_000)).acquired
        statements: list[str] = []
        conn = provider._connection._connection._conn  # the thread's sqlite3 connection
        assert conn is not None
        conn.set_trace_callback(statements.append)

        async def run(operation: Callable[[], object]) -> list[str]:
            statements.clear()
            await operation()  # type: ignore[misc]
            return [" ".join(s.split()[:3]) for s in statements]  # verb and table

        assert await run(lambda: provider.acquire_lease("k", "a", 60_000)) == [
            "INSERT INTO leasekit_leases"
        ]
        assert await run(lambda: provider.renew_lease("k", "a", 60_000)) == [
            "UPDATE leasekit_leases SET"
        ]
        assert await run(lambda: provider.transfer_lease("k", "a", "b", 60_000)) == [
            "UPDATE leasekit_leases SET"
        ]
        denied = await provider.acquire_lease("k", "c", 60_000)
        assert (denied.acquired, denied.owner) == (False, "b")
        assert await run(lambda: provider.acquire_lease("k", "c", 60_000)) == [
            "INSERT INTO leasekit_leases",
            "SELECT owner, metadata",
        ]
        assert await run(lambda: provider.release_lease("k", "b")) == ["UPDATE leasekit_leases SET"]
        assert await provider.get_lease_owner("k") is None
        # Still atomic where it takes several statements: the sweep.
        assert await run(provider.sweep) == [
            "BEGIN IMMEDIATE",
            "SELECT CAST((julianday('now') -",
            "UPDATE leasekit_meta SET",
            "DELETE FROM leasekit_leases",
            "COMMIT",
        ]
