"""Fair waiting: the longest and the mean wait on one hot key, with and without fair=True.

    python benchmarks/fair.py [URL ...] [--waiters N] [--handoffs N]

Without a URL: memory:// and a temporary SQLite file (the backends with fair waiting so
far). ``--waiters`` tasks (16) share one provider and take turns on one key until
``--handoffs`` grants (2,000) were made: each waits with ``leasekit.wait_for``, holds
the key for a moment, releases it and at once waits again, so there is always a crowd.
Without ``fair`` the task that just released often wins again before the others wake;
with it the store's line serves them in arrival order. Reports each run's grants per
second, the mean and the longest wait, and how many grants the least and the most
served task got.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import leasekit

TTL_MS = 30_000
HOLD_S = 0.0005


async def run(url: str, waiters: int, handoffs: int, *, fair: bool) -> dict[str, float]:
    async with leasekit.connect(url) as provider:
        key = f"bench-fair-{uuid.uuid4().hex[:8]}"
        waits: list[float] = []
        served = dict.fromkeys(range(waiters), 0)
        done = asyncio.Event()

        async def waiter(index: int) -> None:
            round_ = 0
            while not done.is_set():
                round_ += 1
                owner = f"w{index}-{round_}"
                asked = time.perf_counter()
                try:
                    await leasekit.wait_for(
                        provider, key, owner, TTL_MS, 10, poll_s=0.001, max_poll_s=0.05, fair=fair
                    )
                except leasekit.LeaseHeld:
                    continue
                waits.append(time.perf_counter() - asked)
                served[index] += 1
                if len(waits) >= handoffs:
                    done.set()
                await asyncio.sleep(HOLD_S)
                await provider.release_lease(key, owner)

        started = time.perf_counter()
        await asyncio.gather(*(waiter(i) for i in range(waiters)))
        elapsed = time.perf_counter() - started
    return {
        "grants_per_s": len(waits) / elapsed,
        "mean_ms": statistics.fmean(waits) * 1000,
        "max_ms": max(waits) * 1000,
        "least": min(served.values()),
        "most": max(served.values()),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("urls", nargs="*")
    parser.add_argument("--waiters", type=int, default=16)
    parser.add_argument("--handoffs", type=int, default=2000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        urls = args.urls or ["memory://", f"sqlite:///{Path(workdir)}/fair.db"]
        for url in urls:
            print(f"{url.split('://')[0]}://, {args.waiters} waiters, {args.handoffs} grants")
            for fair in (False, True):
                r = asyncio.run(run(url, args.waiters, args.handoffs, fair=fair))
                print(
                    f"  fair={fair!s:<5} {r['grants_per_s']:8,.0f} grants/s  "
                    f"mean wait {r['mean_ms']:8.1f} ms  longest {r['max_ms']:8.1f} ms  "
                    f"per task {r['least']:.0f}..{r['most']:.0f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
