"""The MySQL providers, async and blocking: lifecycle only.

One module, over 500 lines: both providers and the extras beyond the contract
(records, slots, fair waiting, inspect, migrate, sweep) are thin methods that build an
``_ops`` operation and send it; split, each half would import the other's options.

Both run the operations of ``_ops`` (statements in ``_sql``), parse their options with
``_options`` and map errors with its table; :class:`MySQLLeaseProvider` sends them
through asyncmy (``_aio``) inside :class:`~leasekit.backend.BackendProvider`'s bounded
calls, :class:`MySQLSyncLeaseProvider` through PyMySQL (``_blocking``) inside
:class:`~leasekit.backend.SyncBackendProvider`'s.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Mapping
from typing import Any, TypeAlias, TypeVar

from asyncmy.pool import Pool

from leasekit import (
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseProviderClosed,
    LeaseResult,
    SlotResult,
)
from leasekit.backend import (
    BackendProvider,
    Grant,
    LeaseRecord,
    SlotGrant,
    SyncBackendProvider,
    metadata_for,
)

from . import _aio, _ops, _options, _slots, _sql
from ._aio import AioTransport, pool_options
from ._blocking import BlockingTransport
from ._options import BACKEND, CAPABILITIES, ERRORS

__all__ = ["MySQLClient", "MySQLLeaseProvider", "MySQLSyncLeaseProvider"]

MySQLClient: TypeAlias = Pool
"""What the async provider runs on: an asyncmy pool (of autocommit connections)."""

_T = TypeVar("_T")
_log = logging.getLogger("leasekit.mysql")


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

    backend = BACKEND
    capabilities = CAPABILITIES
    errors = ERRORS

    def __init__(
        self,
        client: MySQLClient | None = None,
        *,
        pool_options: Mapping[str, Any] | None = None,
        close_client: bool = False,
        **options: Any,
    ) -> None:
        settings = _options.settings(options, connect=pool_options)
        if not isinstance(client, Pool) if pool_options is None else client is not None:
            kind = f"{type(client).__module__}.{type(client).__qualname__}"
            rule = f"must be an asyncmy.pool.Pool (or None with pool_options), got {kind}"
            raise InvalidLeaseArgument.for_argument("client", rule)
        if client is not None and client.maxsize < 1:
            rule = "must allow at least one connection, got a pool of maxsize 0"
            raise InvalidLeaseArgument.for_argument("client", rule)
        super().__init__(timeout_s=settings.timeout_s, owns_client=client is None or close_client)
        self._settings = settings
        self._schema = _ops.Schema(settings)
        self._transport = AioTransport(client, pool_options, self._schema.statements)
        self.table = str(settings.table)
        self.create_schema, self.tokens = settings.create_schema, settings.tokens
        self.sweep_every, self.sweep_batch = settings.sweep_every, settings.sweep_batch
        self.sweep_grace_s = settings.sweep_grace_s
        self._ready_lock = asyncio.Lock()
        self._writes = 0
        self._sweeping = False

    @property
    def client(self) -> MySQLClient | None:
        """The pool the provider runs on (None before its own pool exists)."""
        return self._transport.pool

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MySQLLeaseProvider:
        """Build a provider and its own pool from ``mysql://user:password@host:port/db``.

        ``mariadb://`` is the same. leasekit's options come from the query or keyword
        arguments (which win): the constructor's, plus ``pool_min_size`` (default 1),
        ``pool_max_size`` (10) and ``charset`` (``utf8mb4``). Anything unknown is an
        :class:`~leasekit.InvalidLeaseArgument`. No I/O happens here.
        """
        settings = _options.url_settings(url, options)
        return cls(pool_options=pool_options(settings), **settings.options())

    @classmethod
    def sync_from_url(cls, url: str, **options: Any) -> MySQLSyncLeaseProvider:
        """The blocking provider :func:`leasekit.sync.connect` uses for this URL.

        The same URL, options and errors as :meth:`from_url`, on PyMySQL; see
        :class:`~leasekit_mysql.MySQLSyncLeaseProvider`.
        """
        return MySQLSyncLeaseProvider.from_url(url, **options)

    def _run(
        self, op: _ops.Op[_T], key: str | None = None, grant: Grant | None = None
    ) -> Awaitable[_T]:
        """One bounded call (the toolkit's deadline) of ``op``."""
        return self._call(_aio.run(self._ready_transport, self._connect, op), key, grant)

    def _run_grouped(
        self, op: _ops.Op[_T], key: str, grant: Grant | None, kind: str
    ) -> Awaitable[_T]:
        """:meth:`_run` for a call that goes out with others of its ``kind`` in flight
        (the transport's ``acquires``, ``releases``, ``renewals``: ``_group``)."""
        call = _aio.run(self._ready_transport, self._connect, op, kind, key)
        return self._call(call, key, grant)

    def _ready_transport(self) -> AioTransport | None:
        # Asked inside _call: a provider rebuilt there (a new loop, a fork) answers with
        # its new state; None until its schema is ready.
        return None if self._schema.sql is None else self._transport

    def _statements(self) -> _sql.Statements:
        statements = self._schema.sql
        assert statements is not None  # the schema was made ready first
        return statements

    async def _write(
        self, op: _ops.Op[_T], key: str, grant: Grant | None = None, kind: str | None = None
    ) -> _T:
        if grant is not None and self._undos:
            await self._after_undo(key, grant)
        if kind is None:
            result = await self._run(op, key, grant)
        else:
            result = await self._run_grouped(op, key, grant, kind)
        if self.sweep_every and not self._sweeping:
            self._writes += 1
            if self._writes >= self.sweep_every:
                self._writes = 0
                self._sweeping = True
                self._spawn(self._sweep_in_background())
        return result

    def _where(self) -> str:
        return self._settings.where()

    def _describe(self) -> str:
        return f"table={self.table!r}"

    async def _connect(self) -> None:
        async with self._ready_lock:
            if self._schema.sql is None:
                await self._transport.run(_ops.ready(self._schema))

    async def _close_client(self) -> None:
        await self._transport.close()

    # -- the contract, and beyond -------------------------------------------------------

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, metadata: bytes | str | None = None
    ) -> LeaseResult:
        """Acquire ``key``; ``metadata`` is stored with the grant (``Capabilities.metadata``)."""
        data = None if metadata is None else metadata_for(self, metadata)  # most have none
        op = _ops.acquire(self._statements, key, owner, ttl_ms, data)
        return await self._write(op, key, owner, "acquires")

    async def get_lease_record(self, key: str) -> LeaseRecord | None:
        """Owner, token, metadata and time left (by the server's clock) of the live lease
        of ``key`` in one statement, or None when it is free (``SupportsRecords``)."""
        return await self._run(_ops.record(self._statements, key), key)

    async def get_lease_owner(self, key: str) -> str | None:
        return await self._run(_ops.owner(self._statements, key), key)

    async def release_lease(self, key: str, owner: str) -> None:
        await self._write(_ops.release(self._statements, key, owner), key, None, "releases")

    async def release_if_held(self, key: str, owner: str) -> bool:
        """Release ``key`` if ``owner`` holds it; whether it did (``SupportsReleaseReport``)."""
        op = _ops.release(self._statements, key, owner)
        return await self._write(op, key, None, "releases") == 1

    async def release_grant(self, key: str, owner: str, token: int) -> None:
        """Release ``key`` if ``owner`` holds it with ``token`` (``SupportsReleaseGrant``).

        What the toolkit undoes a cancelled grant with when it read the grant's reply.
        """
        await self._write(_ops.release_grant(self._statements, key, owner, token), key)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        op = _ops.renew(self._statements, key, owner, ttl_ms)
        return await self._write(op, key, None, "renewals")

    async def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int,
        *,
        metadata: bytes | str | None = None,
    ) -> bool:
        """Hand the lease on; ``metadata`` replaces the holder's (None clears it)."""
        data = metadata_for(self, metadata)
        op = _ops.transfer(self._statements, key, from_owner, to_owner, ttl_ms, data)
        return await self._write(op, key, to_owner if to_owner != from_owner else None)

    async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases in key order, optionally only keys starting with ``prefix``."""
        return await self._run(_ops.inspect(self._statements, prefix, limit), prefix)

    async def migrate(self) -> int:
        """Create the table, its meta table (and on MariaDB its sequence) if missing.

        Idempotent. For deployments whose application user may not run DDL: run this
        (``leasekit migrate URL``) once as a user that may, and grant the application
        ``SELECT, INSERT, UPDATE, DELETE`` on the table, ``SELECT`` on the meta table
        and, on MariaDB, ``SELECT, INSERT`` on the sequence. Returns the schema version.
        """
        return await self._call(self._migrate())

    async def _migrate(self) -> int:
        return await self._transport.run(_ops.migrate(self._schema))

    async def sweep(self) -> int:
        """Delete one batch of rows that expired more than ``sweep_grace_s`` ago.

        Runs by itself every ``sweep_every`` writes; call it from a periodic job with
        ``sweep_every=0``. Returns how many rows were deleted.
        """
        return await self._run(_ops.sweep(self._statements, self.sweep_grace_s, self.sweep_batch))

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

    # -- counting leases (SupportsSlots) and fair waiting (SupportsFairWaiting) ------------

    async def acquire_slot(
        self, key: str, owner: str, ttl_ms: int, *, limit: int, exclusive: bool = False
    ) -> SlotResult:
        """Take one of ``limit`` slots of ``key`` (``leasekit.backend.SupportsSlots``).

        One ``CALL``: a procedure whose transaction locks the key's row, drops its
        expired slots, counts and decides, and writes the slot.
        """
        op = _slots.acquire_slot(self._statements, key, owner, ttl_ms, limit, exclusive)
        return await self._write(op, key, SlotGrant(owner))

    async def renew_slot(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Reset the TTL of ``owner``'s live slot of ``key``; whether it held one."""
        return await self._write(_slots.renew_slot(self._statements, key, owner, ttl_ms), key)

    async def release_slot(self, key: str, owner: str) -> bool:
        """Free ``owner``'s live slot of ``key``; whether it held one."""
        return await self._write(_slots.release_slot(self._statements, key, owner), key)

    async def release_slot_grant(self, key: str, owner: str, token: int) -> bool:
        """Free ``owner``'s slot of ``key`` only if it carries ``token`` (undoing a grant)."""
        op = _slots.release_slot_grant(self._statements, key, owner, token)
        return await self._write(op, key)

    async def transfer_slot(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Hand ``from_owner``'s live slot of ``key`` to ``to_owner`` (a new token)."""
        op = _slots.transfer_slot(self._statements, key, from_owner, to_owner, ttl_ms)
        return await self._write(op, key, SlotGrant(to_owner) if to_owner != from_owner else None)

    async def get_slot_holders(self, key: str) -> list[LeaseRecord]:
        """The live slots of ``key`` (time left by the server's clock), in grant order."""
        return await self._run(_slots.slot_holders(self._statements, key), key)

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

        One ``CALL``: a procedure whose transaction locks the key's line, then grants or
        keeps the caller's place.
        """
        data = None if metadata is None else metadata_for(self, metadata)
        op = _slots.acquire_in_turn(self._statements, key, owner, ttl_ms, place_ttl_ms, data)
        return await self._write(op, key, owner)

    async def row_count(self) -> int:
        """Rows in the table, live and expired: what the sweep keeps bounded."""
        return await self._run(_ops.row_count(self._statements))


class MySQLSyncLeaseProvider(SyncBackendProvider):
    """Leases in MySQL or MariaDB from blocking code: the same operations, on PyMySQL.

    Safe to share between threads. Made by ``leasekit.sync.connect("mysql://...")``
    (through :meth:`MySQLLeaseProvider.sync_from_url`) or :meth:`from_url`, with the
    same URL and options; it owns a pool of up to ``pool_max_size`` connections.
    Every call is bounded by ``timeout_s`` (``_blocking``); the schema is checked (or
    created) on first use, and expired rows are swept every ``sweep_every`` writes, in
    the writing thread. Cancellation's undo is the async provider's alone: a blocking
    call cannot be cancelled.
    """

    backend = BACKEND
    capabilities = CAPABILITIES
    errors = ERRORS

    def __init__(self, settings: _options.MySQLSettings) -> None:
        if settings.connect is None:
            raise InvalidLeaseArgument.for_argument("settings", "must name a server (from_url)")
        super().__init__(timeout_s=settings.timeout_s, owns_client=True)
        self._settings = settings
        self._transport = BlockingTransport(settings)
        self._schema = _ops.Schema(settings)
        self.table = str(settings.table)
        self._ready_lock = threading.Lock()
        self._writes = 0

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MySQLSyncLeaseProvider:
        """A provider and its own PyMySQL pool; see :meth:`MySQLLeaseProvider.from_url`."""
        return cls(_options.url_settings(url, options))

    def _run(self, op: _ops.Op[_T], key: str | None = None, *, write: bool = False) -> _T:
        result: _T = self._call(self._send, op, key=key)
        every = self._settings.sweep_every
        if write and every:
            self._writes += 1  # racy under threads: a sweep a little early or late
            if self._writes >= every:
                self._writes = 0
                self._sweep_quietly()
        return result

    def _send(self, op: _ops.Op[_T]) -> _T:
        deadline = time.monotonic() + self.timeout_s
        if self._schema.sql is None:
            self._ready(deadline)
        return self._transport.run(op, deadline)

    def _statements(self) -> _sql.Statements:
        statements = self._schema.sql
        assert statements is not None  # the schema was made ready first
        return statements

    def _ready(self, deadline: float) -> None:
        with self._ready_lock:
            if self._schema.sql is None:
                self._transport.run(_ops.ready(self._schema), deadline)

    def _sweep_quietly(self) -> None:
        try:
            self.sweep()
        except (LeaseBackendError, LeaseProviderClosed) as exc:
            _log.debug("sweep failed: %s", exc)

    def _where(self) -> str:
        return self._settings.where()

    def _describe(self) -> str:
        return f"table={self.table!r}"

    def _connect(self) -> None:
        self._ready(time.monotonic() + self.timeout_s)

    def _close_client(self) -> None:
        self._transport.close()

    def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, metadata: bytes | str | None = None
    ) -> LeaseResult:
        """Blocking :meth:`MySQLLeaseProvider.acquire_lease`."""
        data = None if metadata is None else metadata_for(self, metadata)  # most have none
        op = _ops.acquire(self._statements, key, owner, ttl_ms, data)
        return self._run(op, key, write=True)

    def get_lease_record(self, key: str) -> LeaseRecord | None:
        """Blocking :meth:`MySQLLeaseProvider.get_lease_record`."""
        return self._run(_ops.record(self._statements, key), key)

    def get_lease_owner(self, key: str) -> str | None:
        return self._run(_ops.owner(self._statements, key), key)

    def release_lease(self, key: str, owner: str) -> None:
        self._run(_ops.release(self._statements, key, owner), key, write=True)

    def release_if_held(self, key: str, owner: str) -> bool:
        """Blocking :meth:`MySQLLeaseProvider.release_if_held`."""
        return self._run(_ops.release(self._statements, key, owner), key, write=True) == 1

    def release_grant(self, key: str, owner: str, token: int) -> None:
        """Blocking :meth:`MySQLLeaseProvider.release_grant`."""
        self._run(_ops.release_grant(self._statements, key, owner, token), key, write=True)

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return self._run(_ops.renew(self._statements, key, owner, ttl_ms), key, write=True)

    def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int,
        *,
        metadata: bytes | str | None = None,
    ) -> bool:
        """Blocking :meth:`MySQLLeaseProvider.transfer_lease`."""
        data = metadata_for(self, metadata)
        op = _ops.transfer(self._statements, key, from_owner, to_owner, ttl_ms, data)
        return self._run(op, key, write=True)

    def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases in key order, optionally only keys starting with ``prefix``."""
        return self._run(_ops.inspect(self._statements, prefix, limit), prefix)

    def sweep(self) -> int:
        """Blocking :meth:`MySQLLeaseProvider.sweep`."""
        settings = self._settings
        return self._run(_ops.sweep(self._statements, settings.sweep_grace_s, settings.sweep_batch))

    def row_count(self) -> int:
        """Blocking :meth:`MySQLLeaseProvider.row_count`."""
        return self._run(_ops.row_count(self._statements))

    def migrate(self) -> int:
        """Create what is missing of the schema; see :meth:`MySQLLeaseProvider.migrate`."""
        version: int = self._call(self._migrate)
        return version

    def _migrate(self) -> int:
        return self._transport.run(_ops.migrate(self._schema))

    def acquire_slot(
        self, key: str, owner: str, ttl_ms: int, *, limit: int, exclusive: bool = False
    ) -> SlotResult:
        """Blocking :meth:`MySQLLeaseProvider.acquire_slot`."""
        op = _slots.acquire_slot(self._statements, key, owner, ttl_ms, limit, exclusive)
        return self._run(op, key, write=True)

    def renew_slot(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`MySQLLeaseProvider.renew_slot`."""
        return self._run(_slots.renew_slot(self._statements, key, owner, ttl_ms), key, write=True)

    def release_slot(self, key: str, owner: str) -> bool:
        """Blocking :meth:`MySQLLeaseProvider.release_slot`."""
        return self._run(_slots.release_slot(self._statements, key, owner), key, write=True)

    def transfer_slot(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`MySQLLeaseProvider.transfer_slot`."""
        op = _slots.transfer_slot(self._statements, key, from_owner, to_owner, ttl_ms)
        return self._run(op, key, write=True)

    def get_slot_holders(self, key: str) -> list[LeaseRecord]:
        """Blocking :meth:`MySQLLeaseProvider.get_slot_holders`."""
        return self._run(_slots.slot_holders(self._statements, key), key)

    def acquire_lease_in_turn(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        *,
        place_ttl_ms: int,
        metadata: bytes | str | None = None,
    ) -> LeaseResult:
        """Blocking :meth:`MySQLLeaseProvider.acquire_lease_in_turn`."""
        data = None if metadata is None else metadata_for(self, metadata)
        op = _slots.acquire_in_turn(self._statements, key, owner, ttl_ms, place_ttl_ms, data)
        return self._run(op, key, write=True)
