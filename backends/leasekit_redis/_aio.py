"""The async provider's transport: redis-py's asyncio client, auto-pipelined, in turns.

:meth:`AutoPipeline.exchange` sends one request of an operation (``_ops``) and is
what :func:`~leasekit.backend.drive_async` awaits. When a request is made while none
of the provider's is in flight, it goes out at once, alone: a single task pays nothing
for pipelining. When others are in flight, it joins the open *batch* (or opens one). A
batch is written at the next event-loop iteration, or, on a client built from a URL,
as soon as a connection is free (``max_connections``): until then it takes in every
request made meanwhile. It goes out as one non-transactional pipeline (redis-py's
``pipeline(transaction=False)``): one write, its replies read back in order, each
handed to the caller that made it. On Redis Cluster the pipeline splits itself by node
(redis-py's cluster pipeline), one write per node.

Non-transactional means each script stays atomic on its own, exactly as when sent
alone, and a script that fails (its reply is an error) fails only its caller. A
connection that fails fails every caller in the batch, each with its own mapped
error. Each caller keeps its own deadline (``timeout_s``, on the provider's timer):
a caller who runs out stops waiting and gets a timeout, and its request is not sent
if the batch was still waiting for a connection. The batch itself is bounded by
``timeout_s`` from the moment it is written, which is no earlier than any of its
callers began, so it never outlives them by more than that; ``aclose`` drains it.

On a client :func:`build_client` made, at most ``max_connections`` commands or
batches run at once (:attr:`AutoPipeline.slots`); the rest wait their turn, first
come first served. redis-py cannot do it alone: a cluster node refuses a command
beyond its limit instead of waiting, and ``BlockingConnectionPool`` lets a task that
just released a connection take it straight back, so under load a waiter can starve
past ``timeout_s`` (500 tasks on 50 connections: hundreds of timeouts in 10 s).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeAlias, TypeVar

import redis.asyncio
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from leasekit import InvalidLeaseArgument
from leasekit.backend import Deadlines

from . import _keys, _options
from ._ops import Acknowledged, Command, Pipelined, Request, ScriptCall

__all__ = ["AutoPipeline", "RedisClient", "build_client", "server_of"]

RedisClient: TypeAlias = redis.asyncio.Redis | redis.asyncio.RedisCluster
"""The clients the provider accepts: redis-py's asyncio client, single server or cluster."""

_T = TypeVar("_T")


def build_client(settings: _options.RedisSettings) -> RedisClient:
    """The asyncio client ``from_url`` builds from parsed settings; no I/O."""
    # No socket timeout (unless the URL sets one): the provider's own deadline bounds
    # every operation, and redis-py's would cost a task per write and a timer per read.
    connection = {
        **_options.connection_settings(settings.timeout_s, Retry),
        "socket_timeout": None,
    }
    try:
        if settings.cluster:
            return redis.asyncio.RedisCluster.from_url(
                settings.driver_url, max_connections=settings.max_connections, **connection
            )
        if settings.sentinel is not None:
            return _sentinel_client(settings, connection)
        # Blocking, never MaxConnectionsError, should anything take a connection outside
        # the provider's turns (its wait is bounded by timeout_s).
        pool = BlockingConnectionPool.from_url(
            settings.driver_url,
            max_connections=settings.max_connections,
            timeout=None,
            **connection,
        )
        return redis.asyncio.Redis.from_pool(pool)
    except (RedisError, RedisClusterException, ValueError, TypeError) as exc:
        raise InvalidLeaseArgument.for_argument("url", f"{exc} ({settings.redacted!r})") from None


def _sentinel_client(settings: _options.RedisSettings, connection: dict[str, Any]) -> RedisClient:
    """A client of the primary that the sentinels name, found again on every new connection.

    A connection that fails, or finds its server demoted (a ``READONLY`` reply), is
    dropped; the next one asks the sentinels again, so after a failover operations
    reach the new primary with no restart. The pool holds ``max_connections`` for the
    provider's turns, one for the release subscriber and one spare.
    """
    assert settings.sentinel is not None
    own, servers = _options.sentinel_settings(settings, Retry)
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(settings.sentinel.addresses), sentinel_kwargs=own, **{**servers, **connection}
    )
    return sentinel.master_for(  # type: ignore[no-any-return]
        settings.sentinel.service,
        connection_pool_class=_SentinelPool,
        max_connections=settings.max_connections + 2,
    )


class _SentinelPool(SentinelConnectionPool):
    """redis-py's pool of the primary's connections, asking the sentinels once at a time.

    Connections opened together (after a failover, every task reconnects at once)
    share one question to the sentinels. It runs in a task of its own, shielded: an
    operation cancelled at its deadline stops waiting for the answer, while the
    question itself runs to its end (each sentinel within ``sentinel_timeout_s``), so
    redis-py's sentinel clients never have a connection cut halfway, which would leave
    it unclosed.
    """

    _discovery: asyncio.Task[Any] | None = None

    async def get_master_address(self) -> Any:
        task = self._discovery
        if task is None or task.done():
            discover = super().get_master_address()  # type: ignore[no-untyped-call]
            task = asyncio.get_running_loop().create_task(discover)
            task.add_done_callback(_retrieve)
            self._discovery = task
        return await asyncio.shield(task)

    async def settle(self, timeout_s: float) -> None:
        """Wait for a question to the sentinels still running (before closing them)."""
        task = self._discovery
        if task is not None and not task.done():
            await asyncio.wait([task], timeout=timeout_s)


def _retrieve(task: asyncio.Task[Any]) -> None:
    # Its callers may all have gone: the outcome is nobody's, and not worth a warning.
    if not task.cancelled():
        task.exception()


async def close_sentinels(client: RedisClient, timeout_s: float) -> None:
    """Close the sentinel clients behind a client :func:`build_client` made (if any)."""
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SentinelConnectionPool):
        if isinstance(pool, _SentinelPool):
            await pool.settle(timeout_s)
        await pool.sentinel_manager.aclose()


def server_of(client: RedisClient) -> str:
    """``host:port`` of the client's server (a cluster's first startup node), for messages."""
    if isinstance(client, redis.asyncio.RedisCluster):
        return next(iter(client.nodes_manager.startup_nodes), "")
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        addresses = ",".join(
            _options.describe_server(each.connection_pool.connection_kwargs)
            for each in pool.sentinel_manager.sentinels
        )
        return f"{pool.service_name} via sentinels {addresses}"
    return _options.describe_server(pool.connection_kwargs)


_Single: TypeAlias = ScriptCall | Acknowledged | Command
"""A request an operation sends through :meth:`AutoPipeline.exchange`."""


def _command(request: _Single) -> Command:
    if isinstance(request, Acknowledged):
        return request.call.evalsha()
    return request.evalsha() if isinstance(request, ScriptCall) else request


def _script(request: _Single) -> ScriptCall | None:
    if isinstance(request, Acknowledged):
        return request.call
    return request if isinstance(request, ScriptCall) else None


def _wait_of(requests: Sequence[_Single]) -> Command | None:
    """The ``WAIT`` that ends a batch holding acknowledged requests, else ``None``."""
    for request in requests:
        if isinstance(request, Acknowledged):
            return request.wait
    return None


class _Batch:
    """The requests of one batch, with the callers waiting for their replies."""

    __slots__ = ("futures", "requests")

    def __init__(self) -> None:
        self.requests: list[_Single] = []
        self.futures: list[asyncio.Future[Any]] = []


class AutoPipeline:
    """Sends the provider's requests: alone when nothing else is in flight, else batched.

    ``deadlines`` is the provider's timer and ``spawn`` its way to start background
    work that ``aclose`` drains. ``slots`` (set by ``from_url``) lets at most that many
    commands or batches run at once.
    """

    __slots__ = (
        "_batch",
        "_busy",
        "_client",
        "_deadlines",
        "_spawn",
        "batches",
        "enabled",
        "slots",
    )

    def __init__(
        self,
        client: RedisClient,
        *,
        enabled: bool,
        deadlines: Deadlines,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
    ) -> None:
        self._client = client
        self.enabled = enabled
        self._deadlines = deadlines
        self._spawn = spawn
        self.slots: asyncio.Semaphore | None = None
        self._batch: _Batch | None = None
        self._busy = 0  # requests sent or queued and not yet answered
        self.batches = 0  # pipelines written (two commands or more), for tests and curiosity

    def exchange(self, request: Request) -> Awaitable[Any]:
        """What to await for ``request``'s reply (a script call or a plain command).

        Never raises by itself: errors arrive through the awaitable, raw from redis-py
        (the provider's ``_call`` maps them). The provider refuses calls once closed
        before making them, so nothing joins a batch after ``aclose`` began.
        """
        batch = self._batch
        if batch is None:
            if not self._busy or not self.enabled:
                return self._execute(request, alone=True)  # type: ignore[arg-type]
            batch = self._batch = _Batch()
            self._spawn(self._flush(batch))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        batch.requests.append(request)  # type: ignore[arg-type]
        batch.futures.append(future)
        self._busy += 1
        return future

    def send(self, send: Callable[..., Awaitable[_T]], *args: Any, **kwargs: Any) -> Awaitable[_T]:
        """``send(*args, **kwargs)``, in its turn on a client from_url built.

        For what is not an operation's request (the PING, ``inspect``'s scan).
        """
        if self.slots is None:
            return send(*args, **kwargs)
        return self._in_turn(self.slots, send, *args, **kwargs)

    @staticmethod
    async def _in_turn(
        slots: asyncio.Semaphore, send: Callable[..., Awaitable[_T]], *args: Any, **kwargs: Any
    ) -> _T:
        async with slots:
            return await send(*args, **kwargs)

    def exchange_pipelined(self, request: Pipelined) -> Awaitable[list[Any]]:
        """The replies to ``request``'s commands, in one pipeline of its own, in its turn."""
        return self.send(self._pipeline_of, request.commands)

    def names(self, pattern: bytes) -> AsyncIterator[bytes | str]:
        """The names matching ``pattern`` (``SCAN``, on every node of a cluster)."""
        return self._client.scan_iter(match=pattern, count=1000)

    def slot_groups(self, leases: list[bytes]) -> list[list[int]]:
        """Indexes of ``leases`` grouped by cluster slot (one group on a single server)."""
        client = self._client
        keyslot = client.keyslot if isinstance(client, redis.asyncio.RedisCluster) else None
        return _keys.slot_groups(leases, keyslot)

    # -- a batch: its own task writes it and hands out the replies ----------------------

    async def _flush(self, batch: _Batch) -> None:
        slots = self.slots
        acquired = False
        try:
            if slots is not None:
                await slots.acquire()  # the batch stays open meanwhile, taking in more
                acquired = True
            if self._batch is batch:
                self._batch = None
            # Callers who ran out of time while the batch waited: their writes stay unsent.
            live = [i for i, future in enumerate(batch.futures) if not future.done()]
            if live:
                await self._write(batch, live)
        finally:
            if self._batch is batch:
                self._batch = None  # cancelled while waiting for a connection (aclose)
            if acquired and slots is not None:
                slots.release()
            self._busy -= len(batch.futures)
            for future in batch.futures:
                if not future.done():
                    # The caller's _call maps it to LeaseBackendTimeout, naming its key.
                    future.set_exception(
                        RedisTimeoutError(f"no answer within {self._deadlines.timeout_s:g} s")
                    )

    async def _write(self, batch: _Batch, live: list[int]) -> None:
        requests = [batch.requests[i] for i in live]
        futures = [batch.futures[i] for i in live]
        deadlines = self._deadlines
        watch = deadlines.open()
        try:
            if watch is None:  # Python 3.10, where the timer cannot cancel a task
                replies = await asyncio.wait_for(self._send(requests), deadlines.timeout_s)
            else:
                replies = await self._send(requests)
        except asyncio.CancelledError:
            if deadlines.close(watch):
                return  # our own deadline: _flush gives each caller left a timeout
            raise
        except Exception as exc:  # noqa: BLE001 (handed to every caller, who maps it)
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            return
        finally:
            deadlines.close(watch)
        for future, reply in zip(futures, replies, strict=True):
            if future.done():
                continue  # its caller gave up
            if isinstance(reply, BaseException):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _send(self, requests: list[_Single]) -> list[Any]:
        """The replies to ``requests`` in order; an error reply stands in its own place.

        With :class:`Acknowledged` requests in the batch, one ``WAIT`` ends the pipeline:
        it counts the replicas that have every write before it on that connection, so
        its answer is each acknowledged request's (one wait, not one per request).
        """
        if len(requests) == 1:
            return [await self._execute(requests[0])]
        replies, acks = await self._pipelined(
            [_command(request) for request in requests], _wait_of(requests)
        )
        retry = [
            (i, script)
            for i, (reply, script) in enumerate(zip(replies, map(_script, requests), strict=True))
            if script is not None and isinstance(reply, NoScriptError)
        ]
        retried_acks: dict[int, Any] = {}
        if retry:
            # The script cache was flushed: EVAL those (which caches them again), in one
            # more pipeline (on its own connection, so with its own WAIT).
            again, again_acks = await self._pipelined(
                [script.eval() for _, script in retry], _wait_of([requests[i] for i, _ in retry])
            )
            for (i, _), reply in zip(retry, again, strict=True):
                replies[i] = reply
                retried_acks[i] = again_acks
        for i, request in enumerate(requests):
            if isinstance(request, Acknowledged) and not isinstance(replies[i], BaseException):
                replies[i] = (replies[i], retried_acks.get(i, acks))
        return replies

    async def _pipelined(
        self, commands: list[Command], wait: Command | None
    ) -> tuple[list[Any], Any]:
        """A batch's commands in one pipeline, counted in :attr:`batches`, then ``wait``'s reply."""
        self.batches += 1
        if wait is None:
            return await self._pipeline_of(commands), None
        replies = await self._pipeline_of([*commands, wait])
        return replies[:-1], replies[-1]

    async def _acknowledged(self, request: Acknowledged) -> tuple[Any, Any]:
        """The script and its ``WAIT`` in one pipeline: ``(script's reply, acknowledgements)``.

        The script's error reply is raised, as when it is sent alone.
        """
        reply, acks = await self._pipeline_of((request.call.evalsha(), request.wait))
        if isinstance(reply, NoScriptError):
            reply, acks = await self._pipeline_of((request.call.eval(), request.wait))
        if isinstance(reply, BaseException):
            raise reply
        return reply, acks

    async def _pipeline_of(self, commands: Sequence[Command]) -> list[Any]:
        """``commands`` in one non-transactional pipeline: replies, error replies in place."""
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        return replies

    async def _execute(self, request: _Single, *, alone: bool = False) -> Any:
        """One request on its own: a script by EVALSHA, or by EVAL when the server lacks it.

        The server's script cache was flushed, or this is the script's first call there:
        EVAL runs it and caches it again, so EVALSHA works next time. An acknowledged
        request goes with its ``WAIT`` (:meth:`_acknowledged`). ``alone``: a request
        outside any batch, sent by its caller's own task, counted in :attr:`_busy` (so
        that requests arriving meanwhile form a batch) and in its turn for a connection
        (one coroutine per request: this is every lone request's path).
        """
        slots = self.slots if alone else None
        if alone:
            self._busy += 1
        try:
            if slots is not None:
                await slots.acquire()
            try:
                client = self._client
                if isinstance(request, Acknowledged):
                    return await self._acknowledged(request)
                if not isinstance(request, ScriptCall):
                    return await client.execute_command(*request)
                try:
                    return await client.execute_command(*request.evalsha())
                except NoScriptError:
                    return await client.execute_command(*request.eval())
            finally:
                if slots is not None:
                    slots.release()
        finally:
            if alone:
                self._busy -= 1
