"""The blocking transport: PyMySQL connections in a small thread-safe pool.

Only I/O: :meth:`BlockingTransport.run` checks a connection out, drives an ``_ops``
operation on it with :func:`~leasekit.backend.drive`, and gives it back (or drops it
after a client-side failure). The operations, their retries and the schema are
``_ops``'s, the same the asyncio transport runs.

Every operation is bounded by ``timeout_s`` as a whole, without a watchdog thread:
the wait for a free connection is bounded by what is left of it, a new connection's
``connect_timeout`` too, and before each statement the connection's read and write
timeouts (which PyMySQL applies to every read and write of the socket) are set to
what is left. A server that stops answering thus fails the statement with PyMySQL's
"lost connection (timed out)" error, which ``_options.ERRORS`` makes
:class:`~leasekit.LeaseBackendTimeout`; a statement waiting on a row lock gives up
on the server at ``innodb_lock_wait_timeout`` (``timeout_s``, rounded up).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, TypeVar

import pymysql  # type: ignore[import-untyped]  # (no stubs)

from leasekit import LeaseProviderClosed
from leasekit.backend import drive

from . import _ops
from ._ops import Op, Request
from ._options import BACKEND, LOST, MySQLSettings, error_code

__all__ = ["BlockingTransport"]

_T = TypeVar("_T")
_MIN_TIMEOUT_S = 0.001  # PyMySQL refuses a timeout of 0; this fails at once instead


class BlockingTransport:
    """Up to ``pool_max_size`` PyMySQL connections (autocommit), shared by threads."""

    __slots__ = ("_closed", "_cond", "_dropped", "_idle", "_kwargs", "_max", "_size", "timeout_s")

    def __init__(self, settings: MySQLSettings) -> None:
        assert settings.connect is not None
        self.timeout_s = settings.timeout_s
        self._kwargs = {**settings.connect, "autocommit": True}
        del self._kwargs["connect_timeout"]  # what is left of each operation's timeout_s
        self._max = settings.pool_max_size
        self._idle: list[Any] = []  # pymysql.Connection, most recently used last
        self._size = 0  # connections checked out or idle
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        # Server ids of sessions cut off mid-statement, not yet known to have ended:
        # the next operation ends them first (``_ops.fence``).
        self._dropped: set[int] = set()

    def run(self, operation: Op[_T], deadline: float | None = None) -> _T:
        """Drive ``operation`` on one pooled connection by ``deadline`` (or in ``timeout_s``)."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout_s
        session = _Session(self, self._checkout(deadline), deadline)
        try:
            if self._dropped:
                with self._cond:
                    fenced = tuple(self._dropped)
                drive(_ops.fence(fenced), session.exchange)
                with self._cond:
                    self._dropped.difference_update(fenced)
            return drive(operation, session.exchange)
        finally:
            self._checkin(session.conn, healthy=session.healthy, cut=session.cut)

    def _checkout(self, deadline: float) -> Any:
        with self._cond:
            while True:
                if self._closed:
                    raise LeaseProviderClosed(backend=BACKEND)
                if self._idle:
                    return self._idle.pop()
                if self._size < self._max:
                    self._size += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    msg = f"no connection of {self._max} came free within {self.timeout_s:g} s"
                    raise TimeoutError(msg)
                self._cond.wait(left)
        try:
            return self._connect(deadline)
        except BaseException:
            self._forget(1)
            raise

    def _connect(self, deadline: float) -> Any:
        left = max(deadline - time.monotonic(), _MIN_TIMEOUT_S)
        return pymysql.connect(
            **self._kwargs, connect_timeout=left, read_timeout=left, write_timeout=left
        )

    def _forget(self, count: int) -> None:
        with self._cond:
            self._size -= count
            self._cond.notify(count)

    def _replace(self, conn: Any, deadline: float) -> Any:
        """A fresh connection for a lost ``conn`` (its place kept; the caller's if this
        raises); the idle ones are likely dead too."""
        with self._cond:
            stale, self._idle = self._idle, []
            self._size -= len(stale)
        for dead in [conn, *stale]:
            _close(dead)
        return self._connect(deadline)

    def _checkin(self, conn: Any, *, healthy: bool, cut: bool = False) -> None:
        """Give ``conn`` back, or close it if broken.

        ``cut``: its statement timed out on the client, and may still run on the
        server: the next operation ends its session first (``_ops.fence``).
        """
        if healthy and not self._closed:
            with self._cond:
                if not self._closed:
                    self._idle.append(conn)
                    self._cond.notify()
                    return
        if cut:
            with self._cond, contextlib.suppress(AttributeError, TypeError):
                self._dropped.add(int(conn.thread_id()))
        _close(conn)
        self._forget(1)

    def close(self) -> None:
        """Close the idle connections; those in use close when given back."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._size -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            _close(conn)


def _close(conn: Any) -> None:
    """Close ``conn`` (a QUIT if its socket is still open); never raises."""
    with contextlib.suppress(Exception):
        conn.close()


class _Session:
    """One operation's connection and deadline, and whether the connection is still sound."""

    __slots__ = ("conn", "cut", "deadline", "healthy", "transport")

    def __init__(self, transport: BlockingTransport, conn: Any, deadline: float) -> None:
        self.transport = transport
        self.conn = conn
        self.deadline = deadline
        self.healthy = True
        self.cut = False  # a statement's answer timed out on the client

    def exchange(self, request: Request) -> Any:
        sql, params, reads = request
        if not self.healthy:  # the last statement lost the connection
            self.conn = self.transport._replace(self.conn, self.deadline)
            self.healthy = True
        conn = self.conn
        left = self.deadline - time.monotonic()
        if left <= 0:
            msg = f"no answer within {self.transport.timeout_s:g} s"
            raise TimeoutError(msg)
        # What PyMySQL sets the socket's timeout to before each read and each write.
        conn._read_timeout = conn._write_timeout = left
        self.healthy = False  # until the server answers
        try:
            with conn.cursor() as cursor:
                count = cursor.execute(sql, params)
                if reads == "lastrowid":
                    reply = cursor.lastrowid
                elif reads == "row":
                    reply = cursor.fetchone()
                elif reads == "rows":
                    reply = cursor.fetchall()
                else:
                    reply = count
        except pymysql.MySQLError as exc:
            code = error_code(exc)
            self.healthy = code is not None and code < 2000 and code not in LOST
            if isinstance(exc.__context__, TimeoutError):
                self.cut = True  # PyMySQL's read timed out: the statement may still run
            elif code in LOST:
                # The server may have restarted: its session ids start again, and one
                # remembered to be ended may now be another session's.
                with self.transport._cond:
                    self.transport._dropped.clear()
            raise
        self.healthy = True
        return reply
