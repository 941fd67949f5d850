"""MySQL/MariaDB: the raw asyncmy floor and tooz's driver for ``leasekit bench mysql://``.

Registered in the ``leasekit.bench`` entry-point group for ``mysql`` and ``mariadb``,
and imported only when such a URL is benchmarked. The floor is
the backend's own statements run by hand: its acquire (reading the token from the OK
packet) and release, for a table of the floor's own, executed on asyncmy's pool of
autocommit connections sized like leasekit's (the URL's ``pool_min_size`` and
``pool_max_size`` apply to both; by default 1 to 10). Same server work, same round
trips; the ratio measures what leasekit adds on the client: validation, the deadline,
error translation, the provider's bookkeeping. The floor's tables are dropped at the
end.

The peer is tooz's MySQL driver (``pip install tooz PyMySQL``), used the way its
documentation shows: a lock object per acquisition, ``GET_LOCK(name, 0)`` on a
connection of the lock's own that it opens on acquire and closes on release or denial,
so every tooz cycle connects to the server again. Its locks live as long as that
connection, with no TTL and no fencing token.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from leasekit.bench import AsyncCycler, BenchTarget, Contender, SchemeBench, SyncCycler, open_tooz

__all__ = ["BENCH"]


def _pool_options(target: BenchTarget) -> dict[str, Any]:
    from ._aio import pool_options  # noqa: PLC0415 (drivers load only when used)
    from ._options import url_settings  # noqa: PLC0415

    return pool_options(url_settings(target.url, {}))  # the same pool leasekit would build


def _database(target: BenchTarget) -> str | None:
    from ._options import url_settings  # noqa: PLC0415

    return url_settings(target.url, {}).table.database


def _floor_table(target: BenchTarget) -> Any:
    from ._sql import TableName  # noqa: PLC0415

    return TableName(_database(target), f"{target.namespace.replace('-', '_')}_floor")


# -- the floor: leasekit's acquire and release, by hand, on asyncmy's pool ----------------


class _RawCycler:
    def __init__(self, pool: Any, acquire: str, release: str, ttl_ms: int) -> None:
        self._pool = pool
        self._acquire = acquire
        self._release = release
        self._ttl_us = ttl_ms * 1000

    async def cycle(self, key: str, owner: str) -> bool:
        params = {"key": key.encode(), "owner": owner.encode(), "ttl_us": self._ttl_us}
        # A connection per statement, as for leasekit: a lease's acquire and release are
        # separate calls, with the caller's work (and no connection held) between.
        async with self._pool.acquire() as conn, conn.cursor() as cursor:
            await cursor.execute(self._acquire, params)
            granted = bool(cursor.lastrowid)
        if not granted:
            return False
        async with self._pool.acquire() as conn, conn.cursor() as cursor:
            await cursor.execute(self._release, params)
        return True

    async def aclose(self) -> None:
        self._pool.close()
        await self._pool.wait_closed()


async def _open_raw(target: BenchTarget) -> AsyncCycler:
    import asyncmy  # noqa: PLC0415

    from ._sql import TOKENS_CLOCK, TOKENS_SEQUENCE, Statements  # noqa: PLC0415

    pool = await asyncmy.create_pool(**_pool_options(target))
    try:
        async with pool.acquire() as conn, conn.cursor() as cursor:
            await cursor.execute("SELECT VERSION()")
            (version,) = await cursor.fetchone()
            tokens = TOKENS_SEQUENCE if "mariadb" in str(version).lower() else TOKENS_CLOCK
            statements = Statements(_floor_table(target), tokens)
            # Each round opens the floor again: create only what is missing (an existing
            # table's IF NOT EXISTS note would be fetched and logged by the driver).
            await cursor.execute(statements.existing, statements.names)
            present = {name for (name,) in await cursor.fetchall()}
            if statements.names["table"] not in present:
                await cursor.execute(statements.create_table)
            if tokens == TOKENS_SEQUENCE and statements.names["seq"] not in present:
                await cursor.execute(statements.create_sequence)
    except BaseException:
        pool.close()
        await pool.wait_closed()
        raise
    return _RawCycler(pool, statements.acquire_bare, statements.release, target.ttl_ms)


# -- tooz -----------------------------------------------------------------------------------


def _open_tooz(target: BenchTarget) -> SyncCycler:
    # tooz reads user, password, host, port and the database from the URL.
    parts = urlsplit(target.url)
    url = urlunsplit(("mysql", parts.netloc, parts.path or "/mysql", "", ""))
    return open_tooz(url, target.namespace.encode())


# -- around the run -------------------------------------------------------------------------


async def _cleanup(target: BenchTarget) -> None:
    """Delete leasekit's rows for the run's keys (tombstones) and drop the floor's tables."""
    import asyncmy  # noqa: PLC0415

    from ._provider import MySQLLeaseProvider  # noqa: PLC0415
    from ._sql import TOKENS_SEQUENCE, Statements, TableName  # noqa: PLC0415

    options = {**_pool_options(target), "minsize": 1, "maxsize": 1}
    table = MySQLLeaseProvider.from_url(target.url).table.split(".")
    leases = TableName(*table) if len(table) == 2 else TableName(None, table[0])
    floor = _floor_table(target)
    async with (
        asyncmy.create_pool(**options) as pool,
        pool.acquire() as conn,
        conn.cursor() as cursor,
    ):
        await cursor.execute(
            "SELECT COUNT(*) FROM information_schema.tables"
            " WHERE table_schema = COALESCE(%s, DATABASE()) AND table_name = %s",
            (leases.database, leases.name),
        )
        (present,) = await cursor.fetchone()
        if present:
            await cursor.execute(
                f"DELETE FROM {leases.quoted()} WHERE LOCATE(%s, lease_key) > 0",  # noqa: S608
                (target.namespace.encode(),),
            )
        statements = Statements(floor, TOKENS_SEQUENCE)
        await cursor.execute(statements.existing, statements.names)
        for (name,) in await cursor.fetchall():
            kind = "SEQUENCE" if name == statements.names["seq"] else "TABLE"
            await cursor.execute(f"DROP {kind} {TableName(floor.database, name).quoted()}")


async def _describe_server(target: BenchTarget) -> str | None:
    import asyncmy  # noqa: PLC0415

    options = {**_pool_options(target), "minsize": 1, "maxsize": 1}
    async with (
        asyncmy.create_pool(**options) as pool,
        pool.acquire() as conn,
        conn.cursor() as cursor,
    ):
        await cursor.execute("SELECT VERSION()")
        (version,) = await cursor.fetchone()
    name = "MariaDB" if "mariadb" in str(version).lower() else "MySQL"
    return f"{name} {str(version).split('-')[0]}"


BENCH = SchemeBench(
    contenders=(
        Contender(
            "mysql-raw",
            "asyncmy raw",
            "floor",
            open_async=_open_raw,
            requires=("asyncmy",),
            install="pip install 'leasekit[mysql]'",
            how="asyncmy pool, autocommit: leasekit's own acquire and release statements, "
            "executed by hand",
        ),
        Contender(
            "tooz",
            "tooz mysql (sync)",
            "peer",
            open_sync=_open_tooz,
            requires=("tooz", "pymysql"),
            install="pip install tooz PyMySQL",
            how="tooz coordinator (mysql driver) get_lock(key): acquire(blocking=False), "
            "release; a new connection and GET_LOCK per acquire",
        ),
    ),
    cleanup=_cleanup,
    describe_server=_describe_server,
)
