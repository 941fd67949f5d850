"""``SQLiteLeaseProvider``: leases in one SQLite file, shared by every process on a host.

Each provider owns one ``sqlite3`` connection and one thread. An operation is one
call into that thread which runs the whole transaction (``BEGIN IMMEDIATE``, the
deciding statement, ``COMMIT``) without yielding, so tasks sharing a provider never
interleave inside a transaction, and each operation costs one thread hop. (aiosqlite
would cost a hop per statement and need a lock around every transaction.)

Deadlines: a thread cannot be cancelled, so the caller never waits for it. Each call
awaits the executor's future through :meth:`BackendProvider._call`; at ``timeout_s``
the toolkit's timer cancels that future (a call still queued behind a blocked one is
then dropped before it starts) and the caller gets :class:`~leasekit.LeaseBackendTimeout`
at once. A call already running in the thread cannot outlast its caller's deadline
either: SQLite's busy timeout is set to what is left of it before every transaction,
so the thread is free again by then for the calls queued behind it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar
from urllib.parse import quote, unquote

from leasekit import (
    BackendUnavailable,
    Capabilities,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
    LeaseProviderClosed,
    LeaseResult,
    validate_key,
)
from leasekit.backend import (
    BackendProvider,
    ErrorMap,
    LeaseRecord,
    Option,
    OptionSet,
    Rebuild,
    RenewItem,
    check_renew_items,
    parse_url,
    timeout_option,
)

from . import _sql, _work

__all__ = ["SQLiteLeaseProvider", "SQLiteURLSettings", "url_settings"]

if TYPE_CHECKING:
    from ._sync import SQLiteSyncLeaseProvider

_T = TypeVar("_T")
_BACKEND = "sqlite"
_MIN_SQLITE = (3, 35, 0)  # UPSERT with RETURNING
_SYNCHRONOUS = ("off", "normal", "full", "extra")
_DEFAULT_PATH = "leasekit.db"


class DatabaseLocked(sqlite3.OperationalError):
    """Another connection held the file's write lock until this call's deadline."""


class DatabaseUnavailable(sqlite3.OperationalError):
    """The file cannot be opened: its directory is missing, or it is and ``create=false``."""


def _synchronous(value: str) -> str:
    level = value.strip().lower()
    if level not in _SYNCHRONOUS:
        raise InvalidLeaseArgument.for_argument(
            "synchronous", f"must be one of {', '.join(_SYNCHRONOUS)}, got {value!r}", value
        )
    return level


_OPTIONS = OptionSet(
    _BACKEND,
    (
        timeout_option(5.0),
        Option("synchronous", str, "full", check=_synchronous),
        Option("sweep_every", int, 32, minimum=1),
        Option("sweep_batch", int, 256, minimum=1),
        Option("create", bool, True),
    ),
)


@dataclass(frozen=True, slots=True)
class SQLiteURLSettings:
    """A ``sqlite://`` URL and ``from_url``'s keyword options, parsed and checked.

    ``path`` is the database file; ``options`` every option's value, defaults filled
    in (``timeout_s``, ``synchronous``, ...). The benchmark's floor
    (``leasekit_sqlite._bench``) opens its file with the same settings.
    """

    path: str
    options: dict[str, Any]


def url_settings(url: str, **options: Any) -> SQLiteURLSettings:
    """Parse ``url`` and ``options`` as :meth:`SQLiteLeaseProvider.from_url` does; no I/O."""
    parsed = parse_url(url, schemes=("sqlite",))
    if parsed.endpoints or parsed.username is not None:
        raise InvalidLeaseArgument.for_argument(
            "url",
            "must be sqlite:///relative/path.db or sqlite:////absolute/path.db "
            f"(no host part), got {parsed.redacted!r}",
        )
    path = unquote(parsed.path[1:]) or _DEFAULT_PATH
    return SQLiteURLSettings(path, _OPTIONS.parse(parsed.query, options, url=url).values)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class SQLiteLeaseProvider(BackendProvider):
    """Leases in a SQLite file: atomic across the processes of one host.

    ``sqlite:///leasekit.db`` (relative) or ``sqlite:////abs/path.db``. Options (also
    as URL query parameters): ``timeout_s`` bounds every operation, waiting for the
    file's write lock included (default 5); ``synchronous`` is SQLite's durability
    setting (default ``full``, so fencing tokens survive power loss; ``normal`` is
    faster and still safe against process crashes); ``sweep_every`` and
    ``sweep_batch`` tune how expired rows are reclaimed; ``create`` (default true)
    creates a missing file and its tables, and with ``create=false`` a missing file
    is an error instead (``leasekit owner`` and ``inspect`` open files that way, so a
    typo never leaves a new file behind).

    Expiry uses the host's wall clock (``server_clock=False``): all processes share it,
    but a clock step changes remaining lease times. Never put the file on a network
    filesystem: WAL needs shared memory between the processes.
    """

    backend: ClassVar[str] = _BACKEND
    # What a command that only reads passes to from_url (leasekit owner, inspect).
    read_only_options: ClassVar[dict[str, object]] = {"create": False}
    # sqlite3 runs in a thread of the provider's own: no connection belongs to a loop.
    _loop_bound: ClassVar[bool] = False
    capabilities: Capabilities = Capabilities(
        atomic_transfer=True,
        fencing=True,
        ttl_resolution_ms=1,
        min_ttl_ms=1,
        server_clock=False,
        shared_across_processes=True,
        shared_across_hosts=False,
        persistent=True,
    )
    errors: ClassVar[ErrorMap] = ErrorMap(
        {
            DatabaseLocked: LeaseBackendTimeout,
            DatabaseUnavailable: LeaseBackendUnreachable,
            sqlite3.Error: LeaseBackendError,
        },
        backend=_BACKEND,
    )

    def __init__(self, path: str | os.PathLike[str] = _DEFAULT_PATH, **options: Any) -> None:
        """Open (lazily) the file at ``path``; ``options`` as in the class docstring."""
        path = _check_path(path)
        settings = _OPTIONS.parse((), options)
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise BackendUnavailable(
                f"the SQLite backend needs SQLite >= 3.35 (UPSERT ... RETURNING); this "
                f"Python links SQLite {sqlite3.sqlite_version}",
                scheme="sqlite",
            )
        super().__init__(timeout_s=settings["timeout_s"], owns_client=True)
        # Its client is the file's name: a forked child opens the file anew.
        self._rebuild = Rebuild(type(self), path, options)
        self.path = path
        self.create: bool = settings["create"]
        self._synchronous: str = settings["synchronous"]
        self._sweep_every: int = settings["sweep_every"]
        self._sweep_batch: int = settings["sweep_batch"]
        self._writes = 0
        # The sweep's cursor: the last key of the window swept last (see _sql).
        self._sweep_after: bytes = _sql.SWEEP_START
        self._conn: sqlite3.Connection | None = None
        self._busy_conn: sqlite3.Connection | None = None  # whose busy_timeout is _busy_ms
        self._busy_ms = 0
        self._shut = False  # set in the thread once the connection is closed for good
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SQLiteLeaseProvider:
        """Build from ``sqlite:///relative.db``, ``sqlite:////abs.db`` or ``sqlite://``.

        Keyword ``options`` win over the URL's query. No I/O happens here.
        """
        settings = url_settings(url, **options)
        return cls(settings.path, **settings.options)

    @classmethod
    def sync_from_url(cls, url: str, **options: Any) -> SQLiteSyncLeaseProvider:
        """The blocking provider :func:`leasekit.sync.connect` uses for this URL.

        The same URL, options and errors as :meth:`from_url`; see
        :class:`~leasekit_sqlite.SQLiteSyncLeaseProvider`.
        """
        from ._sync import SQLiteSyncLeaseProvider  # noqa: PLC0415 (only for leasekit.sync)

        return SQLiteSyncLeaseProvider(cls.from_url(url, **options))

    # -- BackendProvider hooks -----------------------------------------------------------

    async def _connect(self) -> None:
        # Open now, so a bad path or a locked file shows up at the `async with`.
        await self._in_executor(lambda conn: None)

    async def _close_client(self) -> None:
        with self._executor_lock:
            executor, self._executor = self._executor, None
        if executor is None:
            return

        def close() -> None:
            self._shut = True
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

        try:
            await asyncio.get_running_loop().run_in_executor(executor, close)
        finally:
            executor.shutdown(wait=False)

    def _describe(self) -> str:
        return repr(self.path)

    def _where(self) -> str:
        return f" (file {self.path!r})"

    # -- the thread that owns the connection -----------------------------------------

    def _open(self, deadline: float) -> sqlite3.Connection:
        """Open the file and make sure the schema exists (runs in the provider thread)."""
        try:
            if self.create:
                conn = sqlite3.connect(
                    self.path, timeout=0, isolation_level=None, check_same_thread=False
                )
            else:
                # mode=rw: SQLite itself refuses to create the file.
                conn = sqlite3.connect(
                    f"file:{quote(os.path.abspath(self.path))}?mode=rw",
                    uri=True,
                    timeout=0,
                    isolation_level=None,
                    check_same_thread=False,
                )
        except sqlite3.OperationalError as exc:
            raise self._unavailable(exc) from exc
        try:
            self._set_busy_timeout(conn, deadline)
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")

            def setup(conn: sqlite3.Connection) -> None:
                # Both steps write only when needed, so opening a provider does not wait
                # for a writer that holds the lock on an already prepared file.
                if self.create and conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    conn.execute("PRAGMA journal_mode = WAL")  # readers and a writer at once
                try:
                    conn.execute(_sql.SCHEMA_VERSION_QUERY).fetchone()
                except sqlite3.OperationalError as exc:
                    if "no such table" not in str(exc):
                        raise
                    if not self.create:
                        raise DatabaseUnavailable(
                            f"{self.path!r} holds no leasekit tables, and create=false "
                            "does not create them"
                        ) from exc
                    self._transaction(conn, lambda: [conn.execute(s) for s in _sql.CREATE_SCHEMA])

            self._retry_busy(setup, conn, deadline)
        except BaseException:
            conn.close()
            raise
        return conn

    def _unavailable(self, exc: sqlite3.OperationalError) -> sqlite3.OperationalError:
        """Say which part of the path is missing, when that is why the file did not open."""
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            return DatabaseUnavailable(f"directory {directory!r} does not exist")
        if not self.create and not os.path.exists(self.path):
            return DatabaseUnavailable(
                f"no SQLite file at {os.path.abspath(self.path)!r} (create=false: "
                "a read never creates one)"
            )
        return exc

    def _set_busy_timeout(self, conn: sqlite3.Connection, deadline: float) -> None:
        # SQLite waits for another connection's write lock at most this long: never past
        # the caller's deadline, so the thread is free for the next call by then. The
        # PRAGMA is a statement of its own, so the setting is kept while it is at most
        # the time left and within 1% (or 5 ms) of it: one call after another, as
        # usual, needs none.
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            raise DatabaseLocked("the call's deadline passed while it waited for the thread")
        if conn is self._busy_conn and left_ms - max(5, left_ms // 100) <= self._busy_ms <= left_ms:
            return
        conn.execute(f"PRAGMA busy_timeout = {left_ms}")
        self._busy_conn, self._busy_ms = conn, left_ms

    _transaction = staticmethod(_work.transaction)

    @staticmethod
    def _retry_busy(
        fn: Callable[[sqlite3.Connection], _T], conn: sqlite3.Connection, deadline: float
    ) -> _T:
        # busy_timeout covers most waits inside SQLite, but a few paths (WAL recovery,
        # a checkpoint racing a write) return SQLITE_BUSY at once; those are retried
        # here with jittered backoff until the caller's deadline, never surfaced as a
        # raw "database is locked".
        delay = 0.001
        while True:
            try:
                return fn(conn)
            except sqlite3.OperationalError as exc:  # noqa: PERF203 (the retry loop is the point)
                if not _is_busy(exc) or isinstance(exc, DatabaseLocked | DatabaseUnavailable):
                    raise
                left = deadline - time.monotonic()
                if left <= delay:
                    raise DatabaseLocked(
                        "another connection held the file's write lock until the deadline"
                    ) from exc
                time.sleep(min(left, delay * random.uniform(0.5, 1.5)))
                delay = min(delay * 2, 0.05)

    def _in_thread(self, work: Callable[[sqlite3.Connection], _T], deadline: float) -> _T:
        if self._shut:
            raise LeaseProviderClosed(backend=_BACKEND)
        if self._conn is None:
            self._conn = self._open(deadline)
        else:
            self._set_busy_timeout(self._conn, deadline)
        conn = self._conn
        if conn.in_transaction:
            # Left open by a ROLLBACK that failed: the autocommit statements would run
            # inside it and never commit.
            conn.execute("ROLLBACK")
        return self._retry_busy(work, conn, deadline)

    async def _in_executor(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``work`` in the provider's thread; the caller's ``_call`` bounds the wait."""
        executor = self._executor
        if executor is None:
            with self._executor_lock:
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix="leasekit-sqlite"
                    )
                executor = self._executor
        deadline = time.monotonic() + self.timeout_s
        return await asyncio.get_running_loop().run_in_executor(
            executor, self._in_thread, work, deadline
        )

    def _run(
        self,
        work: Callable[[sqlite3.Connection], _T],
        key: str | None,
        *,
        write: bool,
        grant: str | None = None,
    ) -> Coroutine[Any, Any, _T]:
        # Not a coroutine of its own: the caller awaits _call's, one frame fewer on
        # every resumption.
        return self._call(self._in_executor(self._sweeping(work, write=write)), key, grant)

    def _sweeping(
        self, work: Callable[[sqlite3.Connection], _T], *, write: bool
    ) -> Callable[[sqlite3.Connection], _T]:
        """``work``, followed by a sweep on every ``sweep_every``-th write."""
        if not write:
            return work
        self._writes += 1
        if self._writes % self._sweep_every:
            return work

        def work_then_sweep(conn: sqlite3.Connection) -> _T:
            result = work(conn)
            self._sweep(conn, small_tables=False)
            return result

        return work_then_sweep

    def _sweep(self, conn: sqlite3.Connection, *, small_tables: bool = True) -> int:
        """Delete the expired rows of the next window of keys, raising the token floor over them.

        With ``small_tables=False`` (the sweep after every ``sweep_every``-th write) a
        table of fewer than ``sweep_batch`` rows is left as it is: it is bounded
        already, and its expired rows are mostly the tombstones of keys in use, which
        the next acquire of each would otherwise have to insert again (and each sweep
        would write, and sync, a transaction of its own). One read tells, without the
        write lock.
        """
        if not small_tables and self._sweep_after == _sql.SWEEP_START:
            window = {"after": _sql.SWEEP_START, "batch": self._sweep_batch}
            ((_, _, keys),) = conn.execute(_sql.SWEEP_WINDOW, window).fetchall()  # to the end
            if keys < self._sweep_batch:
                return 0

        def body() -> tuple[int, bytes]:
            after = self._sweep_after
            window = {"after": after, "batch": self._sweep_batch}
            cutoff, last, keys = conn.execute(_sql.SWEEP_WINDOW, window).fetchone()
            following = last if keys >= self._sweep_batch else _sql.SWEEP_START
            if last is None:
                return 0, following
            params = {"after": after, "last": last, "cutoff": cutoff}
            conn.execute(_sql.SWEEP_RAISE_FLOOR, params)
            return int(conn.execute(_sql.SWEEP_DELETE, params).rowcount), following

        # The cursor moves on only once the sweep has committed.
        deleted, self._sweep_after = self._transaction(conn, body)
        if deleted >= self._sweep_batch:
            self._writes = -1  # a window of nothing but expired rows: sweep again next write
        return deleted

    # -- the contract -------------------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        work = _work.acquire(key, owner, ttl_ms)
        if self._undos:
            await self._after_undo(key, owner)
        return await self._run(work, key, write=True, grant=owner)

    async def get_lease_owner(self, key: str) -> str | None:
        return await self._run(_work.owner(key), key, write=False)

    async def lease_remaining_ms(self, key: str) -> int | None:
        """Milliseconds left on the live lease of ``key`` (host clock), ``None`` if free.

        SQLite has no way to tell other processes about a release, so waiters poll; with
        this they never sleep past a holder's expiry (``leasekit.backend.SupportsRemaining``).
        """
        validate_key(key)
        params = _sql.key_params(key)
        return await self._run(
            lambda conn: _sql.remaining_from(conn.execute(_sql.REMAINING, params).fetchone()),
            key,
            write=False,
        )

    async def release_lease(self, key: str, owner: str) -> None:
        await self._run(_work.release(key, owner), key, write=True)

    async def release_grant(self, key: str, owner: str, token: int) -> None:
        """Release ``key`` if ``owner`` holds it with ``token`` (``SupportsReleaseGrant``)."""
        await self._run(_work.release_grant(key, owner, token), key, write=True)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return await self._run(_work.renew(key, owner, ttl_ms), key, write=True)

    async def renew_leases(self, items: Sequence[RenewItem]) -> list[bool]:
        """Renew many leases in one ``BEGIN IMMEDIATE`` transaction (``SupportsRenewMany``).

        One result per ``(key, owner, ttl_ms)``, each RENEW's own answer; one trip to
        the provider's thread and one commit for the whole batch.
        """
        checked = check_renew_items(items)
        if not checked:
            return []
        params = [{**_sql.key_params(k, owner=o), "ttl_ms": ttl} for k, o, ttl in checked]

        def work(conn: sqlite3.Connection) -> list[bool]:
            def body() -> list[bool]:
                return [_sql.changed(conn.execute(_sql.RENEW, p).rowcount) for p in params]

            return self._transaction(conn, body)

        return await self._run(work, checked[0][0], write=True)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        work = _work.transfer(key, from_owner, to_owner, ttl_ms)
        grant = to_owner if to_owner != from_owner else None  # else a renewal
        if grant is not None and self._undos:
            await self._after_undo(key, grant)
        return await self._run(work, key, write=True, grant=grant)

    # -- beyond the contract -------------------------------------------------------------

    async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases (key order), optionally only keys starting with ``prefix``."""
        if prefix is not None:
            validate_key(prefix, "prefix")
        checked: object = limit  # callers may pass anything; check at run time
        if isinstance(checked, bool) or not isinstance(checked, int) or checked < 1:
            raise InvalidLeaseArgument.for_argument("limit", f"must be an int >= 1, got {limit!r}")
        params = {"prefix": None if prefix is None else prefix.encode(), "limit": limit}
        return await self._run(
            lambda conn: _sql.records_from(conn.execute(_sql.INSPECT, params).fetchall()),
            prefix,
            write=False,
        )

    async def sweep(self) -> int:
        """Sweep the next window of ``sweep_batch`` keys now; returns how many rows it deleted."""
        return await self._run(self._sweep, None, write=False)

    async def row_count(self) -> int:
        """Rows in the table, live and expired: what the sweep keeps bounded."""
        return await self._run(
            lambda conn: int(conn.execute(_sql.COUNT_ROWS).fetchone()[0]), None, write=False
        )


def _check_path(path: object) -> str:
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise InvalidLeaseArgument.for_argument(
            "path", f"must be a non-empty file path, got {path!r}"
        )
    if path == ":memory:" or path.startswith("file::memory:") or "mode=memory" in path:
        raise InvalidLeaseArgument.for_argument(
            "path",
            "an in-memory SQLite database is private to one connection and cannot "
            "coordinate anything; use memory:// for in-process leases, or a file path",
        )
    return path
