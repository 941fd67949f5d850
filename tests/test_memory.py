"""The memory:// provider against every row of the contract table (docs/contract.md).

Expiry is driven by a fake monotonic clock, so no assertion depends on how fast the
machine is; two small real-sleep tests check the default clock with wide margins.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel
import pytest

import leasekit
from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseError,
    LeaseProviderClosed,
    LeaseResult,
    MemoryLeaseProvider,
    capabilities_of,
)

pytestmark = pytest.mark.anyio


class FakeClock:
    """A monotonic nanosecond clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now_ns = 5 * 10**15  # far from zero, like a real monotonic clock

    def __call__(self) -> int:
        return self.now_ns

    def advance_ms(self, ms: int) -> None:
        self.now_ns += ms * 1_000_000


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def provider(clock: FakeClock) -> MemoryLeaseProvider:
    return MemoryLeaseProvider(clock_ns=clock)


async def token_of(provider: MemoryLeaseProvider, key: str, owner: str) -> int | None:
    """The holder's token, read through the contract: a same-owner re-acquire keeps it."""
    result = await provider.acquire_lease(key, owner, 10_000)
    assert result.acquired, f"{owner!r} does not hold {key!r}"
    return result.token


# -- acquire ---------------------------------------------------------------------


async def test_acquire_free_key(provider: MemoryLeaseProvider) -> None:
    result = await provider.acquire_lease("k", "a", 1_000)
    assert result.acquired is True
    assert result.owner == "a"
    assert isinstance(result.token, int)
    assert result.token > 0
    assert await provider.get_lease_owner("k") == "a"


async def test_acquire_expired_key(provider: MemoryLeaseProvider, clock: FakeClock) -> None:
    first = await provider.acquire_lease("k", "a", 100)
    clock.advance_ms(100)
    second = await provider.acquire_lease("k", "b", 100)
    assert second.acquired
    assert second.owner == "b"
    assert first.token is not None
    assert second.token is not None
    assert second.token > first.token


async def test_lease_is_live_until_expiry_and_free_at_expiry(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    await provider.acquire_lease("k", "a", 100)
    clock.now_ns += 100 * 1_000_000 - 1
    assert await provider.get_lease_owner("k") == "a"
    assert await provider.acquire_lease("k", "b", 100) == LeaseResult(False, "a", None)
    clock.now_ns += 1
    assert await provider.get_lease_owner("k") is None


async def test_reacquire_by_holder_is_idempotent_keeps_token_and_resets_ttl(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    first = await provider.acquire_lease("k", "a", 100)
    clock.advance_ms(90)
    again = await provider.acquire_lease("k", "a", 100)
    assert again == LeaseResult(True, "a", first.token)
    clock.advance_ms(90)  # 180 ms after the first acquire: only the reset keeps it alive
    assert await provider.get_lease_owner("k") == "a"
    clock.advance_ms(10)  # exactly 100 ms after the re-acquire
    assert await provider.get_lease_owner("k") is None


async def test_reacquire_sets_the_new_ttl_even_when_shorter(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    await provider.acquire_lease("k", "a", 60_000)
    await provider.acquire_lease("k", "a", 10)
    clock.advance_ms(10)
    assert await provider.get_lease_owner("k") is None


async def test_denied_acquire_reports_holder_and_changes_nothing(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    held = await provider.acquire_lease("k", "a", 100)
    clock.advance_ms(50)
    denied = await provider.acquire_lease("k", "b", 100)
    assert denied == LeaseResult(False, "a", None)
    assert await provider.get_lease_owner("k") == "a"
    clock.advance_ms(50)  # the denied attempt did not extend a's lease
    assert await provider.get_lease_owner("k") is None
    later = await provider.acquire_lease("k", "a", 100)
    assert later.token is not None
    assert held.token is not None
    assert later.token > held.token  # a fresh lease, not the old one revived


# -- get_lease_owner ---------------------------------------------------------------


async def test_get_owner_of_never_used_key_is_none(provider: MemoryLeaseProvider) -> None:
    assert await provider.get_lease_owner("never") is None
    assert provider._store.leases == {}


async def test_get_owner_is_per_key(provider: MemoryLeaseProvider) -> None:
    await provider.acquire_lease("k1", "a", 1_000)
    await provider.acquire_lease("k2", "b", 1_000)
    assert await provider.get_lease_owner("k1") == "a"
    assert await provider.get_lease_owner("k2") == "b"
    assert await provider.get_lease_owner("k3") is None


# -- release -----------------------------------------------------------------------


async def test_release_by_holder_frees_at_once(provider: MemoryLeaseProvider) -> None:
    held = await provider.acquire_lease("k", "a", 60_000)
    await provider.release_lease("k", "a")
    assert await provider.get_lease_owner("k") is None
    taken = await provider.acquire_lease("k", "b", 60_000)
    assert taken.acquired
    assert taken.token is not None
    assert held.token is not None
    assert taken.token > held.token


async def test_release_by_non_owner_is_a_noop(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    held = await provider.acquire_lease("k", "a", 100)
    clock.advance_ms(50)
    await provider.release_lease("k", "b")
    assert await provider.get_lease_owner("k") == "a"
    clock.advance_ms(49)  # expiry untouched: still a's until 100 ms
    assert await provider.get_lease_owner("k") == "a"
    assert await token_of(provider, "k", "a") == held.token


async def test_release_of_free_key_is_a_noop(provider: MemoryLeaseProvider) -> None:
    await provider.release_lease("k", "a")
    assert await provider.get_lease_owner("k") is None
    assert provider._store.leases == {}


async def test_release_after_expiry_never_disturbs_the_next_holder(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    await provider.acquire_lease("k", "a", 100)
    clock.advance_ms(100)
    await provider.acquire_lease("k", "b", 100)
    await provider.release_lease("k", "a")  # a's late release must not free b's lease
    assert await provider.get_lease_owner("k") == "b"


# -- renew -------------------------------------------------------------------------


async def test_renew_by_holder_resets_ttl_and_keeps_token(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    held = await provider.acquire_lease("k", "a", 100)
    clock.advance_ms(90)
    assert await provider.renew_lease("k", "a", 100) is True
    clock.advance_ms(99)
    assert await provider.get_lease_owner("k") == "a"
    assert await token_of(provider, "k", "a") == held.token
    assert await provider.renew_lease("k", "a", 100)
    clock.advance_ms(100)
    assert await provider.get_lease_owner("k") is None


async def test_renew_by_non_holder_is_false_and_changes_nothing(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    held = await provider.acquire_lease("k", "a", 100)
    clock.advance_ms(50)
    assert await provider.renew_lease("k", "b", 10_000) is False
    assert await provider.get_lease_owner("k") == "a"
    clock.advance_ms(50)  # a's expiry was not extended by b's attempt
    assert await provider.get_lease_owner("k") is None
    assert held.acquired


async def test_renew_of_free_key_is_false_and_creates_nothing(
    provider: MemoryLeaseProvider,
) -> None:
    assert await provider.renew_lease("k", "a", 1_000) is False
    assert await provider.get_lease_owner("k") is None
    assert provider._store.leases == {}


async def test_renew_after_expiry_is_false(provider: MemoryLeaseProvider, clock: FakeClock) -> None:
    await provider.acquire_lease("k", "a", 100)
    clock.advance_ms(100)
    assert await provider.renew_lease("k", "a", 100) is False
    assert await provider.get_lease_owner("k") is None
    assert (await provider.acquire_lease("k", "b", 100)).acquired


# -- transfer ----------------------------------------------------------------------


async def test_transfer_by_holder_hands_over_with_fresh_ttl_and_new_token(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    await provider.acquire_lease("k", "a", 100)
    clock.advance_ms(90)
    assert await provider.transfer_lease("k", "a", "b", 100) is True
    assert await provider.get_lease_owner("k") == "b"
    # The old holder lost every right to it.
    assert await provider.renew_lease("k", "a", 100) is False
    assert await provider.acquire_lease("k", "a", 100) == LeaseResult(False, "b", None)
    await provider.release_lease("k", "a")
    assert await provider.get_lease_owner("k") == "b"
    # Fresh TTL for b, counted from the transfer.
    clock.advance_ms(99)
    assert await provider.get_lease_owner("k") == "b"
    clock.advance_ms(1)
    assert await provider.get_lease_owner("k") is None


async def test_transfer_issues_a_strictly_greater_token(provider: MemoryLeaseProvider) -> None:
    held = await provider.acquire_lease("k", "a", 10_000)
    assert await provider.transfer_lease("k", "a", "b", 10_000)
    new_token = await token_of(provider, "k", "b")
    assert held.token is not None
    assert new_token is not None
    assert new_token > held.token


async def test_transfer_by_non_holder_is_false_and_changes_nothing(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    held = await provider.acquire_lease("k", "a", 100)
    clock.advance_ms(50)
    assert await provider.transfer_lease("k", "b", "c", 10_000) is False
    assert await provider.get_lease_owner("k") == "a"
    assert await provider.transfer_lease("k", "b", "a", 10_000) is False
    clock.advance_ms(49)
    assert await provider.get_lease_owner("k") == "a"
    assert await token_of(provider, "k", "a") == held.token


async def test_transfer_of_free_key_is_false(provider: MemoryLeaseProvider) -> None:
    assert await provider.transfer_lease("k", "a", "b", 1_000) is False
    assert await provider.get_lease_owner("k") is None
    assert provider._store.leases == {}


async def test_transfer_after_expiry_is_false(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    await provider.acquire_lease("k", "a", 100)
    clock.advance_ms(100)
    assert await provider.transfer_lease("k", "a", "b", 100) is False
    assert await provider.get_lease_owner("k") is None
    assert (await provider.acquire_lease("k", "c", 100)).acquired


async def test_transfer_to_same_owner_is_renew(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    held = await provider.acquire_lease("k", "a", 100)
    clock.advance_ms(90)
    assert await provider.transfer_lease("k", "a", "a", 100) is True
    clock.advance_ms(99)
    assert await provider.get_lease_owner("k") == "a"
    assert await token_of(provider, "k", "a") == held.token  # unchanged, as with renew


async def test_transfer_to_same_owner_after_expiry_is_false(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    await provider.acquire_lease("k", "a", 100)
    clock.advance_ms(100)
    assert await provider.transfer_lease("k", "a", "a", 100) is False
    assert await provider.get_lease_owner("k") is None


# -- names: NUL, non-ASCII, exact round trip ---------------------------------------

ODD_NAMES = [
    pytest.param("resource\0thread", id="embedded-NUL"),
    pytest.param("\0", id="only-NUL"),
    pytest.param("\0\0", id="two-NULs"),
    pytest.param("ключ", id="cyrillic"),
    pytest.param("鍵🔑", id="cjk-emoji"),
    pytest.param("e\u0301", id="combining-mark"),
    pytest.param("€" * 341 + "a", id="1024-bytes"),
    pytest.param("\U0010ffff", id="highest-code-point"),
]


@pytest.mark.parametrize("name", ODD_NAMES)
async def test_odd_keys_and_owners_round_trip_exactly(
    provider: MemoryLeaseProvider, name: str
) -> None:
    result = await provider.acquire_lease(name, name, 10_000)
    assert result.acquired
    assert result.owner == name
    assert await provider.get_lease_owner(name) == name
    denied = await provider.acquire_lease(name, "other", 10_000)
    assert denied.owner == name
    assert await provider.renew_lease(name, name, 10_000)
    assert await provider.transfer_lease(name, name, "next", 10_000)
    assert await provider.get_lease_owner(name) == "next"
    assert (await provider.acquire_lease("other-key", name, 10_000)).owner == name


async def test_keys_differing_only_after_nul_or_by_normalization_are_distinct(
    provider: MemoryLeaseProvider,
) -> None:
    await provider.acquire_lease("thread\0one", "a", 10_000)
    assert await provider.get_lease_owner("thread\0two") is None
    assert await provider.get_lease_owner("thread") is None
    # No Unicode normalization: composed and decomposed "é" are different keys.
    await provider.acquire_lease("\u00e9", "composed", 10_000)
    assert (await provider.acquire_lease("e\u0301", "decomposed", 10_000)).acquired
    assert await provider.get_lease_owner("\u00e9") == "composed"
    assert await provider.get_lease_owner("e\u0301") == "decomposed"


async def test_owners_are_compared_exactly(provider: MemoryLeaseProvider) -> None:
    await provider.acquire_lease("k", "a\0", 10_000)
    assert await provider.acquire_lease("k", "a", 10_000) == LeaseResult(False, "a\0", None)
    assert await provider.renew_lease("k", "a", 10_000) is False
    await provider.release_lease("k", "a")
    assert await provider.get_lease_owner("k") == "a\0"


# -- fencing tokens ----------------------------------------------------------------


async def test_tokens_strictly_increase_across_expiry_release_and_transfer(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    tokens: list[int | None] = []
    tokens.append((await provider.acquire_lease("k", "a", 100)).token)
    await provider.release_lease("k", "a")
    tokens.append((await provider.acquire_lease("k", "b", 100)).token)
    clock.advance_ms(100)
    tokens.append((await provider.acquire_lease("k", "c", 100)).token)
    assert await provider.transfer_lease("k", "c", "d", 100)
    tokens.append(await token_of(provider, "k", "d"))
    await provider.release_lease("k", "d")
    tokens.append((await provider.acquire_lease("k", "a", 100)).token)
    assert all(isinstance(t, int) for t in tokens)
    ints = [t for t in tokens if t is not None]
    assert ints == sorted(set(ints)), tokens


async def test_tokens_keep_increasing_after_expired_keys_are_swept(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    first = await provider.acquire_lease("k", "a", 10)
    for i in range(100):
        await provider.acquire_lease(f"other-{i}", "x", 10)
    clock.advance_ms(10)
    await provider.acquire_lease("trigger-sweep", "x", 10)
    assert "k" not in provider._store.leases  # forgotten entirely
    later = await provider.acquire_lease("k", "b", 10)
    assert first.token is not None
    assert later.token is not None
    assert later.token > first.token


def test_memory_declares_fencing_and_atomic_transfer() -> None:
    caps = capabilities_of(MemoryLeaseProvider())
    assert isinstance(caps, Capabilities)
    assert caps.fencing is True
    assert caps.atomic_transfer is True
    assert caps.shared_across_processes is False
    assert caps.persistent is False


# -- named and private stores -------------------------------------------------------


def _unique_name() -> str:
    return f"test-{uuid.uuid4().hex}"


async def test_named_store_is_shared_between_providers() -> None:
    name = _unique_name()
    one = MemoryLeaseProvider.from_url(f"memory://{name}")
    two = leasekit.connect(f"memory://{name}")
    assert (await one.acquire_lease("k", "a", 60_000)).acquired
    assert await two.get_lease_owner("k") == "a"
    assert await two.acquire_lease("k", "b", 60_000) == LeaseResult(False, "a", None)
    await one.aclose()
    # Closing one provider leaves the named store to the others.
    assert await two.get_lease_owner("k") == "a"
    await two.release_lease("k", "a")
    three = MemoryLeaseProvider(name)
    assert await three.get_lease_owner("k") is None


async def test_different_names_and_private_stores_are_separate() -> None:
    name = _unique_name()
    named = MemoryLeaseProvider.from_url(f"memory://{name}")
    other_named = MemoryLeaseProvider.from_url(f"memory://{name}-other")
    private_one = MemoryLeaseProvider.from_url("memory://")
    private_two = leasekit.connect("memory://")
    for p in (named, other_named, private_one, private_two):
        assert (await p.acquire_lease("k", f"owner-{id(p)}", 60_000)).acquired
    assert await private_one.get_lease_owner("k") == f"owner-{id(private_one)}"
    assert await private_two.get_lease_owner("k") == f"owner-{id(private_two)}"


@pytest.mark.parametrize(
    ("url", "argument"),
    [
        ("memory://name?x=1", "url"),
        ("memory://name#frag", "url"),
        ("redis://localhost", "url"),
    ],
)
def test_from_url_rejects_malformed_urls(url: str, argument: str) -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        MemoryLeaseProvider.from_url(url)
    assert info.value.argument == argument


def test_from_url_rejects_options() -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        MemoryLeaseProvider.from_url("memory://", timeout=3)
    assert info.value.argument == "options"
    assert "timeout" in str(info.value)


def test_named_store_refuses_a_custom_clock_and_an_empty_name(clock: FakeClock) -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        MemoryLeaseProvider(_unique_name(), clock_ns=clock)
    assert info.value.argument == "clock_ns"
    with pytest.raises(InvalidLeaseArgument) as info:
        MemoryLeaseProvider("")
    assert info.value.argument == "name"


# -- concurrency -------------------------------------------------------------------


async def test_many_tasks_racing_one_key_have_exactly_one_winner() -> None:
    provider = MemoryLeaseProvider()
    start = anyio.Event()
    results: dict[str, LeaseResult] = {}

    async def contender(owner: str) -> None:
        await start.wait()
        await anyio.lowlevel.checkpoint()
        results[owner] = await provider.acquire_lease("contended", owner, 60_000)

    async with anyio.create_task_group() as tg:
        for i in range(200):
            tg.start_soon(contender, f"worker-{i}")
        await anyio.lowlevel.checkpoint()
        start.set()

    winners = [owner for owner, r in results.items() if r.acquired]
    assert len(results) == 200
    assert len(winners) == 1
    (winner,) = winners
    assert results[winner].owner == winner
    assert results[winner].token is not None
    for owner, result in results.items():
        if owner != winner:
            assert result == LeaseResult(False, winner, None)
    assert await provider.get_lease_owner("contended") == winner


def test_threads_with_their_own_event_loops_share_a_named_store_safely() -> None:
    url = f"memory://{_unique_name()}"
    threads_n = 8
    barrier = threading.Barrier(threads_n)
    results: list[LeaseResult] = []
    results_lock = threading.Lock()

    def contend(owner: str) -> None:
        provider = leasekit.connect(url)
        barrier.wait()
        outcome = [asyncio.run(provider.acquire_lease(f"k{i}", owner, 60_000)) for i in range(50)]
        with results_lock:
            results.extend(outcome)

    threads = [threading.Thread(target=contend, args=(f"t{i}",)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == threads_n * 50
    winners_per_key: dict[int | None, int] = {}
    for r in results:
        if r.acquired:
            winners_per_key[r.token] = winners_per_key.get(r.token, 0) + 1
    assert len(winners_per_key) == 50  # one winner, one distinct token, for each key
    assert set(winners_per_key.values()) == {1}


# -- lifecycle ---------------------------------------------------------------------


Call = Callable[[leasekit.ManagedLeaseProvider], Awaitable[object]]

CALLS = [
    pytest.param(lambda p: p.acquire_lease("k", "a", 1_000), id="acquire_lease"),
    pytest.param(lambda p: p.get_lease_owner("k"), id="get_lease_owner"),
    pytest.param(lambda p: p.release_lease("k", "a"), id="release_lease"),
    pytest.param(lambda p: p.renew_lease("k", "a", 1_000), id="renew_lease"),
    pytest.param(lambda p: p.transfer_lease("k", "a", "b", 1_000), id="transfer_lease"),
]


@pytest.mark.parametrize("call", CALLS)
async def test_operations_after_aclose_raise_closed(call: Call) -> None:
    provider = MemoryLeaseProvider()
    await provider.acquire_lease("k", "a", 60_000)
    await provider.aclose()
    with pytest.raises(LeaseProviderClosed) as info:
        await call(provider)
    assert isinstance(info.value, LeaseError)
    assert info.value.backend == "memory"


@pytest.mark.parametrize("call", CALLS)
async def test_operations_after_async_with_raise_closed(call: Call) -> None:
    async with leasekit.connect("memory://") as provider:
        assert (await provider.acquire_lease("k", "a", 60_000)).acquired
        assert await provider.get_lease_owner("k") == "a"
    with pytest.raises(LeaseProviderClosed):
        await call(provider)


async def test_async_with_yields_the_provider_itself_and_aclose_is_idempotent() -> None:
    provider = MemoryLeaseProvider()
    async with provider as entered:
        assert entered is provider
    await provider.aclose()
    with pytest.raises(LeaseProviderClosed):
        async with provider:
            pass


async def test_closing_on_error_still_propagates_the_error() -> None:
    provider = MemoryLeaseProvider()
    with pytest.raises(KeyError):
        async with provider:
            raise KeyError("boom")
    with pytest.raises(LeaseProviderClosed):
        await provider.get_lease_owner("k")


# -- bounded memory ----------------------------------------------------------------


async def test_sweep_keeps_the_table_bounded_after_many_expired_keys(
    provider: MemoryLeaseProvider, clock: FakeClock
) -> None:
    store = provider._store
    for round_no in range(10):
        for i in range(500):
            await provider.acquire_lease(f"r{round_no}-k{i}", "o", 10)
        # Only this round's keys may be held in memory: the earlier rounds expired.
        assert len(store.leases) <= 501
        clock.advance_ms(10)
    await provider.acquire_lease("last", "o", 10)
    assert list(store.leases) == ["last"]
    assert len(store.expiries) <= 2 * len(store.leases) + 65


async def test_renewing_one_key_many_times_keeps_the_expiry_heap_bounded(
    provider: MemoryLeaseProvider,
) -> None:
    await provider.acquire_lease("k", "a", 1_000)
    for _ in range(5_000):
        assert await provider.renew_lease("k", "a", 1_000)
    assert len(provider._store.expiries) <= 2 * 1 + 65


async def test_acquire_release_cycles_keep_memory_bounded(provider: MemoryLeaseProvider) -> None:
    for i in range(5_000):
        await provider.acquire_lease(f"k{i}", "a", 60_000)
        await provider.release_lease(f"k{i}", "a")
    assert provider._store.leases == {}
    assert len(provider._store.expiries) <= 2 * 1 + 65


# -- the real clock, with generous margins -----------------------------------------


async def test_real_clock_lease_expires_after_its_ttl() -> None:
    provider = MemoryLeaseProvider()
    await provider.acquire_lease("k", "a", 20)
    await anyio.sleep(0.3)
    assert await provider.get_lease_owner("k") is None
    assert (await provider.acquire_lease("k", "b", 20)).acquired


async def test_real_clock_lease_is_still_held_well_before_its_ttl() -> None:
    # An hour's TTL: no stall of a test run comes near it, so every assert always runs.
    provider = MemoryLeaseProvider()
    await provider.acquire_lease("k", "a", 3_600_000)
    await anyio.sleep(0.05)
    assert await provider.get_lease_owner("k") == "a"
    assert await provider.renew_lease("k", "a", 3_600_000)
    assert (await provider.acquire_lease("k", "b", 1)).acquired is False
