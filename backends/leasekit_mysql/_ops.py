"""Every MySQL operation as a sans-I/O generator, shared by the async and the blocking provider.

An operation yields :class:`Statement` requests (the SQL of ``_sql``, its parameters,
and what of the reply it reads) and is sent the reply: the row count, the
``LAST_INSERT_ID`` of the OK packet, one row (or None) or all rows. A driver error is
thrown in at the ``yield`` that caused it. Both transports (``_aio``, ``_blocking``)
only send statements; the decisions between them live here once: the retry of a
denied acquire, the retry after a deadlock or (idempotent operations, once) a lost
connection, the reading and creating of the schema.

Each public factory validates its arguments before returning the operation, so a
bad argument raises :class:`~leasekit.InvalidLeaseArgument` before any I/O, on both
providers alike. The statements depend on the table's token source, known once the
schema has been read (:func:`ready`): an operation asks for them (``sql()``, the
provider's) when it first runs, after the provider made the schema ready. (Asked of
the provider, not kept: a provider rebuilt on a new loop or after ``fork()`` between
building an operation and running it answers with its new state.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, TypeAlias, TypeVar

from leasekit import (
    LeaseBackendError,
    LeaseResult,
    validate_key,
    validate_metadata,
    validate_owner,
    validate_ttl_ms,
)
from leasekit.backend import LeaseRecord, Operation, Option

from . import _sql
from ._options import BACKEND, DEADLOCK, LOST, NO_SUCH_TABLE, MySQLSettings, error_code

__all__ = [
    "Schema",
    "Statement",
    "acquire",
    "fence",
    "inspect",
    "migrate",
    "owner",
    "ready",
    "record",
    "release",
    "release_grant",
    "renew",
    "row_count",
    "sweep",
    "transfer",
]

_T = TypeVar("_T")
Reads: TypeAlias = Literal["rowcount", "lastrowid", "row", "rows", "call"]
Request: TypeAlias = tuple[str, "Mapping[str, Any] | None", Reads]
"""A :class:`Statement`, or on the hot path the plain tuple of its three fields."""
Op: TypeAlias = Operation[Request, _T]
Statements: TypeAlias = Callable[[], _sql.Statements]
"""Where an operation finds its table's statements when it runs (the schema is ready)."""

_DENIED_RETRIES = 3
_DUPLICATE_COLUMN = 1060  # another process added the metadata column first
_ROUTINE_EXISTS = 1304  # another process created the procedure first
_UNKNOWN_THREAD = 1094  # KILL of a session that has ended
_NOT_ITS_OWNER = 1095  # KILL of another user's session without the privilege
_ATTEMPTS = 3  # a deadlock victim runs again; a lost connection once more on a fresh one

_log = logging.getLogger("leasekit.mysql")


class Statement(NamedTuple):
    """One statement to run; its reply is what ``reads`` names.

    ``rowcount``: the affected rows (an ``int``); ``lastrowid``: the OK packet's
    ``LAST_INSERT_ID`` (an ``int``); ``row``: the first row or None; ``rows``: all rows;
    ``call``: a procedure's first row, the rest of its replies read and dropped.
    """

    sql: str
    params: Mapping[str, Any] | None = None
    reads: Reads = "rowcount"
    # A tuple, not a dataclass: the contract's operations yield bare tuples of these
    # three fields, which cost less to build (one per statement, on every call).


class Schema:
    """One provider's table: what creating it takes, and its statements once read.

    ``sql`` is None until :func:`ready` (or :func:`migrate`) has read the table's meta;
    each provider has its own.
    """

    __slots__ = ("create_schema", "ddl", "sql", "table", "token_source")

    def __init__(self, settings: MySQLSettings) -> None:
        self.table = settings.table
        self.create_schema = settings.create_schema
        self.token_source = settings.token_source
        self.ddl = _sql.Statements(settings.table, _sql.TOKENS_SEQUENCE)
        self.sql: _sql.Statements | None = None

    def statements(self) -> _sql.Statements:
        assert self.sql is not None, "the provider makes the schema ready first"
        return self.sql

    def error(self, problem: str) -> LeaseBackendError:
        return LeaseBackendError(f"table {self.table} {problem}", backend=BACKEND)


def _retrying(
    body: Callable[..., Op[_T]],
    *args: Any,
    idempotent: bool = True,
    attempts: int = _ATTEMPTS,
) -> Op[_T]:
    """``body(*args)``, run again after a deadlock, or once more after a lost connection.

    Not after a lost connection that was a timeout (the deadline has passed), and not
    for an operation that is not ``idempotent`` (a transfer that ran before the
    connection died would report False the second time). The transport sends the
    next statement after a lost connection on a fresh one. ``attempts``: how many
    times a deadlock victim runs in all.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            return (yield from body(*args))
        except Exception as exc:  # noqa: BLE001 (re-raised unless retried)
            _retry_or_raise(exc, attempt, idempotent=idempotent, attempts=attempts)


def _retry_or_raise(
    exc: Exception, attempt: int, *, idempotent: bool, attempts: int = _ATTEMPTS
) -> None:
    """Return if the operation that raised ``exc`` at ``attempt`` runs again; else raise it.

    The one retry policy. The contract's operations apply it themselves, in their own
    loop (one generator per call on the hot path); the others through :func:`_retrying`.
    """
    code = error_code(exc)
    lost = code in LOST and not isinstance(exc.__context__, TimeoutError)
    if attempt >= attempts or not (code == DEADLOCK or (lost and idempotent and attempt == 1)):
        raise exc
    _log.info("retrying after %s", exc)


# -- the schema ---------------------------------------------------------------------------


def ready(schema: Schema) -> Op[_sql.Statements]:
    """Read the table's meta (creating the schema if allowed); records the statements."""
    return _retrying(_read_schema, schema)


def _read_schema(schema: Schema) -> Op[_sql.Statements]:
    ddl = schema.ddl
    try:
        rows = yield Statement(ddl.meta, None, "rows")
    except Exception as exc:
        if error_code(exc) != NO_SUCH_TABLE:
            raise
        if not schema.create_schema:
            fix = "run `leasekit migrate URL` as a user that may create it"
            raise schema.error(f"is missing (create_schema is off); {fix}") from None
        yield from _create(schema)
        rows = yield Statement(ddl.meta, None, "rows")
    meta = {str(name): int(value) for name, value in rows}
    version, tokens = meta.get("schema_version", 0), meta.get("tokens", 0)
    if version > _sql.SCHEMA_VERSION:
        raise schema.error(f"has schema version {version}; upgrade leasekit")
    if version < _sql.SCHEMA_VERSION:
        # An older table (version 1 has no metadata column): brought up to date here
        # when allowed, as a missing one is created.
        if not schema.create_schema:
            fix = "run `leasekit migrate URL` as a user that may alter it"
            raise schema.error(
                f"has schema version {version}, older than this leasekit's "
                f"({_sql.SCHEMA_VERSION}), and create_schema is off; {fix}"
            )
        recorded = tokens if tokens in _sql.TOKEN_SOURCES.values() else None
        yield from _create(schema, recorded)
        rows = yield Statement(ddl.meta, None, "rows")
        meta = {str(name): int(value) for name, value in rows}
        version, tokens = meta.get("schema_version", 0), meta.get("tokens", 0)
    wanted = schema.token_source
    if tokens not in _sql.TOKEN_SOURCES.values() or wanted not in (None, tokens):
        raise schema.error(f"keeps the token source it was created with ({tokens})")
    schema.sql = _sql.Statements(schema.table, tokens)
    return schema.sql


def _create(schema: Schema, recorded: int | None = None) -> Op[None]:
    """Create what is missing; ``recorded``: the token source an existing table keeps."""
    ddl = schema.ddl
    present = {str(name) for (name,) in (yield Statement(ddl.existing, ddl.names, "rows"))}
    tokens = recorded or schema.token_source
    if tokens is None:
        row = yield Statement("SELECT VERSION()", None, "row")
        mariadb = row is not None and "mariadb" in str(row[0]).lower()
        tokens = _sql.TOKENS_SEQUENCE if mariadb else _sql.TOKENS_CLOCK
    # Only what is missing: IF NOT EXISTS on an existing object leaves a note, which
    # the driver would fetch with SHOW WARNINGS (a round trip) and log.
    if ddl.names["table"] not in present:
        yield Statement(ddl.create_table)
    elif (yield Statement(ddl.has_metadata, ddl.names, "row")) is None:
        # A table of schema version 1: add the column before the version is recorded.
        try:
            yield Statement(ddl.add_metadata)
        except Exception as exc:
            if error_code(exc) != _DUPLICATE_COLUMN:
                raise
    if tokens == _sql.TOKENS_SEQUENCE and ddl.names["seq"] not in present:
        yield Statement(ddl.create_sequence)
    if ddl.names["meta"] not in present:
        yield Statement(ddl.create_meta)
    yield from _create_slots(_sql.Statements(schema.table, tokens))
    yield Statement(ddl.record_meta, {"tokens": tokens})


def _create_slots(ddl: _sql.Statements) -> Op[None]:
    """The slot tables and procedures (schema version 3), each only if missing."""
    rows = yield Statement(ddl.existing_slot_tables, ddl.slot_names, "rows")
    present = {str(name) for (name,) in rows}
    for name, statement in ddl.create_slot_tables.items():
        if ddl.slot_names[name] not in present:
            yield Statement(statement)
    rows = yield Statement(ddl.existing_routines, ddl.routine_names, "rows")
    present = {str(name) for (name,) in rows}
    for name, statement in ddl.create_routines.items():
        if ddl.routine_names[name] not in present:
            try:
                yield Statement(statement)
            except Exception as exc:
                if error_code(exc) != _ROUTINE_EXISTS:  # another process created it first
                    raise


def migrate(schema: Schema) -> Op[int]:
    """Create what is missing of the schema, then read it; returns the schema version."""

    def body() -> Op[int]:
        yield from _create(schema)
        yield from _read_schema(schema)
        return _sql.SCHEMA_VERSION

    return _retrying(body)


# -- the contract -------------------------------------------------------------------------


def acquire(
    sql: Statements, key: str, owner: str, ttl_ms: int, metadata: bytes | str | None = None
) -> Op[LeaseResult]:
    """Acquire ``key``: one statement, and when denied one read of the holder and its
    metadata. ``metadata`` is stored with the grant (the holder's re-acquire sets it)."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    params = {"key": key.encode(), "owner": owner.encode(), "ttl_us": ttl_ms * 1000}
    if metadata is None:
        return _acquire(sql, owner, params, None)
    data = params["metadata"] = validate_metadata(metadata)
    return _acquire(sql, owner, params, data)


def _acquire(
    sql: Statements, owner: str, params: dict[str, Any], metadata: bytes | None
) -> Op[LeaseResult]:
    attempt = 0
    while True:
        attempt += 1
        try:
            s = sql()
            statement = s.acquire_bare if metadata is None else s.acquire
            for _ in range(_DENIED_RETRIES):
                token = yield (statement, params, "lastrowid")
                if token:
                    return LeaseResult(True, owner, int(token), metadata)
                row = yield (s.holder, params, "row")
                if row is not None and bytes(row[0]) != params["owner"]:
                    held = None if row[1] is None else bytes(row[1])
                    return LeaseResult(False, bytes(row[0]).decode(), None, held)
                # Released, expired or handed to us since it denied us: acquire again.
            return LeaseResult(False, None, None)
        except Exception as exc:  # noqa: BLE001 (re-raised unless retried)
            _retry_or_raise(exc, attempt, idempotent=True)


def owner(sql: Statements, key: str) -> Op[str | None]:
    """The live holder of ``key``, or None."""
    validate_key(key)
    return _one(sql, "owner", {"key": key.encode()}, "row", _holder)


def _one(
    sql: Statements,
    name: str,
    params: Mapping[str, Any],
    reads: Reads,
    read: Callable[[Any], _T],
    *,
    idempotent: bool = True,
) -> Op[_T]:
    """Statement ``name``, its reply through ``read``; retried as :func:`_retrying` does."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return read((yield (getattr(sql(), name), params, reads)))
        except Exception as exc:  # noqa: BLE001 (re-raised unless retried)
            _retry_or_raise(exc, attempt, idempotent=idempotent)


def _holder(row: Any) -> str | None:
    return None if row is None else bytes(row[0]).decode()


def record(sql: Statements, key: str) -> Op[LeaseRecord | None]:
    """The live lease of ``key`` (owner, token, metadata, time left), or None."""
    validate_key(key)

    def read(row: Any) -> LeaseRecord | None:
        if row is None:
            return None
        owner, token, metadata, remaining_ms = row
        held = None if metadata is None else bytes(metadata)
        return LeaseRecord(key, bytes(owner).decode(), int(token), max(1, int(remaining_ms)), held)

    return _one(sql, "record", {"key": key.encode()}, "row", read)


def _changed(count: int) -> bool:
    return count == 1


def release(sql: Statements, key: str, owner: str) -> Op[int]:
    """Release ``key`` if ``owner`` holds it; 1 if it did."""
    validate_key(key)
    validate_owner(owner)
    params = {"key": key.encode(), "owner": owner.encode()}
    return _one(sql, "release", params, "rowcount", int)


def release_grant(sql: Statements, key: str, owner: str, token: int) -> Op[int]:
    """Release ``key`` if ``owner`` holds it with fencing ``token``; 1 if it did."""
    validate_key(key)
    validate_owner(owner)
    params = {"key": key.encode(), "owner": owner.encode(), "token": token}
    return _one(sql, "release_grant", params, "rowcount", int)


def renew(sql: Statements, key: str, owner: str, ttl_ms: int) -> Op[bool]:
    """Renew ``owner``'s live lease on ``key``; True if it did."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    params = {"key": key.encode(), "owner": owner.encode(), "ttl_us": ttl_ms * 1000}
    return _one(sql, "renew", params, "rowcount", _changed)


def transfer(  # noqa: PLR0917 (the contract's five arguments, and the metadata)
    sql: Statements,
    key: str,
    from_owner: str,
    to_owner: str,
    ttl_ms: int,
    metadata: bytes | str | None = None,
) -> Op[bool]:
    """Hand ``from_owner``'s live lease on ``key`` to ``to_owner``; True if it did.

    ``metadata`` replaces the holder's (None clears it). Not retried after a lost
    connection: one that ran before the connection died would answer False the second
    time.
    """
    validate_key(key)
    validate_owner(from_owner, "from_owner")
    validate_owner(to_owner, "to_owner")
    validate_ttl_ms(ttl_ms)
    params: dict[str, Any] = {
        "key": key.encode(),
        "from_owner": from_owner.encode(),
        "ttl_us": ttl_ms * 1000,
        "metadata": None if metadata is None else validate_metadata(metadata),
    }
    params["to_owner"] = to_owner.encode()
    return _one(sql, "transfer", params, "rowcount", _changed, idempotent=False)


# -- beyond the contract ------------------------------------------------------------------


def inspect(sql: Statements, prefix: str | None, limit: int) -> Op[list[LeaseRecord]]:
    """Live leases in key order, only keys starting with ``prefix`` if given."""
    if prefix is not None:
        validate_key(prefix, "prefix")
    limit = Option("limit", int, minimum=1).validate(limit)
    params: dict[str, Any] = {"limit": limit}
    if prefix is not None:
        low = prefix.encode()
        # UTF-8 never contains the byte 0xFF, so the last byte can always be raised.
        params.update(low=low, high=low[:-1] + bytes([low[-1] + 1]))

    def body() -> Op[list[LeaseRecord]]:
        s = sql()
        rows = yield Statement(
            s.inspect_all if prefix is None else s.inspect_prefix, params, "rows"
        )
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

    return _retrying(body)


def sweep(sql: Statements, grace_s: float, batch: int) -> Op[int]:
    """Delete up to ``batch`` rows expired more than ``grace_s`` ago; how many it did."""
    params: dict[str, Any] = {"grace_us": round(grace_s * 1_000_000), "batch": batch}

    def body() -> Op[int]:
        s = sql()
        rows = yield Statement(s.sweep_select, params, "rows")
        keys = [row[0] for row in rows]
        if not keys:
            return 0
        delete = {**params, **{f"k{i}": key for i, key in enumerate(keys)}}
        return int((yield Statement(s.sweep_delete(len(keys)), delete)))

    return _retrying(body)


def row_count(sql: Statements) -> Op[int]:
    """Rows in the table, live and expired."""

    def body() -> Op[int]:
        row = yield Statement(sql().count_rows, None, "row")
        return 0 if row is None else int(row[0])

    return _retrying(body)


def fence(sessions: tuple[int, ...]) -> Op[None]:
    """End the server ``sessions`` dropped mid-statement, and wait until they have ended.

    A transport runs this before the next operation after it dropped a connection
    whose statement had not answered (a cancelled or timed-out call): that statement
    may still run on the server, later than anything sent after it on another
    connection, such as the undo of the grant it may make. Killed, it either committed
    already or never will; gone from the process list, it can no longer land. A
    session already gone costs one round trip; one still there a KILL and, usually,
    one more look.
    """
    for session in sessions:
        if (yield Statement(_sql.SESSION_ALIVE, {"id": session}, "row")) is None:
            continue  # it has ended already
        try:
            yield Statement(_sql.KILL_SESSION, {"id": session})
        except Exception as exc:
            code = error_code(exc)
            if code == _NOT_ITS_OWNER:  # another user's session: the server says no
                _log.warning("cannot end session %d cut off mid-statement: %s", session, exc)
                continue
            if code != _UNKNOWN_THREAD:
                raise
            continue  # it ended in between
        while (yield Statement(_sql.SESSION_ALIVE, {"id": session}, "row")) is not None:
            pass
