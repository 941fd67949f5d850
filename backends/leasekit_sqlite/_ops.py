"""The SQLite backend's operations: which statements each sends, and how it reads their replies.

Each is a sans-I/O generator (:data:`leasekit.backend.Operation`) that yields a
:class:`Query` and is sent its reply; the transports (``_blocking``, and ``_aio``,
which runs the blocking one in a thread of its own) only execute them. A public
factory validates its arguments first, so nothing is sent for bad input and neither
provider validates again.

The connection is in autocommit: an operation that is one write statement runs as
just that statement, which SQLite runs as its own transaction and which takes the
file's write lock before it reads anything, exactly as ``BEGIN IMMEDIATE`` would. Only
what needs several statements together (a denied acquire reading its holder, a batch
of renewals, the sweep, the schema) yields ``BEGIN IMMEDIATE`` ... ``COMMIT``
(:func:`transaction`).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Generator, Sequence
from typing import Any, Literal, NamedTuple, TypeAlias, TypeVar

from leasekit import (
    InvalidLeaseArgument,
    LeaseResult,
    validate_key,
    validate_metadata,
    validate_owner,
    validate_ttl_ms,
)
from leasekit.backend import LeaseRecord, RenewItem, check_renew_items

from . import _sql
from ._options import DatabaseUnavailable

__all__ = [
    "Op",
    "Query",
    "Sweeper",
    "acquire",
    "acquire_in_turn",
    "inspect",
    "migrate",
    "nothing",
    "owner",
    "prepare",
    "record",
    "release",
    "release_grant",
    "remaining",
    "renew",
    "renew_many",
    "row_count",
    "transaction",
    "transfer",
]

_T = TypeVar("_T")


class Query(NamedTuple):
    """One statement to execute, and what of its reply the operation is sent back.

    ``reads``: ``"rowcount"`` (how many rows it changed), ``"rows"`` (every row, which
    also runs the statement to its end) or ``"one"`` (the first row, or ``None``).
    """

    statement: str
    params: dict[str, Any] | tuple[()] = ()
    reads: Literal["rowcount", "rows", "one"] = "one"


Op: TypeAlias = Generator[Query, Any, _T]
"""An operation of this backend: :data:`leasekit.backend.Operation` over :class:`Query`."""

Row: TypeAlias = Sequence[Any]

_BEGIN = Query(_sql.BEGIN, reads="rowcount")
_COMMIT = Query(_sql.COMMIT, reads="rowcount")
_ROLLBACK = Query(_sql.ROLLBACK, reads="rowcount")


def transaction(body: Op[_T]) -> Op[_T]:
    """Run ``body`` inside ``BEGIN IMMEDIATE`` ... ``COMMIT``; rolled back if it fails."""
    yield _BEGIN
    try:
        result = yield from body
    except Exception:
        # A rollback that fails too (the connection is gone) leaves the first error; the
        # transport rolls back whatever is left open before its next operation.
        with contextlib.suppress(sqlite3.Error):
            yield _ROLLBACK
        raise
    yield _COMMIT
    return result


def nothing() -> Op[None]:
    """No statement at all: running it only opens the file (and prepares it, when new)."""
    yield from ()


def key_params(key: str, **owners: str) -> dict[str, Any]:
    """Parameters for a statement: keys and owners as their UTF-8 bytes (NUL included)."""
    return {"key": key.encode(), **{name: owner.encode() for name, owner in owners.items()}}


def _holder(row: Row | None) -> str | None:
    return None if row is None else bytes(row[0]).decode()


def _blob(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _denied(row: Row | None) -> tuple[str | None, bytes | None]:
    """A HOLDER row: the live holder and its metadata, or ``(None, None)``."""
    if row is None:
        return None, None
    return bytes(row[0]).decode(), _blob(row[1])


# -- the contract -------------------------------------------------------------------------


def acquire(key: str, owner: str, ttl_ms: int, metadata: bytes | None = None) -> Op[LeaseResult]:
    """Take ``key`` for ``owner`` with ``metadata``; if denied, a live holder that denies it.

    ``metadata`` is checked here too (:func:`leasekit.validate_metadata`); whether the
    provider may store it at all is the provider's to check (``metadata_for``).
    """
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    data = None if metadata is None else validate_metadata(metadata)
    return _acquire({**key_params(key, owner=owner), "ttl_ms": ttl_ms, "metadata": data}, owner)


def _acquire(params: dict[str, Any], owner: str) -> Op[LeaseResult]:
    # The common cases in one statement: ACQUIRE alone decides. "rows" runs it to its
    # end, so in autocommit its transaction ends here.
    rows = yield Query(_sql.ACQUIRE, params, "rows")
    if rows:
        return LeaseResult(True, owner, int(rows[0][0]), params["metadata"])
    # Denied: a live holder other than us had the row. Reading it (and its metadata) in
    # a statement of its own is still a true answer when it names a live holder other
    # than us: an acquire at that moment would have been denied by it, and the denied
    # ACQUIRE wrote nothing. Freed in between, or now held by this owner (another call
    # of ours), it is decided again, both statements in one transaction.
    holder, data = _denied((yield Query(_sql.HOLDER, params)))
    if holder is not None and holder != owner:
        return LeaseResult(False, holder, None, data)
    return (yield from transaction(_acquire_in_transaction(params, owner)))


def acquire_in_turn(
    key: str, owner: str, ttl_ms: int, place_ttl_ms: int, metadata: bytes | None = None
) -> Op[LeaseResult]:
    """``acquire`` in arrival order: granted in ``owner``'s turn, else its place kept.

    One IMMEDIATE transaction (``leasekit.backend.SupportsFairWaiting``).
    """
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    validate_ttl_ms(place_ttl_ms, "place_ttl_ms")
    data = None if metadata is None else validate_metadata(metadata)
    params = {
        **key_params(key, owner=owner),
        "ttl_ms": ttl_ms,
        "metadata": data,
        "place_ttl_ms": place_ttl_ms,
    }
    return transaction(_acquire_in_turn(params, owner))


def _acquire_in_turn(params: dict[str, Any], owner: str) -> Op[LeaseResult]:
    yield Query(_sql.LINE_DROP_LAPSED, params, "rowcount")
    holder, head = yield Query(_sql.LINE_STATE, params)
    me = params["owner"]
    if holder == me or (holder is None and head in (None, me)):
        rows = yield Query(_sql.ACQUIRE, params, "rows")
        if rows:  # always, with the write lock held since the state was read
            yield Query(_sql.LINE_LEAVE, params, "rowcount")
            return LeaseResult(True, owner, int(rows[0][0]), params["metadata"])
    yield Query(_sql.LINE_JOIN, params, "rowcount")
    if holder is None:
        return LeaseResult(False, None, None)  # free, but not the caller's turn
    name, data = _denied((yield Query(_sql.HOLDER, params)))
    return LeaseResult(False, name, None, data)


def _acquire_in_transaction(params: dict[str, Any], owner: str) -> Op[LeaseResult]:
    rows = yield Query(_sql.ACQUIRE, params, "rows")
    if rows:
        return LeaseResult(True, owner, int(rows[0][0]), params["metadata"])
    # Same transaction, so the holder seen here is the one that denied us.
    holder, data = _denied((yield Query(_sql.HOLDER, params)))
    return LeaseResult(False, holder, None, data)


def owner(key: str) -> Op[str | None]:
    """The live holder of ``key``, or ``None``."""
    validate_key(key)
    return _owner(key_params(key))


def _owner(params: dict[str, Any]) -> Op[str | None]:
    return _holder((yield Query(_sql.OWNER, params)))


def _changed(statement: str, params: dict[str, Any]) -> Op[bool]:
    # One UPDATE in autocommit: atomic by itself, with the write lock from its start.
    # It matched the caller's live lease, or nothing.
    count: int = yield Query(statement, params, "rowcount")
    return count == 1


def release(key: str, owner: str) -> Op[bool]:
    """Free ``key`` if ``owner`` holds it; whether it did."""
    validate_key(key)
    validate_owner(owner)
    return _changed(_sql.RELEASE, key_params(key, owner=owner))


def release_grant(key: str, owner: str, token: int) -> Op[bool]:
    """Free ``key`` if ``owner`` holds it with fencing token ``token``."""
    validate_key(key)
    validate_owner(owner)
    return _changed(_sql.RELEASE_GRANT, {**key_params(key, owner=owner), "token": token})


def renew(key: str, owner: str, ttl_ms: int) -> Op[bool]:
    """Reset the TTL of ``owner``'s live lease; whether it was renewed."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    return _changed(_sql.RENEW, {**key_params(key, owner=owner), "ttl_ms": ttl_ms})


def transfer(
    key: str, from_owner: str, to_owner: str, ttl_ms: int, metadata: bytes | None = None
) -> Op[bool]:
    """Hand ``from_owner``'s live lease to ``to_owner`` with ``metadata``; whether it moved."""
    validate_key(key)
    validate_owner(from_owner, "from_owner")
    validate_owner(to_owner, "to_owner")
    validate_ttl_ms(ttl_ms)
    data = None if metadata is None else validate_metadata(metadata)
    params = {
        **key_params(key, from_owner=from_owner, to_owner=to_owner),
        "ttl_ms": ttl_ms,
        "metadata": data,
    }
    return _changed(_sql.TRANSFER, params)


# -- beyond the contract ----------------------------------------------------------------


def remaining(key: str) -> Op[int | None]:
    """Milliseconds left on the live lease of ``key`` (at least 1), ``None`` if free."""
    validate_key(key)
    return _remaining(key_params(key))


def _remaining(params: dict[str, Any]) -> Op[int | None]:
    row = yield Query(_sql.REMAINING, params)
    return None if row is None else max(1, int(row[0]))


def record(key: str) -> Op[LeaseRecord | None]:
    """The live lease of ``key`` (remaining milliseconds by the host clock), or ``None``."""
    validate_key(key)
    return _record(key, key_params(key))


def _record(key: str, params: dict[str, Any]) -> Op[LeaseRecord | None]:
    row = yield Query(_sql.RECORD, params)
    if row is None:
        return None
    owner_, token, remaining_ms, data = row
    return LeaseRecord(
        key, bytes(owner_).decode(), int(token), max(1, int(remaining_ms)), _blob(data)
    )


def renew_many(items: Sequence[RenewItem]) -> Op[list[bool]]:
    """Renew each ``(key, owner, ttl_ms)`` in one transaction; each RENEW's own answer."""
    checked = check_renew_items(items)
    params = [{**key_params(k, owner=o), "ttl_ms": ttl} for k, o, ttl in checked]
    return _renew_many(params)


def _renew_many(params: list[dict[str, Any]]) -> Op[list[bool]]:
    if not params:
        return []
    return (yield from transaction(_renewals(params)))


def _renewals(params: list[dict[str, Any]]) -> Op[list[bool]]:
    renewed = []
    for p in params:
        renewed.append((yield Query(_sql.RENEW, p, "rowcount")) == 1)  # noqa: PERF401 (a yield)
    return renewed


def inspect(prefix: str | None = None, limit: int = 1000) -> Op[list[LeaseRecord]]:
    """Live leases in key order, only keys starting with ``prefix`` if given."""
    if prefix is not None:
        validate_key(prefix, "prefix")
    checked: object = limit  # callers may pass anything; check at run time
    if isinstance(checked, bool) or not isinstance(checked, int) or checked < 1:
        raise InvalidLeaseArgument.for_argument("limit", f"must be an int >= 1, got {limit!r}")
    return _inspect({"prefix": None if prefix is None else prefix.encode(), "limit": limit})


def _inspect(params: dict[str, Any]) -> Op[list[LeaseRecord]]:
    rows = yield Query(_sql.INSPECT, params, "rows")
    return [
        LeaseRecord(
            bytes(key).decode(), bytes(owner).decode(), int(token), int(remaining), _blob(data)
        )
        for key, owner, token, remaining, data in rows
    ]


def row_count() -> Op[int]:
    """Rows in the table, live and expired: what the sweep keeps bounded."""
    row = yield Query(_sql.COUNT_ROWS)
    return int(row[0])


# -- the schema ---------------------------------------------------------------------------


def _create_schema() -> Op[None]:
    for statement in _sql.CREATE_SCHEMA:
        yield Query(statement, reads="rowcount")


def prepare(path: str, *, create: bool) -> Op[None]:
    """Make a newly opened file ready: WAL and the tables, unless ``create`` is false.

    Both steps write only when needed, so opening a provider does not wait for a
    writer that holds the lock on an already prepared file. With ``create`` false,
    nothing is written, and a file without the tables raises
    :class:`~leasekit_sqlite._options.DatabaseUnavailable` naming ``path``.
    """
    if create:
        (mode,) = yield Query(_sql.JOURNAL_MODE)
        if mode != "wal":
            yield Query(_sql.USE_WAL, reads="rows")  # readers and a writer at once
    try:
        (version,) = yield Query(_sql.SCHEMA_VERSION_QUERY)
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        if not create:
            raise DatabaseUnavailable(
                f"{path!r} holds no leasekit tables, and create=false does not create them"
            ) from exc
        yield from transaction(_create_schema())
        return
    if int(version) < _sql.SCHEMA_VERSION:
        if not create:
            raise DatabaseUnavailable(
                f"{path!r} holds leasekit tables of schema version {version}, older than "
                f"this version's {_sql.SCHEMA_VERSION}, and create=false does not upgrade "
                "them: open it once with create=true, or run `leasekit migrate` on it"
            )
        yield from transaction(_upgrade())


def _upgrade() -> Op[None]:
    """Bring the tables to :data:`_sql.SCHEMA_VERSION`, reading the version again first."""
    (version,) = yield Query(_sql.SCHEMA_VERSION_QUERY)
    if int(version) < 2:  # the version that added the metadata column and slot tables
        for statement in (*_sql.CREATE_SCHEMA, *_sql.UPGRADE_TO_2):
            yield Query(statement, reads="rowcount")


def migrate() -> Op[int]:
    """Create the tables if they are missing, or upgrade them (idempotent); the version."""
    yield from transaction(_create_schema())
    yield from transaction(_upgrade())
    row = yield Query(_sql.SCHEMA_VERSION_QUERY)
    return int(row[0])


# -- the sweep ----------------------------------------------------------------------------


class Sweeper:
    """One provider's sweep: how many writes until the next, and where the last one ended.

    :meth:`after_write` appends a sweep to every ``every``-th write operation, run on
    the same trip to the connection. Each sweep reads one window of ``batch`` keys
    after the cursor (:data:`_sql.SWEEP_START` begins a pass) and deletes its expired
    rows, raising the token floor over them first; the cursor moves on once that has
    committed.
    """

    __slots__ = ("_after", "_batch", "_every", "_writes")

    def __init__(self, every: int, batch: int) -> None:
        self._every = every
        self._batch = batch
        self._writes = 0
        self._after: bytes = _sql.SWEEP_START

    def after_write(self, operation: Op[_T]) -> Op[_T]:
        """``operation``, followed by a sweep if it is the ``every``-th write."""
        self._writes += 1
        if self._writes % self._every:
            return operation
        return self._then_sweep(operation)

    def _then_sweep(self, operation: Op[_T]) -> Op[_T]:
        result = yield from operation
        yield from self.sweep(small_tables=False)
        return result

    def sweep(self, *, small_tables: bool = True) -> Op[int]:
        """Delete the expired rows of the next window of keys; how many it deleted.

        With ``small_tables=False`` (the sweep after writes) a table of fewer than
        ``batch`` rows is left as it is: it is bounded already, and its expired rows
        are mostly the tombstones of keys in use, which the next acquire of each would
        otherwise have to insert again (and each sweep would write, and sync, a
        transaction of its own). One read tells, without the write lock.
        """
        batch = self._batch
        if not small_tables and self._after == _sql.SWEEP_START:
            window = {"after": _sql.SWEEP_START, "batch": batch}
            ((_, _, keys),) = yield Query(_sql.SWEEP_WINDOW, window, "rows")  # to its end
            if keys < batch:
                return 0
        deleted, self._after = yield from transaction(self._sweep_window(self._after))
        if deleted >= batch:
            self._writes = -1  # a window of nothing but expired rows: sweep again next write
        return deleted

    def _sweep_window(self, after: bytes) -> Op[tuple[int, bytes]]:
        batch = self._batch
        window = {"after": after, "batch": batch}
        cutoff, last, keys = yield Query(_sql.SWEEP_WINDOW, window)
        following = last if keys >= batch else _sql.SWEEP_START
        if last is None:
            return 0, following
        params = {"after": after, "last": last, "cutoff": cutoff}
        yield Query(_sql.SWEEP_RAISE_FLOOR, params, "rowcount")
        deleted = yield Query(_sql.SWEEP_DELETE, params, "rowcount")
        return int(deleted), following
