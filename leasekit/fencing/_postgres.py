"""The PostgreSQL guards: :func:`fence_postgres` and its blocking twin, one operation.

The guard is written once, as a sans-I/O operation (:data:`leasekit.backend.Operation`:
"run this, tell me the row it returned"), and run on an asyncio cursor by
:func:`leasekit.backend.drive_async` or on a blocking one by :func:`leasekit.backend.drive`.
The statement and why it is atomic: see :mod:`leasekit.fencing._shared`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import InvalidLeaseArgument, StaleFencingToken
from ..backend import Operation, drive, drive_async
from ._shared import DEFAULT_FENCE_TABLE, resource_bytes, table_parts, validate_token

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = [
    "ensure_postgres_fence_table",
    "ensure_postgres_fence_table_sync",
    "fence_postgres",
    "fence_postgres_sync",
]


@dataclass(frozen=True, slots=True)
class _PostgresStatements:
    create: sql.Composed
    fence: sql.Composed
    current: sql.Composed


@functools.lru_cache(maxsize=64)
def _postgres_statements(parts: tuple[str, ...]) -> _PostgresStatements:
    from psycopg import sql  # noqa: PLC0415 (the driver loads only when a guard needs it)

    table = sql.Identifier(*parts)
    return _PostgresStatements(
        create=sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} "
            "(resource bytea PRIMARY KEY, token bigint NOT NULL CHECK (token > 0))"
        ).format(table),
        fence=sql.SQL(
            "INSERT INTO {} AS f (resource, token) VALUES (%s, %s) "
            "ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token "
            "WHERE f.token <= EXCLUDED.token "
            "RETURNING token"
        ).format(table),
        current=sql.SQL("SELECT token FROM {} WHERE resource = %s").format(table),
    )


# A step of the guard: a statement and its parameters; its reply, the row returned.
_Step = tuple["sql.Composed", tuple[Any, ...]]
_Steps = Operation[_Step, None]


def _postgres_steps(resource: str, raw: bytes, token: int, parts: tuple[str, ...]) -> _Steps:
    statements = _postgres_statements(parts)
    row = yield statements.fence, (raw, token)
    if row is not None:
        return
    row = yield statements.current, (raw,)
    current = None if row is None else int(row[0])
    raise StaleFencingToken(resource=resource, token=token, current=current)


def _check_postgres_transaction(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
) -> None:
    from psycopg.pq import TransactionStatus  # noqa: PLC0415

    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise InvalidLeaseArgument.for_argument(
            "conn",
            "must be in a transaction (conn.transaction(), or autocommit off): in "
            "autocommit mode the fence would commit on its own, apart from your write",
        )


async def fence_postgres(
    conn: psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any],
    resource: str,
    token: int,
    *,
    table: str = DEFAULT_FENCE_TABLE,
) -> None:
    """Record ``token`` for ``resource`` in the caller's transaction, or refuse a stale one.

    Call it inside your own transaction, before your write, on the connection (or a
    cursor of it) that makes the write::

        async with conn.transaction():
            await fence_postgres(conn, "invoice-7", lease.token)
            await conn.execute("UPDATE invoices SET ...")

    Raises :class:`leasekit.StaleFencingToken` if a higher token was already recorded
    for ``resource`` (nothing is written; let the exception roll your transaction
    back). An equal or higher token is recorded and passes. The fence's row stays
    locked until your transaction ends, which orders competing writers of the
    resource; the recorded token is kept only if your transaction commits.

    The table (``leasekit_fence`` unless ``table=``, optionally ``"schema.name"``) must
    exist: :func:`ensure_postgres_fence_table`. Under REPEATABLE READ or SERIALIZABLE a
    concurrent writer makes psycopg raise a serialization failure: retry the
    transaction, as for any write. Raises :class:`leasekit.InvalidLeaseArgument` for
    bad input, or a connection in autocommit mode outside a transaction.
    """
    import psycopg  # noqa: PLC0415

    raw = resource_bytes(resource)
    token = validate_token(token)
    parts = table_parts(table)
    if isinstance(conn, psycopg.AsyncConnection):
        _check_postgres_transaction(conn)
        async with conn.cursor() as cursor:
            await _run_async(_postgres_steps(resource, raw, token, parts), cursor)
    else:
        _check_postgres_transaction(conn.connection)
        await _run_async(_postgres_steps(resource, raw, token, parts), conn)


async def _run_async(operation: _Steps, cursor: psycopg.AsyncCursor[Any]) -> None:
    async def exchange(step: _Step) -> tuple[Any, ...] | None:
        await cursor.execute(*step)
        return await cursor.fetchone()

    await drive_async(operation, exchange, throws=())


def fence_postgres_sync(
    conn: psycopg.Connection[Any] | psycopg.Cursor[Any],
    resource: str,
    token: int,
    *,
    table: str = DEFAULT_FENCE_TABLE,
) -> None:
    """The blocking :func:`fence_postgres`, for a ``psycopg.Connection`` or cursor."""
    import psycopg  # noqa: PLC0415

    raw = resource_bytes(resource)
    token = validate_token(token)
    parts = table_parts(table)
    if isinstance(conn, psycopg.Connection):
        _check_postgres_transaction(conn)
        with conn.cursor() as cursor:
            _run(_postgres_steps(resource, raw, token, parts), cursor)
    else:
        _check_postgres_transaction(conn.connection)
        _run(_postgres_steps(resource, raw, token, parts), conn)


def _run(operation: _Steps, cursor: psycopg.Cursor[Any]) -> None:
    def exchange(step: _Step) -> tuple[Any, ...] | None:
        cursor.execute(*step)
        return cursor.fetchone()

    drive(operation, exchange, throws=())


_DUPLICATE_DDL = ("UniqueViolation", "DuplicateTable", "DuplicateObject")


async def ensure_postgres_fence_table(
    conn: psycopg.AsyncConnection[Any], *, table: str = DEFAULT_FENCE_TABLE
) -> None:
    """Create the fence table if it does not exist (idempotent): run it once at deploy.

    It runs in a transaction of its own, or a savepoint of yours if one is open; two
    processes creating the table at the same moment both succeed.
    """
    import psycopg  # noqa: PLC0415

    statement = _postgres_statements(table_parts(table)).create
    duplicate = tuple(getattr(psycopg.errors, name) for name in _DUPLICATE_DDL)
    for attempt in range(3):
        try:
            async with conn.transaction():
                await conn.execute(statement)
        except duplicate:  # noqa: PERF203 (another process created it just now; look again)
            if attempt == 2:
                raise
        else:
            return


def ensure_postgres_fence_table_sync(
    conn: psycopg.Connection[Any], *, table: str = DEFAULT_FENCE_TABLE
) -> None:
    """The blocking :func:`ensure_postgres_fence_table`."""
    import psycopg  # noqa: PLC0415

    statement = _postgres_statements(table_parts(table)).create
    duplicate = tuple(getattr(psycopg.errors, name) for name in _DUPLICATE_DDL)
    for attempt in range(3):
        try:
            with conn.transaction():
                conn.execute(statement)
        except duplicate:  # noqa: PERF203 (the retry loop is the point)
            if attempt == 2:
                raise
        else:
            return
