"""The Redis providers, async and blocking: lifecycle only, one Lua script per operation.

One module, over 500 lines: both providers' lifecycles and their extras side by side.

Each operation (``_ops``) is one script that reads, checks ownership and writes with no
other command in between, or a single ``GET``; validation, requests and replies are
written there once. :class:`RedisLeaseProvider` drives them with
:func:`~leasekit.backend.drive_async` over ``_aio`` (auto-pipelined, in turns), and
:class:`RedisSyncLeaseProvider` with :func:`~leasekit.backend.drive` over
``_blocking``, each inside its toolkit base's ``_call`` (deadlines, error mapping,
closing, fork). Expiry is Redis's own ``PX`` TTL on the server clock. Works on a single
server, behind Sentinel (``redis+sentinel://``, or a caller's Sentinel-managed client),
and on Redis Cluster (``_keys``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

import redis
import redis.asyncio

from leasekit import Capabilities, LeaseResult, SlotResult, validate_key
from leasekit.backend import (
    BackendProvider,
    ErrorMap,
    LeaseRecord,
    ReleaseHub,
    ReleaseWatch,
    RenewItem,
    SlotGrant,
    SyncBackendProvider,
    check_renew_items,
    drive,
    drive_async,
)

from . import _aio, _blocking, _keys, _ops, _options, _slots
from ._aio import RedisClient
from ._blocking import RedisSyncClient
from ._notify import RedisReleaseListener

__all__ = ["LeaseRecord", "RedisClient", "RedisLeaseProvider", "RedisSyncLeaseProvider"]

_INSPECT_BATCH = 256


class _RedisProvider:
    """What both Redis providers declare."""

    backend: ClassVar[str] = _options.BACKEND
    capabilities: Capabilities = _options.CAPABILITIES
    errors: ClassVar[ErrorMap] = _options.ERRORS


class RedisLeaseProvider(_RedisProvider, BackendProvider):
    """Leases in Redis: atomic Lua scripts, server-clock TTLs, fencing tokens.

    Pass your own ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` (which
    the provider then never closes), or use :meth:`from_url` /
    ``leasekit.connect("redis://...")`` (the provider builds the client and closes it
    in :meth:`aclose`).

    - ``prefix`` (default ``"leasekit:"``) starts every Redis name the provider uses;
      it may not contain ``{`` or ``}``, which are reserved for the hash tag.
    - ``timeout_s`` (default 5) bounds every operation, end to end, waiting for a free
      connection included: a stalled server raises
      :class:`~leasekit.LeaseBackendTimeout`, never hangs; a refused connection, a
      failed name lookup or a wrong password raise
      :class:`~leasekit.LeaseBackendUnreachable` at once.
    - ``counter_ttl_ms`` (default one hour) is how long a key's fencing counter is kept
      beyond its lease's TTL; ``None`` keeps it forever. Tokens keep increasing either
      way, because a new token is also at least the server's clock in microseconds;
      the counter guards against that clock stepping back, for that long. A counter
      costs about 150-200 bytes of Redis memory per distinct key.
    - ``autopipeline`` (default True): operations that several tasks start in the same
      event-loop iteration go out together, in one non-transactional pipeline (each
      script still atomic, each caller with its own reply, error and deadline); an
      operation started while nothing else is in flight goes out at once. False
      sends every operation on its own.
    - ``min_replicas`` (default 0: none) and ``replica_timeout_ms`` (default 500): a
      grant, renewal or transfer counts as done only once that many replicas
      acknowledge it (``WAIT``, pipelined behind the script: still one round trip);
      when fewer do within ``replica_timeout_ms``, the call raises
      :class:`~leasekit.LeaseBackendTimeout`, its outcome unknown. Not on a cluster.

    No persistence is assumed (``persistent=False``): what survives a Redis restart
    depends on the server's RDB/AOF configuration, and a failover may lose the last
    writes. Fencing tokens keep increasing across both.
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str = _options.PREFIX.default,
        timeout_s: float = _options.TIMEOUT.default,
        counter_ttl_ms: int | None = _options.COUNTER_TTL.default,
        autopipeline: bool = _options.AUTOPIPELINE.default,
        min_replicas: int = _options.MIN_REPLICAS.default,
        replica_timeout_ms: int = _options.REPLICA_TIMEOUT.default,
        close_client: bool = False,
    ) -> None:
        _options.check_client(
            client,
            (redis.asyncio.Redis, redis.asyncio.RedisCluster),
            "a redis.asyncio.Redis or redis.asyncio.RedisCluster (the asyncio client)",
        )
        cluster = isinstance(client, redis.asyncio.RedisCluster)
        checked = _options.check(
            prefix, timeout_s, counter_ttl_ms, min_replicas, replica_timeout_ms, cluster=cluster
        )
        self.prefix, self.counter_ttl_ms = checked.prefix, checked.counter_ttl_ms
        self.min_replicas, self.replica_timeout_ms = (
            checked.min_replicas,
            checked.replica_timeout_ms,
        )
        super().__init__(timeout_s=checked.timeout_s, owns_client=bool(close_client))
        self._client: RedisClient = client
        self._server = _aio.server_of(client)
        self._pipeline = _aio.AutoPipeline(
            client,
            enabled=_options.AUTOPIPELINE.validate(autopipeline),
            deadlines=self._deadlines,
            spawn=self._spawn,
        )
        self._exchange = self._pipeline.exchange
        # Release notifications: the scripts publish on the lease's channel, sharded on a
        # cluster; a cluster client needs redis-py 8's asyncio cluster pub/sub.
        if cluster and not callable(getattr(client, "pubsub", None)):
            self.capabilities = replace(
                self.capabilities, release_notifications=False, grant_notifications=False
            )
        notify = self.capabilities.release_notifications
        publish = b"" if not notify else (b"SPUBLISH" if cluster else b"PUBLISH")
        self._ctx = _ops.context(
            self.prefix, self.counter_ttl_ms, publish, self.min_replicas, self.replica_timeout_ms
        )
        self._listener = self._release_listener = RedisReleaseListener(
            client, sharded=cluster, timeout_s=self.timeout_s
        )

    @property
    def autopipeline(self) -> bool:
        """Whether operations started together are written together (see the class doc)."""
        return self._pipeline.enabled

    @property
    def client(self) -> RedisClient:
        """The redis-py client the provider runs on (the caller's, or the one it built)."""
        return self._client

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisLeaseProvider:
        """Build a provider and its own client from a ``redis://`` or ``rediss://`` URL.

        ``redis://[user:password@]host[:port][/db]``: ``db`` is a number (default 0).
        The query may carry redis-py connection settings (``ssl_cert_reqs``,
        ``client_name``, ...), passed through, and leasekit's options (``prefix``,
        ``timeout_s``, ``counter_ttl_ms``, ``max_connections``, ``min_replicas``,
        ``replica_timeout_ms``, and ``cluster=true`` for a ``RedisCluster`` client),
        which keyword arguments override. Anything else is an
        :class:`~leasekit.InvalidLeaseArgument`. No I/O happens here.

        ``redis+sentinel://[user:password@]host[:port][,host[:port]...]/service[/db]``
        names the sentinels (port 26379 by default) and the service they watch: each
        new connection asks them which server is the primary, so after a failover the
        provider writes to the new one with no restart. It takes the same options
        (not ``cluster``) and ``sentinel_username``, ``sentinel_password`` and
        ``sentinel_timeout_s`` (how long one sentinel may take before the next is
        asked; default the smaller of 1 s and ``timeout_s``).

        The client's pool opens at most ``max_connections`` connections (default 50;
        per node on a cluster); an operation that finds them all busy waits for one,
        within its ``timeout_s``.
        """
        settings = _options.parse(url, options)
        provider = cls(
            _aio.build_client(settings),
            prefix=settings.prefix,
            timeout_s=settings.timeout_s,
            counter_ttl_ms=settings.counter_ttl_ms,
            autopipeline=settings.autopipeline,
            min_replicas=settings.min_replicas,
            replica_timeout_ms=settings.replica_timeout_ms,
            close_client=True,
        )
        provider._pipeline.slots = asyncio.Semaphore(settings.max_connections)
        return provider

    @classmethod
    def sync_from_url(cls, url: str, **options: Any) -> RedisSyncLeaseProvider:
        """The blocking provider :func:`leasekit.sync.connect` uses for this URL.

        The same URL, options and errors as :meth:`from_url`, on redis-py's blocking
        client; see :class:`~leasekit_redis.RedisSyncLeaseProvider`.
        """
        return RedisSyncLeaseProvider.from_url(url, **options)

    async def _connect(self) -> None:
        # PING now, so a wrong address or password shows up at the `async with`.
        await self._pipeline.send(self._client.execute_command, "PING")

    async def _close_client(self) -> None:
        try:
            await self._client.aclose()
        finally:
            await _aio.close_sentinels(self._client, self.timeout_s)

    def _describe(self) -> str:
        return f"prefix={self.prefix!r}" + (f", server={self._server}" if self._server else "")

    def _where(self) -> str:
        return f" (server {self._server})" if self._server else ""

    # -- the contract: the operation, through the transport, inside _call ----------------
    # _refuse_if_closed comes before self._exchange is read: it may rebuild the provider
    # (a fork, a new loop), and nothing may join a batch once closed.

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, metadata: bytes | str | None = None
    ) -> LeaseResult:
        operation = _ops.acquire(self._ctx, key, owner, ttl_ms, metadata=metadata)
        if self._undos:
            await self._after_undo(key, owner)
        self._refuse_if_closed()
        return await self._call(drive_async(operation, self._exchange), key, owner)

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

        One script over the lease and the key's line of waiters, on the server's clock.
        """
        operation = _ops.acquire_in_turn(
            self._ctx, key, owner, ttl_ms, place_ttl_ms=place_ttl_ms, metadata=metadata
        )
        if self._undos:
            await self._after_undo(key, owner)
        self._refuse_if_closed()
        return await self._call(drive_async(operation, self._exchange), key, owner)

    async def get_lease_owner(self, key: str) -> str | None:
        operation = _ops.owner(self._ctx, key)
        self._refuse_if_closed()
        return await self._call(drive_async(operation, self._exchange), key)

    async def get_lease_record(self, key: str) -> LeaseRecord | None:
        """The live lease of ``key``: owner, token, metadata and ``PTTL``, in one script
        (``SupportsRecords``); ``None`` when free."""
        operation = _ops.record(self._ctx, key)
        self._refuse_if_closed()
        return await self._call(drive_async(operation, self._exchange), key)

    async def release_lease(self, key: str, owner: str) -> None:
        operation = _ops.release(self._ctx, key, owner)  # as release_if_held's, a frame less
        self._refuse_if_closed()
        await self._call(drive_async(operation, self._exchange), key)

    async def release_if_held(self, key: str, owner: str) -> bool:
        """Release ``key`` if ``owner`` holds it; whether it did (``SupportsReleaseReport``)."""
        operation = _ops.release(self._ctx, key, owner)
        self._refuse_if_closed()
        return await self._call(drive_async(operation, self._exchange), key)

    async def release_grant(self, key: str, owner: str, token: int) -> None:
        """Release ``key`` if ``owner`` holds it with ``token`` (``SupportsReleaseGrant``)."""
        operation = _ops.release_grant(self._ctx, key, owner, token)
        self._refuse_if_closed()
        await self._call(drive_async(operation, self._exchange), key)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        operation = _ops.renew(self._ctx, key, owner, ttl_ms)
        self._refuse_if_closed()
        return await self._call(drive_async(operation, self._exchange), key)

    async def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int,
        *,
        metadata: bytes | str | None = None,
    ) -> bool:
        operation = _ops.transfer(self._ctx, key, from_owner, to_owner, ttl_ms, metadata=metadata)
        grant = to_owner if to_owner != from_owner else None  # else a renewal
        if grant is not None and self._undos:
            await self._after_undo(key, grant)
        self._refuse_if_closed()
        return await self._call(drive_async(operation, self._exchange), key, grant)

    async def renew_leases(self, items: Sequence[RenewItem]) -> list[bool]:
        """Renew many leases in one script (``leasekit.backend.SupportsRenewMany``).

        One result per ``(key, owner, ttl_ms)``, each exactly what ``renew_lease`` would
        answer, on the server's clock. One round trip on a single server; on a cluster
        one script per hash slot, sent together (keys rarely share a slot, so there it
        saves little).
        """
        checked = check_renew_items(items)
        if not checked:
            return []
        self._refuse_if_closed()
        leases = [_keys.lease_name(self._ctx.raw_prefix, key) for key, _, _ in checked]
        groups = self._pipeline.slot_groups(leases)
        if len(groups) == 1:
            return await self._renew_group(checked)
        answers = await asyncio.gather(
            *(self._renew_group([checked[i] for i in group]) for group in groups),
            return_exceptions=True,
        )
        renewed = [False] * len(checked)
        for group, answer in zip(groups, answers, strict=True):
            if isinstance(answer, BaseException):
                raise answer  # the caller learns nothing of the batch, as for one failed call
            for index, flag in zip(group, answer, strict=True):
                renewed[index] = flag
        return renewed

    async def _renew_group(self, items: list[RenewItem]) -> list[bool]:
        """RENEW_MANY for items whose keys share a slot (all of them on one server)."""
        operation = _ops.renew_many(self._ctx, items)
        self._refuse_if_closed()
        return await self._call(drive_async(operation, self._exchange), items[0][0])

    # -- counting leases (SupportsSlots) ------------------------------------------------

    async def acquire_slot(
        self, key: str, owner: str, ttl_ms: int, *, limit: int, exclusive: bool = False
    ) -> SlotResult:
        """Take one of ``limit`` slots of ``key`` (``leasekit.backend.SupportsSlots``).

        One script: the key's expired slots dropped, its limit, count, claim and the
        caller's slot read, and the decision written, on the server's clock.
        """
        operation = _slots.acquire_slot(
            self._ctx, key, owner, ttl_ms, limit=limit, exclusive=exclusive
        )
        grant = SlotGrant(owner)
        if self._undos:
            await self._after_undo(key, grant)
        self._refuse_if_closed()
        return await self._call(drive_async(operation, self._exchange), key, grant)

    async def renew_slot(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Reset the TTL of ``owner``'s live slot of ``key``; whether it held one."""
        operation = _slots.renew_slot(self._ctx, key, owner, ttl_ms)
        self._refuse_if_closed()
        return await self._call(drive_async(operation, self._exchange), key)

    async def release_slot(self, key: str, owner: str) -> bool:
        """Free ``owner``'s live slot of ``key``; whether it held one."""
        operation = _slots.release_slot(self._ctx, key, owner)
        self._refuse_if_closed()
        return await self._call(drive_async(operation, self._exchange), key)

    async def release_slot_grant(self, key: str, owner: str, token: int) -> bool:
        """Free ``owner``'s slot of ``key`` only if it carries ``token`` (undoing a grant)."""
        operation = _slots.release_slot_grant(self._ctx, key, owner, token)
        self._refuse_if_closed()
        return await self._call(drive_async(operation, self._exchange), key)

    async def transfer_slot(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Hand ``from_owner``'s live slot of ``key`` to ``to_owner`` (a new token)."""
        operation = _slots.transfer_slot(self._ctx, key, from_owner, to_owner, ttl_ms)
        grant = SlotGrant(to_owner) if to_owner != from_owner else None  # else a renewal
        if grant is not None and self._undos:
            await self._after_undo(key, grant)
        self._refuse_if_closed()
        return await self._call(drive_async(operation, self._exchange), key, grant)

    async def get_slot_holders(self, key: str) -> list[LeaseRecord]:
        """The live slots of ``key``, in grant order."""
        operation = _slots.slot_holders(self._ctx, key)
        self._refuse_if_closed()
        return await self._call(drive_async(operation, self._exchange), key)

    # -- waiting without polling -----------------------------------------------------------

    async def watch_release(self, key: str, *, grants: bool = False) -> ReleaseWatch:
        """Watch ``key`` for release and transfer: its channel on the provider's subscriber.

        With ``grants``, for grants of the free key too (``grant_notifications``): the
        acquire script publishes a ``granted`` hint when it takes a free key. Expiry
        publishes nothing; waiters also sleep only until :meth:`lease_remaining_ms`.
        """
        validate_key(key)
        self._refuse_if_closed()
        if not self._ctx.publish:
            # No channel here: the remaining TTL alone.
            return ReleaseHub().watch(key, grants=grants)
        lease = _keys.lease_name(self._ctx.raw_prefix, key)
        return await self._call(self._listener.watch(key, lease, grants=grants), key)

    async def lease_remaining_ms(self, key: str) -> int | None:
        """Milliseconds left on the live lease of ``key`` by the server's clock (``PTTL``)."""
        operation = _ops.remaining(self._ctx, key)
        self._refuse_if_closed()
        return await self._call(drive_async(operation, self._exchange), key)

    # -- beyond the contract ------------------------------------------------------------

    async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases in key order, optionally only keys starting with ``prefix``.

        Uses ``SCAN`` (every node of a cluster), so it costs time in proportion to the
        keys under the provider's prefix and never blocks the server; each round trip
        is bounded by ``timeout_s``. Not a snapshot: leases that change meanwhile may
        or may not be listed.
        """
        if prefix is not None:
            validate_key(prefix, "prefix")
        limit = _options.INSPECT_LIMIT.validate(limit)
        self._refuse_if_closed()
        found = await self._scan(prefix)
        ordered = sorted(found.items())
        records: list[LeaseRecord] = []
        for start in range(0, len(ordered), _INSPECT_BATCH):
            operation = _ops.inspect_batch(ordered[start : start + _INSPECT_BATCH])
            exchange = self._pipeline.exchange_pipelined
            records += await self._call(drive_async(operation, exchange), prefix)
            if len(records) >= limit:
                return records[:limit]
        return records

    async def _scan(self, prefix: str | None) -> dict[str, bytes]:
        """The lease names under ``prefix``, by lease key; one bounded round trip per step."""
        raw_prefix = self._ctx.raw_prefix
        names = self._pipeline.names(_keys.lease_scan_pattern(raw_prefix, prefix))
        found: dict[str, bytes] = {}
        try:
            while True:
                try:
                    name = await self._call(self._pipeline.send(names.__anext__), prefix)
                except StopAsyncIteration:
                    return found
                raw = name.encode() if isinstance(name, str) else name
                key = _keys.key_from_lease_name(raw_prefix, raw)
                if key is not None and (prefix is None or key.startswith(prefix)):
                    found[key] = raw
        finally:
            aclose = getattr(names, "aclose", None)
            if aclose is not None:
                await aclose()


class RedisSyncLeaseProvider(_RedisProvider, SyncBackendProvider):
    """Leases in Redis from blocking code: the same operations on redis-py's sync client.

    Safe to share between threads. Made by ``leasekit.sync.connect("redis://...")``
    (through :meth:`RedisLeaseProvider.sync_from_url`), by :meth:`from_url`, or over a
    caller's own ``redis.Redis`` / ``redis.RedisCluster`` (never closed by the
    provider). Options, capabilities, fencing tokens, release notifications and
    errors are those of :class:`RedisLeaseProvider`; a stalled server raises
    :class:`~leasekit.LeaseBackendTimeout` after ``timeout_s``, provided the client's
    sockets have timeouts (a client :meth:`from_url` builds always has). Each operation
    is sent from the calling thread: one round trip, no thread hop.
    """

    def __init__(
        self,
        client: RedisSyncClient,
        *,
        prefix: str = _options.PREFIX.default,
        timeout_s: float = _options.TIMEOUT.default,
        counter_ttl_ms: int | None = _options.COUNTER_TTL.default,
        min_replicas: int = _options.MIN_REPLICAS.default,
        replica_timeout_ms: int = _options.REPLICA_TIMEOUT.default,
        close_client: bool = False,
    ) -> None:
        _options.check_client(
            client,
            (redis.Redis, redis.RedisCluster),
            "a redis.Redis or redis.RedisCluster (the blocking client)",
        )
        checked = _options.check(
            prefix,
            timeout_s,
            counter_ttl_ms,
            min_replicas,
            replica_timeout_ms,
            cluster=isinstance(client, redis.RedisCluster),
        )
        self.prefix, self.counter_ttl_ms = checked.prefix, checked.counter_ttl_ms
        self.min_replicas, self.replica_timeout_ms = (
            checked.min_replicas,
            checked.replica_timeout_ms,
        )
        super().__init__(timeout_s=checked.timeout_s, owns_client=bool(close_client))
        self._client = client
        self._server = _blocking.server_of(client)
        # The async provider's waiters listen on the lease's channel: releases and
        # transfers from blocking code wake them too.
        publish = b"SPUBLISH" if isinstance(client, redis.RedisCluster) else b"PUBLISH"
        self._ctx = _ops.context(
            self.prefix, self.counter_ttl_ms, publish, self.min_replicas, self.replica_timeout_ms
        )
        self._transport = _blocking.BlockingTransport(
            client, timeout_s=self.timeout_s, where=self._where()
        )
        self._exchange = self._transport.exchange

    @property
    def client(self) -> RedisSyncClient:
        """The redis-py client the provider runs on (the caller's, or the one it built)."""
        return self._client

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisSyncLeaseProvider:
        """Build a provider and its own blocking client; see :meth:`RedisLeaseProvider.from_url`.

        The same URL and options, validated the same way. No I/O happens here.
        """
        settings = _options.parse(url, options)
        return cls(
            _blocking.build_client(settings),
            prefix=settings.prefix,
            timeout_s=settings.timeout_s,
            counter_ttl_ms=settings.counter_ttl_ms,
            min_replicas=settings.min_replicas,
            replica_timeout_ms=settings.replica_timeout_ms,
            close_client=True,
        )

    def _connect(self) -> None:
        self._transport.execute(("PING",))

    def close(self) -> None:
        """Refuse new operations, hand borrowed connections back, close a client built here."""
        super().close()
        self._transport.give_back()

    def _close_client(self) -> None:
        # The borrowed connections first: handed back after the pool's disconnect, they
        # would stay connected (a socket left to the garbage collector).
        self._transport.give_back()
        try:
            self._client.close()
        finally:
            _blocking.close_sentinels(self._client)

    def _describe(self) -> str:
        return f"prefix={self.prefix!r}" + (f", server={self._server}" if self._server else "")

    def _where(self) -> str:
        return f" (server {self._server})" if self._server else ""

    # Each operation through drive, inside the base's _call (typed loosely: hence the
    # annotated results).

    def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, metadata: bytes | str | None = None
    ) -> LeaseResult:
        """Blocking :meth:`RedisLeaseProvider.acquire_lease`."""
        operation = _ops.acquire(self._ctx, key, owner, ttl_ms, metadata=metadata)
        result: LeaseResult = self._call(drive, operation, self._exchange, key=key)
        return result

    def acquire_lease_in_turn(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        *,
        place_ttl_ms: int,
        metadata: bytes | str | None = None,
    ) -> LeaseResult:
        """Blocking :meth:`RedisLeaseProvider.acquire_lease_in_turn`."""
        operation = _ops.acquire_in_turn(
            self._ctx, key, owner, ttl_ms, place_ttl_ms=place_ttl_ms, metadata=metadata
        )
        result: LeaseResult = self._call(drive, operation, self._exchange, key=key)
        return result

    def get_lease_owner(self, key: str) -> str | None:
        """Blocking :meth:`RedisLeaseProvider.get_lease_owner`."""
        holder: str | None = self._call(drive, _ops.owner(self._ctx, key), self._exchange, key=key)
        return holder

    def get_lease_record(self, key: str) -> LeaseRecord | None:
        """Blocking :meth:`RedisLeaseProvider.get_lease_record`."""
        found: LeaseRecord | None = self._call(
            drive, _ops.record(self._ctx, key), self._exchange, key=key
        )
        return found

    def release_lease(self, key: str, owner: str) -> None:
        """Blocking :meth:`RedisLeaseProvider.release_lease`."""
        self._call(drive, _ops.release(self._ctx, key, owner), self._exchange, key=key)

    def release_if_held(self, key: str, owner: str) -> bool:
        """Blocking :meth:`RedisLeaseProvider.release_if_held`."""
        operation = _ops.release(self._ctx, key, owner)
        released: bool = self._call(drive, operation, self._exchange, key=key)
        return released

    def release_grant(self, key: str, owner: str, token: int) -> None:
        """Blocking :meth:`RedisLeaseProvider.release_grant`."""
        operation = _ops.release_grant(self._ctx, key, owner, token)
        self._call(drive, operation, self._exchange, key=key)

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`RedisLeaseProvider.renew_lease`."""
        operation = _ops.renew(self._ctx, key, owner, ttl_ms)
        renewed: bool = self._call(drive, operation, self._exchange, key=key)
        return renewed

    def renew_leases(self, items: Sequence[RenewItem]) -> list[bool]:
        """Blocking :meth:`RedisLeaseProvider.renew_leases`: one script on a single
        server; on a cluster one per hash slot, one after the other."""
        checked = check_renew_items(items)
        leases = [_keys.lease_name(self._ctx.raw_prefix, key) for key, _, _ in checked]
        renewed = [False] * len(checked)
        for group in self._transport.slot_groups(leases) if checked else ():
            operation = _ops.renew_many(self._ctx, [checked[i] for i in group])
            key = checked[group[0]][0]
            answer: list[bool] = self._call(drive, operation, self._exchange, key=key)
            for index, flag in zip(group, answer, strict=True):
                renewed[index] = flag
        return renewed

    def lease_remaining_ms(self, key: str) -> int | None:
        """Blocking :meth:`RedisLeaseProvider.lease_remaining_ms`."""
        remaining: int | None = self._call(
            drive, _ops.remaining(self._ctx, key), self._exchange, key=key
        )
        return remaining

    def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int,
        *,
        metadata: bytes | str | None = None,
    ) -> bool:
        """Blocking :meth:`RedisLeaseProvider.transfer_lease`."""
        operation = _ops.transfer(self._ctx, key, from_owner, to_owner, ttl_ms, metadata=metadata)
        moved: bool = self._call(drive, operation, self._exchange, key=key)
        return moved

    def acquire_slot(
        self, key: str, owner: str, ttl_ms: int, *, limit: int, exclusive: bool = False
    ) -> SlotResult:
        """Blocking :meth:`RedisLeaseProvider.acquire_slot`."""
        operation = _slots.acquire_slot(
            self._ctx, key, owner, ttl_ms, limit=limit, exclusive=exclusive
        )
        result: SlotResult = self._call(drive, operation, self._exchange, key=key)
        return result

    def renew_slot(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`RedisLeaseProvider.renew_slot`."""
        operation = _slots.renew_slot(self._ctx, key, owner, ttl_ms)
        renewed: bool = self._call(drive, operation, self._exchange, key=key)
        return renewed

    def release_slot(self, key: str, owner: str) -> bool:
        """Blocking :meth:`RedisLeaseProvider.release_slot`."""
        operation = _slots.release_slot(self._ctx, key, owner)
        released: bool = self._call(drive, operation, self._exchange, key=key)
        return released

    def transfer_slot(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`RedisLeaseProvider.transfer_slot`."""
        operation = _slots.transfer_slot(self._ctx, key, from_owner, to_owner, ttl_ms)
        moved: bool = self._call(drive, operation, self._exchange, key=key)
        return moved

    def get_slot_holders(self, key: str) -> list[LeaseRecord]:
        """Blocking :meth:`RedisLeaseProvider.get_slot_holders`."""
        operation = _slots.slot_holders(self._ctx, key)
        found: list[LeaseRecord] = self._call(drive, operation, self._exchange, key=key)
        return found
