"""The SQLite backend's asyncio transport: the blocking connection, in a thread of its own.

An operation is one call into that thread, which drives it to its end there (the
whole transaction, when it has one) without yielding to other tasks: tasks sharing a
provider never interleave inside a transaction. (aiosqlite would cost a hop per
statement and need a lock around every transaction.) Group commit: the writes handed
over while the thread is busy run together at its next turn, in one transaction and
one sync, each in a savepoint of its own (:meth:`Connection.run_together`); a write
that arrives alone runs alone.

Deadlines: a thread cannot be cancelled, so the caller never waits for it. The
provider awaits the future :meth:`ThreadedConnection.run` returns through
``BackendProvider._call``; at ``timeout_s`` the toolkit's timer cancels it (a call the
thread has not started is then dropped) and the caller gets
:class:`~leasekit.LeaseBackendTimeout` at once. A call already running in the thread
does not outlast the deadline of the latest caller it runs for: the connection's busy
timeout is set to what is left of it (:mod:`leasekit_sqlite._blocking`), so the thread
is free again by then for the calls handed over behind it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from . import _ops
from ._blocking import Connection
from ._options import SQLiteSettings

__all__ = ["ThreadedConnection"]

_T = TypeVar("_T")


class ThreadedConnection:
    """A :class:`~leasekit_sqlite._blocking.Connection` used from asyncio through one thread.

    Group commit: write operations that callers hand over while the thread is busy wait
    in :attr:`_pending`, and the thread's next turn runs all of them in one transaction
    (:meth:`Connection.run_together`: one write lock, one sync, each decided on its own
    in a savepoint). An operation that arrives alone runs alone, as before. Reads never
    wait for the write lock: they run on their own, in arrival order, before the group.
    """

    __slots__ = ("_connection", "_executor", "_lock", "_pending", "_timeout_s")

    def __init__(self, settings: SQLiteSettings) -> None:
        self._connection = Connection(settings)
        self._timeout_s = settings.timeout_s
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._pending: list[_Call] = []

    def run(self, operation: _ops.Op[_T], *, write: bool = False) -> asyncio.Future[_T]:
        """Drive ``operation`` in the connection's thread (started on first use).

        Returns the future of its result; cancelling it drops the call if the thread has
        not started it (a call it has started runs to its end, and its result is lost).
        """
        executor = self._executor
        if executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix="leasekit-sqlite"
                    )
                executor = self._executor
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        call = _Call(operation, time.monotonic() + self._timeout_s, future, loop, write)
        with self._lock:
            self._pending.append(call)
            first = len(self._pending) == 1
        if first:  # else the turn already asked for takes this call too
            executor.submit(self._turn)
        return future

    def _turn(self) -> None:
        """In the thread: every call handed over since the last turn."""
        with self._lock:
            calls, self._pending = self._pending, []
        writes: list[_Call] = []
        for call in calls:
            if call.future.cancelled():
                call.operation.close()  # its caller is gone: never started
            elif call.write:
                writes.append(call)
            else:
                call.settle(*_outcome(self._connection.run, call.operation, call.deadline))
        if len(writes) == 1:
            (call,) = writes
            call.settle(*_outcome(self._connection.run, call.operation, call.deadline))
        elif writes:
            deadline = max(call.deadline for call in writes)
            try:
                outcomes = self._connection.run_together(
                    [call.operation for call in writes], deadline
                )
            except BaseException as exc:  # noqa: BLE001  (the transaction's: every caller's)
                for call in writes:
                    call.settle(False, exc)
            else:
                for call, outcome in zip(writes, outcomes, strict=True):
                    call.settle(*outcome)

    async def close(self) -> None:
        """Close the connection in its thread, then let the thread end."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._connection.close)
        finally:
            executor.shutdown(wait=False)


def _outcome(function: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
    try:
        return True, function(*args)
    except BaseException as exc:  # noqa: BLE001  (handed to the caller's future)
        return False, exc


class _Call:
    """One operation handed to the thread, and where its caller waits for the outcome."""

    __slots__ = ("deadline", "future", "loop", "operation", "write")

    def __init__(
        self,
        operation: _ops.Op[Any],
        deadline: float,
        future: asyncio.Future[Any],
        loop: asyncio.AbstractEventLoop,
        write: bool,
    ) -> None:
        self.operation = operation
        self.deadline = deadline
        self.future = future
        self.loop = loop
        self.write = write

    def settle(self, ok: bool, value: Any) -> None:
        """Hand the outcome to the caller's loop (from the thread)."""
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self.loop.call_soon_threadsafe(_settle, self.future, ok, value)


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.cancelled():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
