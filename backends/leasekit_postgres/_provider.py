"""``PostgresLeaseProvider``: leases in one PostgreSQL table, one statement per operation.

One module, over 500 lines: the async, single-connection and blocking providers share
one lifecycle and each forwards every operation, slots and the line included.

Lifecycle only. The statements are in ``_sql``, the operations that send them and read
their replies in ``_ops``, the options, capabilities and error table in ``_options``,
and the I/O in ``_aio``; :class:`PostgresSyncLeaseProvider`, at the end, runs the same
operations through ``_blocking``. Deadlines, error mapping, draining and the undo of
a cancelled grant are the toolkit's :class:`~leasekit.backend.BackendProvider`.

Every call is detached (``_call_detached``): psycopg answers a cancelled query by
sending the server a cancel request and waiting for the query to end, which a frozen
server draws out, so a late call is abandoned at ``timeout_s`` and finishes in the
background, and ``aclose`` drains it. Its statement may still run when a frozen server
wakes, so the provider's later calls on the same key wait for it to settle first
(issue 22: a release given up on must not end the lease its owner acquired next).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ClassVar, TypeAlias, TypeVar

from psycopg_pool import ConnectionPool

from leasekit import Capabilities, LeaseError, LeaseResult, SlotResult, validate_key
from leasekit.backend import (
    BackendProvider,
    ErrorMap,
    Grant,
    LeaseRecord,
    ReleaseHub,
    ReleaseWatch,
    RenewItem,
    SlotGrant,
    SyncBackendProvider,
    grouped,
    metadata_for,
)

from . import _ops, _slots, _sql
from ._aio import AsyncClient, AsyncTransport, log, own_pool
from ._blocking import BlockingTransport
from ._blocking import own_pool as own_blocking_pool
from ._group import Groups
from ._notify import PostgresReleaseListener
from ._options import (
    BACKEND,
    CAPABILITIES,
    ERRORS,
    URL_FORMS,
    Settings,
    SettingsAttributes,
    describe,
    pool_settings,
    provider_settings,
)

__all__ = ["LeaseRecord", "PostgresClient", "PostgresLeaseProvider", "PostgresSyncLeaseProvider"]

PostgresClient: TypeAlias = AsyncClient
"""What the provider runs on: a psycopg_pool async pool, or one async connection."""

_T = TypeVar("_T")


class _PostgresProvider(SettingsAttributes):
    """What both providers declare, and the settings they keep (their options, read-only)."""

    backend: ClassVar[str] = BACKEND
    capabilities: Capabilities = CAPABILITIES
    errors: ClassVar[ErrorMap] = ERRORS
    url_forms: ClassVar[tuple[str, ...]] = URL_FORMS

    def _adopt(self, settings: Settings) -> None:
        self._settings = settings
        self._sql = settings.statements
        self._channel = settings.channel
        self._hint_grants = settings.channel is not None
        if not settings.notifications:
            self.capabilities = settings.capabilities
        self._sweeps = _ops.SweepSchedule(settings.sweep_every, settings.sweep_batch)


class PostgresLeaseProvider(_PostgresProvider, BackendProvider):
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
    - ``synchronous_commit`` (default unset: the server's setting) is ``remote_write``,
      ``on`` or ``remote_apply``: a grant is acknowledged only once a synchronous standby
      has it at that level. The provider refuses to start
      (:class:`~leasekit.LeaseBackendError`) unless its sessions run at that level
      (``from_url`` sets it; a caller's pool sets ``options='-c synchronous_commit=...'``)
      and the server's ``synchronous_standby_names`` names a standby.

    Fencing tokens carry the server's clock (they never go back, a failover included)
    and survive restarts; the table is persistent.
    A caller's pool or connection is used as it is (open it first); pass
    ``close_client=True`` to have :meth:`aclose` close it too.
    """

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
        synchronous_commit: str | None = None,
        close_client: bool = False,
    ) -> None:
        settings = provider_settings(
            {
                "synchronous_commit": synchronous_commit,
                "table": table,
                "timeout_s": timeout_s,
                "create_schema": create_schema,
                "sweep_every": sweep_every,
                "sweep_batch": sweep_batch,
                "sweep_grace_s": sweep_grace_s,
                "notifications": notifications,
            }
        )
        self._io = AsyncTransport(client, settings, owns_client=bool(close_client))
        super().__init__(timeout_s=settings.timeout_s, owns_client=bool(close_client))
        self._adopt(settings)
        # Acquires, releases and renewals that arrive together go out together (_group).
        self._groups = Groups(
            settings.statements, settings.channel, max(1, min(200, int(self.timeout_s * 100)))
        )
        self._sweeper: asyncio.Task[Any] | None = None
        # Release notifications: pg_notify from the releasing statement, one LISTEN
        # connection per provider outside the pool (see _notify).
        self._listener = self._release_listener = PostgresReleaseListener(
            self._io.listen_connection, self._channel or "", timeout_s=self.timeout_s
        )

    @property
    def client(self) -> PostgresClient:
        """The pool or connection the provider runs on (the caller's, or the one it built)."""
        return self._io.client

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
        return cls(own_pool(settings), close_client=True, **settings.provider)

    @classmethod
    def sync_from_url(cls, url: str, **options: Any) -> PostgresSyncLeaseProvider:
        """The blocking provider :func:`leasekit.sync.connect` uses for this URL.

        The same URL, options and errors as :meth:`from_url`, on psycopg's blocking
        pool; see :class:`~leasekit_postgres.PostgresSyncLeaseProvider`.
        """
        return PostgresSyncLeaseProvider.from_url(url, **options)

    # -- one call ---------------------------------------------------------------------------

    def _send(
        self,
        operation: _ops.Operation[_T],
        key: str | None,
        again: Callable[..., _ops.Operation[_T]] | None = None,
        args: tuple[Any, ...] = (),
        *,
        grant: Grant | None = None,
        write: bool = False,
        group: str | None = None,
    ) -> Awaitable[_T]:
        """Run ``operation`` (built, so validated) through the transport, bounded.

        ``again(*args)`` builds it anew for the one retry on a lost connection (``None``:
        not retried). ``grant``: the owner an acquire or transfer may grant ``key`` to.
        ``group``: the kind of call (``"acquire"``, ``"release"``, ``"renew"``) that,
        arriving with others of its kind, is decided with them in one statement
        (``_group``); named, not passed, since a provider rebuilt below (a fork, a new
        loop) has groups of its own.
        """
        # Before the transport is touched: in a forked child (or on a new loop) the
        # provider builds itself anew here, with a transport of its own.
        self._refuse_if_closed()
        # Not while closing: an undo's release still runs then (UNDOING).
        if write and self._sweeps.wrote() and self._sweeper is None and not self.closed:
            self._sweeps.started()
            self._sweeper = self._spawn(self._sweep_in_background())
        if group is None or key is None:
            call = self._io.run(operation, again, args)
        else:
            extra = (again, args)
            call = grouped(self._io, getattr(self._groups, group), key, operation, extra)
        if grant is not None and self._undos and key is not None:
            return self._after_undo_then(key, grant, call)
        return self._call_detached(call, key, grant)

    async def _after_undo_then(self, key: str, grant: Grant, call: Coroutine[Any, Any, _T]) -> _T:
        try:
            await self._after_undo(key, grant)
        except BaseException:
            call.close()
            raise
        return await self._call_detached(call, key, grant)

    async def _connect(self) -> None:
        # Connect and check the schema now, so a wrong address or a missing table shows
        # up at the `async with`.
        await self._call_detached(self._io.open())

    def _housekeep_before_close(self) -> None:
        self._io.closing = True  # a closed pool now means a closed provider

    async def _close_client(self) -> None:
        await self._io.close()

    def _describe(self) -> str:
        return describe(self._io.server, self.table)

    def _where(self) -> str:
        return self._io.where

    # -- the contract -------------------------------------------------------------------

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, metadata: bytes | str | None = None
    ) -> LeaseResult:
        """Acquire ``key``; ``metadata`` is stored with the grant (``Capabilities.metadata``).

        One statement, which also tells owner watchers when the key changed hands.
        """
        data = None if metadata is None else metadata_for(self, metadata)  # most have none
        args = (self._sql, key, owner, ttl_ms, data, self._hint_grants)
        return await self._send(
            _ops.acquire(*args),
            key,
            _ops.acquire,
            args,
            grant=owner,
            write=True,
            group="acquire",
        )

    async def get_lease_record(self, key: str) -> LeaseRecord | None:
        """Owner, token, metadata and time left (by the server's clock) of the live lease
        of ``key`` in one statement, or ``None`` when it is free (``SupportsRecords``)."""
        args = (self._sql, key)
        return await self._send(_ops.record(*args), key, _ops.record, args)

    async def get_lease_owner(self, key: str) -> str | None:
        return await self._send(_ops.owner(self._sql, key), key, _ops.owner, (self._sql, key))

    async def release_lease(self, key: str, owner: str) -> None:
        args = (self._sql, key, owner, self._channel)
        await self._send(_ops.release(*args), key, _ops.release, args, write=True, group="release")

    async def release_if_held(self, key: str, owner: str) -> bool:
        """Release ``key`` if ``owner`` holds it; whether it did (``SupportsReleaseReport``).

        Not retried on a lost connection, unlike ``release_lease``: a release that
        landed before the connection died would answer False the second time.
        """
        operation = _ops.release(self._sql, key, owner, self._channel)
        return await self._send(operation, key, write=True, group="release")

    async def release_grant(self, key: str, owner: str, token: int) -> None:
        """Release ``key`` if ``owner`` holds it with ``token`` (``SupportsReleaseGrant``).

        What the toolkit undoes a cancelled grant with when it read the grant's reply.
        """
        args = (self._sql, key, owner, token, self._channel)
        await self._send(_ops.release_grant(*args), key, _ops.release_grant, args, write=True)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        args = (self._sql, key, owner, ttl_ms)
        return await self._send(_ops.renew(*args), key, _ops.renew, args, write=True, group="renew")

    async def renew_leases(self, items: Sequence[RenewItem]) -> list[bool]:
        """Renew many leases in one statement (``leasekit.backend.SupportsRenewMany``).

        One result per ``(key, owner, ttl_ms)``, each exactly what ``renew_lease`` would
        answer; one round trip and one transaction for the batch, on the server's clock.
        """
        operation = _ops.renew_many(self._sql, items)
        if not items:
            return []
        args = (self._sql, items)
        return await self._send(operation, items[0][0], _ops.renew_many, args, write=True)

    async def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int,
        *,
        metadata: bytes | str | None = None,
    ) -> bool:
        """Hand the lease on; ``metadata`` replaces the holder's (``None`` clears it)."""
        operation = _ops.transfer(
            self._sql,
            key,
            from_owner,
            to_owner,
            ttl_ms,
            metadata=metadata_for(self, metadata),
            channel=self._channel,
        )
        grant = to_owner if to_owner != from_owner else None  # else a renewal
        # Not retried on a lost connection: a transfer that ran before the connection
        # died would report False the second time.
        return await self._send(operation, key, grant=grant, write=True)

    # -- waiting without polling -----------------------------------------------------------

    async def watch_release(self, key: str, *, grants: bool = False) -> ReleaseWatch:
        """Watch ``key`` for release and transfer on the provider's ``LISTEN`` connection;
        with ``grants``, for grants too (the key taken by a new owner).

        Expiry sends nothing; waiters also sleep only until :meth:`lease_remaining_ms`.
        With ``notifications=false`` there is no channel: waiters wait on that alone.
        """
        validate_key(key)
        self._refuse_if_closed()
        if self._channel is None:
            return ReleaseHub().watch(key, grants=grants)
        return await self._call(self._listener.watch(key, grants=grants), key)

    async def lease_remaining_ms(self, key: str) -> int | None:
        """Milliseconds left on the live lease of ``key`` by the server's clock."""
        args = (self._sql, key)
        return await self._send(_ops.remaining(*args), key, _ops.remaining, args)

    # -- beyond the contract ------------------------------------------------------------

    async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases in key order, optionally only keys starting with ``prefix``.

        One statement, served by the primary key's index for a prefix.
        """
        args = (self._sql, prefix, limit)
        return await self._send(_ops.inspect(*args), prefix, _ops.inspect, args)

    async def migrate(self) -> int:
        """Create the table, its sequence and meta table, or bring them up to date.

        Idempotent and safe to run from several processes at once. For deployments whose
        application role may not run DDL: run this (``leasekit migrate URL``) once as a
        role that may, and give the application role ``SELECT, INSERT, UPDATE, DELETE``
        on the table, ``USAGE`` on the sequence and ``SELECT`` on the meta table.
        Returns the schema version now recorded.
        """
        args = (self._sql,)
        self._refuse_if_closed()
        migrate = self._io.run(_ops.migrate(*args), _ops.migrate, args, check_schema=False)
        version = await self._call_detached(migrate)
        self._io.ready = version == _sql.SCHEMA_VERSION
        return version

    async def sweep(self) -> int:
        """Delete one batch of rows that expired more than ``sweep_grace_s`` ago.

        Returns how many rows were deleted. Runs by itself every ``sweep_every``
        writes; call it yourself (from a periodic job) with ``sweep_every=0``.
        """
        args = (self._sql, self.sweep_grace_s, self.sweep_batch)
        return await self._send(_ops.sweep(*args), None, _ops.sweep, args)

    async def _sweep_in_background(self) -> None:
        try:
            deleted = await self.sweep()
        except LeaseError as exc:
            log.debug("background sweep failed: %s", exc)
            deleted = 0
        finally:
            self._sweeper = None
        self._sweeps.swept(deleted)

    # -- counting leases (SupportsSlots) ------------------------------------------------

    async def acquire_slot(
        self, key: str, owner: str, ttl_ms: int, *, limit: int, exclusive: bool = False
    ) -> SlotResult:
        """Take one of ``limit`` slots of ``key`` (``leasekit.backend.SupportsSlots``).

        One statement: a function that locks the key's row, drops its expired slots,
        counts and decides, and writes the slot.
        """
        args = (self._sql, key, owner, ttl_ms, limit, exclusive)
        operation = _slots.acquire_slot(*args)
        return await self._send(
            operation, key, _slots.acquire_slot, args, grant=SlotGrant(owner), write=True
        )

    async def renew_slot(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Reset the TTL of ``owner``'s live slot of ``key``; whether it held one."""
        args = (self._sql, key, owner, ttl_ms)
        return await self._send(_slots.renew_slot(*args), key, _slots.renew_slot, args)

    async def release_slot(self, key: str, owner: str) -> bool:
        """Free ``owner``'s live slot of ``key``; whether it held one (not retried on a
        lost connection, as ``release_if_held``)."""
        return await self._send(_slots.release_slot(self._sql, key, owner), key)

    async def release_slot_grant(self, key: str, owner: str, token: int) -> bool:
        """Free ``owner``'s slot of ``key`` only if it carries ``token`` (undoing a grant)."""
        args = (self._sql, key, owner, token)
        return await self._send(
            _slots.release_slot_grant(*args), key, _slots.release_slot_grant, args
        )

    async def transfer_slot(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Hand ``from_owner``'s live slot of ``key`` to ``to_owner`` (a new token), in one
        statement; not retried on a lost connection."""
        operation = _slots.transfer_slot(self._sql, key, from_owner, to_owner, ttl_ms)
        grant = SlotGrant(to_owner) if to_owner != from_owner else None  # else a renewal
        return await self._send(operation, key, grant=grant)

    async def get_slot_holders(self, key: str) -> list[LeaseRecord]:
        """The live slots of ``key`` (time left by the server's clock), in grant order."""
        args = (self._sql, key)
        return await self._send(_slots.slot_holders(*args), key, _slots.slot_holders, args)

    # -- fair waiting (SupportsFairWaiting) ---------------------------------------------

    async def acquire_lease_in_turn(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        *,
        place_ttl_ms: int,
        metadata: bytes | str | None = None,
    ) -> LeaseResult:
        """``acquire_lease`` in arrival order (``leasekit.backend.SupportsFairWaiting``).

        One statement: a function that takes the key's line lock (an advisory lock),
        then grants or keeps the caller's place.
        """
        data = None if metadata is None else metadata_for(self, metadata)
        channel = self._channel if self._hint_grants else None
        args = (self._sql, key, owner, ttl_ms, place_ttl_ms, data, channel)
        return await self._send(
            _slots.acquire_in_turn(*args),
            key,
            _slots.acquire_in_turn,
            args,
            grant=owner,
            write=True,
        )

    async def row_count(self) -> int:
        """Rows in the table, live and expired: what the sweep keeps bounded."""
        return await self._send(_ops.row_count(self._sql), None, _ops.row_count, (self._sql,))


class PostgresSyncLeaseProvider(_PostgresProvider, SyncBackendProvider):
    """Leases in PostgreSQL from blocking code: the async provider's operations on psycopg's pool.

    Safe to share between threads. Made by ``leasekit.sync.connect("postgresql://...")``
    (through :meth:`PostgresLeaseProvider.sync_from_url`) or by :meth:`from_url`, with
    the same URL and options; or on a caller's ``psycopg_pool.ConnectionPool`` with the
    async provider's keyword options. The schema is checked (or created) on first use,
    expired rows are swept every ``sweep_every`` writes (in the writing thread), and
    releases and transfers notify the async provider's waiters.
    """

    def __init__(self, pool: ConnectionPool[Any], *, close_client: bool = False, **options: Any):
        settings = provider_settings(options)
        self._io = BlockingTransport(pool, settings)
        super().__init__(timeout_s=settings.timeout_s, owns_client=bool(close_client))
        self._adopt(settings)

    @property
    def client(self) -> ConnectionPool[Any]:
        """The pool the provider runs on (the caller's, or the one it built)."""
        return self._io.pool

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresSyncLeaseProvider:
        """A provider and its own blocking pool; see :meth:`PostgresLeaseProvider.from_url`."""
        settings = pool_settings(url, options)
        return cls(own_blocking_pool(settings), close_client=True, **settings.provider)

    # -- one call ---------------------------------------------------------------------------

    def _send(
        self,
        operation: _ops.Operation[_T],
        key: str | None,
        again: Callable[..., _ops.Operation[_T]] | None = None,
        args: tuple[Any, ...] = (),
        *,
        write: bool = False,
    ) -> _T:
        """Run ``operation`` (built, so validated) through the transport; as the async one's."""
        result: _T = self._call(self._io.run, operation, again, args, key, key=key)
        if write and self._sweeps.wrote():
            self._sweeps.started()
            try:
                self._sweeps.swept(self.sweep())
            except LeaseError as exc:
                log.debug("sweep failed: %s", exc)
        return result

    def _connect(self) -> None:
        self._io.ensure_ready()

    def _close_client(self) -> None:
        self._io.close()

    def close(self) -> None:
        """Refuse new operations, close the pool (if built here) and stop the watchdog."""
        super().close()
        self._io.deadlines.stop()

    def _describe(self) -> str:
        return describe(self._io.server, self.table)

    def _where(self) -> str:
        return self._io.where

    # -- the contract ---------------------------------------------------------------------

    def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, metadata: bytes | str | None = None
    ) -> LeaseResult:
        """Blocking :meth:`PostgresLeaseProvider.acquire_lease`."""
        data = None if metadata is None else metadata_for(self, metadata)  # most have none
        args = (self._sql, key, owner, ttl_ms, data, self._hint_grants)
        return self._send(_ops.acquire(*args), key, _ops.acquire, args, write=True)

    def get_lease_record(self, key: str) -> LeaseRecord | None:
        """Blocking :meth:`PostgresLeaseProvider.get_lease_record`."""
        args = (self._sql, key)
        return self._send(_ops.record(*args), key, _ops.record, args)

    def get_lease_owner(self, key: str) -> str | None:
        """Blocking :meth:`PostgresLeaseProvider.get_lease_owner`."""
        return self._send(_ops.owner(self._sql, key), key, _ops.owner, (self._sql, key))

    def release_lease(self, key: str, owner: str) -> None:
        """Blocking :meth:`PostgresLeaseProvider.release_lease`."""
        args = (self._sql, key, owner, self._channel)
        self._send(_ops.release(*args), key, _ops.release, args, write=True)

    def release_if_held(self, key: str, owner: str) -> bool:
        """Blocking :meth:`PostgresLeaseProvider.release_if_held` (not retried, as there)."""
        operation = _ops.release(self._sql, key, owner, self._channel)
        return self._send(operation, key, write=True)

    def release_grant(self, key: str, owner: str, token: int) -> None:
        """Blocking :meth:`PostgresLeaseProvider.release_grant`."""
        args = (self._sql, key, owner, token, self._channel)
        self._send(_ops.release_grant(*args), key, _ops.release_grant, args, write=True)

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`PostgresLeaseProvider.renew_lease`."""
        args = (self._sql, key, owner, ttl_ms)
        return self._send(_ops.renew(*args), key, _ops.renew, args, write=True)

    def renew_leases(self, items: Sequence[RenewItem]) -> list[bool]:
        """Blocking :meth:`PostgresLeaseProvider.renew_leases`: one statement for the batch."""
        operation = _ops.renew_many(self._sql, items)
        if not items:
            return []
        args = (self._sql, items)
        return self._send(operation, items[0][0], _ops.renew_many, args, write=True)

    def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int,
        *,
        metadata: bytes | str | None = None,
    ) -> bool:
        """Blocking :meth:`PostgresLeaseProvider.transfer_lease` (not retried, as there)."""
        operation = _ops.transfer(
            self._sql,
            key,
            from_owner,
            to_owner,
            ttl_ms,
            metadata=metadata_for(self, metadata),
            channel=self._channel,
        )
        return self._send(operation, key, write=True)

    def lease_remaining_ms(self, key: str) -> int | None:
        """Blocking :meth:`PostgresLeaseProvider.lease_remaining_ms`."""
        args = (self._sql, key)
        return self._send(_ops.remaining(*args), key, _ops.remaining, args)

    # -- beyond the contract ------------------------------------------------------------

    def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """Blocking :meth:`PostgresLeaseProvider.inspect`."""
        args = (self._sql, prefix, limit)
        return self._send(_ops.inspect(*args), prefix, _ops.inspect, args)

    def migrate(self) -> int:
        """Blocking :meth:`PostgresLeaseProvider.migrate`."""
        args = (self._sql,)
        operation = _ops.migrate(*args)
        version: int = self._call(self._io.run, operation, _ops.migrate, args, None, False)
        self._io.ready = version == _sql.SCHEMA_VERSION
        return version

    def sweep(self) -> int:
        """Delete one batch of rows expired more than ``sweep_grace_s`` ago; how many went."""
        args = (self._sql, self.sweep_grace_s, self.sweep_batch)
        return self._send(_ops.sweep(*args), None, _ops.sweep, args)

    def row_count(self) -> int:
        """Blocking :meth:`PostgresLeaseProvider.row_count`."""
        return self._send(_ops.row_count(self._sql), None, _ops.row_count, (self._sql,))

    # -- counting leases and fair waiting ---------------------------------------------

    def acquire_slot(
        self, key: str, owner: str, ttl_ms: int, *, limit: int, exclusive: bool = False
    ) -> SlotResult:
        """Blocking :meth:`PostgresLeaseProvider.acquire_slot`."""
        args = (self._sql, key, owner, ttl_ms, limit, exclusive)
        return self._send(_slots.acquire_slot(*args), key, _slots.acquire_slot, args, write=True)

    def renew_slot(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`PostgresLeaseProvider.renew_slot`."""
        args = (self._sql, key, owner, ttl_ms)
        return self._send(_slots.renew_slot(*args), key, _slots.renew_slot, args)

    def release_slot(self, key: str, owner: str) -> bool:
        """Blocking :meth:`PostgresLeaseProvider.release_slot` (not retried, as there)."""
        return self._send(_slots.release_slot(self._sql, key, owner), key)

    def transfer_slot(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`PostgresLeaseProvider.transfer_slot` (not retried, as there)."""
        return self._send(_slots.transfer_slot(self._sql, key, from_owner, to_owner, ttl_ms), key)

    def get_slot_holders(self, key: str) -> list[LeaseRecord]:
        """Blocking :meth:`PostgresLeaseProvider.get_slot_holders`."""
        args = (self._sql, key)
        return self._send(_slots.slot_holders(*args), key, _slots.slot_holders, args)

    def acquire_lease_in_turn(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        *,
        place_ttl_ms: int,
        metadata: bytes | str | None = None,
    ) -> LeaseResult:
        """Blocking :meth:`PostgresLeaseProvider.acquire_lease_in_turn`."""
        data = None if metadata is None else metadata_for(self, metadata)
        channel = self._channel if self._hint_grants else None
        args = (self._sql, key, owner, ttl_ms, place_ttl_ms, data, channel)
        return self._send(
            _slots.acquire_in_turn(*args), key, _slots.acquire_in_turn, args, write=True
        )
