"""The blocking transport: psycopg's ``Connection`` and ``ConnectionPool``.

Only I/O, as ``_aio`` is on asyncio: :func:`exchange` sends one
:class:`~leasekit_postgres._ops.Query` and reads its reply; :func:`run` drives an
operation of ``_ops`` with it (:func:`~leasekit.backend.drive`); :class:`BlockingTransport`
is a provider's pool.

Bounds: the wait for a pooled connection is the pool's ``timeout`` (``timeout_s``);
a statement is cancelled by the server at ``statement_timeout`` (``timeout_s``, in the
connections' startup options); and a server that answers nothing at all (stopped,
or a dead link) is cut off at ``timeout_s`` by :class:`leasekit.backend.SyncDeadlines`,
which shuts the connection's socket down (:func:`_break`). All three are
:class:`~leasekit.LeaseBackendTimeout`.

A call cut off that way may still run later: its statement sits in the (frozen)
server process's socket. The transport notes that process per key, and the next call
on the key ends it first (``pg_terminate_backend``), so one provider's calls on a key
reach the server in the order they were made, as the async provider's do.
"""

from __future__ import annotations

import itertools
import socket
import threading
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from leasekit import LeaseBackendTimeout
from leasekit.backend import SyncDeadlines, drive

from . import _ops, _options
from ._commit import CommitWatch
from ._options import BACKEND, CONNECT_ERRORS, PoolSettings, Settings

__all__ = ["BlockingTransport", "exchange", "own_pool", "run"]

_T = TypeVar("_T")

_pool_numbers = itertools.count(1)


def exchange(conn: psycopg.Connection[Any], query: _ops.Query) -> Any:
    """Send ``query`` on ``conn``; its reply as the query reads it."""
    try:
        cursor = conn.execute(query.statement, query.params, prepare=query.prepare)
        if query.reads == "rowcount":
            return cursor.rowcount
        if query.reads == "rows":
            return cursor.fetchall()
        return cursor.fetchone()
    except psycopg.OperationalError as exc:
        if _ops.lost(conn):
            raise _ops.ConnectionLost(str(exc)) from exc
        if _ops.needs_rollback(conn):
            conn.rollback()
        raise
    except psycopg.Error:
        if _ops.needs_rollback(conn):
            conn.rollback()
        raise


def run(conn: psycopg.Connection[Any], operation: _ops.Operation[_T]) -> _T:
    """Drive ``operation`` on ``conn``."""
    return drive(operation, partial(exchange, conn), throws=psycopg.Error)


def own_pool(settings: PoolSettings) -> ConnectionPool[Any]:
    """The pool ``from_url`` builds (not opened: the first call opens it)."""
    name = f"leasekit-blocking-{next(_pool_numbers)}"
    return ConnectionPool(settings.conninfo, **settings.pool_arguments(name))


def _break(conn: psycopg.Connection[Any]) -> None:
    """Shut ``conn``'s socket down (from the watchdog): its blocked read fails at once."""
    fd = conn.pgconn.socket
    with socket.socket(fileno=socket.dup(fd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


class BlockingTransport:
    """A provider's blocking pool, and how one operation runs on it within ``timeout_s``."""

    def __init__(self, pool: ConnectionPool[Any], settings: Settings) -> None:
        _options.check_client(pool, ConnectionPool, None, expected="a psycopg_pool.ConnectionPool")
        self.pool = pool
        self.settings = settings
        self.ready = False
        self._ready_lock = threading.Lock()
        self.deadlines = SyncDeadlines(settings.timeout_s)
        # key -> the server process of a call abandoned at its deadline on that key. Its
        # statement may still sit in that (frozen) process's socket and run when it
        # wakes, after the caller went on: the next call on the key ends it first.
        self._abandoned: dict[str, int] = {}
        self.server = _options.server_of(pool.conninfo)
        self.where = _options.where(self.server, settings.table)
        # With synchronous_commit: each connection's watch for unacknowledged commits.
        self.watches: weakref.WeakKeyDictionary[Any, CommitWatch] | None = (
            None if settings.synchronous_commit is None else weakref.WeakKeyDictionary()
        )

    def run(
        self,
        operation: _ops.Operation[_T],
        again: Callable[..., _ops.Operation[_T]] | None = None,
        args: tuple[Any, ...] = (),
        key: str | None = None,
        check_schema: bool = True,
    ) -> _T:
        """Run ``operation``; if its connection died, ``again(*args)`` on a fresh one.

        As :meth:`AsyncTransport.run <leasekit_postgres._aio.AsyncTransport.run>`:
        ``again`` is ``None`` for an operation that may not run twice.
        """
        if not self.ready:
            self.ensure_ready(check_schema=check_schema)
        if self._abandoned and key is not None and key in self._abandoned:
            self._end_abandoned(key)
        try:
            return self._attempt(key, operation)
        except _ops.RETRIED as exc:
            return self._attempt(key, _ops.retry_of(exc, operation, again, args))

    def _attempt(self, key: str | None, step: _ops.Operation[_T] | _ops.Retry) -> _T:
        """One of :func:`~leasekit_postgres._ops.attempts`: ``step`` on a pooled connection."""
        if isinstance(step, _ops.Retry):
            self.pool.check()
            step = step.operation
        with self.pool.connection() as conn:
            watch = None if self.watches is None else CommitWatch.on(self.watches, conn)
            try:
                result = self._bounded(conn, step, key)
            except psycopg.errors.ReadOnlySqlTransaction:
                conn.close()  # on a standby: the pool discards it
                raise
            if watch is not None:
                watch.check(self.where, key)
            return result

    def _end_abandoned(self, key: str) -> None:
        """End the server process that may still run a call abandoned on ``key``, or raise.

        A release abandoned at its deadline against a frozen server process would
        otherwise run when it wakes, after the same owner's next acquire, and end that
        newer lease. The process is terminated and waited for
        (``pg_terminate_backend(pid, timeout)``, PostgreSQL 14+); if it is still there
        at this call's deadline, this call is not sent and raises
        :class:`~leasekit.LeaseBackendTimeout`, and the next call tries again.
        """
        pid = self._abandoned[key]
        timeout_s = self.settings.timeout_s
        wait_ms = max(1, int(timeout_s * 1000 * 0.8))
        with self.pool.connection() as conn:
            # Not timed as a call on key: that would note this connection as abandoned.
            ended = self._bounded(conn, _ops.end_process(pid, wait_ms), None)
        if not ended:
            raise LeaseBackendTimeout(
                f"a call abandoned on this key is still in server process {pid}, which did "
                f"not end within {timeout_s:g} s{self.where}",
                backend=BACKEND,
                key=key,
            )
        if self._abandoned.get(key) == pid:
            del self._abandoned[key]

    def _bounded(
        self, conn: psycopg.Connection[Any], operation: _ops.Operation[_T], key: str | None
    ) -> _T:
        def expire() -> None:
            # Noted before the break (a broken connection forgets its server process).
            if key is not None:
                self._abandoned[key] = conn.pgconn.backend_pid
            _break(conn)

        deadlines = self.deadlines
        watch = deadlines.open(expire)
        try:
            return run(conn, operation)
        except psycopg.Error as exc:
            if deadlines.close(watch):
                raise LeaseBackendTimeout(
                    f"no answer within {self.settings.timeout_s:g} s{self.where}",
                    backend=BACKEND,
                    key=key,
                ) from exc
            raise
        finally:
            deadlines.close(watch)

    def ensure_ready(self, *, check_schema: bool = True) -> None:
        """Open the pool (first connection made directly) and check or create the schema
        (not for ``migrate``, ``check_schema=False``, which creates it)."""
        with self._ready_lock:
            if self.ready:
                return
            pool = self.pool
            if pool.closed:
                conninfo, kwargs = pool.conninfo, pool.kwargs
                if isinstance(conninfo, str) and isinstance(kwargs, dict):
                    # A refusal, a wrong password or an unknown host: raised now, not
                    # retried by the pool's workers until the timeout.
                    with CONNECT_ERRORS.mapping(where=self.where):
                        first = psycopg.Connection.connect(conninfo, **kwargs)
                    try:
                        if check_schema:
                            self._bounded(first, self._ensure_schema(), None)
                            self.ready = True
                    finally:
                        first.close()
                pool.open(wait=False)
                if self.ready:
                    return
            if not check_schema:
                return
            with pool.connection() as conn:
                self._bounded(conn, self._ensure_schema(), None)
            self.ready = True

    def _ensure_schema(self) -> _ops.Operation[None]:
        settings = self.settings
        return _ops.ensure_schema(
            settings.statements,
            settings.table,
            create=settings.create_schema,
            synchronous_commit=settings.synchronous_commit,
        )

    def close(self) -> None:
        """Stop the watchdog and close the pool (which the provider built)."""
        self.deadlines.stop()
        self.pool.close(timeout=0.1)
