"""``PostgresLeaseProvider``: leases in one PostgreSQL table, one statement per operation.

Every lease operation is one statement (``_sql``) on an autocommit connection: one round
trip, one transaction, decided by the server under the key's row lock on the server's
clock. No session state is used (no advisory locks, temporary tables, ``SET``, or
prepared statements unless asked for), so any connection of a pool, or of a
transaction-mode pgbouncer, serves any call.

Each call runs in a task of its own that the caller awaits for at most ``timeout_s``.
Psycopg answers a cancelled query by sending the server a cancel request and waiting
for the query to end, which a frozen or unreachable server can draw out; the caller
never waits for that: a late call is abandoned (cancelled, finishing in the
background) and the caller gets :class:`~leasekit.LeaseBackendError` on time. The
task hands its outcome to a future the caller awaits, and one timer per provider
(``_Deadlines``) fails that future at the deadline: no per-call timer or
``asyncio.wait``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeAlias, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg.errors
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseError,
    LeaseProviderClosed,
    LeaseResult,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)

from . import _sql

__all__ = ["LeaseRecord", "PostgresClient", "PostgresLeaseProvider"]

PostgresClient: TypeAlias = AsyncConnectionPool[Any] | psycopg.AsyncConnection[Any]
"""What the provider runs on: a psycopg_pool async pool, or one async connection."""

_T = TypeVar("_T")
_Operation: TypeAlias = Callable[[psycopg.AsyncConnection[Any]], Awaitable[_T]]

_BACKEND = "postgresql"
_SCHEMES = ("postgresql", "postgres")
_DEFAULT_TIMEOUT_S = 5.0
_DEFAULT_SWEEP_EVERY = 100
_DEFAULT_SWEEP_BATCH = 1000
_DEFAULT_SWEEP_GRACE_S = 600.0
_DEFAULT_POOL_MIN_SIZE = 1
_DEFAULT_POOL_MAX_SIZE = 10
_PROVIDER_OPTIONS = (
    "table",
    "timeout_s",
    "create_schema",
    "sweep_every",
    "sweep_batch",
    "sweep_grace_s",
)
_POOL_OPTIONS = ("pool_min_size", "pool_max_size", "prepare_threshold", "server_timeout")
_OPTIONS = _PROVIDER_OPTIONS + _POOL_OPTIONS
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_TABLE_CHARS = 48  # leaves room for the derived names ("_token_seq") within 63 bytes
_DENIED_RETRIES = 3

_log = logging.getLogger("leasekit.postgres")


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One live lease, as ``inspect`` reports it."""

    key: str
    owner: str
    token: int
    remaining_ms: int


class PostgresLeaseProvider:
    """Leases in a PostgreSQL table: one conditional statement per operation.

    Pass your own ``psycopg_pool.AsyncConnectionPool`` or ``psycopg.AsyncConnection``
    (which the provider never closes), or use :meth:`from_url` /
    ``leasekit.connect("postgresql://...")``, which builds a pool of autocommit
    connections and closes it in :meth:`aclose`.

    - ``table`` (default ``"leasekit_leases"``, or ``"schema.table"``) names the lease
      table; its sequence and meta table take it as a prefix.
    - ``timeout_s`` (default 5) bounds every operation, end to end, waiting for a
      connection included: a stalled or unreachable server raises
      :class:`~leasekit.LeaseBackendError`, never hangs.
    - ``create_schema`` (default true) creates the table on first use if it is missing;
      with false, run ``leasekit migrate URL`` (or :meth:`migrate`) first.
    - ``sweep_every``, ``sweep_batch``, ``sweep_grace_s``: every ``sweep_every`` writes
      (0: never by itself) a background statement deletes up to ``sweep_batch`` rows
      that expired more than ``sweep_grace_s`` ago (default 600, longer than
      ``timeout_s``).

    Fencing tokens come from a sequence and survive restarts; the table is persistent.
    A caller's pool or connection is used as it is (open it first); pass
    ``close_client=True`` to have :meth:`aclose` close it too.
    """

    capabilities = Capabilities(
        atomic_transfer=True,
        fencing=True,
        ttl_resolution_ms=1,
        min_ttl_ms=1,
        server_clock=True,
        shared_across_processes=True,
        shared_across_hosts=True,
        persistent=True,
    )

    def __init__(
        self,
        client: PostgresClient,
        *,
        table: str = _sql.DEFAULT_TABLE,
        timeout_s: float = _DEFAULT_TIMEOUT_S,
        create_schema: bool = True,
        sweep_every: int = _DEFAULT_SWEEP_EVERY,
        sweep_batch: int = _DEFAULT_SWEEP_BATCH,
        sweep_grace_s: float = _DEFAULT_SWEEP_GRACE_S,
        close_client: bool = False,
    ) -> None:
        self._pool: AsyncConnectionPool[Any] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        if isinstance(client, AsyncConnectionPool):
            self._pool = client
        elif isinstance(client, psycopg.AsyncConnection):
            if not client.autocommit:
                raise InvalidLeaseArgument.for_argument(
                    "client",
                    "the connection must be in autocommit mode (connect with "
                    "autocommit=True): each lease operation is its own transaction",
                )
            self._conn = client
        else:
            raise InvalidLeaseArgument.for_argument(
                "client",
                "must be a psycopg_pool.AsyncConnectionPool or a psycopg.AsyncConnection "
                f"(asyncio), got {type(client).__module__}.{type(client).__qualname__}",
            )
        self._table = _check_table(table)
        self.table = str(self._table)
        self.timeout_s = _check_timeout(timeout_s)
        self.create_schema = _check_bool("create_schema", create_schema)
        self.sweep_every = _check_int("sweep_every", sweep_every, minimum=0)
        self.sweep_batch = _check_int("sweep_batch", sweep_batch, minimum=1)
        self.sweep_grace_s = _check_grace(sweep_grace_s, self.timeout_s)
        self._sql = _sql.Statements(self._table)
        self._close_client = bool(close_client)
        self._closed = False
        self._ready = False
        self._ready_lock = asyncio.Lock()
        self._writes = 0
        self._sweeper: asyncio.Task[None] | None = None
        self._abandoned: set[asyncio.Task[Any]] = set()
        self._deadlines = _Deadlines(self.timeout_s)

    @property
    def client(self) -> PostgresClient:
        """The pool or connection the provider runs on (the caller's, or the one it built)."""
        if self._pool is not None:
            return self._pool
        assert self._conn is not None
        return self._conn

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresLeaseProvider:
        """Build a provider and its own connection pool from a ``postgresql://`` URL.

        The URL is libpq's (``postgresql://user:password@host:port/dbname``), whose query
        may carry libpq parameters (``sslmode``, ``application_name``, ``options``, ...).
        leasekit's options come from the query or from keyword arguments, which win:
        those of the constructor, plus ``pool_min_size`` (default 1) and
        ``pool_max_size`` (default 10), ``prepare_threshold`` (default none: psycopg
        never prepares statements, as pgbouncer's transaction mode needs) and
        ``server_timeout`` (default true: connections carry ``statement_timeout`` =
        ``timeout_s`` in their startup options). Anything unknown is an
        :class:`~leasekit.InvalidLeaseArgument`. No I/O happens here.
        """
        if not isinstance(url, str):
            raise InvalidLeaseArgument.for_argument(
                "url", f"must be a str, got {type(url).__name__}"
            )
        parts = urlsplit(url)
        if parts.scheme.lower() not in _SCHEMES:
            raise InvalidLeaseArgument.for_argument(
                "url", f"must start with postgresql:// or postgres://, got {_redact(url)!r}"
            )
        try:
            parts.port  # noqa: B018 (validates it: libpq would only complain when connecting)
        except ValueError as exc:
            raise InvalidLeaseArgument.for_argument("url", f"{exc} ({_redact(url)!r})") from None
        ours: dict[str, Any] = {}
        driver: list[tuple[str, str]] = []
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name in _OPTIONS:
                ours[name] = _coerce_option(name, value)
            else:
                driver.append((name, value))
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise InvalidLeaseArgument.for_argument(
                "options",
                f"unknown postgresql option(s) {', '.join(unknown)}; known: "
                f"{', '.join(_OPTIONS)} (libpq parameters go in the URL's query; or pass "
                "your own pool as PostgresLeaseProvider(pool))",
            )
        ours.update(options)
        pool_min_size = _check_int(
            "pool_min_size", ours.pop("pool_min_size", _DEFAULT_POOL_MIN_SIZE), minimum=0
        )
        pool_max_size = _check_int(
            "pool_max_size", ours.pop("pool_max_size", _DEFAULT_POOL_MAX_SIZE), minimum=1
        )
        if pool_max_size < pool_min_size:
            raise InvalidLeaseArgument.for_argument(
                "pool_max_size",
                f"must be at least pool_min_size ({pool_min_size}), got {pool_max_size}",
            )
        prepare_threshold = _check_prepare_threshold(ours.pop("prepare_threshold", None))
        server_timeout = _check_bool("server_timeout", ours.pop("server_timeout", True))
        # Check the provider's own options before the pool exists, so a bad one leaks nothing.
        _check_table(ours.get("table", _sql.DEFAULT_TABLE))
        timeout_s = _check_timeout(ours.get("timeout_s", _DEFAULT_TIMEOUT_S))
        _check_bool("create_schema", ours.get("create_schema", True))
        _check_int("sweep_every", ours.get("sweep_every", _DEFAULT_SWEEP_EVERY), minimum=0)
        _check_int("sweep_batch", ours.get("sweep_batch", _DEFAULT_SWEEP_BATCH), minimum=1)
        _check_grace(ours.get("sweep_grace_s", _DEFAULT_SWEEP_GRACE_S), timeout_s)

        driver_url = urlunsplit(parts._replace(query=urlencode(driver, quote_via=quote)))
        try:
            params = conninfo_to_dict(driver_url)
        except psycopg.Error as exc:
            raise InvalidLeaseArgument.for_argument("url", f"{exc} ({_redact(url)!r})") from None
        if server_timeout:
            # A startup option, not a SET: it holds for the whole connection without any
            # session state, and the server cancels a statement stuck past timeout_s.
            timeout_ms = max(1, math.ceil(timeout_s * 1000))
            extra = f"-c statement_timeout={timeout_ms}"
            params["options"] = f"{params.get('options', '')} {extra}".strip()
        params.setdefault("connect_timeout", str(max(2, math.ceil(timeout_s))))
        params.setdefault("fallback_application_name", "leasekit")
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            make_conninfo("", **params),
            kwargs={"autocommit": True, "prepare_threshold": prepare_threshold},
            min_size=pool_min_size,
            max_size=pool_max_size,
            timeout=timeout_s,
            name="leasekit",
            open=False,
        )
        return cls(pool, close_client=True, **ours)

    # -- one call: bounded, retried once on a lost connection, translated ---------------

    async def _run(
        self,
        op: _Operation[_T],
        key: str | None,
        *,
        write: bool = False,
        idempotent: bool = True,
        check_schema: bool = True,
    ) -> _T:
        if self._closed:
            raise LeaseProviderClosed(backend=_BACKEND)
        loop = asyncio.get_running_loop()
        call: _Call[_T] = _Call(loop.create_future())
        task = loop.create_task(
            self._attempt(op, call, idempotent=idempotent, check_schema=check_schema)
        )
        self._deadlines.start(loop, call)
        try:
            result = await call.waiter
        except _Overdue:
            self._abandon(task)
            # Without a connection, psycopg_pool logs why connecting failed ("psycopg.pool").
            what = "no answer from the server" if call.connected else "no connection to the server"
            raise LeaseBackendError(
                f"{what} within {self.timeout_s:g} s{self._where()}", backend=_BACKEND, key=key
            ) from None
        except (psycopg.Error, OSError) as exc:
            raise self._translate(exc, key) from exc
        except BaseException:
            if not task.done():
                self._abandon(task)  # the caller was cancelled: so is the call
            raise
        finally:
            call.closed = True
        if write and self.sweep_every:
            self._writes += 1
            if self._writes >= self.sweep_every and self._sweeper is None:
                self._writes = 0
                self._sweeper = loop.create_task(self._sweep_in_background())
        return result

    def _translate(self, exc: psycopg.Error | OSError, key: str | None) -> LeaseError:
        """The one place where driver errors become leasekit's."""
        if isinstance(exc, PoolClosed) and self._closed:
            return LeaseProviderClosed(backend=_BACKEND)
        if isinstance(exc, PoolTimeout):
            what = "no connection available"
        elif isinstance(exc, psycopg.errors.QueryCanceled):
            what = "the server cancelled the statement"
        else:
            what = type(exc).__name__
        lines = str(exc).strip().splitlines()
        detail = f": {lines[0]}" if lines else ""
        return LeaseBackendError(f"{what}{detail}{self._where()}", backend=_BACKEND, key=key)

    def _abandon(self, task: asyncio.Task[Any]) -> None:
        """Cancel a call nobody waits for any more and let it finish in the background."""
        task.cancel()
        self._abandoned.add(task)
        task.add_done_callback(self._abandoned.discard)
        task.add_done_callback(_consume_outcome)

    async def _attempt(
        self, op: _Operation[_T], call: _Call[_T], *, idempotent: bool, check_schema: bool
    ) -> None:
        """Run ``op`` on a connection and hand its outcome to ``call.waiter``."""
        waiter = call.waiter
        try:
            if not self._ready:
                await self._ensure_ready(call, check_schema=check_schema)
            result = await self._on_connection(op, call, idempotent=idempotent)
        except asyncio.CancelledError:
            waiter.cancel()  # abandoned: the caller has had its answer (or was cancelled)
            raise
        except Exception as exc:  # noqa: BLE001 (handed to the caller, who raises it)
            if not waiter.done():
                waiter.set_exception(exc)
        else:
            if not waiter.done():
                waiter.set_result(result)

    async def _on_connection(self, op: _Operation[_T], call: _Call[Any], *, idempotent: bool) -> _T:
        retried = False
        while True:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                if self._pool is None:
                    conn = self._own_connection()
                    call.connected = True
                    return await op(conn)
                # The pool's context commits if a caller's pool hands out a connection
                # that is not in autocommit mode (one round trip more), and replaces
                # broken ones.
                async with self._pool.connection() as conn:
                    call.connected = True
                    return await op(conn)
            except psycopg.OperationalError as exc:
                lost = conn is not None and (conn.closed or conn.broken)
                if retried or not idempotent or not lost or self._pool is None:
                    raise
                # The connection died (server restart, pg_terminate_backend, a proxy
                # dropping idle links): its idle siblings likely too. Let the pool test
                # and replace them, then run the operation once more. The first attempt
                # may or may not have run; every retried operation is idempotent.
                _log.info("connection lost (%s); retrying once on a fresh one", exc)
                retried = True
                call.connected = False
                await self._pool.check()

    def _own_connection(self) -> psycopg.AsyncConnection[Any]:
        """The caller's single connection, still in autocommit mode."""
        conn = self._conn
        assert conn is not None
        if not conn.autocommit:
            raise LeaseBackendError(
                "the connection left autocommit mode; leasekit needs it on",
                backend=_BACKEND,
            )
        return conn

    async def _ensure_ready(self, call: _Call[Any], *, check_schema: bool) -> None:
        """Open the pool we built, and once per provider check (or create) the schema."""
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            if self._close_client and self._pool is not None:
                await self._pool.open()
            if not check_schema:
                return
            if self._pool is None:
                await self._check_schema(self._own_connection(), call)
            else:
                async with self._pool.connection() as conn:
                    await self._check_schema(conn, call)
            self._ready = True

    async def _check_schema(self, conn: psycopg.AsyncConnection[Any], call: _Call[Any]) -> None:
        """Create the schema if it is missing (and allowed); refuse a newer one."""
        call.connected = True
        version = await self._schema_version(conn)
        if version == _sql.SCHEMA_VERSION:
            return
        if version is not None and version > _sql.SCHEMA_VERSION:
            raise LeaseBackendError(
                f"table {self.table} has schema version {version}, newer than "
                f"this leasekit's ({_sql.SCHEMA_VERSION}); upgrade leasekit",
                backend=_BACKEND,
            )
        if not self.create_schema:
            raise LeaseBackendError(
                f"table {self.table} is missing or outdated (create_schema is "
                "off); run `leasekit migrate URL` as a role that may create it",
                backend=_BACKEND,
            )
        await self._migrate_on(conn)

    async def _schema_version(self, conn: psycopg.AsyncConnection[Any]) -> int | None:
        try:
            row = await (await conn.execute(self._sql.schema_version)).fetchone()
        except psycopg.errors.UndefinedTable:
            await _end_failed_transaction(conn)
            return None
        return None if row is None else int(row[0])

    async def _migrate_on(self, conn: psycopg.AsyncConnection[Any]) -> None:
        attempts = 3
        for attempt in range(1, attempts + 1):
            try:
                await conn.execute(self._sql.migrate, prepare=False)  # several commands
            except (  # noqa: PERF203 (the retry loop is the point)
                psycopg.errors.UniqueViolation,
                psycopg.errors.DuplicateTable,
                psycopg.errors.DuplicateObject,
            ):
                # Another process created the same objects at the same moment; its
                # transaction has committed now, so IF NOT EXISTS sees them next time.
                await _end_failed_transaction(conn)
                if attempt == attempts:
                    raise
            else:
                return

    def _where(self) -> str:
        server = self._server()
        return f" (server {server}, table {self.table})" if server else f" (table {self.table})"

    def _server(self) -> str:
        """``host:port/dbname`` of the server, for messages (never the password)."""
        try:
            if self._pool is not None:
                conninfo = self._pool.conninfo
                if not isinstance(conninfo, str):
                    return ""  # a callable that computes it (psycopg_pool >= 3.3)
                params = conninfo_to_dict(conninfo)
                host, port = params.get("host", "localhost"), params.get("port", "5432")
                dbname = params.get("dbname", "")
            else:
                assert self._conn is not None
                info = self._conn.info
                host, port, dbname = info.host, info.port, info.dbname
        except (psycopg.Error, ValueError):
            return ""
        return f"{host}:{port}/{dbname}"

    # -- the contract -------------------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        params = {"key": key.encode(), "owner": owner.encode(), "ttl_ms": ttl_ms}

        async def op(conn: psycopg.AsyncConnection[Any]) -> LeaseResult:
            for _ in range(_DENIED_RETRIES):
                token, holder = await _one(conn, self._sql.acquire, params)
                if token is not None:
                    return LeaseResult(True, owner, int(token))
                if holder is None:
                    # The row that denied us is newer than the statement's snapshot (two
                    # acquirers raced for a brand-new key), or it expired since: ask again.
                    row = await _optional(conn, self._sql.owner, params)
                    holder = None if row is None else row[0]
                if holder is None:
                    return LeaseResult(False, None, None)
                if bytes(holder) != params["owner"]:
                    return LeaseResult(False, bytes(holder).decode(), None)
                # The key was handed to us between the two reads: acquire again, which
                # now finds our own lease.
            return LeaseResult(False, None, None)

        return await self._run(op, key, write=True)

    async def get_lease_owner(self, key: str) -> str | None:
        validate_key(key)
        params = {"key": key.encode()}

        async def op(conn: psycopg.AsyncConnection[Any]) -> str | None:
            row = await _optional(conn, self._sql.owner, params)
            return None if row is None else bytes(row[0]).decode()

        return await self._run(op, key)

    async def release_lease(self, key: str, owner: str) -> None:
        validate_key(key)
        validate_owner(owner)
        params = {"key": key.encode(), "owner": owner.encode()}
        await self._run(self._rowcount(self._sql.release, params), key, write=True)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        params = {"key": key.encode(), "owner": owner.encode(), "ttl_ms": ttl_ms}
        return await self._run(self._rowcount(self._sql.renew, params), key, write=True) == 1

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        params = {
            "key": key.encode(),
            "from_owner": from_owner.encode(),
            "to_owner": to_owner.encode(),
            "ttl_ms": ttl_ms,
        }
        # Not retried on a lost connection: a transfer that ran before the connection
        # died would report False the second time.
        moved = await self._run(
            self._rowcount(self._sql.transfer, params), key, write=True, idempotent=False
        )
        return moved == 1

    @staticmethod
    def _rowcount(statement: bytes, params: dict[str, Any]) -> _Operation[int]:
        async def op(conn: psycopg.AsyncConnection[Any]) -> int:
            return (await conn.execute(statement, params)).rowcount

        return op

    # -- beyond the contract ------------------------------------------------------------

    async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases in key order, optionally only keys starting with ``prefix``.

        One statement, served by the primary key's index for a prefix.
        """
        if prefix is not None:
            validate_key(prefix, "prefix")
        limit = _check_int("limit", limit, minimum=1)
        params: dict[str, Any]
        if prefix is None:
            statement, params = self._sql.inspect_all, {"limit": limit}
        else:
            low = prefix.encode()
            # UTF-8 never contains the byte 0xFF, so the last byte can always be raised.
            high = low[:-1] + bytes([low[-1] + 1])
            statement = self._sql.inspect_prefix
            params = {"limit": limit, "low": low, "high": high}

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[LeaseRecord]:
            rows = await (await conn.execute(statement, params)).fetchall()
            return [
                LeaseRecord(bytes(k).decode(), bytes(o).decode(), int(t), max(1, int(r)))
                for k, o, t, r in rows
            ]

        return await self._run(op, prefix)

    async def migrate(self) -> int:
        """Create the table, its sequence and meta table, or bring them up to date.

        Idempotent and safe to run from several processes at once. For deployments whose
        application role may not run DDL: run this (``leasekit migrate URL``) once as a
        role that may, and give the application role ``SELECT, INSERT, UPDATE, DELETE``
        on the table, ``USAGE`` on the sequence and ``SELECT`` on the meta table.
        Returns the schema version now recorded.
        """

        async def op(conn: psycopg.AsyncConnection[Any]) -> int:
            await self._migrate_on(conn)
            version = await self._schema_version(conn)
            return _sql.SCHEMA_VERSION if version is None else version

        version = await self._run(op, None, check_schema=False)
        self._ready = version == _sql.SCHEMA_VERSION
        return version

    async def sweep(self) -> int:
        """Delete one batch of rows that expired more than ``sweep_grace_s`` ago.

        Returns how many rows were deleted. Runs by itself every ``sweep_every``
        writes; call it yourself (from a periodic job) with ``sweep_every=0``.
        """
        params = {"grace_s": self.sweep_grace_s, "batch": self.sweep_batch}
        return await self._run(self._rowcount(self._sql.sweep, params), None)

    async def _sweep_in_background(self) -> None:
        try:
            deleted = await self.sweep()
        except LeaseError as exc:
            _log.debug("background sweep failed: %s", exc)
            deleted = 0
        finally:
            self._sweeper = None
        if deleted >= self.sweep_batch:
            self._writes = self.sweep_every  # a backlog: sweep again on the next write

    async def row_count(self) -> int:
        """Rows in the table, live and expired: what the sweep keeps bounded."""

        async def op(conn: psycopg.AsyncConnection[Any]) -> int:
            (count,) = await _one(conn, self._sql.count_rows, None)
            return int(count)

        return await self._run(op, None)

    # -- lifecycle ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop background work and close the pool if the provider built it.

        A caller's pool or connection is left open. Later operations raise
        :class:`~leasekit.LeaseProviderClosed`.
        """
        if self._closed:
            return
        self._closed = True
        sweeper = self._sweeper
        if sweeper is not None:
            sweeper.cancel()
            await asyncio.wait((sweeper,), timeout=self.timeout_s)
        # Calls abandoned at their timeout (the sweeper's among them) are being cancelled
        # on the server; let them return their connections before the pool closes.
        if self._abandoned:
            await asyncio.wait(list(self._abandoned), timeout=self.timeout_s)
        if self._close_client and self._pool is not None:
            await self._pool.close(timeout=self.timeout_s)

    async def __aenter__(self) -> PostgresLeaseProvider:
        # Connect and check the schema now, so a wrong address or a missing table shows
        # up at the `async with`; a provider that cannot open leaves no pool behind.
        try:
            await self._run(_nothing, None)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        server = self._server()
        where = f", server={server!r}" if server else ""
        state = ", closed" if self._closed else ""
        return f"PostgresLeaseProvider(table={self.table!r}{where}{state})"


class _Overdue(Exception):
    """A call's deadline passed: set on its waiter by ``_Deadlines``, never seen by users."""


class _Call(Generic[_T]):
    """One call in flight: the future its caller awaits, its deadline, how far it got."""

    __slots__ = ("closed", "connected", "deadline", "waiter")

    def __init__(self, waiter: asyncio.Future[_T]) -> None:
        self.waiter = waiter
        self.deadline = 0.0
        self.connected = False  # for the message if it runs out of time
        self.closed = False  # the caller has its answer


class _Deadlines:
    """The timeout of every call in flight of one provider, on a single timer.

    A timer per call (``asyncio.wait(..., timeout=)``, ``asyncio.timeout()``) is armed
    and disarmed at every operation. Every call of a provider has the same
    ``timeout_s``, so deadlines fall due in the order the calls began: a FIFO of
    calls, and one timer set for the oldest open one, bound them all. When it fires,
    each overdue call's waiter fails with :class:`_Overdue`; its caller then abandons
    the task doing the work, which finishes (cancelling its statement) in the
    background. The Redis backend bounds its calls the same way.
    """

    __slots__ = ("_loop", "_open", "_timeout_s", "_timer")

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._open: deque[_Call[Any]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop, call: _Call[Any]) -> None:
        """Time ``call`` from now; it stops counting once ``call.closed`` is set."""
        if loop is not self._loop:  # first use, or the provider now runs on another loop
            self._loop, self._open, self._timer = loop, deque(), None
        call.deadline = loop.time() + self._timeout_s
        pending = self._open
        # Drop the calls already answered, so the queue stays as short as the calls in
        # flight (the timer, when it fires, would skip them too).
        while pending and pending[0].closed:
            pending.popleft()
        pending.append(call)
        if self._timer is None:
            self._timer = loop.call_at(call.deadline, self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:
            return  # a timer left on a loop the provider no longer runs on
        self._timer = None
        now = loop.time()
        pending = self._open
        while pending and (pending[0].closed or pending[0].deadline <= now):
            call = pending.popleft()
            if not call.closed and not call.waiter.done():
                call.waiter.set_exception(_Overdue())
        if pending:
            self._timer = loop.call_at(pending[0].deadline, self._expire, loop)


async def _nothing(conn: psycopg.AsyncConnection[Any]) -> None:
    return None


async def _one(
    conn: psycopg.AsyncConnection[Any], statement: bytes, params: dict[str, Any] | None
) -> tuple[Any, ...]:
    row = await _optional(conn, statement, params)
    if row is None:
        raise LeaseBackendError("the server returned no row", backend=_BACKEND)
    return row


async def _optional(
    conn: psycopg.AsyncConnection[Any], statement: bytes, params: dict[str, Any] | None
) -> tuple[Any, ...] | None:
    row: tuple[Any, ...] | None = await (await conn.execute(statement, params)).fetchone()
    return row


async def _end_failed_transaction(conn: psycopg.AsyncConnection[Any]) -> None:
    """Roll back if a failed statement left the connection in an aborted transaction."""
    if conn.info.transaction_status == pq.TransactionStatus.INERROR:
        await conn.rollback()


def _consume_outcome(task: asyncio.Task[Any]) -> None:
    # An abandoned call's error was already reported as a timeout; retrieve it so
    # asyncio does not log "exception was never retrieved".
    if not task.cancelled():
        task.exception()


def _check_table(table: object) -> _sql.TableName:
    if not isinstance(table, str):
        raise InvalidLeaseArgument.for_argument(
            "table", f"must be a str, got {type(table).__name__}"
        )
    parts = table.split(".")
    if len(parts) > 2 or not all(_IDENTIFIER.fullmatch(part) for part in parts):
        raise InvalidLeaseArgument.for_argument(
            "table",
            "must be an identifier (letters, digits, underscores; not starting with a "
            f"digit), optionally schema-qualified as schema.table, got {table!r}",
        )
    if len(parts[-1]) > _MAX_TABLE_CHARS or len(parts[0]) > 63:
        raise InvalidLeaseArgument.for_argument(
            "table", f"the table name may have at most {_MAX_TABLE_CHARS} characters"
        )
    if len(parts) == 2:
        return _sql.TableName(parts[0], parts[1])
    return _sql.TableName(None, parts[0])


def _check_timeout(timeout_s: object) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
        raise InvalidLeaseArgument.for_argument("timeout_s", f"must be a number, got {timeout_s!r}")
    if not 0 < timeout_s <= 3600:
        raise InvalidLeaseArgument.for_argument(
            "timeout_s", f"must be in (0, 3600], got {timeout_s!r}"
        )
    return float(timeout_s)


def _check_grace(grace_s: object, timeout_s: float) -> float:
    if isinstance(grace_s, bool) or not isinstance(grace_s, int | float):
        raise InvalidLeaseArgument.for_argument(
            "sweep_grace_s", f"must be a number, got {grace_s!r}"
        )
    if not grace_s > timeout_s:
        raise InvalidLeaseArgument.for_argument(
            "sweep_grace_s",
            f"must be longer than timeout_s ({timeout_s:g}), so no statement outlives it "
            f"(fencing tokens depend on that), got {grace_s!r}",
        )
    return float(grace_s)


def _check_int(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidLeaseArgument.for_argument(name, f"must be an int >= {minimum}, got {value!r}")
    return value


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidLeaseArgument.for_argument(name, f"must be a bool, got {value!r}")
    return value


def _check_prepare_threshold(value: object) -> int | None:
    if value is None:
        return None
    return _check_int("prepare_threshold", value, minimum=0)


def _coerce_option(name: str, value: str) -> Any:
    try:
        if name in ("timeout_s", "sweep_grace_s"):
            return float(value)
        if name in ("sweep_every", "sweep_batch", "pool_min_size", "pool_max_size"):
            return int(value)
        if name == "prepare_threshold":
            return None if value.lower() in ("none", "") else int(value)
    except ValueError:
        raise InvalidLeaseArgument.for_argument(name, f"must be a number, got {value!r}") from None
    if name in ("create_schema", "server_timeout"):
        flag = value.lower()
        if flag in ("true", "yes", "1", "on"):
            return True
        if flag in ("false", "no", "0", "off"):
            return False
        raise InvalidLeaseArgument.for_argument(name, f"must be true or false, got {value!r}")
    return value


def _redact(url: str) -> str:
    """``url`` with any password replaced, fit for error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))
