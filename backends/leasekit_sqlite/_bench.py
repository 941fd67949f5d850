"""SQLite: the raw ``sqlite3`` floor for ``leasekit bench sqlite:///path``.

Registered in the ``leasekit.bench`` entry-point group for ``sqlite``, and imported
only when such a URL is benchmarked. The floor reads the URL with the provider's own
parser (:func:`~leasekit_sqlite._options.url_settings`), so the file, ``synchronous``
and ``timeout_s`` (the busy timeout) mean the same to both. It is the least a
hand-written lease table needs on the same file: WAL, the same ``synchronous`` level
as leasekit's (default ``FULL``), one connection in one worker thread (what
leasekit's backend does too, so the event loop never blocks), and one autocommit
statement per operation: an UPSERT that takes a free or expired key, and a DELETE by
key and owner. No fencing tokens, tombstones, sweeping or busy
retries. It writes to its own table, dropped at the end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3

from leasekit.bench import AsyncCycler, BenchTarget, Contender, SchemeBench

from ._options import url_settings

__all__ = ["BENCH"]

_TABLE = "leasekit_bench_floor"
_NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
_SCHEMA = f"""
    CREATE TABLE IF NOT EXISTS {_TABLE} (
        key TEXT PRIMARY KEY NOT NULL,
        owner TEXT NOT NULL,
        expires_at_ms INTEGER NOT NULL
    ) WITHOUT ROWID
"""
# ?1 key, ?2 owner, ?3 ttl_ms. One statement, so atomic on its own: a live row of
# anyone fails the WHERE and nothing is written.
_ACQUIRE = f"""
    INSERT INTO {_TABLE} (key, owner, expires_at_ms) VALUES (?1, ?2, {_NOW_MS} + ?3)
    ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, expires_at_ms = excluded.expires_at_ms
    WHERE expires_at_ms <= {_NOW_MS}
"""  # noqa: S608 (constants only; keys and owners are parameters)
_RELEASE = f"DELETE FROM {_TABLE} WHERE key = ?1 AND owner = ?2"  # noqa: S608 (as above)


class _RawCycler:
    def __init__(self, path: str, ttl_ms: int, *, synchronous: str, timeout_s: float) -> None:
        self._ttl_ms = ttl_ms
        self._synchronous = synchronous
        self._timeout_s = timeout_s
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="bench-sqlite"
        )
        self._path = path
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._connect)

    def _connect(self) -> None:
        conn = sqlite3.connect(self._path, timeout=self._timeout_s, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")  # checked by the parser
        conn.execute(_SCHEMA)
        self._conn = conn

    def _acquire(self, key: str, owner: str) -> bool:
        assert self._conn is not None
        return self._conn.execute(_ACQUIRE, (key, owner, self._ttl_ms)).rowcount == 1

    def _release(self, key: str, owner: str) -> None:
        assert self._conn is not None
        self._conn.execute(_RELEASE, (key, owner))

    async def cycle(self, key: str, owner: str) -> bool:
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(self._executor, self._acquire, key, owner):
            return False
        await loop.run_in_executor(self._executor, self._release, key, owner)
        return True

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.execute(f"DROP TABLE IF EXISTS {_TABLE}")
            self._conn.close()
            self._conn = None

    async def aclose(self) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._close)
        finally:
            self._executor.shutdown()


async def _open_raw(target: BenchTarget) -> AsyncCycler:
    settings = url_settings(target.url)
    cycler = _RawCycler(
        settings.path,
        target.ttl_ms,
        synchronous=settings.synchronous,
        timeout_s=settings.timeout_s,
    )
    try:
        await cycler.open()
    except BaseException:
        await cycler.aclose()
        raise
    return cycler


BENCH = SchemeBench(
    contenders=(
        Contender(
            "sqlite-raw",
            "sqlite3 raw",
            "floor",
            open_async=_open_raw,
            how="sqlite3 in one worker thread, WAL, leasekit's synchronous: one autocommit "
            "UPSERT ... WHERE expired, then DELETE by key and owner",
        ),
    ),
)
