"""Shared fixtures for leasekit's own tests."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from servers import PostgresServer, RedisClusterServer, RedisServer, missing_server

# gRPC (the etcd driver) runs fork handlers in every child forked while it is active,
# the harness's fork-then-exec of a server that drops root included (user= rules out
# vfork): one such child crashed (SIGSEGV) before its exec, failing a MariaDB start.
# No test forks a child that uses gRPC (tests needing processes spawn them; a forked
# child's etcd provider refuses before any gRPC call), so the handlers are left off.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# The conformance suite's checks that start OS processes (spawn, one interpreter each,
# several rounds): over 5 s on most backends. The suite itself carries no marks, since
# a third party's --strict-markers would refuse an unregistered one, so they are
# marked here.
PROCESS_CHECKS = frozenset(
    {
        "test_racing_processes_get_exactly_one_winner_per_round",
        "test_churning_processes_never_overlap_as_holders",
    }
)


# The suite's cancellation checks run 60 cancels and 300: the 300 are marked here.
MANY_CANCELS = 300

SLOW_TEST_TIMEOUT_S = 900
"""The bound of a test marked slow; every other test has pyproject's ``timeout`` (300 s)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        if item.originalname in PROCESS_CHECKS:
            item.add_marker(pytest.mark.slow)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("cancels") == MANY_CANCELS:
            item.add_marker(pytest.mark.slow)
        # pytest-timeout reads the closest timeout mark: a test's own comes first.
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))


# -- how long each shared fixture takes to tear down -------------------------------------
#
# A worker's session teardown is reported by xdist on the last test it ran. With
# LEASEKIT_TEST_TEARDOWN_LOG=path, each session-, package- or module-scoped fixture's
# teardown time is appended to that file (one line each, "seconds scope name"), so the
# time can be put where it belongs.

_TEARDOWN_LOG = os.environ.get("LEASEKIT_TEST_TEARDOWN_LOG", "")


class _TeardownTimes:
    """Registered as a plugin: the session's own hooks do not see this conftest's."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.started: dict[int, float] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any) -> Any:
        result = yield
        if fixturedef.scope != "function":
            # Registered after the fixture's own teardown, so it runs just before it.
            key = id(fixturedef)
            fixturedef.addfinalizer(lambda: self.started.__setitem__(key, time.monotonic()))
        return result

    def pytest_fixture_post_finalizer(self, fixturedef: Any) -> None:
        started = self.started.pop(id(fixturedef), None)
        if started is not None:
            with open(self.path, "a", encoding="utf-8") as log:
                elapsed = time.monotonic() - started
                log.write(f"{elapsed:.2f} {fixturedef.scope} {fixturedef.argname}\n")


def pytest_configure(config: pytest.Config) -> None:
    if _TEARDOWN_LOG:
        config.pluginmanager.register(_TeardownTimes(_TEARDOWN_LOG), "leasekit-teardown-times")


# -- gRPC events of event loops that are already closed -------------------------------------
#
# grpc.aio has one poller per process, bound to the event loop that first started gRPC;
# it hands each completion to the loop of the call it belongs to with
# call_soon_threadsafe. When that call's loop has closed (an earlier test's, or a
# leasekit.sync loop thread's), the handover raises "Event loop is closed" inside the
# poller's callback, and that is reported to the poller's loop: whatever test runs gRPC
# next fails at a random place, for an event of a loop it never saw. Such a report says
# nothing about the test it lands in, so on the tests' own anyio loops it is recorded
# (and listed at the end of the run) instead of failing that test. leasekit's own part,
# that a provider's close leaves nothing behind, is checked where it can be attributed:
# test_a_call_cut_off_at_close_leaves_nothing_for_the_next_event_loop runs its own
# loops with their own exception handler, which this does not touch.

LATE_GRPC_EVENTS: list[str] = []
_call_exception_handler = asyncio.BaseEventLoop.call_exception_handler


def _late_grpc_event(context: dict[str, Any]) -> bool:
    exc = context.get("exception")
    return (
        isinstance(exc, RuntimeError)
        and str(exc) == "Event loop is closed"
        and "PollerCompletionQueue._handle_events" in repr(context.get("handle"))
    )


def _on_anyio_test_loop(loop: asyncio.AbstractEventLoop) -> bool:
    handler = loop.get_exception_handler()
    return type(getattr(handler, "__self__", None)).__module__.startswith("anyio.")


def _call_exception_handler_of_test_loops(
    self: asyncio.BaseEventLoop, context: dict[str, Any]
) -> None:
    if _late_grpc_event(context) and _on_anyio_test_loop(self):
        LATE_GRPC_EVENTS.append(os.environ.get("PYTEST_CURRENT_TEST", "?"))
        return
    _call_exception_handler(self, context)


asyncio.BaseEventLoop.call_exception_handler = _call_exception_handler_of_test_loops  # type: ignore[method-assign]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if LATE_GRPC_EVENTS:
        terminalreporter.write_line(
            f"gRPC events of closed event loops, recorded on the test loop: "
            f"{len(LATE_GRPC_EVENTS)} (during {', '.join(sorted(set(LATE_GRPC_EVENTS)))})"
        )


@pytest.fixture
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio, the loop every backend targets."""
    return "asyncio"


# -- real servers (tests/servers.py) ------------------------------------------------------
#
# Fixtures are session-scoped where a server can be shared, function-scoped where a test
# injects faults. A missing server binary skips the tests that need it, naming the install
# command, or fails them when LEASEKIT_REQUIRE_SERVERS=1 (CI).

REDIS_URL_ENV = "LEASEKIT_TEST_REDIS_URL"

RUN_ID = uuid.uuid4().hex[:10]
"""Unique to this test run: key prefixes on a shared server never collide across runs."""


def _redis_binary() -> str:
    binary = RedisServer.find()
    if binary is None:
        missing_server("redis-server is not installed", RedisServer.install_hint)
    return binary


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """This run's own redis-server (loopback, free port, no persistence), shared by tests.

    Do not inject faults here; take ``private_redis_server`` for that.
    """
    with RedisServer(_redis_binary(), tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A Redis URL to test against: ``$LEASEKIT_TEST_REDIS_URL``, else ``redis_server``'s.

    On a server given by URL, keys this run left under its prefixes are deleted at the end.
    """
    url = os.environ.get(REDIS_URL_ENV, "").strip()
    if not url:
        server: RedisServer = request.getfixturevalue("redis_server")
        yield server.url
        return
    yield url
    _delete_run_keys(url)


def _delete_run_keys(url: str) -> None:
    import redis  # noqa: PLC0415 (only tests that use a given server need the driver)

    with redis.Redis.from_url(url) as client:
        names = list(client.scan_iter(match=f"leasekit-test-{RUN_ID}-*", count=1000))
        for start in range(0, len(names), 500):
            client.unlink(*names[start : start + 500])


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix no other test (in this run or any other) uses."""
    return f"leasekit-test-{RUN_ID}-{uuid.uuid4().hex[:8]}:"


@pytest.fixture
def private_redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server for this test alone: pause, kill or restart it freely."""
    with RedisServer(_redis_binary(), tmp_path / "redis") as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServer]:
    """A three-primary Redis Cluster on loopback ports (about two seconds to settle)."""
    with RedisClusterServer(_redis_binary(), tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster


# -- etcd -----------------------------------------------------------------------------------

from servers import EtcdCluster, EtcdServer  # noqa: E402 (the etcd section is one appended unit)

ETCD_URL_ENV = "LEASEKIT_TEST_ETCD_URL"


def _etcd_binary() -> str:
    binary = EtcdServer.find()
    if binary is None:
        missing_server("etcd is not installed", EtcdServer.install_hint)
    return binary


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """This run's own single-member etcd (loopback, free ports, temp data dir), shared.

    Do not inject faults here; take ``private_etcd_server`` for that.
    """
    with EtcdServer(_etcd_binary(), tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture(scope="session")
def etcd_url(request: pytest.FixtureRequest) -> str:
    """An etcd URL to test against: ``$LEASEKIT_TEST_ETCD_URL``, else ``etcd_server``'s.

    Nothing to clean up on a given server: every key the backend writes is bound to an
    etcd lease, so what a run leaves behind is gone when the tests' TTLs (a minute at
    most) run out.
    """
    url = os.environ.get(ETCD_URL_ENV, "").strip()
    if url:
        return url
    server: EtcdServer = request.getfixturevalue("etcd_server")
    return server.url


@pytest.fixture
def etcd_prefix() -> str:
    """A key prefix no other test (in this run or any other) uses."""
    return f"leasekit-test-{RUN_ID}-{uuid.uuid4().hex[:8]}/"


@pytest.fixture
def wide_reuse_window(monkeypatch: pytest.MonkeyPatch) -> int:
    """Grant reusable etcd leases 30 s beyond their TTL instead of 1 s, so that an idle
    one stays bindable for the whole test however slow a loaded machine is (the 1 s
    window itself is tested against the server's own count)."""
    from leasekit_etcd import _pool  # noqa: PLC0415

    monkeypatch.setattr(_pool, "REUSE_EXTRA_S", 30)
    return 30


@pytest.fixture
def private_etcd_server(tmp_path: Path) -> Iterator[EtcdServer]:
    """A single-member etcd for this test alone: pause, kill or restart it freely."""
    with EtcdServer(_etcd_binary(), tmp_path / "etcd") as server:
        yield server


@pytest.fixture(scope="session")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """A three-member etcd cluster on loopback ports, shared: inject no faults here."""
    with EtcdCluster(_etcd_binary(), tmp_path_factory.mktemp("etcd-cluster")) as cluster:
        yield cluster


@pytest.fixture
def private_etcd_cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    """A three-member etcd cluster for this test alone: kill, pause, restart members."""
    with EtcdCluster(_etcd_binary(), tmp_path / "etcd-cluster") as cluster:
        yield cluster


# -- PostgreSQL -----------------------------------------------------------------------------

POSTGRES_URL_ENV = "LEASEKIT_TEST_POSTGRES_URL"

# _SHARED_ONLY: a schema or database of the run's own is dropped at the end only on a
# server given by URL. The run's own servers are stopped and their data directories
# deleted anyway, and dropping first was each worker's slowest teardown: MariaDB's
# DROP DATABASE of a run's tables took 14-33 s, PostgreSQL's DROP SCHEMA 2-6 s
# (LEASEKIT_TEST_TEARDOWN_LOG, 2026-12-03).


def _postgres_binary() -> str:
    binary = PostgresServer.find()
    if binary is None:
        missing_server("PostgreSQL is not installed", PostgresServer.install_hint)
    return binary


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """This run's own PostgreSQL (initdb'd now, loopback, free port, fsync off), shared.

    Do not inject faults here; take ``private_postgres_server`` for that.
    """
    with PostgresServer(_postgres_binary(), tmp_path_factory.mktemp("postgres")) as server:
        yield server


@pytest.fixture(scope="session")
def postgres_url(request: pytest.FixtureRequest) -> str:
    """A PostgreSQL URL: ``$LEASEKIT_TEST_POSTGRES_URL``, else ``postgres_server``'s.

    Never the machine's own server on 5432 unless that variable names it.
    """
    url = os.environ.get(POSTGRES_URL_ENV, "").strip()
    if url:
        return url
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.url


@pytest.fixture(scope="session")
def postgres_schema(postgres_url: str) -> Iterator[str]:
    """A schema of this run's own on ``postgres_url``, dropped with its contents at the end.

    So a run against a shared server (``$LEASEKIT_TEST_POSTGRES_URL``) leaves nothing
    behind and never meets another run's tables.
    """
    import psycopg  # noqa: PLC0415 (only tests that use PostgreSQL need the driver)
    from psycopg import sql  # noqa: PLC0415

    schema = f"leasekit_test_{RUN_ID}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    yield schema
    if not os.environ.get(POSTGRES_URL_ENV, "").strip():
        return  # the run's own server: thrown away whole, data and all (see _SHARED_ONLY)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def postgres_table(postgres_schema: str) -> str:
    """A lease table name (``schema.table``) no other test uses; created on first use."""
    return f"{postgres_schema}.leases_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def private_postgres_server(tmp_path: Path) -> Iterator[PostgresServer]:
    """A PostgreSQL server for this test alone: pause, kill or restart it freely."""
    with PostgresServer(_postgres_binary(), tmp_path / "postgres") as server:
        yield server


# -- MySQL / MariaDB ------------------------------------------------------------------------

from servers import MariaDBServer  # noqa: E402 (the MariaDB section is one appended unit)

MYSQL_URL_ENV = "LEASEKIT_TEST_MYSQL_URL"


def _mariadb_binary() -> str:
    binary = MariaDBServer.find()
    if binary is None:
        missing_server("MariaDB is not installed", MariaDBServer.install_hint)
    return binary


@pytest.fixture(scope="session")
def mariadb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    """This run's own mariadbd (fresh data dir, loopback, free port), shared.

    Do not inject faults here; take ``private_mariadb_server`` for that.
    """
    with MariaDBServer(_mariadb_binary(), tmp_path_factory.mktemp("mariadb")) as server:
        yield server


@pytest.fixture(scope="session")
def mysql_url(request: pytest.FixtureRequest) -> str:
    """A MySQL/MariaDB URL: ``$LEASEKIT_TEST_MYSQL_URL``, else ``mariadb_server``'s.

    Never the machine's own server on 3306 unless that variable names it.
    """
    url = os.environ.get(MYSQL_URL_ENV, "").strip()
    if url:
        return url
    server: MariaDBServer = request.getfixturevalue("mariadb_server")
    return server.url


def mysql_admin(url: str, *statements: str) -> list[tuple[object, ...]]:
    """Run ``statements`` on a connection of the test's own; the last one's rows."""
    import asyncio  # noqa: PLC0415

    import asyncmy  # noqa: PLC0415 (only tests that use MySQL need the driver)

    from leasekit.backend import parse_url  # noqa: PLC0415

    parsed = parse_url(url, schemes=("mysql", "mariadb"), default_port=3306)
    endpoint = parsed.endpoints[0]

    async def run() -> list[tuple[object, ...]]:
        conn = await asyncmy.connect(
            host=endpoint.host,
            port=endpoint.port or 3306,
            user=parsed.username or "root",
            password=parsed.password or "",
            autocommit=True,
        )
        try:
            rows: list[tuple[object, ...]] = []
            async with conn.cursor() as cursor:
                for statement in statements:
                    await cursor.execute(statement)
                    rows = list(await cursor.fetchall() or ())
            return rows
        finally:
            await conn.ensure_closed()

    return asyncio.run(run())


@pytest.fixture(scope="session")
def mysql_database(mysql_url: str) -> Iterator[str]:
    """A database of this run's own on ``mysql_url``, dropped with its tables at the end.

    So a run against a shared server (``$LEASEKIT_TEST_MYSQL_URL``) leaves nothing
    behind and never meets another run's tables.
    """
    database = f"leasekit_test_{RUN_ID}"
    mysql_admin(mysql_url, f"CREATE DATABASE `{database}`")
    yield database
    if not os.environ.get(MYSQL_URL_ENV, "").strip():
        return  # the run's own server: thrown away whole, data and all (see _SHARED_ONLY)
    mysql_admin(mysql_url, f"DROP DATABASE IF EXISTS `{database}`")


@pytest.fixture
def mysql_table(mysql_database: str) -> str:
    """A lease table name (``database.table``) no other test uses; created on first use."""
    return f"{mysql_database}.leases_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def private_mariadb_server(tmp_path: Path) -> Iterator[MariaDBServer]:
    """A mariadbd for this test alone: pause, kill or restart it freely."""
    with MariaDBServer(_mariadb_binary(), tmp_path / "mariadb") as server:
        yield server
