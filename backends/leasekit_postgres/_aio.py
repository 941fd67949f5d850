"""The asyncio transport: psycopg's ``AsyncConnection`` and ``AsyncConnectionPool``.

Only I/O. :func:`exchange` sends one :class:`~leasekit_postgres._ops.Query` and reads
its reply; :func:`run` drives an operation of ``_ops`` with it
(:func:`~leasekit.backend.drive_async`). :class:`AsyncTransport` is a provider's pool or
single connection: it checks a connection out for each attempt of ``_ops.attempts``
(the operation, and once more on a fresh connection when the first one died),
opens a pool the provider built with a first direct connection (so that a refused
connection, a wrong password or an unknown host surface at once instead of as
psycopg_pool's background retries) and checks the schema once. psycopg_pool's own log
about a pool the provider built goes to leasekit's logger at DEBUG
(:data:`ROUTE_POOL_LOG`), not to a terminal.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from functools import partial
from typing import Any, TypeAlias, TypeVar

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolClosed

from leasekit import LeaseBackendError, LeaseProviderClosed
from leasekit.backend import drive_async

from . import _group, _ops
from ._commit import CommitWatch
from ._options import (
    BACKEND,
    CONNECT_ERRORS,
    PoolSettings,
    Settings,
    check_client,
    server_of,
    where,
)

__all__ = [
    "ROUTE_POOL_LOG",
    "AsyncClient",
    "AsyncTransport",
    "exchange",
    "open_connection",
    "own_pool",
    "run",
]

_T = TypeVar("_T")

log = logging.getLogger("leasekit.postgres")

AsyncClient: TypeAlias = AsyncConnectionPool[Any] | psycopg.AsyncConnection[Any]
"""What the async provider runs on: a psycopg_pool async pool, or one async connection."""

# How long closing lets the pool's workers finish a task in hand (a connection attempt
# to a server that does not answer) before they are cancelled.
_POOL_WORKERS_GRACE_S = 0.1
_pool_numbers = itertools.count(1)


async def exchange(conn: psycopg.AsyncConnection[Any], query: _ops.Query) -> Any:
    """Send ``query`` on ``conn``; its reply as the query reads it."""
    try:
        cursor = await conn.execute(query.statement, query.params, prepare=query.prepare)
        if query.reads == "rowcount":
            return cursor.rowcount
        if query.reads == "rows":
            return await cursor.fetchall()
        return await cursor.fetchone()
    except psycopg.OperationalError as exc:
        if _ops.lost(conn):
            raise _ops.ConnectionLost(str(exc)) from exc
        if _ops.needs_rollback(conn):
            await conn.rollback()
        raise
    except psycopg.Error:
        if _ops.needs_rollback(conn):
            await conn.rollback()
        raise


def run(conn: psycopg.AsyncConnection[Any], operation: _ops.Operation[_T]) -> Awaitable[_T]:
    """Drive ``operation`` on ``conn``."""
    return drive_async(operation, partial(exchange, conn), throws=psycopg.Error)


def own_pool(settings: PoolSettings) -> AsyncConnectionPool[Any]:
    """The pool ``from_url`` builds (not opened: the first call opens it)."""
    # A name of its own: closing finds this pool's worker tasks by it.
    name = f"leasekit-{next(_pool_numbers)}"
    return AsyncConnectionPool(settings.conninfo, **settings.pool_arguments(name))


async def open_connection(
    conninfo: str, kwargs: Mapping[str, Any], *, where: str
) -> psycopg.AsyncConnection[Any]:
    """Connect once, directly: a refusal is :class:`~leasekit.LeaseBackendUnreachable` now."""
    with CONNECT_ERRORS.mapping(where=where):
        return await psycopg.AsyncConnection.connect(conninfo, **kwargs)


class AsyncTransport:
    """A provider's pool or single connection, and how one operation runs on it.

    A caller's single connection must be in autocommit mode (and stay so); a pool's
    connections need not be: the pool commits what a connection left open.
    """

    def __init__(self, client: AsyncClient, settings: Settings, *, owns_client: bool) -> None:
        check_client(
            client,
            AsyncConnectionPool,
            psycopg.AsyncConnection,
            expected="a psycopg_pool.AsyncConnectionPool or a psycopg.AsyncConnection (asyncio)",
        )
        self.client = client
        self.pool = client if isinstance(client, AsyncConnectionPool) else None
        self.conn = client if isinstance(client, psycopg.AsyncConnection) else None
        self.settings = settings
        self.owns_client = owns_client
        # psycopg_pool's log about a pool the provider built goes to leasekit's logger.
        self.route_log = owns_client and self.pool is not None
        self.ready = False
        self._ready_lock = asyncio.Lock()
        self.closing = False
        self.server = self._server()
        self.where = where(self.server, settings.table)
        # With synchronous_commit: each connection's watch for unacknowledged commits.
        self.watches: weakref.WeakKeyDictionary[Any, CommitWatch] | None = (
            None if settings.synchronous_commit is None else weakref.WeakKeyDictionary()
        )
        # The statements of groups of calls (_group) in flight.
        self._group_tasks: set[asyncio.Task[Any]] = set()

    async def run(
        self,
        operation: _ops.Operation[_T],
        again: Callable[..., _ops.Operation[_T]] | None = None,
        args: tuple[Any, ...] = (),
        check_schema: bool = True,
    ) -> _T:
        """Run ``operation``; if its pooled connection died, ``again(*args)`` on a fresh one.

        ``again`` is ``None`` for an operation that may not run twice (a transfer that
        landed before the connection died would answer False the second time). The
        first operation is built by the caller, whose factory validated its arguments
        before any I/O; ``again`` and ``args`` come apart, not as a closure, which
        would cost a cell per argument and a function object on every call.
        """
        if self.route_log:
            ROUTE_POOL_LOG.set(True)
        pool = self.pool
        try:
            if not self.ready:
                await self.ensure_ready(check_schema=check_schema)
            if pool is None:
                return await self._run_single(operation)
            try:
                return await self._attempt(operation)
            except _ops.RETRIED as exc:
                return await self._attempt(_ops.retry_of(exc, operation, again, args))
        except PoolClosed:
            if self.closing:
                raise LeaseProviderClosed(backend=BACKEND) from None
            raise

    async def exchange_once(self, query: _ops.Query) -> Any:
        """Send one statement for a group (``_group``): its reply; never retried here."""
        try:
            if not self.ready:
                await self.ensure_ready(check_schema=True)
            if self.pool is None:
                return await self._run_single(_one(query))
            return await self._attempt(_one(query))
        except PoolClosed:
            if self.closing:
                raise LeaseProviderClosed(backend=BACKEND) from None
            raise

    async def retry(self, operation: _ops.Operation[_T], exc: BaseException) -> _T:
        """What :func:`~leasekit_postgres._ops.attempts` does after ``exc`` (its connection
        died under a group's statement): ``operation`` once more, on a fresh connection."""
        if self.pool is None:
            operation.close()
            raise exc
        try:
            return await self._attempt(_ops.Retry(operation))
        except PoolClosed:
            if self.closing:
                raise LeaseProviderClosed(backend=BACKEND) from None
            raise

    def run_alone(self, operation: Generator[Any, Any, _T], extra: Any) -> Coroutine[Any, Any, _T]:
        """A group's member on a connection of its own (``leasekit.backend.GroupTransport``):
        ``extra`` is ``(again, args)`` for :meth:`run`, or None (not run again)."""
        if extra is None:
            return self.run(operation)
        again, args = extra
        return self.run(operation, again, args)

    def recover(
        self,
        error: BaseException,
        alone: bool,
        request: Any,
        operation: Generator[Any, Any, _T],
        extra: Any,
    ) -> Coroutine[Any, Any, _T]:
        """A member's answer after its statement (or its group's) failed (``_group``)."""
        again, args = (None, ()) if extra is None else extra
        return _group.recover(self, error, alone, request, operation, again, args)

    def start(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a group's statement in a task of its own (:meth:`close` stops it)."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._group_tasks.add(task)
        task.add_done_callback(self._group_tasks.discard)
        task.add_done_callback(_consume_outcome)
        return task

    async def _attempt(self, step: _ops.Operation[_T] | _ops.Retry) -> _T:
        """One of :func:`~leasekit_postgres._ops.attempts`: ``step`` on a pooled connection."""
        assert self.pool is not None
        if isinstance(step, _ops.Retry):
            await self.pool.check()
            step = step.operation
        async with self.pool.connection() as conn:
            watch = None if self.watches is None else CommitWatch.on(self.watches, conn)
            try:
                result = await run(conn, step)
            except psycopg.errors.ReadOnlySqlTransaction:
                await conn.close()  # on a standby: the pool discards it
                raise
            if watch is not None:
                watch.check(self.where)
            return result

    async def _run_single(self, operation: _ops.Operation[_T]) -> _T:
        assert self.conn is not None
        if not self.conn.autocommit:
            operation.close()
            raise LeaseBackendError(
                "the connection left autocommit mode; leasekit needs it on", backend=BACKEND
            )
        if self.watches is None:
            return await run(self.conn, operation)
        watch = CommitWatch.on(self.watches, self.conn)
        result = await run(self.conn, operation)
        watch.check(self.where)
        return result

    async def open(self) -> None:
        """Connect and check the schema now (``async with``)."""
        self.route_pool_log()
        await self.ensure_ready(check_schema=True)

    async def ensure_ready(self, *, check_schema: bool) -> None:
        """Open the pool we built, and once per provider check (or create) the schema.

        The first connection to a pool's server is made directly, not by the pool:
        psycopg_pool connects in the background and retries a refusal until the
        caller's timeout, where a direct attempt reports the refusal (or the wrong
        password, or the unknown host) at once.
        """
        async with self._ready_lock:
            if self.ready:
                return
            pool = self.pool
            if self.owns_client and pool is not None and pool.closed:
                conninfo, kwargs = pool.conninfo, pool.kwargs
                if isinstance(conninfo, str) and isinstance(kwargs, dict):
                    conn = await open_connection(conninfo, kwargs, where=self.where)
                    try:
                        if check_schema:
                            await run(conn, self._ensure_schema())
                            self.ready = True
                    finally:
                        await conn.close()
                await self._fill(pool)
                if not check_schema or self.ready:
                    return
            if not check_schema:
                return
            if pool is None:
                await self._run_single(self._ensure_schema())
            else:
                async with pool.connection() as conn:
                    await run(conn, self._ensure_schema())
            self.ready = True

    async def _fill(self, pool: AsyncConnectionPool[Any]) -> None:
        """Open the pool we built and wait for its ``min_size`` connections.

        Not left connecting in the background: a connection attempt that the end of
        the event loop (``asyncio.run()``) cancels midway hung in psycopg_pool's
        reconnection attempts for its ``reconnect_timeout`` (300 s). The wait is the
        call's, so its deadline (``timeout_s``) cuts it off first: the call is then a
        :class:`~leasekit.LeaseBackendTimeout` and the pool, open, goes on filling.
        """
        await pool.open(wait=True, timeout=self.settings.timeout_s)

    def _ensure_schema(self) -> _ops.Operation[None]:
        settings = self.settings
        return _ops.ensure_schema(
            settings.statements,
            settings.table,
            create=settings.create_schema,
            synchronous_commit=settings.synchronous_commit,
        )

    async def listen_connection(self) -> psycopg.AsyncConnection[Any]:
        """A new autocommit connection to the provider's server, for ``LISTEN``."""
        if self.pool is not None:
            conninfo, settings = self.pool.conninfo, self.pool.kwargs
            if not isinstance(conninfo, str) or not isinstance(settings, dict):
                # A pool configured with callables: no way to open a connection like its
                # own from here. Waiters then go by the holder's remaining time.
                raise LeaseBackendError(
                    "cannot open a LISTEN connection for a pool configured with callables",
                    backend=BACKEND,
                )
            kwargs = dict(settings)
        else:
            assert self.conn is not None
            info = self.conn.info
            conninfo = make_conninfo(info.dsn, password=info.password or None)
            kwargs = {}
        kwargs["autocommit"] = True
        return await open_connection(conninfo, kwargs, where=self.where)

    async def close(self) -> None:
        """Close the client; a pool's workers still connecting are stopped too."""
        self.closing = True
        for task in list(self._group_tasks):
            task.cancel()  # the provider drained its calls: nobody waits for these
        if self.pool is None:
            assert self.conn is not None
            await self.conn.close()
            return
        pool = self.pool
        prefix = f"{pool.name}-"
        workers = [task for task in asyncio.all_tasks() if task.get_name().startswith(prefix)]
        token = ROUTE_POOL_LOG.set(True)
        try:
            await pool.close(timeout=_POOL_WORKERS_GRACE_S)
        finally:
            ROUTE_POOL_LOG.reset(token)
        # A worker still connecting to a server that does not answer would go on until
        # libpq's connect_timeout: stop it now, so nothing of the pool outlives aclose.
        late = [task for task in workers if not task.done()]
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=_POOL_WORKERS_GRACE_S)

    def route_pool_log(self) -> None:
        """In this task (and the pool's workers it starts), psycopg_pool logs at DEBUG."""
        if self.route_log:
            ROUTE_POOL_LOG.set(True)

    def _server(self) -> str:
        """``host:port/dbname`` of the server, for messages (never the password)."""
        if self.pool is not None:
            return server_of(self.pool.conninfo)
        assert self.conn is not None
        try:
            info = self.conn.info
            return f"{info.host}:{info.port}/{info.dbname}"
        except (psycopg.Error, ValueError):
            return ""


def _one(query: _ops.Query) -> _ops.Operation[Any]:
    """The operation that sends ``query`` and returns its reply."""
    reply = yield query
    return reply


def _consume_outcome(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # handed to the group's members already


# -- psycopg_pool's log ------------------------------------------------------------------

ROUTE_POOL_LOG: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "leasekit_postgres_route_pool_log", default=False
)
"""True in the tasks working for a pool the provider built, and in its pool's workers.

The pool's worker tasks are created while the provider opens the pool, so they inherit
the value, and everything psycopg_pool logs from them ("error connecting in ...",
six times in five seconds against a server that is down) is routed.
"""


class _RoutePoolLog(logging.Filter):
    """Moves psycopg's records about leasekit's own pools to ``leasekit.postgres``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not ROUTE_POOL_LOG.get():
            return True
        if log.isEnabledFor(logging.DEBUG):
            prefix = "psycopg_pool" if record.name == "psycopg.pool" else record.name
            log.debug("%s: %s", prefix, record.getMessage())
        return False


def _install_pool_log_route() -> None:
    # A logger's filters see only the records logged on it, not its children's: the
    # pool's ("psycopg.pool"), and psycopg's own about a cancel a frozen server ignores.
    for name in ("psycopg.pool", "psycopg"):
        driver_log = logging.getLogger(name)
        if not any(isinstance(f, _RoutePoolLog) for f in driver_log.filters):
            driver_log.addFilter(_RoutePoolLog())


_install_pool_log_route()
