"""``RedisLeaseProvider``: leases in Redis, one Lua script (one round trip) per operation.

Each write is one script (``_lua``) that reads, checks ownership and writes without
any other command in between; the owner lookup is a single ``GET``. What to send and
how to read the answer are pure functions (``_replies``); this module only drives them
over redis-py's asyncio client, on the lifecycle, deadlines and error mapping of
:class:`leasekit.backend.BackendProvider`. Expiry is Redis's own ``PX`` TTL on the
server clock. Works on a single server, behind Sentinel-managed clients, and on Redis
Cluster: the names a script touches share one hash tag (``_keys``). Operations that
many tasks start together are written together, one pipeline per event-loop iteration
(``_pipeline``); one alone goes out at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias, TypeVar

import redis.asyncio
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.exceptions import (
    RedisClusterException,
    RedisError,
)

from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseResult,
    validate_key,
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
    redact_url,
)

from . import _keys, _ops, _options, _replies
from ._notify import RedisReleaseListener
from ._pipeline import AutoPipeline

if TYPE_CHECKING:
    from ._sync import RedisSyncLeaseProvider

__all__ = ["LeaseRecord", "RedisClient", "RedisLeaseProvider"]

RedisClient: TypeAlias = redis.asyncio.Redis | redis.asyncio.RedisCluster
"""The clients the provider accepts: redis-py's asyncio client, single server or cluster."""

_T = TypeVar("_T")
_INSPECT_BATCH = 256
_LIMIT = Option("limit", int, 1000, minimum=1)  # inspect's


class RedisLeaseProvider(BackendProvider):
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

    No persistence is assumed (``persistent=False``): what survives a Redis restart
    depends on the server's RDB/AOF configuration, and a failover may lose the last
    writes. Fencing tokens keep increasing across both.
    """

    backend = "redis"
    capabilities = Capabilities(
        atomic_transfer=True,
        fencing=True,
        ttl_resolution_ms=1,
        min_ttl_ms=1,
        server_clock=True,
        shared_across_processes=True,
        shared_across_hosts=True,
        persistent=False,
        release_notifications=True,
    )
    errors: ClassVar[ErrorMap] = _options.ERRORS

    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str = _options.PREFIX.default,
        timeout_s: float = _options.TIMEOUT.default,
        counter_ttl_ms: int | None = _options.COUNTER_TTL.default,
        autopipeline: bool = _options.AUTOPIPELINE.default,
        close_client: bool = False,
    ) -> None:
        if not isinstance(client, redis.asyncio.Redis | redis.asyncio.RedisCluster):
            raise InvalidLeaseArgument.for_argument(
                "client",
                "must be a redis.asyncio.Redis or redis.asyncio.RedisCluster (the asyncio "
                f"client), got {type(client).__module__}.{type(client).__qualname__}",
            )
        self.prefix: str = _options.PREFIX.validate(prefix)
        self.counter_ttl_ms: int | None = _options.COUNTER_TTL.validate(counter_ttl_ms)
        super().__init__(
            timeout_s=_options.TIMEOUT.validate(timeout_s), owns_client=bool(close_client)
        )
        self._client: RedisClient = client
        self._prefix = self.prefix.encode()
        self._server = _server_of(client)
        # On a client from_url built, at most max_connections commands run at once and
        # the rest wait their turn here, first come first served. redis-py cannot do
        # it alone: a cluster node refuses a command beyond its limit instead of
        # waiting, and BlockingConnectionPool lets a task that just released a
        # connection take it straight back, so under load a waiter can starve past
        # timeout_s (500 tasks on 50 connections: hundreds of timeouts in 10 s).
        self._slots: asyncio.Semaphore | None = None
        self._pipeline = AutoPipeline(
            client,
            enabled=_options.AUTOPIPELINE.validate(autopipeline),
            deadlines=self._deadlines,
            spawn=self._spawn,
            timeout=self._timeout,
        )
        self._submit = self._pipeline.submit
        # Release notifications: the scripts publish on the lease's channel, sharded on a
        # cluster; a cluster client needs redis-py 8's asyncio cluster pub/sub.
        cluster = isinstance(client, redis.asyncio.RedisCluster)
        if cluster and not callable(getattr(client, "pubsub", None)):
            self.capabilities = replace(self.capabilities, release_notifications=False)
        self._publish = (
            b""
            if not self.capabilities.release_notifications
            else (b"SPUBLISH" if cluster else b"PUBLISH")
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
        ``timeout_s``, ``counter_ttl_ms``, ``max_connections``, and ``cluster=true``
        for a ``RedisCluster`` client), which keyword arguments override. Anything else
        is an :class:`~leasekit.InvalidLeaseArgument`. No I/O happens here.

        The client's pool opens at most ``max_connections`` connections (default 50;
        per node on a cluster); an operation that finds them all busy waits for one,
        within its ``timeout_s``.
        """
        settings = _options.parse(url, options)
        driver_url, cluster = settings.driver_url, settings.cluster
        timeout_s, max_connections = settings.timeout_s, settings.max_connections
        # No socket timeout (unless the URL sets one): the provider's own deadline bounds
        # every operation, and redis-py's would cost a task per write and a timer per read.
        connection = {**_options.connection_settings(timeout_s, Retry), "socket_timeout": None}
        client: RedisClient
        try:
            if cluster:
                client = redis.asyncio.RedisCluster.from_url(
                    driver_url, max_connections=max_connections, **connection
                )
            else:
                # Blocking, never MaxConnectionsError, should anything take a connection
                # outside the provider's turns (its wait is bounded by timeout_s).
                pool = BlockingConnectionPool.from_url(
                    driver_url, max_connections=max_connections, timeout=None, **connection
                )
                client = redis.asyncio.Redis.from_pool(pool)
        except (RedisError, RedisClusterException, ValueError, TypeError) as exc:
            raise InvalidLeaseArgument.for_argument(
                "url", f"{exc} ({settings.redacted!r})"
            ) from None
        provider = cls(
            client,
            prefix=settings.prefix,
            timeout_s=timeout_s,
            counter_ttl_ms=settings.counter_ttl_ms,
            autopipeline=settings.autopipeline,
            close_client=True,
        )
        provider._slots = provider._pipeline.slots = asyncio.Semaphore(max_connections)
        return provider

    @classmethod
    def sync_from_url(cls, url: str, **options: Any) -> RedisSyncLeaseProvider:
        """The blocking provider :func:`leasekit.sync.connect` uses for this URL.

        The same URL, options and errors as :meth:`from_url`, on redis-py's blocking
        client; see :class:`~leasekit_redis.RedisSyncLeaseProvider`.
        """
        from ._sync import RedisSyncLeaseProvider  # noqa: PLC0415 (loaded only for leasekit.sync)

        return RedisSyncLeaseProvider.from_url(url, **options)

    # -- one round trip: the toolkit bounds it and maps its errors ------------------------

    def _send(self, send: Callable[..., Awaitable[_T]], *args: Any, **kwargs: Any) -> Awaitable[_T]:
        """``send(*args, **kwargs)`` for ``_call``; in its turn on a client from_url built.

        For what is not a lease operation (the PING, ``inspect``); those go through
        ``self._submit``, which writes operations started together as one pipeline.
        """
        if self._slots is None:
            return send(*args, **kwargs)
        return self._in_turn(self._slots, send, *args, **kwargs)

    @staticmethod
    async def _in_turn(
        slots: asyncio.Semaphore, send: Callable[..., Awaitable[_T]], *args: Any, **kwargs: Any
    ) -> _T:
        async with slots:
            return await send(*args, **kwargs)

    async def _connect(self) -> None:
        # PING now, so a wrong address or password shows up at the `async with`.
        await self._send(self._client.execute_command, "PING")

    async def _close_client(self) -> None:
        await self._client.aclose()

    def _describe(self) -> str:
        where = f", server={self._server}" if self._server else ""
        return f"prefix={self.prefix!r}{where}"

    def _where(self) -> str:
        return f" (server {self._server})" if self._server else ""

    def _garbled(self, key: str | None, exc: _replies.GarbledReply) -> LeaseBackendError:
        return _options.garbled(exc, prefix=self.prefix, key=key)

    # -- the contract -------------------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        call = _ops.acquire(self._prefix, key, owner, ttl_ms, counter_ttl_ms=self.counter_ttl_ms)
        if self._undos:
            await self._after_undo(key, owner)
        self._refuse_if_closed()  # before anything joins a batch
        reply = await self._call(self._submit(call.evalsha(), call, key), key, owner)
        try:
            return _replies.read_acquire(reply, owner)
        except _replies.GarbledReply as exc:
            raise self._garbled(key, exc) from exc

    async def get_lease_owner(self, key: str) -> str | None:
        command = _ops.owner(self._prefix, key)
        self._refuse_if_closed()
        reply = await self._call(self._submit(command, None, key), key)
        try:
            return _replies.read_owner(reply)
        except _replies.GarbledReply as exc:
            raise self._garbled(key, exc) from exc

    async def release_lease(self, key: str, owner: str) -> None:
        call = _ops.release(self._prefix, key, owner, publish=self._publish)
        self._refuse_if_closed()
        await self._call(self._submit(call.evalsha(), call, key), key)

    async def release_grant(self, key: str, owner: str, token: int) -> None:
        """Release ``key`` if ``owner`` holds it with ``token`` (``SupportsReleaseGrant``)."""
        call = _ops.release_grant(self._prefix, key, owner, token, publish=self._publish)
        self._refuse_if_closed()
        await self._call(self._submit(call.evalsha(), call, key), key)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        call = _ops.renew(self._prefix, key, owner, ttl_ms, counter_ttl_ms=self.counter_ttl_ms)
        self._refuse_if_closed()
        return _replies.read_flag(await self._call(self._submit(call.evalsha(), call, key), key))

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
        client = self._client
        if not isinstance(client, redis.asyncio.RedisCluster):
            return await self._renew_group(checked)
        slots: dict[int, list[int]] = {}
        for index, (key, _, _) in enumerate(checked):
            slots.setdefault(client.keyslot(_keys.lease_name(self._prefix, key)), []).append(index)
        groups = list(slots.values())
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
        call = _replies.renew_many_request(self._prefix, items, counter_ttl_ms=self.counter_ttl_ms)
        self._refuse_if_closed()
        reply = await self._call(self._submit(call.evalsha(), call, items[0][0]), items[0][0])
        try:
            return _replies.read_flags(reply, len(items))
        except _replies.GarbledReply as exc:
            raise self._garbled(items[0][0], exc) from exc

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        call = _ops.transfer(
            self._prefix,
            key,
            from_owner,
            to_owner,
            ttl_ms,
            counter_ttl_ms=self.counter_ttl_ms,
            publish=self._publish,
        )
        grant = to_owner if to_owner != from_owner else None  # else a renewal
        if grant is not None and self._undos:
            await self._after_undo(key, grant)
        self._refuse_if_closed()
        reply = await self._call(self._submit(call.evalsha(), call, key), key, grant)
        return _replies.read_flag(reply)

    # -- waiting without polling -----------------------------------------------------------

    async def watch_release(self, key: str) -> ReleaseWatch:
        """Watch ``key`` for release and transfer: its channel on the provider's subscriber.

        Expiry publishes nothing; waiters also sleep only until :meth:`lease_remaining_ms`.
        """
        validate_key(key)
        self._refuse_if_closed()
        if not self._publish:
            return ReleaseHub().watch(key)  # no channel here: the remaining TTL alone
        lease = _keys.lease_name(self._prefix, key)
        return await self._call(self._listener.watch(key, lease), key)

    async def lease_remaining_ms(self, key: str) -> int | None:
        """Milliseconds left on the live lease of ``key`` by the server's clock (``PTTL``)."""
        validate_key(key)
        self._refuse_if_closed()
        command = _replies.remaining_request(self._prefix, key)
        reply = await self._call(self._submit(command, None, key), key)
        return _replies.read_remaining(reply)

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
        limit = _LIMIT.validate(limit)
        self._refuse_if_closed()
        found = await self._scan(prefix)
        records: list[LeaseRecord] = []
        ordered = sorted(found)
        for start in range(0, len(ordered), _INSPECT_BATCH):
            batch = ordered[start : start + _INSPECT_BATCH]
            pipe = self._client.pipeline(transaction=False)
            for key in batch:
                pipe.get(found[key])
                pipe.pttl(found[key])
            # Errors come back per command (a foreign key of another type), not raised.
            replies = await self._call(self._send(pipe.execute, raise_on_error=False), prefix)
            for key, value, remaining in zip(batch, replies[::2], replies[1::2], strict=True):
                if not isinstance(value, bytes | str) or not isinstance(remaining, int):
                    continue  # not a lease value: not ours, or gone since the scan
                if remaining <= 0:
                    continue  # expired or released since the scan
                try:
                    owner, token = _replies.read_lease_value(value)
                except _replies.GarbledReply:
                    continue  # not ours; inspect reports, it does not judge
                records.append(LeaseRecord(key, owner, token, remaining))
                if len(records) == limit:
                    return records
        return records

    async def _scan(self, prefix: str | None) -> dict[str, bytes]:
        """The lease names under ``prefix``, by lease key; one bounded round trip per step."""
        pattern = _keys.lease_scan_pattern(self._prefix, prefix)
        found: dict[str, bytes] = {}
        names: AsyncIterator[bytes | str] = self._client.scan_iter(match=pattern, count=1000)
        try:
            while True:
                try:
                    name = await self._call(self._send(names.__anext__), prefix)
                except StopAsyncIteration:
                    return found
                raw = name.encode() if isinstance(name, str) else name
                key = _keys.key_from_lease_name(self._prefix, raw)
                if key is not None and (prefix is None or key.startswith(prefix)):
                    found[key] = raw
        finally:
            aclose = getattr(names, "aclose", None)
            if aclose is not None:
                await aclose()


def _server_of(client: RedisClient) -> str:
    """``host:port`` of the client's server (a cluster's first startup node), for messages."""
    if isinstance(client, redis.asyncio.RedisCluster):
        return next(iter(client.nodes_manager.startup_nodes), "")
    kwargs = client.connection_pool.connection_kwargs
    if "host" in kwargs:
        return f"{kwargs['host']}:{kwargs.get('port', _options.DEFAULT_PORT)}"
    if "path" in kwargs:
        return redact_url(str(kwargs["path"]))
    return ""
