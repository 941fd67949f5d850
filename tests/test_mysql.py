"""The MySQL/MariaDB backend beyond the conformance suite (``test_contract_mysql.py``).

URLs and options, the schema and ``leasekit migrate``, binary-safe keys under no
collation, the server's clock (a statement that waited on a row lock still grants a
full TTL; sessions in other time zones agree), fencing across row deletion and
restarts for both token sources, the sweep, callers' pools, and faults: a killed
connection, a paused server, a restarted one.

Servers come from the harness in ``tests/servers.py`` via ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import datetime
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from scenarios import LONG_MS, connect_mysql, exercise_every_operation
from servers import MariaDBServer, free_port, missing_extra

import leasekit
import leasekit.sync

try:
    import asyncmy
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("mysql", "the MySQL tests")

from leasekit_mysql import MySQLLeaseProvider
from leasekit_mysql._sql import SCHEMA_VERSION

from leasekit.backend import parse_url

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
SLACK_S = 5.0  # how much later than its timeout a call may fail, on a loaded machine


# -- helpers ---------------------------------------------------------------------------------


async def eventually(predicate: Callable[[], Any], what: str) -> None:
    """Await ``predicate()`` until it is true; fail after a limit only a hung test reaches."""
    deadline = time.monotonic() + 10
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def admin(url: str) -> AsyncIterator[Any]:
    """A cursor on a connection of the test's own, outside the code under test."""
    conn = await connect_mysql(url)
    try:
        async with conn.cursor() as cursor:
            yield cursor
    finally:
        conn.close()


async def create_schema(url: str, **options: Any) -> None:
    """Create the schema with the default timeout_s, before a test's short one: first use
    creates five tables and three procedures, slower on a loaded machine."""
    async with MySQLLeaseProvider.from_url(url, **options) as provider:
        await provider.migrate()


async def one(cursor: Any, statement: str, args: Any = None) -> Any:
    await cursor.execute(statement, args)
    row = await cursor.fetchone()
    return None if row is None else row[0]


def quoted(table: str) -> str:
    return ".".join(f"`{part}`" for part in table.split("."))


def with_query(url: str, **params: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leasekit", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


async def skip_unless_mariadb(mysql_url: str) -> None:
    """Skip on MySQL (a ``$LEASEKIT_TEST_MYSQL_URL`` server): the test needs sequences."""
    async with admin(mysql_url) as cursor:
        version = str(await one(cursor, "SELECT VERSION()"))
    if "mariadb" not in version.lower():
        pytest.skip(f"needs MariaDB's sequences; the server is MySQL {version}")


@pytest.fixture
async def provider(mysql_url: str, mysql_table: str) -> AsyncIterator[MySQLLeaseProvider]:
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table) as p:
        yield p


# -- URLs and options ----------------------------------------------------------------------


def test_entry_points_declare_both_schemes_with_the_mysql_extra() -> None:
    from importlib.metadata import entry_points  # noqa: PLC0415

    found = {ep.name: ep.value for ep in entry_points(group="leasekit.backends")}
    assert found["mysql"] == "leasekit_mysql:MySQLLeaseProvider [mysql]"
    assert found["mariadb"] == "leasekit_mysql:MySQLLeaseProvider [mysql]"


@pytest.mark.parametrize("scheme", ["mysql", "mariadb"])
async def test_connect_builds_a_provider_without_io(scheme: str) -> None:
    port = free_port()  # nothing listens: any I/O would fail
    provider = leasekit.connect(f"{scheme}://u:secret@127.0.0.1:{port}/db?table=t&timeout_s=2")
    assert isinstance(provider, MySQLLeaseProvider)
    assert provider.table == "t"
    assert provider.timeout_s == 2.0
    assert provider.client is None
    assert "secret" not in repr(provider)
    await provider.aclose()


async def test_url_query_and_keywords_set_options_keywords_winning() -> None:
    provider = MySQLLeaseProvider.from_url(
        "mysql://h/db?sweep_every=7&sweep_batch=9&create_schema=off&tokens=clock&table=a",
        table="db2.b",
        sweep_grace_s=60,
    )
    assert (provider.table, provider.sweep_every, provider.sweep_batch) == ("db2.b", 7, 9)
    assert (provider.create_schema, provider.tokens, provider.sweep_grace_s) == (
        False,
        "clock",
        60.0,
    )
    await provider.aclose()


@pytest.mark.parametrize(
    ("url", "options", "argument"),
    [
        ("mysql://h/db?colour=red", {}, "url"),
        ("mysql://h/db", {"colour": "red"}, "options"),
        ("mysql://h/db?table=1bad", {}, "table"),
        ("mysql://h/db", {"table": "a.b.c"}, "table"),
        ("mysql://h/db", {"table": "x" * 49}, "table"),
        ("mysql://h/db", {"tokens": "random"}, "tokens"),
        ("mysql://h/db?timeout_s=0", {}, "timeout_s"),
        ("mysql://h/db?sweep_grace_s=1", {}, "sweep_grace_s"),
        ("mysql://h/db?pool_min_size=5&pool_max_size=2", {}, "pool_max_size"),
        ("mysql://a,b/db", {}, "url"),
        ("postgresql://h/db", {}, "url"),
    ],
)
def test_bad_urls_and_options_name_the_problem(
    url: str, options: dict[str, Any], argument: str
) -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument) as info:
        MySQLLeaseProvider.from_url(url, **options)
    assert info.value.argument == argument


def test_errors_about_a_url_never_show_its_password() -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument) as info:
        MySQLLeaseProvider.from_url("mysql://user:hunter2@h/db?colour=red")
    assert "hunter2" not in str(info.value)


async def test_an_unreachable_server_fails_at_async_with_within_the_timeout() -> None:
    provider = MySQLLeaseProvider.from_url(f"mysql://root@127.0.0.1:{free_port()}/db?timeout_s=1")
    started = time.monotonic()
    with pytest.raises(leasekit.LeaseBackendUnreachable):
        async with provider:
            pass
    assert time.monotonic() - started < 1 + SLACK_S


async def test_a_wrong_password_is_unreachable_and_never_shown(mysql_url: str) -> None:
    parsed = parse_url(mysql_url, schemes=("mysql", "mariadb"))
    endpoint = parsed.endpoints[0]
    url = f"mysql://nobody_here:hunter2@{endpoint}/mysql"
    with pytest.raises(leasekit.LeaseBackendUnreachable) as info:
        async with MySQLLeaseProvider.from_url(url):
            pass
    assert "hunter2" not in str(info.value)


async def test_a_client_that_is_not_asyncmy_is_refused() -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument) as info:
        MySQLLeaseProvider(object())  # type: ignore[arg-type]
    assert info.value.argument == "client"


async def test_a_pool_that_allows_no_connection_is_refused() -> None:
    pool = await asyncmy.create_pool(minsize=0, maxsize=0)  # no I/O without minsize
    try:
        with pytest.raises(leasekit.InvalidLeaseArgument, match="at least one") as info:
            MySQLLeaseProvider(pool)
        assert info.value.argument == "client"
    finally:
        pool.close()
        await pool.wait_closed()


# -- the schema ---------------------------------------------------------------------------------


async def test_first_use_creates_table_sequence_and_meta(
    provider: MySQLLeaseProvider, mysql_url: str, mysql_table: str
) -> None:
    await skip_unless_mariadb(mysql_url)
    assert (await provider.acquire_lease("k", "a", LONG_MS)).acquired
    database, name = mysql_table.split(".")
    async with admin(mysql_url) as cursor:
        await cursor.execute(
            "SELECT table_name, table_type FROM information_schema.tables"
            " WHERE table_schema = %s AND table_name LIKE %s",
            (database, f"{name}%"),
        )
        kinds = dict(await cursor.fetchall())
        meta_table = quoted(f"{mysql_table}_meta")
        await cursor.execute(f"SELECT name, value FROM {meta_table}")
        meta = dict(await cursor.fetchall())
        await cursor.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name = %s",
            (database, name),
        )
        columns = dict(await cursor.fetchall())
    assert kinds == {
        name: "BASE TABLE",
        f"{name}_meta": "BASE TABLE",
        f"{name}_token_seq": "SEQUENCE",
        f"{name}_slot_keys": "BASE TABLE",
        f"{name}_slots": "BASE TABLE",
        f"{name}_line": "BASE TABLE",
        f"{name}_line_keys": "BASE TABLE",
    }
    assert meta == {"schema_version": SCHEMA_VERSION, "tokens": 1}
    assert columns["lease_key"] == columns["owner"] == columns["metadata"] == "varbinary"
    assert columns["expires_at"] == "datetime"


async def test_clock_tokens_need_no_sequence(mysql_url: str, mysql_table: str) -> None:
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table, tokens="clock") as p:
        token = (await p.acquire_lease("k", "a", LONG_MS)).token
        assert token is not None
        assert token > 1_600_000_000 * 1_000_000  # microseconds since the epoch
    database, name = mysql_table.split(".")
    async with admin(mysql_url) as cursor:
        count = await one(
            cursor,
            "SELECT COUNT(*) FROM information_schema.tables"
            " WHERE table_schema = %s AND table_name = %s",
            (database, f"{name}_token_seq"),
        )
    assert count == 0
    # The table keeps its source: asking for the other one is refused, auto follows it.
    with pytest.raises(leasekit.LeaseBackendError, match="token source"):
        async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table, tokens="sequence"):
            pass
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table) as p:
        again = await p.acquire_lease("k", "b", LONG_MS)
        assert again == leasekit.LeaseResult(False, "a", None)


async def test_without_create_schema_a_missing_table_names_migrate_then_migrate_fixes_it(
    mysql_url: str, mysql_table: str, caplog: pytest.LogCaptureFixture
) -> None:
    provider = MySQLLeaseProvider.from_url(mysql_url, table=mysql_table, create_schema=False)
    with pytest.raises(leasekit.LeaseBackendError, match="leasekit migrate"):
        await provider.acquire_lease("k", "a", LONG_MS)
    assert await provider.migrate() == SCHEMA_VERSION
    # Idempotent, and quiet: no notes to fetch and log.
    assert await provider.migrate() == SCHEMA_VERSION
    assert (await provider.acquire_lease("k", "a", LONG_MS)).acquired
    await provider.aclose()
    assert not [r for r in caplog.records if r.levelno >= 30], caplog.records


async def create_version_1_table(url: str, table: str) -> None:
    """The schema leasekit wrote before lease metadata (version 1, clock tokens), with one
    live lease."""
    t, meta = quoted(table), quoted(f"{table}_meta")
    async with admin(url) as cursor:
        await cursor.execute(
            f"CREATE TABLE {t} (lease_key VARBINARY(1024) NOT NULL, owner VARBINARY(1024)"
            " NOT NULL, token BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL,"
            " PRIMARY KEY (lease_key)) ENGINE=InnoDB"
        )
        await cursor.execute(
            f"CREATE TABLE {meta} (name VARCHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY,"
            " value BIGINT NOT NULL) ENGINE=InnoDB"
        )
        await cursor.execute(f"INSERT INTO {meta} VALUES ('schema_version', 1), ('tokens', 2)")
        await cursor.execute(
            f"INSERT INTO {t} VALUES ('old', 'before', 7, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)"
        )


async def schema_version_of(url: str, table: str) -> int:
    meta = quoted(f"{table}_meta")
    async with admin(url) as cursor:
        return int(await one(cursor, f"SELECT value FROM {meta} WHERE name = 'schema_version'"))


async def test_a_version_1_table_gains_the_metadata_column_on_first_use(
    mysql_url: str, mysql_table: str
) -> None:
    await create_version_1_table(mysql_url, mysql_table)
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table) as provider:
        # The lease taken before the upgrade is still there, without metadata.
        old = await provider.get_lease_record("old")
        assert old is not None
        assert (old.owner, old.token, old.metadata) == ("before", 7, None)
        denied = await provider.acquire_lease("old", "b", LONG_MS, metadata=b"b:1")
        assert denied == leasekit.LeaseResult(False, "before", None, None)
        granted = await provider.acquire_lease("k", "a", LONG_MS, metadata=b"a:1")
        assert (granted.acquired, granted.metadata) == (True, b"a:1")
        assert await provider.acquire_lease("k", "b", LONG_MS) == leasekit.LeaseResult(
            False, "a", None, b"a:1"
        )
        # Version 3 on top: the slot tables and procedures, on the table's clock tokens.
        assert (await provider.acquire_slot("s", "a", LONG_MS, limit=1)).acquired
        denied_slot = await provider.acquire_slot("s", "b", LONG_MS, limit=1)
        assert (denied_slot.acquired, denied_slot.holders) == (False, ("a",))
    assert await schema_version_of(mysql_url, mysql_table) == SCHEMA_VERSION
    database, name = mysql_table.split(".")
    async with admin(mysql_url) as cursor:
        sequences = await one(
            cursor,
            "SELECT COUNT(*) FROM information_schema.tables"
            " WHERE table_schema = %s AND table_name = %s",
            (database, f"{name}_token_seq"),
        )
    assert sequences == 0  # the table keeps its clock tokens: no sequence appears


def test_a_version_1_table_gains_the_metadata_column_through_the_blocking_provider(
    mysql_url: str, mysql_table: str
) -> None:
    asyncio.run(create_version_1_table(mysql_url, mysql_table))
    with leasekit.sync.connect(mysql_url, table=mysql_table) as leases:
        assert leases.acquire_lease("k", "a", LONG_MS, metadata="a:1").acquired
        assert leases.acquire_lease("k", "b", LONG_MS) == leasekit.LeaseResult(
            False, "a", None, b"a:1"
        )
        record = leases.get_lease_record("k")
        assert record is not None
        assert (record.owner, record.metadata) == ("a", b"a:1")
    assert asyncio.run(schema_version_of(mysql_url, mysql_table)) == SCHEMA_VERSION


async def test_without_create_schema_a_version_1_table_names_migrate_then_migrate_fixes_it(
    mysql_url: str, mysql_table: str
) -> None:
    await create_version_1_table(mysql_url, mysql_table)
    provider = MySQLLeaseProvider.from_url(mysql_url, table=mysql_table, create_schema=False)
    with pytest.raises(leasekit.LeaseBackendError, match="leasekit migrate"):
        await provider.acquire_lease("k", "a", LONG_MS, metadata=b"m")
    assert await provider.migrate() == SCHEMA_VERSION
    assert (await provider.acquire_lease("k", "a", LONG_MS, metadata=b"m")).metadata == b"m"
    record = await provider.get_lease_record("k")
    assert record is not None
    assert record.metadata == b"m"
    await provider.aclose()


async def test_a_newer_schema_version_is_refused(mysql_url: str, mysql_table: str) -> None:
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table) as p:
        await p.migrate()
    async with admin(mysql_url) as cursor:
        meta = quoted(f"{mysql_table}_meta")
        await cursor.execute(f"UPDATE {meta} SET value = 99 WHERE name = 'schema_version'")
    with pytest.raises(leasekit.LeaseBackendError, match="upgrade leasekit"):
        async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table):
            pass


async def test_many_providers_creating_one_table_at_once_all_succeed(
    mysql_url: str, mysql_table: str
) -> None:
    providers = [MySQLLeaseProvider.from_url(mysql_url, table=mysql_table) for _ in range(6)]
    try:
        results = await asyncio.gather(
            *(p.acquire_lease("k", f"o{i}", LONG_MS) for i, p in enumerate(providers))
        )
        assert sum(r.acquired for r in results) == 1
    finally:
        for p in providers:
            await p.aclose()


def test_leasekit_migrate_creates_the_schema_up_front(mysql_url: str, mysql_table: str) -> None:
    url = with_query(mysql_url, table=mysql_table, create_schema="false")
    done = run_cli("migrate", url)
    assert done.returncode == 0, done.stderr
    assert run_cli("migrate", url).returncode == 0  # idempotent
    done = run_cli("acquire", url, "k", "a", "--ttl-ms", "60000")
    assert done.returncode == 0, done.stderr


# -- keys, owners, inspect ----------------------------------------------------------------------

AWKWARD_KEYS = [
    "plain",
    "resource\0thread",
    "\0",
    "\0\0",
    "trailing\0",
    "trailing space ",
    "emoji 🎉 and 中文",
    "quote ' and \" and \\ and %s and %(key)s",
    "space and\ttab\nnewline",
    "x" * 1024,
    "é" * 512,  # 1024 bytes
    "🎉" * 256,  # 1024 bytes of four-byte characters (utf8mb3 could not hold them)
]


@pytest.mark.parametrize("key", AWKWARD_KEYS, ids=range(len(AWKWARD_KEYS)))
async def test_awkward_keys_and_owners_round_trip(provider: MySQLLeaseProvider, key: str) -> None:
    owner = key[::-1]
    granted = await provider.acquire_lease(key, owner, LONG_MS)
    assert granted.acquired
    assert await provider.get_lease_owner(key) == owner
    assert await provider.acquire_lease(key, "other", LONG_MS) == leasekit.LeaseResult(
        False, owner, None
    )
    [record] = await provider.inspect(key)
    assert (record.key, record.owner, record.token) == (key, owner, granted.token)


async def test_no_collation_folds_case_trailing_spaces_or_nul(provider: MySQLLeaseProvider) -> None:
    keys = ["a", "A", "a ", "a\0", "á", "ä"]
    for i, key in enumerate(keys):
        assert (await provider.acquire_lease(key, f"o{i}", LONG_MS)).acquired, key
    for i, key in enumerate(keys):
        assert await provider.get_lease_owner(key) == f"o{i}"
    # Owners too: "x" does not hold what "X" or "x " holds.
    assert (await provider.acquire_lease("owned", "x", LONG_MS)).acquired
    assert not await provider.renew_lease("owned", "X", LONG_MS)
    assert not await provider.renew_lease("owned", "x ", LONG_MS)
    await provider.release_lease("owned", "X")
    assert await provider.get_lease_owner("owned") == "x"


async def test_inspect_filters_by_prefix_orders_and_limits(provider: MySQLLeaseProvider) -> None:
    for key in ["b/2", "a/1", "b/1", "c", "b\0"]:
        await provider.acquire_lease(key, "o", LONG_MS)
    await provider.acquire_lease("b/gone", "o", LONG_MS)
    await provider.release_lease("b/gone", "o")
    assert [r.key for r in await provider.inspect()] == ["a/1", "b\0", "b/1", "b/2", "c"]
    assert [r.key for r in await provider.inspect("b/")] == ["b/1", "b/2"]
    assert [r.key for r in await provider.inspect(limit=2)] == ["a/1", "b\0"]
    assert all(0 < r.remaining_ms <= LONG_MS for r in await provider.inspect())


# -- the server's clock ---------------------------------------------------------------------------


async def running_on(url: str, table: str) -> set[int]:
    """The connection ids of the other sessions now running a statement on ``table``.

    From the process list, which is live. ``information_schema.innodb_trx`` (which says
    who waits for a lock) is a snapshot that InnoDB refreshes only after nobody has read
    it for 0.1 s: polled faster, it keeps showing what it showed first.
    """
    async with admin(url) as cursor:
        await cursor.execute(
            "SELECT id FROM information_schema.processlist"
            " WHERE id <> CONNECTION_ID() AND command = 'Query' AND LOCATE(%s, info) > 0",
            (table.rpartition(".")[2],),
        )
        return {int(thread) for (thread,) in await cursor.fetchall()}


@asynccontextmanager
async def row_locked(url: str, table: str, key: str = "k") -> AsyncIterator[Any]:
    """A session of its own holding ``key``'s row lock (``FOR UPDATE``) until it commits.

    Yields its cursor: ``await cursor.execute("COMMIT")`` lets the waiting statements on.
    """
    locker = await connect_mysql(url)
    try:
        async with locker.cursor() as cursor:
            await cursor.execute("BEGIN")
            await cursor.execute(
                f"SELECT * FROM {quoted(table)} WHERE lease_key = %s FOR UPDATE", (key,)
            )
            yield cursor
    finally:
        locker.close()


@pytest.mark.parametrize("who", ["same owner", "takeover"])
async def test_a_statement_that_waited_on_a_row_lock_still_grants_a_full_ttl(
    provider: MySQLLeaseProvider, mysql_url: str, mysql_table: str, who: str
) -> None:
    ttl_ms = 5000
    first = await provider.acquire_lease("k", "a", LONG_MS if who == "same owner" else 1)
    owner = "a" if who == "same owner" else "b"
    async with row_locked(mysql_url, mysql_table) as cursor:
        task = asyncio.ensure_future(provider.acquire_lease("k", owner, ttl_ms))
        await eventually(
            lambda: running_on(mysql_url, mysql_table), "the acquire to wait for the row lock"
        )
        await asyncio.sleep(0.3)  # let it wait a while: NOW(6) would fall behind by this
        unlocked_at = await one(cursor, "SELECT UTC_TIMESTAMP(6)")
        await cursor.execute("COMMIT")
        result = await task
    assert result.acquired
    if who == "same owner":
        assert result.token == first.token
    else:
        assert first.token is not None
        assert result.token is not None
        assert result.token > first.token
    async with admin(mysql_url) as cursor:
        expires_at = await one(
            cursor, f"SELECT expires_at FROM {quoted(mysql_table)} WHERE lease_key = 'k'"
        )
    # Times the server observed: the lease runs a full TTL from after the wait ended.
    assert expires_at >= unlocked_at + datetime.timedelta(milliseconds=ttl_ms)


async def test_sessions_in_other_time_zones_agree_on_expiry(
    mysql_url: str, mysql_table: str
) -> None:
    parsed = parse_url(mysql_url, schemes=("mysql", "mariadb"), default_port=3306)
    endpoint = parsed.endpoints[0]

    async def pool_in(zone: str) -> Any:
        return await asyncmy.create_pool(
            host=endpoint.host,
            port=endpoint.port,
            user=parsed.username,
            password=parsed.password or "",
            autocommit=True,
            init_command=f"SET time_zone = '{zone}'",
        )

    east, west = await pool_in("+05:00"), await pool_in("-07:00")
    p_east = MySQLLeaseProvider(east, table=mysql_table)
    p_west = MySQLLeaseProvider(west, table=mysql_table)
    try:
        assert (await p_east.acquire_lease("k", "east", 300)).acquired
        assert await p_west.get_lease_owner("k") == "east"
        [record] = await p_west.inspect()
        assert 0 < record.remaining_ms <= 300

        async def west_takes_over() -> bool:
            return (await p_west.acquire_lease("k", "west", LONG_MS)).acquired

        await eventually(west_takes_over, "the lease to expire for the other session")
        assert await p_east.get_lease_owner("k") == "west"
    finally:
        await p_east.aclose()
        await p_west.aclose()
        for pool in (east, west):
            pool.close()
            await pool.wait_closed()


# -- fencing tokens and the sweep ---------------------------------------------------------------


async def age_rows(url: str, table: str, like: str, seconds: int, *, tokens: str) -> int:
    """Move the rows whose key is ``LIKE like`` ``seconds`` into the past, as if granted then.

    Their expiry moves, and with ``tokens=clock`` their token too (the grant's time on
    the server's clock, which the sweep also checks). The sweep judges rows by the
    server's clock: aged this way they are past any grace period at once, so a test
    needs neither a short ``timeout_s`` (the grace must exceed it) nor to wait.
    """
    token = ", token = token - %s * 1000000" if tokens == "clock" else ""
    args = (seconds, seconds, like) if token else (seconds, like)
    async with admin(url) as cursor:
        await cursor.execute(
            f"UPDATE {quoted(table)} SET expires_at = expires_at - INTERVAL %s SECOND{token} "
            "WHERE lease_key LIKE %s",
            args,
        )
        return int(cursor.rowcount)


@pytest.mark.parametrize("tokens", ["sequence", "clock"])
async def test_sweep_reclaims_old_rows_only_and_tokens_keep_increasing(
    mysql_url: str, mysql_table: str, tokens: str
) -> None:
    if tokens == "sequence":
        await skip_unless_mariadb(mysql_url)
    async with MySQLLeaseProvider.from_url(
        mysql_url, table=mysql_table, tokens=tokens, sweep_grace_s=600, sweep_every=0
    ) as p:
        old = [await p.acquire_lease(f"old{i}", "a", 1) for i in range(5)]
        await p.acquire_lease("live", "a", LONG_MS)
        assert await p.sweep() == 0  # expired, but not for longer than the grace period
        assert await age_rows(mysql_url, mysql_table, "old%", 3600, tokens=tokens) == 5
        assert await p.sweep() == 5
        assert await p.row_count() == 1
        assert await p.get_lease_owner("live") == "a"
        again = await p.acquire_lease("old0", "b", LONG_MS)  # a new row for a swept key
        assert again.token is not None
        assert all(r.token is not None and again.token > r.token for r in old)


async def test_background_sweeps_keep_the_table_bounded(mysql_url: str, mysql_table: str) -> None:
    async with MySQLLeaseProvider.from_url(
        mysql_url, table=mysql_table, tokens="clock", sweep_grace_s=600, sweep_every=10
    ) as p:
        for i in range(40):
            await p.acquire_lease(f"k{i}", "a", 1)
        assert await age_rows(mysql_url, mysql_table, "k%", 3600, tokens="clock") == 40

        async def bounded() -> bool:
            await p.acquire_lease("churn", "a", 1)
            return await p.row_count() < 20

        await eventually(bounded, "background sweeps to delete the old rows")


# -- callers' clients ---------------------------------------------------------------------------


async def test_a_callers_pool_is_used_and_never_closed(mysql_url: str, mysql_table: str) -> None:
    parsed = parse_url(mysql_url, schemes=("mysql", "mariadb"), default_port=3306)
    endpoint = parsed.endpoints[0]
    pool = await asyncmy.create_pool(
        host=endpoint.host, port=endpoint.port, user=parsed.username, autocommit=True
    )
    try:
        async with MySQLLeaseProvider(pool, table=mysql_table) as p:
            assert p.client is pool
            await exercise_every_operation(p, "k")
        async with pool.acquire() as conn, conn.cursor() as cursor:
            assert await one(cursor, "SELECT 1") == 1
    finally:
        pool.close()
        await pool.wait_closed()


async def test_a_built_pool_is_closed_by_aclose(mysql_url: str, mysql_table: str) -> None:
    p = MySQLLeaseProvider.from_url(mysql_url, table=mysql_table)
    await p.acquire_lease("k", "a", LONG_MS)
    pool = p.client
    assert pool is not None
    await p.aclose()
    with pytest.raises(leasekit.LeaseProviderClosed):
        await p.get_lease_owner("k")
    with pytest.raises(RuntimeError):
        await pool.acquire()  # type: ignore[union-attr]


# -- faults -------------------------------------------------------------------------------------


async def test_killed_connections_are_replaced_without_surfacing(
    mysql_url: str, mysql_table: str
) -> None:
    async with MySQLLeaseProvider.from_url(
        mysql_url, table=mysql_table, pool_max_size=2, pool_min_size=2
    ) as p:
        await p.acquire_lease("k", "a", LONG_MS)
        pool = p.client
        assert pool is not None
        conns = [await pool.acquire(), await pool.acquire()]  # type: ignore[union-attr]
        ids = []
        for conn in conns:
            async with conn.cursor() as cursor:
                ids.append(await one(cursor, "SELECT CONNECTION_ID()"))
            pool.release(conn)  # type: ignore[union-attr]
        async with admin(mysql_url) as cursor:
            for thread_id in ids:
                await cursor.execute(f"KILL CONNECTION {int(thread_id)}")
        assert await p.get_lease_owner("k") == "a"
        assert (await p.acquire_lease("k", "a", LONG_MS)).acquired
        await exercise_every_operation(p, "after-kill")


@pytest.mark.parametrize("operation", ["renew", "transfer"])
async def test_a_connection_killed_mid_statement_is_retried_except_for_a_transfer(
    provider: MySQLLeaseProvider, mysql_url: str, mysql_table: str, operation: str
) -> None:
    # The pool drops an idle connection whose socket the server closed; one killed while
    # its statement runs (here: waits on a row lock) fails the statement itself.
    await provider.acquire_lease("k", "a", LONG_MS)
    async with row_locked(mysql_url, mysql_table) as cursor:
        call = (
            provider.renew_lease("k", "a", LONG_MS)
            if operation == "renew"
            else provider.transfer_lease("k", "a", "b", LONG_MS)
        )
        task = asyncio.ensure_future(call)
        waiters: list[int] = []

        async def waits_anew() -> bool:
            # A killed statement may still be listed for a while, beside its retry.
            new = await running_on(mysql_url, mysql_table) - set(waiters)
            waiters.extend(sorted(new))
            return bool(new)

        await eventually(waits_anew, "the statement to wait for the row lock")
        async with admin(mysql_url) as killer:
            await killer.execute(f"KILL CONNECTION {waiters[0]}")
        if operation == "transfer":
            # Not run again: had it run before the connection died, a second run
            # would answer False for a transfer that happened.
            with pytest.raises(leasekit.LeaseBackendError) as info:
                await task
            assert not isinstance(info.value, leasekit.LeaseBackendTimeout)  # at once
            assert info.value.key == "k"
        else:
            await eventually(waits_anew, "the renew to wait again on a fresh connection")
        await cursor.execute("COMMIT")
    if operation == "renew":
        assert await task is True
    assert await provider.get_lease_owner("k") == "a"
    await exercise_every_operation(provider, "after-kill")


async def test_a_statement_stalled_by_a_row_lock_is_a_timeout_and_the_pool_recovers(
    mysql_url: str, mysql_table: str
) -> None:
    timeout_s = 0.5
    await create_schema(mysql_url, table=mysql_table)
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table, timeout_s=timeout_s) as p:
        await p.acquire_lease("k", "a", LONG_MS)
        async with row_locked(mysql_url, mysql_table) as cursor:
            started = time.monotonic()
            with pytest.raises(leasekit.LeaseBackendTimeout) as info:
                await p.renew_lease("k", "a", LONG_MS)
            assert time.monotonic() - started < timeout_s + SLACK_S
            assert info.value.key == "k"
            await cursor.execute("COMMIT")
        await exercise_every_operation(p, "after-stall")


async def alive(url: str, threads: set[int]) -> set[int]:
    """Which of the server sessions ``threads`` are still in the process list."""
    async with admin(url) as cursor:
        await cursor.execute("SELECT id FROM information_schema.processlist")
        return {int(thread) for (thread,) in await cursor.fetchall()} & threads


async def test_a_cancelled_acquire_still_waiting_on_the_server_never_lands_after_its_undo(
    mysql_url: str, mysql_table: str
) -> None:
    """Its statement waits on the server when the caller is cancelled (async).

    The toolkit undoes the grant with a release, but the cancelled statement was not
    stopped by closing its connection: it waits for a lock another session holds, and
    runs when that lock goes. The undo must not run before the statement can no longer
    land (the provider ends the session on the server first): otherwise the key stays
    held, for its whole TTL, by an owner told it was cancelled. Under load the same
    happens without any lock: the server runs the statement late, after the undo.
    """
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table) as p:
        await p.acquire_lease("other", "x", LONG_MS)  # the table exists
        # No row for "k" yet: the locking read takes the gap, where an insert of "k"
        # waits, and where a release finds nothing to wait for.
        async with row_locked(mysql_url, mysql_table) as cursor:
            task = asyncio.ensure_future(p.acquire_lease("k", "a", LONG_MS))
            waiting: set[int] = set()

            async def stalled() -> bool:
                waiting.update(await running_on(mysql_url, mysql_table))
                return bool(waiting)

            await eventually(stalled, "the acquire to wait for the gap lock")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await p.aclose()  # waits for the undo
            await cursor.execute("ROLLBACK")
        # Whatever the cancelled statement was going to do is done once its session is.
        await eventually(lambda: _none(alive(mysql_url, waiting)), "the cancelled session to end")
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table) as q:
        assert await q.get_lease_owner("k") is None


async def test_a_timed_out_blocking_acquire_never_lands_after_the_next_call(
    mysql_url: str, mysql_table: str
) -> None:
    """The same through the blocking provider: a statement cut off by its timeout.

    The acquire's statement still waits for the gap lock when its read times out
    (``timeout_s`` 2.1 s; the server gives up the lock wait only at 3 s, the timeout
    rounded up). The caller releases, as ``leasekit.sync.hold`` does after an unknown
    outcome, and the lock goes: that release must not run before the cut-off statement
    can no longer land. (On a machine too slow to release and unlock within the 0.9 s
    between the two, the statement gives up on the server and the check passes.)
    """
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table) as first:
        await first.acquire_lease("other", "x", LONG_MS)  # the table exists
        with MySQLLeaseProvider.sync_from_url(mysql_url, table=mysql_table, timeout_s=2.1) as p:
            await asyncio.to_thread(p.get_lease_owner, "other")  # it has read the schema
            async with row_locked(mysql_url, mysql_table) as cursor:
                with pytest.raises(leasekit.LeaseBackendTimeout):
                    await asyncio.to_thread(p.acquire_lease, "k", "a", LONG_MS)
                await asyncio.to_thread(p.release_lease, "k", "a")
                waiting = await running_on(mysql_url, mysql_table)
                await cursor.execute("ROLLBACK")
        await eventually(lambda: _none(alive(mysql_url, waiting)), "the cut-off session to end")
        assert await first.get_lease_owner("k") is None


async def _none(pending: Any) -> bool:
    return not await pending


@pytest.mark.slow
async def test_a_paused_server_is_a_timeout_within_the_timeout_then_recovers(
    private_mariadb_server: MariaDBServer,
) -> None:
    timeout_s = 0.5
    server = private_mariadb_server
    await create_schema(server.url)
    async with MySQLLeaseProvider.from_url(server.url, timeout_s=timeout_s) as p:
        assert (await p.acquire_lease("k", "a", LONG_MS)).acquired
        server.pause()
        try:
            for call in (
                p.acquire_lease("k", "a", LONG_MS),
                p.get_lease_owner("k"),
                p.transfer_lease("k", "a", "b", LONG_MS),
            ):
                started = time.monotonic()
                with pytest.raises(leasekit.LeaseBackendTimeout) as info:
                    await call
                assert time.monotonic() - started < timeout_s + SLACK_S
                assert info.value.key == "k"
        finally:
            server.resume()
        assert await p.get_lease_owner("k") in ("a", "b")
        await exercise_every_operation(p, "after-pause")
        server.pause()
        try:
            started = time.monotonic()
            await p.aclose()  # bounded even with the server frozen
            assert time.monotonic() - started < timeout_s + SLACK_S
        finally:
            server.resume()


@pytest.mark.slow
async def test_tokens_keep_increasing_across_restarts_and_deleted_rows(
    private_mariadb_server: MariaDBServer,
) -> None:
    server = private_mariadb_server
    sources = ("sequence", "clock")
    providers = {
        tokens: MySQLLeaseProvider.from_url(server.url, table=f"t_{tokens}", tokens=tokens)
        for tokens in sources
    }
    try:
        first = {t: await p.acquire_lease("k", "a", LONG_MS) for t, p in providers.items()}
        server.kill()
        with pytest.raises(leasekit.LeaseBackendError):
            await providers["sequence"].acquire_lease("k", "a", LONG_MS)
        server.restart()  # on the same port: every pooled connection died with the server
        seen = {t: r.token for t, r in first.items()}
        for tokens, p in providers.items():
            assert await p.get_lease_owner("k") == "a"  # persistent
            assert (await p.acquire_lease("k", "a", LONG_MS)).token == seen[tokens]
            await p.release_lease("k", "a")
        server.restart()
        for tokens, p in providers.items():
            again = await p.acquire_lease("k", "b", LONG_MS)
            assert again.token is not None
            assert again.token > seen[tokens]
            seen[tokens] = again.token
        async with admin(server.url) as cursor:  # every row gone, as a sweep would leave it
            for tokens in sources:
                await cursor.execute(f"DELETE FROM mysql.t_{tokens}")
        server.restart()
        for tokens, p in providers.items():
            fresh = await p.acquire_lease("k", "c", LONG_MS)
            assert fresh.token is not None
            assert fresh.token > seen[tokens], tokens
            await exercise_every_operation(p, "after-restarts")
    finally:
        for p in providers.values():
            await p.aclose()


# -- more tasks than connections ----------------------------------------------------------------


async def cycle_until(
    p: MySQLLeaseProvider, tasks: int, *, cycles: int | None = None, seconds: float | None = None
) -> tuple[list[int], list[BaseException]]:
    """``tasks`` tasks cycling acquire, renew and release, each on a key of its own.

    Until every task has done ``cycles`` cycles, or for ``seconds``; either way the
    first error ends every task. Returns each task's cycles and the errors.
    """
    done = [0] * tasks
    errors: list[BaseException] = []
    stop_at = None if seconds is None else time.monotonic() + seconds

    def more() -> bool:
        if errors:
            return False
        if stop_at is not None:
            return time.monotonic() < stop_at
        return min(done) < (cycles or 0)

    async def worker(n: int) -> None:
        key, owner = f"cycle-{n}", f"owner-{n}"
        while more():
            try:
                assert (await p.acquire_lease(key, owner, LONG_MS)).acquired
                assert await p.renew_lease(key, owner, LONG_MS)
                await p.release_lease(key, owner)
            except leasekit.LeaseError as exc:  # noqa: PERF203 (the first one ends the run)
                errors.append(exc)
            else:
                done[n] += 1

    await p.get_lease_owner("warm-up")  # the schema, before the tasks start
    await asyncio.gather(*(worker(n) for n in range(tasks)))
    return done, errors


async def test_waiters_for_a_connection_are_served_in_arrival_order(
    mysql_url: str, mysql_table: str
) -> None:
    # asyncmy's pool hands a freed connection to whoever asks next: the task that has
    # just checked it in took it straight back, ahead of every waiter.
    async with MySQLLeaseProvider.from_url(
        mysql_url, table=mysql_table, pool_max_size=1, sweep_every=0
    ) as p:
        await p.get_lease_owner("warm-up")
        served: list[str] = []

        async def first() -> None:
            await p.get_lease_owner("again")
            served.append("first")
            await p.get_lease_owner("again")  # checked in and at once out again
            served.append("again")

        async def waiter(name: str) -> None:
            await p.get_lease_owner(name)
            served.append(name)

        names = [f"waiter-{n}" for n in range(8)]
        await asyncio.gather(first(), *(waiter(name) for name in names))
        assert served == ["first", *names, "again"]


async def test_more_tasks_than_connections_all_progress_without_errors(
    mysql_url: str, mysql_table: str
) -> None:
    # 40 tasks on 4 connections, each cycling until all have done 5 cycles: before
    # waiting became first come, first served, the tasks holding connections kept them
    # and the others ran out their timeout_s (LeaseBackendTimeout, no driver error).
    async with MySQLLeaseProvider.from_url(
        mysql_url, table=mysql_table, pool_max_size=4, sweep_every=0
    ) as p:
        done, errors = await cycle_until(p, 40, cycles=5)
        assert errors == []
        assert min(done) >= 5
        pool = p.client
        assert pool is not None
        assert pool.size <= 4


async def test_a_waiter_cancelled_while_waiting_gives_up_its_place_and_leaks_nothing(
    mysql_url: str, mysql_table: str
) -> None:
    # A long timeout_s: the stalled renew must outlast the setup on a loaded machine.
    async with MySQLLeaseProvider.from_url(
        mysql_url, table=mysql_table, pool_max_size=1, sweep_every=0, timeout_s=20
    ) as p:
        await p.acquire_lease("k", "a", LONG_MS)
        async with row_locked(mysql_url, mysql_table) as cursor:
            # The pool's only connection waits on the row lock ...
            holder = asyncio.ensure_future(p.renew_lease("k", "a", LONG_MS))
            await eventually(
                lambda: running_on(mysql_url, mysql_table), "the renew to wait on the lock"
            )
            # ... while these wait for it; the first two give up.
            quitters = [asyncio.ensure_future(p.get_lease_owner("k")) for _ in range(2)]
            stayer = asyncio.ensure_future(p.get_lease_owner("k"))
            await asyncio.sleep(0.05)
            for quitter in quitters:
                quitter.cancel()
            await asyncio.gather(*quitters, return_exceptions=True)
            assert all(quitter.cancelled() for quitter in quitters)
            await cursor.execute("COMMIT")
        assert await holder is True
        assert await stayer == "a"
        pool = p.client
        assert pool is not None
        assert (pool.size, pool.freesize) == (1, 1)
        await exercise_every_operation(p, "after-cancel")


@pytest.mark.slow
async def test_500_tasks_on_10_connections_cycle_for_10_s_without_errors(
    mysql_url: str, mysql_table: str
) -> None:
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table) as p:
        done, errors = await cycle_until(p, 500, seconds=10)
    assert errors == []
    assert min(done) >= 1  # every task was served, not only some


# -- the benchmark ------------------------------------------------------------------------------


@pytest.mark.slow
async def test_bench_measures_leasekit_the_asyncmy_floor_and_tooz(
    mysql_url: str, mysql_database: str
) -> None:
    import importlib.util  # noqa: PLC0415
    import json  # noqa: PLC0415

    url = with_query(mysql_url, table=f"{mysql_database}.bench_leases")
    done = await asyncio.to_thread(
        run_cli, "bench", url, "--seconds", "0.3", "--scenarios", "single", "contended", "--json"
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["server"].startswith("MariaDB ") or report["server"].startswith("MySQL ")
    tooz = all(importlib.util.find_spec(module) for module in ("tooz", "pymysql"))
    measured = {(r["contender"], r["scenario"]): r for r in report["results"]}
    assert {contender for contender, _ in measured} == {
        "leasekit",
        "mysql-raw",
        *(("tooz",) if tooz else ()),
    }
    for (contender, scenario), result in measured.items():
        assert result["error"] is None, result
        # In a 0.3 s window on a loaded machine a contended key may see no successful
        # cycle (16 tasks racing, each denial a round trip), and tooz connects once per
        # cycle: neither is an error. One task alone always completes cycles.
        if scenario == "single" and contender != "tooz":
            assert result["cycles_per_s"] > 0, result
    assert measured["mysql-raw", "single"]["ratio_to_floor"] == 1.0
    # leasekit's rows for the run's keys are deleted, the floor's table dropped.
    async with admin(mysql_url) as cursor:
        await cursor.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (mysql_database,),
        )
        tables = {name for (name,) in await cursor.fetchall()}
        left = await one(
            cursor,
            f"SELECT COUNT(*) FROM `{mysql_database}`.bench_leases WHERE LOCATE(%s, lease_key) > 0",
            (report["namespace"].encode(),),
        )
    assert "bench_leases" in tables
    assert not [name for name in tables if name.endswith("_floor")]
    assert left == 0


async def test_a_version_2_table_gains_slots_and_the_line_on_first_use(
    mysql_url: str, mysql_table: str
) -> None:
    # Schema version 3 adds the slot tables, the line and their procedures beside an
    # existing table (here one with clock tokens, which the procedures draw too).
    await create_version_1_table(mysql_url, mysql_table)
    t, meta = quoted(mysql_table), quoted(f"{mysql_table}_meta")
    async with admin(mysql_url) as cursor:
        await cursor.execute(f"ALTER TABLE {t} ADD COLUMN metadata VARBINARY(4096) NULL")
        await cursor.execute(f"UPDATE {meta} SET value = 2 WHERE name = 'schema_version'")
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table) as provider:
        old = await provider.get_lease_record("old")
        assert old is not None
        assert (old.owner, old.token) == ("before", 7)
        first = await provider.acquire_slot("s", "a", LONG_MS, limit=2)
        second = await provider.acquire_slot("s", "b", LONG_MS, limit=2)
        assert (first.acquired, second.acquired) == (True, True)
        assert (second.token or 0) > (first.token or 0) > 0
        denied = await provider.acquire_slot("s", "c", LONG_MS, limit=2)
        assert (denied.acquired, denied.held, denied.holders) == (False, 2, ("a", "b"))
        in_turn = await provider.acquire_lease_in_turn("old", "c", LONG_MS, place_ttl_ms=LONG_MS)
        assert in_turn == leasekit.LeaseResult(False, "before", None, None)
    assert await schema_version_of(mysql_url, mysql_table) == SCHEMA_VERSION


async def test_a_slot_denial_names_long_owners_whole(mysql_url: str, mysql_table: str) -> None:
    # The holders travel hex-encoded in one GROUP_CONCAT: 16 owners of 600 bytes are
    # past the server's default group_concat_max_len (1024), which would cut them short.
    owners = [f"{n:02d}" + "o" * 598 for n in range(16)]
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table) as provider:
        for owner in owners:
            assert (await provider.acquire_slot("k", owner, LONG_MS, limit=16)).acquired
        denied = await provider.acquire_slot("k", "late", LONG_MS, limit=16)
    assert (denied.acquired, denied.held, denied.holders) == (False, 16, tuple(owners))


async def test_a_callers_pool_without_autocommit_is_refused_before_it_writes(
    mysql_url: str, mysql_table: str
) -> None:
    # asyncmy's own default is autocommit off. A statement there opens a transaction
    # that nothing commits, and the pool drops a connection given back inside one (a
    # rollback): a lease granted to "a" was gone, and "b" was granted it too, while a
    # released slot came back. The provider refuses such a connection before any
    # statement, its first (the schema's) included.
    parsed = parse_url(mysql_url, schemes=("mysql", "mariadb"), default_port=3306)
    endpoint = parsed.endpoints[0]
    pool = await asyncmy.create_pool(
        minsize=1,
        maxsize=1,
        host=endpoint.host,
        port=endpoint.port,
        user=parsed.username,
        password=parsed.password or "",
        autocommit=False,
    )
    provider = MySQLLeaseProvider(pool, table=mysql_table)
    try:
        for attempt in range(2):
            with pytest.raises(leasekit.InvalidLeaseArgument, match="autocommit") as caught:
                await provider.acquire_lease("k", f"o{attempt}", LONG_MS)
            assert caught.value.argument == "client"
    finally:
        await provider.aclose()
        pool.close()
        await pool.wait_closed()
    database, name = mysql_table.split(".")
    async with admin(mysql_url) as cursor:
        created = await one(
            cursor,
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = %s"
            " AND table_name LIKE %s",
            (database, f"{name}%"),
        )
    assert created == 0


@pytest.mark.parametrize("first_use", [True, False], ids=["new-key", "known-key"])
async def test_a_slot_acquire_waits_for_the_keys_lock_and_counts_what_its_holder_committed(
    mysql_url: str, mysql_table: str, first_use: bool
) -> None:
    # Another transaction holds the key's row lock (taking it as the procedure does:
    # for a key with no row yet, by inserting the row) and writes a slot of limit 1.
    # Two acquires queue behind it; once it commits, both must count its slot and be
    # denied: the procedure takes the key's lock before it reads, and its reads see
    # what the lock's previous holder committed.
    keys, slots = quoted(f"{mysql_table}_slot_keys"), quoted(f"{mysql_table}_slots")
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table) as provider:
        await provider.migrate()
        async with admin(mysql_url) as cursor:
            if not first_use:
                await cursor.execute(f"INSERT INTO {keys} VALUES ('k', 1, 0, NULL, NULL)")
            await cursor.execute("START TRANSACTION")
            await cursor.execute(
                f"INSERT INTO {keys} (lease_key, slot_limit, last_token) VALUES ('k', 1, 0)"
                " ON DUPLICATE KEY UPDATE lease_key = lease_key"
            )
            await cursor.execute(
                f"INSERT INTO {slots} VALUES"
                " ('k', 'x', 100, UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, FALSE)"
            )
            await cursor.execute(f"UPDATE {keys} SET last_token = 100 WHERE lease_key = 'k'")
            racing = [
                asyncio.ensure_future(provider.acquire_slot("k", owner, LONG_MS, limit=1))
                for owner in ("a", "b")
            ]
            await asyncio.sleep(0.3)
            assert not any(call.done() for call in racing)  # waiting for the key's lock
            await cursor.execute("COMMIT")
            results = await asyncio.gather(*racing)
        assert [(r.acquired, r.held, r.holders) for r in results] == [(False, 1, ("x",))] * 2
        assert [r.owner for r in await provider.get_slot_holders("k")] == ["x"]


async def test_a_slot_acquire_runs_its_transaction_at_read_committed(
    mysql_url: str, mysql_table: str
) -> None:
    # The procedures say "SET TRANSACTION ISOLATION LEVEL READ COMMITTED" right before
    # their START TRANSACTION: no gap locks, so that their range delete cannot deadlock
    # with a renew or release. That level is for the next transaction only, and an
    # autocommit statement between the two uses it up (issue 26: a read placed there
    # left the procedure's transaction at the session's REPEATABLE READ). Asked while
    # the procedure waits for the key's lock, InnoDB names the level it runs at.
    keys = quoted(f"{mysql_table}_slot_keys")
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table) as provider:
        await provider.migrate()
        async with admin(mysql_url) as cursor:
            await cursor.execute(f"INSERT INTO {keys} VALUES ('k', 1, 0, NULL, NULL)")
            await cursor.execute("START TRANSACTION")
            await cursor.execute(f"SELECT 1 FROM {keys} WHERE lease_key = 'k' FOR UPDATE")
            call = asyncio.ensure_future(provider.acquire_slot("k", "a", LONG_MS, limit=1))
            levels: list[Any] = []

            async def waiting() -> bool:
                # innodb_trx is refreshed only after 0.1 s unread (see running_on).
                await asyncio.sleep(0.15)
                await cursor.execute(
                    "SELECT trx_isolation_level FROM information_schema.innodb_trx"
                    " WHERE trx_state = 'LOCK WAIT' AND LOCATE(%s, trx_query) > 0",
                    (mysql_table.rpartition(".")[2],),
                )
                levels[:] = [level for (level,) in await cursor.fetchall()]
                return bool(levels)

            await eventually(waiting, "the acquire to wait for the key's lock")
            await cursor.execute("COMMIT")
            assert (await call).acquired
    assert levels == ["READ COMMITTED"]
