"""PostgreSQL at scale: acquire/release latency with a million rows, and their reclamation.

    python benchmarks/postgres_scale.py --url postgresql://user@host/db [--rows 1000000]
        [--ops 3000] [--concurrency 1] [--sweep-timeout-s 600]

Steps, on two fresh tables of its own (dropped at the end unless --keep):

1. One table is filled with ``--rows`` rows by one ``INSERT ... SELECT generate_series``:
   half of them expired an hour ago (released or lapsed leases not yet reclaimed), half
   live for another hour; then ``ANALYZE``, as autovacuum would. The other stays empty.
2. ``--ops`` acquire+release cycles on fresh keys against each table, in alternating
   blocks (so that load from anything else on the machine hits both alike): p50/p99 of
   each operation, and the ratio of the full table's p99 to the empty one's (target:
   within 2x). Every cycle inserts a key and leaves its row as a tombstone.
3. Reclamation: cycles go on with the provider's default sweep settings (a background
   sweep every 100 writes, 1000 rows each, repeated at once while a backlog remains)
   until every row that expired before the grace period is gone; the report shows how
   long that took, the rows left (the live ones and recent tombstones) and the latency
   of the cycles that ran while sweeping.

Latencies are wall-clock times of ``await provider.acquire_lease(...)`` and
``release_lease``, one operation each, measured on the client: network, the pool and
leasekit included. With --concurrency N, N tasks run cycles at once.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import psycopg
from leasekit_postgres import PostgresLeaseProvider
from psycopg import sql

LIVE_TTL_MS = 60_000


@dataclass
class Latencies:
    """Per-operation latencies in seconds."""

    acquire: list[float] = field(default_factory=list)
    release: list[float] = field(default_factory=list)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


def describe(name: str, samples: list[float], baseline: list[float] | None = None) -> str:
    p50, p99 = percentile(samples, 50) * 1000, percentile(samples, 99) * 1000
    text = f"  {name:<8} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms"
    if baseline:
        ratio = percentile(samples, 99) / percentile(baseline, 99)
        text += f"   p99 x{ratio:.2f} of the empty table"
    return text + f"   (mean {statistics.fmean(samples) * 1000:.3f} ms, n={len(samples)})"


async def run_cycles(
    provider: PostgresLeaseProvider,
    ops: int,
    concurrency: int,
    label: str,
    until: Callable[[], Awaitable[bool]] | None = None,
) -> tuple[Latencies, int]:
    """``ops`` acquire+release cycles on fresh keys (or, with ``until``, until it is true)."""
    latencies = Latencies()
    done = 0
    stop = asyncio.Event()

    async def worker(worker_id: int) -> None:
        nonlocal done
        owner = f"bench-{worker_id}"
        while not stop.is_set() and (until is not None or done < ops):
            key = f"{label}/{worker_id}/{done}/{uuid.uuid4().hex[:8]}"
            done += 1
            start = time.perf_counter()
            result = await provider.acquire_lease(key, owner, LIVE_TTL_MS)
            middle = time.perf_counter()
            await provider.release_lease(key, owner)
            latencies.acquire.append(middle - start)
            latencies.release.append(time.perf_counter() - middle)
            assert result.acquired, result

    async def watch() -> None:
        assert until is not None
        while not await until():  # noqa: ASYNC110 (polls the database, not an event)
            await asyncio.sleep(0.5)
        stop.set()

    tasks = [asyncio.create_task(worker(i)) for i in range(concurrency)]
    if until is not None:
        tasks.append(asyncio.create_task(watch()))
    await asyncio.gather(*tasks)
    return latencies, done


FILL_EXPIRY = {
    "half": """CASE WHEN g %% 2 = 0 THEN clock_timestamp() - interval '1 hour'
                    ELSE clock_timestamp() + interval '1 hour' END""",
    "live": "clock_timestamp() + interval '1 hour'",
    "expired": "clock_timestamp() - interval '1 hour'",
}
"""How :func:`fill` dates its rows: alternately expired and live, all live, all expired."""


async def fill(
    url: str, table: str, rows: int, *, start: int = 1, expiry: str = "half", prefix: str = "fill"
) -> float:
    """Insert ``rows`` rows keyed ``<prefix>/<n>`` from ``n = start``, owned by ``filler``.

    ``expiry`` picks how they are dated (:data:`FILL_EXPIRY`): by default half expired
    an hour ago and half live for an hour. Then ``ANALYZE``, as autovacuum would.
    """
    schema, _, name = table.rpartition(".")
    ident = sql.Identifier(schema, name) if schema else sql.Identifier(name)
    seq_text = (
        sql.Identifier(schema, f"{name}_token_seq")
        if schema
        else sql.Identifier(f"{name}_token_seq")
    ).as_string()
    statement = sql.SQL(
        """
        INSERT INTO {table} (key, owner, token, expires_at)
        SELECT convert_to(%(prefix)s::text || '/' || g, 'UTF8'), convert_to('filler', 'UTF8'),
               nextval({seq}), {expiry}
        FROM generate_series(%(start)s::bigint, %(start)s::bigint + %(rows)s::bigint - 1) AS g
        """
    ).format(table=ident, seq=sql.Literal(seq_text), expiry=sql.SQL(FILL_EXPIRY[expiry]))
    began = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(statement, {"rows": rows, "start": start, "prefix": prefix})
        await conn.execute(sql.SQL("ANALYZE {}").format(ident))
    return time.perf_counter() - began


async def expired_rows(url: str, table: str, grace_s: float) -> int:
    schema, _, name = table.rpartition(".")
    ident = sql.Identifier(schema, name) if schema else sql.Identifier(name)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {} "
                "WHERE expires_at < statement_timestamp() - %(grace_s)s * interval '1 second'"
            ).format(ident),
            {"grace_s": grace_s},
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def drop(url: str, table: str) -> None:
    schema, _, name = table.rpartition(".")

    def qualified(suffix: str) -> sql.Identifier:
        full = name + suffix
        return sql.Identifier(schema, full) if schema else sql.Identifier(full)

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP TABLE IF EXISTS {}, {}; DROP SEQUENCE IF EXISTS {}").format(
                qualified(""), qualified("_meta"), qualified("_token_seq")
            )
        )


async def compare(
    empty: PostgresLeaseProvider, full: PostgresLeaseProvider, args: argparse.Namespace
) -> tuple[Latencies, Latencies]:
    """Cycles on both tables in alternating blocks, so load from elsewhere hits both alike."""
    on_empty, on_full = Latencies(), Latencies()
    block = max(1, min(100, args.ops // 10))
    for number in range(max(1, args.ops // block)):
        order = [(empty, on_empty), (full, on_full)]
        for provider, into in order if number % 2 == 0 else order[::-1]:
            got, _ = await run_cycles(provider, block, args.concurrency, f"b{number}")
            into.acquire += got.acquire
            into.release += got.release
    return on_empty, on_full


async def main(args: argparse.Namespace) -> int:
    table = args.table or f"leasekit_scale_{uuid.uuid4().hex[:8]}"
    baseline = f"{table}_empty"
    url = args.url
    print(f"tables {table} and {baseline}, {args.rows:,} rows, {args.ops:,} cycles each, "
          f"concurrency {args.concurrency}")  # fmt: skip
    try:
        # Measure without background sweeps first: the table's size is the variable.
        async with (
            PostgresLeaseProvider.from_url(
                url, table=baseline, sweep_every=0, pool_max_size=args.concurrency
            ) as empty,
            PostgresLeaseProvider.from_url(
                url, table=table, sweep_every=0, pool_max_size=args.concurrency
            ) as provider,
        ):
            seconds = await fill(url, table, args.rows)
            rows = await provider.row_count()
            print(f"filled {args.rows:,} rows in {seconds:.1f} s; the table now has {rows:,}")
            await run_cycles(empty, min(200, args.ops), args.concurrency, "warm")
            await run_cycles(provider, min(200, args.ops), args.concurrency, "warm")
            on_empty, on_full = await compare(empty, provider, args)
            print("empty table:")
            print(describe("acquire", on_empty.acquire))
            print(describe("release", on_empty.release))
            print(f"{rows:,} rows (half expired, half live):")
            print(describe("acquire", on_full.acquire, on_empty.acquire))
            print(describe("release", on_full.release, on_empty.release))

        # Then with the defaults: the background sweep reclaims the expired rows.
        async with PostgresLeaseProvider.from_url(
            url, table=table, pool_max_size=args.concurrency + 1
        ) as swept:
            grace_s = swept.sweep_grace_s
            before = await expired_rows(url, table, grace_s)
            start = time.perf_counter()

            async def reclaimed() -> bool:
                if time.perf_counter() - start > args.sweep_timeout_s:
                    return True
                return await expired_rows(url, table, grace_s) == 0

            during, cycles = await run_cycles(
                swept, 0, args.concurrency, "sweeping", until=reclaimed
            )
            elapsed = time.perf_counter() - start
            left_expired = await expired_rows(url, table, grace_s)
            rows_after = await swept.row_count()
            print(
                f"reclaiming: {before - left_expired:,} of {before:,} rows expired more than "
                f"{grace_s:g} s ago deleted in {elapsed:.1f} s by background sweeps, "
                f"during {cycles:,} cycles; {left_expired:,} left; the table now has "
                f"{rows_after:,} rows (live leases and recent tombstones)"
            )
            print("while sweeping:")
            print(describe("acquire", during.acquire, on_empty.acquire))
            print(describe("release", during.release, on_empty.release))
        return 0 if left_expired == 0 else 1
    finally:
        if not args.keep:
            await drop(url, table)
            await drop(url, baseline)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="postgresql://user@host:port/dbname")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows to fill (1,000,000)")
    parser.add_argument("--ops", type=int, default=3000, help="cycles per measurement (3000)")
    parser.add_argument("--concurrency", type=int, default=1, help="tasks running cycles (1)")
    parser.add_argument("--table", help="table name (default: a fresh one, dropped at the end)")
    parser.add_argument("--keep", action="store_true", help="keep the table afterwards")
    parser.add_argument(
        "--sweep-timeout-s", type=float, default=600, help="give up reclaiming after this (600)"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
