"""``RedisLeaseProvider``: leases in Redis, one Lua script (one round trip) per operation.

Each write is one script (``_lua``) that reads, checks ownership and writes without
any other command in between; the owner lookup is a single ``GET``. What to send and
how to read the answer are pure functions (``_replies``); this module only drives them
over redis-py's asyncio client, on the lifecycle, deadlines and error mapping of
:class:`leasekit.backend.BackendProvider`. Expiry is Redis's own ``PX`` TTL on the
server clock. Works on a single server, behind Sentinel-managed clients, and on Redis
Cluster: the names a script touches share one hash tag (``_keys``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar, TypeAlias, TypeVar
from urllib.parse import urlencode

import redis.asyncio
from redis.asyncio.connection import URL_QUERY_ARGUMENT_PARSERS, BlockingConnectionPool
from redis.asyncio.connection import parse_url as redis_parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationWrongNumberOfArgsError,
    MaxConnectionsError,
    NoScriptError,
    RedisClusterException,
    RedisError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
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
    OptionSet,
    ReleaseHub,
    ReleaseWatch,
    RenewItem,
    check_renew_items,
    parse_url,
    redact_url,
    timeout_option,
)

from . import _keys, _replies
from ._notify import RedisReleaseListener

__all__ = ["LeaseRecord", "RedisClient", "RedisLeaseProvider"]

RedisClient: TypeAlias = redis.asyncio.Redis | redis.asyncio.RedisCluster
"""The clients the provider accepts: redis-py's asyncio client, single server or cluster."""

_T = TypeVar("_T")
_SCHEMES = ("redis", "rediss")
_DEFAULT_PORT = 6379
_MAX_COUNTER_TTL_MS = 2**40  # about 35 years: far beyond any use, far below PX's limit
_MAX_PREFIX_BYTES = 256
_INSPECT_BATCH = 256
_DATABASE = re.compile(r"/([0-9]+)?")


def _check_prefix(prefix: str) -> str:
    if "{" in prefix or "}" in prefix:
        raise InvalidLeaseArgument.for_argument(
            "prefix",
            f"must not contain '{{' or '}}' (leasekit puts the Redis Cluster hash tag "
            f"after the prefix), got {prefix!r}",
            prefix,
        )
    try:
        raw = prefix.encode()
    except UnicodeEncodeError:
        raise InvalidLeaseArgument.for_argument("prefix", "must be encodable as UTF-8") from None
    if len(raw) > _MAX_PREFIX_BYTES:
        raise InvalidLeaseArgument.for_argument(
            "prefix", f"must be at most {_MAX_PREFIX_BYTES} UTF-8 bytes"
        )
    return prefix


_PREFIX = Option("prefix", str, "leasekit:", check=_check_prefix)
_TIMEOUT = timeout_option(5.0)
# One hour; see docs/backends/redis.md. None keeps counters forever.
_COUNTER_TTL = Option(
    "counter_ttl_ms", int, 3_600_000, minimum=1, maximum=_MAX_COUNTER_TTL_MS, nullable=True
)
_CLUSTER = Option("cluster", bool, False)
_LIMIT = Option("limit", int, 1000, minimum=1)  # inspect's
# Connections the built client opens at most (per node on a cluster); operations beyond
# that wait for a free one within timeout_s. 50 is redis-py's BlockingConnectionPool's.
_MAX_CONNECTIONS = Option("max_connections", int, 50, minimum=1, maximum=100_000)

# Connection settings that redis-py reads from a URL's query, passed through to it.
# max_connections is leasekit's own (it sizes the blocking pool), and the pool's wait
# ("timeout") is bounded by timeout_s, so neither passes through.
_DRIVER_QUERY = (frozenset(URL_QUERY_ARGUMENT_PARSERS) - {"max_connections", "timeout"}) | {
    "client_name",
    "ssl_keyfile",
    "ssl_certfile",
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_ca_path",
    "ssl_ciphers",
    "ssl_password",
}
_OPTIONS = (_PREFIX, _TIMEOUT, _COUNTER_TTL, _CLUSTER, _MAX_CONNECTIONS)
# TLS settings only make sense, and only pass through, with rediss://.
_OPTION_SETS = {
    "redis": OptionSet(
        "redis", _OPTIONS, driver=frozenset(n for n in _DRIVER_QUERY if not n.startswith("ssl_"))
    ),
    "rediss": OptionSet("redis", _OPTIONS, driver=_DRIVER_QUERY),
}


class _RedisErrors(ErrorMap):
    """The toolkit's table, plus one rule: a cluster failure is judged by its cause.

    A cluster client with no reachable node raises ``RedisClusterException`` ("cannot
    be connected") from the ``ConnectionError`` of its last attempt; that cause (a
    refused connection, a name that does not resolve, a wrong password) says what
    happened, so it decides the class.
    """

    __slots__ = ()

    def classify(self, exc: BaseException) -> type[LeaseBackendError]:
        cause = exc.__cause__
        if isinstance(exc, RedisClusterException) and isinstance(cause, RedisError | OSError):
            return super().classify(cause)
        return super().classify(exc)


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
    # Subclasses before their bases: MaxConnectionsError is a ConnectionError (a
    # caller's non-blocking pool ran out, not an unreachable server), the AUTH
    # arity error a ResponseError. AuthenticationError, AuthorizationError, refused
    # connections, DNS and TLS failures all arrive as redis-py's ConnectionError.
    # RedisClusterException is not a RedisError.
    errors: ClassVar[ErrorMap] = _RedisErrors(
        {
            MaxConnectionsError: LeaseBackendError,
            AuthenticationWrongNumberOfArgsError: LeaseBackendUnreachable,
            RedisTimeoutError: LeaseBackendTimeout,
            RedisConnectionError: LeaseBackendUnreachable,
            RedisClusterException: LeaseBackendError,
            RedisError: LeaseBackendError,
        },
        backend="redis",
    )

    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str = _PREFIX.default,
        timeout_s: float = _TIMEOUT.default,
        counter_ttl_ms: int | None = _COUNTER_TTL.default,
        close_client: bool = False,
    ) -> None:
        if not isinstance(client, redis.asyncio.Redis | redis.asyncio.RedisCluster):
            raise InvalidLeaseArgument.for_argument(
                "client",
                "must be a redis.asyncio.Redis or redis.asyncio.RedisCluster (the asyncio "
                f"client), got {type(client).__module__}.{type(client).__qualname__}",
            )
        self.prefix: str = _PREFIX.validate(prefix)
        self.counter_ttl_ms: int | None = _COUNTER_TTL.validate(counter_ttl_ms)
        super().__init__(timeout_s=_TIMEOUT.validate(timeout_s), owns_client=bool(close_client))
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
        parsed = parse_url(url, schemes=_SCHEMES, default_port=_DEFAULT_PORT)
        settled = _OPTION_SETS[parsed.scheme].parse(parsed.query, options, url=url)
        values = settled.values
        if len(parsed.endpoints) > 1:
            raise InvalidLeaseArgument.for_argument(
                "url",
                f"takes one host (a cluster client finds the other nodes itself), got "
                f"{len(parsed.endpoints)} in {parsed.redacted!r}",
            )
        database = _DATABASE.fullmatch(parsed.path) if parsed.path else None
        if parsed.path and database is None:
            raise InvalidLeaseArgument.for_argument(
                "url",
                f"the database must be a number after the host, as in /0, got "
                f"{parsed.path!r} in {parsed.redacted!r}",
            )
        cluster: bool = values["cluster"]
        if cluster and database is not None and int(database.group(1) or 0) != 0:
            raise InvalidLeaseArgument.for_argument(
                "url",
                f"Redis Cluster has only database 0, got db {parsed.path!r} in {parsed.redacted!r}",
            )
        query = urlencode(settled.driver)
        driver_url = parsed.without_query() + (f"?{query}" if query else "")
        try:
            redis_parse_url(driver_url)
        except ValueError as exc:
            raise InvalidLeaseArgument.for_argument("url", f"{exc} ({parsed.redacted!r})") from None
        timeout_s: float = values["timeout_s"]
        max_connections: int = values["max_connections"]
        settings: dict[str, Any] = {
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            # One immediate retry on a dropped connection (a restarted server, an idle
            # link cut by a proxy) and none on timeouts; see docs/backends/redis.md.
            "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            "retry_on_error": [RedisConnectionError],
        }
        client: RedisClient
        try:
            if cluster:
                client = redis.asyncio.RedisCluster.from_url(
                    driver_url, max_connections=max_connections, **settings
                )
            else:
                # Blocking, never MaxConnectionsError, should anything take a connection
                # outside the provider's turns (its wait is bounded by timeout_s).
                pool = BlockingConnectionPool.from_url(
                    driver_url, max_connections=max_connections, timeout=None, **settings
                )
                client = redis.asyncio.Redis.from_pool(pool)
        except (RedisError, RedisClusterException, ValueError, TypeError) as exc:
            raise InvalidLeaseArgument.for_argument("url", f"{exc} ({parsed.redacted!r})") from None
        provider = cls(
            client,
            prefix=values["prefix"],
            timeout_s=timeout_s,
            counter_ttl_ms=values["counter_ttl_ms"],
            close_client=True,
        )
        provider._slots = asyncio.Semaphore(max_connections)
        return provider

    # -- one round trip: the toolkit bounds it and maps its errors ------------------------

    async def _evalsha(self, call: _replies.ScriptCall) -> Any:
        client = self._client
        try:
            return await client.execute_command(*call.evalsha())
        except NoScriptError:
            # The server's script cache was flushed, or this is its first call here:
            # EVAL runs the script and caches it again, so EVALSHA works next time.
            return await client.execute_command(*call.eval())

    def _send(self, send: Callable[..., Awaitable[_T]], *args: Any, **kwargs: Any) -> Awaitable[_T]:
        """``send(*args, **kwargs)`` for ``_call``; in its turn on a client from_url built."""
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
        return LeaseBackendError(
            f"unexpected data at the lease's Redis key ({exc}); is another program "
            f"writing under the prefix {self.prefix!r}?",
            backend=self.backend,
            key=key,
        )

    # -- the contract -------------------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        call = _replies.acquire_request(
            self._prefix, key, owner, ttl_ms, counter_ttl_ms=self.counter_ttl_ms
        )
        reply = await self._call(self._send(self._evalsha, call), key)
        try:
            return _replies.read_acquire(reply, owner)
        except _replies.GarbledReply as exc:
            raise self._garbled(key, exc) from exc

    async def get_lease_owner(self, key: str) -> str | None:
        validate_key(key)
        command = _replies.owner_request(self._prefix, key)
        reply = await self._call(self._send(self._client.execute_command, *command), key)
        try:
            return _replies.read_owner(reply)
        except _replies.GarbledReply as exc:
            raise self._garbled(key, exc) from exc

    async def release_lease(self, key: str, owner: str) -> None:
        validate_key(key)
        validate_owner(owner)
        await self._call(
            self._send(
                self._evalsha,
                _replies.release_request(self._prefix, key, owner, publish=self._publish),
            ),
            key,
        )

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        call = _replies.renew_request(
            self._prefix, key, owner, ttl_ms, counter_ttl_ms=self.counter_ttl_ms
        )
        return _replies.read_flag(await self._call(self._send(self._evalsha, call), key))

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
        reply = await self._call(self._send(self._evalsha, call), items[0][0])
        try:
            return _replies.read_flags(reply, len(items))
        except _replies.GarbledReply as exc:
            raise self._garbled(items[0][0], exc) from exc

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        call = _replies.transfer_request(
            self._prefix,
            key,
            from_owner,
            to_owner,
            ttl_ms,
            counter_ttl_ms=self.counter_ttl_ms,
            publish=self._publish,
        )
        return _replies.read_flag(await self._call(self._send(self._evalsha, call), key))

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
        command = _replies.remaining_request(self._prefix, key)
        reply = await self._call(self._send(self._client.execute_command, *command), key)
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
        return f"{kwargs['host']}:{kwargs.get('port', _DEFAULT_PORT)}"
    if "path" in kwargs:
        return redact_url(str(kwargs["path"]))
    return ""
