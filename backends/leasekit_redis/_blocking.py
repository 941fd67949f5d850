"""The blocking provider's transport: redis-py's blocking client, from the calling thread.

:meth:`BlockingTransport.exchange` sends one request of an operation (``_ops``) and
is what :func:`~leasekit.backend.drive` calls, so a blocking caller pays one round trip
and no thread hop. Every wait is bounded by ``timeout_s`` through the driver: the
socket's connect and read timeouts, and the wait for a free connection (at most
``max_connections`` commands run at once; the rest wait their turn, within
``timeout_s``).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeAlias

import redis
from redis.connection import ConnectionPool
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from leasekit import InvalidLeaseArgument, LeaseBackendTimeout

from . import _keys, _options
from ._ops import Acknowledged, Command, ScriptCall

__all__ = ["BlockingTransport", "RedisSyncClient", "build_client", "server_of"]

RedisSyncClient: TypeAlias = redis.Redis | redis.RedisCluster
"""The blocking clients the provider accepts: redis-py's, single server or cluster."""

_UNBOUNDED = 2**31


def build_client(settings: _options.RedisSettings) -> RedisSyncClient:
    """The blocking client ``from_url`` builds from parsed settings; no I/O."""
    connection = _options.connection_settings(settings.timeout_s, Retry)
    try:
        if settings.cluster:
            return redis.RedisCluster.from_url(
                settings.driver_url, max_connections=settings.max_connections, **connection
            )
        if settings.sentinel is not None:
            # As the async client (_aio._sentinel_client): every new connection asks the
            # sentinels where the primary is; a failed or demoted one is dropped.
            own, servers = _options.sentinel_settings(settings, Retry)
            sentinel = Sentinel(  # type: ignore[no-untyped-call]
                list(settings.sentinel.addresses), sentinel_kwargs=own, **{**servers, **connection}
            )
            client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
                settings.sentinel.service,
                connection_pool_class=SentinelConnectionPool,
                max_connections=settings.max_connections,
            )
        else:
            # The transport takes at most max_connections from it (_Connections), so the
            # pool never runs out; its own wait would raise ConnectionError.
            pool = ConnectionPool.from_url(
                settings.driver_url, max_connections=settings.max_connections, **connection
            )
            client = redis.Redis(connection_pool=pool)
        # The pool is the client's own, as from_url makes it: close() disconnects it
        # (a pool passed in is otherwise left open, its sockets to the garbage collector).
        client.auto_close_connection_pool = True
        return client
    except (RedisError, RedisClusterException, ValueError, TypeError) as exc:
        raise InvalidLeaseArgument.for_argument("url", f"{exc} ({settings.redacted!r})") from None


def server_of(client: RedisSyncClient) -> str:
    """``host:port`` of the client's server (a cluster's default node), for messages."""
    if isinstance(client, redis.RedisCluster):
        node = client.get_default_node()  # type: ignore[no-untyped-call]
        return f"{node.host}:{node.port}" if node is not None else ""
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        addresses = ",".join(
            _options.describe_server(each.connection_pool.connection_kwargs)
            for each in pool.sentinel_manager.sentinels
        )
        return f"{pool.service_name} via sentinels {addresses}"
    return _options.describe_server(pool.connection_kwargs)


def close_sentinels(client: RedisSyncClient) -> None:
    """Close the sentinel clients behind a client :func:`build_client` made (if any)."""
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SentinelConnectionPool):
        for sentinel in pool.sentinel_manager.sentinels:
            sentinel.close()


class BlockingTransport:
    """Sends requests on a blocking client: a single server's straight to a connection.

    A cluster routes by slot, so there its client sends. ``where`` ends the message of
    a timeout waiting for a free connection.
    """

    __slots__ = ("_client", "_connections", "_timeout_s", "_where")

    def __init__(self, client: RedisSyncClient, *, timeout_s: float, where: str) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._where = where
        self._connections: _Connections | None = None
        if isinstance(client, redis.Redis):
            pool = client.connection_pool
            limit = getattr(pool, "max_connections", None) or _UNBOUNDED
            self._connections = _Connections(pool, limit, timeout_s)

    def exchange(self, request: ScriptCall | Acknowledged | Command) -> Any:
        """Send ``request`` (a script call or a plain command); raises the driver's errors."""
        if isinstance(request, Acknowledged):
            return self._acknowledged(request)
        if not isinstance(request, ScriptCall):
            return self.execute(request)
        try:
            return self.execute(request.evalsha())
        except NoScriptError:
            # A flushed script cache, or this server's first call: EVAL caches it again.
            return self.execute(request.eval())

    def _acknowledged(self, request: Acknowledged) -> tuple[Any, Any]:
        """The script and its ``WAIT``, pipelined on one connection: ``(reply, acks)``."""
        reply, acks = self.execute_pipelined((request.call.evalsha(), request.wait))
        if isinstance(reply, NoScriptError):
            reply, acks = self.execute_pipelined((request.call.eval(), request.wait))
        if isinstance(reply, BaseException):
            raise reply
        return reply, acks

    def execute_pipelined(self, commands: tuple[Command, ...]) -> list[Any]:
        """Send ``commands`` in one write on one connection; error replies stand in place.

        Only on a single server (``min_replicas``, its one user, is refused on a cluster).
        """
        return self._on_connection(_pipelined_trip, commands)  # type: ignore[no-any-return]

    def execute(self, command: Command) -> Any:
        """Send one command and return its reply; raises the driver's errors."""
        if self._connections is None:
            return self._client.execute_command(*command)  # type: ignore[no-untyped-call]
        return self._on_connection(_round_trip, command)

    def _on_connection(self, trip: Callable[[Any, Any], Any], what: Any) -> Any:
        """``trip(connection, what)`` on a free connection of the single server."""
        connections = self._connections
        assert connections is not None
        connection = connections.take()
        if connection is None:
            raise LeaseBackendTimeout(
                f"no free connection within {self._timeout_s:g} s{self._where}",
                backend=_options.BACKEND,
            )
        try:
            # The connection's own retry: one immediate retry on a dropped connection
            # (from_url's clients), none on a timeout.
            return connection.retry.call_with_retry(
                lambda: trip(connection, what),
                lambda _error: connection.disconnect(),
            )
        except NoScriptError:
            raise  # a whole reply, read: the connection is fine (exchange() sends EVAL next)
        except BaseException:
            # Whatever was cut short (a timeout, Ctrl-C mid-reply) may have left a reply
            # unread: the connection starts afresh, reconnecting on its next command.
            connection.disconnect()
            raise
        finally:
            connections.give(connection)

    def give_back(self) -> None:
        """Hand borrowed connections back to redis-py's pool (the provider is closing)."""
        if self._connections is not None:
            self._connections.give_back()

    def slot_groups(self, leases: list[bytes]) -> list[list[int]]:
        """Indexes of ``leases`` grouped by cluster slot (one group on a single server)."""
        client = self._client
        keyslot = client.keyslot if isinstance(client, redis.RedisCluster) else None
        return _keys.slot_groups(leases, keyslot)


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


def _connected(connection: Any) -> None:
    # Through connect(), as redis-py's pool does when it hands a connection out: a
    # Sentinel-managed connection asks the sentinels where the primary is there, while
    # a command on a closed connection would reconnect to its last address (redis-py 8),
    # a demoted primary after a failover.
    if getattr(connection, "_sock", None) is None:
        connection.connect()


def _round_trip(connection: Any, command: Command) -> Any:
    _connected(connection)
    connection.send_command(*command)
    return connection.read_response()


def _pipelined_trip(connection: Any, commands: tuple[Command, ...]) -> list[Any]:
    # One write; every reply read, an error reply in its command's place, so the
    # connection is left with nothing unread.
    _connected(connection)
    connection.send_packed_command(connection.pack_commands(commands))
    return [_read_reply(connection) for _ in commands]


def _read_reply(connection: Any) -> Any:
    try:
        return connection.read_response()
    except ResponseError as exc:
        return exc
