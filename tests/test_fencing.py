"""Fencing guards (``leasekit.fencing``) end to end, on a real SQLite file, PostgreSQL,
MySQL/MariaDB and Redis.

For every store: a stale token is refused with nothing written, an equal one passes, a
higher one advances the fence, a rolled-back transaction leaves the fence where it
was, bad input is refused before any I/O, and writers racing with old and new tokens
leave the new token's write in place. Races are made deterministic by holding the
winner's transaction open until the loser is waiting (observed by the server where it
can tell), never by sleeping.
"""

from __future__ import annotations

import asyncio
import random
import re
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from scenarios import connect_mysql
from servers import missing_extra

import leasekit
from leasekit import InvalidLeaseArgument, StaleFencingToken
from leasekit.fencing import (
    MAX_FENCING_TOKEN,
    ensure_sqlite_fence_table,
    fence_sqlite,
    validate_token,
)
from leasekit.fencing._redis import _REDIS_FENCED_WRITE

# The SQLite tests always run; the PostgreSQL, MySQL and Redis ones need their extras.
try:
    import psycopg
except ImportError:  # pragma: no cover (depends on the environment)
    psycopg = None
try:
    import asyncmy
except ImportError:  # pragma: no cover
    asyncmy = None
try:
    import redis
    import redis.asyncio
    from redis.exceptions import ResponseError
except ImportError:  # pragma: no cover
    redis = None


def _require(module: object, extra: str) -> None:
    if module is None:
        missing_extra(extra, "the fencing tests of this store")


BAD_TOKENS = [None, True, 0, -1, 1.0, "7", MAX_FENCING_TOKEN + 1]
BAD_RESOURCES = ["", 7, None, b"bytes", "x" * 1025, "\ud800"]


# -- common --------------------------------------------------------------------------------


@pytest.mark.parametrize("token", BAD_TOKENS)
def test_bad_tokens_are_refused_naming_the_argument(token: object) -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        validate_token(token)
    assert info.value.argument == "token"


def test_largest_token_is_accepted() -> None:
    assert validate_token(MAX_FENCING_TOKEN) == MAX_FENCING_TOKEN


def test_the_module_is_reachable_from_the_package_and_loads_no_driver() -> None:
    probe = (
        "import sys, leasekit\n"
        "assert 'leasekit.fencing' not in sys.modules\n"
        "leasekit.fencing.fence_sqlite\n"
        "loaded = {n.partition('.')[0] for n in sys.modules}\n"
        "print(sorted(loaded & {'redis', 'psycopg', 'psycopg_pool', 'asyncmy'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


# -- SQLite --------------------------------------------------------------------------------


def _sqlite(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS doc (id INTEGER PRIMARY KEY, body TEXT, token INT)")
    conn.execute("CREATE TABLE IF NOT EXISTS log (n INTEGER PRIMARY KEY, token INT)")
    return conn


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "resource.db"
    _sqlite(path).close()
    return path


def _sqlite_write(conn: sqlite3.Connection, resource: str, token: int, body: str) -> None:
    """The caller's side: one transaction, the guard first, then the write."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        fence_sqlite(conn, resource, token)
        conn.execute("INSERT OR REPLACE INTO doc (id, body, token) VALUES (1, ?, ?)", (body, token))
        conn.execute("INSERT INTO log (token) VALUES (?)", (token,))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _sqlite_fence(conn: sqlite3.Connection, resource: str = "doc-1") -> int | None:
    row = conn.execute(
        "SELECT token FROM leasekit_fence WHERE resource = ?", (resource.encode(),)
    ).fetchone()
    return None if row is None else int(row[0])


def test_sqlite_stale_is_refused_equal_passes_higher_advances(db: Path) -> None:
    conn = _sqlite(db)
    _sqlite_write(conn, "doc-1", 5, "five")
    _sqlite_write(conn, "doc-1", 5, "five again")  # the same holder writes again
    with pytest.raises(StaleFencingToken) as info:
        _sqlite_write(conn, "doc-1", 4, "four")
    assert (info.value.resource, info.value.token, info.value.current) == ("doc-1", 4, 5)
    assert isinstance(info.value, leasekit.LeaseError)
    assert conn.execute("SELECT body FROM doc").fetchone() == ("five again",)
    _sqlite_write(conn, "doc-1", 9, "nine")
    assert _sqlite_fence(conn) == 9
    assert conn.execute("SELECT body FROM doc").fetchone() == ("nine",)


def test_sqlite_resources_are_independent_and_binary_safe(db: Path) -> None:
    conn = _sqlite(db)
    names = ["doc\0a", "doc\0b", "dóc ✓"]
    for token, name in enumerate(names, 10):
        _sqlite_write(conn, name, token, name)
    for token, name in enumerate(names, 10):
        assert _sqlite_fence(conn, name) == token


def test_sqlite_rolled_back_transaction_does_not_advance_the_fence(db: Path) -> None:
    conn = _sqlite(db)
    _sqlite_write(conn, "doc-1", 3, "three")
    conn.execute("BEGIN IMMEDIATE")
    fence_sqlite(conn, "doc-1", 8)
    conn.execute("ROLLBACK")
    assert _sqlite_fence(conn) == 3
    _sqlite_write(conn, "doc-1", 4, "four")  # 8 never counted: 4 is still current
    assert _sqlite_fence(conn) == 4


def test_sqlite_works_with_pythons_default_implicit_transactions(db: Path) -> None:
    conn = sqlite3.connect(db, timeout=30)  # legacy mode: sqlite3 BEGINs before the INSERT
    with conn:
        fence_sqlite(conn, "doc-1", 2)
    with pytest.raises(StaleFencingToken), conn:
        fence_sqlite(conn, "doc-1", 1)
    assert _sqlite_fence(conn) == 2


def test_sqlite_autocommit_outside_a_transaction_is_refused_with_nothing_written(
    db: Path,
) -> None:
    conn = _sqlite(db)
    with pytest.raises(InvalidLeaseArgument, match="BEGIN IMMEDIATE") as info:
        fence_sqlite(conn, "doc-1", 1)
    assert info.value.argument == "conn"
    assert not conn.execute(
        "SELECT name FROM sqlite_master WHERE name = 'leasekit_fence'"
    ).fetchall()


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        *[({"resource": r}, "resource") for r in BAD_RESOURCES],
        *[({"token": t}, "token") for t in BAD_TOKENS],
        ({"table": ""}, "table"),
        ({"table": "a.b.c"}, "table"),
        ({"table": 7}, "table"),
    ],
)
def test_sqlite_bad_input_is_refused_with_nothing_written(
    db: Path, kwargs: dict[str, Any], argument: str
) -> None:
    conn = _sqlite(db)
    conn.execute("BEGIN IMMEDIATE")
    call = {"resource": "doc-1", "token": 1, **kwargs}
    with pytest.raises(InvalidLeaseArgument) as info:
        fence_sqlite(conn, call.pop("resource"), call.pop("token"), **call)
    assert info.value.argument == argument
    conn.execute("COMMIT")
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "leasekit_fence" not in tables


def test_sqlite_custom_table_names_are_quoted(db: Path) -> None:
    conn = _sqlite(db)
    ensure_sqlite_fence_table(conn, table='odd "name"; DROP TABLE doc')
    ensure_sqlite_fence_table(conn, table='odd "name"; DROP TABLE doc')  # idempotent
    conn.execute("BEGIN IMMEDIATE")
    fence_sqlite(conn, "doc-1", 4, table='main.odd "name"; DROP TABLE doc')
    conn.execute("COMMIT")
    assert conn.execute('SELECT token FROM "odd ""name""; DROP TABLE doc"').fetchall() == [(4,)]
    assert conn.execute("SELECT count(*) FROM doc").fetchone() == (0,)


def test_sqlite_stale_writer_that_waited_for_the_newer_one_is_refused(db: Path) -> None:
    newer, older = _sqlite(db), _sqlite(db)
    _sqlite_write(newer, "doc-1", 1, "one")
    # The newer holder (token 3) is inside its transaction, past the guard and its write.
    newer.execute("BEGIN IMMEDIATE")
    fence_sqlite(newer, "doc-1", 3)
    newer.execute("UPDATE doc SET body = 'three', token = 3")
    # The stale holder (token 2) cannot get in before that transaction ends: its BEGIN
    # IMMEDIATE waits on the write lock, whenever its thread happens to run.
    outcome: list[BaseException | None] = []

    def stale() -> None:
        try:
            _sqlite_write(older, "doc-1", 2, "two")
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=stale)
    thread.start()
    newer.execute("COMMIT")
    thread.join(timeout=60)
    assert len(outcome) == 1
    assert isinstance(outcome[0], StaleFencingToken)
    assert outcome[0].current == 3
    assert newer.execute("SELECT body, token FROM doc").fetchone() == ("three", 3)


def test_sqlite_many_writers_racing_commit_in_token_order(db: Path) -> None:
    tokens = random.Random(17).sample(range(1, 1000), 24)
    start = threading.Barrier(len(tokens))
    refused: dict[int, int | None] = {}

    def writer(token: int) -> None:
        conn = _sqlite(db)
        start.wait()
        try:
            _sqlite_write(conn, "doc-1", token, f"by {token}")
        except StaleFencingToken as exc:
            refused[token] = exc.current
        finally:
            conn.close()

    threads = [threading.Thread(target=writer, args=(t,)) for t in tokens]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    conn = _sqlite(db)
    committed = [row[0] for row in conn.execute("SELECT token FROM log ORDER BY n")]
    assert committed == sorted(committed)
    assert sorted(committed + list(refused)) == sorted(tokens)
    assert all(current is not None and current > t for t, current in refused.items())
    assert conn.execute("SELECT body FROM doc").fetchone() == (f"by {max(tokens)}",)
    assert _sqlite_fence(conn) == max(tokens)


# -- PostgreSQL ----------------------------------------------------------------------------


@pytest.fixture
def pg_tables(postgres_url: str, postgres_schema: str) -> tuple[str, str]:
    """(fence table, document table), both new, in this run's schema."""
    _require(psycopg, "postgres")
    suffix = uuid.uuid4().hex[:10]
    fence, doc = f"{postgres_schema}.fence_{suffix}", f"{postgres_schema}.doc_{suffix}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {doc} (id int PRIMARY KEY, body text, token bigint)")
        conn.execute(f"INSERT INTO {doc} VALUES (1, 'none', 0)")
        leasekit.fencing.ensure_postgres_fence_table_sync(conn, table=fence)
    return fence, doc


async def _pg_write(conn: Any, fence: str, doc: str, token: int, body: str) -> None:
    async with conn.transaction():
        await leasekit.fencing.fence_postgres(conn, "doc-1", token, table=fence)
        await conn.execute(f"UPDATE {doc} SET body = %s, token = %s", (body, token))


async def _pg_fence(conn: Any, fence: str, resource: str = "doc-1") -> int | None:
    cur = await conn.execute(
        f"SELECT token FROM {fence} WHERE resource = %s",
        (resource.encode(),),
    )
    row = await cur.fetchone()
    return None if row is None else int(row[0])


async def _until_waiting_on_a_lock(observer: Any, conn: Any) -> None:
    """Return once the server reports ``conn``'s backend blocked on a lock (a row lock here)."""
    for _ in range(6000):
        cur = await observer.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
            (conn.info.backend_pid,),
        )
        if await cur.fetchone() == ("Lock",):
            return
        await asyncio.sleep(0.01)
    pytest.fail("the second writer never waited on the fence's row lock")


@pytest.fixture
async def pg(postgres_url: str) -> AsyncIterator[Any]:
    _require(psycopg, "postgres")
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        yield conn


@pytest.mark.anyio
async def test_postgres_stale_is_refused_equal_passes_higher_advances(
    pg: Any, pg_tables: tuple[str, str]
) -> None:
    fence, doc = pg_tables
    await _pg_write(pg, fence, doc, 5, "five")
    await _pg_write(pg, fence, doc, 5, "five again")
    with pytest.raises(StaleFencingToken) as info:
        await _pg_write(pg, fence, doc, 4, "four")
    assert (info.value.resource, info.value.token, info.value.current) == ("doc-1", 4, 5)
    cur = await pg.execute(f"SELECT body FROM {doc}")
    assert await cur.fetchone() == ("five again",)
    await _pg_write(pg, fence, doc, 2**62, "big")
    assert await _pg_fence(pg, fence) == 2**62


@pytest.mark.anyio
async def test_postgres_rolled_back_transaction_does_not_advance_the_fence(
    pg: Any, pg_tables: tuple[str, str]
) -> None:
    fence, doc = pg_tables
    await _pg_write(pg, fence, doc, 3, "three")

    async def abandoned() -> None:
        async with pg.transaction():
            await leasekit.fencing.fence_postgres(pg, "doc-1", 8, table=fence)
            raise RuntimeError("abandon the write")

    with pytest.raises(RuntimeError, match="abandon"):
        await abandoned()
    assert await _pg_fence(pg, fence) == 3
    await _pg_write(pg, fence, doc, 4, "four")
    assert await _pg_fence(pg, fence) == 4


@pytest.mark.anyio
async def test_postgres_cursor_and_implicit_transactions_work(
    postgres_url: str, pg_tables: tuple[str, str]
) -> None:
    fence, _ = pg_tables
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:  # autocommit off
        async with conn.cursor() as cur:
            await leasekit.fencing.fence_postgres(cur, "doc\0bin ✓", 7, table=fence)
        await conn.rollback()
        assert await _pg_fence(conn, fence, "doc\0bin ✓") is None
        await leasekit.fencing.fence_postgres(conn, "doc\0bin ✓", 7, table=fence)
        await conn.commit()
        assert await _pg_fence(conn, fence, "doc\0bin ✓") == 7


@pytest.mark.anyio
async def test_postgres_autocommit_outside_a_transaction_is_refused(
    pg: Any, pg_tables: tuple[str, str]
) -> None:
    fence, _ = pg_tables
    with pytest.raises(InvalidLeaseArgument, match="transaction") as info:
        await leasekit.fencing.fence_postgres(pg, "doc-1", 1, table=fence)
    assert info.value.argument == "conn"
    assert await _pg_fence(pg, fence) is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        *[({"resource": r}, "resource") for r in BAD_RESOURCES],
        *[({"token": t}, "token") for t in BAD_TOKENS],
        ({"table": "a.b.c"}, "table"),
    ],
)
async def test_postgres_bad_input_is_refused_with_nothing_written(
    pg: Any, pg_tables: tuple[str, str], kwargs: dict[str, Any], argument: str
) -> None:
    fence, _ = pg_tables
    call = {"resource": "doc-1", "token": 1, "table": fence, **kwargs}
    async with pg.transaction():
        with pytest.raises(InvalidLeaseArgument) as info:
            await leasekit.fencing.fence_postgres(
                pg, call.pop("resource"), call.pop("token"), **call
            )
    assert info.value.argument == argument
    cur = await pg.execute(f"SELECT count(*) FROM {fence}")
    assert await cur.fetchone() == (0,)


@pytest.mark.anyio
async def test_postgres_stale_writer_waits_on_the_row_lock_then_is_refused(
    postgres_url: str, pg: Any, pg_tables: tuple[str, str]
) -> None:
    fence, doc = pg_tables
    await _pg_write(pg, fence, doc, 1, "one")
    async with (
        await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as newer,
        await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as older,
    ):
        async with newer.transaction():
            await leasekit.fencing.fence_postgres(newer, "doc-1", 3, table=fence)
            await newer.execute(f"UPDATE {doc} SET body = 'three', token = 3")
            stale = asyncio.ensure_future(_pg_write(older, fence, doc, 2, "two"))
            await _until_waiting_on_a_lock(pg, older)
            assert not stale.done()
        with pytest.raises(StaleFencingToken) as info:
            await stale
    assert info.value.current == 3
    cur = await pg.execute(f"SELECT body, token FROM {doc}")
    assert await cur.fetchone() == ("three", 3)


@pytest.mark.anyio
async def test_postgres_newer_writer_waiting_behind_a_rollback_goes_through(
    postgres_url: str, pg: Any, pg_tables: tuple[str, str]
) -> None:
    fence, doc = pg_tables
    await _pg_write(pg, fence, doc, 1, "one")
    async with (
        await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as first,
        await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as second,
    ):
        waiting = []

        async def failing() -> None:
            async with first.transaction():
                await leasekit.fencing.fence_postgres(first, "doc-1", 9, table=fence)
                waiting.append(asyncio.ensure_future(_pg_write(second, fence, doc, 5, "five")))
                await _until_waiting_on_a_lock(pg, second)
                raise RuntimeError("token 9's transaction fails")

        with pytest.raises(RuntimeError):
            await failing()
        await waiting[0]  # 9 never committed, so 5 is not stale
    assert await _pg_fence(pg, fence) == 5


@pytest.mark.anyio
async def test_postgres_many_writers_racing_commit_in_token_order(
    postgres_url: str, pg: Any, pg_tables: tuple[str, str]
) -> None:
    fence, doc = pg_tables
    await pg.execute(f"CREATE TABLE {doc}_log (n serial PRIMARY KEY, token bigint)")
    tokens = random.Random(17).sample(range(1, 1000), 12)
    refused: list[int] = []

    async def writer(token: int) -> None:
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
            try:
                async with conn.transaction():
                    await leasekit.fencing.fence_postgres(conn, "doc-1", token, table=fence)
                    await conn.execute(f"UPDATE {doc} SET body = %s", (f"by {token}",))
                    await conn.execute(f"INSERT INTO {doc}_log (token) VALUES (%s)", (token,))
            except StaleFencingToken:
                refused.append(token)

    await asyncio.gather(*(writer(t) for t in tokens))
    cur = await pg.execute(f"SELECT token FROM {doc}_log ORDER BY n")
    committed = [row[0] for row in await cur.fetchall()]
    assert committed == sorted(committed)
    assert sorted(committed + refused) == sorted(tokens)
    cur = await pg.execute(f"SELECT body FROM {doc}")
    assert await cur.fetchone() == (f"by {max(tokens)}",)


def test_postgres_sync_guard_races_like_the_async_one(
    postgres_url: str, pg_tables: tuple[str, str]
) -> None:
    fence, doc = pg_tables
    fence_sync = leasekit.fencing.fence_postgres_sync
    with (
        psycopg.connect(postgres_url, autocommit=True) as newer,
        psycopg.connect(postgres_url) as older,
    ):
        with newer.transaction():
            fence_sync(newer, "doc-1", 3, table=fence)
            newer.execute(f"UPDATE {doc} SET body = 'three'")
            outcome: list[BaseException | None] = []

            def stale() -> None:
                try:
                    with older.transaction(), older.cursor() as cur:
                        fence_sync(cur, "doc-1", 2, table=fence)
                        cur.execute(f"UPDATE {doc} SET body = 'two'")
                    outcome.append(None)
                except BaseException as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=stale)
            thread.start()
        thread.join(timeout=60)
        assert len(outcome) == 1
        assert isinstance(outcome[0], StaleFencingToken)
        with pytest.raises(InvalidLeaseArgument):
            fence_sync(newer, "doc-1", 4, table=fence)  # autocommit, no transaction
        assert newer.execute(f"SELECT body FROM {doc}").fetchone() == ("three",)


@pytest.mark.anyio
async def test_postgres_ensure_is_idempotent_and_safe_to_race(
    postgres_url: str, postgres_schema: str
) -> None:
    table = f"{postgres_schema}.fence_{uuid.uuid4().hex[:10]}"
    conns = [await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) for _ in range(4)]
    try:
        await asyncio.gather(
            *(leasekit.fencing.ensure_postgres_fence_table(c, table=table) for c in conns)
        )
        await leasekit.fencing.ensure_postgres_fence_table(conns[0], table=table)
        async with conns[0].transaction():
            await leasekit.fencing.fence_postgres(conns[0], "r", 1, table=table)
    finally:
        for conn in conns:
            await conn.close()


# -- MySQL / MariaDB -----------------------------------------------------------------------


@pytest.fixture
async def my(mysql_url: str) -> AsyncIterator[Any]:
    """An autocommit asyncmy connection of the test's own (the caller's connection)."""
    _require(asyncmy, "mysql")
    conn = await connect_mysql(mysql_url)
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
async def my_tables(my: Any, mysql_database: str) -> tuple[str, str]:
    """(fence table, document table), both new, in this run's database."""
    suffix = uuid.uuid4().hex[:10]
    fence, doc = f"{mysql_database}.fence_{suffix}", f"{mysql_database}.doc_{suffix}"
    await leasekit.fencing.ensure_mysql_fence_table(my, table=fence)
    async with my.cursor() as cur:
        await cur.execute(
            f"CREATE TABLE {doc} (id INT PRIMARY KEY, body TEXT, token BIGINT) ENGINE=InnoDB"
        )
        await cur.execute(f"INSERT INTO {doc} VALUES (1, 'none', 0)")
        await cur.execute(
            f"CREATE TABLE {doc}_log (n INT AUTO_INCREMENT PRIMARY KEY, token BIGINT) ENGINE=InnoDB"
        )
    return fence, doc


async def _my_write(conn: Any, fence: str, doc: str, token: int, body: str) -> None:
    """The caller's side: one transaction, the guard first, then the write."""
    await conn.begin()
    try:
        await leasekit.fencing.fence_mysql(conn, "doc-1", token, table=fence)
        async with conn.cursor() as cur:
            await cur.execute(f"UPDATE {doc} SET body = %s, token = %s", (body, token))
            await cur.execute(f"INSERT INTO {doc}_log (token) VALUES (%s)", (token,))
        await conn.commit()
    except BaseException:
        await conn.rollback()
        raise


async def _my_one(conn: Any, query: str, *params: object) -> Any:
    async with conn.cursor() as cur:
        await cur.execute(query, params)
        return await cur.fetchone()


async def _my_fence(conn: Any, fence: str, resource: str = "doc-1") -> int | None:
    row = await _my_one(conn, f"SELECT token FROM {fence} WHERE resource = %s", resource.encode())
    return None if row is None else int(row[0])


async def _my_until_waiting_on_a_lock(observer: Any, thread_id: int) -> None:
    """Return once InnoDB reports the session ``thread_id`` waiting for a lock."""
    # InnoDB refreshes its information_schema snapshot of transactions only when nobody
    # has read it for 0.1 s: a faster poll would read the same stale rows forever.
    for _ in range(400):
        row = await _my_one(
            observer,
            "SELECT COUNT(*) FROM information_schema.innodb_trx"
            " WHERE trx_mysql_thread_id = %s AND trx_state = 'LOCK WAIT'",
            thread_id,
        )
        if row[0]:
            return
        await asyncio.sleep(0.15)
    pytest.fail("the second writer never waited on the fence's row lock")


async def _my_thread_id(conn: Any) -> int:
    return int((await _my_one(conn, "SELECT CONNECTION_ID()"))[0])


@pytest.mark.anyio
async def test_mysql_stale_is_refused_equal_passes_higher_advances(
    my: Any, my_tables: tuple[str, str]
) -> None:
    fence, doc = my_tables
    await _my_write(my, fence, doc, 5, "five")
    await _my_write(my, fence, doc, 5, "five again")  # the same holder writes again
    with pytest.raises(StaleFencingToken) as info:
        await _my_write(my, fence, doc, 4, "four")
    assert (info.value.resource, info.value.token, info.value.current) == ("doc-1", 4, 5)
    assert await _my_one(my, f"SELECT body FROM {doc}") == ("five again",)
    # Right after a refusal on the same session (LAST_INSERT_ID was just set), a token
    # that passes is not mistaken for a stale one.
    await _my_write(my, fence, doc, 2**62, "big")
    assert await _my_fence(my, fence) == 2**62
    await _my_write(my, fence, doc, MAX_FENCING_TOKEN, "max")
    with pytest.raises(StaleFencingToken) as info:
        await _my_write(my, fence, doc, MAX_FENCING_TOKEN - 1, "max - 1")
    assert info.value.current == MAX_FENCING_TOKEN
    assert await _my_one(my, f"SELECT body FROM {doc}") == ("max",)


@pytest.mark.anyio
async def test_mysql_rolled_back_transaction_does_not_advance_the_fence(
    my: Any, my_tables: tuple[str, str]
) -> None:
    fence, doc = my_tables
    await _my_write(my, fence, doc, 3, "three")
    await my.begin()
    await leasekit.fencing.fence_mysql(my, "doc-1", 8, table=fence)
    await my.rollback()
    assert await _my_fence(my, fence) == 3
    await _my_write(my, fence, doc, 4, "four")  # 8 never counted: 4 is still current
    assert await _my_fence(my, fence) == 4


@pytest.mark.anyio
async def test_mysql_cursor_and_autocommit_off_connections_work_binary_safe(
    mysql_url: str, my_tables: tuple[str, str]
) -> None:
    fence, _ = my_tables
    name = "doc\0bin ✓"
    conn = await connect_mysql(mysql_url, autocommit=False)  # asyncmy's default
    try:
        async with conn.cursor() as cur:
            await leasekit.fencing.fence_mysql(cur, name, 7, table=fence)
        await conn.rollback()
        assert await _my_fence(conn, fence, name) is None
        await conn.commit()  # end the read's snapshot
        await leasekit.fencing.fence_mysql(conn, name, 7, table=fence)
        await conn.commit()
        assert await _my_fence(conn, fence, name) == 7
        await conn.commit()
        assert await _my_fence(conn, fence, "doc") is None  # NUL is not a terminator
    finally:
        conn.close()


@pytest.mark.anyio
async def test_mysql_autocommit_outside_a_transaction_is_refused(
    my: Any, my_tables: tuple[str, str]
) -> None:
    fence, _ = my_tables
    with pytest.raises(InvalidLeaseArgument, match="transaction") as info:
        await leasekit.fencing.fence_mysql(my, "doc-1", 1, table=fence)
    assert info.value.argument == "conn"
    async with my.cursor() as cur:
        with pytest.raises(InvalidLeaseArgument):
            await leasekit.fencing.fence_mysql(cur, "doc-1", 1, table=fence)
    assert await _my_fence(my, fence) is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        *[({"resource": r}, "resource") for r in BAD_RESOURCES],
        *[({"token": t}, "token") for t in BAD_TOKENS],
        ({"table": "a.b.c"}, "table"),
        ({"table": ""}, "table"),
    ],
)
async def test_mysql_bad_input_is_refused_with_nothing_written(
    my: Any, my_tables: tuple[str, str], kwargs: dict[str, Any], argument: str
) -> None:
    fence, _ = my_tables
    call = {"resource": "doc-1", "token": 1, "table": fence, **kwargs}
    await my.begin()
    with pytest.raises(InvalidLeaseArgument) as info:
        await leasekit.fencing.fence_mysql(my, call.pop("resource"), call.pop("token"), **call)
    await my.commit()
    assert info.value.argument == argument
    assert await _my_one(my, f"SELECT COUNT(*) FROM {fence}") == (0,)


@pytest.mark.anyio
async def test_mysql_stale_writer_waits_on_the_row_lock_then_is_refused(
    mysql_url: str, my: Any, my_tables: tuple[str, str]
) -> None:
    fence, doc = my_tables
    await _my_write(my, fence, doc, 1, "one")
    newer, older = await connect_mysql(mysql_url), await connect_mysql(mysql_url)
    try:
        older_id = await _my_thread_id(older)
        await newer.begin()
        await leasekit.fencing.fence_mysql(newer, "doc-1", 3, table=fence)
        async with newer.cursor() as cur:
            await cur.execute(f"UPDATE {doc} SET body = 'three', token = 3")
        stale = asyncio.ensure_future(_my_write(older, fence, doc, 2, "two"))
        await _my_until_waiting_on_a_lock(my, older_id)
        assert not stale.done()
        await newer.commit()
        with pytest.raises(StaleFencingToken) as info:
            await stale
    finally:
        newer.close()
        older.close()
    assert info.value.current == 3
    assert await _my_one(my, f"SELECT body, token FROM {doc}") == ("three", 3)


@pytest.mark.anyio
async def test_mysql_newer_writer_waiting_behind_a_rollback_goes_through(
    mysql_url: str, my: Any, my_tables: tuple[str, str]
) -> None:
    fence, doc = my_tables
    await _my_write(my, fence, doc, 1, "one")
    first, second = await connect_mysql(mysql_url), await connect_mysql(mysql_url)
    try:
        second_id = await _my_thread_id(second)
        await first.begin()
        await leasekit.fencing.fence_mysql(first, "doc-1", 9, table=fence)
        waiting = asyncio.ensure_future(_my_write(second, fence, doc, 5, "five"))
        await _my_until_waiting_on_a_lock(my, second_id)
        await first.rollback()  # token 9's transaction fails
        await waiting  # 9 never committed, so 5 is not stale
    finally:
        first.close()
        second.close()
    assert await _my_fence(my, fence) == 5
    assert await _my_one(my, f"SELECT body FROM {doc}") == ("five",)


@pytest.mark.anyio
async def test_mysql_many_writers_racing_commit_in_token_order(
    mysql_url: str, my: Any, my_tables: tuple[str, str]
) -> None:
    fence, doc = my_tables
    tokens = random.Random(17).sample(range(1, 1000), 12)
    refused: dict[int, int | None] = {}

    async def writer(token: int) -> None:
        conn = await connect_mysql(mysql_url)
        try:
            await _my_write(conn, fence, doc, token, f"by {token}")
        except StaleFencingToken as exc:
            refused[token] = exc.current
        finally:
            conn.close()

    await asyncio.gather(*(writer(t) for t in tokens))
    async with my.cursor() as cur:
        await cur.execute(f"SELECT token FROM {doc}_log ORDER BY n")
        committed = [int(row[0]) for row in await cur.fetchall()]
    assert committed == sorted(committed)
    assert sorted(committed + list(refused)) == sorted(tokens)
    assert all(current is not None and current > t for t, current in refused.items())
    assert await _my_one(my, f"SELECT body FROM {doc}") == (f"by {max(tokens)}",)
    assert await _my_fence(my, fence) == max(tokens)


@pytest.mark.anyio
async def test_mysql_ensure_is_idempotent_safe_to_race_and_quotes_names(
    mysql_url: str, mysql_database: str
) -> None:
    _require(asyncmy, "mysql")
    table = f"{mysql_database}.odd `fence` {uuid.uuid4().hex[:6]}"
    conns = [await connect_mysql(mysql_url) for _ in range(4)]
    try:
        await asyncio.gather(
            *(leasekit.fencing.ensure_mysql_fence_table(c, table=table) for c in conns)
        )
        await leasekit.fencing.ensure_mysql_fence_table(conns[0], table=table)
        await conns[0].begin()
        await leasekit.fencing.fence_mysql(conns[0], "r", 1, table=table)
        await conns[0].commit()
        quoted = ".".join("`" + p.replace("`", "``") + "`" for p in table.split("."))
        assert await _my_one(conns[0], f"SELECT token FROM {quoted}") == (1,)
    finally:
        for conn in conns:
            conn.close()


# -- Redis ---------------------------------------------------------------------------------


@pytest.fixture
async def rds(redis_url: str) -> AsyncIterator[Any]:
    _require(redis, "redis")
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def names(redis_prefix: str) -> Callable[[str], str]:
    return lambda suffix: redis_prefix + suffix


async def _fenced(rds: Any, names: Callable[[str], str], token: int, *commands: Any) -> list[Any]:
    return await leasekit.fencing.fenced_redis_write(
        rds, "doc-1", token, list(commands), prefix=names("fence:")
    )


@pytest.mark.anyio
async def test_redis_stale_is_refused_equal_passes_higher_advances(
    rds: Any, names: Callable[[str], str]
) -> None:
    doc = names("doc")
    assert await _fenced(rds, names, 5, ("SET", doc, "five")) == [b"OK"]
    assert await _fenced(rds, names, 5, ("SET", doc, "five again")) == [b"OK"]
    with pytest.raises(StaleFencingToken) as info:
        await _fenced(rds, names, 4, ("SET", doc, "four"), ("DEL", names("other")))
    assert (info.value.resource, info.value.token, info.value.current) == ("doc-1", 4, 5)
    assert await rds.get(doc) == b"five again"
    await _fenced(rds, names, 6, ("SET", doc, "six"))
    assert await rds.get(names("fence:doc-1")) == b"6"
    assert await rds.ttl(names("fence:doc-1")) == -1  # the fence never expires


@pytest.mark.anyio
async def test_redis_every_allowed_command_runs_and_replies(
    rds: Any, names: Callable[[str], str]
) -> None:
    doc, hsh, log, gone = names("doc"), names("h"), names("log"), names("gone")
    await rds.set(gone, "x")
    replies = await _fenced(
        rds,
        names,
        1,
        ("set", doc, b"v\0", "EX", 100),
        ("HSET", hsh, "a", 1, "b", 2.5),
        ("XADD", log, "*", "token", 1),
        ("EXPIRE", hsh, 100),
        ("DEL", gone, names("never-existed")),
    )
    assert replies[0] == b"OK"
    assert replies[1:] == [2, replies[2], 1, 1]
    assert replies[2].endswith(b"-0")  # the stream entry's id
    assert await rds.get(doc) == b"v\0"
    assert await rds.hgetall(hsh) == {b"a": b"1", b"b": b"2.5"}
    assert 0 < await rds.ttl(hsh) <= 100
    assert await rds.exists(gone) == 0


@pytest.mark.anyio
async def test_redis_tokens_above_two_to_the_53_compare_exactly(
    rds: Any, names: Callable[[str], str]
) -> None:
    big = MAX_FENCING_TOKEN
    await _fenced(rds, names, big, ("SET", names("doc"), "max"))
    with pytest.raises(StaleFencingToken) as info:  # equal as doubles, not as integers
        await _fenced(rds, names, big - 1, ("SET", names("doc"), "max - 1"))
    assert info.value.current == big
    assert await rds.get(names("doc")) == b"max"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("first", "second"),
    [(9, 10), (19, 21), (99, 100), (2**53, 2**53 + 1), (10**18 + 8, 10**18 + 9)],
)
async def test_redis_compares_tokens_as_integers(
    rds: Any, names: Callable[[str], str], first: int, second: int
) -> None:
    await _fenced(rds, names, first, ("SET", names("doc"), first))
    await _fenced(rds, names, second, ("SET", names("doc"), second))
    with pytest.raises(StaleFencingToken):
        await _fenced(rds, names, first, ("SET", names("doc"), first))
    assert await rds.get(names("doc")) == str(second).encode()


@pytest.mark.anyio
@pytest.mark.parametrize(
    "commands",
    [
        [("SET", "{k}", "v"), ("FLUSHALL",)],
        [("SET", "{k}", "v"), ("EVAL", "return 1", 0)],
        [("SET", "{k}", "v"), ("SET", "{k}")],
        [("SET", "{k}", "v"), ("HSET", "{k}", "field")],
        [("SET", "{k}", "v"), ("EXPIRE", "{k}", 1, "NX", "extra")],
        [("SET", "{k}", "v"), ("SET", 7, "v")],
        [("SET", "{k}", "v"), ("SET", "{k}", None)],
        [("SET", "{k}", "v"), ("SET", "{k}", True)],
        [("SET", "{k}", "v"), "SET"],
        [("SET", "{k}", "v"), ()],
        [],
        "SET k v",
    ],
)
async def test_redis_disallowed_or_malformed_commands_are_refused_before_any_write(
    rds: Any, names: Callable[[str], str], commands: Any
) -> None:
    commands = (
        [
            tuple(names("doc") if a == "{k}" else a for a in c) if isinstance(c, tuple) else c
            for c in commands
        ]
        if isinstance(commands, list)
        else commands
    )
    with pytest.raises(InvalidLeaseArgument) as info:
        await leasekit.fencing.fenced_redis_write(rds, "doc-1", 1, commands, prefix=names("f:"))
    assert info.value.argument == "commands"
    assert await rds.exists(names("doc"), names("f:doc-1")) == 0


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        *[({"resource": r}, "resource") for r in BAD_RESOURCES],
        *[({"token": t}, "token") for t in BAD_TOKENS],
        ({"prefix": 7}, "prefix"),
    ],
)
async def test_redis_bad_input_is_refused_with_nothing_written(
    rds: Any, names: Callable[[str], str], kwargs: dict[str, Any], argument: str
) -> None:
    call: dict[str, Any] = {"resource": "doc-1", "token": 1, "prefix": names("f:"), **kwargs}
    with pytest.raises(InvalidLeaseArgument) as info:
        await leasekit.fencing.fenced_redis_write(
            rds, call.pop("resource"), call.pop("token"), [("SET", names("doc"), "v")], **call
        )
    assert info.value.argument == argument
    assert await rds.exists(names("doc")) == 0


@pytest.mark.anyio
async def test_redis_script_itself_refuses_other_commands_before_writing(
    rds: Any, names: Callable[[str], str]
) -> None:
    # Bypassing the Python-side check (a hand-built call): the script still refuses.
    fence, doc = names("f:doc-1"), names("doc")
    args = ["1", "2", "SET", "1", "1", "v", "CONFIG", "0", "2", "SET", "appendonly"]
    with pytest.raises(ResponseError, match="not allowed: CONFIG"):
        await rds.eval(_REDIS_FENCED_WRITE, 2, fence, doc, *args)
    assert await rds.exists(fence, doc) == 0


@pytest.mark.anyio
async def test_redis_flushed_script_cache_falls_back_to_eval(
    rds: Any, names: Callable[[str], str]
) -> None:
    await _fenced(rds, names, 1, ("SET", names("doc"), "one"))
    await rds.script_flush()
    await _fenced(rds, names, 2, ("SET", names("doc"), "two"))
    assert await rds.get(names("doc")) == b"two"


@pytest.mark.anyio
async def test_redis_many_writers_racing_apply_in_token_order(
    redis_url: str, names: Callable[[str], str]
) -> None:
    tokens = random.Random(17).sample(range(1, 10_000), 40)
    refused: dict[int, int | None] = {}
    clients = [redis.asyncio.Redis.from_url(redis_url) for _ in range(8)]

    async def writer(index: int, token: int) -> None:
        try:
            await leasekit.fencing.fenced_redis_write(
                clients[index % len(clients)],
                "doc-1",
                token,
                [("SET", names("doc"), token), ("XADD", names("log"), "*", "token", token)],
                prefix=names("fence:"),
            )
        except StaleFencingToken as exc:
            refused[token] = exc.current

    try:
        await asyncio.gather(*(writer(i, t) for i, t in enumerate(tokens)))
        entries = await clients[0].xrange(names("log"))
        applied = [int(fields[b"token"]) for _, fields in entries]
        assert applied == sorted(applied)
        assert sorted(applied + list(refused)) == sorted(tokens)
        assert all(current is not None and current > t for t, current in refused.items())
        assert await clients[0].get(names("doc")) == str(max(tokens)).encode()
    finally:
        for client in clients:
            await client.aclose()


def test_redis_sync_client_and_decoded_responses(
    redis_url: str, names: Callable[[str], str]
) -> None:
    _require(redis, "redis")
    write = leasekit.fencing.fenced_redis_write_sync
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        assert write(client, "doc\0x", 2, [("SET", names("doc"), "two")], prefix=names("f:")) == [
            "OK"
        ]
        with pytest.raises(StaleFencingToken) as info:
            write(client, "doc\0x", 1, [("SET", names("doc"), "one")], prefix=names("f:"))
        assert info.value.current == 2
        client.script_flush()
        write(client, "doc\0x", 3, [("DEL", names("doc"))], prefix=names("f:"))
        assert client.get(names("f:doc\0x")) == "3"
        assert client.exists(names("doc")) == 0


@pytest.mark.anyio
async def test_redis_cluster_with_one_hash_tag(redis_cluster: Any, redis_prefix: str) -> None:
    _require(redis, "redis")
    client = redis.asyncio.RedisCluster.from_url(redis_cluster.url)
    tag = "{" + redis_prefix + "doc-1}"
    try:
        await leasekit.fencing.fenced_redis_write(
            client, tag, 2, [("SET", tag + ":body", "two"), ("HSET", tag + ":meta", "by", 2)]
        )
        with pytest.raises(StaleFencingToken):
            await leasekit.fencing.fenced_redis_write(client, tag, 1, [("SET", tag + ":body", "1")])
        assert await client.get(tag + ":body") == b"two"
        await client.delete(tag + ":body", tag + ":meta", "leasekit-fence:" + tag)
    finally:
        await client.aclose()


# -- the documentation ---------------------------------------------------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs" / "fencing.md"


def test_docs_sqlite_example_refuses_the_paused_writer(tmp_path: Path) -> None:
    text = DOCS.read_text(encoding="utf-8")
    blocks = [b for lang, b in _fenced_blocks(text) if lang == "python" and "asyncio.run(" in b]
    (example,) = blocks
    run = subprocess.run(
        [sys.executable, "-W", "error", "-c", example],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "refused: fencing token 1 for 'invoice-7' is stale: 2 was already seen",
        "paid by b",
    ]


def test_docs_show_the_statement_the_mysql_guard_runs() -> None:
    text = " ".join(DOCS.read_text(encoding="utf-8").split())
    statement = leasekit.fencing._mysql._mysql_statements(("leasekit_fence",)).fence
    assert " ".join(statement.replace("`leasekit_fence`", "leasekit_fence").split()) in text


def test_docs_show_the_statement_the_postgres_guard_runs() -> None:
    text = " ".join(DOCS.read_text(encoding="utf-8").split())
    statement = leasekit.fencing._postgres._postgres_statements(("leasekit_fence",)).fence
    shown = " ".join(
        statement.as_string(None).replace('"leasekit_fence"', "leasekit_fence").split()
    )
    assert shown in text


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    fence = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
    return [(m.group(1), m.group(2)) for m in fence.finditer(text)]
