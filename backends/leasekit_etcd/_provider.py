"""The etcd providers' lifecycles: ``EtcdLeaseProvider`` (asyncio), ``EtcdSyncLeaseProvider``.

One module, over 500 lines: both providers' lifecycles and their extras (records,
slots, the line of waiters) side by side.

Both run the operations of ``_ops`` (the layout, the transactions, each operation's
round trips), the async one on grpc.aio (``_aio``), the blocking one on grpc's blocking
channels (``_blocking``). Expiry is etcd's: the leader revokes the etcd lease when its
TTL runs out and deletes the record in the same step.

No etcd lease is left behind: every etcd lease a provider grants ends up bound to a
record whose operation returned to its caller, or revoked. One that a transaction left
without a record, or that an operation failing midway may have left, is revoked in the
background, off the caller's path (the async provider's tasks, which ``flush`` waits
for and ``aclose`` drains within ``timeout_s``; the blocking provider's revocation
thread, drained by ``close``). One that cannot be revoked in time ends at its TTL.
``docs/backends/etcd.md`` has the round trips per operation and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Sequence
from typing import Any, ClassVar, TypeVar

from leasekit import LeaseBackendError, LeaseResult, SlotResult
from leasekit.backend import (
    BackendProvider,
    ErrorMap,
    Grant,
    LeaseRecord,
    Operation,
    ReleaseWatch,
    SlotGrant,
    SyncBackendProvider,
)

from . import _aio, _blocking, _fair, _ops, _slots
from ._keys import holder_range
from ._members import SETTLE_S, GrpcState
from ._notify import EtcdReleaseListener, WatchStream
from ._options import (
    BACKEND,
    CAPABILITIES,
    DEFAULT_MIN_TTL_S,
    DEFAULT_PREFIX,
    ERRORS,
    FORKED_AFTER_GRPC,
    check_settings,
    url_settings,
)

__all__ = ["EtcdLeaseProvider", "EtcdSyncLeaseProvider"]

_T = TypeVar("_T")
_Op = Operation[_ops.Request, _T]


class EtcdLeaseProvider(BackendProvider):
    """Leases in etcd: transactions on the raft log, etcd-lease TTLs, fencing tokens.

    Use :meth:`from_url` / ``leasekit.connect("etcd://host:port,host:port")`` (the
    provider opens one gRPC channel per endpoint and closes them in ``aclose``), or
    pass endpoints (``["10.0.0.1:2379", ...]``) or your own connected-or-not
    ``aetcd.Client`` (used through its channel, never closed by the provider; one
    endpoint, so no failover). :meth:`sync_from_url` (``leasekit.sync.connect``) gives
    the blocking :class:`EtcdSyncLeaseProvider`.

    - ``prefix`` (default ``"leasekit/"``) starts every etcd key the provider writes.
    - ``timeout_s`` (default 5) bounds every operation end to end, all its round trips
      and any failover included: a stalled cluster raises
      :class:`~leasekit.LeaseBackendTimeout`, never hangs; a cluster whose every
      member refuses connections raises :class:`~leasekit.LeaseBackendUnreachable`
      at once.
    - ``connect_timeout_s`` (default 1): with several endpoints, how long to wait for a
      member's connection before trying the next.
    - ``username``/``password`` for etcd's authentication; ``tls`` with ``ca``,
      ``cert``, ``key`` (PEM bytes) for ``etcds://``.
    - ``reuse_leases`` (default True): for TTLs of 10 s and more, bind the etcd leases
      this provider's operations left empty again, granted one second longer than the
      TTL for that, so that a free key costs one transaction; False (and any shorter
      TTL) grants a lease of exactly the TTL (rounded up) per acquire and revokes each
      when it is left empty.

    TTLs are whole seconds (rounded up) and at least the server's minimum (2 s with
    etcd's default election timeout). See ``docs/backends/etcd.md``.
    """

    backend: ClassVar[str] = BACKEND
    errors: ClassVar[ErrorMap] = ERRORS
    capabilities = CAPABILITIES

    def __init__(
        self,
        client: Any = None,
        *,
        endpoints: Sequence[str] | None = None,
        prefix: str = DEFAULT_PREFIX,
        timeout_s: float = 5.0,
        connect_timeout_s: float = 1.0,
        username: str | None = None,
        password: str | None = None,
        reuse_leases: bool = True,
        tls: bool = False,
        ca: bytes | None = None,
        cert: bytes | None = None,
        key: bytes | None = None,
    ) -> None:
        settings = check_settings(
            client,
            endpoints,
            prefix=prefix,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            username=username,
            password=password,
            reuse_leases=reuse_leases,
            tls=tls,
            ca=ca,
            cert=cert,
            key=key,
        )
        super().__init__(timeout_s=settings.timeout_s, owns_client=client is None)
        self.prefix: str = settings.prefix
        self.connect_timeout_s: float = settings.connect_timeout_s
        self._client = client
        self.endpoints = settings.endpoints or (f"{client._host}:{client._port}",)
        self._transport: _aio.AioTransport | None = (
            None if client is not None else _aio.AioTransport(settings.members(_aio.open_channel))
        )
        self._ctx = _ops.Context(
            settings.prefix_bytes,
            reuse=settings.reuse_leases,
            revoke_later=self._revoke_later,
            now=_loop_time,
            call_at=_aio.call_at,
            min_ttl_s=DEFAULT_MIN_TTL_S,
        )
        self._pool = self._ctx.pool
        self._stream = WatchStream(self._opened, timeout_s=self.timeout_s, spawn=self._spawn_open)
        self._listener = self._release_listener = EtcdReleaseListener(
            self._stream, timeout_s=self.timeout_s, lost=self._stream.lost
        )

    @classmethod
    def from_url(cls, url: str, **options: Any) -> EtcdLeaseProvider:
        """Build a provider from ``etcd://[user:password@]host:port[,host:port...]``.

        Hosts are names, IPv4 or bracketed IPv6 addresses (``[::1]:2379``), the port
        2379 if left out. ``etcds://`` uses TLS, with ``ca_file``, ``cert_file`` and
        ``key_file`` (PEM paths, read now) for a private CA and a client certificate.
        Other options (``prefix``, ``timeout_s``, ``connect_timeout_s``,
        ``reuse_leases``, and ``username``/``password`` instead of the URL's) come from
        the query or from keyword arguments, which win. Anything else is an
        :class:`~leasekit.InvalidLeaseArgument`. No network I/O.
        """
        return cls(**url_settings(url, **options).provider_arguments())

    @classmethod
    def sync_from_url(cls, url: str, **options: Any) -> EtcdSyncLeaseProvider:
        """The blocking provider :func:`leasekit.sync.connect` uses for this URL: the
        same URL, options and errors as :meth:`from_url`, on grpc's blocking channels."""
        return EtcdSyncLeaseProvider.from_url(url, **options)

    def _after_fork_in_child(self) -> None:
        # gRPC cannot run in a process forked after it started (grpc.aio has no fork
        # support: a call aborts the process or never answers), on any channel.
        if not self._closing and GrpcState.started:
            self._closing = True
            self._closed_reason = FORKED_AFTER_GRPC

    async def _run(self, key: str | None, operation: _Op[_T], grant: Grant | None = None) -> _T:
        """Run one operation within ``timeout_s``, its errors mapped at one boundary."""
        if grant is not None and key is not None and self._undos:
            await self._after_undo(key, grant)
        return await self._call(self._operate(operation), key, grant)

    async def _operate(self, operation: _Op[_T], budget_s: float | None = None) -> _T:
        transport = self._transport or await self._opened()
        return await transport.run(operation, _loop_time() + (budget_s or self.timeout_s))

    async def _opened(self) -> _aio.AioTransport:
        if self._transport is None:  # on a caller's aetcd.Client, connected now
            self._transport = await _aio.AioTransport.adopt(
                self._client, self.endpoints[0], connect_timeout_s=self.connect_timeout_s
            )
        return self._transport

    async def _connect(self) -> None:
        # One read now, so a wrong address, TLS setting or password shows up here. A
        # failed check closes the provider, which gives gRPC SETTLE_S after the call it
        # cut off: the check ends that much sooner, so `async with` ends by timeout_s.
        try:
            budget_s = max(self.timeout_s - SETTLE_S, self.timeout_s / 2)
            await self._operate(_ops.ping(self._ctx), budget_s)
        except TimeoutError:  # the check's own deadline ran out between attempts
            raise self._timeout(None) from None

    def _housekeep_before_close(self) -> None:
        for lease in self._pool.take_all_idle():
            self._ctx.revoke(lease)

    async def _close_client(self) -> None:
        if self._transport is not None:
            await self._transport.close()

    def _describe(self) -> str:
        return _describe(self.endpoints, self.prefix)

    def _where(self) -> str:
        return _where(self._transport, self.endpoints)

    def _spawn_open(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        if self.closed:
            coroutine.close()
        else:
            self._spawn(coroutine)

    def _revoke_later(self, lease_id: int) -> None:
        transport = self._transport
        if transport is None or transport.closed:
            return  # nothing left to send it on: the empty lease ends at its TTL

        async def revoke() -> None:
            # If the store is failing, the lease expires with its TTL anyway.
            with contextlib.suppress(LeaseBackendError, *self.errors.types):
                await transport.run(_ops.revoke(lease_id), _loop_time() + self.timeout_s)

        self._spawn(revoke())

    # -- the contract, and beyond -------------------------------------------------------

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, metadata: bytes | str | None = None
    ) -> LeaseResult:
        operation = _ops.acquire(self._ctx, key, owner, ttl_ms, metadata)
        return await self._run(key, operation, owner)

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

        The key's holder and its line read side by side, then (in the caller's turn)
        one transaction that compares both, or the caller's place kept (see ``_fair``).
        """
        operation = _fair.acquire_in_turn(
            self._ctx, key, owner, ttl_ms, place_ttl_ms=place_ttl_ms, metadata=metadata
        )
        return await self._run(key, operation, owner)

    async def get_lease_record(self, key: str) -> LeaseRecord | None:
        """The live lease of ``key``, ``None`` if free (``SupportsRecords``): a range read
        of its record and its etcd lease's time left (whole seconds, rounded down), side
        by side where this provider saw the record on that etcd lease before."""
        return await self._run(key, _ops.record(self._ctx, key))

    async def get_lease_owner(self, key: str) -> str | None:
        return await self._run(key, _ops.owner(self._ctx, key))

    async def release_lease(self, key: str, owner: str) -> None:
        await self._run(key, _ops.release(self._ctx, key, owner))

    async def release_if_held(self, key: str, owner: str) -> bool:
        """Release ``key`` if ``owner`` holds it; whether it did (``SupportsReleaseReport``)."""
        return await self._run(key, _ops.release(self._ctx, key, owner))

    async def release_grant(self, key: str, owner: str, token: int) -> None:
        """Release ``key`` if ``owner`` holds it with ``token`` (``SupportsReleaseGrant``)."""
        await self._run(key, _ops.release_grant(self._ctx, key, owner, token))

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return await self._run(key, _ops.renew(self._ctx, key, owner, ttl_ms))

    async def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int,
        *,
        metadata: bytes | str | None = None,
    ) -> bool:
        operation = _ops.transfer(self._ctx, key, from_owner, to_owner, ttl_ms, metadata)
        return await self._run(key, operation, None if from_owner == to_owner else to_owner)

    async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases in key order, optionally only keys starting with ``prefix``.

        One range read per batch of records, then one ``LeaseTimeToLive`` per lease for
        the remaining time (whole seconds, as etcd reports it), all within ``timeout_s``.
        Not a snapshot: leases that change meanwhile may or may not be listed.
        """
        return await self._run(prefix, _ops.inspect(self._ctx, prefix, limit))

    # -- counting leases (SupportsSlots) ------------------------------------------------

    async def acquire_slot(
        self, key: str, owner: str, ttl_ms: int, *, limit: int, exclusive: bool = False
    ) -> SlotResult:
        """Take one of ``limit`` slots of ``key`` (``leasekit.backend.SupportsSlots``).

        A range read of the key's slots, claim and generation, then (to grant, or to
        place an exclusive acquirer's claim) one transaction that compares the
        generation with the one read, reading again if it moved (see ``_slots``).
        """
        operation = _slots.acquire_slot(
            self._ctx, key, owner, ttl_ms, limit=limit, exclusive=exclusive
        )
        return await self._run(key, operation, SlotGrant(owner))

    async def renew_slot(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Reset the TTL of ``owner``'s live slot of ``key``; whether it held one."""
        return await self._run(key, _slots.renew_slot(self._ctx, key, owner, ttl_ms))

    async def release_slot(self, key: str, owner: str) -> bool:
        """Free ``owner``'s live slot of ``key``; whether it held one."""
        return await self._run(key, _slots.release_slot(self._ctx, key, owner))

    async def release_slot_grant(self, key: str, owner: str, token: int) -> bool:
        """Free ``owner``'s slot of ``key`` only if it carries ``token`` (undoing a grant)."""
        return await self._run(key, _slots.release_slot_grant(self._ctx, key, owner, token))

    async def transfer_slot(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Hand ``from_owner``'s live slot of ``key`` to ``to_owner`` (a new token)."""
        operation = _slots.transfer_slot(self._ctx, key, from_owner, to_owner, ttl_ms)
        grant = SlotGrant(to_owner) if to_owner != from_owner else None  # else a renewal
        return await self._run(key, operation, grant)

    async def get_slot_holders(self, key: str) -> list[LeaseRecord]:
        """The live slots of ``key``, in grant order (time left in whole seconds, as
        etcd reports its leases')."""
        return await self._run(key, _slots.slot_holders(self._ctx, key))

    async def watch_release(self, key: str, *, grants: bool = False) -> ReleaseWatch:
        """Watch ``key`` for release, transfer and expiry (and, with ``grants``, for the
        key changing hands): a watch on its records."""
        _ops.owner(self._ctx, key).close()  # validates the key
        start, end = holder_range(self._ctx.prefix, key)
        self._refuse_if_closed()
        return await self._call(self._listener.watch(key, start, end, grants=grants), key)

    async def break_notifications(self) -> None:
        """Cut the watch stream, as a failed member would (for tests)."""
        await self._stream.cut()

    async def lease_ids(self) -> list[int]:
        """Every etcd lease in the cluster (``LeaseLeases``), not only this provider's.

        For tests and diagnostics; it first waits for this provider's background
        revocations (:meth:`flush`), so that the list is settled.
        """
        await self.flush()
        return await self._run(None, _ops.lease_ids())

    async def flush(self) -> None:
        """Revoke the idle etcd leases kept for reuse, and wait for every revocation in
        the background (each bounded; one that fails ends at its TTL). Never raises."""
        self._housekeep_before_close()
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


class EtcdSyncLeaseProvider(SyncBackendProvider):
    """Leases in etcd from threads: the same operations on grpc's blocking channels.

    Built by ``leasekit.sync.connect("etcd://...")`` (:meth:`from_url`), with the URL,
    options and errors of :class:`EtcdLeaseProvider` (whose keyword arguments it takes,
    a caller's client aside); safe to share between threads. Each call is bounded by
    ``timeout_s`` through gRPC's per-call ``timeout=`` (what is left of the
    operation's), failing over between endpoints as the async provider does.

    etcd leases are reused as the async provider reuses them (``reuse_leases``, on by
    default, for TTLs of 10 s and more): an acquire binds an idle one this provider
    granted, in its one transaction, instead of granting one first. An etcd lease left
    without a record (and not kept) is revoked by one background thread, which also
    revokes each kept one once it can no longer be bound; :meth:`flush` revokes the
    kept ones now, :meth:`close` too and drains the thread.

    In a forked child, a provider is rebuilt and works if its process had not opened
    any gRPC channel before the fork; once gRPC has started in the parent (any etcd
    provider used), the child's provider refuses every call, saying why.
    """

    backend: ClassVar[str] = BACKEND
    errors: ClassVar[ErrorMap] = ERRORS
    capabilities = CAPABILITIES

    def __init__(self, *, endpoints: Sequence[str], **options: Any) -> None:
        settings = check_settings(None, endpoints, **options)
        super().__init__(timeout_s=settings.timeout_s, owns_client=True)
        self.prefix: str = settings.prefix
        self.endpoints = settings.endpoints
        self._transport = _blocking.BlockingTransport(settings.members(_blocking.open_channel))
        self._revoker = _blocking.Revoker(self._transport, self.timeout_s)
        self._ctx = _ops.Context(
            settings.prefix_bytes,
            reuse=settings.reuse_leases,
            revoke_later=self._revoker,
            now=time.monotonic,
            call_at=self._revoker.call_at,
            min_ttl_s=DEFAULT_MIN_TTL_S,
        )
        self._pool = self._ctx.pool

    @classmethod
    def from_url(cls, url: str, **options: Any) -> EtcdSyncLeaseProvider:
        """Build a provider from an ``etcd://`` URL, as :meth:`EtcdLeaseProvider.from_url`."""
        return cls(**url_settings(url, **options).provider_arguments())

    def _after_fork_in_child(self) -> None:
        if not self._closing and GrpcState.started:  # see the class's docstring
            self._closing = True
            self._closed_reason = FORKED_AFTER_GRPC
            return
        super()._after_fork_in_child()

    def _run(self, operation: _Op[_T], key: str | None) -> _T:
        result: _T = self._call(self._transport.run, operation, self.timeout_s, key=key)
        return result

    def _connect(self) -> None:
        self._transport.run(_ops.ping(self._ctx), self.timeout_s)

    def _close_client(self) -> None:
        self._revoke_idle()
        self._revoker.drain()
        self._transport.close()

    def _revoke_idle(self) -> None:
        for lease in self._pool.take_all_idle():
            self._ctx.revoke(lease)

    def _describe(self) -> str:
        return _describe(self.endpoints, self.prefix)

    def _where(self) -> str:
        return _where(self._transport, self.endpoints)

    def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, metadata: bytes | str | None = None
    ) -> LeaseResult:
        return self._run(_ops.acquire(self._ctx, key, owner, ttl_ms, metadata), key)

    def acquire_lease_in_turn(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        *,
        place_ttl_ms: int,
        metadata: bytes | str | None = None,
    ) -> LeaseResult:
        """Blocking :meth:`EtcdLeaseProvider.acquire_lease_in_turn`."""
        operation = _fair.acquire_in_turn(
            self._ctx, key, owner, ttl_ms, place_ttl_ms=place_ttl_ms, metadata=metadata
        )
        return self._run(operation, key)

    def get_lease_record(self, key: str) -> LeaseRecord | None:
        """The live lease of ``key``, ``None`` if free, as
        :meth:`EtcdLeaseProvider.get_lease_record`."""
        return self._run(_ops.record(self._ctx, key), key)

    def get_lease_owner(self, key: str) -> str | None:
        return self._run(_ops.owner(self._ctx, key), key)

    def release_lease(self, key: str, owner: str) -> None:
        self._run(_ops.release(self._ctx, key, owner), key)

    def release_if_held(self, key: str, owner: str) -> bool:
        """Blocking :meth:`EtcdLeaseProvider.release_if_held`."""
        return self._run(_ops.release(self._ctx, key, owner), key)

    def release_grant(self, key: str, owner: str, token: int) -> None:
        """Release ``key`` if ``owner`` holds it with ``token``."""
        self._run(_ops.release_grant(self._ctx, key, owner, token), key)

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return self._run(_ops.renew(self._ctx, key, owner, ttl_ms), key)

    def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int,
        *,
        metadata: bytes | str | None = None,
    ) -> bool:
        operation = _ops.transfer(self._ctx, key, from_owner, to_owner, ttl_ms, metadata)
        return self._run(operation, key)

    def acquire_slot(
        self, key: str, owner: str, ttl_ms: int, *, limit: int, exclusive: bool = False
    ) -> SlotResult:
        """Blocking :meth:`EtcdLeaseProvider.acquire_slot`."""
        operation = _slots.acquire_slot(
            self._ctx, key, owner, ttl_ms, limit=limit, exclusive=exclusive
        )
        return self._run(operation, key)

    def renew_slot(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`EtcdLeaseProvider.renew_slot`."""
        return self._run(_slots.renew_slot(self._ctx, key, owner, ttl_ms), key)

    def release_slot(self, key: str, owner: str) -> bool:
        """Blocking :meth:`EtcdLeaseProvider.release_slot`."""
        return self._run(_slots.release_slot(self._ctx, key, owner), key)

    def transfer_slot(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`EtcdLeaseProvider.transfer_slot`."""
        operation = _slots.transfer_slot(self._ctx, key, from_owner, to_owner, ttl_ms)
        return self._run(operation, key)

    def get_slot_holders(self, key: str) -> list[LeaseRecord]:
        """Blocking :meth:`EtcdLeaseProvider.get_slot_holders`."""
        return self._run(_slots.slot_holders(self._ctx, key), key)

    def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases in key order, as :meth:`EtcdLeaseProvider.inspect`."""
        return self._run(_ops.inspect(self._ctx, prefix, limit), prefix)

    def lease_ids(self) -> list[int]:
        """Every etcd lease in the cluster, after :meth:`flush`; as
        :meth:`EtcdLeaseProvider.lease_ids` (for tests and diagnostics)."""
        self.flush()
        return self._run(_ops.lease_ids(), None)

    def flush(self) -> None:
        """Revoke the idle etcd leases kept for reuse, and wait for every revocation in
        the background (each bounded; one that fails ends at its TTL). Never raises."""
        self._revoke_idle()
        self._revoker.flush()


def _describe(endpoints: Sequence[str], prefix: str) -> str:
    return f"etcd {', '.join(endpoints)}, prefix={prefix!r}"


def _where(
    transport: _aio.AioTransport | _blocking.BlockingTransport | None, endpoints: Sequence[str]
) -> str:
    failure = transport.members.last_failure if transport is not None else None
    return f" (etcd {failure or ', '.join(endpoints)})"


def _loop_time() -> float:
    return asyncio.get_running_loop().time()
