"""Cost as work grows: acquire latency and the store's memory with 1k to 1M live keys.

    python benchmarks/scale.py [--sizes 1000,100000,1000000]
        [--backends redis,postgres,sqlite] [--samples 2000] [--expired 100000] [--json]

For each backend, on a private server started with the test harness
(``tests/servers.py``: loopback, a temporary directory, stopped afterwards) or a
SQLite file in a temporary directory, the store is filled with the raw driver in bulk
to each size in turn (topped up, smallest first) with exactly the records that
leasekit writes for a live lease, owned by ``filler`` for an hour:

- Redis: the lease ``<prefix>{fill/<n>}`` = ``"<token> filler"`` with ``PX`` and its
  fencing counter ``<lease>:fence`` (``leasekit_redis._keys`` names both; the values
  are those of ``leasekit_redis._lua.ACQUIRE``), pipelined ``SET`` commands, no Lua;
- PostgreSQL: one ``INSERT ... SELECT generate_series`` into the provider's table
  (``postgres_scale.fill``), then ``ANALYZE``;
- SQLite: one ``executemany`` in one transaction into ``leasekit_leases``.

Then ``--samples`` pairs of operations through the provider, one at a time:

- ``fresh``: ``acquire_lease`` of a key never seen (granted; released afterwards,
  untimed, and the leftovers deleted before the next fill, so the store holds exactly
  the live keys it says);
- ``denied``: ``acquire_lease`` by another owner of a random filled key (denied,
  ``filler`` reported as the holder).

p50/p99 are client wall-clock latencies (the driver, the network and leasekit
included). ``p99 x`` is the p99 over the smallest size's in the same run (flat is
1.0). Memory per live key is the store's growth from empty over the live keys
written: Redis ``INFO memory`` ``used_memory``; PostgreSQL ``pg_total_relation_size``
of the table (its indexes and TOAST included); SQLite ``page_count * page_size``.
Memory per expired key is the growth when ``--expired`` expired records are added
to the emptied store after the last size: what the store keeps of a lease that lapsed
or was released and is not yet reclaimed. On Redis that is the fencing counter alone
(Redis deletes the expired lease itself); on PostgreSQL and SQLite it is the tombstone
row, kept until the sweep deletes it (background sweeps are off here, so the sizes
stay exact).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import leasekit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the harness that starts private servers
sys.path.insert(0, str(ROOT / "benchmarks"))  # postgres_scale's fill

LIVE_TTL_MS = 3_600_000
FILLER = "filler"
BENCH_OWNER = "bench"
WARMUP = 50


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


class Store(Protocol):
    """One backend's store, seen through its raw driver."""

    url: str
    options: dict[str, Any]

    async def fill(self, start: int, count: int, *, expired: bool = False) -> None:
        """Write records for keys ``fill/<start>`` .. (``expired/<n>`` if ``expired``)."""

    async def memory_bytes(self) -> int:
        """What the store takes now, by this backend's measure (see the module docstring)."""

    async def forget(self, prefix: str) -> None:
        """Delete every record whose key starts with ``prefix``."""

    async def empty(self) -> None:
        """Delete every record and give the space back (Redis's tables, the file's pages)."""


class RedisStore:
    def __init__(self, url: str) -> None:
        import redis.asyncio  # noqa: PLC0415 (only this backend needs the driver)
        from leasekit_redis import _keys  # noqa: PLC0415

        self.url = url
        self.options: dict[str, Any] = {}
        self._keys = _keys
        self._prefix = b"leasekit:"
        self._client = redis.asyncio.Redis.from_url(url)
        self._token = time.time_ns() // 1000  # ACQUIRE's tokens are server microseconds

    async def fill(self, start: int, count: int, *, expired: bool = False) -> None:
        chunk = 10_000
        counter_px = LIVE_TTL_MS + 3_600_000  # the provider's default counter_ttl_ms
        for first in range(start, start + count, chunk):
            pipe = self._client.pipeline(transaction=False)
            for n in range(first, min(first + chunk, start + count)):
                self._token += 1
                if expired:  # the lease is gone; its counter stays counter_ttl_ms
                    lease = self._keys.lease_name(self._prefix, f"expired/{n}")
                    pipe.set(self._keys.counter_name(lease), self._token, px=3_600_000)
                    continue
                lease = self._keys.lease_name(self._prefix, f"fill/{n}")
                pipe.set(lease, f"{self._token} {FILLER}", px=LIVE_TTL_MS)
                pipe.set(self._keys.counter_name(lease), self._token, px=counter_px)
            await pipe.execute()

    async def memory_bytes(self) -> int:
        info = await self._client.info("memory")
        return int(info["used_memory"])

    async def forget(self, prefix: str) -> None:
        pattern = self._prefix + b"{" + prefix.encode() + b"*"
        names = [name async for name in self._client.scan_iter(match=pattern, count=10_000)]
        for first in range(0, len(names), 10_000):
            await self._client.unlink(*names[first : first + 10_000])

    async def empty(self) -> None:
        await self._client.flushall(asynchronous=False)

    async def aclose(self) -> None:
        await self._client.aclose()


class PostgresStore:
    TABLE = "leasekit_scale"

    def __init__(self, url: str) -> None:
        self.url = url
        self.options: dict[str, Any] = {"table": self.TABLE, "sweep_every": 0}

    async def fill(self, start: int, count: int, *, expired: bool = False) -> None:
        import postgres_scale  # noqa: PLC0415 (after the sys.path entry)

        await postgres_scale.fill(
            self.url,
            self.TABLE,
            count,
            start=start,
            expiry="expired" if expired else "live",
            prefix="expired" if expired else "fill",
        )

    async def _execute(self, statement: str, params: tuple[Any, ...] = ()) -> Any:
        import psycopg  # noqa: PLC0415

        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            cur = await conn.execute(statement, params)
            return await cur.fetchone() if cur.description else None

    async def memory_bytes(self) -> int:
        row = await self._execute("SELECT pg_total_relation_size(%s::regclass)", (self.TABLE,))
        return int(row[0])

    async def forget(self, prefix: str) -> None:
        await self._execute(
            f"DELETE FROM {self.TABLE} WHERE key >= %s AND key < %s",  # noqa: S608 (a constant)
            (prefix.encode(), prefix.encode() + b"\xff"),
        )

    async def empty(self) -> None:
        await self._execute(f"TRUNCATE {self.TABLE}")


class SqliteStore:
    def __init__(self, path: Path) -> None:
        self.url = f"sqlite:///{path}"
        # Sweeps off (as far as the option goes), so expired rows stay to be measured.
        self.options: dict[str, Any] = {"sweep_every": 2**62}
        self._path = path

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self._path, isolation_level=None, timeout=30)

    async def fill(self, start: int, count: int, *, expired: bool = False) -> None:
        prefix = "expired" if expired else "fill"
        owner = FILLER.encode()
        with contextlib.closing(self._connect()) as conn:
            now_ms = int(time.time() * 1000)
            expires = 0 if expired else now_ms + LIVE_TTL_MS
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO leasekit_leases (key, owner, token, expires_at_ms) "
                "VALUES (?, ?, ?, ?)",
                (
                    (f"{prefix}/{n}".encode(), owner, n, expires)
                    for n in range(start, start + count)
                ),
            )
            conn.execute("COMMIT")

    async def memory_bytes(self) -> int:
        with contextlib.closing(self._connect()) as conn:
            (pages,) = conn.execute("PRAGMA page_count").fetchone()
            (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        return int(pages) * int(page_size)

    async def forget(self, prefix: str) -> None:
        with contextlib.closing(self._connect()) as conn:
            conn.execute(
                "DELETE FROM leasekit_leases WHERE key >= ? AND key < ?",
                (prefix.encode(), prefix.encode() + b"\xff"),
            )

    async def empty(self) -> None:
        with contextlib.closing(self._connect()) as conn:
            conn.execute("DELETE FROM leasekit_leases")
            conn.execute("VACUUM")


@contextlib.asynccontextmanager
async def open_store(name: str, workdir: Path) -> AsyncIterator[Store]:
    if name == "sqlite":
        yield SqliteStore(workdir / "scale.db")
    elif name == "redis":
        from servers import RedisServer  # noqa: PLC0415 (after the sys.path entry)

        binary = RedisServer.find()
        if binary is None:
            raise SystemExit("redis-server not found")
        with RedisServer(binary, workdir / "redis") as server:
            store = RedisStore(server.url)
            try:
                yield store
            finally:
                await store.aclose()
    elif name == "postgres":
        from servers import PostgresServer  # noqa: PLC0415

        binary = PostgresServer.find()
        if binary is None:
            raise SystemExit("postgres not found")
        with PostgresServer(binary, workdir / "pg") as server:
            yield PostgresStore(server.url)
    else:
        raise SystemExit(f"unknown backend {name!r}")


@dataclass
class SizeResult:
    backend: str
    live_keys: int
    samples: int
    fill_s: float
    fresh_p50_ms: float
    fresh_p99_ms: float
    denied_p50_ms: float
    denied_p99_ms: float
    fresh_p99_x: float = 1.0
    denied_p99_x: float = 1.0
    bytes_per_live_key: float = 0.0


@dataclass
class ExpiredResult:
    backend: str
    expired_keys: int
    bytes_per_expired_key: float


@dataclass
class Report:
    sizes: list[SizeResult] = field(default_factory=list)
    expired: list[ExpiredResult] = field(default_factory=list)


async def sample(provider: Any, size: int, count: int, tag: str) -> tuple[list[float], list[float]]:
    """``count`` fresh acquires and ``count`` denied ones, alternating; seconds each."""
    fresh: list[float] = []
    denied: list[float] = []
    pick = random.Random(size)
    for i in range(count):
        key = f"fresh/{tag}/{i}"
        start = time.perf_counter()
        got = await provider.acquire_lease(key, BENCH_OWNER, LIVE_TTL_MS)
        fresh.append(time.perf_counter() - start)
        assert got.acquired, got
        await provider.release_lease(key, BENCH_OWNER)

        held = f"fill/{pick.randint(1, size)}"
        start = time.perf_counter()
        got = await provider.acquire_lease(held, BENCH_OWNER, LIVE_TTL_MS)
        denied.append(time.perf_counter() - start)
        assert not got.acquired, (held, got)
        assert got.owner == FILLER, (held, got)
    return fresh, denied


async def run_backend(name: str, args: argparse.Namespace, report: Report) -> None:
    with tempfile.TemporaryDirectory(prefix="leasekit-scale-") as tmp:
        workdir = Path(tmp)
        (workdir / "redis").mkdir()
        (workdir / "pg").mkdir()
        async with (
            open_store(name, workdir) as store,
            leasekit.connect(store.url, **store.options) as provider,
        ):
            # The first operation creates the schema; then the store is empty again.
            await provider.acquire_lease("fresh/schema", BENCH_OWNER, 1000)
            await provider.release_lease("fresh/schema", BENCH_OWNER)
            await store.forget("fresh/")
            empty = await store.memory_bytes()
            filled = 0
            first: SizeResult | None = None
            for size in args.sizes:
                start = time.perf_counter()
                await store.fill(filled + 1, size - filled)
                fill_s = time.perf_counter() - start
                filled = size
                per_key = (await store.memory_bytes() - empty) / size
                await sample(provider, size, min(WARMUP, args.samples), f"warm{size}")
                fresh, denied = await sample(provider, size, args.samples, str(size))
                await store.forget("fresh/")
                result = SizeResult(
                    backend=name,
                    live_keys=size,
                    samples=args.samples,
                    fill_s=round(fill_s, 2),
                    fresh_p50_ms=round(percentile(fresh, 50) * 1000, 3),
                    fresh_p99_ms=round(percentile(fresh, 99) * 1000, 3),
                    denied_p50_ms=round(percentile(denied, 50) * 1000, 3),
                    denied_p99_ms=round(percentile(denied, 99) * 1000, 3),
                    bytes_per_live_key=round(per_key, 1),
                )
                first = first or result
                result.fresh_p99_x = round(result.fresh_p99_ms / first.fresh_p99_ms, 2)
                result.denied_p99_x = round(result.denied_p99_ms / first.denied_p99_ms, 2)
                print(format_row(result), file=sys.stderr, flush=True)
                report.sizes.append(result)
            if args.expired:
                # On an empty store: added to a full one, the growth would be dominated
                # by whatever the store does at that size (Redis doubling its tables).
                await store.empty()
                before = await store.memory_bytes()
                await store.fill(1, args.expired, expired=True)
                per_expired = (await store.memory_bytes() - before) / args.expired
                expired = ExpiredResult(name, args.expired, round(per_expired, 1))
                print(
                    f"  {name}: {args.expired:,} expired keys, "
                    f"{expired.bytes_per_expired_key:,.1f} B each",
                    file=sys.stderr,
                    flush=True,
                )
                report.expired.append(expired)


COLUMNS: list[tuple[str, str, Callable[[SizeResult], object]]] = [
    ("backend", "<8", lambda r: r.backend),
    ("live keys", ">9", lambda r: f"{r.live_keys:,}"),
    ("fill", ">7", lambda r: f"{r.fill_s:.1f} s"),
    ("fresh p50", ">9", lambda r: f"{r.fresh_p50_ms:.3f}"),
    ("fresh p99", ">9", lambda r: f"{r.fresh_p99_ms:.3f}"),
    ("p99 x", ">5", lambda r: f"{r.fresh_p99_x:.2f}"),
    ("denied p50", ">10", lambda r: f"{r.denied_p50_ms:.3f}"),
    ("denied p99", ">10", lambda r: f"{r.denied_p99_ms:.3f}"),
    ("p99 x", ">5", lambda r: f"{r.denied_p99_x:.2f}"),
    ("B/live key", ">10", lambda r: f"{r.bytes_per_live_key:,.1f}"),
]


def format_row(result: SizeResult) -> str:
    return "  ".join(format(str(get(result)), spec) for _, spec, get in COLUMNS)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,100000,1000000", help="live keys, ascending")
    parser.add_argument("--backends", default="redis,postgres,sqlite")
    parser.add_argument("--samples", type=int, default=2000, help="operations of each kind")
    parser.add_argument("--expired", type=int, default=100_000, help="expired keys to add")
    parser.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    args = parser.parse_args(argv)
    args.sizes = [int(size) for size in args.sizes.split(",")]
    if args.sizes != sorted(set(args.sizes)) or args.sizes[0] < 1:
        parser.error("--sizes must be positive and ascending")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    print("latencies in ms, one operation at a time", file=sys.stderr)
    print("  ".join(format(title, spec) for title, spec, _ in COLUMNS), file=sys.stderr)
    report = Report()
    for name in args.backends.split(","):
        asyncio.run(run_backend(name, args, report))
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
