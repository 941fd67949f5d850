"""Counting leases: slot acquire+release cycles per second against the one-holder lease.

    python benchmarks/slots.py [URL ...] [--cycles N] [--rounds R]

Without a URL: memory:// and a temporary SQLite file (the backends with slots so far).
One task, one provider, in the same run and interleaved round by round, so the ratios
compare like with like:

- ``lease``: ``acquire_lease`` + ``release_lease`` on one key (the contract);
- ``slot, limit 1``: ``acquire_slot(limit=1)`` + ``release_slot`` on one key;
- ``slot, limit 8, 7 held``: the same with 7 other live holders of the key, so each
  acquire counts and checks them.

Reports the median cycles per second over the rounds and each row's ratio to the
lease's. Timings, not tests: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import leasekit

TTL_MS = 60_000


async def _rate(cycle: Callable[[int], Awaitable[None]], cycles: int) -> float:
    for i in range(min(50, cycles)):  # warm up: connections, statements, caches
        await cycle(i)
    started = time.perf_counter()
    for i in range(cycles):
        await cycle(i)
    return cycles / (time.perf_counter() - started)


async def measure(url: str, cycles: int, rounds: int) -> list[tuple[str, float]]:
    async with leasekit.connect(url) as provider:
        slots: Any = provider
        run = uuid.uuid4().hex[:8]
        crowded = f"bench-{run}-crowded"
        for i in range(7):
            await slots.acquire_slot(crowded, f"other-{i}", TTL_MS, limit=8)

        async def lease(i: int) -> None:
            await provider.acquire_lease(f"bench-{run}-lease", "me", TTL_MS)
            await provider.release_lease(f"bench-{run}-lease", "me")

        async def slot(i: int) -> None:
            await slots.acquire_slot(f"bench-{run}-slot", "me", TTL_MS, limit=1)
            await slots.release_slot(f"bench-{run}-slot", "me")

        async def slot_crowded(i: int) -> None:
            await slots.acquire_slot(crowded, "me", TTL_MS, limit=8)
            await slots.release_slot(crowded, "me")

        rows: dict[str, list[float]] = {}
        for _ in range(rounds):
            for name, cycle in (
                ("lease", lease),
                ("slot, limit 1", slot),
                ("slot, limit 8, 7 held", slot_crowded),
            ):
                rows.setdefault(name, []).append(await _rate(cycle, cycles))
        for i in range(7):
            await slots.release_slot(crowded, f"other-{i}")
    return [(name, statistics.median(rates)) for name, rates in rows.items()]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("urls", nargs="*")
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        urls = args.urls or ["memory://", f"sqlite:///{Path(workdir)}/slots.db"]
        for url in urls:
            rows = asyncio.run(measure(url, args.cycles, args.rounds))
            base = rows[0][1]
            print(f"{url.split('://')[0]}://")
            for name, rate in rows:
                print(f"  {name:<24} {rate:>10,.0f} cycles/s  {rate / base:5.2f}x the lease")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
