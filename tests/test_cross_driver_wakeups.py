"""A blocking provider's release wakes the async waiters of the same store.

Flask or Celery code releases through :mod:`leasekit.sync` (the backend's native
blocking provider) while an asyncio service waits for the same key: the release must
notify, as the async provider's own does, or the waiter sleeps until its next look
(up to the holder's TTL). Each waiter here paces its polls and its periodic re-looks on
a clock that never moves, so only the release's notification can wake it; the bound on
the wait only ends a failing run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import leasekit
import leasekit.sync
from leasekit.testing import FakeClock

LONG_TTL_MS = 60_000
FAILING_RUN_S = 30.0  # far beyond a notification's milliseconds; only bounds a failure


@pytest.fixture(params=["redis", "postgres"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A URL of a store whose blocking and async providers both exist, keys of its own."""
    if request.param == "redis":
        redis_url: str = request.getfixturevalue("redis_url")
        prefix: str = request.getfixturevalue("redis_prefix")
        yield f"{redis_url}{'&' if '?' in redis_url else '?'}prefix={prefix}"
    else:
        postgres_url: str = request.getfixturevalue("postgres_url")
        table: str = request.getfixturevalue("postgres_table")
        yield f"{postgres_url}{'&' if '?' in postgres_url else '?'}table={table}"


def test_the_store_offers_both_drivers_and_notifications(url: str) -> None:
    with leasekit.sync.connect(url) as leases:
        assert leases.native  # the backend's own blocking provider, not the loop thread
        assert leases.capabilities.release_notifications


@pytest.mark.anyio
async def test_a_blocking_release_wakes_an_async_waiter(url: str) -> None:
    with leasekit.sync.connect(url) as leases:
        assert leases.acquire_lease("k", "blocking", LONG_TTL_MS).acquired
        async with leasekit.connect(url) as provider:
            subscribed = asyncio.Event()
            watch_release = provider.watch_release  # type: ignore[attr-defined]

            async def watching(key: str) -> Any:
                watch = await watch_release(key)
                subscribed.set()  # listening from here on
                return watch

            provider.watch_release = watching  # type: ignore[attr-defined]
            waiting = asyncio.ensure_future(
                leasekit.wait_for(
                    provider, "k", "async", LONG_TTL_MS, timeout_s=None, clock=FakeClock()
                )
            )
            await asyncio.wait_for(subscribed.wait(), FAILING_RUN_S)
            assert not waiting.done()  # denied: the key is the blocking holder's
            await asyncio.to_thread(leases.release_lease, "k", "blocking")
            result = await asyncio.wait_for(waiting, FAILING_RUN_S)
            assert (result.acquired, result.owner) == (True, "async")
            assert leases.get_lease_owner("k") == "async"
            await provider.release_lease("k", "async")
