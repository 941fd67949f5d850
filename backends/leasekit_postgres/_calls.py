"""Each operation as "the statements to send, and how to read the replies", then the I/O.

An operation is a generator: it yields a :class:`Query` (statement, parameters, which
part of the reply it reads), is sent that reply (the first row, every row, or the row
count), and returns its result. It never touches a connection, so the same operation
can be driven by a blocking ``psycopg.Connection`` as well as by :func:`run` here. A
statement that fails is thrown into the generator, which may handle it (a missing
table while reading the schema version) or let it propagate.

The rest of the module is the asyncio side: :func:`run` drives an operation on one
connection (the provider takes it from the pool, and runs the operation once more on a
fresh one when :func:`lost` says the connection died), and :func:`open_connection`
makes the provider's first connection itself, so that a refused connection, a wrong
password or an unknown host surface at once instead of as psycopg_pool's background
retries. psycopg_pool's own log about a pool the provider
built goes to leasekit's logger at DEBUG (:data:`ROUTE_POOL_LOG`), not to a terminal.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, TypeVar

import psycopg
import psycopg.errors
from psycopg import pq

from leasekit import LeaseBackendError, LeaseBackendUnreachable, LeaseResult
from leasekit.backend import ErrorMap, LeaseRecord, RenewItem

from . import _sql
from ._options import BACKEND

__all__ = [
    "ROUTE_POOL_LOG",
    "Operation",
    "Query",
    "acquire",
    "create_schema",
    "ensure_schema",
    "inspect",
    "lost",
    "migrate",
    "open_connection",
    "owner",
    "release",
    "release_grant",
    "renew",
    "renew_many",
    "row_count",
    "run",
    "run_single",
    "sweep",
    "transfer",
]

_T = TypeVar("_T")

log = logging.getLogger("leasekit.postgres")

_DENIED_RETRIES = 3


@dataclass(slots=True)  # not frozen: a frozen dataclass costs a call per field to build
class Query:
    """One statement to send, and what of its reply the operation reads.

    ``reads``: ``"row"`` (the first row, or ``None``), ``"rows"`` (every row) or
    ``"rowcount"``. ``prepare=False`` for a string of several commands, which
    PostgreSQL cannot prepare; ``None`` leaves it to the connection's threshold.
    """

    statement: bytes
    params: Mapping[str, Any] | None = None
    reads: Literal["row", "rows", "rowcount"] = "row"
    prepare: bool | None = None


Operation: TypeAlias = Generator[Query, Any, _T]
"""Yields queries, is sent their replies, returns the operation's result."""


# -- the operations (no I/O) --------------------------------------------------------------


def acquire(sql: _sql.Statements, key: str, owner: str, ttl_ms: int) -> Operation[LeaseResult]:
    """Acquire ``key`` for ``owner``: one statement, two for a brand-new key raced for."""
    params = {"key": key.encode(), "owner": owner.encode(), "ttl_ms": ttl_ms}
    for _ in range(_DENIED_RETRIES):
        row = yield Query(sql.acquire, params)
        if row is None:
            raise LeaseBackendError("the server returned no row", backend=BACKEND, key=key)
        token, holder = row
        if token is not None:
            return LeaseResult(True, owner, int(token))
        if holder is None:
            # The row that denied us is newer than the statement's snapshot (two
            # acquirers raced for a brand-new key), or it expired since: ask again.
            row = yield Query(sql.owner, params)
            holder = None if row is None else row[0]
        if holder is None:
            return LeaseResult(False, None, None)
        if bytes(holder) != params["owner"]:
            return LeaseResult(False, bytes(holder).decode(), None)
        # The key was handed to us between the two reads: acquire again, which now
        # finds our own lease.
    return LeaseResult(False, None, None)


def owner(sql: _sql.Statements, key: str) -> Operation[str | None]:
    """The live holder of ``key``, or ``None``."""
    row = yield Query(sql.owner, {"key": key.encode()})
    return None if row is None else bytes(row[0]).decode()


def release(
    sql: _sql.Statements, key: str, owner: str, channel: str | None = None
) -> Operation[None]:
    """Release ``key`` if ``owner`` holds it (a tombstone stays, see ``_sql``).

    With a ``channel``, the same statement notifies the waiters listening on it.
    """
    if channel is None:
        yield Query(sql.release, {"key": key.encode(), "owner": owner.encode()}, "rowcount")
    else:
        params = {"key": key.encode(), "owner": owner.encode(), "channel": channel}
        yield Query(sql.release_notify, params, "rowcount")


def release_grant(
    sql: _sql.Statements, key: str, owner: str, token: int, channel: str | None = None
) -> Operation[None]:
    """Release ``key`` if ``owner`` holds it with fencing token ``token``."""
    params: dict[str, object] = {"key": key.encode(), "owner": owner.encode(), "token": token}
    if channel is None:
        yield Query(sql.release_grant, params, "rowcount")
    else:
        yield Query(sql.release_grant_notify, {**params, "channel": channel}, "rowcount")


def remaining(sql: _sql.Statements, key: str) -> Operation[int | None]:
    """Milliseconds left on the live lease of ``key``, or ``None`` when it is free."""
    row = yield Query(sql.remaining, {"key": key.encode()})
    return None if row is None else max(1, int(row[0]))


def renew(sql: _sql.Statements, key: str, owner: str, ttl_ms: int) -> Operation[bool]:
    """Renew ``owner``'s live lease on ``key``; whether it was renewed."""
    params = {"key": key.encode(), "owner": owner.encode(), "ttl_ms": ttl_ms}
    renewed: int = yield Query(sql.renew, params, "rowcount")
    return renewed == 1


def renew_many(sql: _sql.Statements, items: Sequence[RenewItem]) -> Operation[list[bool]]:
    """Renew each ``(key, owner, ttl_ms)`` of a checked batch in one statement."""
    params = {
        "keys": [key.encode() for key, _, _ in items],
        "owners": [owner.encode() for _, owner, _ in items],
        "ttls_ms": [ttl_ms for _, _, ttl_ms in items],
    }
    rows = yield Query(sql.renew_many, params, "rows")
    renewed = [False] * len(items)
    for (position,) in rows:
        renewed[int(position) - 1] = True
    return renewed


def transfer(
    sql: _sql.Statements,
    key: str,
    from_owner: str,
    to_owner: str,
    ttl_ms: int,
    *,
    channel: str | None = None,
) -> Operation[bool]:
    """Hand ``from_owner``'s live lease on ``key`` to ``to_owner``; whether it moved."""
    params: dict[str, Any] = {
        "key": key.encode(),
        "from_owner": from_owner.encode(),
        "to_owner": to_owner.encode(),
        "ttl_ms": ttl_ms,
    }
    if channel is None:
        moved: int = yield Query(sql.transfer, params, "rowcount")
    else:
        moved = yield Query(sql.transfer_notify, {**params, "channel": channel}, "rowcount")
    return moved == 1


def inspect(sql: _sql.Statements, prefix: str | None, limit: int) -> Operation[list[LeaseRecord]]:
    """Live leases in key order; a prefix is a range of the primary key."""
    if prefix is None:
        query = Query(sql.inspect_all, {"limit": limit}, "rows")
    else:
        low = prefix.encode()
        # UTF-8 never contains the byte 0xFF, so the last byte can always be raised.
        high = low[:-1] + bytes([low[-1] + 1])
        query = Query(sql.inspect_prefix, {"limit": limit, "low": low, "high": high}, "rows")
    rows = yield query
    return [
        LeaseRecord(bytes(k).decode(), bytes(o).decode(), int(t), max(1, int(r)))
        for k, o, t, r in rows
    ]


def sweep(sql: _sql.Statements, grace_s: float, batch: int) -> Operation[int]:
    """Delete up to ``batch`` rows expired for more than ``grace_s``; how many went."""
    deleted: int = yield Query(sql.sweep, {"grace_s": grace_s, "batch": batch}, "rowcount")
    return deleted


def row_count(sql: _sql.Statements) -> Operation[int]:
    """Rows in the table, live and expired."""
    row = yield Query(sql.count_rows)
    return int(row[0])


def schema_version(sql: _sql.Statements) -> Operation[int | None]:
    """The recorded schema version, or ``None`` before the first migration."""
    try:
        row = yield Query(sql.schema_version)
    except psycopg.errors.UndefinedTable:
        return None
    return None if row is None else int(row[0])


def create_schema(sql: _sql.Statements) -> Operation[None]:
    """Create or upgrade the schema: one simple query, idempotent."""
    attempts = 3
    for attempt in range(1, attempts + 1):
        try:
            yield Query(sql.migrate, reads="rowcount", prepare=False)  # several commands
        except (  # noqa: PERF203 (the retry loop is the point)
            psycopg.errors.UniqueViolation,
            psycopg.errors.DuplicateTable,
            psycopg.errors.DuplicateObject,
        ):
            # Another process created the same objects at the same moment; its
            # transaction has committed now, so IF NOT EXISTS sees them next time.
            if attempt == attempts:
                raise
        else:
            return


def migrate(sql: _sql.Statements) -> Operation[int]:
    """Create or upgrade the schema (idempotent); the version now recorded."""
    yield from create_schema(sql)
    version = yield from schema_version(sql)
    return _sql.SCHEMA_VERSION if version is None else version


def ensure_schema(sql: _sql.Statements, table: str, *, create: bool) -> Operation[None]:
    """Check the schema; create it if it is missing and ``create``; refuse a newer one."""
    version = yield from schema_version(sql)
    if version == _sql.SCHEMA_VERSION:
        return
    if version is not None and version > _sql.SCHEMA_VERSION:
        raise LeaseBackendError(
            f"table {table} has schema version {version}, newer than this leasekit's "
            f"({_sql.SCHEMA_VERSION}); upgrade leasekit",
            backend=BACKEND,
        )
    if not create:
        raise LeaseBackendError(
            f"table {table} is missing or outdated (create_schema is off); run "
            "`leasekit migrate URL` as a role that may create it",
            backend=BACKEND,
        )
    yield from create_schema(sql)


# -- driving them on asyncio connections ---------------------------------------------------


async def run(conn: psycopg.AsyncConnection[Any], operation: Operation[_T]) -> _T:
    """Drive ``operation`` on ``conn``: send each query, hand back its reply."""
    try:
        query = next(operation)
        while True:
            try:
                cursor = await conn.execute(query.statement, query.params, prepare=query.prepare)
                reply: Any
                if query.reads == "rowcount":
                    reply = cursor.rowcount
                elif query.reads == "rows":
                    reply = await cursor.fetchall()
                else:
                    reply = await cursor.fetchone()
            except psycopg.Error as exc:  # noqa: PERF203 (handed to the operation)
                # A failed statement leaves a connection outside autocommit mode (a
                # caller's pool may hand out such) in an aborted transaction.
                if not conn.broken and conn.info.transaction_status == pq.TransactionStatus.INERROR:
                    await conn.rollback()
                query = operation.throw(exc)
            else:
                query = operation.send(reply)
    except StopIteration as stop:
        result: _T = stop.value
        return result


async def run_single(conn: psycopg.AsyncConnection[Any], operation: Operation[_T]) -> _T:
    """Drive ``operation`` on a caller's single connection, still in autocommit mode."""
    if not conn.autocommit:
        operation.close()
        raise LeaseBackendError(
            "the connection left autocommit mode; leasekit needs it on", backend=BACKEND
        )
    return await run(conn, operation)


def lost(conn: psycopg.AsyncConnection[Any] | None) -> bool:
    """Whether an ``OperationalError`` on ``conn`` means the connection itself died."""
    return conn is not None and (conn.closed or conn.broken)


# Connecting failed: refused, DNS, TLS, authentication. Only for the provider's own
# first connection; once connected, an OperationalError is a lost connection.
_CONNECT_ERRORS = ErrorMap({psycopg.OperationalError: LeaseBackendUnreachable}, backend=BACKEND)


async def open_connection(
    conninfo: str, kwargs: Mapping[str, Any], *, where: str
) -> psycopg.AsyncConnection[Any]:
    """Connect once, directly: a refusal is :class:`~leasekit.LeaseBackendUnreachable` now."""
    with _CONNECT_ERRORS.mapping(where=where):
        return await psycopg.AsyncConnection.connect(conninfo, **kwargs)


# -- psycopg_pool's log ------------------------------------------------------------------

ROUTE_POOL_LOG: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "leasekit_postgres_route_pool_log", default=False
)
"""True in the tasks working for a pool the provider built, and in its pool's workers.

The pool's worker tasks are created while the provider opens the pool, so they inherit
the value, and everything psycopg_pool logs from them ("error connecting in ...",
six times in five seconds against a server that is down) is routed.
"""


class _RoutePoolLog(logging.Filter):
    """Moves psycopg's records about leasekit's own pools to ``leasekit.postgres``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not ROUTE_POOL_LOG.get():
            return True
        if log.isEnabledFor(logging.DEBUG):
            prefix = "psycopg_pool" if record.name == "psycopg.pool" else record.name
            log.debug("%s: %s", prefix, record.getMessage())
        return False


def _install_pool_log_route() -> None:
    # A logger's filters see only the records logged on it, not its children's: the
    # pool's ("psycopg.pool"), and psycopg's own about a cancel a frozen server ignores.
    for name in ("psycopg.pool", "psycopg"):
        driver_log = logging.getLogger(name)
        if not any(isinstance(f, _RoutePoolLog) for f in driver_log.filters):
            driver_log.addFilter(_RoutePoolLog())


_install_pool_log_route()
