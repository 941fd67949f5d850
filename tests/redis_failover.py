"""Failovers under load through Sentinel: grants lost and fencing tokens that went back.

Shared by tests/test_redis_sentinel.py (a few failovers) and
benchmarks/failover_redis.py (twenty per mode). One round (:func:`fail_over_once`):

1. workers (tasks of one provider, made from the ``redis+sentinel://`` URL once for the
   whole run: no restart) churn leases: acquire a random key of a shared pool, keep it
   (TTL 60 s, far beyond a round), sometimes release one;
2. the replica falls behind by ``lag_s``: it is frozen (SIGSTOP) and the primary drops
   its replication link (``CLIENT KILL TYPE replica``), so nothing granted from then on
   reaches it, while the workers go on granting for ``lag_s``;
3. the primary is killed (SIGKILL) right after, the replica thawed; Sentinel promotes
   it; the killed server rejoins, empty, as the new primary's replica; the workers go
   on, through the same provider, for ``after_s``;
4. a checker acquires every key a live worker believes it holds: each one granted (to
   it, or to a worker since) is a grant lost. Every token granted is compared with
   every token granted before for the same key: one not greater is a token
   regression, unless the owner gets back the very token it was granted before. That
   happens when its release was lost with the old primary: the new primary still has
   the owner's old lease, and an acquire of one's own live lease keeps its token (the
   contract's idempotent re-acquire). Such a lease is counted as resurrected, apart:
   it is no new grant, and its token is the lower one, which fencing guards refuse.

With ``min_replicas``, a grant whose ``WAIT`` fell short raises
:class:`~leasekit.LeaseBackendTimeout` (outcome unknown): the worker does not count it
as held and undoes it (``undo_grant``), as ``hold()`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from servers import RedisSentinelGroup

import leasekit
from leasekit import LeaseBackendError, LeaseBackendTimeout

__all__ = ["FailoverTotals", "Round", "acquire_latency_ms", "fail_over_once", "run_failovers"]

TTL_MS = 60_000


@dataclass
class Round:
    """What one failover did."""

    believed: int = 0
    """Keys a live worker believed it held when the primary was killed."""
    lost: int = 0
    """Of those, how many the checker was granted after the failover."""
    regressions: list[str] = field(default_factory=list)
    """One line per grant whose token was not greater than an earlier token of its key."""
    resurrected: list[str] = field(default_factory=list)
    """Re-acquires answered with the owner's own older token: a release lost with the old
    primary brought its lease back (the same grant, not a new one; see the module doc)."""
    granted_in_lag: int = 0
    """Grants answered while the replica was behind (held: lost if the primary dies)."""
    unknown_in_lag: int = 0
    """Grants answered "outcome unknown" from the replica falling behind to its promotion."""
    grants_after: int = 0
    """Grants through the same provider after the failover."""
    failover_s: float = 0.0
    """From the kill to the first grant on the new primary."""


@dataclass
class FailoverTotals:
    """Rounds of one mode, summed."""

    mode: str
    rounds: list[Round] = field(default_factory=list)

    @property
    def believed(self) -> int:
        return sum(r.believed for r in self.rounds)

    @property
    def lost(self) -> int:
        return sum(r.lost for r in self.rounds)

    @property
    def regressions(self) -> int:
        return sum(len(r.regressions) for r in self.rounds)

    @property
    def resurrected(self) -> int:
        return sum(len(r.resurrected) for r in self.rounds)

    @property
    def failovers_losing(self) -> int:
        return sum(1 for r in self.rounds if r.lost)

    @property
    def unknown_in_lag(self) -> int:
        return sum(r.unknown_in_lag for r in self.rounds)

    @property
    def granted_in_lag(self) -> int:
        return sum(r.granted_in_lag for r in self.rounds)


class _Ledger:
    """Every token granted per key, and what each worker believes it holds."""

    def __init__(self) -> None:
        self.highest: dict[str, int] = {}
        self.highest_owner: dict[str, str] = {}
        self.tokens: dict[tuple[str, str], set[int]] = {}  # (key, owner) -> tokens answered
        self.resurrected: list[str] = []
        self.held: dict[str, tuple[str, int]] = {}  # key -> (owner, token)
        self.regressions: list[str] = []
        self.lagging = False
        self.after_failover = False
        self.granted_in_lag = 0
        self.unknown_in_lag = 0
        self.grants_after = 0
        self.first_grant_after: float | None = None
        self.believed_at_kill: dict[str, tuple[str, int]] = {}
        self.lost: set[str] = set()
        self.killed = False  # from the kill on, beliefs stand: no releases
        self.unknown: list[tuple[float, str]] = []  # (when, message) of unknown outcomes
        self.killed_at = 0.0

    def granted(self, key: str, owner: str, token: int, *, holds: bool = True) -> None:
        believed = self.believed_at_kill.get(key)
        if believed is not None and believed[0] != owner:
            self.lost.add(key)  # a live holder's key, granted to someone else
        last = self.highest.get(key)
        mine = self.tokens.setdefault((key, owner), set())
        if last is not None and token <= last:
            line = f"{key}: token {token} after {last} (to {owner})"
            if token in mine:
                # The owner's own earlier grant, back: its release was lost with the old
                # primary, and a re-acquire keeps the token of the lease it finds.
                if token != last or self.highest_owner.get(key) != owner:
                    self.resurrected.append(line)
            else:
                self.regressions.append(line)
        mine.add(token)
        if last is None or token > last:
            self.highest[key], self.highest_owner[key] = token, owner
        if holds:
            self.held[key] = (owner, token)
        if self.lagging:
            self.granted_in_lag += 1
        if self.after_failover:
            self.grants_after += 1
            if self.first_grant_after is None:
                self.first_grant_after = time.monotonic()


async def _worker(
    provider: Any, ledger: _Ledger, keys: list[str], name: str, *, stop: asyncio.Event, seed: int
) -> None:
    rng = random.Random(seed)
    mine: list[str] = []
    while not stop.is_set():
        try:
            if mine and not ledger.killed and rng.random() < 0.2:
                key = mine.pop(rng.randrange(len(mine)))
                ledger.held.pop(key, None)  # no longer believed held, whatever the answer
                await provider.release_lease(key, name)
                continue
            key = rng.choice(keys)
            if key in mine:
                continue  # a re-acquire keeps its token: not a new grant
            try:
                result = await provider.acquire_lease(key, name, TTL_MS)
            except LeaseBackendTimeout as exc:
                ledger.unknown.append((time.monotonic(), str(exc)))
                if ledger.lagging or (ledger.killed and not ledger.after_failover):
                    ledger.unknown_in_lag += 1
                provider.undo_grant(key, name)  # as hold() does: not held, undone
                continue
            if result.acquired and result.token is not None:
                if key not in mine:
                    mine.append(key)
                ledger.granted(key, name, result.token)
        except LeaseBackendError:
            await asyncio.sleep(0.02)  # the primary is gone, or no primary yet: go on
        await asyncio.sleep(0)


async def fail_over_once(
    group: RedisSentinelGroup,
    provider: Any,
    ledger: _Ledger,
    keys: list[str],
    *,
    lag_s: float,
    before_s: float = 0.3,
    after_s: float = 0.3,
    workers: int = 8,
    seed: int = 0,
) -> Round:
    """One round (see the module doc); ``ledger`` carries tokens across rounds."""
    checker = f"checker-{seed}"
    ledger.held.clear()
    ledger.believed_at_kill = {}
    ledger.lost = set()
    ledger.killed = False
    ledger.granted_in_lag = ledger.unknown_in_lag = ledger.grants_after = 0
    ledger.first_grant_after = None
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(
            _worker(provider, ledger, keys, f"w{seed}-{i}", stop=stop, seed=seed * 100 + i)
        )
        for i in range(workers)
    ]
    round_ = Round()
    try:
        # Until the workers hold keys (``workers`` of them), or before_s at the least: on
        # a loaded machine, or with min_replicas while the replica is still catching up
        # after the last round's rejoin, nothing may be granted in before_s, and a round
        # with nothing believed held proves nothing (bounded, as after the failover).
        deadline = time.monotonic() + 20.0
        await asyncio.sleep(before_s)
        while len(ledger.held) < workers and time.monotonic() < deadline:  # noqa: ASYNC110 (a count and a deadline, polled)
            await asyncio.sleep(0.05)
        # Which server is the primary now, as the sentinels say (on a loaded machine
        # they may have failed over once more on their own since the last round).
        await asyncio.to_thread(group.settle_roles)
        # The replica falls behind: frozen, and its link dropped, so nothing more reaches it.
        replica, primary = group.replica, group.primary
        replica.pause()
        primary.command("CLIENT", "KILL", "TYPE", "replica")
        ledger.lagging = True
        await asyncio.sleep(lag_s)
        ledger.killed = True
        group.kill_primary()
        ledger.lagging = False
        killed_at = ledger.killed_at = time.monotonic()
        believed = ledger.believed_at_kill = dict(ledger.held)
        round_.believed = len(believed)
        replica.resume()
        await asyncio.to_thread(group.wait_promoted)
        ledger.after_failover = True
        await asyncio.to_thread(group.rejoin)
        # The workers go on through the same provider: until each could grant once, or
        # after_s at the least (bounded, on a loaded machine).
        deadline = time.monotonic() + 20.0
        await asyncio.sleep(after_s)
        while ledger.grants_after < workers and time.monotonic() < deadline:  # noqa: ASYNC110 (a count and a deadline, polled)
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*tasks)
        ledger.after_failover = False
        # Every key believed held at the kill (no worker released one since): one that
        # a worker was granted meanwhile, or the checker is now, was lost.
        for key in believed:
            if key in ledger.lost:
                continue
            result = await _settled(provider.acquire_lease, key, checker, TTL_MS)
            if result.acquired and result.token is not None:
                ledger.granted(key, checker, result.token, holds=False)
                await _settled(provider.release_lease, key, checker)
        round_.lost = len(ledger.lost)
        if ledger.first_grant_after is not None:
            round_.failover_s = ledger.first_grant_after - killed_at
        round_.granted_in_lag = ledger.granted_in_lag
        round_.unknown_in_lag = ledger.unknown_in_lag
        round_.grants_after = ledger.grants_after
        round_.regressions = list(ledger.regressions)
        round_.resurrected = list(ledger.resurrected)
        ledger.regressions.clear()
        ledger.resurrected.clear()
        # Leave the pool free for the next round.
        for key, (owner, _token) in list(ledger.held.items()):
            await _settled(provider.release_lease, key, owner)
        ledger.believed_at_kill = {}
        return round_
    finally:
        stop.set()
        ledger.lagging = ledger.after_failover = False
        for task in tasks:
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*tasks, return_exceptions=True)
        if group.replica.paused:
            group.replica.resume()


async def _settled(call: Any, *args: Any) -> Any:
    """``call(*args)``, retried while the store fails (the new primary settling)."""
    for _ in range(100):
        try:
            return await call(*args)
        except LeaseBackendError:  # noqa: PERF203 (rare: the new primary settling)
            await asyncio.sleep(0.05)
    return await call(*args)


async def run_failovers(
    group: RedisSentinelGroup,
    *,
    failovers: int,
    min_replicas: int,
    lag_range_s: tuple[float, float] = (0.0, 0.3),
    replica_timeout_ms: int = 200,
    pool: int = 200,
    seed: int = 1,
    mode: str = "",
) -> FailoverTotals:
    """``failovers`` rounds through one provider; lag drawn from ``lag_range_s``."""
    rng = random.Random(seed)
    keys = [f"failover-{seed}-{i}" for i in range(pool)]
    ledger = _Ledger()
    totals = FailoverTotals(mode or f"min_replicas={min_replicas}")
    url = f"{group.url}?timeout_s=2&min_replicas={min_replicas}"
    url += f"&replica_timeout_ms={replica_timeout_ms}&prefix=failover-{seed}:"
    async with leasekit.connect(url) as provider:
        for index in range(failovers):
            lag = rng.uniform(*lag_range_s)
            totals.rounds.append(
                await fail_over_once(
                    group, provider, ledger, keys, lag_s=lag, seed=seed * 1000 + index
                )
            )
    return totals


async def acquire_latency_ms(url: str, *, cycles: int = 2000) -> dict[str, float]:
    """Acquire and release, one at a time, ``cycles`` times: acquire latency in ms."""
    samples: list[float] = []
    async with leasekit.connect(url) as provider:
        for i in range(cycles):
            key = f"latency-{i % 50}"
            start = time.perf_counter()
            await provider.acquire_lease(key, "latency", 30_000)
            samples.append((time.perf_counter() - start) * 1000)
            await provider.release_lease(key, "latency")
    samples.sort()
    return {
        "p50": statistics.median(samples),
        "p99": samples[int(len(samples) * 0.99) - 1],
        "mean": statistics.fmean(samples),
    }
