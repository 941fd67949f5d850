"""Fencing guards: make the protected resource refuse writes that carry a stale token.

A fencing token only protects a resource if the resource itself rejects a write whose
token is lower than one it has already seen (Martin Kleppmann, "How to do distributed
locking"). leasekit issues the tokens (:attr:`leasekit.LeaseResult.token`,
:attr:`leasekit.LeaseHold.token`); the guards here are the rejecting side, each one
call atomic with the caller's own write:

- **SQL** (:func:`fence_postgres`, :func:`fence_postgres_sync`, :func:`fence_sqlite`,
  :func:`fence_mysql`): run inside the caller's own transaction, before its write. One
  conditional upsert on a small fence table records the token for the resource, or
  raises :class:`leasekit.StaleFencingToken` when a higher token is already recorded. The row
  lock orders competing writers, and the fence advances only if the caller's
  transaction commits. Create the table once with :func:`ensure_postgres_fence_table`
  (or its ``_sync`` twin) or :func:`ensure_mysql_fence_table`; :func:`fence_sqlite`
  creates its table on first use.
- **Redis** (:func:`fenced_redis_write`, :func:`fenced_redis_write_sync`): one Lua
  script checks the token and then runs the caller's write commands (``SET``,
  ``HSET``, ``DEL``, ``XADD``, ``EXPIRE``), so no other command runs in between.

Equal tokens pass: the holder of a lease writes as often as it likes. Resources are
named like lease keys (any non-empty ``str`` of at most 1024 UTF-8 bytes, NUL
included) and stored as UTF-8 bytes; tokens are ``int`` in ``1..2**63-1``. Bad input
raises :class:`leasekit.InvalidLeaseArgument` before anything is sent.

The guards run on the caller's own connection or client, inside the caller's own
transaction, so the driver's exceptions (a serialization failure to retry, a lost
connection) reach the caller unchanged, exactly as they would from its own write.

No driver is imported here: ``psycopg``, ``asyncmy`` and ``redis`` load only when a guard
that needs them is called (the caller has them imported already).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._contract import validate_key
from ._errors import InvalidLeaseArgument, StaleFencingToken

if TYPE_CHECKING:
    import asyncmy
    import asyncmy.cursors
    import psycopg
    import redis
    import redis.asyncio
    from psycopg import sql

__all__ = [
    "DEFAULT_FENCE_TABLE",
    "DEFAULT_REDIS_FENCE_PREFIX",
    "MAX_FENCING_TOKEN",
    "REDIS_COMMANDS",
    "ensure_mysql_fence_table",
    "ensure_postgres_fence_table",
    "ensure_postgres_fence_table_sync",
    "ensure_sqlite_fence_table",
    "fence_mysql",
    "fence_postgres",
    "fence_postgres_sync",
    "fence_sqlite",
    "fenced_redis_write",
    "fenced_redis_write_sync",
    "validate_token",
]

DEFAULT_FENCE_TABLE = "leasekit_fence"
"""The fence table's name, in PostgreSQL, SQLite and MySQL, unless ``table=`` says otherwise."""

DEFAULT_REDIS_FENCE_PREFIX = "leasekit-fence:"
"""The Redis fence key of ``resource`` is this prefix followed by ``resource``."""

MAX_FENCING_TOKEN = 2**63 - 1
"""The largest token a guard accepts: a signed 64-bit integer (``bigint``, ``INTEGER``)."""

REDIS_COMMANDS = frozenset({"SET", "HSET", "DEL", "XADD", "EXPIRE"})
"""The write commands :func:`fenced_redis_write` runs after the check."""

_MIN_SQLITE = (3, 24, 0)  # UPSERT (INSERT ... ON CONFLICT DO UPDATE ... WHERE)


# -- validation ------------------------------------------------------------------------------


def validate_token(token: object, argument: str = "token") -> int:
    """Check a fencing token and return it: an ``int`` (not ``bool``) in ``1..2**63-1``.

    Raises :class:`leasekit.InvalidLeaseArgument` naming ``argument``; a ``None`` token
    (from a backend without fencing) is refused with a hint.
    """
    if token is None:
        raise InvalidLeaseArgument.for_argument(
            argument,
            "must be an int, got None (connect with require='fencing' so every grant "
            "carries a token)",
            token,
        )
    if isinstance(token, bool) or not isinstance(token, int):
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be an int, got {type(token).__name__} {token!r}", token
        )
    if not 1 <= token <= MAX_FENCING_TOKEN:
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be between 1 and 2**63-1, got {token}", token
        )
    return int(token)


def _resource_bytes(resource: object) -> bytes:
    return validate_key(resource, "resource").encode("utf-8")


def _table_parts(table: object) -> tuple[str, ...]:
    """``"name"`` or ``"schema.name"``, each part non-empty and without NUL."""
    if not isinstance(table, str):
        raise InvalidLeaseArgument.for_argument(
            "table", f"must be a str, got {type(table).__name__}", table
        )
    parts = tuple(table.split("."))
    if len(parts) > 2 or not all(parts) or "\0" in table:
        raise InvalidLeaseArgument.for_argument(
            "table", "must be 'name' or 'schema.name', without NUL", table
        )
    return parts


# -- SQL: one conditional upsert -------------------------------------------------------------
#
# The statements, for a fence table ``fence`` (resource, token), with parameters
# (resource, token):
#
#     INSERT INTO fence AS f (resource, token) VALUES (:resource, :token)
#     ON CONFLICT (resource) DO UPDATE SET token = excluded.token
#     WHERE f.token <= excluded.token
#
# Why it is atomic: the upsert finds the resource's row and decides under that row's
# write lock (PostgreSQL's row lock; SQLite's single write lock), so no other writer's
# token can land between the comparison and the update. A competing transaction's
# upsert of the same resource waits for the lock; under READ COMMITTED, PostgreSQL then
# re-evaluates the WHERE against the row as the winner committed it, so an older token
# that arrives second is refused, and a newer one goes through. The lock is held until
# the caller's transaction ends, so the caller's own write (after the guard, in the same
# transaction) is ordered by it too; and a rolled-back transaction rolls the fence back.
# The WHERE fails only on a stale token: then nothing is written and the statement
# reports no row (PostgreSQL: no RETURNING row; SQLite: zero changes), and a second
# read fetches the current token for the error message.


def _quoted(parts: tuple[str, ...], quote: str) -> str:
    """A dotted table name with each part quoted (the quote doubled inside), so any name
    is safe: the table name is the only text of the statements not passed as a
    parameter. SQLite quotes with ``"``, MySQL and MariaDB with a backquote."""
    return ".".join(quote + part.replace(quote, quote * 2) + quote for part in parts)


@dataclass(frozen=True, slots=True)
class _SQLiteStatements:
    create: str
    fence: str
    current: str


@functools.lru_cache(maxsize=64)
def _sqlite_statements(parts: tuple[str, ...]) -> _SQLiteStatements:
    table = _quoted(parts, '"')
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


# The PostgreSQL guard is written once, as the steps to take ("run this, tell me the row
# it returned"), and driven by a blocking or an asyncio cursor below.
_Step = tuple["sql.Composed", tuple[Any, ...]]
_Steps = Generator[_Step, tuple[Any, ...] | None, None]


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

    raw = _resource_bytes(resource)
    token = validate_token(token)
    parts = _table_parts(table)
    if isinstance(conn, psycopg.AsyncConnection):
        _check_postgres_transaction(conn)
        async with conn.cursor() as cursor:
            await _drive_async(_postgres_steps(resource, raw, token, parts), cursor)
    else:
        _check_postgres_transaction(conn.connection)
        await _drive_async(_postgres_steps(resource, raw, token, parts), conn)


async def _drive_async(steps: _Steps, cursor: psycopg.AsyncCursor[Any]) -> None:
    query, params = next(steps)
    while True:
        await cursor.execute(query, params)
        row = await cursor.fetchone()
        try:
            query, params = steps.send(row)
        except StopIteration:
            return


def fence_postgres_sync(
    conn: psycopg.Connection[Any] | psycopg.Cursor[Any],
    resource: str,
    token: int,
    *,
    table: str = DEFAULT_FENCE_TABLE,
) -> None:
    """The blocking :func:`fence_postgres`, for a ``psycopg.Connection`` or cursor."""
    import psycopg  # noqa: PLC0415

    raw = _resource_bytes(resource)
    token = validate_token(token)
    parts = _table_parts(table)
    if isinstance(conn, psycopg.Connection):
        _check_postgres_transaction(conn)
        with conn.cursor() as cursor:
            _drive_sync(_postgres_steps(resource, raw, token, parts), cursor)
    else:
        _check_postgres_transaction(conn.connection)
        _drive_sync(_postgres_steps(resource, raw, token, parts), conn)


def _drive_sync(steps: _Steps, cursor: psycopg.Cursor[Any]) -> None:
    query, params = next(steps)
    while True:
        cursor.execute(query, params)
        row = cursor.fetchone()
        try:
            query, params = steps.send(row)
        except StopIteration:
            return


_DUPLICATE_DDL = ("UniqueViolation", "DuplicateTable", "DuplicateObject")


async def ensure_postgres_fence_table(
    conn: psycopg.AsyncConnection[Any], *, table: str = DEFAULT_FENCE_TABLE
) -> None:
    """Create the fence table if it does not exist (idempotent): run it once at deploy.

    It runs in a transaction of its own, or a savepoint of yours if one is open; two
    processes creating the table at the same moment both succeed.
    """
    import psycopg  # noqa: PLC0415

    statement = _postgres_statements(_table_parts(table)).create
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

    statement = _postgres_statements(_table_parts(table)).create
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


# -- SQLite ----------------------------------------------------------------------------------


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
    conn.execute(_sqlite_statements(_table_parts(table)).create)


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
    raw = _resource_bytes(resource)
    token = validate_token(token)
    statements = _sqlite_statements(_table_parts(table))
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
    table = _quoted(parts, "`")
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

    raw = _resource_bytes(resource)
    token = validate_token(token)
    statement = _mysql_statements(_table_parts(table)).fence
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
    parts = _table_parts(table)
    statements = _mysql_statements(parts)
    names = {"database": parts[0] if len(parts) == 2 else None, "table": parts[-1]}
    async with conn.cursor() as cursor:
        # Only when missing: IF NOT EXISTS on an existing table leaves a note, which the
        # driver would fetch (a round trip) and log as a warning.
        await cursor.execute(statements.existing, names)
        if await cursor.fetchone() is None:
            await cursor.execute(statements.create)


# -- Redis: one Lua script ------------------------------------------------------------------
#
# KEYS[1]     the fence key, holding the highest token seen as a decimal string
# KEYS[2..]   the keys of the commands, in order
# ARGV[1]     the caller's token, a decimal string without leading zeros
# ARGV[2]     the number of commands; then, per command: its name, its number of keys
#             (taken in order from KEYS), its number of other arguments, the arguments
#
# Why it is atomic: Redis runs a script without interleaving any other command, so
# the comparison with the fence, the caller's writes and the fence's update are one
# step. The script checks every command name against the allowed set and the token
# against the fence before its first write, so a refused call writes nothing. Tokens
# are compared as decimal strings (longer is larger, then digit by digit; not with
# Lua's string "<", which follows the server's locale), never as Lua numbers, which are
# doubles and lose exactness above 2**53. The fence key has no TTL.
# If a command fails (a WRONGTYPE, say), the script stops there: Redis has no rollback,
# so earlier commands of the same call stay written, and the fence is not advanced.
_REDIS_FENCED_WRITE = """
local allowed = {SET = true, HSET = true, DEL = true, XADD = true, EXPIRE = true}
local function greater(a, b)
  if #a ~= #b then return #a > #b end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return false
end
local token = ARGV[1]
local count = tonumber(ARGV[2])
local commands = {}
local a, k = 3, 2
for i = 1, count do
  local name = ARGV[a]
  if not allowed[name] then
    return redis.error_reply('ERR leasekit fence: command not allowed: ' .. tostring(name))
  end
  local nkeys, nargs = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  local command = {name}
  for _ = 1, nkeys do command[#command + 1] = KEYS[k]; k = k + 1 end
  for _ = 1, nargs do command[#command + 1] = ARGV[a]; a = a + 1 end
  commands[i] = command
end
local current = redis.call('GET', KEYS[1])
if current and greater(current, token) then
  return {0, current}
end
local replies = {1, token}
for i = 1, count do
  replies[#replies + 1] = redis.call(unpack(commands[i]))
end
redis.call('SET', KEYS[1], token)
return replies
"""


@functools.lru_cache(maxsize=1)
def _redis_script_sha() -> str:
    import hashlib  # noqa: PLC0415

    return hashlib.sha1(_REDIS_FENCED_WRITE.encode(), usedforsecurity=False).hexdigest()


_RedisValue = str | bytes | int | float


@dataclass(frozen=True, slots=True)
class _RedisRequest:
    """What to send: the script's KEYS and ARGV, built and checked before any I/O."""

    resource: str
    token: int
    keys: tuple[_RedisValue, ...]
    args: tuple[_RedisValue, ...]


def _redis_argument(value: object, where: str) -> _RedisValue:
    if isinstance(value, bool) or not isinstance(value, str | bytes | int | float):
        raise InvalidLeaseArgument.for_argument(
            "commands",
            f"{where} must be str, bytes, int or float, got {type(value).__name__}",
            value,
        )
    return value


# Per command: the fewest arguments after the name, and whether they must pair up
# (HSET's field/value pairs); every argument of DEL is a key, the others take one key.
_ARITY = {"SET": 2, "HSET": 3, "DEL": 1, "XADD": 4, "EXPIRE": 2}


def _redis_request(
    resource: object, token: object, commands: object, prefix: object
) -> _RedisRequest:
    raw = _resource_bytes(resource)
    token = validate_token(token)
    if not isinstance(prefix, str | bytes):
        raise InvalidLeaseArgument.for_argument("prefix", "must be str or bytes", prefix)
    if isinstance(commands, str | bytes) or not isinstance(commands, Sequence) or not commands:
        raise InvalidLeaseArgument.for_argument(
            "commands", "must be a non-empty list of command tuples such as ('SET', key, value)"
        )
    fence_key = (prefix.encode("utf-8") if isinstance(prefix, str) else prefix) + raw
    keys: list[_RedisValue] = [fence_key]
    args: list[_RedisValue] = [str(token), str(len(commands))]
    for index, command in enumerate(commands):
        where = f"command {index}"
        if isinstance(command, str | bytes) or not isinstance(command, Sequence) or not command:
            raise InvalidLeaseArgument.for_argument(
                "commands", f"{where} must be a tuple such as ('SET', key, value)", command
            )
        name = command[0]
        if not isinstance(name, str) or name.upper() not in REDIS_COMMANDS:
            raise InvalidLeaseArgument.for_argument(
                "commands",
                f"{where}: {name!r} is not one of {', '.join(sorted(REDIS_COMMANDS))}",
                command,
            )
        name = name.upper()
        rest = [_redis_argument(v, f"{where} ({name}) argument") for v in command[1:]]
        if len(rest) < _ARITY[name] or (name == "HSET" and len(rest) % 2 == 0):
            raise InvalidLeaseArgument.for_argument(
                "commands", f"{where}: wrong number of arguments for {name}", command
            )
        if name == "EXPIRE" and len(rest) > 3:
            raise InvalidLeaseArgument.for_argument(
                "commands", f"{where}: wrong number of arguments for EXPIRE", command
            )
        nkeys = len(rest) if name == "DEL" else 1
        for key in rest[:nkeys]:
            if not isinstance(key, str | bytes):
                raise InvalidLeaseArgument.for_argument(
                    "commands", f"{where} ({name}): a key must be str or bytes", command
                )
        keys.extend(rest[:nkeys])
        args.extend((name, str(nkeys), str(len(rest) - nkeys), *rest[nkeys:]))
    return _RedisRequest(resource=str(resource), token=token, keys=tuple(keys), args=tuple(args))


def _redis_replies(request: _RedisRequest, reply: Any) -> list[Any]:
    if int(reply[0]) == 1:
        return list(reply[2:])
    raise StaleFencingToken(resource=request.resource, token=request.token, current=int(reply[1]))


async def fenced_redis_write(
    client: redis.asyncio.Redis | redis.asyncio.RedisCluster,
    resource: str,
    token: int,
    commands: Sequence[Sequence[Any]],
    *,
    prefix: str | bytes = DEFAULT_REDIS_FENCE_PREFIX,
) -> list[Any]:
    """Run ``commands`` atomically if ``token`` is not stale for ``resource``.

    ``commands`` is a list of write commands, each a tuple of its name and arguments:
    ``("SET", key, value, ...)``, ``("HSET", key, field, value, ...)``, ``("DEL", key,
    ...)``, ``("XADD", key, id, field, value, ...)``, ``("EXPIRE", key, seconds)``. One
    Lua script compares ``token`` with the highest token recorded for ``resource`` (in
    the key ``prefix + resource``), runs the commands and records the token, with no
    other command in between; equal tokens pass. Returns the commands' replies.

    Raises :class:`leasekit.StaleFencingToken`, with nothing written, if a higher
    token was recorded; :class:`leasekit.InvalidLeaseArgument`, before any I/O, for a
    command outside that set or malformed input. On Redis Cluster every key, the fence
    key included, must hash to one slot: give them one hash tag (``resource="{inv-7}"``,
    keys ``"{inv-7}:status"``).
    """
    from redis.exceptions import NoScriptError  # noqa: PLC0415

    request = _redis_request(resource, token, commands, prefix)
    numkeys = len(request.keys)
    try:
        reply = await client.execute_command(
            "EVALSHA", _redis_script_sha(), numkeys, *request.keys, *request.args
        )
    except NoScriptError:
        # The server's script cache is empty (a restart, SCRIPT FLUSH): EVAL runs the
        # script and caches it again, so EVALSHA works next time.
        reply = await client.execute_command(
            "EVAL", _REDIS_FENCED_WRITE, numkeys, *request.keys, *request.args
        )
    return _redis_replies(request, reply)


def fenced_redis_write_sync(
    client: redis.Redis | redis.RedisCluster,
    resource: str,
    token: int,
    commands: Sequence[Sequence[Any]],
    *,
    prefix: str | bytes = DEFAULT_REDIS_FENCE_PREFIX,
) -> list[Any]:
    """The blocking :func:`fenced_redis_write`, for a ``redis.Redis`` client."""
    from redis.exceptions import NoScriptError  # noqa: PLC0415

    request = _redis_request(resource, token, commands, prefix)
    numkeys = len(request.keys)
    try:
        reply = client.execute_command(  # type: ignore[no-untyped-call]
            "EVALSHA", _redis_script_sha(), numkeys, *request.keys, *request.args
        )
    except NoScriptError:
        reply = client.execute_command(  # type: ignore[no-untyped-call]
            "EVAL", _REDIS_FENCED_WRITE, numkeys, *request.keys, *request.args
        )
    return _redis_replies(request, reply)
