"""``RedisSyncLeaseProvider``: the Redis backend on redis-py's blocking client, for leasekit.sync.

Not a second backend: the scripts (``_lua``), requests and validation (``_ops``),
reply reading (``_replies``), URL and option parsing and the error table
(``_options``) are the async provider's own. This module only sends each request on
a blocking connection, from the calling thread, so a blocking caller pays one round
trip and no thread hop.

Every wait is bounded by ``timeout_s`` through the driver: the socket's connect and
read timeouts, and the wait for a free connection (at most ``max_connections``
commands run at once; the rest wait their turn, within ``timeout_s``).
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any, TypeAlias

import redis
from redis.connection import ConnectionPool
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.retry import Retry

from leasekit import InvalidLeaseArgument, LeaseBackendTimeout, LeaseResult
from leasekit.backend import SyncBackendProvider, redact_url

from . import _ops, _options, _replies
from ._provider import RedisLeaseProvider

__all__ = ["RedisSyncClient", "RedisSyncLeaseProvider"]

RedisSyncClient: TypeAlias = redis.Redis | redis.RedisCluster
"""The blocking clients the provider accepts: redis-py's, single server or cluster."""

_Command = tuple[bytes | int | str, ...]
_UNBOUNDED = 2**31


class RedisSyncLeaseProvider(SyncBackendProvider):
    """Leases in Redis from blocking code: the async provider's scripts on redis-py's sync client.

    Safe to share between threads. Made by ``leasekit.sync.connect("redis://...")``
    (through :meth:`RedisLeaseProvider.sync_from_url`), by :meth:`from_url`, or over a
    caller's own ``redis.Redis`` / ``redis.RedisCluster`` (never closed by the
    provider). Options, capabilities, fencing tokens, release notifications and
    errors are those of :class:`RedisLeaseProvider`; a stalled server raises
    :class:`~leasekit.LeaseBackendTimeout` after ``timeout_s``, provided the client's
    sockets have timeouts (a client :meth:`from_url` builds always has).
    """

    backend = RedisLeaseProvider.backend
    capabilities = RedisLeaseProvider.capabilities
    errors = _options.ERRORS

    def __init__(
        self,
        client: RedisSyncClient,
        *,
        prefix: str = _options.PREFIX.default,
        timeout_s: float = _options.TIMEOUT.default,
        counter_ttl_ms: int | None = _options.COUNTER_TTL.default,
        close_client: bool = False,
    ) -> None:
        if not isinstance(client, redis.Redis | redis.RedisCluster):
            raise InvalidLeaseArgument.for_argument(
                "client",
                "must be a redis.Redis or redis.RedisCluster (the blocking client), got "
                f"{type(client).__module__}.{type(client).__qualname__}",
            )
        self.prefix: str = _options.PREFIX.validate(prefix)
        self.counter_ttl_ms: int | None = _options.COUNTER_TTL.validate(counter_ttl_ms)
        super().__init__(
            timeout_s=_options.TIMEOUT.validate(timeout_s), owns_client=bool(close_client)
        )
        self._client = client
        self._prefix = self.prefix.encode()
        cluster = isinstance(client, redis.RedisCluster)
        # The async provider's waiters listen on the lease's channel: releases and
        # transfers from blocking code wake them too.
        self._publish = b"SPUBLISH" if cluster else b"PUBLISH"
        # A single server's commands go straight to a connection (see _Connections); a
        # cluster routes by slot, so its client sends.
        self._connections: _Connections | None = None
        if isinstance(client, redis.Redis):
            pool = client.connection_pool
            limit = getattr(pool, "max_connections", None) or _UNBOUNDED
            self._connections = _Connections(pool, limit, self.timeout_s)
        self._server = _server_of(client)

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
        connection = _options.connection_settings(settings.timeout_s, Retry)
        client: RedisSyncClient
        try:
            if settings.cluster:
                client = redis.RedisCluster.from_url(
                    settings.driver_url, max_connections=settings.max_connections, **connection
                )
            else:
                # The provider takes at most max_connections from it (_Connections), so
                # the pool never runs out; its own wait would raise ConnectionError.
                pool = ConnectionPool.from_url(
                    settings.driver_url, max_connections=settings.max_connections, **connection
                )
                client = redis.Redis(connection_pool=pool)
        except (RedisError, RedisClusterException, ValueError, TypeError) as exc:
            raise InvalidLeaseArgument.for_argument(
                "url", f"{exc} ({settings.redacted!r})"
            ) from None
        return cls(
            client,
            prefix=settings.prefix,
            timeout_s=settings.timeout_s,
            counter_ttl_ms=settings.counter_ttl_ms,
            close_client=True,
        )

    # -- one round trip -------------------------------------------------------------------

    def _execute(self, command: _Command) -> Any:
        """Send one command and return its reply; raises the driver's errors."""
        connections = self._connections
        if connections is None:
            return self._client.execute_command(*command)  # type: ignore[no-untyped-call]
        connection = connections.take()
        if connection is None:
            raise LeaseBackendTimeout(
                f"no free connection within {self.timeout_s:g} s{self._where()}",
                backend=self.backend,
            )
        try:
            # The connection's own retry: one immediate retry on a dropped connection
            # (from_url's clients), none on a timeout.
            return connection.retry.call_with_retry(
                lambda: _round_trip(connection, command),
                lambda _error: connection.disconnect(),
            )
        except BaseException:
            # Whatever was cut short (a timeout, Ctrl-C mid-reply) may have left a reply
            # unread: the connection starts afresh, reconnecting on its next command.
            connection.disconnect()
            raise
        finally:
            connections.give(connection)

    def _evalsha(self, call: _replies.ScriptCall) -> Any:
        try:
            return self._execute(call.evalsha())
        except NoScriptError:
            # A flushed script cache, or this server's first call: EVAL caches it again.
            return self._execute(call.eval())

    def _connect(self) -> None:
        self._execute(("PING",))

    def close(self) -> None:
        """Refuse new operations, hand borrowed connections back, close a client built here."""
        super().close()
        if self._connections is not None:
            self._connections.give_back()

    def _close_client(self) -> None:
        self._client.close()

    def _describe(self) -> str:
        where = f", server={self._server}" if self._server else ""
        return f"prefix={self.prefix!r}{where}"

    def _where(self) -> str:
        return f" (server {self._server})" if self._server else ""

    # -- the contract ---------------------------------------------------------------------

    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        """Blocking :meth:`RedisLeaseProvider.acquire_lease`."""
        call = _ops.acquire(self._prefix, key, owner, ttl_ms, counter_ttl_ms=self.counter_ttl_ms)
        reply = self._call(self._evalsha, call, key=key)
        try:
            return _replies.read_acquire(reply, owner)
        except _replies.GarbledReply as exc:
            raise _options.garbled(exc, prefix=self.prefix, key=key) from exc

    def get_lease_owner(self, key: str) -> str | None:
        """Blocking :meth:`RedisLeaseProvider.get_lease_owner`."""
        reply = self._call(self._execute, _ops.owner(self._prefix, key), key=key)
        try:
            return _replies.read_owner(reply)
        except _replies.GarbledReply as exc:
            raise _options.garbled(exc, prefix=self.prefix, key=key) from exc

    def release_lease(self, key: str, owner: str) -> None:
        """Blocking :meth:`RedisLeaseProvider.release_lease`."""
        call = _ops.release(self._prefix, key, owner, publish=self._publish)
        self._call(self._evalsha, call, key=key)

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`RedisLeaseProvider.renew_lease`."""
        call = _ops.renew(self._prefix, key, owner, ttl_ms, counter_ttl_ms=self.counter_ttl_ms)
        return _replies.read_flag(self._call(self._evalsha, call, key=key))

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`RedisLeaseProvider.transfer_lease`."""
        call = _ops.transfer(
            self._prefix,
            key,
            from_owner,
            to_owner,
            ttl_ms,
            counter_ttl_ms=self.counter_ttl_ms,
            publish=self._publish,
        )
        return _replies.read_flag(self._call(self._evalsha, call, key=key))


class _Connections:
    """Connections borrowed from redis-py's pool once, then handed out without it.

    redis-py's ``get_connection``/``release`` cost about 15 µs of CPU per command (a
    poll for stray input, fork checks, locks, metrics bookkeeping): more than leasekit's
    own work on an operation. Here a connection is taken from the pool the first time
    it is needed and then circulates through a lock-free queue; at most ``limit`` are
    taken, and a thread that finds them all busy waits for one, within ``timeout_s``
    (``take`` returns ``None`` at the deadline). A connection whose command failed is
    disconnected before it goes back, so no stray reply is ever read as an answer.
    After a fork the child borrows afresh.
    """

    __slots__ = ("_borrowed", "_idle", "_limit", "_lock", "_pid", "_pool", "_taken", "_timeout_s")

    def __init__(self, pool: ConnectionPool, limit: int, timeout_s: float) -> None:
        self._pool = pool
        self._limit = limit
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._idle: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._taken: list[Any] = []
        self._borrowed = 0
        self._pid = os.getpid()

    def take(self) -> Any:
        if self._pid != os.getpid():
            self._after_fork()
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            borrow = self._borrowed < self._limit
            if borrow:
                self._borrowed += 1
        if borrow:
            # Outside the lock: connecting may take up to the connect timeout.
            try:
                connection = self._pool.get_connection()
            except BaseException:
                with self._lock:
                    self._borrowed -= 1
                raise
            with self._lock:
                self._taken.append(connection)
            return connection
        try:
            return self._idle.get(timeout=self._timeout_s)
        except queue.Empty:
            return None

    def give(self, connection: Any) -> None:
        self._idle.put(connection)

    def give_back(self) -> None:
        """Return every borrowed connection to redis-py's pool (the provider is closing)."""
        with self._lock:
            taken, self._taken = self._taken, []
            self._limit = self._borrowed = 0
        for connection in taken:
            self._pool.release(connection)

    def _after_fork(self) -> None:
        # The parent's sockets are not ours to use: borrow new ones from the pool, which
        # resets itself in the child.
        with self._lock:
            self._pid = os.getpid()
            self._idle = queue.SimpleQueue()
            self._taken = []
            self._borrowed = 0


def _round_trip(connection: Any, command: _Command) -> Any:
    connection.send_command(*command)
    return connection.read_response()


def _server_of(client: RedisSyncClient) -> str:
    """``host:port`` of the client's server (a cluster's first startup node), for messages."""
    if isinstance(client, redis.RedisCluster):
        node = client.get_default_node()  # type: ignore[no-untyped-call]
        return f"{node.host}:{node.port}" if node is not None else ""
    kwargs = client.connection_pool.connection_kwargs
    if "host" in kwargs:
        return f"{kwargs['host']}:{kwargs.get('port', _options.DEFAULT_PORT)}"
    if "path" in kwargs:
        return redact_url(str(kwargs["path"]))
    return ""
