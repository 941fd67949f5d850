"""PostgreSQL: the raw psycopg floor and tooz's driver for ``leasekit bench postgresql://``.

Imported only when a ``postgresql://`` or ``postgres://`` URL is benchmarked. The floor
is leasekit's own statements run by hand: the backend's acquire and release, rendered
for a table of the floor's own, executed on psycopg's asyncio pool of autocommit
connections configured like leasekit's (the URL's ``pool_min_size``, ``pool_max_size``
and ``prepare_threshold`` apply to both; by default 1 to 10 connections and no
prepared statements). Same server work, same round trips; what the ratio measures is
everything leasekit adds on the client: validation, timeouts, error translation, the
provider's bookkeeping. The table is dropped at the end.

The peer is tooz's PostgreSQL driver (``pip install tooz psycopg2-binary``), used the
way its documentation shows: a lock object per acquisition. Each lock opens a
connection of its own for a session-level advisory lock and closes it on release or
denial, so every tooz cycle connects to the server again.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ._core import AsyncCycler, BenchTarget, Contender, SchemeBench, SyncCycler

if TYPE_CHECKING:
    from psycopg import sql
    from psycopg_pool import AsyncConnectionPool

__all__ = ["BENCH"]

# leasekit's own URL options; libpq would reject them.
_LEASEKIT_OPTIONS = frozenset(
    {
        "table",
        "timeout_s",
        "create_schema",
        "sweep_every",
        "sweep_batch",
        "sweep_grace_s",
        "pool_min_size",
        "pool_max_size",
        "prepare_threshold",
        "server_timeout",
    }
)
# leasekit's defaults for its pool and table, which the floor and the cleanup follow.
_POOL_MIN_SIZE = 1
_POOL_MAX_SIZE = 10
_LEASEKIT_TABLE = "leasekit_leases"


def _options(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without leasekit's options in its query (for libpq), and those options."""
    parts = urlsplit(url)
    ours: dict[str, str] = {}
    driver: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in _LEASEKIT_OPTIONS:
            ours[name] = value
        else:
            driver.append((name, value))
    return urlunsplit(parts._replace(query=urlencode(driver))), ours


def _prepare_threshold(options: dict[str, str]) -> int | None:
    # leasekit's default, None, never prepares: what pgbouncer's transaction mode needs.
    value = options.get("prepare_threshold", "none")
    return None if value.lower() in ("none", "") else int(value)


def _table(name: str) -> sql.Identifier:
    from psycopg import sql  # noqa: PLC0415 (drivers load only when benchmarked)

    return sql.Identifier(*name.split("."))


def _floor_table(target: BenchTarget, options: dict[str, str]) -> tuple[str | None, str]:
    """The floor's table (schema, name): named after the run, beside leasekit's table."""
    schema, _, _ = options.get("table", "").rpartition(".")
    return schema or None, f"{target.namespace.replace('-', '_')}_floor"


# -- the floor: leasekit's acquire and release, by hand, on psycopg's async pool ----------


class _RawCycler:
    def __init__(
        self, pool: AsyncConnectionPool[Any], acquire: bytes, release: bytes, ttl_ms: int
    ) -> None:
        self._pool = pool
        self._acquire = acquire
        self._release = release
        self._ttl_ms = ttl_ms

    async def cycle(self, key: str, owner: str) -> bool:
        params = {"key": key.encode(), "owner": owner.encode(), "ttl_ms": self._ttl_ms}
        # A connection per statement, as for leasekit: a lease's acquire and release
        # are separate calls, with the caller's work (and no connection held) between.
        async with self._pool.connection() as conn:
            cursor = await conn.execute(self._acquire, params)
            row = await cursor.fetchone()
        if row is None or row[0] is None:
            return False
        async with self._pool.connection() as conn:
            await conn.execute(self._release, params)
        return True

    async def aclose(self) -> None:
        await self._pool.close()


async def _open_raw(target: BenchTarget) -> AsyncCycler:
    from leasekit_postgres._sql import (  # noqa: PLC0415 (the backend's own statements)
        Statements,
        TableName,
    )
    from psycopg_pool import AsyncConnectionPool  # noqa: PLC0415

    url, options = _options(target.url)
    statements = Statements(TableName(*_floor_table(target, options)))
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        url,
        kwargs={"autocommit": True, "prepare_threshold": _prepare_threshold(options)},
        min_size=int(options.get("pool_min_size", _POOL_MIN_SIZE)),
        max_size=int(options.get("pool_max_size", _POOL_MAX_SIZE)),
        name="leasekit-bench-floor",
        open=False,
    )
    try:
        await pool.open(wait=True)
        async with pool.connection() as conn:
            await conn.execute(statements.migrate, prepare=False)
    except BaseException:
        await pool.close()
        raise
    return _RawCycler(pool, statements.acquire, statements.release, target.ttl_ms)


# -- tooz -----------------------------------------------------------------------------------


class _ToozCycler:
    def __init__(self, coordinator: Any) -> None:
        self._coordinator = coordinator

    def cycle(self, key: str, owner: str) -> bool:
        lock = self._coordinator.get_lock(key.encode())
        if not lock.acquire(blocking=False):
            return False
        lock.release()
        return True

    def close(self) -> None:
        self._coordinator.stop()


def _open_tooz(target: BenchTarget) -> SyncCycler:
    from tooz import coordination  # noqa: PLC0415

    # tooz reads host, port, user, password and the database from the URL, nothing else.
    parts = urlsplit(target.url)
    url = urlunsplit(("postgresql", parts.netloc, parts.path, "", ""))
    with warnings.catch_warnings():
        # "PostgreSQL driver is deprecated": true, and not the reader's concern here.
        warnings.simplefilter("ignore", DeprecationWarning)
        coordinator = coordination.get_coordinator(url, target.namespace.encode())
    coordinator.start(start_heart=False)
    return _ToozCycler(coordinator)


# -- around the run -------------------------------------------------------------------------


async def _cleanup(target: BenchTarget) -> None:
    """Delete leasekit's rows for the run's keys (tombstones) and the floor's tables."""
    import psycopg  # noqa: PLC0415
    from leasekit_postgres._sql import TableName  # noqa: PLC0415
    from psycopg import sql  # noqa: PLC0415

    url, options = _options(target.url)
    leases = _table(options.get("table", _LEASEKIT_TABLE))
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DELETE FROM {} WHERE position(%s IN key) > 0").format(leases),
            (target.namespace.encode(),),
        )
        floor = TableName(*_floor_table(target, options))
        await conn.execute(
            sql.SQL("DROP TABLE IF EXISTS {}, {}; DROP SEQUENCE IF EXISTS {}").format(
                floor.table, floor.meta, floor.sequence
            )
        )


async def _describe_server(target: BenchTarget) -> str | None:
    import psycopg  # noqa: PLC0415

    url, _ = _options(target.url)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        version = conn.info.parameter_status("server_version")
    return f"PostgreSQL {version.split()[0]}" if version else None


BENCH = SchemeBench(
    contenders=(
        Contender(
            "postgres-raw",
            "psycopg raw",
            "floor",
            open_async=_open_raw,
            requires=("psycopg", "psycopg_pool"),
            install="pip install 'leasekit[postgres]'",
            how="psycopg AsyncConnectionPool, autocommit: leasekit's own acquire and "
            "release statements, executed by hand",
        ),
        Contender(
            "tooz",
            "tooz postgresql (sync)",
            "peer",
            open_sync=_open_tooz,
            requires=("tooz", "psycopg2"),
            install="pip install tooz psycopg2-binary",
            how="tooz coordinator (postgresql driver) get_lock(key): acquire(blocking=False), "
            "release; a new connection and pg_try_advisory_lock per acquire",
        ),
    ),
    cleanup=_cleanup,
    describe_server=_describe_server,
)
