"""Each operation as work on a ``sqlite3`` connection, shared by the async and blocking providers.

A builder validates its arguments (before any I/O) and returns a function of a
connection that runs the whole operation. The connection is in autocommit
(``isolation_level=None``): an operation that is one write statement runs as just
that statement, which SQLite runs as its own transaction and which takes the file's
write lock before it reads anything, exactly as ``BEGIN IMMEDIATE`` would; only what
needs several statements together (a denied acquire reading its holder, a batch of
renewals) opens ``BEGIN IMMEDIATE`` ... ``COMMIT``. The async provider runs the work
in its thread; the blocking one in the caller's thread, one at a time. Neither has a
copy of its own.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

from leasekit import LeaseResult, validate_key, validate_owner, validate_ttl_ms

from . import _sql

__all__ = [
    "Work",
    "acquire",
    "owner",
    "release",
    "release_grant",
    "renew",
    "transaction",
    "transfer",
]

_T = TypeVar("_T")

Work: TypeAlias = Callable[[sqlite3.Connection], _T]
"""One operation, run on a connection; what it returns is the operation's result."""


def transaction(conn: sqlite3.Connection, body: Callable[[], _T]) -> _T:
    """Run ``body`` in a ``BEGIN IMMEDIATE`` transaction; rolled back if it raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body()
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


def _changed(statement: str, params: dict[str, Any]) -> Work[bool]:
    # One UPDATE in autocommit: atomic by itself, with the write lock from its start.
    return lambda conn: _sql.changed(conn.execute(statement, params).rowcount)


def acquire(key: str, owner: str, ttl_ms: int) -> Work[LeaseResult]:
    """Take ``key`` for ``owner``; if denied, a live holder that denies it."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    params = {**_sql.key_params(key, owner=owner), "ttl_ms": ttl_ms}

    def grant(conn: sqlite3.Connection) -> LeaseResult | None:
        # fetchall() runs the statement to completion, so in autocommit its
        # transaction ends here.
        return _sql.granted(_first(conn.execute(_sql.ACQUIRE, params).fetchall()), owner)

    def in_one_transaction(conn: sqlite3.Connection) -> LeaseResult:
        # Same transaction, so the holder seen here is the one that denied us.
        return grant(conn) or _sql.denied(conn.execute(_sql.OWNER, params).fetchone())

    def work(conn: sqlite3.Connection) -> LeaseResult:
        # The common cases in one statement: ACQUIRE alone decides.
        granted = grant(conn)
        if granted is not None:
            return granted
        # Denied: a live holder other than us had the row. Reading it in a statement of
        # its own is still a true answer when it names a live holder other than us: an
        # acquire at that moment would have been denied by it, and the denied ACQUIRE
        # wrote nothing. Freed in between, or now held by this owner (another call of
        # ours), it is decided again, both statements in one transaction.
        holder = _sql.holder_from(conn.execute(_sql.OWNER, params).fetchone())
        if holder is not None and holder != owner:
            return LeaseResult(False, holder, None)
        return transaction(conn, lambda: in_one_transaction(conn))

    return work


def _first(rows: list[Any]) -> Any:
    return rows[0] if rows else None


def owner(key: str) -> Work[str | None]:
    """The live holder of ``key``, or ``None``."""
    validate_key(key)
    params = _sql.key_params(key)
    return lambda conn: _sql.holder_from(conn.execute(_sql.OWNER, params).fetchone())


def release(key: str, owner: str) -> Work[bool]:
    """Free ``key`` if ``owner`` holds it."""
    validate_key(key)
    validate_owner(owner)
    return _changed(_sql.RELEASE, _sql.key_params(key, owner=owner))


def release_grant(key: str, owner: str, token: int) -> Work[bool]:
    """Free ``key`` if ``owner`` holds it with fencing token ``token``."""
    validate_key(key)
    validate_owner(owner)
    return _changed(_sql.RELEASE_GRANT, {**_sql.key_params(key, owner=owner), "token": token})


def renew(key: str, owner: str, ttl_ms: int) -> Work[bool]:
    """Reset the TTL of ``owner``'s live lease; whether it was renewed."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    return _changed(_sql.RENEW, {**_sql.key_params(key, owner=owner), "ttl_ms": ttl_ms})


def transfer(key: str, from_owner: str, to_owner: str, ttl_ms: int) -> Work[bool]:
    """Hand ``from_owner``'s live lease to ``to_owner``; whether it moved."""
    validate_key(key)
    validate_owner(from_owner, "from_owner")
    validate_owner(to_owner, "to_owner")
    validate_ttl_ms(ttl_ms)
    params = {**_sql.key_params(key, from_owner=from_owner, to_owner=to_owner), "ttl_ms": ttl_ms}
    return _changed(_sql.TRANSFER, params)
