"""hold() coalescing renewals into renew_leases batches, on a fake clock.

Many holds on one provider whose backend can renew many leases at once share calls:
renewals falling due together go out as one ``renew_leases`` call (at most
``RENEW_BATCH_LIMIT`` items), never later than each hold's own schedule, and a batch
that fails or is refused moves no hold's deadline on. Time is a ``FakeClock``, so
every count below is exact, whatever the machine's load.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import pytest
from faults import BatchingScriptedProvider, ScriptedProvider, leasekit_tasks

import leasekit
from leasekit import LeaseHold, LeaseProvider
from leasekit.backend import RENEW_BATCH_LIMIT, SupportsRenewMany, supports
from leasekit.testing import FakeClock, memory_provider

pytestmark = pytest.mark.anyio

TTL_MS = 3000  # renewed every 1000 ms, believed for 2700 ms after each renewal


async def hold_many(
    stack: contextlib.AsyncExitStack,
    provider: LeaseProvider,
    clock: FakeClock,
    count: int,
    **options: object,
) -> list[LeaseHold]:
    holds = []
    for i in range(count):
        lease = leasekit.hold(provider, f"k{i}", f"owner-{i}", TTL_MS, clock=clock, **options)  # type: ignore[arg-type]
        holds.append(await stack.enter_async_context(lease))
    return holds


async def test_renewals_due_together_go_out_as_one_call() -> None:
    clock = FakeClock()
    store = BatchingScriptedProvider(memory_provider(clock))
    async with contextlib.AsyncExitStack() as stack:
        holds = await hold_many(stack, store, clock, 50)
        await clock.advance(1000)
        assert (store.batches, store.largest_batch, store.renewed) == (1, 50, 50)
        # Each hold believes from the moment the batch went out: its own schedule, 1 s.
        assert [lease.valid_until for lease in holds] == pytest.approx([1.0 + 2.7] * len(holds))
        await clock.advance(9000)
        assert (store.batches, store.renewed) == (10, 500)  # one call per period
        assert not any(lease.lost.is_set() for lease in holds)
    assert store.renewed == 500
    assert leasekit_tasks() == []


async def test_a_batch_holds_at_most_the_limit() -> None:
    clock = FakeClock()
    store = BatchingScriptedProvider(memory_provider(clock))
    count = RENEW_BATCH_LIMIT + 10
    async with contextlib.AsyncExitStack() as stack:
        await hold_many(stack, store, clock, count)
        await clock.advance(1000)
        assert (store.batches, store.largest_batch, store.renewed) == (2, RENEW_BATCH_LIMIT, count)


async def test_renewals_due_within_the_lead_coalesce_and_none_is_sent_late() -> None:
    # Two holds acquired 30 ms apart: with a 50 ms lead (1000 ms / 20), the later one
    # joins the earlier one's batch, which goes out when the *earlier* is due. Neither
    # is ever renewed later than its own schedule.
    clock = FakeClock()
    store = BatchingScriptedProvider(memory_provider(clock))
    async with contextlib.AsyncExitStack() as stack:
        (first,) = await hold_many(stack, store, clock, 1)
        await clock.advance(30)
        second = await stack.enter_async_context(
            leasekit.hold(store, "late", "owner-late", TTL_MS, clock=clock)
        )
        await clock.advance(970)  # t = 1.0: the first is due, the second at 1.03
        assert (store.batches, store.largest_batch) == (1, 2)
        assert first.valid_until == pytest.approx(1.0 + 2.7)
        assert second.valid_until == pytest.approx(1.0 + 2.7)  # 30 ms early, not late


async def test_a_failed_batch_renews_no_one_and_the_retry_does() -> None:
    clock = FakeClock()
    store = BatchingScriptedProvider(memory_provider(clock))
    async with contextlib.AsyncExitStack() as stack:
        holds = await hold_many(stack, store, clock, 20)
        store.fail_renewals = 1
        await clock.advance(1000)
        assert (store.batches, store.renewed) == (1, 0)
        # Nobody believes the failed batch: every deadline is still the grant's.
        assert [lease.valid_until for lease in holds] == pytest.approx([2.7] * len(holds))
        assert not any(lease.lost.is_set() for lease in holds)
        await clock.advance(200)  # retries back off 62-125 ms, and coalesce again
        assert store.renewed == 20
        assert store.batches < 1 + 20  # the retries shared calls too
        assert all(lease.valid_until > 2.7 for lease in holds)


async def test_batches_failing_until_the_deadline_lose_every_lease_as_expired() -> None:
    clock = FakeClock()
    store = BatchingScriptedProvider(memory_provider(clock))
    store.renew_mode = "fail"
    async with contextlib.AsyncExitStack() as stack:
        holds = await hold_many(stack, store, clock, 5, on_lost="flag")
        await clock.advance(2700)
        assert [lease.lost_reason for lease in holds] == ["expired"] * 5
        assert clock.monotonic() == pytest.approx(2.7)  # at the deadline, not before
        assert store.renewed == 0


async def test_mixed_outcomes_in_one_batch_lose_only_the_refused_lease() -> None:
    clock = FakeClock()
    memory = memory_provider(clock)
    store = BatchingScriptedProvider(memory)
    async with contextlib.AsyncExitStack() as stack:
        holds = await hold_many(stack, store, clock, 3, on_lost="flag")
        await memory.release_lease("k1", "owner-1")
        await memory.acquire_lease("k1", "thief", 60_000)
        await clock.advance(1000)
        assert store.batches == 1
        assert [lease.lost_reason for lease in holds] == [None, "renew_refused", None]
        assert [lease.valid_until > 2.7 for lease in holds] == [True, False, True]
        assert await memory.get_lease_owner("k1") == "thief"


async def test_a_hung_batch_is_cut_off_at_the_deadline_and_leaves_no_task() -> None:
    clock = FakeClock()
    store = BatchingScriptedProvider(memory_provider(clock))
    async with contextlib.AsyncExitStack() as stack:
        holds = await hold_many(stack, store, clock, 4, on_lost="flag")
        store.renew_mode = "hang"
        await clock.advance(3000)
        assert [lease.lost_reason for lease in holds] == ["expired"] * 4
        assert store.hanging == 0  # the batch nobody waited for was cancelled
    assert leasekit_tasks() == []
    assert clock.pending == 0


async def test_a_hold_leaving_drops_its_pending_renewal_from_the_batch() -> None:
    clock = FakeClock()
    store = BatchingScriptedProvider(memory_provider(clock))
    async with contextlib.AsyncExitStack() as stack:
        await hold_many(stack, store, clock, 2)
        leaving = await stack.enter_async_context(
            leasekit.hold(store, "leaving", "owner-leaving", TTL_MS, clock=clock)
        )
        await clock.advance(980)  # inside the 50 ms lead: all three renewals are pending
        assert store.batches == 0
        await leaving.__aexit__(None, None, None)
        await clock.advance(20)
        assert (store.batches, store.largest_batch) == (1, 2)
        assert await store.get_lease_owner("leaving") is None


async def test_a_backend_without_renew_leases_is_renewed_one_by_one() -> None:
    clock = FakeClock()
    store = ScriptedProvider(memory_provider(clock))
    assert not supports(store, SupportsRenewMany)
    async with contextlib.AsyncExitStack() as stack:
        await hold_many(stack, store, clock, 5)
        await clock.advance(1000)
        assert store.renewed == store.renew_calls == 5


async def test_renewals_sent_early_never_shorten_the_lead_below_the_schedule() -> None:
    # An hour of renewals: one call per period, each sent exactly on schedule.
    clock = FakeClock()
    store = BatchingScriptedProvider(memory_provider(clock))
    async with contextlib.AsyncExitStack() as stack:
        holds = await hold_many(stack, store, clock, 3)
        await clock.advance(3_600_000)
        assert store.batches == 3600
        assert [lease.valid_until for lease in holds] == pytest.approx([3600 + 2.7] * len(holds))


class CountingRenewMany:
    """A memory provider whose renew_leases answers with a wrong number of results."""

    def __init__(self, inner: leasekit.MemoryLeaseProvider) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def renew_leases(self, items: Sequence[tuple[str, str, int]]) -> list[bool]:
        return [True] * (len(items) - 1)


async def test_a_batch_answering_the_wrong_number_of_items_renews_no_one() -> None:
    clock = FakeClock()
    store = CountingRenewMany(memory_provider(clock))
    async with contextlib.AsyncExitStack() as stack:
        holds = await hold_many(stack, store, clock, 3, on_lost="flag")  # type: ignore[arg-type]
        await clock.advance(2700)
        assert [lease.lost_reason for lease in holds] == ["expired"] * 3
        assert math.isfinite(holds[0].valid_until)


async def test_a_retry_after_a_failed_batch_that_is_refused_loses_the_lease() -> None:
    # A batch fails (outcome unknown); before its retry, another owner takes one key.
    # The retry, sent as a single renewal in the next batch, is refused: that hold is
    # lost at once ("renew_refused") and believes nothing more, while the others'
    # retries renew them. (Counting the refused retry as renewed kept the hold alive on
    # a key someone else held, and every test waiting for its loss hung.)
    clock = FakeClock()
    memory = memory_provider(clock)
    store = BatchingScriptedProvider(memory)
    async with contextlib.AsyncExitStack() as stack:
        holds = await hold_many(stack, store, clock, 3, on_lost="flag")
        store.fail_renewals = 1
        await clock.advance(1000)
        assert (store.batches, store.renewed) == (1, 0)  # failed: nobody renewed yet
        await memory.release_lease("k1", "owner-1")
        await memory.acquire_lease("k1", "thief", 60_000)
        await clock.advance(200)  # the retries back off 62-125 ms, and coalesce
        assert [lease.lost_reason for lease in holds] == [None, "renew_refused", None]
        assert [lease.valid_until > 2.7 for lease in holds] == [True, False, True]
        assert await memory.get_lease_owner("k1") == "thief"
