"""The PostgreSQL backend beyond the conformance suite (``test_contract_postgres.py``).

URLs and options, the schema and ``leasekit migrate``, binary-safe keys, one statement
(one round trip, no prepared statement) per operation traced at the protocol level,
denied acquires under concurrency, fencing across sweeps and restarts, callers' pools
and connections, and faults: terminated backends, a row lock held past the timeout, a
paused, killed and restarted server. Plus a tiny run of ``benchmarks/postgres_scale.py``.

Servers come from the harness in ``tests/servers.py`` via ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit, urlunsplit

import pytest
from scenarios import EXERCISE_OPERATIONS, LONG_MS, exercise_every_operation
from servers import PostgresServer, free_port, missing_extra

import leasekit

try:
    import psycopg
    from psycopg import sql
    from psycopg_pool import AsyncConnectionPool
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("postgres", "the PostgreSQL tests")

from leasekit_postgres import LeaseRecord, PostgresLeaseProvider
from leasekit_postgres._notify import decode_payload
from leasekit_postgres._sql import SCHEMA_VERSION

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
SLACK_S = 5.0  # how much later than its timeout a call may fail, on a loaded machine


# -- helpers ---------------------------------------------------------------------------------


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    """Wait until ``predicate()`` is true; fail after a limit only a hung test reaches."""
    deadline = time.monotonic() + 10
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def identifier(table: str) -> sql.Identifier:
    return sql.Identifier(*table.split("."))


def admin(url: str) -> psycopg.Connection[Any]:
    """A connection of the test's own, outside the code under test."""
    return psycopg.connect(url, autocommit=True)


def with_query(url: str, **params: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


@pytest.fixture
async def provider(postgres_url: str, postgres_table: str) -> AsyncIterator[PostgresLeaseProvider]:
    async with PostgresLeaseProvider.from_url(postgres_url, table=postgres_table) as p:
        yield p


@pytest.fixture
def app_name() -> str:
    """An application_name that marks this test's connections in pg_stat_activity."""
    return f"leasekit-test-{uuid.uuid4().hex[:8]}"


def backends_of(url: str, app_name: str, *, waiting: bool = False) -> int:
    condition = "AND wait_event_type = 'Lock'" if waiting else ""
    with admin(url) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM pg_stat_activity WHERE application_name = %s {condition}",
            (app_name,),
        ).fetchone()
    assert row is not None
    return int(row[0])


class ProtocolTrace:
    """libpq's trace of the wire protocol on a one-connection pool: what really went out.

    ``round_trips`` counts ReadyForQuery messages: the server sends exactly one per
    simple query or per extended-protocol Sync, i.e. one per round trip.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._traces = 0
        self._file: BinaryIO | None = None
        self._conns: list[psycopg.AsyncConnection[Any]] = []

    def _attach(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if self._file is None:
            self._traces += 1
            self._file = (self.directory / f"protocol-{self._traces}.trace").open("wb")
        conn.pgconn.trace(self._file.fileno())
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        self._conns.append(conn)

    async def configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The pool's ``configure`` callback: trace every new connection."""
        self._attach(conn)

    async def restart(self, pool: AsyncConnectionPool[Any]) -> None:
        """Trace the pool's (one) connection into a fresh file."""
        async with pool.connection() as conn:
            self._attach(conn)

    def messages(self) -> list[str]:
        """Stop tracing and return the messages traced since the last (re)start."""
        for conn in self._conns:
            if not conn.closed:
                conn.pgconn.untrace()  # flushes libpq's buffer
        self._conns.clear()
        if self._file is None:
            return []
        self._file.close()
        path, self._file = Path(self._file.name), None
        return path.read_text(errors="replace").splitlines()

    @staticmethod
    def round_trips(messages: list[str]) -> int:
        return sum(line.startswith("B") and "\tReadyForQuery" in line for line in messages)


@pytest.fixture
async def traced_pool(
    postgres_url: str, tmp_path: Path, app_name: str
) -> AsyncIterator[tuple[AsyncConnectionPool[Any], ProtocolTrace]]:
    """A caller's pool of one autocommit connection whose protocol is traced."""
    trace = ProtocolTrace(tmp_path)
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        with_query(postgres_url, application_name=app_name),
        kwargs={"autocommit": True, "prepare_threshold": None},
        min_size=1,
        max_size=1,
        configure=trace.configure,
        open=False,
    )
    await pool.open(wait=True)
    yield pool, trace
    trace.messages()  # stops libpq writing to the file before it is closed
    await pool.close()


# -- registry, URLs and options -------------------------------------------------------------


def test_entry_points_declare_both_schemes_with_the_postgres_extra() -> None:
    infos = {info.scheme: info for info in leasekit.available_backends()}
    for scheme in ("postgresql", "postgres"):
        assert infos[scheme].target == "leasekit_postgres:PostgresLeaseProvider"
        assert infos[scheme].extras == ("postgres",)


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
async def test_connect_builds_a_provider_without_io(scheme: str) -> None:
    # Port 1 answers nothing; building must not try.
    provider = leasekit.connect(f"{scheme}://u:pw@127.0.0.1:1/db", require=("fencing",))
    assert isinstance(provider, PostgresLeaseProvider)
    assert provider.table == "leasekit_leases"
    assert provider.timeout_s == 5.0
    assert (provider.sweep_every, provider.sweep_batch, provider.sweep_grace_s) == (100, 1000, 600)
    pool = provider.client
    assert isinstance(pool, AsyncConnectionPool)
    assert pool.kwargs == {"autocommit": True, "prepare_threshold": None}
    assert (pool.min_size, pool.max_size) == (1, 10)
    params = psycopg.conninfo.conninfo_to_dict(pool.conninfo)
    assert params["options"] == "-c statement_timeout=5000"
    assert params["fallback_application_name"] == "leasekit"
    assert params["dbname"] == "db"
    assert "pw" not in repr(provider)
    await provider.aclose()


async def test_url_query_and_keywords_set_options_keywords_winning() -> None:
    provider = leasekit.connect(
        "postgresql://h:5433/app?table=leases.jobs&timeout_s=0.25&sweep_every=0"
        "&sslmode=disable&application_name=worker&options=-c%20search_path%3Dleases"
        "&pool_max_size=3&prepare_threshold=5&create_schema=false",
        timeout_s=1.5,
        pool_min_size=2,
    )
    assert isinstance(provider, PostgresLeaseProvider)
    assert provider.table == "leases.jobs"
    assert provider.timeout_s == 1.5
    assert provider.sweep_every == 0
    assert provider.create_schema is False
    pool = provider.client
    assert isinstance(pool, AsyncConnectionPool)
    assert (pool.min_size, pool.max_size) == (2, 3)
    assert pool.kwargs["prepare_threshold"] == 5
    params = psycopg.conninfo.conninfo_to_dict(pool.conninfo)
    assert params["sslmode"] == "disable"
    assert params["application_name"] == "worker"
    assert params["options"] == "-c search_path=leases -c statement_timeout=1500"
    await provider.aclose()
    quiet = leasekit.connect("postgres://h/app?server_timeout=false")
    assert isinstance(quiet, PostgresLeaseProvider)
    assert isinstance(quiet.client, AsyncConnectionPool)
    assert "options" not in psycopg.conninfo.conninfo_to_dict(quiet.client.conninfo)
    await quiet.aclose()


@pytest.mark.parametrize(
    ("url", "options", "argument"),
    [
        ("postgresql://h/db?colour=blue", {}, "url"),  # libpq knows no such parameter
        ("postgresql://h:notaport/db", {}, "url"),
        # Values libpq refuses only when it starts connecting: refused before any I/O.
        ("postgresql://h/db?sslmode=bogus", {}, "url"),
        ("postgresql://h/db?connect_timeout=soon", {}, "url"),
        ("postgresql://h/db?port=abc", {}, "url"),
        ("postgresql://h1,h2/db?target_session_attrs=any-old", {}, "url"),
        ("postgresql://h/db?gssencmode=always", {}, "url"),
        # ... and those it checks only on a TCP socket, which that dry run never opens.
        ("postgresql://h/db?keepalives=x", {}, "url"),
        ("postgresql://h/db?keepalives_idle=soon", {}, "url"),
        ("postgresql://h/db?tcp_user_timeout=1.5", {}, "url"),
        ("postgresql://h/db", {"colour": "blue"}, "options"),
        ("postgresql://h/db", {"autocommit": False}, "options"),
        ("postgresql://h/db?timeout_s=soon", {}, "timeout_s"),
        ("postgresql://h/db?timeout_s=0", {}, "timeout_s"),
        ("postgresql://h/db", {"timeout_s": True}, "timeout_s"),
        ("postgresql://h/db?table=a%3Bdrop", {}, "table"),
        ("postgresql://h/db", {"table": "1leases"}, "table"),
        ("postgresql://h/db", {"table": "a.b.c"}, "table"),
        ("postgresql://h/db", {"table": 'x"y'}, "table"),
        ("postgresql://h/db", {"table": ""}, "table"),
        ("postgresql://h/db", {"table": "x" * 49}, "table"),
        ("postgresql://h/db", {"table": b"leases"}, "table"),
        ("postgresql://h/db?sweep_every=-1", {}, "sweep_every"),
        ("postgresql://h/db", {"sweep_batch": 0}, "sweep_batch"),
        ("postgresql://h/db?sweep_grace_s=5", {}, "sweep_grace_s"),  # not > timeout_s
        ("postgresql://h/db", {"timeout_s": 30, "sweep_grace_s": 20}, "sweep_grace_s"),
        ("postgresql://h/db?pool_max_size=0", {}, "pool_max_size"),
        ("postgresql://h/db", {"pool_min_size": 5, "pool_max_size": 2}, "pool_max_size"),
        ("postgresql://h/db?prepare_threshold=-1", {}, "prepare_threshold"),
        ("postgresql://h/db?create_schema=maybe", {}, "create_schema"),
        ("postgresql://h/db", {"server_timeout": "yes"}, "server_timeout"),
    ],
)
def test_bad_urls_and_options_name_the_problem(
    url: str, options: dict[str, Any], argument: str
) -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument) as info:
        leasekit.connect(url, **options)
    assert info.value.argument == argument


@pytest.mark.parametrize(
    "query",
    ["colour=blue", "sslmode=bogus", "connect_timeout=soon", "channel_binding=x", "keepalives=x"],
)
def test_a_bad_libpq_parameter_is_a_usage_error_on_one_line_in_both_apis(
    query: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from leasekit._cli import main  # noqa: PLC0415

    url = f"postgresql://u:s3cret@127.0.0.1:1/db?{query}"
    for connect in (leasekit.connect, leasekit.sync.connect):
        with pytest.raises(leasekit.InvalidLeaseArgument) as info:
            connect(url)
        assert info.value.argument == "url"
        assert "\n" not in str(info.value)
        assert "s3cret" not in str(info.value)
    assert main(["owner", url, "k"]) == 2  # a usage error, not a backend error (3)
    err = capsys.readouterr().err
    assert err.startswith("leasekit: error: invalid url: ")
    assert err.count("\n") == 1, err


def test_from_url_refuses_other_schemes_and_never_shows_the_password() -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument, match=r"postgresql://"):
        PostgresLeaseProvider.from_url("mysql://h/db")
    with pytest.raises(leasekit.InvalidLeaseArgument) as info:
        leasekit.connect("postgresql://user:s3cret@h/db?colour=blue")
    assert "s3cret" not in str(info.value)
    assert "user:***@h" in str(info.value)


async def test_a_sync_or_non_autocommit_client_is_refused_with_a_hint(postgres_url: str) -> None:
    with admin(postgres_url) as conn, pytest.raises(leasekit.InvalidLeaseArgument, match="asyncio"):
        PostgresLeaseProvider(conn)
    conn_async = await psycopg.AsyncConnection.connect(postgres_url)
    with pytest.raises(leasekit.InvalidLeaseArgument, match="autocommit"):
        PostgresLeaseProvider(conn_async)
    await conn_async.close()


async def test_a_refused_connection_is_unreachable_at_once_not_at_the_timeout() -> None:
    # Nothing listens: the refusal itself is the answer, long before timeout_s.
    timeout_s = 30
    provider = PostgresLeaseProvider.from_url(
        f"postgresql://postgres@127.0.0.1:{free_port()}/postgres", timeout_s=timeout_s
    )
    started = time.monotonic()
    with pytest.raises(leasekit.LeaseBackendUnreachable, match="refused") as info:
        async with provider:
            pass
    assert time.monotonic() - started < timeout_s / 2
    assert info.value.backend == "postgresql"
    assert isinstance(info.value.__cause__, psycopg.OperationalError)
    await provider.aclose()


# -- the schema and migrate -------------------------------------------------------------------


def relation_kinds(url: str, table: str) -> dict[str, str]:
    schema, name = table.split(".")
    with admin(url) as conn:
        rows = conn.execute(
            "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname LIKE %s",
            (schema, name + "%"),
        ).fetchall()
    return {relname.removeprefix(name): kind for relname, kind in rows}


async def test_first_use_creates_table_sequence_index_and_meta(
    provider: PostgresLeaseProvider, postgres_url: str, postgres_table: str
) -> None:
    assert relation_kinds(postgres_url, postgres_table) == {
        "": "r",
        "_pkey": "i",
        "_expires_at": "i",
        "_token_seq": "S",
        "_meta": "r",
        "_meta_pkey": "i",
        "_slots": "r",
        "_slots_pkey": "i",
        "_slot_keys": "r",
        "_slot_keys_pkey": "i",
        "_line": "r",
        "_line_pkey": "i",
    }
    schema, name = postgres_table.split(".")
    with admin(postgres_url) as conn:
        columns = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
            (schema, name),
        ).fetchall()
        version = conn.execute(
            sql.SQL("SELECT value FROM {} WHERE name = 'schema_version'").format(
                identifier(postgres_table + "_meta")
            )
        ).fetchone()
    assert columns == [
        ("key", "bytea"),
        ("owner", "bytea"),
        ("token", "bigint"),
        ("expires_at", "timestamp with time zone"),
        ("metadata", "bytea"),
    ]
    assert version == (SCHEMA_VERSION,)


async def test_without_create_schema_a_missing_table_names_migrate_then_migrate_fixes_it(
    postgres_url: str, postgres_table: str
) -> None:
    provider = PostgresLeaseProvider.from_url(
        postgres_url, table=postgres_table, create_schema=False
    )
    with pytest.raises(leasekit.LeaseBackendError, match="leasekit migrate"):
        await provider.acquire_lease("k", "a", LONG_MS)
    assert relation_kinds(postgres_url, postgres_table) == {}
    assert await provider.migrate() == SCHEMA_VERSION
    assert await provider.migrate() == SCHEMA_VERSION  # idempotent
    await exercise_every_operation(provider, "k")
    await provider.aclose()


def create_version_2_table(url: str, table: str) -> None:
    """The schema leasekit wrote before lease metadata (version 2), with one live lease."""
    names = {
        "table": identifier(table),
        "meta": identifier(f"{table}_meta"),
        "seq": identifier(f"{table}_token_seq"),
    }
    with admin(url) as conn:
        for statement in (
            "CREATE TABLE {table} (key bytea PRIMARY KEY, owner bytea NOT NULL, "
            "token bigint NOT NULL, expires_at timestamptz NOT NULL)",
            "CREATE SEQUENCE {seq} AS bigint",
            "CREATE TABLE {meta} (name text PRIMARY KEY, value bigint NOT NULL)",
            "INSERT INTO {meta} VALUES ('schema_version', 2)",
            "INSERT INTO {table} VALUES "
            "('old', 'before', 7, clock_timestamp() + interval '1 hour')",
        ):
            used = {k: v for k, v in names.items() if f"{{{k}}}" in statement}
            conn.execute(sql.SQL(statement).format(**used))


async def test_a_version_2_table_gains_the_metadata_column_on_first_use(
    postgres_url: str, postgres_table: str
) -> None:
    create_version_2_table(postgres_url, postgres_table)
    async with PostgresLeaseProvider.from_url(postgres_url, table=postgres_table) as provider:
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
    with admin(postgres_url) as conn:
        version = conn.execute(
            sql.SQL("SELECT value FROM {}").format(identifier(f"{postgres_table}_meta"))
        ).fetchone()
    assert version == (SCHEMA_VERSION,)


async def test_without_create_schema_a_version_2_table_names_migrate_then_migrate_fixes_it(
    postgres_url: str, postgres_table: str
) -> None:
    create_version_2_table(postgres_url, postgres_table)
    provider = PostgresLeaseProvider.from_url(
        postgres_url, table=postgres_table, create_schema=False
    )
    with pytest.raises(leasekit.LeaseBackendError, match="leasekit migrate"):
        await provider.acquire_lease("k", "a", LONG_MS, metadata=b"m")
    assert await provider.migrate() == SCHEMA_VERSION
    assert (await provider.acquire_lease("k", "a", LONG_MS, metadata=b"m")).metadata == b"m"
    record = await provider.get_lease_record("k")
    assert record is not None
    assert record.metadata == b"m"
    await provider.aclose()


async def test_a_newer_schema_version_is_refused(
    provider: PostgresLeaseProvider, postgres_url: str, postgres_table: str
) -> None:
    with admin(postgres_url) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET value = 99 WHERE name = 'schema_version'").format(
                identifier(postgres_table + "_meta")
            )
        )
    newer = PostgresLeaseProvider.from_url(postgres_url, table=postgres_table)
    with pytest.raises(leasekit.LeaseBackendError, match="newer"):
        async with newer:
            pass
    await newer.aclose()


async def test_many_providers_creating_one_table_at_once_all_succeed(
    postgres_url: str, postgres_table: str
) -> None:
    providers = [
        PostgresLeaseProvider.from_url(postgres_url, table=postgres_table) for _ in range(8)
    ]
    results = await asyncio.gather(
        *(p.acquire_lease("k", f"o{i}", LONG_MS) for i, p in enumerate(providers))
    )
    winners = [r for r in results if r.acquired]
    assert len(winners) == 1
    assert all(r.owner == winners[0].owner for r in results)
    for p in providers:
        await p.aclose()


async def test_an_application_role_without_ddl_rights_works_after_migrate(
    postgres_url: str, postgres_schema: str, postgres_table: str
) -> None:
    if os.environ.get("LEASEKIT_TEST_POSTGRES_URL"):
        pytest.skip("needs the harness's own server (trust auth, a superuser)")
    role = f"leasekit_app_{uuid.uuid4().hex[:8]}"
    table, meta, seq = (identifier(postgres_table + s) for s in ("", "_meta", "_token_seq"))
    async with PostgresLeaseProvider.from_url(postgres_url, table=postgres_table) as owner:
        await owner.migrate()
    with admin(postgres_url) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(postgres_schema), sql.Identifier(role)
        ))  # fmt: skip
        conn.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
            table, sql.Identifier(role)
        ))  # fmt: skip
        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(meta, sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT USAGE ON {} TO {}").format(seq, sql.Identifier(role)))
    try:
        parts = urlsplit(postgres_url)
        app_url = urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))
        async with PostgresLeaseProvider.from_url(app_url, table=postgres_table) as app:
            await exercise_every_operation(app, "k")
            assert await app.sweep() == 0
            with pytest.raises(leasekit.LeaseBackendError, match="InsufficientPrivilege"):
                await app.migrate()
    finally:
        with admin(postgres_url) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(sql.Identifier(role)))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leasekit", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


@pytest.mark.slow  # six CLI processes
def test_leasekit_migrate_creates_the_schema_up_front(
    postgres_url: str, postgres_table: str, tmp_path: Path
) -> None:
    url = with_query(postgres_url, table=postgres_table)
    done = run_cli("migrate", url)
    assert done.returncode == 0, done.stderr
    assert "schema up to date" in done.stdout
    assert set(relation_kinds(postgres_url, postgres_table)) >= {"", "_meta", "_token_seq"}
    assert run_cli("migrate", url).returncode == 0  # idempotent
    done = run_cli("acquire", url, "k", "a", "--ttl-ms", "60000")
    assert done.returncode == 0, done.stderr
    no_schema = run_cli("migrate", "memory://")  # SQLite has a schema to migrate now
    assert no_schema.returncode == 2
    assert "no schema to migrate" in no_schema.stderr
    unreachable = run_cli("migrate", f"postgresql://u@127.0.0.1:{free_port()}/db?timeout_s=1")
    assert unreachable.returncode == 3
    assert "leasekit: error:" in unreachable.stderr


# -- keys, tables, inspect --------------------------------------------------------------------

AWKWARD_KEYS = [
    "plain",
    "resource\0thread",
    "\0",
    "\0\0",
    "trailing\0",
    "emoji 🎉 and 中文",
    "quote ' and \" and \\ and %s and %(key)s",
    "space and\ttab\nnewline",
    "x" * 1024,
    "é" * 512,  # 1024 bytes
]


@pytest.mark.parametrize("key", AWKWARD_KEYS, ids=range(len(AWKWARD_KEYS)))
async def test_awkward_keys_and_owners_round_trip_as_utf8_bytea(
    provider: PostgresLeaseProvider, postgres_url: str, postgres_table: str, key: str
) -> None:
    owner = f"own\0{key[:40]}🎉"
    await exercise_every_operation(provider, key)
    assert (await provider.acquire_lease(key, owner, LONG_MS)).acquired
    assert await provider.get_lease_owner(key) == owner
    [record] = await provider.inspect(key)
    assert (record.key, record.owner) == (key, owner)
    with admin(postgres_url) as conn:
        rows = conn.execute(sql.SQL("SELECT key, owner FROM {}").format(identifier(postgres_table)))
        assert rows.fetchall() == [(key.encode(), owner.encode())]


async def test_awkward_keys_stay_distinct(provider: PostgresLeaseProvider) -> None:
    for i, key in enumerate(AWKWARD_KEYS):
        assert (await provider.acquire_lease(key, f"o{i}", LONG_MS)).acquired
    for i, key in enumerate(AWKWARD_KEYS):
        assert await provider.get_lease_owner(key) == f"o{i}"
    records = await provider.inspect()
    assert [(r.key, r.owner) for r in records] == sorted(
        (key, f"o{i}") for i, key in enumerate(AWKWARD_KEYS)
    )


async def test_tables_are_independent(postgres_url: str, postgres_table: str) -> None:
    async with (
        PostgresLeaseProvider.from_url(postgres_url, table=postgres_table + "_a") as a,
        PostgresLeaseProvider.from_url(postgres_url, table=postgres_table + "_b") as b,
    ):
        assert (await a.acquire_lease("k", "x", LONG_MS)).acquired
        assert (await b.acquire_lease("k", "y", LONG_MS)).acquired
        assert [r.owner for r in await a.inspect()] == ["x"]
        assert [r.owner for r in await b.inspect()] == ["y"]


async def test_inspect_filters_by_prefix_orders_and_limits(provider: PostgresLeaseProvider) -> None:
    for i in range(5):
        await provider.acquire_lease(f"job/{i}", f"w{i}", LONG_MS)
    await provider.acquire_lease("job0", "zero", LONG_MS)  # '0' sorts right after '/'
    await provider.acquire_lease("jo", "short", LONG_MS)
    await provider.acquire_lease("job/gone", "g", LONG_MS)
    await provider.release_lease("job/gone", "g")
    await provider.acquire_lease("é/1", "accent", LONG_MS)
    await provider.acquire_lease("é\0", "nul", LONG_MS)
    records = await provider.inspect("job/")
    assert [(r.key, r.owner) for r in records] == [(f"job/{i}", f"w{i}") for i in range(5)]
    assert all(isinstance(r, LeaseRecord) and 0 < r.remaining_ms <= LONG_MS for r in records)
    for r in records:
        assert r.token == (await provider.acquire_lease(r.key, r.owner, LONG_MS)).token
    assert [r.key for r in await provider.inspect("é")] == ["é\0", "é/1"]
    assert [r.key for r in await provider.inspect("job")] == [
        *(f"job/{i}" for i in range(5)),
        "job0",
    ]
    assert [r.key for r in await provider.inspect(limit=2)] == ["jo", "job/0"]
    assert len(await provider.inspect()) == 9
    for bad in ("", 5):
        with pytest.raises(leasekit.InvalidLeaseArgument):
            await provider.inspect(bad)
    with pytest.raises(leasekit.InvalidLeaseArgument):
        await provider.inspect(limit=0)


# -- one statement per operation ----------------------------------------------------------------


async def test_every_operation_is_one_statement_and_one_round_trip(
    traced_pool: tuple[AsyncConnectionPool[Any], ProtocolTrace], postgres_table: str
) -> None:
    pool, trace = traced_pool
    rounds = 5
    async with PostgresLeaseProvider(pool, table=postgres_table, sweep_every=0) as provider:
        for i in range(rounds):
            await exercise_every_operation(provider, f"k{i}")
    messages = trace.messages()
    sent = [line.split("\t")[2].strip() for line in messages if line.startswith("F\t")]
    # Opening: one simple query that checks the schema, one that creates it.
    assert sent[:2] == ["Query", "Query"]
    operations = sent[2:]
    assert operations.count("Sync") == rounds * EXERCISE_OPERATIONS
    assert operations.count("Parse") == rounds * EXERCISE_OPERATIONS
    assert "Query" not in operations
    assert ProtocolTrace.round_trips(messages) == 2 + rounds * EXERCISE_OPERATIONS
    # Every statement is the unnamed one: nothing is prepared in the session.
    parses = [line for line in messages if line.startswith("F") and "\tParse\t" in line]
    assert all('\tParse\t "" ' in line for line in parses), parses[:3]


async def test_no_session_state_unless_prepared_statements_are_asked_for(
    postgres_url: str, postgres_table: str
) -> None:
    async def prepared(provider: PostgresLeaseProvider) -> int:
        pool = provider.client
        assert isinstance(pool, AsyncConnectionPool)
        async with pool.connection() as conn:
            row = await (
                await conn.execute("SELECT count(*) FROM pg_prepared_statements")
            ).fetchone()
            assert row is not None
            return int(row[0])

    url = with_query(postgres_url, pool_max_size="1")
    async with PostgresLeaseProvider.from_url(url, table=postgres_table) as default:
        for i in range(10):
            await exercise_every_operation(default, f"k{i}")
        assert await prepared(default) == 0
    async with PostgresLeaseProvider.from_url(
        url, table=postgres_table, prepare_threshold=0
    ) as preparing:
        await exercise_every_operation(preparing, "p")
        assert await prepared(preparing) > 0


async def start_blocked(coro: Any, postgres_url: str, app_name: str) -> asyncio.Task[Any]:
    """Start ``coro`` and return once its statement waits for a row lock."""
    task: asyncio.Task[Any] = asyncio.ensure_future(coro)
    await eventually(
        lambda: task.done() or backends_of(postgres_url, app_name, waiting=True) == 1,
        "the statement to wait for the row lock",
    )
    assert not task.done(), task
    return task


async def test_a_denied_acquire_names_the_holder_that_committed_while_it_waited(
    traced_pool: tuple[AsyncConnectionPool[Any], ProtocolTrace],
    postgres_url: str,
    postgres_table: str,
    app_name: str,
) -> None:
    """READ COMMITTED's snapshot is older than the row that denies us; the answer is not."""
    pool, trace = traced_pool
    provider = PostgresLeaseProvider(pool, table=postgres_table, sweep_every=0)
    await provider.acquire_lease("held", "x", LONG_MS)
    other = await psycopg.AsyncConnection.connect(postgres_url, autocommit=True)
    try:
        # Another client transfers the lease from x to y in a transaction it keeps open.
        await other.execute("BEGIN")
        params = {
            "key": b"held",
            "from_owner": b"x",
            "to_owner": b"y",
            "ttl_ms": LONG_MS,
            "metadata": b"y:1",
        }
        assert (await other.execute(provider._sql.transfer, params)).rowcount == 1
        trace.messages()
        await trace.restart(pool)
        task = await start_blocked(
            provider.acquire_lease("held", "z", LONG_MS), postgres_url, app_name
        )
        await other.execute("COMMIT")
        # Not the stale x, and y's metadata, in the same round trip.
        assert await task == leasekit.LeaseResult(False, "y", None, b"y:1")
        assert ProtocolTrace.round_trips(trace.messages()) == 1

        # A brand-new key whose first row another client inserts while we wait: that
        # row is newer than our snapshot, so the holder is read once more.
        await trace.restart(pool)
        await other.execute("BEGIN")
        params = {"key": b"new", "owner": b"f", "ttl_ms": LONG_MS, "metadata": b"f:1"}
        await other.execute(provider._sql.acquire, params)
        task = await start_blocked(
            provider.acquire_lease("new", "z", LONG_MS), postgres_url, app_name
        )
        await other.execute("COMMIT")
        assert await task == leasekit.LeaseResult(False, "f", None, b"f:1")
        assert ProtocolTrace.round_trips(trace.messages()) == 2
    finally:
        await other.close()
        await provider.aclose()


async def test_racing_acquirers_get_one_winner_and_every_loser_names_it(
    postgres_url: str, postgres_table: str
) -> None:
    providers = [
        PostgresLeaseProvider.from_url(postgres_url, table=postgres_table, pool_max_size=4)
        for _ in range(3)
    ]
    try:
        for round_number in range(30):
            key = f"race/{round_number}"
            results = await asyncio.gather(
                *(providers[i % 3].acquire_lease(key, f"o{i}", LONG_MS) for i in range(12))
            )
            winners = [r.owner for r in results if r.acquired]
            assert len(winners) == 1, results
            assert {r.owner for r in results} == {winners[0]}, results
    finally:
        for p in providers:
            await p.aclose()


# -- fencing tokens and the sweep ---------------------------------------------------------------


def age_rows(postgres_url: str, table: str, keys: list[str], *, by_s: float) -> None:
    """Move the expiry of ``keys``' rows ``by_s`` seconds into the server's past."""
    with admin(postgres_url) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {} SET expires_at = least(expires_at, clock_timestamp()) "
                "- make_interval(secs => %s) WHERE key = ANY(%s)"
            ).format(identifier(table)),
            (by_s, [key.encode() for key in keys]),
        )


async def test_sweep_reclaims_old_rows_only_and_tokens_keep_increasing(
    postgres_url: str, postgres_table: str
) -> None:
    # Rows grow old on the server's clock, moved there by an UPDATE: no sleep, and no
    # window a slow machine could miss (the grace period is a minute).
    async with PostgresLeaseProvider.from_url(
        postgres_url, table=postgres_table, timeout_s=1, sweep_grace_s=60, sweep_every=0,
        sweep_batch=7,
    ) as provider:  # fmt: skip
        tokens = {}
        for i in range(20):
            result = await provider.acquire_lease(f"k{i}", "a", 1 if i < 10 else LONG_MS)
            tokens[f"k{i}"] = result.token
        assert await provider.sweep() == 0  # expired, but not for the grace period yet
        age_rows(postgres_url, postgres_table, [f"k{i}" for i in range(10)], by_s=120)
        await provider.release_lease("k19", "a")  # a fresh tombstone
        assert await provider.sweep() == 7  # one batch
        assert await provider.sweep() == 3
        assert await provider.sweep() == 0
        assert await provider.row_count() == 10  # the live leases and the fresh tombstone
        age_rows(postgres_url, postgres_table, ["k19"], by_s=120)
        assert await provider.sweep() == 1  # the tombstone, now old
        assert await provider.row_count() == 9
        for key, token in tokens.items():
            result = await provider.acquire_lease(key, "b", LONG_MS)
            if key in ("k19", *(f"k{i}" for i in range(10))):
                assert result.acquired
                assert result.token is not None
                assert token is not None
                assert result.token > token
            else:
                assert result == leasekit.LeaseResult(False, "a", None)


async def test_sweeping_the_row_with_the_highest_token_never_lowers_the_next_token(
    postgres_url: str, postgres_table: str
) -> None:
    # Tokens come from the sequence, not from what the table still holds: a token
    # derived from max(token) + 1 would repeat once the row holding the max is gone.
    async with PostgresLeaseProvider.from_url(
        postgres_url, table=postgres_table, sweep_grace_s=60, sweep_every=0
    ) as provider:
        low = await provider.acquire_lease("low", "a", LONG_MS)
        high = await provider.acquire_lease("high", "a", LONG_MS)
        assert low.token is not None
        assert high.token is not None
        assert high.token > low.token
        await provider.release_lease("high", "a")
        age_rows(postgres_url, postgres_table, ["high"], by_s=120)
        assert await provider.sweep() == 1
        assert await provider.row_count() == 1  # only "low" is left
        again = await provider.acquire_lease("high", "b", LONG_MS)
        assert again.acquired
        assert again.token is not None
        assert again.token > high.token, (low.token, high.token, again.token)


async def test_a_grant_that_waited_for_a_row_lock_lives_its_full_ttl_after_the_grant(
    postgres_url: str, postgres_table: str, app_name: str
) -> None:
    # Expiry counts from when the statement decides (clock_timestamp()), not from when
    # its transaction began (now()): a grant that waited 1.5 s for another session's
    # row lock must still live ttl_ms from the moment the lock was released.
    async with PostgresLeaseProvider.from_url(
        with_query(postgres_url, application_name=app_name),
        table=postgres_table,
        timeout_s=30,
        sweep_every=0,
    ) as provider:
        assert (await provider.acquire_lease("k", "a", LONG_MS)).acquired
        await provider.release_lease("k", "a")  # a free key, with a row to lock
        other = await psycopg.AsyncConnection.connect(postgres_url, autocommit=True)
        try:
            await other.execute("BEGIN")
            await other.execute(
                sql.SQL("SELECT 1 FROM {} WHERE key = 'k' FOR UPDATE").format(
                    identifier(postgres_table)
                )
            )
            task = await start_blocked(
                provider.acquire_lease("k", "b", LONG_MS), postgres_url, app_name
            )
            await asyncio.sleep(1.5)  # the statement waits for the lock all along
            cursor = await other.execute("SELECT clock_timestamp()")
            row = await cursor.fetchone()
            assert row is not None
            released_at = row[0]
            await other.execute("COMMIT")
            result = await task
        finally:
            await other.close()
        assert result.acquired
        with admin(postgres_url) as conn:
            row = conn.execute(
                sql.SQL("SELECT expires_at FROM {} WHERE key = 'k'").format(
                    identifier(postgres_table)
                )
            ).fetchone()
        assert row is not None
        # The server's own times: the grant came after released_at, so it ends after
        # released_at + ttl (now() would have counted from 1.5 s earlier).
        assert row[0] >= released_at + datetime.timedelta(milliseconds=LONG_MS), (
            row[0],
            released_at,
        )


@pytest.mark.slow  # 800 statements and a wait past the grace
async def test_background_sweeps_keep_the_table_bounded(
    postgres_url: str, postgres_table: str
) -> None:
    async with PostgresLeaseProvider.from_url(
        postgres_url, table=postgres_table, timeout_s=1, sweep_grace_s=1.1, sweep_every=10,
        sweep_batch=50,
    ) as provider:  # fmt: skip
        for i in range(200):
            await provider.acquire_lease(f"k{i}", "a", 1)
        await asyncio.sleep(1.2)
        for i in range(200):
            await provider.acquire_lease(f"j{i}", "a", LONG_MS)
            await provider.release_lease(f"j{i}", "a")
        # The 200 old rows went in background sweeps; the 200 fresh tombstones stay.
        assert await provider.row_count() <= 250


# -- callers' pools and connections ----------------------------------------------------------------


async def test_a_callers_pool_is_used_and_never_closed(
    traced_pool: tuple[AsyncConnectionPool[Any], ProtocolTrace], postgres_table: str
) -> None:
    pool, _ = traced_pool
    async with PostgresLeaseProvider(pool, table=postgres_table) as provider:
        await exercise_every_operation(provider, "k")
    with pytest.raises(leasekit.LeaseProviderClosed):
        await provider.get_lease_owner("k")
    assert not pool.closed
    async with pool.connection() as conn:
        await conn.execute("SELECT 1")


async def test_a_callers_connection_is_used_and_never_closed(
    postgres_url: str, postgres_table: str
) -> None:
    conn = await psycopg.AsyncConnection.connect(postgres_url, autocommit=True)
    async with PostgresLeaseProvider(conn, table=postgres_table) as provider:
        await asyncio.gather(*(exercise_every_operation(provider, f"k{i}") for i in range(4)))
    assert not conn.closed
    await conn.execute("SELECT 1")
    await conn.close()


async def test_a_callers_pool_without_autocommit_still_commits_each_operation(
    postgres_url: str, postgres_table: str
) -> None:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        postgres_url, min_size=1, max_size=2, open=False
    )
    await pool.open()
    async with PostgresLeaseProvider(pool, table=postgres_table) as provider:
        await exercise_every_operation(provider, "k")
        assert (await provider.acquire_lease("kept", "a", LONG_MS)).acquired
    async with PostgresLeaseProvider.from_url(postgres_url, table=postgres_table) as other:
        assert await other.get_lease_owner("kept") == "a"
    await pool.close()


async def test_a_built_pool_is_closed_by_aclose(postgres_url: str, postgres_table: str) -> None:
    provider = PostgresLeaseProvider.from_url(postgres_url, table=postgres_table)
    async with provider:
        await exercise_every_operation(provider, "k")
    pool = provider.client
    assert isinstance(pool, AsyncConnectionPool)
    assert pool.closed
    for call in (provider.get_lease_owner("k"), provider.inspect(), provider.sweep()):
        with pytest.raises(leasekit.LeaseProviderClosed):
            await call
    await provider.aclose()  # idempotent


# -- faults ---------------------------------------------------------------------------------------


async def test_terminated_backends_mid_run_are_backend_errors_at_worst_then_recover(
    postgres_url: str, postgres_table: str, app_name: str
) -> None:
    url = with_query(postgres_url, application_name=app_name, pool_max_size="4")
    async with PostgresLeaseProvider.from_url(url, table=postgres_table, timeout_s=2) as provider:
        outcomes = {"ok": 0}
        errors: list[leasekit.LeaseBackendError] = []
        stop = asyncio.Event()

        async def churn(worker: int) -> None:
            key, owner = f"k{worker}", f"o{worker}"
            while not stop.is_set():
                for call in (
                    provider.acquire_lease(key, owner, LONG_MS),
                    provider.renew_lease(key, owner, LONG_MS),
                    provider.get_lease_owner(key),
                    provider.transfer_lease(key, owner, owner, LONG_MS),
                    provider.release_lease(key, owner),
                ):
                    try:
                        await call
                        outcomes["ok"] += 1
                    except leasekit.LeaseBackendError as exc:  # noqa: PERF203 (counting them)
                        errors.append(exc)

        workers = [asyncio.create_task(churn(i)) for i in range(4)]
        with admin(postgres_url) as conn:
            for _ in range(10):
                await asyncio.sleep(0.05)
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (app_name,),
                )
        stop.set()
        await asyncio.gather(*workers)
        assert outcomes["ok"] > 0
        assert all(e.__cause__ is None or isinstance(e.__cause__, psycopg.Error) for e in errors)
        # Idempotent operations are retried once on a fresh connection, so most succeed.
        await exercise_every_operation(provider, "after")


def terminate_backends(url: str, app_name: str) -> int:
    """End every server process of ``app_name``'s connections, and wait for them to go."""
    with admin(url) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE application_name = %s",
            (app_name,),
        ).fetchall()
    assert all(ended for (ended,) in rows), rows
    return len(rows)


async def test_an_idempotent_call_on_a_connection_ended_since_runs_again_a_transfer_does_not(
    postgres_url: str, postgres_table: str, app_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The one retry on a fresh connection (``_ops.attempts``), as the server saw it:
    the pool's only connection is ended between two calls."""
    url = with_query(postgres_url, application_name=app_name, pool_max_size="1")
    async with PostgresLeaseProvider.from_url(url, table=postgres_table) as provider:
        assert (await provider.acquire_lease("k", "a", LONG_MS)).acquired
        assert terminate_backends(postgres_url, app_name) == 1
        with caplog.at_level(logging.INFO, logger="leasekit.postgres"):
            assert await provider.get_lease_owner("k") == "a"  # on a fresh connection
        assert "retrying once on a fresh one" in caplog.text
        assert terminate_backends(postgres_url, app_name) == 1
        with pytest.raises(leasekit.LeaseBackendError) as failed:
            await provider.transfer_lease("k", "a", "b", LONG_MS)
        assert isinstance(failed.value.__cause__, psycopg.OperationalError)
        assert await provider.get_lease_owner("k") == "a"  # not run twice, nor once


async def test_a_statement_stalled_by_a_row_lock_is_cancelled_by_the_server(
    postgres_url: str, postgres_table: str
) -> None:
    # The server's statement_timeout (200 ms) fires long before the provider's own bound.
    timeout_s = 3.0
    url = with_query(postgres_url, options="-c%20statement_timeout%3D200", server_timeout="false")
    async with PostgresLeaseProvider.from_url(
        url, table=postgres_table, timeout_s=timeout_s
    ) as quick:
        assert (await quick.acquire_lease("k", "a", LONG_MS)).acquired
        with admin(postgres_url) as other:
            other.execute("BEGIN")
            other.execute(
                sql.SQL("SELECT * FROM {} WHERE key = 'k' FOR UPDATE").format(
                    identifier(postgres_table)
                )
            )
            started = time.monotonic()
            with pytest.raises(leasekit.LeaseBackendTimeout, match="statement timeout") as info:
                await quick.renew_lease("k", "a", LONG_MS)
            assert time.monotonic() - started < timeout_s + SLACK_S
            assert info.value.key == "k"
            assert isinstance(info.value.__cause__, psycopg.errors.QueryCanceled)
            other.execute("ROLLBACK")
        assert await quick.renew_lease("k", "a", LONG_MS)
        await exercise_every_operation(quick, "after")


async def test_a_stalled_statement_on_a_callers_pool_without_a_server_timeout_is_bounded(
    postgres_url: str, postgres_table: str, app_name: str
) -> None:
    timeout_s = 0.5
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        with_query(postgres_url, application_name=app_name),
        kwargs={"autocommit": True},
        min_size=1,
        max_size=2,
        open=False,
    )
    await pool.open()
    async with PostgresLeaseProvider(pool, table=postgres_table, timeout_s=timeout_s) as p:
        assert (await p.acquire_lease("k", "a", LONG_MS)).acquired
        with admin(postgres_url) as other:
            other.execute("BEGIN")
            other.execute(
                sql.SQL("SELECT * FROM {} WHERE key = 'k' FOR UPDATE").format(
                    identifier(postgres_table)
                )
            )
            for call in (p.acquire_lease("k", "b", LONG_MS), p.release_lease("k", "a")):
                started = time.monotonic()
                with pytest.raises(leasekit.LeaseBackendError, match="no answer"):
                    await call
                assert time.monotonic() - started < timeout_s + SLACK_S
            # The abandoned statements are cancelled on the server, not left waiting.
            await eventually(
                lambda: backends_of(postgres_url, app_name, waiting=True) == 0,
                "the abandoned statements to be cancelled",
            )
            other.execute("ROLLBACK")
        assert await p.get_lease_owner("k") == "a"
        await exercise_every_operation(p, "after")
    await pool.close()


async def test_a_paused_server_is_a_backend_error_within_the_timeout_then_recovers(
    private_postgres_server: PostgresServer,
) -> None:
    timeout_s = 0.5
    async with PostgresLeaseProvider.from_url(
        private_postgres_server.url, timeout_s=timeout_s
    ) as provider:
        assert (await provider.acquire_lease("k", "a", LONG_MS)).acquired
        private_postgres_server.pause()
        try:
            for call in (
                provider.acquire_lease("k", "a", LONG_MS),
                provider.get_lease_owner("k"),
                provider.transfer_lease("k", "a", "b", LONG_MS),
            ):
                started = time.monotonic()
                with pytest.raises(leasekit.LeaseBackendError) as info:
                    await call
                assert time.monotonic() - started < timeout_s + SLACK_S
                assert info.value.key == "k"
        finally:
            private_postgres_server.resume()
        # The transfer may or may not have run once the server woke; either is fine.
        assert await provider.get_lease_owner("k") in ("a", "b")
        await exercise_every_operation(provider, "after-pause")


async def test_a_release_abandoned_at_the_timeout_never_ends_a_lease_granted_after_it(
    private_postgres_server: PostgresServer,
) -> None:
    # Issue 22, item 3. A release sent to a frozen backend is abandoned at timeout_s and
    # runs when the backend wakes. The caller, told only "timed out", acquires again on
    # another connection. Had that acquire been answered "acquired" (and a renew True)
    # before the old release ran, the old release would end the new lease, keyed as it
    # is by owner, and a rival would take the key while the caller believes it holds it.
    # Calls on one key from one provider are therefore sent in the order they were made:
    # a later one waits (within its own timeout) for an abandoned one to settle.
    server = private_postgres_server
    url = with_query(server.url, pool_min_size="2", pool_max_size="2", timeout_s="0.5")
    async with PostgresLeaseProvider.from_url(url) as provider:
        pool = provider.client
        assert isinstance(pool, AsyncConnectionPool)
        first = await provider.acquire_lease("k", "x", LONG_MS)
        assert first.acquired
        async with pool.connection() as held:
            async with pool.connection() as idle:
                frozen_pid = (await (await idle.execute("SELECT pg_backend_pid()")).fetchone())[0]
            # `idle` is back in the pool, the only connection there: the release takes it.
            os.kill(frozen_pid, signal.SIGSTOP)
            try:
                with pytest.raises(leasekit.LeaseBackendTimeout):
                    await provider.release_lease("k", "x")
            except BaseException:
                os.kill(frozen_pid, signal.SIGCONT)
                raise
            assert held.info.backend_pid != frozen_pid
        believed = False
        try:
            # The caller goes on: its release may or may not have happened.
            again = await provider.acquire_lease("k", "x", LONG_MS)
            believed = again.acquired and await provider.renew_lease("k", "x", LONG_MS)
        except leasekit.LeaseBackendTimeout:
            pass  # waited for the abandoned release, which the frozen backend holds up
        finally:
            os.kill(frozen_pid, signal.SIGCONT)

        def release_ran() -> bool:
            with admin(server.url) as conn:
                row = conn.execute(
                    "SELECT state, query FROM pg_stat_activity WHERE pid = %s", (frozen_pid,)
                ).fetchone()
            return row is not None and row[0] == "idle" and "expires_at > " in row[1]

        await eventually(release_ran, "the abandoned release to run")
        if not believed:
            believed = (await provider.acquire_lease("k", "x", LONG_MS)).acquired
            believed = believed and await provider.renew_lease("k", "x", LONG_MS)
        assert believed
        # x believes it holds k for LONG_MS: on the server it does, and nobody else gets it.
        assert await provider.get_lease_owner("k") == "x"
        rival = await provider.acquire_lease("k", "y", LONG_MS)
        assert not rival.acquired, rival
        assert rival.owner == "x"


async def test_a_restarted_server_keeps_leases_and_tokens_and_the_pool_recovers(
    private_postgres_server: PostgresServer,
) -> None:
    server = private_postgres_server
    async with PostgresLeaseProvider.from_url(server.url, timeout_s=2) as provider:
        first = await provider.acquire_lease("k", "a", LONG_MS)
        assert first.token is not None
        server.kill()
        started = time.monotonic()
        with pytest.raises(leasekit.LeaseBackendError):
            await provider.acquire_lease("k", "a", LONG_MS)
        assert time.monotonic() - started < 2 + SLACK_S
        server.restart()  # on the same port
        # Every pooled connection died with the server; the first call retries on a new one.
        assert await provider.get_lease_owner("k") == "a"  # persistent
        assert (await provider.acquire_lease("k", "a", LONG_MS)).token == first.token
        await provider.release_lease("k", "a")
        server.restart()
        again = await provider.acquire_lease("k", "b", LONG_MS)
        assert again.token is not None
        assert again.token > first.token
        await exercise_every_operation(provider, "after-restart")


# -- the scale benchmark -----------------------------------------------------------------------


def test_the_scale_benchmark_runs_on_a_small_table(postgres_url: str, postgres_schema: str) -> None:
    table = f"{postgres_schema}.scale_{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [
            sys.executable, str(ROOT / "benchmarks" / "postgres_scale.py"),
            "--url", postgres_url, "--table", table,
            "--rows", "10000", "--ops", "50", "--sweep-timeout-s", "60",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "p99 x" in done.stdout
    assert "reclaiming: 5,000 of 5,000 rows" in done.stdout
    with admin(postgres_url) as conn:
        row = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
    assert row == (None,)  # dropped at the end


# -- prepared statements and per-call deadlines -------------------------------------------------


@pytest.mark.parametrize("own_pool", [False, True], ids=["built-pool", "callers-pool"])
async def test_preparing_every_statement_still_creates_a_fresh_table(
    postgres_url: str, postgres_table: str, own_pool: bool
) -> None:
    # The schema is several commands in one string, which PostgreSQL cannot prepare:
    # it must go out unprepared even when psycopg prepares everything from the start.
    if not own_pool:
        async with PostgresLeaseProvider.from_url(
            postgres_url, table=postgres_table, prepare_threshold=0
        ) as provider:
            await exercise_every_operation(provider, "k")
        return
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        postgres_url,
        kwargs={"autocommit": True, "prepare_threshold": 0},
        min_size=1,
        max_size=1,
        open=False,
    )
    await pool.open()
    try:
        provider = PostgresLeaseProvider(pool, table=postgres_table)
        await exercise_every_operation(provider, "k")  # the first operation creates it
        await provider.aclose()
    finally:
        await pool.close()


async def test_calls_stalled_at_different_moments_each_fail_at_their_own_deadline(
    postgres_url: str, postgres_table: str, app_name: str
) -> None:
    # One timer serves every call of a provider: it must re-arm for each later call.
    timeout_s = 0.5
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        with_query(postgres_url, application_name=app_name),
        kwargs={"autocommit": True},
        min_size=1,
        max_size=4,
        open=False,
    )
    await pool.open()
    async with PostgresLeaseProvider(pool, table=postgres_table, timeout_s=timeout_s) as p:
        assert (await p.acquire_lease("k", "a", LONG_MS)).acquired

        async def stalled_call() -> float:
            started = time.monotonic()
            with pytest.raises(leasekit.LeaseBackendError, match="no answer"):
                await p.renew_lease("k", "a", LONG_MS)
            return time.monotonic() - started

        with admin(postgres_url) as other:
            other.execute("BEGIN")
            other.execute(
                sql.SQL("SELECT * FROM {} WHERE key = 'k' FOR UPDATE").format(
                    identifier(postgres_table)
                )
            )
            first = asyncio.ensure_future(stalled_call())
            await asyncio.sleep(timeout_s / 2)
            second = asyncio.ensure_future(stalled_call())
            # A call that is not stalled answers meanwhile, and frees its slot in time.
            assert (await p.acquire_lease("free", "a", LONG_MS)).acquired
            elapsed = await asyncio.gather(first, second)
            assert all(timeout_s * 0.9 <= s < timeout_s + SLACK_S for s in elapsed), elapsed
            await eventually(
                lambda: backends_of(postgres_url, app_name, waiting=True) == 0,
                "the abandoned statements to be cancelled",
            )
            other.execute("ROLLBACK")
        assert await p.get_lease_owner("k") == "a"
        await exercise_every_operation(p, "after")
    await pool.close()


# -- deadlines, the pool's log, load, closing, secrets ----------------------------------------


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port whose server accepts TCP connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)  # the kernel completes each handshake; nobody ever reads
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def pool_tasks(provider: PostgresLeaseProvider) -> list[str]:
    """The names of the asyncio tasks of the provider's pool (workers, scheduler)."""
    pool = provider.client
    assert isinstance(pool, AsyncConnectionPool)
    return [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith(pool.name)]


async def test_a_server_that_never_answers_fails_async_with_at_the_timeout_and_leaves_nothing(
    silent_port: int,
) -> None:
    # libpq's connect_timeout is 2 s at least: nothing may wait for the attempt to end.
    timeout_s = 1.0
    url = f"postgresql://postgres@127.0.0.1:{silent_port}/postgres?timeout_s={timeout_s}"
    provider = leasekit.connect(url)
    assert isinstance(provider, PostgresLeaseProvider)
    started = time.monotonic()
    with pytest.raises(leasekit.LeaseBackendTimeout, match="no answer within 1 s"):
        async with provider:
            pass
    elapsed = time.monotonic() - started
    assert elapsed < timeout_s + 0.5, elapsed  # before the fix: 2.0 s
    assert provider.closed
    assert pool_tasks(provider) == []
    # An operation without `async with` is bounded the same way, and so is aclose.
    lazy = leasekit.connect(url)
    assert isinstance(lazy, PostgresLeaseProvider)
    with pytest.raises(leasekit.LeaseBackendTimeout):
        await lazy.acquire_lease("k", "a", LONG_MS)
    started = time.monotonic()
    await lazy.aclose()
    assert time.monotonic() - started < timeout_s
    assert pool_tasks(lazy) == []


async def test_a_frozen_server_leaves_no_pool_task_after_aclose(
    private_postgres_server: PostgresServer,
) -> None:
    timeout_s = 0.5
    url = with_query(private_postgres_server.url, pool_min_size="2", timeout_s=str(timeout_s))
    provider = leasekit.connect(url)
    assert isinstance(provider, PostgresLeaseProvider)
    async with provider:
        await provider.acquire_lease("k", "a", LONG_MS)
        private_postgres_server.pause()
        try:
            results = await asyncio.gather(
                *(provider.get_lease_owner(f"k{i}") for i in range(6)), return_exceptions=True
            )
            assert all(isinstance(r, leasekit.LeaseBackendTimeout) for r in results), results
            assert pool_tasks(provider)  # the pool is busy connecting to a frozen server
        finally:
            closing = asyncio.ensure_future(provider.aclose())
            await asyncio.wait((closing,), timeout=SLACK_S)
            private_postgres_server.resume()
        await closing
    assert pool_tasks(provider) == []


async def test_async_with_returns_once_the_pools_min_size_connections_are_open(
    postgres_url: str, postgres_table: str, app_name: str
) -> None:
    """No connection of the pool is still being opened once the provider is open: one
    cut off mid-connect when its event loop ends hung ``asyncio.run()`` in psycopg."""
    url = with_query(postgres_url, pool_min_size="4", application_name=app_name)
    async with PostgresLeaseProvider.from_url(url, table=postgres_table) as provider:
        # The server's count: the direct first connection is closed, the pool's 4 are up.
        assert backends_of(postgres_url, app_name) == 4
        assert pool_tasks(provider)  # the pool's workers, which the loop's end cancels
    lazy = PostgresLeaseProvider.from_url(url, table=postgres_table)
    try:
        await lazy.get_lease_owner("k")  # opened by its first call, not by `async with`
        assert backends_of(postgres_url, app_name) == 4
    finally:
        await lazy.aclose()


async def test_a_pool_that_cannot_fill_in_time_is_a_timeout_and_the_next_call_works(
    postgres_url: str, postgres_table: str
) -> None:
    """Opening waits for ``min_size`` connections within ``timeout_s`` only: past it the
    call is a typed timeout, and the pool, still open, serves the next call."""
    if os.environ.get("LEASEKIT_TEST_POSTGRES_URL"):
        pytest.skip("needs the harness's own server (trust auth, a superuser)")
    role = f"leasekit_few_{uuid.uuid4().hex[:8]}"
    async with PostgresLeaseProvider.from_url(postgres_url, table=postgres_table) as owner:
        await owner.migrate()
    schema = postgres_table.split(".", maxsplit=1)[0]
    with admin(postgres_url) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 2").format(
            sql.Identifier(role)
        ))  # fmt: skip
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(schema), sql.Identifier(role)
        ))  # fmt: skip
        for suffix in ("", "_meta"):
            conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(
                identifier(postgres_table + suffix), sql.Identifier(role)
            ))  # fmt: skip
    try:
        parts = urlsplit(postgres_url)
        app_url = urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))
        url = with_query(app_url, pool_min_size="3", timeout_s="1")
        provider = PostgresLeaseProvider.from_url(url, table=postgres_table)
        try:
            with pytest.raises(leasekit.LeaseBackendTimeout, match="within 1 s"):
                await provider.get_lease_owner("k")  # the third connection is refused
            assert await provider.get_lease_owner("k") is None  # on the two it has
            assert not provider.closed
        finally:
            await provider.aclose()
    finally:
        with admin(postgres_url) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(sql.Identifier(role)))


_RUN_WITHOUT_ACLOSE = """
import asyncio, sys
import leasekit

async def main() -> None:
    provider = leasekit.connect(sys.argv[1])
    await provider.__aenter__()
    assert (await provider.acquire_lease("exit-k", leasekit.new_owner_id(), 60_000)).acquired
    print("used", flush=True)

asyncio.run(main())
print("ended", flush=True)
"""


def test_asyncio_run_ends_promptly_after_a_provider_left_open(
    postgres_url: str, postgres_table: str
) -> None:
    """The loop's end cancels the pool's workers; none is mid-connect, so none hangs it."""
    url = with_query(postgres_url, pool_min_size="8", table=postgres_table)
    done = subprocess.run(
        [sys.executable, "-c", _RUN_WITHOUT_ACLOSE, url],
        capture_output=True,
        text=True,
        timeout=60,  # the hang was 300 s (psycopg_pool's reconnect_timeout)
        check=False,
    )
    assert done.stdout.split() == ["used", "ended"], (done.stdout, done.stderr)


async def test_nothing_listening_logs_nothing_at_warning_from_psycopg_pool(
    private_postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    caplog.set_level(logging.DEBUG, logger="leasekit.postgres")
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres?timeout_s=2"
    with pytest.raises(leasekit.LeaseBackendUnreachable):
        async with leasekit.connect(url):
            pass
    # A server that goes away under an open pool: psycopg_pool discards the broken
    # connections and retries connecting, and says so, but to leasekit's logger only.
    server = private_postgres_server
    async with leasekit.connect(with_query(server.url, timeout_s="1", pool_min_size="2")) as p:
        await p.acquire_lease("k", "a", LONG_MS)
        server.kill()
        with pytest.raises(leasekit.LeaseBackendError):
            await p.acquire_lease("k", "a", LONG_MS)
        await eventually(
            lambda: any("error connecting" in r.getMessage() for r in caplog.records),
            "the pool to try connecting again",
        )
    pool_records = [r for r in caplog.records if r.name.startswith("psycopg")]
    assert [r.getMessage() for r in pool_records if r.levelno >= logging.WARNING] == []
    routed = [
        r
        for r in caplog.records
        if r.name == "leasekit.postgres" and r.getMessage().startswith("psycopg_pool: ")
    ]
    assert routed
    assert all(r.levelno == logging.DEBUG for r in routed)


@pytest.mark.parametrize("seconds", [2, pytest.param(10, marks=pytest.mark.slow)])
async def test_500_concurrent_tasks_wait_for_a_pooled_connection_without_errors(
    postgres_url: str, postgres_table: str, seconds: float
) -> None:
    # The default pool has 10 connections; the other tasks queue for one within timeout_s.
    errors: list[BaseException] = []
    async with leasekit.connect(postgres_url, table=postgres_table) as provider:
        assert isinstance(provider.client, AsyncConnectionPool)
        assert provider.client.max_size == 10
        stop = time.monotonic() + seconds

        async def worker(i: int) -> None:
            key, owner = f"k{i}", f"o{i}"
            while True:  # at least one cycle each, however late the task starts
                try:
                    assert (await provider.acquire_lease(key, owner, LONG_MS)).acquired
                    assert await provider.renew_lease(key, owner, LONG_MS)
                    await provider.release_lease(key, owner)
                    finished.add(i)
                except leasekit.LeaseError as exc:
                    errors.append(exc)
                if time.monotonic() >= stop:
                    return

        finished: set[int] = set()
        await asyncio.gather(*(worker(i) for i in range(500)))
    assert errors == []
    # Every task got a connection in its turn (none starved, none failed).
    assert finished == set(range(500))


async def test_aclose_with_operations_in_flight_settles_them_and_leaves_no_connection(
    postgres_url: str, postgres_table: str, app_name: str
) -> None:
    before = backends_of(postgres_url, app_name)
    url = with_query(postgres_url, application_name=app_name, pool_max_size="20")
    provider = leasekit.connect(url, table=postgres_table)
    outcomes: list[object] = []

    async def busy(i: int) -> None:
        while True:
            try:
                await provider.acquire_lease(f"k{i}", "a", LONG_MS)
                await provider.release_lease(f"k{i}", "a")
            except leasekit.LeaseProviderClosed as exc:  # noqa: PERF203 (the way out)
                outcomes.append(exc)
                return

    async with provider:
        tasks = [asyncio.ensure_future(busy(i)) for i in range(60)]
        await eventually(lambda: backends_of(postgres_url, app_name) >= 5, "busy connections")
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results == [None] * 60  # no CancelledError, no other error
    assert len(outcomes) == 60
    # Every connection was closed by aclose(); the server's backend processes exit a
    # moment after their client hangs up, so pg_stat_activity catches up shortly.
    await eventually(lambda: backends_of(postgres_url, app_name) == before, "connections closed")


async def test_booleans_are_read_one_way_and_keywords_must_be_bools() -> None:
    for text, value in (("on", True), ("OFF", False), ("yes", True), ("0", False)):
        provider = leasekit.connect(f"postgresql://h/db?create_schema={text}")
        assert isinstance(provider, PostgresLeaseProvider)
        assert provider.create_schema is value
        await provider.aclose()
    with pytest.raises(leasekit.InvalidLeaseArgument, match="server_timeout"):
        leasekit.connect("postgresql://h/db?server_timeout=maybe")
    with pytest.raises(leasekit.InvalidLeaseArgument, match="create_schema"):
        leasekit.connect("postgresql://h/db", create_schema="off")


async def test_no_message_or_repr_shows_the_password(
    private_postgres_server: PostgresServer,
) -> None:
    server = private_postgres_server
    secret = "s3cret-Pa55"
    refused = f"postgresql://app:{secret}@127.0.0.1:{free_port()}/postgres"
    for url, options in (
        (f"{refused}?colour=blue", {}),
        (f"{refused}?timeout_s=soon", {}),
        (refused, {"colour": "blue"}),
        (f"postgresql://app:{secret}@h:notaport/db", {}),
        (f"mysql://app:{secret}@h/db", {}),
    ):
        with pytest.raises(leasekit.InvalidLeaseArgument) as info:
            PostgresLeaseProvider.from_url(url, **options)
        assert secret not in str(info.value)
    provider = PostgresLeaseProvider.from_url(refused)
    assert secret not in repr(provider)
    with pytest.raises(leasekit.LeaseBackendUnreachable) as refusal:
        await provider.acquire_lease("k", "a", LONG_MS)
    assert secret not in str(refusal.value)
    assert secret not in repr(provider)

    # A wrong password, against a server that checks passwords for this role.
    assert server.data_dir is not None
    hba = server.data_dir / "pg_hba.conf"
    hba.write_text("host all app 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    with admin(server.url) as conn:
        conn.execute("CREATE ROLE app LOGIN PASSWORD 'right-one'")
        conn.execute("GRANT CREATE ON SCHEMA public TO app")
        conn.execute("SELECT pg_reload_conf()")
    parts = urlsplit(server.url)
    wrong = urlunsplit(parts._replace(netloc=f"app:{secret}@{parts.hostname}:{parts.port}"))
    provider = PostgresLeaseProvider.from_url(wrong, timeout_s=5)
    with pytest.raises(leasekit.LeaseBackendUnreachable, match="password") as auth:
        async with provider:
            pass
    assert secret not in str(auth.value)
    assert secret not in repr(provider)
    right = urlunsplit(parts._replace(netloc=f"app:right-one@{parts.hostname}:{parts.port}"))
    async with PostgresLeaseProvider.from_url(right) as ok:
        assert "right-one" not in repr(ok)


async def test_notifications_off_for_pgbouncer_still_waits_and_sends_no_notify(
    postgres_url: str, postgres_table: str
) -> None:
    """``notifications=false``: no LISTEN, plain statements, waiters poll and still win."""
    url = with_query(postgres_url, notifications="false")
    async with leasekit.connect(url, table=postgres_table) as provider:
        assert not provider.capabilities.release_notifications
        assert type(provider).capabilities.release_notifications  # the class still can
        await provider.acquire_lease("k", "alice", LONG_MS)
        waiter = asyncio.ensure_future(
            leasekit.wait_for(provider, "k", "bob", LONG_MS, 30.0, poll_s=0.01, max_poll_s=0.05)
        )
        await asyncio.sleep(0.05)
        await provider.release_lease("k", "alice")
        assert (await asyncio.wait_for(waiter, 30)).owner == "bob"
        assert provider._listener._conn is None  # never listened
        # Its release sends no NOTIFY: a listener's first notifications are the grant
        # and the release that a provider with notifications made after it (delivered
        # in commit order).
        async with leasekit.connect(postgres_url, table=postgres_table) as notifying:
            channel = notifying._channel
            assert channel is not None
            async with await psycopg.AsyncConnection.connect(
                postgres_url, autocommit=True
            ) as listening:
                await listening.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                await provider.release_lease("k", "bob")
                await notifying.acquire_lease("m", "carol", LONG_MS)
                await notifying.release_lease("m", "carol")
                first = [n.payload async for n in listening.notifies(timeout=30, stop_after=2)]
                assert [decode_payload(payload) for payload in first] == [
                    ("m", True),
                    ("m", False),
                ]


async def test_the_acquire_statement_hints_a_grant_only_when_the_key_changes_hands(
    postgres_url: str, postgres_table: str
) -> None:
    """Grant hints ride on the acquire statement: a fresh grant and a takeover send one;
    the holder's re-acquire, a renewal, a transfer to oneself and a denial send none.

    Notifications arrive in commit order, so the sequence heard is exact: a hint sent
    where none belongs would show up in it before the next one expected."""
    async with leasekit.connect(postgres_url, table=postgres_table) as leases:
        channel = leases._channel
        assert channel is not None
        assert leases.capabilities.grant_notifications
        async with await psycopg.AsyncConnection.connect(
            postgres_url, autocommit=True
        ) as listening:
            await listening.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            assert (await leases.acquire_lease("k", "alice", LONG_MS)).acquired  # grant
            assert (await leases.acquire_lease("k", "alice", LONG_MS, metadata="m")).acquired
            assert await leases.renew_lease("k", "alice", LONG_MS)
            assert await leases.transfer_lease("k", "alice", "alice", LONG_MS)
            assert not (await leases.acquire_lease("k", "carol", LONG_MS)).acquired
            assert await leases.transfer_lease("k", "alice", "bob", LONG_MS)  # release hint
            await leases.release_lease("k", "bob")  # release hint
            assert (await leases.acquire_lease("k", "dave", 1)).acquired  # grant
            for _ in range(2000):  # denied until dave's millisecond is over: no hints
                if (await leases.acquire_lease("k", "erin", LONG_MS)).acquired:  # takeover
                    break
                await asyncio.sleep(0.005)
            await leases.release_lease("k", "erin")  # release hint
            with leasekit.sync.connect(postgres_url, table=postgres_table) as blocking:
                assert blocking.acquire_lease("s", "frank", LONG_MS).acquired  # grant
                assert blocking.acquire_lease("s", "frank", LONG_MS).acquired
                blocking.release_lease("s", "frank")  # release hint
            heard = [n.payload async for n in listening.notifies(timeout=30, stop_after=8)]
    assert [decode_payload(payload) for payload in heard] == [
        ("k", True),
        ("k", False),
        ("k", False),
        ("k", True),
        ("k", True),
        ("k", False),
        ("s", True),
        ("s", False),
    ]


async def test_a_watcher_of_grants_sees_a_blocking_providers_grant(
    postgres_url: str, postgres_table: str
) -> None:
    async with leasekit.connect(postgres_url, table=postgres_table) as leases:
        watch = await leases.watch_release("k", grants=True)
        release_only = await leases.watch_release("k")
        try:
            with leasekit.sync.connect(postgres_url, table=postgres_table) as blocking:
                assert blocking.acquire_lease("k", "alice", LONG_MS, metadata=b"a").acquired
            assert await watch.wait(30.0)
            assert not await release_only.wait(0)  # sent with the grant hint, if at all
        finally:
            watch.close()
            release_only.close()


def test_a_blocking_release_abandoned_at_the_timeout_never_ends_a_lease_granted_after_it(
    private_postgres_server: PostgresServer,
) -> None:
    # The blocking twin of the test above. leasekit.sync's provider breaks the
    # connection at the deadline, so it never learns whether (or when) the frozen server
    # process runs the release; the next call on the key ends that process first, and
    # is not sent (a timeout) while the process is still there.
    server = private_postgres_server
    url = with_query(server.url, pool_min_size="2", pool_max_size="2", timeout_s="0.5")
    with leasekit.sync.connect(url) as leases:
        native = leases._native
        assert native is not None
        pool = native.client  # type: ignore[attr-defined]
        assert leases.acquire_lease("k", "x", LONG_MS).acquired
        with pool.connection() as held, pool.connection() as idle:
            frozen_pid = idle.execute("SELECT pg_backend_pid()").fetchone()[0]
            assert held.info.backend_pid != frozen_pid
        # Both back in the pool, the frozen one first in line: the release takes it.
        os.kill(frozen_pid, signal.SIGSTOP)
        believed = False
        try:
            with pytest.raises(leasekit.LeaseBackendTimeout):
                leases.release_lease("k", "x")
            try:
                again = leases.acquire_lease("k", "x", LONG_MS)
                believed = again.acquired and leases.renew_lease("k", "x", LONG_MS)
            except leasekit.LeaseBackendTimeout:
                pass  # the frozen process did not end in time: nothing was sent
        finally:
            os.kill(frozen_pid, signal.SIGCONT)
        if not believed:
            believed = leases.acquire_lease("k", "x", LONG_MS).acquired
            believed = believed and leases.renew_lease("k", "x", LONG_MS)
        assert believed

        def frozen_process_gone() -> bool:
            with admin(server.url) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (frozen_pid,)
                ).fetchone()
            return row is not None and row[0] == 0

        deadline = time.monotonic() + 10
        while not frozen_process_gone():  # then no stale statement of it can still run
            assert time.monotonic() < deadline, "the frozen server process never ended"
            time.sleep(0.02)
        assert leases.get_lease_owner("k") == "x"
        rival = leases.acquire_lease("k", "y", LONG_MS)
        assert (rival.acquired, rival.owner) == (False, "x")


async def test_a_version_3_table_gains_slots_and_the_line_on_first_use(
    postgres_url: str, postgres_table: str
) -> None:
    # Schema version 4 adds the slot tables and the line beside an existing table.
    create_version_2_table(postgres_url, postgres_table)
    with admin(postgres_url) as conn:
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN metadata bytea").format(identifier(postgres_table))
        )
        conn.execute(
            sql.SQL("UPDATE {} SET value = 3").format(identifier(f"{postgres_table}_meta"))
        )
    async with PostgresLeaseProvider.from_url(postgres_url, table=postgres_table) as provider:
        old = await provider.get_lease_record("old")
        assert old is not None
        assert (old.owner, old.token) == ("before", 7)
        first = await provider.acquire_slot("s", "a", LONG_MS, limit=2)
        second = await provider.acquire_slot("s", "b", LONG_MS, limit=2)
        assert (first.acquired, second.acquired) == (True, True)
        assert (second.token or 0) > (first.token or 0) > 0
        denied = await provider.acquire_slot("s", "c", LONG_MS, limit=2)
        assert (denied.acquired, denied.held, denied.holders) == (False, 2, ("a", "b"))
        assert (
            await provider.acquire_lease_in_turn("old", "c", LONG_MS, place_ttl_ms=LONG_MS)
        ) == (leasekit.LeaseResult(False, "before", None, None))
    with admin(postgres_url) as conn:
        version = conn.execute(
            sql.SQL("SELECT value FROM {}").format(identifier(f"{postgres_table}_meta"))
        ).fetchone()
    assert version == (SCHEMA_VERSION,)
