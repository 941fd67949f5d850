"""The asyncio transport: asyncmy's pool, in arrival order, running one operation at a time.

Only I/O: :func:`run` checks a connection out (behind a
:class:`~leasekit.backend.FifoGate`), drives an ``_ops`` operation on it with
:func:`~leasekit.backend.drive_async`, and gives the connection back (or drops it, if
a statement failed on the client's side: lost, cancelled). After a lost connection
the operation's next statement goes to a fresh one. A connection dropped because its
caller stopped waiting (cancelled, or its deadline passed) leaves its statement running
on the server: the next operation first ends that session there (``_ops.fence``), so
nothing sent later can be overtaken by it. Deadlines and error mapping are the
provider's (``BackendProvider._call``).

Acquires, releases and renewals run as a ``kind`` of :func:`run`: alone when nothing of
their kind is in flight, else together with the others waiting, in one statement
(``_group``, :mod:`leasekit.backend._group`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from typing import Any, TypeVar

import asyncmy
from asyncmy import errors as driver_errors
from asyncmy.connection import Connection
from asyncmy.cursors import Cursor
from asyncmy.pool import Pool

from leasekit import InvalidLeaseArgument, LeaseProviderClosed
from leasekit.backend import (
    FifoGate,
    Group,
    drive_async,
    join_group,
    resume,
    resume_with,
    send_waiting,
)

from . import _ops
from ._group import GroupStatements, send_acquires, send_releases, send_renewals
from ._ops import Op, Request, Statements
from ._options import BACKEND, LOST, MySQLSettings, error_code

__all__ = ["AioTransport", "pool_options", "run"]

_T = TypeVar("_T")

# Every statement must be its own transaction. With autocommit off (asyncmy's default)
# nothing commits a grant, and the pool rolls it back when it drops a connection given
# back inside a transaction: another owner is then granted the same key. Checked on
# each checkout (a caller may switch a pooled connection), before any statement.
_NOT_AUTOCOMMIT = (
    "must hand out autocommit connections (asyncmy.create_pool(..., autocommit=True)): "
    "each leasekit statement commits on its own, and a grant left in an open "
    "transaction is rolled back when the pool drops the connection"
)


def pool_options(settings: MySQLSettings) -> dict[str, Any]:
    """asyncmy's ``create_pool`` arguments for the server in ``settings`` (autocommit)."""
    assert settings.connect is not None
    return {
        **settings.connect,
        "autocommit": True,
        "minsize": settings.pool_min_size,
        "maxsize": settings.pool_max_size,
    }


class AioTransport:
    """asyncmy's pool (the caller's, or one built at first use from ``options``)."""

    __slots__ = (
        "_gate",
        "_group_sql",
        "_group_tasks",
        "_lock",
        "_options",
        "_statements",
        "acquires",
        "callers_pool",
        "dropped",
        "pool",
        "releases",
        "renewals",
    )

    def __init__(
        self, pool: Pool | None, options: Mapping[str, Any] | None, statements: Statements
    ) -> None:
        self.pool = pool
        # Only a caller's pool can hand out a connection with autocommit off (its own
        # default, or switched by the caller); the transport's own is built with it on.
        self.callers_pool = pool is not None
        self._options = dict(options or {})
        # asyncmy hands a freed connection to whoever asks next, and a task that checks
        # one in and at once out again asks before any waiter wakes: waiters starve for
        # all of timeout_s. Only a holder of the gate (the pool's size) asks the pool.
        self._gate: FifoGate | None = None if pool is None else FifoGate(pool.maxsize)
        self._lock = asyncio.Lock()
        # Server ids of sessions cut off mid-statement, not yet known to have ended.
        self.dropped: set[int] = set()
        # Calls that arrive while one of their kind is in flight go out together (_group).
        self._statements = statements
        self._group_sql: GroupStatements | None = None
        self._group_tasks: set[asyncio.Task[Any]] = set()
        self.acquires: Group[Request] = Group(send_acquires)
        self.releases: Group[Request] = Group(send_releases)
        self.renewals: Group[Request] = Group(send_renewals)

    def run(self, operation: Op[_T]) -> Coroutine[Any, Any, _T]:
        """Drive ``operation`` on one pooled connection (a fresh one after a lost one)."""
        return run(self._itself, _nothing, operation)

    def _itself(self) -> AioTransport:
        return self

    # -- groups (leasekit.backend.GroupTransport) ---------------------------------------

    def group_statements(self) -> GroupStatements:
        """The grouped statements of the table (rendered per group size, kept)."""
        statements = self._statements()
        grouped = self._group_sql
        if grouped is None or grouped.sql is not statements:
            grouped = self._group_sql = GroupStatements(statements)
        return grouped

    def run_alone(self, operation: Generator[Any, Any, _T], extra: Any) -> Coroutine[Any, Any, _T]:
        """Run ``operation`` on a connection of its own (a group's member going on alone)."""
        return run(self._itself, _nothing, operation)

    def recover(
        self,
        error: BaseException,
        alone: bool,
        request: Any,
        operation: Generator[Any, Any, _T],
        extra: Any,
    ) -> Coroutine[Any, Any, _T]:
        """A member's answer after its statement failed with ``error``.

        A group's statement that failed on the server (a lock wait, a deadlock) was
        rolled back whole: the member runs its own statement alone. Anything else (its
        own statement's error, a lost connection) is thrown into its operation, which
        retries or raises as if it had run alone all along.
        """
        if not alone and isinstance(error, driver_errors.MySQLError):
            code = error_code(error)
            if code is not None and code < 2000 and code not in LOST:
                return run(self._itself, _nothing, resume(request, operation))
        return run(self._itself, _nothing, resume_with(error, operation))

    def start(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a group's statement in a task of its own (:meth:`close` stops it)."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._group_tasks.add(task)
        task.add_done_callback(self._group_tasks.discard)
        task.add_done_callback(_consume_outcome)
        return task

    def exchange_one(self, request: Request) -> Coroutine[Any, Any, Any]:
        """One member's own statement, alone, on a connection of its own: its reply."""
        return run(self._itself, _nothing, _one(request))

    async def exchange_group(self, sql: str, params: Mapping[str, Any]) -> list[Any]:
        """A group's multi-statement request: the rows of its last result with columns.

        Whatever goes wrong, the connection is closed, not given back: a statement that
        failed midway leaves the transaction open.
        """
        conn = await self._checkout()
        if self.callers_pool and not conn.get_autocommit():
            self._checkin(conn, healthy=True)
            _check_autocommit(conn)
        healthy = cut = False
        try:
            cursor = conn.cursor()
            await cursor.execute(sql, params)
            rows: list[Any] = []
            while True:
                if cursor.description is not None:
                    rows = list(await cursor.fetchall())
                if not await cursor.nextset():
                    break
            healthy = True
            return rows
        except driver_errors.MySQLError as exc:
            if error_code(exc) in LOST:
                self.dropped.clear()  # the server may have restarted (see _Session)
            raise
        except BaseException:
            cut = True  # cancelled: the request may still run on the server
            raise
        finally:
            self._checkin(conn, healthy=healthy, cut=cut)

    async def _checkout(self) -> Connection:
        """A connection, for callers in arrival order (within the operation's deadline)."""
        pool, gate = self.pool, self._gate
        if pool is None or gate is None:
            pool, gate = await self._open_pool()
        if not gate.try_acquire():
            await gate.acquire()
        try:
            return await pool.acquire()
        except RuntimeError:  # "Cannot acquire connection after closing pool"
            gate.release()
            raise LeaseProviderClosed(backend=BACKEND) from None
        except BaseException:
            gate.release()
            raise

    async def _open_pool(self) -> tuple[Pool, FifoGate]:
        async with self._lock:
            if self.pool is None:
                self.pool = await asyncmy.create_pool(**self._options)
            if self._gate is None:
                self._gate = FifoGate(self.pool.maxsize)
            return self.pool, self._gate

    async def _fresh(self) -> Connection:
        """A connection in place of a lost one (given back), keeping its place at the gate."""
        pool = self.pool
        assert pool is not None
        await pool.clear()  # its idle siblings are likely dead too
        try:
            return await pool.acquire()
        except RuntimeError:
            raise LeaseProviderClosed(backend=BACKEND) from None

    def _checkin(
        self,
        conn: Connection | None,
        *,
        healthy: bool,
        keep_place: bool = False,
        cut: bool = False,
    ) -> None:
        """Give ``conn`` back, or drop it if broken; then its place, to the next waiter.

        ``cut``: dropped because its caller stopped waiting for a statement, which may
        still run on the server: the next operation ends its session first.
        """
        try:
            if conn is not None and not healthy:
                if cut:
                    self.dropped.add(_session_id(conn))
                    self.dropped.discard(0)
                conn.close()  # mid-statement (cancelled, lost): its protocol state is unknown
            if conn is not None and self.pool is not None:
                self.pool.release(conn)  # a closed connection leaves the pool here
        finally:
            if self._gate is not None and not keep_place:
                self._gate.release()

    async def close(self) -> None:
        """Close the pool; drop its sockets if the server does not answer."""
        for task in list(self._group_tasks):
            task.cancel()  # the provider drained its calls: nobody waits for these
        if self.pool is not None:
            self.pool.close()
            try:
                await self.pool.wait_closed()
            except BaseException:
                self.pool.terminate()
                raise


async def run(
    transport: Callable[[], AioTransport | None],
    ready: Callable[[], Awaitable[object]],
    operation: Op[_T],
    kind: str | None = None,
    key: str = "",
) -> _T:
    """Drive ``operation`` on a connection of ``transport()``, after ``await ready()`` if None.

    Both are asked only when the call starts: a provider rebuilt in between (a new loop,
    a fork) answers with its new transport, and makes its new schema ready first. The
    connection is checked out at the first statement and given back when the operation
    ends, however it ends. Sessions cut off before are ended on the server first
    (``_ops.fence``).

    ``kind``: a call that groups (the transport's ``acquires``, ``releases`` or
    ``renewals``) on ``key``; it runs alone, as any other, if nothing of its kind is in
    flight on ``key`` or waits, else in the next group. One coroutine for both: every
    acquire, release and renewal passes here, and a frame more costs each of them.
    """
    current = transport()
    if current is None:
        await ready()
        current = transport()
        assert current is not None
    group: Group[Request] | None = None
    if kind is not None:
        group = getattr(current, kind)
        busy = group.busy
        # Group.free and enter, inline (every acquire, release and renewal passes here).
        if group.in_flight >= group.limit or group.waiting or key in busy:
            return await join_group(current, group, key, operation)
        group.in_flight += 1
        busy.add(key)
    session = _Session(current)
    try:
        if current.dropped:
            fenced = tuple(current.dropped)
            await drive_async(_ops.fence(fenced), session.exchange)
            current.dropped.difference_update(fenced)
        return await drive_async(operation, session.exchange)
    finally:
        if session.placed:
            current._checkin(session.conn, healthy=session.healthy, cut=session.cut)
        if group is not None:  # Group.leave, inline
            group.in_flight -= 1
            group.busy.discard(key)
            if group.waiting:
                send_waiting(current, group)


class _Session:
    """One operation's connection and cursor, and whether the connection is still sound."""

    __slots__ = ("conn", "cursor", "cut", "healthy", "placed", "transport")

    def __init__(self, transport: AioTransport) -> None:
        self.transport = transport
        self.conn: Connection | None = None
        self.cursor: Cursor | None = None
        self.healthy = True
        self.cut = False  # its caller stopped waiting for a statement's answer
        self.placed = False  # holds a place at the gate

    async def _reconnect(self) -> Cursor:
        """A cursor on a fresh connection in place of a lost one."""
        lost, self.conn, transport = self.conn, None, self.transport
        transport._checkin(lost, healthy=False, keep_place=True)
        self.conn = await transport._fresh()
        self.healthy = True
        _check_autocommit(self.conn)
        self.cursor = self.conn.cursor()
        return self.cursor

    async def exchange(self, request: Request) -> Any:
        sql, params, reads = request
        cursor = self.cursor
        if cursor is None:  # the operation's first statement
            transport = self.transport
            conn = self.conn = await transport._checkout()
            self.placed = True
            if transport.callers_pool and not conn.get_autocommit():
                _check_autocommit(conn)
            cursor = self.cursor = conn.cursor()
        elif not self.healthy:
            cursor = await self._reconnect()
        self.healthy = False  # until the server answers: cancelled, the state is unknown
        try:
            count = await cursor.execute(sql, params)
        except driver_errors.MySQLError as exc:
            code = error_code(exc)
            self.healthy = code is not None and code < 2000 and code not in LOST
            if code in LOST:
                # The server may have restarted: its session ids start again, and one
                # remembered to be ended may now be another session's.
                self.transport.dropped.clear()
            raise
        except BaseException:
            self.cut = True  # cancelled: the statement may still run on the server
            raise
        self.healthy = True
        if reads == "lastrowid":
            return cursor.lastrowid
        if reads == "row":
            return await cursor.fetchone()
        if reads == "rows":
            return await cursor.fetchall()
        if reads == "call":  # a procedure's row, then its status: read to the end
            row = await cursor.fetchone()
            self.healthy = False  # until the status is read
            while await cursor.nextset():
                pass
            self.healthy = True
            return row
        return count


def _check_autocommit(conn: Connection) -> None:
    """Refuse a connection with autocommit off (the server's status bit: no round trip)."""
    if not conn.get_autocommit():
        raise InvalidLeaseArgument.for_argument("client", _NOT_AUTOCOMMIT)


async def _nothing() -> None:
    return None


def _session_id(conn: Connection) -> int:
    """The server's id of ``conn``'s session (from its handshake; 0: none yet)."""
    try:
        return int(conn.thread_id())
    except (AttributeError, TypeError):  # the handshake never completed
        return 0


def _one(request: Request) -> Op[Any]:
    """The operation that sends ``request`` and returns its reply."""
    reply = yield request
    return reply


def _consume_outcome(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # handed to the group's members already
