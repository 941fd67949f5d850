"""The MySQL and MariaDB guard: :func:`fence_mysql`, one statement on an asyncmy connection."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._errors import InvalidLeaseArgument, StaleFencingToken
from ._shared import DEFAULT_FENCE_TABLE, quoted, resource_bytes, table_parts, validate_token

if TYPE_CHECKING:
    import asyncmy
    import asyncmy.cursors

__all__ = ["ensure_mysql_fence_table", "fence_mysql"]


# -- MySQL / MariaDB: one conditional upsert ---------------------------------------------------
#
# The statement, for a fence table ``fence`` (resource VARBINARY(1024), token BIGINT), with
# parameters %(resource)s, %(token)s:
#
#     INSERT INTO fence (resource, token) VALUES (%(resource)s, %(token)s)
#     ON DUPLICATE KEY UPDATE
#         token = IF(token <= %(token)s, %(token)s, LAST_INSERT_ID(token))
#
# Why it is atomic: on a duplicate key InnoDB locks the resource's row exclusively and
# reads its newest committed version (a locking read, at any isolation level) before the
# assignment is evaluated, so no other writer's token can land between the comparison and
# the update; a competing transaction's upsert of the same resource waits for that lock
# and then compares against the row as the winner committed it. The lock is held until
# the caller's transaction ends, so the caller's own write is ordered by it too, and a
# rolled-back transaction rolls the fence back. MySQL has no RETURNING and no WHERE on
# ON DUPLICATE KEY UPDATE, so the one statement reports its decision through
# LAST_INSERT_ID(expr), whose value reaches the client in the OK packet (the driver's
# ``lastrowid``): only a stale token calls it, with the recorded token (>= 1), and leaves
# the row as it was; a token that passes, or a new row, calls nothing, so ``lastrowid``
# is 0. One round trip either way. (VALUES(col) is avoided: MySQL 8.0.20 deprecates it,
# and MariaDB has no row alias to replace it, so the parameter is bound twice.)


@dataclass(frozen=True, slots=True)
class _MySQLStatements:
    existing: str
    create: str
    fence: str


@functools.lru_cache(maxsize=64)
def _mysql_statements(parts: tuple[str, ...]) -> _MySQLStatements:
    table = quoted(parts, "`")
    return _MySQLStatements(
        # %(database)s (None: the connection's), %(table)s -> a row if the table exists.
        existing=(
            "SELECT 1 FROM information_schema.tables"
            " WHERE table_schema = COALESCE(%(database)s, DATABASE()) AND table_name = %(table)s"
        ),
        create=(
            f"CREATE TABLE IF NOT EXISTS {table} ("
            "resource VARBINARY(1024) NOT NULL PRIMARY KEY, "
            "token BIGINT NOT NULL CHECK (token > 0)"
            ") ENGINE=InnoDB"
        ),
        fence=(
            f"INSERT INTO {table} (resource, token) VALUES (%(resource)s, %(token)s) "  # noqa: S608 (quoted name)
            "ON DUPLICATE KEY UPDATE "
            "token = IF(token <= %(token)s, %(token)s, LAST_INSERT_ID(token))"
        ),
    )


def _check_mysql_transaction(conn: asyncmy.Connection) -> None:
    # Both read the server's status flags from its last reply (SERVER_STATUS_AUTOCOMMIT,
    # SERVER_STATUS_IN_TRANS): no round trip.
    if conn.get_autocommit() and not conn.get_transaction_status():
        raise InvalidLeaseArgument.for_argument(
            "conn",
            "must be in a transaction (await conn.begin(), or autocommit off): in "
            "autocommit mode the fence would commit on its own, apart from your write",
        )


async def fence_mysql(
    conn: asyncmy.Connection | asyncmy.cursors.Cursor,
    resource: str,
    token: int,
    *,
    table: str = DEFAULT_FENCE_TABLE,
) -> None:
    """Record ``token`` for ``resource`` in the caller's transaction, or refuse a stale one.

    MySQL and MariaDB (InnoDB), on an ``asyncmy`` connection or a cursor of it, the
    driver of ``leasekit[mysql]``. Call it inside your own transaction, before your
    write, on the connection that makes the write::

        await conn.begin()
        try:
            await fence_mysql(conn, "invoice-7", lease.token)
            async with conn.cursor() as cur:
                await cur.execute("UPDATE invoices SET ...")
            await conn.commit()
        except BaseException:
            await conn.rollback()
            raise

    Raises :class:`leasekit.StaleFencingToken` if a higher token was already recorded
    for ``resource`` (nothing is written; roll your transaction back). An equal or
    higher token is recorded and passes. The fence's row stays locked until your
    transaction ends, which orders competing writers of the resource; the recorded
    token is kept only if your transaction commits. One statement, one round trip.

    The table (``leasekit_fence`` unless ``table=``, optionally ``"database.name"``)
    must exist: :func:`ensure_mysql_fence_table`. A deadlock or lock wait timeout
    reaches you as asyncmy's error, as for any write: retry the transaction. Raises
    :class:`leasekit.InvalidLeaseArgument` for bad input, or a connection in autocommit
    mode outside a transaction.
    """
    import asyncmy  # noqa: PLC0415 (the driver loads only when a guard needs it)

    raw = resource_bytes(resource)
    token = validate_token(token)
    statement = _mysql_statements(table_parts(table)).fence
    params = {"resource": raw, "token": token}
    if isinstance(conn, asyncmy.Connection):
        _check_mysql_transaction(conn)
        async with conn.cursor() as cursor:
            await cursor.execute(statement, params)
            current = int(cursor.lastrowid)
    else:
        _check_mysql_transaction(conn.connection)
        await conn.execute(statement, params)
        current = int(conn.lastrowid)
    if current:
        raise StaleFencingToken(resource=resource, token=token, current=current)


async def ensure_mysql_fence_table(
    conn: asyncmy.Connection, *, table: str = DEFAULT_FENCE_TABLE
) -> None:
    """Create the MySQL/MariaDB fence table if it does not exist (idempotent): run it once
    at deploy, outside your transactions.

    MySQL commits any open transaction before a ``CREATE TABLE``, so do not call it in
    the middle of one. Two processes creating the table at the same moment both
    succeed. ``table`` may name another database's table as ``"database.name"``.
    """
    parts = table_parts(table)
    statements = _mysql_statements(parts)
    names = {"database": parts[0] if len(parts) == 2 else None, "table": parts[-1]}
    async with conn.cursor() as cursor:
        # Only when missing: IF NOT EXISTS on an existing table leaves a note, which the
        # driver would fetch (a round trip) and log as a warning.
        await cursor.execute(statements.existing, names)
        if await cursor.fetchone() is None:
            await cursor.execute(statements.create)
