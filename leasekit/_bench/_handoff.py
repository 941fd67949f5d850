"""The "handoff" benchmark: how soon a waiter holds a key after its holder lets go.

Three measures per URL, each with leasekit's notifications and with notifications
hidden (today's polling), side by side in one run:

- **handoff**: a waiter is already in ``wait_for()`` when the holder releases at t0;
  the waiter holds the key at t1. p50/p99 of t1 - t0.
- **takeover**: the holder dies (never releases); t1 - (grant + ttl), where grant is
  when the holder's acquire returned. Positive: after the TTL, as it must be.
- **waiting load**: 50 waiters wait on one held key for a few seconds; the requests
  they send to the store per second (counted at the provider boundary: every
  operation is one request).
- **observer**: ``watch_owner()`` (its default ``poll_s``) watches a free key; another
  owner's acquire starts at t0, and the observer yields that owner at t1. p50/p99 of
  t1 - t0: how stale routing to a new owner is (grant notifications against polling).

The peer libraries measured beside leasekit are the URL scheme's
:attr:`~leasekit.bench.SchemeBench.handoff_peers`, from its bench plugin, when
installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from .. import connect, wait_for, watch_owner
from .._capabilities import capabilities_of
from .._contract import LeaseResult
from .._registry import scheme_of
from ..backend import redact_url
from ._model import DEFAULT_TTL_MS, BenchTarget
from ._schemes import scheme_bench

__all__ = ["HandoffReport", "run_handoff"]


class _Counting:
    """A provider that counts what it sends, and can hide release notifications."""

    def __init__(self, inner: Any, *, notifications: bool) -> None:
        self._inner = inner
        caps = capabilities_of(inner)
        self.capabilities = (
            caps
            if notifications
            else replace(caps, release_notifications=False, grant_notifications=False)
        )
        self.requests = 0
        if notifications and caps.release_notifications:
            self.watch_release = inner.watch_release
        if notifications and callable(getattr(inner, "lease_remaining_ms", None)):
            self.lease_remaining_ms = self._remaining

    async def _remaining(self, key: str) -> int | None:
        self.requests += 1
        result: int | None = await self._inner.lease_remaining_ms(key)
        return result

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        self.requests += 1
        result: LeaseResult = await self._inner.acquire_lease(key, owner, ttl_ms)
        return result

    async def get_lease_owner(self, key: str) -> str | None:
        self.requests += 1
        owner: str | None = await self._inner.get_lease_owner(key)
        return owner

    async def release_lease(self, key: str, owner: str) -> None:
        self.requests += 1
        await self._inner.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        self.requests += 1
        renewed: bool = await self._inner.renew_lease(key, owner, ttl_ms)
        return renewed

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        self.requests += 1
        moved: bool = await self._inner.transfer_lease(key, from_owner, to_owner, ttl_ms)
        return moved


@dataclass
class Measure:
    """One contender's numbers: latencies in ms, waiting load in requests/s per waiter."""

    contender: str
    handoff_ms: list[float] = field(default_factory=list)
    takeover_ms: list[float] = field(default_factory=list)
    load_per_waiter: float | None = None
    observe_ms: list[float] = field(default_factory=list)

    @staticmethod
    def _pct(values: list[float], q: float) -> float | None:
        if not values:
            return None
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    def row(self) -> dict[str, Any]:
        return {
            "contender": self.contender,
            "handoff_p50_ms": self._pct(self.handoff_ms, 0.5),
            "handoff_p99_ms": self._pct(self.handoff_ms, 0.99),
            "takeover_p50_ms": self._pct(self.takeover_ms, 0.5),
            "takeover_max_ms": max(self.takeover_ms) if self.takeover_ms else None,
            "waiting_requests_per_s_per_waiter": self.load_per_waiter,
            "observe_p50_ms": self._pct(self.observe_ms, 0.5),
            "observe_p99_ms": self._pct(self.observe_ms, 0.99),
            "rounds": len(self.handoff_ms),
        }


@dataclass
class HandoffReport:
    url: str
    measures: list[Measure]

    def rows(self) -> list[dict[str, Any]]:
        return [measure.row() for measure in self.measures]


async def _leasekit_measure(
    url: str, *, notifications: bool, handoffs: int, takeovers: int, load_s: float
) -> Measure:
    label = "leasekit, notifications" if notifications else "leasekit, polling"
    measure = Measure(label)
    async with connect(url) as inner:
        provider = _Counting(inner, notifications=notifications)
        caps = capabilities_of(inner)
        ns = f"leasekit-bench-handoff:{time.time_ns()}:{int(notifications)}"
        for index in range(handoffs):
            key = f"{ns}:h{index}"
            await provider.acquire_lease(key, "holder", 30_000)
            done = asyncio.get_running_loop().create_future()

            async def wait(key: str = key, done: asyncio.Future[float] = done) -> None:
                await wait_for(provider, key, "waiter", 30_000, 30.0)
                done.set_result(time.perf_counter())

            task = asyncio.ensure_future(wait())
            await asyncio.sleep(0.02)  # the waiter is denied and waiting by then
            t0 = time.perf_counter()
            await provider.release_lease(key, "holder")
            t1 = await done
            await task
            measure.handoff_ms.append((t1 - t0) * 1000)
            await provider.release_lease(key, "waiter")
        ttl_ms = caps.effective_ttl_ms(max(200, caps.min_ttl_ms))
        for index in range(takeovers):
            key = f"{ns}:t{index}"
            await provider.acquire_lease(key, "dead", ttl_ms)
            granted = time.perf_counter()
            await wait_for(provider, key, "waiter", 30_000, 60.0)
            measure.takeover_ms.append((time.perf_counter() - granted) * 1000 - ttl_ms)
            await provider.release_lease(key, "waiter")
        key = f"{ns}:load"
        await provider.acquire_lease(key, "holder", 60_000)
        waiters = [
            asyncio.ensure_future(wait_for(provider, key, f"w{n}", 30_000, load_s + 5))
            for n in range(50)
        ]
        await asyncio.sleep(0.5)  # past the first looks and subscriptions
        before = provider.requests
        await asyncio.sleep(load_s)
        measure.load_per_waiter = (provider.requests - before) / load_s / 50
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        await provider.release_lease(key, "holder")
        # Polling pays up to poll_s per round: fewer rounds there.
        rounds = handoffs if notifications and caps.grant_notifications else min(handoffs, 20)
        measure.observe_ms = await _observe(provider, f"{ns}:o", rounds)
    return measure


async def _observe(provider: Any, key: str, rounds: int) -> list[float]:
    """Latencies (ms) from the start of an acquire to watch_owner() yielding its owner."""
    seen: asyncio.Queue[tuple[str | None, float]] = asyncio.Queue()

    async def observe() -> None:
        async for owner in watch_owner(provider, key):
            seen.put_nowait((owner, time.perf_counter()))

    async def next_seen(wanted: str | None) -> float:
        while True:
            owner, at = await asyncio.wait_for(seen.get(), 30.0)
            if owner == wanted:
                return at

    observer = asyncio.ensure_future(observe())
    latencies = []
    try:
        await next_seen(None)
        for index in range(rounds):
            owner = f"o{index}"
            t0 = time.perf_counter()
            await provider.acquire_lease(key, owner, 30_000)
            latencies.append((await next_seen(owner) - t0) * 1000)
            await provider.release_lease(key, owner)
            await next_seen(None)
    finally:
        observer.cancel()
        await asyncio.gather(observer, return_exceptions=True)
    return latencies


async def _measure_all(
    url: str, handoffs: int, takeovers: int, load_s: float, peers: bool
) -> list[Measure]:
    measures = [
        await _leasekit_measure(
            url, notifications=flag, handoffs=handoffs, takeovers=takeovers, load_s=load_s
        )
        for flag in (True, False)
    ]
    if peers:
        # The scheme's bench plugin owns its peers, as it owns the cycle benchmark's.
        target = BenchTarget(url, DEFAULT_TTL_MS, f"leasekit-bench-handoff-{uuid.uuid4().hex[:12]}")
        measures.extend(
            [
                Measure(peer.label, await peer.measure(target, handoffs))
                for peer in scheme_bench(scheme_of(url)).handoff_peers
                if not peer.missing()
            ]
        )
    return measures


def run_handoff(
    url: str,
    *,
    handoffs: int = 200,
    takeovers: int = 10,
    load_s: float = 5.0,
    peers: bool = True,
) -> HandoffReport:
    """Measure handoff, takeover and waiting load on ``url``; see the module docstring."""
    coroutine = _measure_all(url, handoffs, takeovers, load_s, peers)
    with contextlib.closing(asyncio.new_event_loop()) as loop:
        return HandoffReport(url, loop.run_until_complete(coroutine))


def format_report(report: HandoffReport) -> str:
    """A plain table of the report, one line per contender."""
    lines = [
        f"handoff on {redact_url(report.url)}",
        f"{'contender':40} {'p50 ms':>8} {'p99 ms':>8} {'takeover p50':>13} "
        f"{'req/s/waiter':>13} {'observer p50':>13} {'observer p99':>13}",
    ]

    def show(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines.extend(
        f"{row['contender']:40} {show(row['handoff_p50_ms']):>8} "
        f"{show(row['handoff_p99_ms']):>8} {show(row['takeover_p50_ms']):>13} "
        f"{show(row['waiting_requests_per_s_per_waiter']):>13} "
        f"{show(row['observe_p50_ms']):>13} {show(row['observe_p99_ms']):>13}"
        for row in report.rows()
    )
    return "\n".join(lines)
