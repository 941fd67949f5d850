"""PostgreSQL: the raw psycopg floor and tooz's driver for ``leasekit bench postgresql://``.

Registered in the ``leasekit.bench`` entry-point group for ``postgresql`` and
``postgres``, and imported only when such a URL is benchmarked. The floor is
leasekit's own statements run by hand: the backend's acquire and release, rendered
for a table of the floor's own, executed on psycopg's asyncio pool of autocommit
connections built from the provider's own parse of the URL
(:func:`~leasekit_postgres._options.pool_settings`): the same connection string
(libpq parameters, ``statement_timeout`` from ``timeout_s``, ``connect_timeout``),
``pool_min_size``, ``pool_max_size`` and ``prepare_threshold``; by default 1 to 10
connections and no prepared statements. Same server work, same round trips; what
the ratio measures is everything leasekit adds on the client: validation, timeouts,
error translation, the provider's bookkeeping. The table is dropped at the end.

The peer is tooz's PostgreSQL driver (``pip install tooz psycopg2-binary``), used the
way its documentation shows: a lock object per acquisition. Each lock opens a
connection of its own for a session-level advisory lock and closes it on release or
denial, so every tooz cycle connects to the server again.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from leasekit.bench import AsyncCycler, BenchTarget, Contender, SchemeBench, SyncCycler, open_tooz

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

    from ._options import PoolSettings
    from ._sql import TableName

__all__ = ["BENCH"]


def _settings(target: BenchTarget) -> PoolSettings:
    from ._options import pool_settings  # noqa: PLC0415 (drivers load only when benchmarked)

    return pool_settings(target.url, {})


def _leases_table(settings: PoolSettings) -> TableName:
    from ._options import table_name  # noqa: PLC0415

    return table_name(settings.provider["table"])


def _floor_table(target: BenchTarget, settings: PoolSettings) -> TableName:
    """The floor's table: named after the run, in the schema of leasekit's table."""
    from ._sql import TableName  # noqa: PLC0415

    schema = _leases_table(settings).schema
    return TableName(schema, f"{target.namespace.replace('-', '_')}_floor")


# -- the floor: leasekit's acquire and release, by hand, on psycopg's async pool ----------


class _RawCycler:
    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        acquire: bytes,
        release: bytes,
        ttl_ms: int,
        channel: str | None,
    ) -> None:
        self._pool = pool
        self._acquire = acquire
        self._release = release
        self._ttl_ms = ttl_ms
        self._channel = channel

    async def cycle(self, key: str, owner: str) -> bool:
        params: dict[str, object] = {
            "key": key.encode(),
            "owner": owner.encode(),
            "ttl_ms": self._ttl_ms,
            "metadata": None,
        }
        if self._channel is not None:
            params["channel"] = self._channel
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
    from psycopg_pool import AsyncConnectionPool  # noqa: PLC0415

    from ._sql import Statements, channel_for  # noqa: PLC0415 (the backend's own statements)

    settings = _settings(target)
    table = _floor_table(target, settings)
    statements = Statements(table)
    # Acquire and release as leasekit does: with notifications on (the default), its
    # release statement also calls pg_notify, and so does its acquire when the key
    # changes hands (a grant hint), each a queue write for the server.
    notify = bool(settings.provider["notifications"])
    channel = channel_for(str(table)) if notify else None
    acquire = statements.acquire_notify if notify else statements.acquire
    release = statements.release_notify if notify else statements.release
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        settings.conninfo,
        kwargs=dict(settings.connection_kwargs),
        min_size=settings.min_size,
        max_size=settings.max_size,
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
    return _RawCycler(pool, acquire, release, target.ttl_ms, channel)


# -- tooz -----------------------------------------------------------------------------------


def _open_tooz(target: BenchTarget) -> SyncCycler:
    # tooz reads host, port, user, password and the database from the URL, nothing else.
    parts = urlsplit(target.url)
    url = urlunsplit(("postgresql", parts.netloc, parts.path, "", ""))
    with warnings.catch_warnings():
        # "PostgreSQL driver is deprecated": true, and not the reader's concern here.
        warnings.simplefilter("ignore", DeprecationWarning)
        return open_tooz(url, target.namespace.encode())


# -- around the run -------------------------------------------------------------------------


async def _cleanup(target: BenchTarget) -> None:
    """Delete leasekit's rows for the run's keys (tombstones) and the floor's tables."""
    import psycopg  # noqa: PLC0415
    from psycopg import sql  # noqa: PLC0415

    settings = _settings(target)
    leases = _leases_table(settings).table
    async with await psycopg.AsyncConnection.connect(settings.conninfo, autocommit=True) as conn:
        # Autocommit: a missing table (leasekit never got to create it) fails alone.
        with contextlib.suppress(psycopg.errors.UndefinedTable):
            await conn.execute(
                sql.SQL("DELETE FROM {} WHERE position(%s IN key) > 0").format(leases),
                (target.namespace.encode(),),
            )
        floor = _floor_table(target, settings)
        await conn.execute(
            sql.SQL("DROP TABLE IF EXISTS {}, {}; DROP SEQUENCE IF EXISTS {}").format(
                floor.table, floor.meta, floor.sequence
            )
        )


async def _describe_server(target: BenchTarget) -> str | None:
    import psycopg  # noqa: PLC0415

    conninfo = _settings(target).conninfo
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
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
            "release statements (with pg_notify, unless notifications=false), "
            "executed by hand",
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
