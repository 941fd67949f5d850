"""The SQLite providers, async and blocking: lifecycle, and each method one operation.

Both run ``_ops``'s operations, with the same path and options (checked by ``_options``):
the async one through ``_aio``'s thread, the blocking one through ``_blocking``'s
connection in the caller's thread. Neither touches the other's state.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ClassVar, TypeAlias, TypeVar

from leasekit import Capabilities, LeaseResult, SlotResult
from leasekit.backend import (
    BackendProvider,
    ErrorMap,
    Grant,
    LeaseRecord,
    Rebuild,
    RenewItem,
    SlotGrant,
    SyncBackendProvider,
    metadata_for,
)

from . import _ops, _options, _slots
from ._aio import ThreadedConnection
from ._blocking import Connection

__all__ = ["SQLiteLeaseProvider", "SQLiteSyncLeaseProvider"]

_T = TypeVar("_T")
_P = TypeVar("_P", bound="_OnFile")
_Path: TypeAlias = "str | os.PathLike[str]"


class _OnFile:
    """What both providers are alike in: built from a path or URL, and named by the file."""

    path: str
    create: bool
    _rebuild: Rebuild | None
    _sweeper: _ops.Sweeper

    def _adopt(self, settings: _options.SQLiteSettings) -> None:
        # Its client is the file's name: a forked child opens the file anew.
        self._rebuild = Rebuild(type(self), settings.path, dict(settings.options))
        self.path = settings.path
        self.create = settings.create
        self._sweeper = _ops.Sweeper(settings.sweep_every, settings.sweep_batch)

    @classmethod
    def from_url(cls: type[_P], url: str, **options: Any) -> _P:
        """Build from ``sqlite:///rel.db`` or ``sqlite:////abs.db``; ``options`` win; no I/O."""
        settings = _options.url_settings(url, **options)
        build: Callable[..., _P] = cls  # each provider's own __init__(path, **options)
        return build(settings.path, **settings.options)

    def _describe(self) -> str:
        return repr(self.path)

    def _where(self) -> str:
        return f" (file {self.path!r})"


class SQLiteLeaseProvider(_OnFile, BackendProvider):
    """Leases in a SQLite file: atomic across the processes of one host.

    ``sqlite:///leasekit.db`` (relative) or ``sqlite:////abs/path.db``. Options (also
    as URL query parameters): ``timeout_s`` bounds every operation, waiting for the
    file's write lock included (default 5); ``synchronous`` is SQLite's durability
    setting (default ``full``, so fencing tokens survive power loss; ``normal`` is
    faster and still safe against process crashes); ``sweep_every`` and
    ``sweep_batch`` tune how expired rows are reclaimed; ``create`` (or
    ``create_schema``, the name the other SQL backends use; default true) creates a
    missing file and its tables, and with ``create=false`` a missing file is an error
    instead (``leasekit owner`` and ``inspect`` open files that way, so a typo never
    leaves a new file behind).

    Expiry uses the host's wall clock (``server_clock=False``): all processes share it,
    but a clock step changes remaining lease times. Never put the file on a network
    filesystem: WAL needs shared memory between the processes.
    """

    backend: ClassVar[str] = _options.BACKEND
    # sqlite3 runs in a thread of the provider's own: no connection belongs to a loop.
    _loop_bound: ClassVar[bool] = False
    capabilities: Capabilities = _options.CAPABILITIES
    errors: ClassVar[ErrorMap] = _options.ERRORS
    # What `leasekit owner` and `leasekit inspect` pass: reading never creates a file.
    read_only_options: ClassVar[dict[str, Any]] = {"create": False}

    def __init__(self, path: _Path = _options.DEFAULT_PATH, **options: Any) -> None:
        """Open (lazily) the file at ``path``; ``options`` as in the class docstring."""
        settings = _options.settings(path, options)
        super().__init__(timeout_s=settings.timeout_s, owns_client=True)
        self._adopt(settings)
        self._connection = ThreadedConnection(settings)

    @classmethod
    def sync_from_url(cls, url: str, **options: Any) -> SQLiteSyncLeaseProvider:
        """The :class:`SQLiteSyncLeaseProvider` for this URL (``leasekit.sync.connect``)."""
        return SQLiteSyncLeaseProvider.from_url(url, **options)

    async def _connect(self) -> None:
        # Open now, so a bad path or a locked file shows up at the `async with`.
        await self._connection.run(_ops.nothing())

    async def _close_client(self) -> None:
        await self._connection.close()

    def _run(
        self, operation: _ops.Op[_T], key: str | None, grant: Grant | None = None
    ) -> Coroutine[Any, Any, _T]:
        # Not a coroutine of its own (one frame fewer); the connection is looked up after
        # _refuse_if_closed, which gives a forked child (or a new loop) its new one.
        self._refuse_if_closed()
        return self._call(self._connection.run(operation), key, grant)

    def _write(
        self, operation: _ops.Op[_T], key: str | None, grant: Grant | None = None
    ) -> Coroutine[Any, Any, _T]:
        self._refuse_if_closed()
        operation = self._sweeper.after_write(operation)
        return self._call(self._connection.run(operation, write=True), key, grant)

    # -- the contract -------------------------------------------------------------------

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, metadata: bytes | str | None = None
    ) -> LeaseResult:
        operation = _ops.acquire(key, owner, ttl_ms, metadata_for(self, metadata))
        if self._undos:
            await self._after_undo(key, owner)
        return await self._write(operation, key, grant=owner)

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

        One ``BEGIN IMMEDIATE`` transaction over the lease and the key's line of waiters.
        """
        data = metadata_for(self, metadata)
        operation = _ops.acquire_in_turn(key, owner, ttl_ms, place_ttl_ms, data)
        if self._undos:
            await self._after_undo(key, owner)
        return await self._write(operation, key, grant=owner)

    async def get_lease_owner(self, key: str) -> str | None:
        return await self._run(_ops.owner(key), key)

    async def release_lease(self, key: str, owner: str) -> None:
        await self._write(_ops.release(key, owner), key)

    async def release_if_held(self, key: str, owner: str) -> bool:
        """Release ``key`` if ``owner`` holds it; whether it did (``SupportsReleaseReport``)."""
        return await self._write(_ops.release(key, owner), key)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return await self._write(_ops.renew(key, owner, ttl_ms), key)

    async def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int,
        *,
        metadata: bytes | str | None = None,
    ) -> bool:
        data = metadata_for(self, metadata)
        operation = _ops.transfer(key, from_owner, to_owner, ttl_ms, data)
        grant = to_owner if to_owner != from_owner else None  # else a renewal
        if grant is not None and self._undos:
            await self._after_undo(key, grant)
        return await self._write(operation, key, grant=grant)

    # -- beyond the contract -------------------------------------------------------------

    async def get_lease_record(self, key: str) -> LeaseRecord | None:
        """The live lease of ``key`` with its metadata, ``None`` if free (``SupportsRecords``).

        One statement; ``remaining_ms`` by the host's clock, as SQLite judges expiry.
        """
        return await self._run(_ops.record(key), key)

    # -- counting leases (SupportsSlots) ------------------------------------------------

    async def acquire_slot(
        self, key: str, owner: str, ttl_ms: int, *, limit: int, exclusive: bool = False
    ) -> SlotResult:
        """Take one of ``limit`` slots of ``key`` (``leasekit.backend.SupportsSlots``).

        One ``BEGIN IMMEDIATE`` transaction: the key's expired slots dropped, its limit,
        count and the caller's slot read, and the slot written, with no other writer
        in between.
        """
        operation = _slots.acquire_slot(key, owner, ttl_ms, limit, exclusive)
        grant = SlotGrant(owner)
        if self._undos:
            await self._after_undo(key, grant)
        return await self._write(operation, key, grant)

    async def renew_slot(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Reset the TTL of ``owner``'s live slot of ``key``; whether it held one."""
        return await self._write(_slots.renew_slot(key, owner, ttl_ms), key)

    async def release_slot(self, key: str, owner: str) -> bool:
        """Free ``owner``'s live slot of ``key``; whether it held one."""
        return await self._write(_slots.release_slot(key, owner), key)

    async def release_slot_grant(self, key: str, owner: str, token: int) -> bool:
        """Free ``owner``'s slot of ``key`` only if it carries ``token`` (undoing a grant)."""
        return await self._write(_slots.release_slot_grant(key, owner, token), key)

    async def transfer_slot(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Hand ``from_owner``'s live slot of ``key`` to ``to_owner`` (a new token)."""
        operation = _slots.transfer_slot(key, from_owner, to_owner, ttl_ms)
        grant = SlotGrant(to_owner) if to_owner != from_owner else None  # else a renewal
        if grant is not None and self._undos:
            await self._after_undo(key, grant)
        return await self._write(operation, key, grant)

    async def get_slot_holders(self, key: str) -> list[LeaseRecord]:
        """The live slots of ``key``, in grant order."""
        return await self._run(_slots.slot_holders(key), key)

    async def lease_remaining_ms(self, key: str) -> int | None:
        """Milliseconds left on the live lease of ``key`` (host clock), ``None`` if free.

        SQLite has no way to tell other processes about a release, so waiters poll; with
        this they never sleep past a holder's expiry (``leasekit.backend.SupportsRemaining``).
        """
        return await self._run(_ops.remaining(key), key)

    async def release_grant(self, key: str, owner: str, token: int) -> None:
        """Release ``key`` if ``owner`` holds it with ``token`` (``SupportsReleaseGrant``)."""
        await self._write(_ops.release_grant(key, owner, token), key)

    async def renew_leases(self, items: Sequence[RenewItem]) -> list[bool]:
        """Renew many leases in one ``BEGIN IMMEDIATE`` transaction (``SupportsRenewMany``).

        One result per ``(key, owner, ttl_ms)``, each RENEW's own answer; one trip to
        the provider's thread and one commit for the whole batch.
        """
        operation = _ops.renew_many(items)
        return await self._write(operation, items[0][0] if items else None)

    async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases (key order), optionally only keys starting with ``prefix``."""
        return await self._run(_ops.inspect(prefix, limit), prefix)

    async def sweep(self) -> int:
        """Sweep the next window of ``sweep_batch`` keys now; returns how many rows it deleted."""
        return await self._run(self._sweeper.sweep(), None)

    async def row_count(self) -> int:
        """Rows in the table, live and expired: what the sweep keeps bounded."""
        return await self._run(_ops.row_count(), None)

    async def migrate(self) -> int:
        """Create the file's tables if they are missing (``leasekit migrate URL``).

        Idempotent; every provider with ``create`` on does it when it opens the file.
        Returns the schema version recorded.
        """
        return await self._run(_ops.migrate(), None)


class SQLiteSyncLeaseProvider(_OnFile, SyncBackendProvider):
    """Leases in a SQLite file from blocking code; safe to share between threads.

    Made by ``leasekit.sync.connect("sqlite:///path.db")``; the path and options of
    :class:`SQLiteLeaseProvider`. Each operation runs in the calling thread; threads
    take turns on the provider's one connection (SQLite serialises writers to a file
    anyway), and processes share the file as with the async provider. Deadlines: the
    wait for a turn and SQLite's busy timeout both end at ``timeout_s``.
    """

    backend: ClassVar[str] = _options.BACKEND
    capabilities: Capabilities = _options.CAPABILITIES
    errors: ClassVar[ErrorMap] = _options.ERRORS

    def __init__(self, path: _Path = _options.DEFAULT_PATH, **options: Any) -> None:
        """Open (lazily) the file at ``path``; ``options`` as for :class:`SQLiteLeaseProvider`."""
        settings = _options.settings(path, options)
        super().__init__(timeout_s=settings.timeout_s, owns_client=True)
        self._adopt(settings)
        self._connection = Connection(settings)

    def _run(self, operation: _ops.Op[_T], key: str | None) -> _T:
        result: _T = self._call(self._connection.run_in_turn, operation, self.timeout_s, key=key)
        return result

    def _write(self, operation: _ops.Op[_T], key: str | None) -> _T:
        return self._run(self._sweeper.after_write(operation), key)

    def _connect(self) -> None:
        self._run(_ops.nothing(), None)

    def _close_client(self) -> None:
        self._connection.close()

    def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, metadata: bytes | str | None = None
    ) -> LeaseResult:
        """Blocking :meth:`SQLiteLeaseProvider.acquire_lease`."""
        return self._write(_ops.acquire(key, owner, ttl_ms, metadata_for(self, metadata)), key)

    def acquire_lease_in_turn(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        *,
        place_ttl_ms: int,
        metadata: bytes | str | None = None,
    ) -> LeaseResult:
        """Blocking :meth:`SQLiteLeaseProvider.acquire_lease_in_turn`."""
        data = metadata_for(self, metadata)
        return self._write(_ops.acquire_in_turn(key, owner, ttl_ms, place_ttl_ms, data), key)

    def get_lease_owner(self, key: str) -> str | None:
        """Blocking :meth:`SQLiteLeaseProvider.get_lease_owner`."""
        return self._run(_ops.owner(key), key)

    def release_lease(self, key: str, owner: str) -> None:
        """Blocking :meth:`SQLiteLeaseProvider.release_lease`."""
        self._write(_ops.release(key, owner), key)

    def release_if_held(self, key: str, owner: str) -> bool:
        """Blocking :meth:`SQLiteLeaseProvider.release_if_held`."""
        return self._write(_ops.release(key, owner), key)

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`SQLiteLeaseProvider.renew_lease`."""
        return self._write(_ops.renew(key, owner, ttl_ms), key)

    def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int,
        *,
        metadata: bytes | str | None = None,
    ) -> bool:
        """Blocking :meth:`SQLiteLeaseProvider.transfer_lease`."""
        data = metadata_for(self, metadata)
        return self._write(_ops.transfer(key, from_owner, to_owner, ttl_ms, data), key)

    def get_lease_record(self, key: str) -> LeaseRecord | None:
        """Blocking :meth:`SQLiteLeaseProvider.get_lease_record`."""
        return self._run(_ops.record(key), key)

    def acquire_slot(
        self, key: str, owner: str, ttl_ms: int, *, limit: int, exclusive: bool = False
    ) -> SlotResult:
        """Blocking :meth:`SQLiteLeaseProvider.acquire_slot`."""
        return self._write(_slots.acquire_slot(key, owner, ttl_ms, limit, exclusive), key)

    def renew_slot(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`SQLiteLeaseProvider.renew_slot`."""
        return self._write(_slots.renew_slot(key, owner, ttl_ms), key)

    def release_slot(self, key: str, owner: str) -> bool:
        """Blocking :meth:`SQLiteLeaseProvider.release_slot`."""
        return self._write(_slots.release_slot(key, owner), key)

    def transfer_slot(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`SQLiteLeaseProvider.transfer_slot`."""
        return self._write(_slots.transfer_slot(key, from_owner, to_owner, ttl_ms), key)

    def get_slot_holders(self, key: str) -> list[LeaseRecord]:
        """Blocking :meth:`SQLiteLeaseProvider.get_slot_holders`."""
        return self._run(_slots.slot_holders(key), key)

    def lease_remaining_ms(self, key: str) -> int | None:
        """Blocking :meth:`SQLiteLeaseProvider.lease_remaining_ms`."""
        return self._run(_ops.remaining(key), key)

    def release_grant(self, key: str, owner: str, token: int) -> None:
        """Blocking :meth:`SQLiteLeaseProvider.release_grant`."""
        self._write(_ops.release_grant(key, owner, token), key)

    def renew_leases(self, items: Sequence[RenewItem]) -> list[bool]:
        """Blocking :meth:`SQLiteLeaseProvider.renew_leases`: one transaction for the batch."""
        return self._write(_ops.renew_many(items), items[0][0] if items else None)

    def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """Blocking :meth:`SQLiteLeaseProvider.inspect`."""
        return self._run(_ops.inspect(prefix, limit), prefix)

    def sweep(self) -> int:
        """Blocking :meth:`SQLiteLeaseProvider.sweep`."""
        return self._run(self._sweeper.sweep(), None)

    def row_count(self) -> int:
        """Blocking :meth:`SQLiteLeaseProvider.row_count`."""
        return self._run(_ops.row_count(), None)

    def migrate(self) -> int:
        """Blocking :meth:`SQLiteLeaseProvider.migrate`."""
        return self._run(_ops.migrate(), None)
