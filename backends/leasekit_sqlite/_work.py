"""Each operation as work on a ``sqlite3`` connection, shared by the async and blocking providers.

A builder validates its arguments (before any I/O) and returns a function of a
connection that runs the whole operation: ``BEGIN IMMEDIATE``, the deciding statement
(``_sql``), ``COMMIT``. The async provider runs it in its thread; the blocking one in
the caller's thread, one at a time. Neither has a copy of its own.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

from leasekit import LeaseResult, validate_key, validate_owner, validate_ttl_ms

from . import _sql

__all__ = ["Work", "acquire", "owner", "release", "renew", "transaction", "transfer"]

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
    def work(conn: sqlite3.Connection) -> bool:
        return _sql.changed(transaction(conn, lambda: conn.execute(statement, params).rowcount))

    return work


def acquire(key: str, owner: str, ttl_ms: int) -> Work[LeaseResult]:
    """Take ``key`` for ``owner``; the holder, read in the same transaction, if denied."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    params = {**_sql.key_params(key, owner=owner), "ttl_ms": ttl_ms}

    def work(conn: sqlite3.Connection) -> LeaseResult:
        def body() -> LeaseResult:
            grant = _sql.granted(conn.execute(_sql.ACQUIRE, params).fetchone(), owner)
            if grant is not None:
                return grant
            # Same transaction, so the holder seen here is the one that denied us.
            return _sql.denied(conn.execute(_sql.OWNER, params).fetchone())

        return transaction(conn, body)

    return work


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
