"""What event hooks cost: memory:// acquire+release pairs per second, with and without plugins.

    python benchmarks/hooks_overhead.py [--ops 20000] [--repeat 5]

memory:// is the cheapest backend (no I/O), so any overhead shows here at its largest;
on a networked backend it disappears in the round trip. With no plugin registered,
connect() returns the backend's own provider: the "no plugin" row runs exactly the
code of a MemoryLeaseProvider made by hand, which is the baseline row. Each row is the
best of --repeat runs of --ops pairs; "op" below is one acquire plus one release.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import Callable

import leasekit
import leasekit.plugins


class NoopPlugin:
    """Implements every hook and does nothing: the pure cost of emitting."""

    @leasekit.hookimpl
    def leasekit_acquired(self, key: str) -> None:
        pass

    @leasekit.hookimpl
    def leasekit_denied(self, key: str) -> None:
        pass

    @leasekit.hookimpl
    def leasekit_renewed(self, key: str) -> None:
        pass

    @leasekit.hookimpl
    def leasekit_lost(self, key: str) -> None:
        pass

    @leasekit.hookimpl
    def leasekit_released(self, key: str) -> None:
        pass

    @leasekit.hookimpl
    def leasekit_transferred(self, key: str) -> None:
        pass

    @leasekit.hookimpl
    def leasekit_failed(self, key: str) -> None:
        pass


async def pairs_per_second(make: Callable[[], leasekit.LeaseProvider], ops: int) -> float:
    provider = make()
    acquire, release = provider.acquire_lease, provider.release_lease
    start = time.perf_counter()
    for i in range(ops):
        key = f"k{i & 1023}"
        await acquire(key, "owner", 30_000)
        await release(key, "owner")
    return ops / (time.perf_counter() - start)


async def best_of(make: Callable[[], leasekit.LeaseProvider], ops: int, repeat: int) -> float:
    await pairs_per_second(make, min(ops, 1000))  # warm up
    return max([await pairs_per_second(make, ops) for _ in range(repeat)])


async def main(ops: int, repeat: int) -> None:
    rows: list[tuple[str, str, float]] = []

    def report(label: str, make: Callable[[], leasekit.LeaseProvider], rate: float) -> None:
        rows.append((label, type(make()).__name__, rate))

    make_direct = leasekit.MemoryLeaseProvider
    report("baseline", make_direct, await best_of(make_direct, ops, repeat))

    def make_connected() -> leasekit.LeaseProvider:
        return leasekit.connect("memory://")

    report("no plugin", make_connected, await best_of(make_connected, ops, repeat))

    noop = leasekit.plugins.register(NoopPlugin())
    report("no-op plugin", make_connected, await best_of(make_connected, ops, repeat))
    leasekit.plugins.unregister(noop)

    # Enabled, but its logger filters the records out: the usual production setting
    # for INFO events.
    logging.getLogger("leasekit").setLevel(logging.WARNING)
    logger_plugin = leasekit.plugins.enable_logging(logging.INFO)
    rate = await best_of(make_connected, ops, repeat)
    report("logging plugin (filtered)", make_connected, rate)
    leasekit.plugins.unregister(logger_plugin)

    base = rows[0][2]
    width = max(len(label) for label, _, _ in rows)
    for label, provider, rate in rows:
        print(
            f"{label:<{width}}  {rate:>10,.0f} ops/s  {1e6 / rate:6.2f} us/op  "
            f"{rate / base:5.2f}x baseline  ({provider})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=20_000, help="acquire+release pairs per run")
    parser.add_argument("--repeat", type=int, default=5, help="runs per row; the best counts")
    args = parser.parse_args()
    asyncio.run(main(args.ops, args.repeat))
