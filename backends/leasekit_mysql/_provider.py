"""``MySQLLeaseProvider``: leases in one MySQL or MariaDB table, one statement per operation.

Built on :mod:`leasekit.backend`: the toolkit's :class:`~leasekit.backend.BackendProvider`
carries the lifecycle, the deadline of every call and the error path; this module holds
the driver plumbing (asyncmy's pool, retries on a lost connection or a deadlock) and
the reading of replies. The statements and why they are atomic are in ``_sql``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeAlias, TypeVar

import asyncmy
from asyncmy import errors as driver_errors
from asyncmy.connection import Connection
from asyncmy.cursors import Cursor
from asyncmy.pool import Pool

from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
    LeaseProviderClosed,
    LeaseResult,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)
from leasekit.backend import (
    BackendProvider,
    Endpoint,
    ErrorMap,
    FifoGate,
    LeaseRecord,
    Option,
    OptionSet,
    parse_url,
    timeout_option,
)

from . import _sql

__all__ = ["MySQLClient", "MySQLLeaseProvider"]

MySQLClient: TypeAlias = Pool
"""What the provider runs on: an asyncmy pool (of autocommit connections)."""

_T = TypeVar("_T")
_Operation: TypeAlias = Callable[[Cursor], Awaitable[_T]]

_SCHEMES = ("mysql", "mariadb")
# [database.]table; 48 characters leave room for "_token_seq" within MySQL's 64.
_TABLE = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]{0,63}\.)?[A-Za-z_][A-Za-z0-9_]{0,47}")
_DENIED_RETRIES = 3
_ATTEMPTS = 3  # a deadlock victim runs again; a lost connection once more on a fresh one

# Driver error numbers (errno < 2000 come from the server, 2000 and up from the client).
_DEADLOCK = 1213
_NO_SUCH_TABLE = 1146
_LOST = frozenset({2006, 2013, 2055, 4031})  # gone away, lost during query, killed idle
_BY_CODE: dict[int, type[LeaseBackendError]] = {
    **dict.fromkeys((1040, 1044, 1045, 1049, 2003, 2005, 2026), LeaseBackendUnreachable),
    **dict.fromkeys((1205, 1969, 3024), LeaseBackendTimeout),  # lock wait, statement time
}

_log = logging.getLogger("leasekit.mysql")


def _check_table(table: str) -> str:
    if not _TABLE.fullmatch(table):
        rule = "must be [database.]table of letters, digits and _ (a table of at most 48)"
        raise InvalidLeaseArgument.for_argument("table", f"{rule}, got {table!r}", table)
    return table


def _check_tokens(tokens: str) -> str:
    if tokens != "auto" and tokens not in _sql.TOKEN_SOURCES:
        rule = f"must be auto, sequence or clock, got {tokens!r}"
        raise InvalidLeaseArgument.for_argument("tokens", rule, tokens)
    return tokens


_PROVIDER_OPTIONS = OptionSet(
    "mysql",
    [
        Option("table", str, _sql.DEFAULT_TABLE, check=_check_table),
        timeout_option(),
        Option("create_schema", bool, True),
        Option("tokens", str, "auto", check=_check_tokens),
        Option("sweep_every", int, 100, minimum=0),
        Option("sweep_batch", int, 1000, minimum=1),
        Option("sweep_grace_s", float, 600.0, above=0),
    ],
)
_URL_OPTIONS = OptionSet(
    "mysql",
    [
        *_PROVIDER_OPTIONS.options.values(),
        Option("pool_min_size", int, 1, minimum=0),
        Option("pool_max_size", int, 10, minimum=1),
        Option("charset", str, "utf8mb4"),
    ],
)


def _code(exc: BaseException) -> int | None:
    code = exc.args[0] if exc.args else None
    return code if isinstance(code, int) else None


class MySQLLeaseProvider(BackendProvider):
    """Leases in a MySQL (8.0+) or MariaDB (10.3+) InnoDB table.

    Pass your own ``asyncmy`` pool of autocommit connections (never closed by the
    provider), or use :meth:`from_url` / ``leasekit.connect("mysql://...")``,
    which builds a pool at first use and closes it in :meth:`aclose`.

    - ``table`` (default ``"leasekit_leases"``, or ``"database.table"``).
    - ``timeout_s`` (default 5) bounds every operation, waiting for a connection
      included.
    - ``create_schema`` (default true) creates the table on first use if missing;
      with false, run ``leasekit migrate URL`` (or :meth:`migrate`) first.
    - ``tokens``: where a new table draws fencing tokens from: ``sequence`` (MariaDB),
      ``clock`` (MySQL), or ``auto`` (default: by the server). An existing table
      keeps the source it was created with.
    - ``sweep_every``, ``sweep_batch``, ``sweep_grace_s``: every ``sweep_every``
      writes (0: never by itself) a background sweep deletes up to ``sweep_batch``
      rows expired more than ``sweep_grace_s`` ago (default 600, > ``timeout_s``).
    """

    backend = "mysql"
    capabilities = Capabilities(
        atomic_transfer=True,
        fencing=True,
        server_clock=True,  # microsecond resolution: ttl_resolution_ms=1, the default
        shared_across_processes=True,
        shared_across_hosts=True,
        persistent=True,
    )
    errors = ErrorMap({driver_errors.MySQLError: LeaseBackendError}, backend="mysql")

    def __init__(
        self,
        client: MySQLClient | None = None,
        *,
        pool_options: Mapping[str, Any] | None = None,
        close_client: bool = False,
        **options: Any,
    ) -> None:
        values = _PROVIDER_OPTIONS.parse(overrides=options).values
        if values["sweep_grace_s"] <= values["timeout_s"]:
            rule = "must be longer than timeout_s: fencing tokens need every statement done"
            raise InvalidLeaseArgument.for_argument("sweep_grace_s", rule, values["sweep_grace_s"])
        if not isinstance(client, Pool) if pool_options is None else client is not None:
            kind = f"{type(client).__module__}.{type(client).__qualname__}"
            rule = f"must be an asyncmy.pool.Pool (or None with pool_options), got {kind}"
            raise InvalidLeaseArgument.for_argument("client", rule)
        if client is not None and client.maxsize < 1:
            rule = "must allow at least one connection, got a pool of maxsize 0"
            raise InvalidLeaseArgument.for_argument("client", rule)
        super().__init__(timeout_s=values["timeout_s"], owns_client=client is None or close_client)
        self._pool: Pool | None = client
        self._pool_options = dict(pool_options or {})
        # asyncmy hands a freed connection to whoever asks next, and a task that checks
        # one in and at once out again asks before any waiter wakes: waiters starve for
        # all of timeout_s. Only a holder of the gate (the pool's size) asks the pool.
        self._gate: FifoGate | None = None if client is None else FifoGate(client.maxsize)
        name = values["table"].split(".")
        self._table = _sql.TableName(*name) if len(name) == 2 else _sql.TableName(None, name[0])
        self.table = str(self._table)
        self.create_schema: bool = values["create_schema"]
        self.tokens: str = values["tokens"]
        self.sweep_every: int = values["sweep_every"]
        self.sweep_batch: int = values["sweep_batch"]
        self.sweep_grace_s: float = values["sweep_grace_s"]
        self._ddl = _sql.Statements(self._table, _sql.TOKENS_SEQUENCE)
        self._sql: _sql.Statements | None = None  # set once the schema is known
        self._ready_lock = asyncio.Lock()
        self._pool_lock = asyncio.Lock()
        self._writes = 0
        self._sweeping = False

    @property
    def client(self) -> MySQLClient | None:
        """The pool the provider runs on (None before its own pool exists)."""
        return self._pool

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MySQLLeaseProvider:
        """Build a provider and its own pool from ``mysql://user:password@host:port/db``.

        ``mariadb://`` is the same. leasekit's options come from the query or keyword
        arguments (which win): the constructor's, plus ``pool_min_size`` (default 1),
        ``pool_max_size`` (10) and ``charset`` (``utf8mb4``). Anything unknown is an
        :class:`~leasekit.InvalidLeaseArgument`. No I/O happens here.
        """
        parsed = parse_url(url, schemes=_SCHEMES, default_port=3306)
        if len(parsed.endpoints) > 1:
            rule = f"takes one host, got {len(parsed.endpoints)} ({parsed.redacted!r})"
            raise InvalidLeaseArgument.for_argument("url", rule)
        values = _URL_OPTIONS.parse(parsed.query, options, url=url).values
        endpoint = parsed.endpoints[0] if parsed.endpoints else Endpoint("127.0.0.1", 3306)
        timeout_s = values["timeout_s"]
        pool_options = {
            "host": endpoint.host,
            "port": endpoint.port or 3306,
            "user": parsed.username or "root",
            "password": parsed.password or "",
            "database": parsed.path.strip("/") or None,
            "charset": values.pop("charset"),
            "autocommit": True,
            "minsize": values.pop("pool_min_size"),
            "maxsize": values.pop("pool_max_size"),
            "connect_timeout": max(1, math.ceil(timeout_s)),
            # A statement waiting on a row lock gives up on the server soon after the
            # client has: whole seconds, the only unit both servers take.
            "init_command": f"SET SESSION innodb_lock_wait_timeout = {math.ceil(timeout_s)}",
        }
        if pool_options["maxsize"] < pool_options["minsize"]:
            rule = "must be at least pool_min_size"
            raise InvalidLeaseArgument.for_argument("pool_max_size", rule, pool_options["maxsize"])
        return cls(pool_options=pool_options, **values)

    # -- connections: check out, run, retry, check in ----------------------------------

    async def _run(
        self,
        op: _Operation[_T],
        key: str | None = None,
        *,
        idempotent: bool = True,
        grant: str | None = None,
    ) -> _T:
        """One bounded call (the toolkit's deadline) of ``op`` on a ready connection."""
        return await self._call(self._use(op, key, idempotent=idempotent), key, grant)

    async def _use(
        self, op: _Operation[_T], key: str | None, *, idempotent: bool = True, ready: bool = True
    ) -> _T:
        """Run ``op`` on a cursor; retried after a deadlock, or a lost connection once."""
        if ready:
            await self._ensure_ready()
        for attempt in range(1, _ATTEMPTS + 1):
            conn: Connection | None = None
            healthy = False
            try:
                conn = await self._checkout()
                async with conn.cursor() as cursor:
                    result = await op(cursor)
                healthy = True
                return result
            except driver_errors.MySQLError as exc:
                code = _code(exc)
                healthy = code is not None and code < 2000  # the server answered
                retry = code == _DEADLOCK or (code in _LOST and idempotent and attempt == 1)
                if not retry or attempt == _ATTEMPTS:
                    raise self._translate(exc, key) from exc
                _log.info("retrying after %s", exc)
                if code in _LOST and self._pool is not None:
                    await self._pool.clear()  # its idle siblings are likely dead too
            finally:
                if conn is not None:
                    self._checkin(conn, healthy=healthy)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _checkout(self) -> Connection:
        """A connection, for callers in arrival order (within the operation's deadline)."""
        pool, gate = self._pool, self._gate
        if pool is None or gate is None:
            pool, gate = await self._open_pool()
        if not gate.try_acquire():
            await gate.acquire()
        try:
            return await pool.acquire()
        except RuntimeError:  # "Cannot acquire connection after closing pool"
            gate.release()
            raise LeaseProviderClosed(backend=self.backend) from None
        except BaseException:
            gate.release()
            raise

    async def _open_pool(self) -> tuple[Pool, FifoGate]:
        async with self._pool_lock:
            if self._pool is None:
                self._pool = await asyncmy.create_pool(**self._pool_options)
            if self._gate is None:
                self._gate = FifoGate(self._pool.maxsize)
            return self._pool, self._gate

    def _checkin(self, conn: Connection, *, healthy: bool) -> None:
        """Give ``conn`` back, or drop it if broken; then its place, to the next waiter."""
        try:
            if not healthy:
                conn.close()  # mid-statement (cancelled, lost): its protocol state is unknown
            if self._pool is not None:
                self._pool.release(conn)  # a closed connection leaves the pool here
        finally:
            if self._gate is not None:
                self._gate.release()

    def _translate(self, exc: driver_errors.MySQLError, key: str | None) -> LeaseBackendError:
        """The driver's error as leasekit's, classified by its error number."""
        error = self.errors.translate(exc, key=key, where=self._where())
        kind = _BY_CODE.get(_code(exc) or 0)
        return error if kind is None else kind(str(error), backend=self.backend, key=key)

    async def _ensure_ready(self) -> None:
        """Once per provider: read the table's meta (creating the schema if allowed)."""
        if self._sql is not None:
            return
        async with self._ready_lock:
            if self._sql is None:
                self._sql = await self._use(self._read_schema, None, ready=False)

    async def _read_schema(self, cursor: Cursor) -> _sql.Statements:
        try:
            await cursor.execute(self._ddl.meta)
        except driver_errors.ProgrammingError as exc:
            if _code(exc) != _NO_SUCH_TABLE:
                raise
            if not self.create_schema:
                fix = "run `leasekit migrate URL` as a user that may create it"
                raise self._schema_error(f"is missing (create_schema is off); {fix}") from None
            await self._migrate_on(cursor)
            await cursor.execute(self._ddl.meta)
        meta = {str(name): int(value) for name, value in await cursor.fetchall()}
        version, tokens = meta.get("schema_version", 0), meta.get("tokens", 0)
        if version > _sql.SCHEMA_VERSION:
            raise self._schema_error(f"has schema version {version}; upgrade leasekit")
        wanted = _sql.TOKEN_SOURCES.get(self.tokens)
        if tokens not in _sql.TOKEN_SOURCES.values() or wanted not in (None, tokens):
            raise self._schema_error(f"keeps the token source it was created with ({tokens})")
        return _sql.Statements(self._table, tokens)

    def _schema_error(self, problem: str) -> LeaseBackendError:
        return LeaseBackendError(f"table {self.table} {problem}", backend=self.backend)

    async def _migrate_on(self, cursor: Cursor) -> None:
        ddl = self._ddl
        await cursor.execute(ddl.existing, ddl.names)
        present = {str(name) for (name,) in await cursor.fetchall()}
        tokens = _sql.TOKEN_SOURCES.get(self.tokens)
        if tokens is None:
            await cursor.execute("SELECT VERSION()")
            row = await cursor.fetchone()
            mariadb = row is not None and "mariadb" in str(row[0]).lower()
            tokens = _sql.TOKENS_SEQUENCE if mariadb else _sql.TOKENS_CLOCK
        # Only what is missing: IF NOT EXISTS on an existing object leaves a note, which
        # the driver would fetch with SHOW WARNINGS (a round trip) and log.
        if ddl.names["table"] not in present:
            await cursor.execute(ddl.create_table)
        if tokens == _sql.TOKENS_SEQUENCE and ddl.names["seq"] not in present:
            await cursor.execute(ddl.create_sequence)
        if ddl.names["meta"] not in present:
            await cursor.execute(ddl.create_meta)
        await cursor.execute(ddl.record_meta, {"tokens": tokens})

    def _where(self) -> str:
        options = self._pool_options  # a caller's client: its address is the caller's to say
        server = f"server {options.get('host')}:{options.get('port')}, " if options else ""
        return f" ({server}table {self.table})"

    def _describe(self) -> str:
        return f"table={self.table!r}"

    async def _connect(self) -> None:
        await self._use(_nothing, None)

    async def _close_client(self) -> None:
        if self._pool is not None:
            self._pool.close()
            try:
                await self._pool.wait_closed()
            except BaseException:
                self._pool.terminate()  # the server stopped answering: drop the sockets
                raise

    # -- the contract -------------------------------------------------------------------

    async def _write(
        self, op: _Operation[_T], key: str, *, idempotent: bool = True, grant: str | None = None
    ) -> _T:
        if grant is not None and self._undos:
            await self._after_undo(key, grant)
        result = await self._run(op, key, idempotent=idempotent, grant=grant)
        if self.sweep_every and not self._sweeping:
            self._writes += 1
            if self._writes >= self.sweep_every:
                self._writes = 0
                self._sweeping = True
                self._spawn(self._sweep_in_background())
        return result

    def _statements(self) -> _sql.Statements:
        assert self._sql is not None  # _use() made sure
        return self._sql

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        params = {"key": key.encode(), "owner": owner.encode(), "ttl_us": ttl_ms * 1000}

        async def op(cursor: Cursor) -> LeaseResult:
            s = self._statements()
            for _ in range(_DENIED_RETRIES):
                await cursor.execute(s.acquire, params)
                if cursor.lastrowid:
                    return LeaseResult(True, owner, int(cursor.lastrowid))
                await cursor.execute(s.owner, params)
                row = await cursor.fetchone()
                if row is not None and bytes(row[0]) != params["owner"]:
                    return LeaseResult(False, bytes(row[0]).decode(), None)
                # Released, expired or handed to us since it denied us: acquire again.
            return LeaseResult(False, None, None)

        return await self._write(op, key, grant=owner)

    async def get_lease_owner(self, key: str) -> str | None:
        validate_key(key)
        params = {"key": key.encode()}

        owner = await self._run(self._scalar("owner", params), key)
        return None if owner is None else bytes(owner).decode()

    async def release_lease(self, key: str, owner: str) -> None:
        validate_key(key)
        validate_owner(owner)
        params = {"key": key.encode(), "owner": owner.encode()}
        await self._write(self._rowcount("release", params), key)

    async def release_grant(self, key: str, owner: str, token: int) -> None:
        """Release ``key`` if ``owner`` holds it with ``token`` (``SupportsReleaseGrant``).

        What the toolkit undoes a cancelled grant with when it read the grant's reply.
        """
        validate_key(key)
        validate_owner(owner)
        params = {"key": key.encode(), "owner": owner.encode(), "token": token}
        await self._write(self._rowcount("release_grant", params), key)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        params = {"key": key.encode(), "owner": owner.encode(), "ttl_us": ttl_ms * 1000}
        return await self._write(self._rowcount("renew", params), key) == 1

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        params = {"key": key.encode(), "from_owner": from_owner.encode(), "ttl_us": ttl_ms * 1000}
        params["to_owner"] = to_owner.encode()
        # Not retried on a lost connection: a transfer that ran before the connection
        # died would report False the second time.
        op = self._rowcount("transfer", params)
        grant = to_owner if to_owner != from_owner else None  # else a renewal
        return await self._write(op, key, idempotent=False, grant=grant) == 1

    def _scalar(self, statement: str, params: dict[str, Any] | None) -> _Operation[Any]:
        """``statement``'s first column of its first row, or None without a row."""

        async def op(cursor: Cursor) -> Any:
            await cursor.execute(getattr(self._statements(), statement), params)
            row = await cursor.fetchone()
            return None if row is None else row[0]

        return op

    def _rowcount(self, statement: str, params: dict[str, Any]) -> _Operation[int]:
        async def op(cursor: Cursor) -> int:
            return int(await cursor.execute(getattr(self._statements(), statement), params))

        return op

    # -- beyond the contract ------------------------------------------------------------

    async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases in key order, optionally only keys starting with ``prefix``."""
        if prefix is not None:
            validate_key(prefix, "prefix")
        limit = Option("limit", int, minimum=1).validate(limit)
        params: dict[str, Any] = {"limit": limit}
        if prefix is not None:
            low = prefix.encode()
            # UTF-8 never contains the byte 0xFF, so the last byte can always be raised.
            params.update(low=low, high=low[:-1] + bytes([low[-1] + 1]))

        async def op(cursor: Cursor) -> list[LeaseRecord]:
            s = self._statements()
            await cursor.execute(s.inspect_all if prefix is None else s.inspect_prefix, params)
            return [
                LeaseRecord(bytes(k).decode(), bytes(o).decode(), int(t), max(1, int(r)))
                for k, o, t, r in await cursor.fetchall()
            ]

        return await self._run(op, prefix)

    async def migrate(self) -> int:
        """Create the table, its meta table (and on MariaDB its sequence) if missing.

        Idempotent. For deployments whose application user may not run DDL: run this
        (``leasekit migrate URL``) once as a user that may, and grant the application
        ``SELECT, INSERT, UPDATE, DELETE`` on the table, ``SELECT`` on the meta table
        and, on MariaDB, ``SELECT, INSERT`` on the sequence. Returns the schema version.
        """

        async def op(cursor: Cursor) -> int:
            await self._migrate_on(cursor)
            self._sql = await self._read_schema(cursor)
            return _sql.SCHEMA_VERSION

        return await self._call(self._use(op, None, ready=False))

    async def sweep(self) -> int:
        """Delete one batch of rows that expired more than ``sweep_grace_s`` ago.

        Runs by itself every ``sweep_every`` writes; call it from a periodic job with
        ``sweep_every=0``. Returns how many rows were deleted.
        """
        grace_us = round(self.sweep_grace_s * 1_000_000)
        params: dict[str, Any] = {"grace_us": grace_us, "batch": self.sweep_batch}

        async def op(cursor: Cursor) -> int:
            s = self._statements()
            await cursor.execute(s.sweep_select, params)
            keys = [row[0] for row in await cursor.fetchall()]
            if not keys:
                return 0
            params.update({f"k{i}": key for i, key in enumerate(keys)})
            return int(await cursor.execute(s.sweep_delete(len(keys)), params))

        return await self._run(op)

    async def _sweep_in_background(self) -> None:
        try:
            deleted = await self.sweep()
        except (LeaseBackendError, LeaseProviderClosed) as exc:
            _log.debug("background sweep failed: %s", exc)
            deleted = 0
        finally:
            self._sweeping = False
        if deleted >= self.sweep_batch:
            self._writes = self.sweep_every  # a backlog: sweep again on the next write

    async def row_count(self) -> int:
        """Rows in the table, live and expired: what the sweep keeps bounded."""

        return int(await self._run(self._scalar("count_rows", None)))


async def _nothing(cursor: Cursor) -> None:
    return None
