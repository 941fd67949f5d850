"""``PostgresLeaseProvider``: leases in one PostgreSQL table, one statement per operation.

Every lease operation is one statement (``_sql``) on an autocommit connection: one round
trip, one transaction, decided by the server under the key's row lock on the server's
clock. No session state is used (no advisory locks, temporary tables, ``SET``, or
prepared statements unless asked for), so any connection of a pool, or of a
transaction-mode pgbouncer, serves any call.

The operations themselves, and the connection and retry path, are in ``_calls``; the
options in ``_options``. Lifecycle, deadlines and error mapping are the toolkit's
:class:`~leasekit.backend.BackendProvider`. Every call is detached
(``_call_detached``): psycopg answers a cancelled query by sending the server a cancel
request and waiting for the query to end, which a frozen server draws out, so a late
call is abandoned at ``timeout_s`` and finishes in the background, and ``aclose``
drains it. Its statement may still run when a frozen server wakes, so the provider's
later calls on the same key wait for it to settle first (issue 22: a release given up
on must not end the lease its owner acquired next).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias, TypeVar

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseError,
    LeaseProviderClosed,
    LeaseResult,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)
from leasekit.backend import (
    BackendProvider,
    ErrorMap,
    LeaseRecord,
    Option,
    ReleaseHub,
    ReleaseWatch,
    RenewItem,
    check_renew_items,
)

from . import _calls, _sql
from ._notify import PostgresReleaseListener, channel_for
from ._options import BACKEND, PROVIDER_OPTIONS, check_grace, pool_settings, table_name

if TYPE_CHECKING:
    from ._sync import PostgresSyncLeaseProvider

__all__ = ["LeaseRecord", "PostgresClient", "PostgresLeaseProvider"]

PostgresClient: TypeAlias = AsyncConnectionPool[Any] | psycopg.AsyncConnection[Any]
"""What the provider runs on: a psycopg_pool async pool, or one async connection."""

_T = TypeVar("_T")

_LIMIT = Option("limit", int, 1000, minimum=1)
# How long aclose lets the pool's workers finish a task in hand (a connection attempt
# to a server that does not answer) before they are cancelled.
_POOL_WORKERS_GRACE_S = 0.1
_pool_numbers = itertools.count(1)


class PostgresLeaseProvider(BackendProvider):
    """Leases in a PostgreSQL table: one conditional statement per operation.

    Pass your own ``psycopg_pool.AsyncConnectionPool`` or ``psycopg.AsyncConnection``
    (which the provider never closes), or use :meth:`from_url` /
    ``leasekit.connect("postgresql://...")``, which builds a pool of autocommit
    connections and closes it in :meth:`aclose`.

    - ``table`` (default ``"leasekit_leases"``, or ``"schema.table"``) names the lease
      table; its sequence and meta table take it as a prefix.
    - ``timeout_s`` (default 5) bounds every operation, end to end, waiting for a
      connection included: a stalled server raises
      :class:`~leasekit.LeaseBackendTimeout`, never hangs; one that refuses, or
      refuses the credentials, :class:`~leasekit.LeaseBackendUnreachable`.
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

    backend: ClassVar[str] = BACKEND
    capabilities: Capabilities = Capabilities(
        atomic_transfer=True,
        fencing=True,
        ttl_resolution_ms=1,
        min_ttl_ms=1,
        server_clock=True,
        shared_across_processes=True,
        shared_across_hosts=True,
        persistent=True,
        release_notifications=True,
    )
    errors: ClassVar[ErrorMap] = ErrorMap(
        {
            PoolTimeout: LeaseBackendTimeout,  # no connection available within timeout_s
            psycopg.errors.QueryCanceled: LeaseBackendTimeout,  # statement_timeout
            psycopg.Error: LeaseBackendError,
        },
        backend=BACKEND,
    )

    def __init__(
        self,
        client: PostgresClient,
        *,
        table: str = _sql.DEFAULT_TABLE,
        timeout_s: float = 5.0,
        create_schema: bool = True,
        sweep_every: int = 100,
        sweep_batch: int = 1000,
        sweep_grace_s: float = 600.0,
        notifications: bool = True,
        close_client: bool = False,
    ) -> None:
        options = PROVIDER_OPTIONS.parse(
            overrides={
                "table": table,
                "timeout_s": timeout_s,
                "create_schema": create_schema,
                "sweep_every": sweep_every,
                "sweep_batch": sweep_batch,
                "sweep_grace_s": sweep_grace_s,
                "notifications": notifications,
            }
        ).values
        check_grace(options)
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
        super().__init__(timeout_s=options["timeout_s"], owns_client=bool(close_client))
        # psycopg_pool's log about a pool the provider built goes to leasekit's logger.
        self._route_log = self._owns_client and self._pool is not None
        self.table: str = options["table"]
        self.create_schema: bool = options["create_schema"]
        self.sweep_every: int = options["sweep_every"]
        self.sweep_batch: int = options["sweep_batch"]
        self.sweep_grace_s: float = options["sweep_grace_s"]
        self._sql = _sql.Statements(table_name(self.table))
        self._ready = False
        self._ready_lock = asyncio.Lock()
        self._writes = 0
        self._sweeper: asyncio.Task[Any] | None = None
        # Release notifications: pg_notify from the releasing statement, one LISTEN
        # connection per provider outside the pool (see _notify).
        self.notifications: bool = options["notifications"]
        self._channel: str | None = None
        if self.notifications:
            self._channel = channel_for(str(table_name(self.table)))
        else:
            self.capabilities = replace(self.capabilities, release_notifications=False)
        self._listener = self._release_listener = PostgresReleaseListener(
            self._listen_connection, self._channel or "", timeout_s=self.timeout_s
        )

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
        ``pool_max_size`` (default 10: operations beyond it wait for a connection,
        within ``timeout_s``), ``prepare_threshold`` (default none: psycopg never
        prepares statements, as pgbouncer's transaction mode needs) and
        ``server_timeout`` (default true: connections carry ``statement_timeout`` =
        ``timeout_s`` in their startup options). Anything unknown is an
        :class:`~leasekit.InvalidLeaseArgument`. No I/O happens here.
        """
        settings = pool_settings(url, options)
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            settings.conninfo,
            kwargs=settings.connection_kwargs,
            min_size=settings.min_size,
            max_size=settings.max_size,
            timeout=settings.provider["timeout_s"],
            # A name of its own: aclose finds this pool's worker tasks by it.
            name=f"leasekit-{next(_pool_numbers)}",
            open=False,
        )
        return cls(pool, close_client=True, **settings.provider)

    @classmethod
    def sync_from_url(cls, url: str, **options: Any) -> PostgresSyncLeaseProvider:
        """The blocking provider :func:`leasekit.sync.connect` uses for this URL.

        The same URL, options and errors as :meth:`from_url`, on psycopg's blocking
        pool; see :class:`~leasekit_postgres.PostgresSyncLeaseProvider`.
        """
        from ._sync import PostgresSyncLeaseProvider  # noqa: PLC0415 (only for leasekit.sync)

        return PostgresSyncLeaseProvider.from_url(url, **options)

    # -- one call: bounded, retried once on a lost connection, translated ---------------

    def _run(
        self,
        operation: Callable[[], _calls.Operation[_T]],
        key: str | None,
        *,
        write: bool = False,
        idempotent: bool = True,
        check_schema: bool = True,
        grant: str | None = None,
    ) -> Awaitable[_T]:
        return self._call_detached(
            self._attempt(operation, (), write, idempotent, check_schema), key, grant
        )

    async def _attempt(
        self,
        operation: Callable[..., _calls.Operation[_T]],
        args: tuple[Any, ...],
        write: bool,
        idempotent: bool = True,
        check_schema: bool = True,
    ) -> _T:
        """Run ``operation(*args)`` on a connection; once more if a pooled one was dead.

        The operation and its arguments come apart, not as a closure: the contract's
        methods call this for every operation, and a closure over their arguments
        costs a cell per argument and a function object on each call.

        Bounded by ``_call_detached``, which runs it in a copy of the caller's context.
        The pool's context commits if a caller's pool hands out a connection that is
        not in autocommit mode (one round trip more), and replaces broken ones.
        """
        if self._route_log:
            _calls.ROUTE_POOL_LOG.set(True)
        pool = self._pool
        try:
            if not self._ready:
                await self._ensure_ready(check_schema=check_schema)
            if pool is None:
                assert self._conn is not None
                result = await _calls.run_single(self._conn, operation(*args))
            else:
                retried = False
                while True:
                    conn: psycopg.AsyncConnection[Any] | None = None
                    try:
                        async with pool.connection() as conn:
                            result = await _calls.run(conn, operation(*args))
                        break
                    except psycopg.OperationalError as exc:
                        if retried or not idempotent or not _calls.lost(conn):
                            raise
                        # The connection died (server restart, pg_terminate_backend, a
                        # proxy dropping idle links): its idle siblings likely too. Let
                        # the pool test and replace them, then run the operation once
                        # more. The first attempt may or may not have run; every retried
                        # operation is idempotent.
                        _calls.log.info("connection lost (%s); retrying once on a fresh one", exc)
                        retried = True
                        await pool.check()
        except PoolClosed:
            if self.closed:
                raise LeaseProviderClosed(backend=BACKEND) from None
            raise
        if write and self.sweep_every:
            self._writes += 1
            if self._writes >= self.sweep_every and self._sweeper is None and not self.closed:
                self._writes = 0
                self._sweeper = self._spawn(self._sweep_in_background())
        return result

    async def _ensure_ready(self, *, check_schema: bool) -> None:
        """Open the pool we built, and once per provider check (or create) the schema.

        The first connection to a pool's server is made directly, not by the pool:
        psycopg_pool connects in the background and retries a refusal until the
        caller's timeout, where a direct attempt reports the refusal (or the wrong
        password, or the unknown host) at once.
        """
        async with self._ready_lock:
            if self._ready:
                return
            pool = self._pool
            if self._owns_client and pool is not None and pool.closed:
                conninfo, kwargs = pool.conninfo, pool.kwargs
                if isinstance(conninfo, str) and isinstance(kwargs, dict):
                    conn = await _calls.open_connection(conninfo, kwargs, where=self._where())
                    try:
                        if check_schema:
                            await _calls.run(conn, self._ensure_schema())
                            self._ready = True
                    finally:
                        await conn.close()
                await pool.open(wait=False)
                if not check_schema or self._ready:
                    return
            if not check_schema:
                return
            if pool is None:
                assert self._conn is not None
                await _calls.run_single(self._conn, self._ensure_schema())
            else:
                async with pool.connection() as conn:
                    await _calls.run(conn, self._ensure_schema())
            self._ready = True

    def _ensure_schema(self) -> _calls.Operation[None]:
        return _calls.ensure_schema(self._sql, self.table, create=self.create_schema)

    async def _connect(self) -> None:
        # Connect and check the schema now, so a wrong address or a missing table shows
        # up at the `async with`.
        await self._call_detached(self._open())

    async def _open(self) -> None:
        self._route_pool_log()
        await self._ensure_ready(check_schema=True)

    def _route_pool_log(self) -> None:
        """In this task (and the pool's workers it starts), psycopg_pool logs at DEBUG."""
        if self._route_log:
            _calls.ROUTE_POOL_LOG.set(True)

    async def _close_client(self) -> None:
        if self._pool is None:
            assert self._conn is not None
            await self._conn.close()
            return
        pool = self._pool
        prefix = f"{pool.name}-"
        workers = [task for task in asyncio.all_tasks() if task.get_name().startswith(prefix)]
        token = _calls.ROUTE_POOL_LOG.set(True)
        try:
            await pool.close(timeout=_POOL_WORKERS_GRACE_S)
        finally:
            _calls.ROUTE_POOL_LOG.reset(token)
        # A worker still connecting to a server that does not answer would go on until
        # libpq's connect_timeout: stop it now, so nothing of the pool outlives aclose.
        late = [task for task in workers if not task.done()]
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=_POOL_WORKERS_GRACE_S)

    def _describe(self) -> str:
        server = self._server()
        return f"table={self.table!r}" + (f", server={server!r}" if server else "")

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
        if self._undos:
            await self._after_undo(key, owner)
        return await self._call_detached(
            self._attempt(_calls.acquire, (self._sql, key, owner, ttl_ms), True), key, owner
        )

    async def get_lease_owner(self, key: str) -> str | None:
        validate_key(key)
        return await self._call_detached(self._attempt(_calls.owner, (self._sql, key), False), key)

    async def release_lease(self, key: str, owner: str) -> None:
        validate_key(key)
        validate_owner(owner)
        await self._call_detached(
            self._attempt(_calls.release, (self._sql, key, owner, self._channel), True), key
        )

    async def release_grant(self, key: str, owner: str, token: int) -> None:
        """Release ``key`` if ``owner`` holds it with ``token`` (``SupportsReleaseGrant``).

        What the toolkit undoes a cancelled grant with when it read the grant's reply.
        """
        validate_key(key)
        validate_owner(owner)
        await self._call_detached(
            self._attempt(
                _calls.release_grant, (self._sql, key, owner, token, self._channel), True
            ),
            key,
        )

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        return await self._call_detached(
            self._attempt(_calls.renew, (self._sql, key, owner, ttl_ms), True), key
        )

    async def renew_leases(self, items: Sequence[RenewItem]) -> list[bool]:
        """Renew many leases in one statement (``leasekit.backend.SupportsRenewMany``).

        One result per ``(key, owner, ttl_ms)``, each exactly what ``renew_lease`` would
        answer; one round trip and one transaction for the batch, on the server's clock.
        """
        checked = check_renew_items(items)
        if not checked:
            return []
        return await self._run(
            lambda: _calls.renew_many(self._sql, checked), checked[0][0], write=True
        )

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        grant = to_owner if to_owner != from_owner else None  # else a renewal
        if grant is not None and self._undos:
            await self._after_undo(key, grant)
        # Not retried on a lost connection: a transfer that ran before the connection
        # died would report False the second time.
        return await self._run(
            lambda: _calls.transfer(
                self._sql, key, from_owner, to_owner, ttl_ms, channel=self._channel
            ),
            key,
            write=True,
            idempotent=False,
            grant=grant,
        )

    # -- waiting without polling -----------------------------------------------------------

    async def watch_release(self, key: str) -> ReleaseWatch:
        """Watch ``key`` for release and transfer on the provider's ``LISTEN`` connection.

        Expiry sends nothing; waiters also sleep only until :meth:`lease_remaining_ms`.
        With ``notifications=false`` there is no channel: waiters wait on that alone.
        """
        validate_key(key)
        self._refuse_if_closed()
        if self._channel is None:
            return ReleaseHub().watch(key)
        return await self._call(self._listener.watch(key), key)

    async def lease_remaining_ms(self, key: str) -> int | None:
        """Milliseconds left on the live lease of ``key`` by the server's clock."""
        validate_key(key)
        return await self._run(lambda: _calls.remaining(self._sql, key), key)

    async def _listen_connection(self) -> psycopg.AsyncConnection[Any]:
        """A new autocommit connection to the provider's server, for ``LISTEN``."""
        if self._pool is not None:
            conninfo, settings = self._pool.conninfo, self._pool.kwargs
            if not isinstance(conninfo, str) or not isinstance(settings, dict):
                # A pool configured with callables: no way to open a connection like its
                # own from here. Waiters then go by the holder's remaining time.
                raise LeaseBackendError(
                    "cannot open a LISTEN connection for a pool configured with callables",
                    backend=self.backend,
                )
            kwargs = dict(settings)
        else:
            assert self._conn is not None
            info = self._conn.info
            conninfo = make_conninfo(info.dsn, password=info.password or None)
            kwargs = {}
        kwargs["autocommit"] = True
        return await _calls.open_connection(conninfo, kwargs, where=self._where())

    # -- beyond the contract ------------------------------------------------------------

    async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases in key order, optionally only keys starting with ``prefix``.

        One statement, served by the primary key's index for a prefix.
        """
        if prefix is not None:
            validate_key(prefix, "prefix")
        limit = _LIMIT.validate(limit)
        return await self._run(lambda: _calls.inspect(self._sql, prefix, limit), prefix)

    async def migrate(self) -> int:
        """Create the table, its sequence and meta table, or bring them up to date.

        Idempotent and safe to run from several processes at once. For deployments whose
        application role may not run DDL: run this (``leasekit migrate URL``) once as a
        role that may, and give the application role ``SELECT, INSERT, UPDATE, DELETE``
        on the table, ``USAGE`` on the sequence and ``SELECT`` on the meta table.
        Returns the schema version now recorded.
        """
        version = await self._run(lambda: _calls.migrate(self._sql), None, check_schema=False)
        self._ready = version == _sql.SCHEMA_VERSION
        return version

    async def sweep(self) -> int:
        """Delete one batch of rows that expired more than ``sweep_grace_s`` ago.

        Returns how many rows were deleted. Runs by itself every ``sweep_every``
        writes; call it yourself (from a periodic job) with ``sweep_every=0``.
        """
        return await self._run(
            lambda: _calls.sweep(self._sql, self.sweep_grace_s, self.sweep_batch), None
        )

    async def _sweep_in_background(self) -> None:
        try:
            deleted = await self.sweep()
        except LeaseError as exc:
            _calls.log.debug("background sweep failed: %s", exc)
            deleted = 0
        finally:
            self._sweeper = None
        if deleted >= self.sweep_batch:
            self._writes = self.sweep_every  # a backlog: sweep again on the next write

    async def row_count(self) -> int:
        """Rows in the table, live and expired: what the sweep keeps bounded."""
        return await self._run(lambda: _calls.row_count(self._sql), None)
