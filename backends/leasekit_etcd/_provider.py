"""The etcd providers' lifecycles: ``EtcdLeaseProvider`` (asyncio), ``EtcdSyncLeaseProvider``.

Each lease is one record bound to an etcd lease of its own (``_ops`` has the layout,
the transactions and each operation's round trips). Expiry is etcd's: the leader
revokes the etcd lease when its TTL runs out and deletes the record in the same step.
Both providers run the same operations, the async one on grpc.aio (``_aio``), the
blocking one on grpc's blocking channels (``_blocking``).

No etcd lease is left behind. Every etcd lease a provider grants ends up bound to a
record whose operation returned to its caller, or revoked. An operation waits only for
the round trips that decide its answer: an etcd lease that a transaction has just
detached from its record or never bound, or that an operation failing midway may have
left, is revoked in the background (the async provider's tasks, which :meth:`flush
<EtcdLeaseProvider.flush>` waits for and ``aclose`` drains within ``timeout_s``; the
blocking provider's revocation thread, drained by ``close``). A revocation that cannot
reach the server in time, or a reply that never came back, leaves a lease that ends
on its own at its granted TTL; nothing keeps such a lease alive.
``docs/backends/etcd.md`` has the round trips per operation and the argument for each
choice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from leasekit import LeaseBackendError, LeaseResult
from leasekit.backend import (
    BackendProvider,
    ErrorMap,
    LeaseRecord,
    Operation,
    ReleaseWatch,
    SyncBackendProvider,
)

from . import _aio, _blocking, _ops, _rpc
from ._keys import holder_range
from ._members import SETTLE_S, Member, Members
from ._notify import EtcdReleaseListener
from ._options import (
    BACKEND,
    CAPABILITIES,
    DEFAULT_MIN_TTL_S,
    DEFAULT_PREFIX,
    ERRORS,
    FORKED_AFTER_GRPC,
    EtcdSettings,
    check_settings,
    url_settings,
)

__all__ = ["EtcdLeaseProvider", "EtcdSyncLeaseProvider"]

_T = TypeVar("_T")


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
            client=client,
            endpoints=endpoints,
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
            min_ttl_s=DEFAULT_MIN_TTL_S,
        )
        self._pool = self._ctx.pool
        self._watcher: Any = None
        self._listener = self._release_listener = EtcdReleaseListener(
            self._release_watcher, timeout_s=self.timeout_s, lost=self._forget_watcher
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

    # -- one operation: its deadline, its round trips, its errors ---------------------

    def _after_fork_in_child(self) -> None:
        """In a forked child: refuse every call, with the reason, instead of crashing.

        gRPC cannot run in a process forked after it started (its C core's threads and
        pollers are not in the child, and grpc.aio has no fork support: a call aborts
        the process or never answers), whether on the parent's channel or a new one.
        """
        if not self._closing and self._loop is not None:  # used, so gRPC has started
            self._closing = True
            self._closed_reason = FORKED_AFTER_GRPC

    async def _run(
        self, key: str | None, operation: Operation[_ops.Request, _T], grant: str | None = None
    ) -> _T:
        """Run one operation within ``timeout_s``, its errors mapped at one boundary."""
        if grant is not None and key is not None and self._undos:
            await self._after_undo(key, grant)
        return await self._call(self._operate(operation), key, grant)

    async def _operate(
        self, operation: Operation[_ops.Request, _T], budget_s: float | None = None
    ) -> _T:
        transport = self._transport or await self._adopt_client()
        deadline = asyncio.get_running_loop().time() + (budget_s or self.timeout_s)
        return await transport.run(operation, deadline)

    async def _adopt_client(self) -> _aio.AioTransport:
        """A caller's aetcd.Client: its channel (and auth token) once it is connected."""
        client = self._client
        await client.connect()
        member = Member(
            self.endpoints[0],
            tls=None,
            credentials=None,
            channel=client.channel,
            metadata=tuple(client.metadata or ()),
        )
        members = Members([member], connect_timeout_s=self.connect_timeout_s)
        self._transport = _aio.AioTransport(members)
        return self._transport

    async def _connect(self) -> None:
        # One read now, so a wrong address, TLS setting or password shows up here. A
        # failed check closes the provider before `async with` raises, and closing gives
        # gRPC SETTLE_S after the call it cut off: the check ends that much before
        # timeout_s, so that `async with`, close included, ends by timeout_s.
        budget_s = max(self.timeout_s - SETTLE_S, self.timeout_s / 2)
        try:
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
        return f"etcd {', '.join(self.endpoints)}, prefix={self.prefix!r}"

    def _where(self) -> str:
        return _where(self._transport, self.endpoints)

    def _revoke_later(self, lease_id: int) -> None:
        """Revoke an etcd lease in the background (``aclose`` drains these)."""
        transport = self._transport
        if transport is None or transport.closed:
            return  # nothing left to send it on: the empty lease ends at its TTL

        async def revoke() -> None:
            # If the store is failing, the lease expires with its TTL anyway.
            with contextlib.suppress(LeaseBackendError, *self.errors.types):
                await transport.run(_ops.revoke(lease_id), _loop_time() + self.timeout_s)

        self._spawn(revoke())

    # -- the contract -------------------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        return await self._run(key, _ops.acquire(self._ctx, key, owner, ttl_ms), owner)

    async def get_lease_owner(self, key: str) -> str | None:
        return await self._run(key, _ops.owner(self._ctx, key))

    async def release_lease(self, key: str, owner: str) -> None:
        await self._run(key, _ops.release(self._ctx, key, owner))

    async def release_grant(self, key: str, owner: str, token: int) -> None:
        """Release ``key`` if ``owner`` holds it with ``token`` (``SupportsReleaseGrant``)."""
        await self._run(key, _ops.release_grant(self._ctx, key, owner, token))

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return await self._run(key, _ops.renew(self._ctx, key, owner, ttl_ms))

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        operation = _ops.transfer(self._ctx, key, from_owner, to_owner, ttl_ms)
        grant = None if from_owner == to_owner else to_owner
        return await self._run(key, operation, grant)

    # -- beyond the contract ------------------------------------------------------------

    async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases in key order, optionally only keys starting with ``prefix``.

        One range read per batch of records, then one ``LeaseTimeToLive`` per lease for
        the remaining time (whole seconds, as etcd reports it), bounded by ``timeout_s``
        as a whole. Not a snapshot: leases that change meanwhile may or may not be listed.
        """
        return await self._run(prefix, _ops.inspect(self._ctx, prefix, limit))

    async def watch_release(self, key: str) -> ReleaseWatch:
        """Watch ``key`` for release, transfer and expiry: a delete watch on its records."""
        _ops.owner(self._ctx, key).close()  # validates the key
        start, end = holder_range(self._ctx.prefix, key)
        self._refuse_if_closed()
        return await self._call(self._listener.watch(key, start, end), key)

    async def _release_watcher(self) -> Any:
        """The watch stream's ``Watcher``, on the member operations are pinned to now."""
        if self._watcher is None:
            transport = self._transport or await self._adopt_client()
            member = transport.members.pinned
            if member.needs_token:
                await transport.authenticate(member, self.timeout_s)
            self._watcher = _rpc.release_watcher(member.stubs, member.metadata)
            transport.members.streams_opened = True
        return self._watcher

    def _forget_watcher(self) -> None:
        """A watch failed: the next wait starts a stream on whichever member is pinned."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None and not self.closed:
            self._spawn(watcher.shutdown())

    async def break_notifications(self) -> None:
        """Cut the watch stream, as a failed member would (for tests)."""
        if self._watcher is not None:
            await self._watcher._terminate_stream(ConnectionError("watch stream cut"))

    async def lease_ids(self) -> list[int]:
        """Every etcd lease in the cluster (``LeaseLeases``), not only this provider's.

        For tests and diagnostics: leasekit leaves no etcd lease behind, so on an
        otherwise idle cluster this returns to what it was after any number of
        operations. It first waits for this provider's background revocations
        (:meth:`flush`), so that the list is settled.
        """
        await self.flush()
        return await self._run(None, _ops.lease_ids())

    async def flush(self) -> None:
        """Wait for the etcd leases this provider is revoking in the background.

        Release, transfer, a denied acquire and a move to a new TTL return once their
        transaction has decided; the etcd lease they left without a record is revoked
        right after, off the caller's path. This waits until those revocations have
        finished (each is bounded; one that fails leaves its empty etcd lease to end at
        its TTL). The idle etcd leases kept for reuse are revoked first, so after a
        flush every etcd lease this provider granted carries a record. Never raises.
        """
        self._housekeep_before_close()
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


class EtcdSyncLeaseProvider(SyncBackendProvider):
    """Leases in etcd from threads: the async provider's operations on blocking gRPC.

    Built by ``leasekit.sync.connect("etcd://...")`` (:meth:`from_url`), with the same
    URL, options and errors as :class:`EtcdLeaseProvider`; safe to share between
    threads. Every call is bounded by ``timeout_s`` through gRPC's own per-call
    ``timeout=`` (what is left of the operation's ``timeout_s``), failing over between
    endpoints as the async provider does.

    Each grant binds an etcd lease of its own, of exactly the TTL (``reuse_leases``
    does not apply): the record's expiry is that etcd lease's TTL on the server, a
    renewal keeps it alive (only if the caller's record is still on it), and an etcd
    lease left without a record is revoked by one background thread, drained by
    :meth:`close`.

    In a forked child, a provider whose parent never made an etcd call is rebuilt
    there and works; once gRPC has started in the parent, the child's provider refuses
    every call with the reason (gRPC cannot work in a child forked after it started).
    """

    backend: ClassVar[str] = BACKEND
    errors: ClassVar[ErrorMap] = ERRORS
    capabilities = CAPABILITIES

    def __init__(
        self,
        *,
        endpoints: Sequence[str],
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
        settings: EtcdSettings = check_settings(
            endpoints=endpoints,
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
        super().__init__(timeout_s=settings.timeout_s, owns_client=True)
        self.prefix: str = settings.prefix
        self.endpoints = settings.endpoints
        self._transport = _blocking.BlockingTransport(settings.members(_blocking.open_channel))
        self._revoker = _blocking.Revoker(self._transport, self.timeout_s)
        self._ctx = _ops.Context(
            settings.prefix_bytes,
            reuse=False,
            revoke_later=self._revoker,
            now=time.monotonic,
            min_ttl_s=DEFAULT_MIN_TTL_S,
        )

    @classmethod
    def from_url(cls, url: str, **options: Any) -> EtcdSyncLeaseProvider:
        """Build a provider from an ``etcd://`` URL, as :meth:`EtcdLeaseProvider.from_url`."""
        return cls(**url_settings(url, **options).provider_arguments())

    def _after_fork_in_child(self) -> None:
        if not self._closing and self._transport.used:
            self._closing = True
            self._closed_reason = FORKED_AFTER_GRPC
            return
        super()._after_fork_in_child()

    def _run(self, operation: Operation[_ops.Request, _T], key: str | None) -> _T:
        result: _T = self._call(self._transport.run, operation, self.timeout_s, key=key)
        return result

    def _connect(self) -> None:
        self._transport.run(_ops.ping(self._ctx), self.timeout_s)

    def _close_client(self) -> None:
        self._revoker.drain()
        self._transport.close()

    def _describe(self) -> str:
        return f"etcd {', '.join(self.endpoints)}, prefix={self.prefix!r}"

    def _where(self) -> str:
        return _where(self._transport, self.endpoints)

    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        return self._run(_ops.acquire(self._ctx, key, owner, ttl_ms), key)

    def get_lease_owner(self, key: str) -> str | None:
        return self._run(_ops.owner(self._ctx, key), key)

    def release_lease(self, key: str, owner: str) -> None:
        self._run(_ops.release(self._ctx, key, owner), key)

    def release_grant(self, key: str, owner: str, token: int) -> None:
        """Release ``key`` if ``owner`` holds it with ``token``."""
        self._run(_ops.release_grant(self._ctx, key, owner, token), key)

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return self._run(_ops.renew(self._ctx, key, owner, ttl_ms), key)

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        operation = _ops.transfer(self._ctx, key, from_owner, to_owner, ttl_ms)
        return self._run(operation, key)

    def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases in key order, as :meth:`EtcdLeaseProvider.inspect`."""
        return self._run(_ops.inspect(self._ctx, prefix, limit), prefix)


def _where(
    transport: _aio.AioTransport | _blocking.BlockingTransport | None, endpoints: Any
) -> str:
    failure = transport.members.last_failure if transport is not None else None
    return f" (etcd {failure or ', '.join(endpoints)})"


def _loop_time() -> float:
    return asyncio.get_running_loop().time()
