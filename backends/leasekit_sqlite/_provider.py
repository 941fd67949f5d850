"""``SQLiteLeaseProvider``: leases in one SQLite file, shared by every process on a host.

Each provider owns one ``sqlite3`` connection and one thread. An operation is one
call into that thread which runs the whole transaction (``BEGIN IMMEDIATE``, the
deciding statement, ``COMMIT``) without yielding, so tasks sharing a provider never
interleave inside a transaction, and each operation costs one thread hop. (aiosqlite
would cost a hop per statement and need a lock around every transaction.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote

import leasekit
from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseProviderClosed,
    LeaseResult,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)

from . import _sql

__all__ = ["LeaseRecord", "SQLiteLeaseProvider"]

_T = TypeVar("_T")
_BACKEND = "sqlite"
_MIN_SQLITE = (3, 35, 0)  # UPSERT with RETURNING
_SYNCHRONOUS = ("off", "normal", "full", "extra")


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One live lease, as ``inspect`` reports it."""

    key: str
    owner: str
    token: int
    remaining_ms: int


class _Busy(Exception):
    """SQLite said the database is locked; retried until the operation times out."""


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class SQLiteLeaseProvider:
    """Leases in a SQLite file: atomic across the processes of one host.

    ``sqlite:///leasekit.db`` (relative) or ``sqlite:////abs/path.db``. Options (also
    as URL query parameters): ``timeout_s`` bounds every operation, waiting on the
    file lock included (default 5); ``synchronous`` is SQLite's durability setting
    (default ``full``, so fencing tokens survive power loss; ``normal`` is faster and
    still safe against process crashes); ``sweep_every`` and ``sweep_batch`` tune how
    expired rows are reclaimed.

    Expiry uses the host's wall clock (``server_clock=False``): all processes share it,
    but a clock step changes remaining lease times. Never put the file on a network
    filesystem: WAL needs shared memory between the processes.
    """

    capabilities = Capabilities(
        atomic_transfer=True,
        fencing=True,
        ttl_resolution_ms=1,
        min_ttl_ms=1,
        server_clock=False,
        shared_across_processes=True,
        shared_across_hosts=False,
        persistent=True,
    )

    def __init__(
        self,
        path: str | os.PathLike[str] = "leasekit.db",
        *,
        timeout_s: float = 5.0,
        synchronous: str = "full",
        sweep_every: int = 32,
        sweep_batch: int = 256,
    ) -> None:
        path = _check_path(path)
        if path == ":memory:" or path.startswith("file::memory:") or "mode=memory" in path:
            raise InvalidLeaseArgument.for_argument(
                "path",
                "an in-memory SQLite database is private to one connection and cannot "
                "coordinate anything; use memory:// for in-process leases, or a file path",
            )
        timeout_s = _check_timeout(timeout_s)
        if synchronous not in _SYNCHRONOUS:
            raise InvalidLeaseArgument.for_argument(
                "synchronous", f"must be one of {', '.join(_SYNCHRONOUS)}, got {synchronous!r}"
            )
        sweep_every = _check_count("sweep_every", sweep_every)
        sweep_batch = _check_count("sweep_batch", sweep_batch)
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise leasekit.BackendUnavailable(
                f"the SQLite backend needs SQLite >= 3.35 (UPSERT ... RETURNING); this "
                f"Python links SQLite {sqlite3.sqlite_version}",
                scheme="sqlite",
            )
        self.path = path
        self.timeout_s = timeout_s
        self._synchronous = synchronous
        self._sweep_every = sweep_every
        self._sweep_batch = sweep_batch
        self._writes = 0
        self._conn: sqlite3.Connection | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SQLiteLeaseProvider:
        """Build from ``sqlite:///relative.db``, ``sqlite:////abs.db`` or ``sqlite://``."""
        prefix = "sqlite://"
        if not url.lower().startswith(prefix):
            raise InvalidLeaseArgument.for_argument(
                "url", f"must start with sqlite://, got {url!r}"
            )
        rest, _, query = url[len(prefix) :].partition("?")
        if rest and not rest.startswith("/"):
            raise InvalidLeaseArgument.for_argument(
                "url",
                "must be sqlite:///relative/path.db or sqlite:////absolute/path.db "
                f"(no host part), got {url!r}",
            )
        path = unquote(rest[1:]) or "leasekit.db"
        merged: dict[str, Any] = {}
        for name, value in parse_qsl(query, keep_blank_values=True):
            merged[name] = _coerce_option(name, value)
        merged.update(options)
        unknown = sorted(set(merged) - {"timeout_s", "synchronous", "sweep_every", "sweep_batch"})
        if unknown:
            raise InvalidLeaseArgument.for_argument(
                "options",
                f"unknown sqlite option(s) {', '.join(unknown)}; known: timeout_s, "
                "synchronous, sweep_every, sweep_batch",
            )
        return cls(path, **merged)

    # -- the thread that owns the connection -----------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """Open the file and make sure the schema exists (runs in the provider thread)."""
        deadline = time.monotonic() + self.timeout_s
        conn = sqlite3.connect(
            self.path,
            timeout=self.timeout_s,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")

            def setup() -> None:
                # Both steps write only when needed, so opening a provider does not wait
                # for a writer that holds the lock on an already prepared file.
                if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    # WAL lets readers and the writer proceed together.
                    conn.execute("PRAGMA journal_mode = WAL")
                try:
                    conn.execute(_sql.SCHEMA_VERSION_QUERY).fetchone()
                except sqlite3.OperationalError as exc:
                    if "no such table" not in str(exc):
                        raise
                    self._transaction(conn, lambda: [conn.execute(s) for s in _sql.CREATE_SCHEMA])

            self._retry_busy(setup, deadline)
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _transaction(conn: sqlite3.Connection, body: Callable[[], _T]) -> _T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = body()
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    @staticmethod
    def _retry_busy(fn: Callable[[], _T], deadline: float) -> _T:
        # busy_timeout covers most waits inside SQLite, but a few paths (WAL recovery,
        # a checkpoint racing a write) return SQLITE_BUSY at once; those are retried
        # here with jittered backoff, never surfaced as a raw "database is locked".
        delay = 0.001
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:  # noqa: PERF203 (the retry loop is the point)
                if not _is_busy(exc):
                    raise
                if time.monotonic() + delay >= deadline:
                    raise _Busy(str(exc)) from exc
                time.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, 0.05)

    def _in_thread(self, work: Callable[[sqlite3.Connection], _T], deadline: float) -> _T:
        if self._closed:
            raise LeaseProviderClosed(backend=_BACKEND)
        if self._conn is None:
            self._conn = self._connect()
        conn = self._conn
        return self._retry_busy(lambda: work(conn), deadline)

    async def _run(
        self, work: Callable[[sqlite3.Connection], _T], key: str | None, *, write: bool
    ) -> _T:
        if self._closed:
            raise LeaseProviderClosed(backend=_BACKEND)
        with self._executor_lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="leasekit-sqlite"
                )
            executor = self._executor
        deadline = time.monotonic() + self.timeout_s
        if write:
            self._writes += 1
            if self._writes % self._sweep_every == 0:
                inner = work

                def work(conn: sqlite3.Connection) -> _T:
                    result = inner(conn)
                    self._sweep(conn)
                    return result

        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(executor, self._in_thread, work, deadline)
        try:
            return await asyncio.wait_for(future, self.timeout_s + 0.5)
        except LeaseProviderClosed:
            raise
        except (TimeoutError, asyncio.TimeoutError, _Busy) as exc:
            conn = self._conn
            if conn is not None:
                conn.interrupt()  # stop whatever still runs, so the next call is not stuck
            raise LeaseBackendError(
                f"operation timed out after {self.timeout_s:g} s (file {self.path!r} busy)",
                backend=_BACKEND,
                key=key,
            ) from exc
        except sqlite3.Error as exc:
            raise LeaseBackendError(
                f"{type(exc).__name__}: {exc} (file {self.path!r})", backend=_BACKEND, key=key
            ) from exc
        except OSError as exc:
            raise LeaseBackendError(
                f"cannot use {self.path!r}: {exc}", backend=_BACKEND, key=key
            ) from exc

    def _sweep(self, conn: sqlite3.Connection) -> int:
        """Delete one bounded batch of expired rows, raising the token floor over them."""

        def body() -> int:
            (cutoff,) = conn.execute(_sql.SWEEP_CUTOFF).fetchone()
            params = {"cutoff": cutoff, "batch": self._sweep_batch}
            conn.execute(_sql.SWEEP_RAISE_FLOOR, params)
            return conn.execute(_sql.SWEEP_DELETE, params).rowcount

        deleted = self._transaction(conn, body)
        if deleted >= self._sweep_batch:
            self._writes = -1  # a backlog: sweep again on the next write
        return deleted

    # -- the contract -------------------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        params = {"key": key.encode(), "owner": owner.encode(), "ttl_ms": ttl_ms}

        def work(conn: sqlite3.Connection) -> LeaseResult:
            def body() -> LeaseResult:
                row = conn.execute(_sql.ACQUIRE, params).fetchone()
                if row is not None:
                    return LeaseResult(True, owner, row[0])
                # Same transaction, so the holder seen here is the one that denied us.
                holder = conn.execute(_sql.OWNER, params).fetchone()
                return LeaseResult(False, None if holder is None else holder[0].decode(), None)

            return self._transaction(conn, body)

        return await self._run(work, key, write=True)

    async def get_lease_owner(self, key: str) -> str | None:
        validate_key(key)
        params = {"key": key.encode()}

        def work(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(_sql.OWNER, params).fetchone()
            return None if row is None else bytes(row[0]).decode()

        return await self._run(work, key, write=False)

    async def release_lease(self, key: str, owner: str) -> None:
        validate_key(key)
        validate_owner(owner)
        params = {"key": key.encode(), "owner": owner.encode()}
        await self._run(self._write(_sql.RELEASE, params), key, write=True)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        params = {"key": key.encode(), "owner": owner.encode(), "ttl_ms": ttl_ms}
        return await self._run(self._write(_sql.RENEW, params), key, write=True) == 1

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        params = {
            "key": key.encode(),
            "from_owner": from_owner.encode(),
            "to_owner": to_owner.encode(),
            "ttl_ms": ttl_ms,
        }
        return await self._run(self._write(_sql.TRANSFER, params), key, write=True) == 1

    def _write(self, statement: str, params: dict[str, Any]) -> Callable[[sqlite3.Connection], int]:
        def work(conn: sqlite3.Connection) -> int:
            return self._transaction(conn, lambda: conn.execute(statement, params).rowcount)

        return work

    # -- beyond the contract -------------------------------------------------------------

    async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases (key order), optionally only keys starting with ``prefix``."""
        if prefix is not None:
            validate_key(prefix, "prefix")
        limit = _check_count("limit", limit)
        params = {"prefix": None if prefix is None else prefix.encode(), "limit": limit}

        def work(conn: sqlite3.Connection) -> list[LeaseRecord]:
            rows = conn.execute(_sql.INSPECT, params).fetchall()
            return [LeaseRecord(bytes(k).decode(), bytes(o).decode(), t, r) for k, o, t, r in rows]

        return await self._run(work, prefix, write=False)

    async def sweep(self) -> int:
        """Reclaim one batch of expired rows now; returns how many were deleted."""
        return await self._run(self._sweep, None, write=False)

    async def row_count(self) -> int:
        """Rows in the table, live and expired: what the sweep keeps bounded."""
        return await self._run(
            lambda conn: int(conn.execute(_sql.COUNT_ROWS).fetchone()[0]), None, write=False
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the connection and stop the thread; later operations raise."""
        if self._closed:
            return
        self._closed = True
        with self._executor_lock:
            executor, self._executor = self._executor, None
        if executor is None:
            return
        conn, self._conn = self._conn, None

        def close() -> None:
            if conn is not None:
                conn.close()

        await asyncio.get_running_loop().run_in_executor(executor, close)
        executor.shutdown(wait=False)

    async def __aenter__(self) -> SQLiteLeaseProvider:
        # Open now, so a bad path or a locked file shows up at the `async with`.
        await self._run(lambda conn: None, None, write=False)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"SQLiteLeaseProvider({self.path!r}{', closed' if self._closed else ''})"


def _check_path(path: object) -> str:
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise InvalidLeaseArgument.for_argument(
            "path", f"must be a non-empty file path, got {path!r}"
        )
    return path


def _check_timeout(timeout_s: object) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
        raise InvalidLeaseArgument.for_argument("timeout_s", f"must be a number, got {timeout_s!r}")
    if not 0 < timeout_s <= 3600:
        raise InvalidLeaseArgument.for_argument(
            "timeout_s", f"must be in (0, 3600], got {timeout_s!r}"
        )
    return float(timeout_s)


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidLeaseArgument.for_argument(name, f"must be an int >= 1, got {value!r}")
    return value


def _coerce_option(name: str, value: str) -> Any:
    try:
        if name == "timeout_s":
            return float(value)
        if name in ("sweep_every", "sweep_batch"):
            return int(value)
    except ValueError:
        raise InvalidLeaseArgument.for_argument(name, f"must be a number, got {value!r}") from None
    return value
