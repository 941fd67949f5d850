"""Each operation as "the statements to send, and how to read the replies": no I/O.

One module, over 500 lines: every operation's statements and replies (contract, records,
slots, the line), written once for both drivers; split by topic they would share most of
their helpers.

An operation is a generator (:data:`leasekit.backend.Operation`): it yields a
:class:`Query` (statement, parameters, which part of the reply it reads), is sent that
reply (the first row, every row, or the row count), and returns its result. It never
touches a connection: the asyncio transport (``_aio``) drives it with
:func:`~leasekit.backend.drive_async`, the blocking one (``_blocking``) with
:func:`~leasekit.backend.drive`. A statement that fails is thrown into the generator,
which may handle it (a missing table while reading the schema version) or let it
propagate.

Each public factory validates its arguments before it returns the generator, so a bad
key raises :class:`~leasekit.InvalidLeaseArgument` before any I/O, whichever provider
asked. Also here, as pure functions of what a transport sees: whether a failed
statement left the connection in an aborted transaction (:func:`needs_rollback`) or
lost it (:func:`lost`), the one retry on a fresh connection after a lost one
(:func:`attempts`, which both transports drive), and when to sweep
(:class:`SweepSchedule`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, TypeVar

import psycopg.errors
from psycopg import pq

from leasekit import (
    LeaseBackendError,
    LeaseResult,
    validate_key,
    validate_metadata,
    validate_owner,
    validate_ttl_ms,
)
from leasekit import backend as toolkit
from leasekit.backend import LeaseRecord, RenewItem, check_renew_items

from . import _sql
from ._options import BACKEND, INSPECT_LIMIT

__all__ = [
    "RETRIED",
    "ConnectionLost",
    "Operation",
    "Query",
    "Retry",
    "SweepSchedule",
    "acquire",
    "attempts",
    "check_synchronous_standby",
    "end_process",
    "ensure_schema",
    "inspect",
    "lost",
    "migrate",
    "needs_rollback",
    "owner",
    "record",
    "release",
    "release_grant",
    "remaining",
    "renew",
    "renew_many",
    "retry_of",
    "row_count",
    "sweep",
    "transfer",
]

_T = TypeVar("_T")

_log = logging.getLogger("leasekit.postgres")
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


Operation: TypeAlias = toolkit.Operation[Query, _T]
"""Yields queries, is sent their replies, returns the operation's result."""


# -- the contract ---------------------------------------------------------------------------


def acquire(  # noqa: PLR0917 (its retry rebuilds it from one tuple of arguments, see attempts)
    sql: _sql.Statements,
    key: str,
    owner: str,
    ttl_ms: int,
    metadata: bytes | str | None = None,
    notify: bool = False,
) -> Operation[LeaseResult]:
    """Acquire ``key`` for ``owner``: one statement, two for a brand-new key raced for.

    ``metadata`` is stored with the grant; a denied caller gets the holder's. With
    ``notify``, the same statement sends owner watchers a grant hint on the table's
    channel when the key changed hands.
    """
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    params: dict[str, Any] = {
        "key": key.encode(),
        "owner": owner.encode(),
        "ttl_ms": ttl_ms,
        "metadata": None if metadata is None else validate_metadata(metadata),
    }
    statement = sql.acquire_notify if notify else sql.acquire
    return _acquire(sql, key, owner, statement, params)


def _acquire(
    sql: _sql.Statements, key: str, owner: str, statement: bytes, params: dict[str, Any]
) -> Operation[LeaseResult]:
    for _ in range(_DENIED_RETRIES):
        row = yield Query(statement, params)
        if row is None:
            raise LeaseBackendError("the server returned no row", backend=BACKEND, key=key)
        token, holder, held_with = row[0], row[1], row[2]
        if token is not None:
            return LeaseResult(True, owner, int(token), params["metadata"])
        if holder is None:
            # The row that denied us is newer than the statement's snapshot (two
            # acquirers raced for a brand-new key), or it expired since: ask again.
            row = yield Query(sql.record, params)
            holder, held_with = (None, None) if row is None else (row[0], row[2])
        if holder is None:
            return LeaseResult(False, None, None)
        if bytes(holder) != params["owner"]:
            held = None if held_with is None else bytes(held_with)
            return LeaseResult(False, bytes(holder).decode(), None, held)
        # The key was handed to us between the two reads: acquire again, which now
        # finds our own lease.
    return LeaseResult(False, None, None)


def owner(sql: _sql.Statements, key: str) -> Operation[str | None]:
    """The live holder of ``key``, or ``None``."""
    validate_key(key)
    return _owner(sql, key)


def _owner(sql: _sql.Statements, key: str) -> Operation[str | None]:
    row = yield Query(sql.owner, {"key": key.encode()})
    return None if row is None else bytes(row[0]).decode()


def record(sql: _sql.Statements, key: str) -> Operation[LeaseRecord | None]:
    """The live lease of ``key`` (owner, token, metadata, time left), or ``None``."""
    validate_key(key)
    return _record(sql, key)


def _record(sql: _sql.Statements, key: str) -> Operation[LeaseRecord | None]:
    row = yield Query(sql.record, {"key": key.encode()})
    if row is None:
        return None
    owner, token, metadata, remaining_ms = row
    held = None if metadata is None else bytes(metadata)
    return LeaseRecord(key, bytes(owner).decode(), int(token), max(1, int(remaining_ms)), held)


def release(
    sql: _sql.Statements, key: str, owner: str, channel: str | None = None
) -> Operation[bool]:
    """Release ``key`` if ``owner`` holds it (a tombstone stays, see ``_sql``); whether it did.

    With a ``channel``, the same statement notifies the waiters listening on it.
    """
    validate_key(key)
    validate_owner(owner)
    if channel is None:
        query = Query(sql.release, {"key": key.encode(), "owner": owner.encode()}, "rowcount")
    else:
        params = {"key": key.encode(), "owner": owner.encode(), "channel": channel}
        query = Query(sql.release_notify, params, "rowcount")
    return _changed_one(query)


def release_grant(
    sql: _sql.Statements, key: str, owner: str, token: int, channel: str | None = None
) -> Operation[None]:
    """Release ``key`` if ``owner`` holds it with fencing token ``token``."""
    validate_key(key)
    validate_owner(owner)
    params: dict[str, object] = {"key": key.encode(), "owner": owner.encode(), "token": token}
    if channel is None:
        return _send(Query(sql.release_grant, params, "rowcount"))
    return _send(Query(sql.release_grant_notify, {**params, "channel": channel}, "rowcount"))


def _send(query: Query) -> Operation[None]:
    yield query


def renew(sql: _sql.Statements, key: str, owner: str, ttl_ms: int) -> Operation[bool]:
    """Renew ``owner``'s live lease on ``key``; whether it was renewed."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    params = {"key": key.encode(), "owner": owner.encode(), "ttl_ms": ttl_ms}
    return _changed_one(Query(sql.renew, params, "rowcount"))


def transfer(
    sql: _sql.Statements,
    key: str,
    from_owner: str,
    to_owner: str,
    ttl_ms: int,
    *,
    metadata: bytes | str | None = None,
    channel: str | None = None,
) -> Operation[bool]:
    """Hand ``from_owner``'s live lease on ``key`` to ``to_owner``; whether it moved.

    ``metadata`` replaces the holder's (``None`` clears it). With a ``channel``, the
    same statement notifies the key's waiters and watchers, unless the key stays with
    its owner (a transfer to oneself is a renewal). Not idempotent: run a second time
    after it landed, it answers False.
    """
    validate_key(key)
    validate_owner(from_owner, "from_owner")
    validate_owner(to_owner, "to_owner")
    validate_ttl_ms(ttl_ms)
    params: dict[str, Any] = {
        "key": key.encode(),
        "from_owner": from_owner.encode(),
        "to_owner": to_owner.encode(),
        "ttl_ms": ttl_ms,
        "metadata": None if metadata is None else validate_metadata(metadata),
    }
    if channel is None or to_owner == from_owner:
        return _changed_one(Query(sql.transfer, params, "rowcount"))
    return _changed_one(Query(sql.transfer_notify, {**params, "channel": channel}, "rowcount"))


def _changed_one(query: Query) -> Operation[bool]:
    changed: int = yield query
    return changed == 1


# -- beyond the contract ---------------------------------------------------------------------


def renew_many(sql: _sql.Statements, items: Sequence[RenewItem]) -> Operation[list[bool]]:
    """Renew each ``(key, owner, ttl_ms)`` of a batch in one statement (none: no statement)."""
    return _renew_many(sql, check_renew_items(items))


def _renew_many(sql: _sql.Statements, items: list[RenewItem]) -> Operation[list[bool]]:
    if not items:
        return []
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


def remaining(sql: _sql.Statements, key: str) -> Operation[int | None]:
    """Milliseconds left on the live lease of ``key``, or ``None`` when it is free."""
    validate_key(key)
    return _remaining(sql, key)


def _remaining(sql: _sql.Statements, key: str) -> Operation[int | None]:
    row = yield Query(sql.remaining, {"key": key.encode()})
    return None if row is None else max(1, int(row[0]))


def inspect(
    sql: _sql.Statements, prefix: str | None = None, limit: int = 1000
) -> Operation[list[LeaseRecord]]:
    """Live leases in key order; a prefix is a range of the primary key."""
    if prefix is not None:
        validate_key(prefix, "prefix")
    limit = INSPECT_LIMIT.validate(limit)
    if prefix is None:
        return _records(Query(sql.inspect_all, {"limit": limit}, "rows"))
    low = prefix.encode()
    # UTF-8 never contains the byte 0xFF, so the last byte can always be raised.
    high = low[:-1] + bytes([low[-1] + 1])
    return _records(Query(sql.inspect_prefix, {"limit": limit, "low": low, "high": high}, "rows"))


def _records(query: Query) -> Operation[list[LeaseRecord]]:
    rows = yield query
    return [
        LeaseRecord(
            bytes(k).decode(),
            bytes(o).decode(),
            int(t),
            max(1, int(r)),
            None if m is None else bytes(m),
        )
        for k, o, t, r, m in rows
    ]


def sweep(sql: _sql.Statements, grace_s: float, batch: int) -> Operation[int]:
    """Delete up to ``batch`` rows expired for more than ``grace_s``; how many went."""
    deleted: int = yield Query(sql.sweep, {"grace_s": grace_s, "batch": batch}, "rowcount")
    return deleted


def row_count(sql: _sql.Statements) -> Operation[int]:
    """Rows in the table, live and expired."""
    row = yield Query(sql.count_rows)
    return int(row[0])


def end_process(pid: int, wait_ms: int) -> Operation[bool]:
    """Terminate server process ``pid`` and wait for it: True once it is gone (or was)."""
    rows = yield Query(_sql.END_PROCESS, {"pid": pid, "wait_ms": wait_ms}, reads="rows")
    return not rows or bool(rows[0][0])


# -- the schema ------------------------------------------------------------------------------


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
            psycopg.errors.DuplicateColumn,
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


def ensure_schema(
    sql: _sql.Statements, table: str, *, create: bool, synchronous_commit: str | None = None
) -> Operation[None]:
    """Check the schema; create it if it is missing and ``create``; refuse a newer one.

    With ``synchronous_commit``, first check that the session runs at that level and
    that the server names a synchronous standby (:func:`check_synchronous_standby`).
    """
    if synchronous_commit is not None:
        yield from check_synchronous_standby(synchronous_commit)
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


def check_synchronous_standby(level: str) -> Operation[None]:
    """Refuse to run unless commits wait for a synchronous standby at ``level``.

    The session must run at ``synchronous_commit = level`` (``from_url`` sets it in the
    connections' startup options; a caller's pool must set it itself), and the server's
    ``synchronous_standby_names`` must name a standby: empty, every commit returns as
    soon as it is flushed locally, and a failover could lose a grant.
    """
    session_level, standby_names = yield Query(_sql.REPLICATION_SETTINGS)
    if not str(standby_names).strip():
        raise LeaseBackendError(
            f"synchronous_commit={level} asks for grants acknowledged by a synchronous "
            "standby, but the server's synchronous_standby_names is empty, so no commit "
            "waits for one; configure a synchronous standby on the primary, or leave "
            "synchronous_commit unset",
            backend=BACKEND,
        )
    if session_level != level:
        raise LeaseBackendError(
            f"synchronous_commit={level} was asked for, but the connections run with "
            f"synchronous_commit={session_level}; give the pool's connections "
            f"options='-c synchronous_commit={level}' (from_url does)",
            backend=BACKEND,
        )


# -- what a transport reads off a connection --------------------------------------------------


def needs_rollback(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether a failed statement left ``conn`` in an aborted transaction.

    Only a connection outside autocommit mode (a caller's pool may hand out such) can be.
    """
    return not conn.broken and conn.info.transaction_status == pq.TransactionStatus.INERROR


def lost(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None) -> bool:
    """Whether an ``OperationalError`` on ``conn`` means the connection itself died."""
    return conn is not None and (conn.closed or conn.broken)


class ConnectionLost(psycopg.OperationalError):
    """The connection died under a statement (its cause is psycopg's error): the
    statement may or may not have run. What a transport's ``exchange`` raises instead,
    so that :func:`attempts` can tell it from a statement that failed on the server."""


@dataclass(slots=True)
class Retry:
    """What :func:`attempts` asks a transport for the second time: test the pool's
    idle connections (the lost one's siblings likely died too), then run ``operation``
    on one."""

    operation: Operation[Any]


def attempts(
    operation: Operation[_T],
    again: Callable[..., Operation[_T]] | None,
    args: tuple[Any, ...],
) -> toolkit.Operation[Operation[_T] | Retry, _T]:
    """The one retry policy: ``operation``; once more, as ``again(*args)``, if its
    connection died (:class:`ConnectionLost`: a server restart, ``pg_terminate_backend``,
    a proxy dropping idle links).

    Yields the operation to run on a pooled connection (then a :class:`Retry`), and is
    sent its result or thrown its :class:`ConnectionLost`. ``again`` is ``None`` for an
    operation that may not run twice: a transfer that landed before the connection
    died would answer False the second time; every operation retried is idempotent.
    ``again`` and ``args`` come apart, not as a closure, which would cost a cell per
    argument and a function object on every call.
    """
    try:
        result: _T = yield operation
    except ConnectionLost as exc:
        if again is None:
            raise
        _log.info("connection lost (%s); retrying once on a fresh one", exc)
        result = yield Retry(again(*args))
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        if again is None:
            raise
        # The connection reached a standby (or a demoted primary), which the transport
        # closed: nothing was written. Once more on a fresh connection, which libpq opens
        # on the primary (target_session_attrs=read-write).
        _log.info("connection on a read-only server (%s); retrying once", exc)
        result = yield Retry(again(*args))
    return result


RETRIED = (ConnectionLost, psycopg.errors.ReadOnlySqlTransaction)
"""What a transport throws into :func:`attempts`: the failures it may retry."""


def retry_of(
    exc: BaseException,
    operation: Operation[_T],
    again: Callable[..., Operation[_T]] | None,
    args: tuple[Any, ...],
) -> Retry:
    """What :func:`attempts` does once its first attempt raised ``exc`` (one of
    :data:`RETRIED`): the :class:`Retry` to run, or ``exc`` raised again.

    For transports that make the first attempt without the policy (most calls succeed
    at once, and driving a generator for them costs every call a frame): on a failure
    they ask the same policy what comes next.
    """
    policy = attempts(operation, again, args)
    next(policy)  # the first attempt, already made
    step = policy.throw(exc)
    assert isinstance(step, Retry)
    return step


class SweepSchedule:
    """When to sweep: every ``every`` writes (0: never by itself), sooner after a backlog."""

    __slots__ = ("_writes", "batch", "every")

    def __init__(self, every: int, batch: int) -> None:
        self.every = every
        self.batch = batch
        self._writes = 0

    def wrote(self) -> bool:
        """Count one write; True when a sweep is due (call :meth:`started` if one starts)."""
        if not self.every:
            return False
        self._writes += 1  # racy under threads: a sweep a little early or late
        return self._writes >= self.every

    def started(self) -> None:
        """A sweep starts: count writes from zero again."""
        self._writes = 0

    def swept(self, deleted: int) -> None:
        """A sweep deleted ``deleted`` rows; a full batch means a backlog: sweep next write."""
        if deleted >= self.batch:
            self._writes = self.every
