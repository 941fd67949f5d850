"""Waiting without polling: wake-ups on the memory provider, watch_owner, elect, leaders.

Wait times are set so that polling could not pass (a poll interval far longer than
the generous bound each step gets), so a pass shows the wake-up path was taken; the
bounds themselves are loose on purpose (loaded 2-core machines).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import leasekit
from leasekit import Capabilities, LeaseHeld, LeaseResult, MemoryLeaseProvider

pytestmark = pytest.mark.anyio

SLOW_POLL_S = 60.0  # polling this slowly would fail every test here
BOUND_S = 20.0  # a wake-up that must come arrives well within this


class CountingProvider:
    """The memory provider, counting the acquires and owner lookups that reach it."""

    def __init__(self, inner: MemoryLeaseProvider) -> None:
        self.inner = inner
        self.capabilities: Capabilities = inner.capabilities
        self.acquires = 0
        self.lookups = 0

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        self.acquires += 1
        return await self.inner.acquire_lease(key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        self.lookups += 1
        return await self.inner.get_lease_owner(key)

    async def release_lease(self, key: str, owner: str) -> None:
        await self.inner.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return await self.inner.renew_lease(key, owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)

    async def watch_release(self, key: str, *, grants: bool = False) -> Any:
        return await self.inner.watch_release(key, grants=grants)

    async def lease_remaining_ms(self, key: str) -> int | None:
        return await self.inner.lease_remaining_ms(key)


async def test_a_waiter_takes_a_released_key_without_polling() -> None:
    provider = CountingProvider(MemoryLeaseProvider())
    await provider.acquire_lease("k", "alice", 60_000)
    waiter = asyncio.ensure_future(
        leasekit.wait_for(provider, "k", "bob", 60_000, None, poll_s=SLOW_POLL_S)
    )
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiter.done()
    waiting_acquires = provider.acquires
    await asyncio.sleep(0.2)
    assert provider.acquires == waiting_acquires  # no polling while the key is held
    await provider.release_lease("k", "alice")
    result = await asyncio.wait_for(waiter, BOUND_S)
    assert result.acquired
    assert result.owner == "bob"
    # The first try, one more once subscribed, one after the release.
    assert provider.acquires <= 4


async def test_a_waiter_takes_a_dead_holders_key_at_its_expiry() -> None:
    provider = MemoryLeaseProvider()
    await provider.acquire_lease("k", "dead", 300)
    result = await asyncio.wait_for(
        leasekit.wait_for(provider, "k", "bob", 60_000, None, poll_s=SLOW_POLL_S), BOUND_S
    )
    assert result.owner == "bob"


async def test_a_transfer_wakes_waiters_who_are_denied_again() -> None:
    provider = CountingProvider(MemoryLeaseProvider())
    await provider.acquire_lease("k", "alice", 60_000)
    waiter = asyncio.ensure_future(
        leasekit.wait_for(provider, "k", "bob", 60_000, 30.0, poll_s=SLOW_POLL_S)
    )
    for _ in range(20):
        await asyncio.sleep(0)
    before = provider.acquires
    assert await provider.transfer_lease("k", "alice", "carol", 60_000)
    for _ in range(20):
        await asyncio.sleep(0)
    assert provider.acquires == before + 1  # woken, looked once, denied (carol holds it)
    assert not waiter.done()
    await provider.release_lease("k", "carol")
    assert (await asyncio.wait_for(waiter, BOUND_S)).owner == "bob"


class RefusingProvider(CountingProvider):
    """Declares notifications, but the store refuses every subscription."""

    async def watch_release(self, key: str, *, grants: bool = False) -> Any:
        raise leasekit.LeaseBackendError("subscription refused", backend="test", key=key)


async def test_a_refused_subscription_degrades_to_polling() -> None:
    provider = RefusingProvider(MemoryLeaseProvider())
    await provider.acquire_lease("k", "alice", 60_000)
    with pytest.raises(LeaseHeld) as info:  # not the refusal
        await leasekit.wait_for(provider, "k", "bob", 60_000, 0.2, poll_s=0.01)
    assert info.value.holder == "alice"
    assert provider.acquires >= 2  # it looked again after the refusal
    waiter = asyncio.ensure_future(
        leasekit.wait_for(provider, "k", "bob", 60_000, None, poll_s=0.01, max_poll_s=0.02)
    )
    await asyncio.sleep(0.05)
    await provider.release_lease("k", "alice")
    assert (await asyncio.wait_for(waiter, BOUND_S)).owner == "bob"


async def test_wait_for_times_out_with_lease_held_naming_the_holder() -> None:
    provider = MemoryLeaseProvider()
    await provider.acquire_lease("k", "alice", 60_000)
    with pytest.raises(LeaseHeld) as info:
        await leasekit.wait_for(provider, "k", "bob", 1000, 0.05)
    assert info.value.holder == "alice"


async def test_hold_with_wait_s_is_woken_by_the_release() -> None:
    provider = MemoryLeaseProvider()
    await provider.acquire_lease("k", "alice", 60_000)

    async def take() -> int | None:
        async with leasekit.hold(provider, "k", "bob", 60_000, wait_s=BOUND_S) as lease:
            return lease.token

    taker = asyncio.ensure_future(take())
    for _ in range(20):
        await asyncio.sleep(0)
    await provider.release_lease("k", "alice")
    assert isinstance(await asyncio.wait_for(taker, BOUND_S), int)


async def test_watch_owner_yields_each_owner_in_turn() -> None:
    provider = MemoryLeaseProvider()
    changes = leasekit.watch_owner(provider, "k", poll_s=0.01)
    try:
        assert await anext(changes) is None
        await provider.acquire_lease("k", "alice", 60_000)
        assert await asyncio.wait_for(anext(changes), BOUND_S) == "alice"
        await provider.transfer_lease("k", "alice", "bob", 60_000)
        assert await asyncio.wait_for(anext(changes), BOUND_S) == "bob"
        await provider.release_lease("k", "bob")
        assert await asyncio.wait_for(anext(changes), BOUND_S) is None
    finally:
        await changes.aclose()


async def test_watch_owner_sees_a_held_key_change_without_polling() -> None:
    provider = CountingProvider(MemoryLeaseProvider())
    await provider.acquire_lease("k", "alice", 60_000)
    changes = leasekit.watch_owner(provider, "k", poll_s=SLOW_POLL_S)
    try:
        assert await anext(changes) == "alice"
        lookups = provider.lookups
        await asyncio.sleep(0.2)
        nxt = asyncio.ensure_future(anext(changes))
        await asyncio.sleep(0.05)
        assert provider.lookups <= lookups + 1  # waiting, not polling
        await provider.transfer_lease("k", "alice", "bob", 60_000)
        assert await asyncio.wait_for(nxt, BOUND_S) == "bob"
    finally:
        await changes.aclose()


async def test_watch_owner_sees_a_grant_of_a_free_key_without_polling() -> None:
    # Before grant notifications, a free key was looked at every poll_s: at 60 s this
    # waited a minute for the grant.
    provider = CountingProvider(MemoryLeaseProvider())
    changes = leasekit.watch_owner(provider, "k", poll_s=SLOW_POLL_S)
    try:
        assert await anext(changes) is None
        nxt = asyncio.ensure_future(anext(changes))
        await asyncio.sleep(0.05)
        lookups = provider.lookups
        await asyncio.sleep(0.2)
        assert provider.lookups == lookups  # waiting for a hint, not polling
        await provider.acquire_lease("k", "alice", 60_000)
        assert await asyncio.wait_for(nxt, BOUND_S) == "alice"
    finally:
        await changes.aclose()


async def test_an_observer_of_elect_sees_every_leader_in_turn() -> None:
    # The reproduction: two candidates taking 100 ms turns, observed with the
    # default poll_s; the observer used to report [None, 'c2', None], missing c1.
    provider = MemoryLeaseProvider()
    seen: list[str | None] = []
    started = asyncio.Event()
    done = asyncio.Event()

    async def observe() -> None:
        async for leader in leasekit.leaders(provider, "group"):
            seen.append(leader)
            started.set()
            if leader == "c2":
                done.set()

    async def candidate(name: str) -> None:
        async with leasekit.elect(provider, "group", name, 60_000, timeout_s=BOUND_S):
            await asyncio.sleep(0.1)

    observer = asyncio.ensure_future(observe())
    await asyncio.wait_for(started.wait(), BOUND_S)
    await candidate("c1")
    await candidate("c2")
    await asyncio.wait_for(done.wait(), BOUND_S)
    observer.cancel()
    await asyncio.gather(observer, return_exceptions=True)
    assert [leader for leader in seen if leader is not None] == ["c1", "c2"], seen


async def test_a_grant_hint_wakes_only_watchers_that_asked_for_grants() -> None:
    # Acquirers waiting for a release are not sent to be denied by every grant.
    provider = MemoryLeaseProvider()
    for_release = await provider.watch_release("k")
    for_grants = await provider.watch_release("k", grants=True)
    try:
        await provider.acquire_lease("k", "alice", 60_000)
        assert await for_grants.wait(BOUND_S)
        assert not await for_release.wait(0)
        await provider.release_lease("k", "alice")
        assert await for_release.wait(BOUND_S)
        assert await for_grants.wait(BOUND_S)
    finally:
        for_release.close()
        for_grants.close()


async def test_watch_owner_polls_where_there_are_no_notifications(tmp_path: Any) -> None:
    async with leasekit.connect(f"sqlite:///{tmp_path}/leases.db") as provider:
        assert not provider.capabilities.release_notifications
        changes = leasekit.watch_owner(provider, "k", poll_s=0.01)
        try:
            assert await anext(changes) is None
            await provider.acquire_lease("k", "alice", 60_000)
            assert await asyncio.wait_for(anext(changes), BOUND_S) == "alice"
            await provider.release_lease("k", "alice")
            assert await asyncio.wait_for(anext(changes), BOUND_S) is None
        finally:
            await changes.aclose()


async def test_elect_hands_leadership_to_the_next_candidate_when_the_leader_resigns() -> None:
    provider = MemoryLeaseProvider()
    order: list[str] = []
    first_leads = asyncio.Event()
    resign = asyncio.Event()
    a_seen = asyncio.Event()
    b_seen = asyncio.Event()

    async def candidate(name: str) -> None:
        async with leasekit.elect(provider, "scheduler", name, 60_000) as term:
            assert term.owner == name
            order.append(name)
            first_leads.set()
            await (resign if name == "a" else b_seen).wait()

    observed: list[str | None] = []

    async def observe() -> None:
        async for leader in leasekit.leaders(provider, "scheduler", poll_s=0.01):
            observed.append(leader)
            if leader == "a":
                a_seen.set()
            if leader == "b":
                b_seen.set()
                return

    observer = asyncio.ensure_future(observe())
    a = asyncio.ensure_future(candidate("a"))
    await asyncio.wait_for(first_leads.wait(), BOUND_S)
    b = asyncio.ensure_future(candidate("b"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert order == ["a"]
    assert not b.done()
    await asyncio.wait_for(a_seen.wait(), BOUND_S)
    resign.set()
    await asyncio.wait_for(asyncio.gather(a, b, observer), BOUND_S)
    assert order == ["a", "b"]
    assert observed in (["a", "b"], [None, "a", "b"], ["a", None, "b"], [None, "a", None, "b"])


async def test_elect_with_a_timeout_raises_lease_held() -> None:
    provider = MemoryLeaseProvider()
    await provider.acquire_lease("scheduler", "a", 60_000)
    with pytest.raises(LeaseHeld):
        async with leasekit.elect(provider, "scheduler", "b", 60_000, timeout_s=0.05):
            pass


@pytest.mark.parametrize("bad", [0, -1, float("nan"), True, "1"])
async def test_watch_owner_validates_poll_s(bad: object) -> None:
    changes = leasekit.watch_owner(MemoryLeaseProvider(), "k", poll_s=bad)  # type: ignore[arg-type]
    with pytest.raises(leasekit.InvalidLeaseArgument, match="poll_s"):
        await anext(changes)


async def test_sqlite_waiters_take_a_dead_holders_key_at_its_expiry_not_the_next_poll(
    tmp_path: Any,
) -> None:
    async with leasekit.connect(f"sqlite:///{tmp_path}/leases.db") as provider:
        assert await provider.lease_remaining_ms("k") is None  # type: ignore[attr-defined]
        await provider.acquire_lease("k", "dead", 400)
        remaining = await provider.lease_remaining_ms("k")  # type: ignore[attr-defined]
        assert 0 < remaining <= 400
        # Polling alone would first sleep 30 to 60 s (poll_s=60, jittered), past BOUND_S;
        # the remaining time caps each pause, so the key is taken once the lease runs out.
        result = await asyncio.wait_for(
            leasekit.wait_for(
                provider, "k", "bob", 60_000, None, poll_s=SLOW_POLL_S, max_poll_s=SLOW_POLL_S
            ),
            BOUND_S,
        )
        assert result.owner == "bob"
