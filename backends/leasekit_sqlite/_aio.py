"""The SQLite backend's asyncio transport: the blocking connection, in a thread of its own.

An operation is one call into that thread, which drives it to its end there (the
whole transaction, when it has one) without yielding to other tasks: tasks sharing a
provider never interleave inside a transaction, and each operation costs one thread
hop. (aiosqlite would cost a hop per statement and need a lock around every
transaction.)

Deadlines: a thread cannot be cancelled, so the caller never waits for it. The
provider awaits :meth:`ThreadedConnection.run` through ``BackendProvider._call``; at
``timeout_s`` the toolkit's timer cancels the executor's future (a call still queued
behind a blocked one is then dropped before it starts) and the caller gets
:class:`~leasekit.LeaseBackendTimeout` at once. A call already running in the thread
cannot outlast its caller's deadline either: the connection's busy timeout is set to
what is left of it (:mod:`leasekit_sqlite._blocking`), so the thread is free again by
then for the calls queued behind it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import TypeVar

from . import _ops
from ._blocking import Connection
from ._options import SQLiteSettings

__all__ = ["ThreadedConnection"]

_T = TypeVar("_T")


class ThreadedConnection:
    """A :class:`~leasekit_sqlite._blocking.Connection` used from asyncio through one thread."""

    __slots__ = ("_connection", "_executor", "_lock", "_timeout_s")

    def __init__(self, settings: SQLiteSettings) -> None:
        self._connection = Connection(settings)
        self._timeout_s = settings.timeout_s
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    async def run(self, operation: _ops.Op[_T]) -> _T:
        """Drive ``operation`` in the connection's thread (started on first use)."""
        executor = self._executor
        if executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix="leasekit-sqlite"
                    )
                executor = self._executor
        deadline = time.monotonic() + self._timeout_s
        return await asyncio.get_running_loop().run_in_executor(
            executor, self._connection.run, operation, deadline
        )

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
