"""The SQLite backend's blocking transport: one ``sqlite3`` connection, driven by ``drive``.

:class:`Connection` opens the file on first use and runs one operation at a time on
it: callers in several threads take turns (:meth:`Connection.run_in_turn`), the
async transport calls it from its one thread. It only executes: which statements, in
which transaction, and what their replies mean is ``_ops``'s.

Deadlines: a thread cannot be interrupted, so each operation is given its deadline
and SQLite's busy timeout is set to what is left of it, so no wait for another
connection's write lock outlasts it.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar
from urllib.parse import quote

from leasekit import LeaseProviderClosed
from leasekit.backend import drive

from . import _ops, _sql
from ._options import BACKEND, DatabaseLocked, DatabaseUnavailable, SQLiteSettings

__all__ = ["Connection"]

_T = TypeVar("_T")

# run_together's statements: one transaction, a savepoint per operation.
_GROUP_BEGIN = _ops.Query(_sql.BEGIN, reads="rowcount")
_GROUP_COMMIT = _ops.Query(_sql.COMMIT, reads="rowcount")
_SAVEPOINT = "SAVEPOINT leasekit_operation"
_RELEASE = "RELEASE leasekit_operation"
_ROLLBACK_TO = "ROLLBACK TO leasekit_operation"
_ROLLBACK_TO_QUERY = _ops.Query(_ROLLBACK_TO, reads="rowcount")


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class Connection:
    """One ``sqlite3`` connection to the settings' file, opened lazily; one caller at a time."""

    __slots__ = ("_busy_ms", "_conn", "_deadline", "_settings", "_shut", "_turn")

    def __init__(self, settings: SQLiteSettings) -> None:
        self._settings = settings
        self._conn: sqlite3.Connection | None = None
        self._busy_ms = 0  # the connection's busy_timeout, as last set
        self._deadline = 0.0  # of the operation running now
        self._shut = False
        self._turn = threading.Lock()  # for callers in several threads: run_in_turn

    def run_in_turn(self, operation: _ops.Op[_T], timeout_s: float) -> _T:
        """:meth:`run` once no other thread runs an operation here, all within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        if not self._turn.acquire(timeout=timeout_s):
            operation.close()
            raise DatabaseLocked(f"no turn on the connection within {timeout_s:g} s")
        try:
            return self.run(operation, deadline)
        finally:
            self._turn.release()

    def run(self, operation: _ops.Op[_T], deadline: float) -> _T:
        """Drive ``operation`` to its result, no wait past ``deadline`` (``time.monotonic``)."""
        try:
            self._ready(deadline)
        except BaseException:
            operation.close()
            raise
        return drive(operation, self._exchange)

    def run_together(
        self, operations: Sequence[_ops.Op[Any]], deadline: float
    ) -> list[tuple[bool, Any]]:
        """Drive write operations in one transaction: one write lock and one sync for all.

        Group commit: ``BEGIN IMMEDIATE``, then each operation in a savepoint of its own
        (its own ``BEGIN IMMEDIATE`` ... ``COMMIT`` becomes that savepoint, its
        ``ROLLBACK`` a rollback to it), then one ``COMMIT``. Each is decided on its own,
        in order, seeing what the ones before it wrote; one that raises is rolled back
        alone and gets its error, ``(False, exc)``, and the others their results,
        ``(True, value)``, once the ``COMMIT`` has succeeded. What fails the transaction
        itself (the write lock not had by ``deadline``, a failed ``COMMIT``, an I/O error
        that ends the transaction) concerns every operation in it, and is raised.
        """
        try:
            conn = self._ready(deadline)
        except BaseException:
            for operation in operations:
                operation.close()
            raise
        outcomes: list[tuple[bool, Any]] = []
        try:
            self._exchange(_GROUP_BEGIN)
            for operation in operations:
                conn.execute(_SAVEPOINT)
                try:
                    value = drive(operation, self._exchange_in_group)
                except Exception as exc:  # the caller's, handed back to it
                    if not conn.in_transaction:
                        raise  # the error ended the transaction: every write in it is gone
                    conn.execute(_ROLLBACK_TO)
                    conn.execute(_RELEASE)
                    outcomes.append((False, exc))
                else:
                    conn.execute(_RELEASE)
                    outcomes.append((True, value))
            self._exchange(_GROUP_COMMIT)
        except BaseException:
            for operation in operations[len(outcomes) :]:
                operation.close()
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute(_sql.ROLLBACK)
            raise
        return outcomes

    def _ready(self, deadline: float) -> sqlite3.Connection:
        """The open connection, its busy timeout within ``deadline``, no transaction open."""
        if self._shut:
            raise LeaseProviderClosed(backend=BACKEND)
        self._deadline = deadline
        conn = self._conn
        if conn is None:
            conn = self._conn = self._open()
        else:
            self._set_busy_timeout(conn)
            if conn.in_transaction:
                # Left open by a ROLLBACK that failed: the autocommit statements would
                # run inside it and never commit.
                conn.execute(_sql.ROLLBACK)
        return conn

    def close(self) -> None:
        """Close the connection for good: later operations raise ``LeaseProviderClosed``."""
        with self._turn:  # after the operation running in another thread, if any
            self._shut = True
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    def _exchange(self, query: _ops.Query) -> Any:
        conn = self._conn
        assert conn is not None
        try:
            cursor = conn.execute(query.statement, query.params)
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc):
                raise
            cursor = self._retry_busy(conn, query, exc)
        reads = query.reads
        if reads == "rowcount":
            return cursor.rowcount
        if reads == "one":
            return cursor.fetchone()
        return cursor.fetchall()

    def _exchange_in_group(self, query: _ops.Query) -> Any:
        # Inside run_together's transaction: an operation's own transaction is its savepoint.
        statement = query.statement
        if statement in (_sql.BEGIN, _sql.COMMIT):
            return 0
        if statement == _sql.ROLLBACK:
            self._exchange(_ROLLBACK_TO_QUERY)
            return 0
        return self._exchange(query)

    def _retry_busy(
        self, conn: sqlite3.Connection, query: _ops.Query, exc: sqlite3.OperationalError
    ) -> sqlite3.Cursor:
        # busy_timeout covers most waits inside SQLite, but a few paths (WAL recovery, a
        # checkpoint racing a write) return SQLITE_BUSY at once. A statement that ran
        # outside a transaction, or a COMMIT, changed nothing and can be sent again:
        # that is done here with jittered backoff until the deadline, never surfaced as
        # a raw "database is locked". Inside a transaction the operation rolls back.
        delay = 0.001
        while True:
            if conn.in_transaction and query.statement != _sql.COMMIT:
                raise DatabaseLocked(f"SQLite reported the file busy inside a transaction: {exc}")
            left = self._deadline - time.monotonic()
            if left <= delay:
                raise DatabaseLocked(
                    "another connection held the file's write lock until the deadline"
                ) from exc
            time.sleep(min(left, delay * random.uniform(0.5, 1.5)))
            delay = min(delay * 2, 0.05)
            try:
                return conn.execute(query.statement, query.params)
            except sqlite3.OperationalError as again:
                if not _is_busy(again):
                    raise
                exc = again

    def _set_busy_timeout(self, conn: sqlite3.Connection) -> None:
        # SQLite waits for another connection's write lock at most this long: never past
        # the caller's deadline, so the thread is free for the next call by then. The
        # PRAGMA is a statement of its own, so the setting is kept while it is at most
        # the time left and within 1% (or 5 ms) of it; it is set half that below the
        # time left, so the calls after it may each wait that much longer for the
        # thread (a loaded machine) and still need none.
        left_ms = int((self._deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            raise DatabaseLocked("the call's deadline passed while it waited for the thread")
        slack_ms = max(5, left_ms // 100)
        if left_ms - slack_ms <= self._busy_ms <= left_ms:
            return
        busy_ms = max(1, left_ms - slack_ms // 2)
        conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
        self._busy_ms = busy_ms

    def _open(self) -> sqlite3.Connection:
        """Open the file and make sure the schema exists."""
        settings = self._settings
        path = settings.path
        try:
            if settings.create:
                conn = sqlite3.connect(
                    path, timeout=0, isolation_level=None, check_same_thread=False
                )
            else:
                # mode=rw: SQLite itself refuses to create the file.
                conn = sqlite3.connect(
                    f"file:{quote(os.path.abspath(path))}?mode=rw",
                    uri=True,
                    timeout=0,
                    isolation_level=None,
                    check_same_thread=False,
                )
        except sqlite3.OperationalError as exc:
            raise self._unavailable(exc) from exc
        try:
            self._busy_ms = 0
            self._set_busy_timeout(conn)
            conn.execute(f"PRAGMA synchronous = {settings.synchronous}")  # checked by _options
            self._conn = conn
            drive(_ops.prepare(path, create=settings.create), self._exchange)
        except BaseException:
            self._conn = None
            conn.close()
            raise
        return conn

    def _unavailable(self, exc: sqlite3.OperationalError) -> sqlite3.OperationalError:
        """Say which part of the path is missing, when that is why the file did not open."""
        path = self._settings.path
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            return DatabaseUnavailable(f"directory {directory!r} does not exist")
        if not self._settings.create and not os.path.exists(path):
            return DatabaseUnavailable(
                f"no SQLite file at {os.path.abspath(path)!r} (create=false: "
                "a read never creates one)"
            )
        return exc
