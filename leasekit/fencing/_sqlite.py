"""The SQLite guard: :func:`fence_sqlite`, one conditional upsert in the caller's transaction."""

from __future__ import annotations

import functools
import sqlite3
from dataclasses import dataclass

from .._errors import InvalidLeaseArgument, StaleFencingToken
from ._shared import DEFAULT_FENCE_TABLE, quoted, resource_bytes, table_parts, validate_token

__all__ = ["ensure_sqlite_fence_table", "fence_sqlite"]

_MIN_SQLITE = (3, 24, 0)  # UPSERT (INSERT .. ON CONFLICT DO UPDATE .. WHERE)

# The statement and why it is atomic: see leasekit.fencing._shared.


@dataclass(frozen=True, slots=True)
class _SQLiteStatements:
    create: str
    fence: str
    current: str


@functools.lru_cache(maxsize=64)
def _sqlite_statements(parts: tuple[str, ...]) -> _SQLiteStatements:
    table = quoted(parts, '"')
    return _SQLiteStatements(
        create=(
            f"CREATE TABLE IF NOT EXISTS {table} "
            "(resource BLOB PRIMARY KEY NOT NULL, token INTEGER NOT NULL) WITHOUT ROWID"
        ),
        fence=(
            f"INSERT INTO {table} AS f (resource, token) VALUES (?, ?) "  # noqa: S608 (quoted name)
            "ON CONFLICT (resource) DO UPDATE SET token = excluded.token "
            "WHERE f.token <= excluded.token"
        ),
        current=f"SELECT token FROM {table} WHERE resource = ?",  # noqa: S608 (quoted name)
    )


def _sqlite_in_transaction(conn: sqlite3.Connection) -> bool:
    """Whether the next write on ``conn`` is part of a transaction that the caller ends."""
    if conn.in_transaction:
        return True
    autocommit = getattr(conn, "autocommit", None)  # Python 3.12+: True, False or -1 (legacy)
    if autocommit is True:
        return False
    if autocommit is False:
        return True
    # Legacy transaction control: sqlite3 opens a transaction before an INSERT, unless
    # isolation_level is None (autocommit).
    return conn.isolation_level is not None


def ensure_sqlite_fence_table(
    conn: sqlite3.Connection, *, table: str = DEFAULT_FENCE_TABLE
) -> None:
    """Create the fence table if it does not exist (idempotent; :func:`fence_sqlite` does
    this itself, so calling it is optional). ``table`` may name an attached database's
    table as ``"schema.name"``."""
    conn.execute(_sqlite_statements(table_parts(table)).create)


def fence_sqlite(
    conn: sqlite3.Connection,
    resource: str,
    token: int,
    *,
    table: str = DEFAULT_FENCE_TABLE,
) -> None:
    """Record ``token`` for ``resource`` in the caller's transaction, or refuse a stale one.

    Call it inside your own transaction, before your write, on the connection that makes
    the write. Start the transaction with ``BEGIN IMMEDIATE``: it takes SQLite's write
    lock up front, so writers queue on the busy timeout instead of failing with
    ``database is locked`` when a deferred transaction must upgrade its lock::

        conn = sqlite3.connect("app.db", isolation_level=None)  # you issue BEGIN
        conn.execute("BEGIN IMMEDIATE")
        try:
            fence_sqlite(conn, "invoice-7", lease.token)
            conn.execute("UPDATE invoices SET ...")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    Raises :class:`leasekit.StaleFencingToken` if a higher token was already recorded
    (nothing is written). An equal or higher token is recorded and passes, and is kept
    only if your transaction commits. The fence table (``leasekit_fence`` unless
    ``table=``) is created if missing. Raises :class:`leasekit.InvalidLeaseArgument` for
    bad input, or when ``conn`` is in autocommit mode outside a transaction (the fence
    would commit on its own, apart from your write).
    """
    raw = resource_bytes(resource)
    token = validate_token(token)
    statements = _sqlite_statements(table_parts(table))
    if not _sqlite_in_transaction(conn):
        raise InvalidLeaseArgument.for_argument(
            "conn",
            "must be in a transaction (run BEGIN IMMEDIATE first): in autocommit mode "
            "the fence would commit on its own, apart from your write",
        )
    if sqlite3.sqlite_version_info < _MIN_SQLITE:  # pragma: no cover (old host libraries)
        raise InvalidLeaseArgument.for_argument(
            "conn", f"needs SQLite 3.24 or newer (UPSERT); Python links {sqlite3.sqlite_version}"
        )
    conn.execute(statements.create)
    if conn.execute(statements.fence, (raw, token)).rowcount == 1:
        return
    row = conn.execute(statements.current, (raw,)).fetchone()
    raise StaleFencingToken(
        resource=resource, token=token, current=None if row is None else int(row[0])
    )
