"""``leasekit demo``: workers contend for thread keys, hand them off, and survive a crash.

Every worker logs the intervals during which it believed it owned a key; the verdict
replays those logs and proves (or disproves) that no two owners overlapped. A
worker's belief starts when the grant returns and ends when it starts to release or
hand off, or when the lease must have expired counted from *before* the last call
that granted or renewed it: the conservative bound a careful client uses.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ._capabilities import capabilities_of
from ._contract import LeaseProvider

__all__ = ["DemoReport", "Holding", "find_overlaps", "run_demo"]


@dataclass(frozen=True, slots=True)
class Holding:
    """One interval during which ``owner`` believed it held ``key`` (monotonic seconds)."""

    key: str
    owner: str
    token: int | None
    start_s: float
    end_s: float
    how: str  # "acquired", "handed over" or "took over"
    ended: str  # "released", "transferred", "expired" (the crash)


@dataclass
class DemoReport:
    """What the demo did and what the verdict found."""

    operations: int = 0
    acquired: int = 0
    routed: int = 0
    handoffs: int = 0
    takeovers: int = 0
    releases: int = 0
    holdings: list[Holding] = field(default_factory=list)
    overlaps: list[tuple[Holding, Holding]] = field(default_factory=list)
    token_disorder: list[tuple[Holding, Holding]] = field(default_factory=list)

    @property
    def exclusive(self) -> bool:
        return not self.overlaps and not self.token_disorder


def find_overlaps(
    holdings: list[Holding],
) -> tuple[list[tuple[Holding, Holding]], list[tuple[Holding, Holding]]]:
    """Return (pairs of different owners overlapping in time, pairs whose tokens disagree
    with time order) per key."""
    overlaps: list[tuple[Holding, Holding]] = []
    disorder: list[tuple[Holding, Holding]] = []
    by_key: dict[str, list[Holding]] = collections.defaultdict(list)
    for holding in holdings:
        by_key[holding.key].append(holding)
    for items in by_key.values():
        items.sort(key=lambda h: h.start_s)
        for i, first in enumerate(items):
            for second in items[i + 1 :]:
                if second.start_s >= first.end_s:
                    break
                if second.owner != first.owner:
                    overlaps.append((first, second))
        tokened = sorted((h for h in items if h.token is not None), key=lambda h: h.token or 0)
        for earlier, later in itertools.pairwise(tokened):
            if later.token == earlier.token:
                continue
            if later.start_s < earlier.start_s:
                disorder.append((earlier, later))
    return overlaps, disorder


class _Demo:
    def __init__(
        self,
        provider: LeaseProvider,
        *,
        workers: int,
        keys: int,
        seconds: float,
        ttl_ms: int,
        on_tick: Callable[[dict[str, tuple[str | None, int | None]], float], None] | None,
    ) -> None:
        self.provider = provider
        self.keys = [f"thread-{i}" for i in range(keys)]
        self.owners = [f"worker-{i}-{uuid.uuid4().hex[:6]}" for i in range(workers)]
        self.crasher = self.owners[0]
        self.seconds = seconds
        self.ttl_ms = capabilities_of(provider).effective_ttl_ms(ttl_ms)
        self.ttl_s = self.ttl_ms / 1000
        self.on_tick = on_tick
        self.report = DemoReport()
        # Work routed to a key's owner queues its sender as a successor there.
        self.successors: dict[str, collections.deque[str]] = {
            k: collections.deque() for k in self.keys
        }
        self.views: dict[str, tuple[str | None, int | None]] = dict.fromkeys(
            self.keys, (None, None)
        )
        self.crashed_keys: set[str] = set()

    async def run(self) -> DemoReport:
        start = time.monotonic()
        self.deadline = start + self.seconds
        # The crash comes a quarter of the way in, once handoffs are under way.
        self.crash_after = start + self.seconds / 4
        tasks = [asyncio.create_task(self.worker(owner)) for owner in self.owners]
        ticker = asyncio.create_task(self.tick(start))
        try:
            await asyncio.gather(*tasks)
        finally:
            ticker.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(ticker, *tasks, return_exceptions=True)
        report = self.report
        report.overlaps, report.token_disorder = find_overlaps(report.holdings)
        return report

    async def tick(self, start: float) -> None:
        while self.on_tick is not None:
            await asyncio.sleep(0.5)
            self.on_tick(dict(self.views), time.monotonic() - start)

    async def worker(self, owner: str) -> None:
        rng = random.Random(owner)
        while time.monotonic() < self.deadline:
            key = rng.choice(self.keys)
            asked = time.monotonic()
            result = await self.provider.acquire_lease(key, owner, self.ttl_ms)
            self.report.operations += 1
            if result.acquired:
                self.report.acquired += 1
                how = "took over" if key in self.crashed_keys else "acquired"
                self.crashed_keys.discard(key)
                if owner == self.crasher and time.monotonic() >= self.crash_after:
                    await self.crash(key, owner, result.token, asked)
                    return
                await self.own(key, owner, token=result.token, granted_at=asked, how=how, rng=rng)
            else:
                # Somebody else owns the thread: route the work there and queue up.
                self.report.routed += 1
                queue = self.successors[key]
                if owner not in queue and len(queue) < 2:
                    queue.append(owner)
                await self.wait_for_handoff(key, owner, rng)

    async def own(
        self,
        key: str,
        owner: str,
        *,
        token: int | None,
        granted_at: float,
        how: str,
        rng: random.Random,
    ) -> None:
        start = time.monotonic()
        self.views[key] = (owner, token)
        for _ in range(rng.randint(1, 4)):
            await asyncio.sleep(self.ttl_s / 4)  # a slice of work on the thread
            asked = time.monotonic()
            self.report.operations += 1
            if not await self.provider.renew_lease(key, owner, self.ttl_ms):
                self.record(
                    key,
                    owner,
                    token=token,
                    start=start,
                    end=granted_at + self.ttl_s,
                    how=how,
                    ended="expired",
                )
                return
            granted_at = asked
        queue = self.successors[key]
        while queue and queue[0] == owner:
            queue.popleft()
        successor = queue.popleft() if queue else None
        ending = time.monotonic()
        end = min(ending, granted_at + self.ttl_s)
        if successor is not None and time.monotonic() < self.deadline:
            self.report.operations += 1
            if await self.provider.transfer_lease(key, owner, successor, self.ttl_ms):
                self.report.handoffs += 1
                self.record(
                    key, owner, token=token, start=start, end=end, how=how, ended="transferred"
                )
                self.views[key] = (successor, None)
                return
        self.report.operations += 1
        await self.provider.release_lease(key, owner)
        self.report.releases += 1
        self.record(key, owner, token=token, start=start, end=end, how=how, ended="released")
        self.views[key] = (None, None)

    async def wait_for_handoff(self, key: str, owner: str, rng: random.Random) -> None:
        """Wait a little for the owner to hand the thread over; take it if it comes."""
        for _ in range(4):
            await asyncio.sleep(self.ttl_s / 6 * rng.uniform(0.5, 1.5))
            self.report.operations += 1
            if await self.provider.get_lease_owner(key) == owner:
                asked = time.monotonic()
                self.report.operations += 1
                # Idempotent re-acquire: confirms the lease and reads our token.
                result = await self.provider.acquire_lease(key, owner, self.ttl_ms)
                if result.acquired:
                    await self.own(
                        key,
                        owner,
                        token=result.token,
                        granted_at=asked,
                        how="handed over",
                        rng=rng,
                    )
                return
        queue = self.successors[key]
        if owner in queue:
            queue.remove(owner)

    async def crash(self, key: str, owner: str, token: int | None, granted_at: float) -> None:
        """Hold the key and vanish without releasing, like a killed process."""
        start = time.monotonic()
        self.views[key] = (owner + " (crashed)", token)
        self.crashed_keys.add(key)
        self.record(
            key,
            owner,
            token=token,
            start=start,
            end=granted_at + self.ttl_s,
            how="acquired",
            ended="expired",
        )
        await asyncio.sleep(self.ttl_s)

    def record(
        self,
        key: str,
        owner: str,
        *,
        token: int | None,
        start: float,
        end: float,
        how: str,
        ended: str,
    ) -> None:
        if how == "took over":
            self.report.takeovers += 1
        self.report.holdings.append(Holding(key, owner, token, start, end, how, ended))


async def run_demo(
    provider: LeaseProvider,
    *,
    workers: int = 6,
    keys: int = 3,
    seconds: float = 10.0,
    ttl_ms: int = 600,
    on_tick: Callable[[dict[str, tuple[str | None, int | None]], float], None] | None = None,
) -> DemoReport:
    """Run the contention demo on ``provider`` and return the report with its verdict."""
    demo = _Demo(
        provider, workers=workers, keys=keys, seconds=seconds, ttl_ms=ttl_ms, on_tick=on_tick
    )
    return await demo.run()
