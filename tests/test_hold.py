"""hold(), wait_for() and new_owner_id() on memory:// and SQLite.

Renewal, loss and cancellation are observed through their effects (the store's
owner, the ``lost`` event, the tasks left on the loop), waited for with a generous
limit; no assertion depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from faults import (
    PATIENCE_S,
    RENEWAL_PATHS,
    LoopTurns,
    ScriptedProvider,
    documented_output,
    eventually,
    leasekit_tasks,
    run_example,
    scripted_provider,
    shared_url,
)

import leasekit
from leasekit import (
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
    LeaseHeld,
    LeaseHold,
    LeaseLost,
    LeaseProvider,
    ManagedLeaseProvider,
)
from leasekit._hold import OnLost

pytestmark = pytest.mark.anyio

LONG_TTL_MS = 60_000  # never expires during a test: only renewals and refusals matter
FAST_RENEW_MS = 10


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL on each backend whose connections share leases."""
    return shared_url(request.param, str(tmp_path), f"hold-{uuid.uuid4().hex}")


@pytest.fixture
async def provider(url: str) -> AsyncIterator[ManagedLeaseProvider]:
    async with leasekit.connect(url) as p:
        yield p


@pytest.fixture
async def other(url: str) -> AsyncIterator[ManagedLeaseProvider]:
    """A second connection to the same store: another process, as far as leases go."""
    async with leasekit.connect(url) as p:
        yield p


@pytest.fixture(params=RENEWAL_PATHS)
def scripted(request: pytest.FixtureRequest, provider: ManagedLeaseProvider) -> ScriptedProvider:
    """The provider, renewals scripted; each test runs renewing one by one and batched."""
    return scripted_provider(provider, request.param)


async def forever() -> None:
    await asyncio.Event().wait()


# -- the basic cycle ----------------------------------------------------------------------


async def test_hold_acquires_exposes_the_grant_renews_and_releases(
    scripted: ScriptedProvider, other: LeaseProvider
) -> None:
    async with leasekit.hold(
        scripted, "thread-1", "worker-a", LONG_TTL_MS, renew_every_ms=FAST_RENEW_MS
    ) as lease:
        assert (lease.key, lease.owner, lease.ttl_ms) == ("thread-1", "worker-a", LONG_TTL_MS)
        assert isinstance(lease.token, int)
        assert not lease.lost.is_set()
        await eventually(lambda: scripted.renewed >= 3, "three renewals")
        assert await other.get_lease_owner("thread-1") == "worker-a"
        denied = await other.acquire_lease("thread-1", "worker-b", 1000)
        assert (denied.acquired, denied.owner) == (False, "worker-a")
    assert await other.get_lease_owner("thread-1") is None
    assert not lease.lost.is_set()
    assert leasekit_tasks() == []


async def test_renewal_keeps_a_short_lease_alive_past_its_ttl(
    scripted: ScriptedProvider, other: LeaseProvider
) -> None:
    # Proven by the store, not by a stopwatch: a renewal that *began* a full TTL after
    # the grant was accepted (renew_lease answers True only for a live lease), so the
    # lease outlived its first TTL.
    async with leasekit.hold(scripted, "short", "a", 1000, renew_every_ms=50) as lease:
        first_valid_until = lease.valid_until
        await eventually(
            lambda: lease.valid_until > first_valid_until + 1.0 or lease.lost.is_set(),
            "a renewal one TTL after the grant",
        )
        assert not lease.lost.is_set()
        assert await other.get_lease_owner("short") == "a"


async def test_default_renewal_interval_is_a_third_of_the_ttl(provider: LeaseProvider) -> None:
    lease = leasekit.hold(provider, "k", "a", 3000)
    assert lease.renew_every_ms == 1000
    assert lease.on_lost == "cancel"


async def test_a_held_key_raises_lease_held_naming_the_holder(
    provider: LeaseProvider, other: LeaseProvider
) -> None:
    await other.acquire_lease("busy", "worker-b", LONG_TTL_MS)
    with pytest.raises(LeaseHeld) as caught:
        async with leasekit.hold(provider, "busy", "worker-a", LONG_TTL_MS):
            pytest.fail("the body must not run")
    assert (caught.value.key, caught.value.holder) == ("busy", "worker-b")
    assert isinstance(caught.value, leasekit.LeaseError)
    assert await other.get_lease_owner("busy") == "worker-b"
    assert leasekit_tasks() == []


async def test_hold_waits_for_the_holder_with_wait_s(
    provider: LeaseProvider, other: LeaseProvider
) -> None:
    await other.acquire_lease("queue", "first", LONG_TTL_MS)

    async def finish_soon() -> None:
        await asyncio.sleep(0.05)
        await other.release_lease("queue", "first")

    releaser = asyncio.create_task(finish_soon())
    async with leasekit.hold(provider, "queue", "second", LONG_TTL_MS, wait_s=None) as lease:
        assert await other.get_lease_owner("queue") == "second"
        assert lease.token is not None
    await releaser


async def test_body_errors_propagate_and_the_lease_is_released(
    provider: LeaseProvider, other: LeaseProvider
) -> None:
    with pytest.raises(KeyError):
        async with leasekit.hold(provider, "k", "a", LONG_TTL_MS):
            raise KeyError("boom")
    assert await other.get_lease_owner("k") is None
    assert leasekit_tasks() == []


async def test_a_hold_is_entered_once(provider: LeaseProvider) -> None:
    lease = leasekit.hold(provider, "once", "a", LONG_TTL_MS)
    async with lease:
        pass
    with pytest.raises(RuntimeError, match="entered once"):
        async with lease:
            pass


async def test_hold_works_on_a_provider_written_without_leasekit(url: str) -> None:
    # Structural: any object with the five methods will do, wrapped or not.
    async with leasekit.connect(url) as real:
        plain = ScriptedProvider(real)
        async with leasekit.hold(plain, "k", "a", LONG_TTL_MS, renew_every_ms=5) as lease:
            await eventually(lambda: plain.renewed >= 2, "renewals")
        assert lease.backend == "ScriptedProvider"
        assert await real.get_lease_owner("k") is None


# -- loss ---------------------------------------------------------------------------------


async def held(lease: LeaseHold, body: Callable[[], Awaitable[object]]) -> None:
    """Run ``body`` inside ``lease``'s block (so a test's raises() wraps one call)."""
    async with lease:
        await body()


async def test_a_refused_renewal_cancels_the_body_with_lease_lost(
    scripted: ScriptedProvider, other: LeaseProvider
) -> None:
    reached_end = False
    lease = leasekit.hold(scripted, "stolen", "a", LONG_TTL_MS, renew_every_ms=FAST_RENEW_MS)
    moved: asyncio.Task[bool] | None = None

    async def body() -> None:
        nonlocal reached_end, moved
        # Someone else takes the key (as if our lease had expired in a pause), in one
        # step. In a task of its own: the renewer may cancel this body as soon as the
        # transfer has landed, before its answer is back, and a transfer cancelled in
        # flight is undone (the contract's rule, not this test's subject).
        moved = asyncio.create_task(other.transfer_lease("stolen", "a", "b", LONG_TTL_MS))
        await asyncio.shield(moved)
        await forever()
        reached_end = True

    with pytest.raises(LeaseLost) as caught:
        await held(lease, body)
    assert moved is not None
    assert await moved
    assert not reached_end
    assert (caught.value.key, caught.value.owner) == ("stolen", "a")
    assert lease.lost.is_set()
    assert lease.lost_reason == "renew_refused"
    # Not released: the key is someone else's now, and stays theirs.
    assert await other.get_lease_owner("stolen") == "b"
    assert leasekit_tasks() == []
    task = asyncio.current_task()
    assert task is not None
    if sys.version_info >= (3, 11):
        assert task.cancelling() == 0  # our cancel() was taken back exactly


async def test_with_on_lost_flag_the_body_runs_on_and_sees_lost(
    scripted: ScriptedProvider, other: LeaseProvider
) -> None:
    async with leasekit.hold(
        scripted, "k", "a", LONG_TTL_MS, renew_every_ms=FAST_RENEW_MS, on_lost="flag"
    ) as lease:
        scripted.renew_mode = "refuse"
        await asyncio.wait_for(lease.lost.wait(), 10)
        assert lease.lost_reason == "renew_refused"
        await asyncio.sleep(0)  # still running: nothing cancelled us
    assert leasekit_tasks() == []


async def test_renewals_failing_until_the_ttl_runs_out_lose_the_lease(
    scripted: ScriptedProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="leasekit")
    # 900 ms between the last renewal and the deadline: room for many retries even on
    # a loaded machine (the count below is an ordering, not a timing: retried at all).
    lease = leasekit.hold(scripted, "k", "a", 1000, renew_every_ms=50, safety_margin_ms=50)

    async def body() -> None:
        scripted.renew_mode = "fail"
        await forever()

    with pytest.raises(LeaseLost) as caught:
        await held(lease, body)
    assert lease.lost_reason == "expired"
    # The last failure is the cause, so the traceback says why renewals failed.
    assert isinstance(caught.value.__cause__, LeaseBackendError)
    assert scripted.renew_calls >= 2  # retried, not given up at the first failure
    messages = [r.getMessage() for r in caplog.records if r.name == "leasekit"]
    assert any("renewal 1 of lease on 'k'" in m and "retrying" in m for m in messages)
    assert any("was lost (expired)" in m for m in messages)
    assert leasekit_tasks() == []


async def test_a_failed_renewal_is_retried_and_the_lease_kept(
    scripted: ScriptedProvider, other: LeaseProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="leasekit")
    async with leasekit.hold(scripted, "k", "a", LONG_TTL_MS, renew_every_ms=20) as lease:
        scripted.fail_renewals = 2
        await eventually(lambda: scripted.renewed >= 2, "renewals after the failures")
        assert not lease.lost.is_set()
        assert await other.get_lease_owner("k") == "a"
    failures = [r for r in caplog.records if "renewal" in r.getMessage()]
    assert [r.levelno for r in failures] == [logging.WARNING, logging.WARNING]
    assert "renewal 2 of lease" in failures[1].getMessage()


async def test_a_stalled_renewal_cannot_outlive_the_ttl(scripted: ScriptedProvider) -> None:
    # The store never answers: the body is still stopped when the TTL runs out.
    async def body() -> None:
        scripted.renew_mode = "hang"
        await forever()

    with pytest.raises(LeaseLost):
        await held(leasekit.hold(scripted, "k", "a", 200, renew_every_ms=20), body)
    assert scripted.hanging == 0  # the hung call was cancelled, not abandoned
    assert leasekit_tasks() == []


async def test_a_body_that_swallows_the_cancellation_still_gets_lease_lost(
    scripted: ScriptedProvider,
) -> None:
    lease = leasekit.hold(scripted, "k", "a", LONG_TTL_MS, renew_every_ms=5)

    async def body() -> None:
        scripted.renew_mode = "refuse"
        # Bad manners, but the block must still not pass as a success.
        with contextlib.suppress(asyncio.CancelledError):
            await forever()

    with pytest.raises(LeaseLost):
        await held(lease, body)
    assert lease.lost.is_set()


async def test_a_body_error_after_loss_propagates_as_itself(scripted: ScriptedProvider) -> None:
    lease = leasekit.hold(scripted, "k", "a", LONG_TTL_MS, renew_every_ms=5)

    async def body() -> None:
        scripted.renew_mode = "refuse"
        try:
            await forever()
        except asyncio.CancelledError:
            raise ValueError("cleanup failed") from None

    with pytest.raises(ValueError, match="cleanup"):
        await held(lease, body)
    assert lease.lost.is_set()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="needs Task.uncancel (3.11)")
async def test_lease_lost_passes_through_an_enclosing_timeout_unchanged(
    scripted: ScriptedProvider,
) -> None:
    async def body() -> None:
        scripted.renew_mode = "refuse"
        await forever()

    async def under_timeout() -> None:
        async with asyncio.timeout(30):  # type: ignore[attr-defined]  # 3.11+
            await held(leasekit.hold(scripted, "k", "a", LONG_TTL_MS, renew_every_ms=5), body)

    with pytest.raises(LeaseLost):
        await under_timeout()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="needs Task.cancelling (3.11)")
async def test_a_loss_in_cleanup_code_of_a_cancelled_task_is_still_a_loss(
    scripted: ScriptedProvider,
) -> None:
    # The hold starts while its task is already being cancelled (cancelling() == 1):
    # only a count above that is someone else's cancellation.
    started = asyncio.Event()

    async def body() -> None:
        scripted.renew_mode = "refuse"
        await forever()

    async def worker() -> None:
        try:
            started.set()
            await forever()
        finally:
            await held(leasekit.hold(scripted, "k", "a", LONG_TTL_MS, renew_every_ms=5), body)

    task = asyncio.create_task(worker())
    await started.wait()
    task.cancel()
    with pytest.raises(LeaseLost):
        await task


# -- the deadline: margin, valid_until, the three renewal outcomes ---------------------------


@pytest.mark.parametrize(
    ("ttl_ms", "renew_every_ms", "margin_ms"),
    [(30_000, None, 3000), (300, None, 30), (100, None, 20), (60, None, 20), (30, None, 10)],
)
async def test_the_default_safety_margin_is_a_tenth_of_the_ttl_at_least_20_ms(
    provider: LeaseProvider, ttl_ms: int, renew_every_ms: int | None, margin_ms: int
) -> None:
    lease = leasekit.hold(provider, "k", "a", ttl_ms, renew_every_ms=renew_every_ms)
    assert lease.safety_margin_ms == margin_ms
    assert lease.renew_every_ms + lease.safety_margin_ms < ttl_ms


async def test_valid_until_is_the_grant_start_plus_ttl_minus_the_margin(
    provider: LeaseProvider,
) -> None:
    lease = leasekit.hold(provider, "k", "a", LONG_TTL_MS, safety_margin_ms=500)
    assert lease.valid_until == float("-inf")
    assert lease.remaining() == 0.0
    before = time.monotonic()
    async with lease:
        after = time.monotonic()
        believed_s = (LONG_TTL_MS - 500) / 1000
        assert before + believed_s <= lease.valid_until <= after + believed_s
        assert 0 < lease.remaining() <= believed_s
    # Released: no longer believed.
    assert lease.valid_until <= time.monotonic()
    assert lease.remaining() == 0.0


async def test_a_hung_renewal_is_cut_off_at_the_deadline_and_the_body_told_first(
    scripted: ScriptedProvider,
) -> None:
    seen: list[tuple[str, float]] = []
    lease = leasekit.hold(scripted, "k", "a", 400, renew_every_ms=50, safety_margin_ms=100)
    lease._add_lost_callback(lambda: seen.append(("lost", time.monotonic())))

    async def body() -> None:
        scripted.renew_mode = "hang"
        try:
            await forever()
        except asyncio.CancelledError:
            seen.append(("cancelled", time.monotonic()))
            raise

    with pytest.raises(LeaseLost) as caught:
        await held(lease, body)
    assert caught.value.reason == "expired"
    assert [what for what, _ in seen] == ["lost", "cancelled"]
    # Not before the deadline (the last valid_until the hold believed).
    assert seen[0][1] >= lease.valid_until
    assert scripted.hanging == 0  # the hung call was cancelled, not abandoned
    assert leasekit_tasks() == []


async def test_the_deadline_reaches_the_body_in_one_loop_turn_on_a_busy_loop(
    scripted: ScriptedProvider,
) -> None:
    # Six tasks computing 4 ms between awaits. Counted in loop turns, not ms: from the
    # deadline callback to the body's CancelledError is the next turn.
    stop = False

    async def busy() -> None:
        while not stop:
            end = time.perf_counter() + 0.004
            while time.perf_counter() < end:
                pass
            await asyncio.sleep(0)

    at_loss: list[int] = []
    at_cancel: list[int] = []
    lease = leasekit.hold(scripted, "k", "a", 300, renew_every_ms=50, safety_margin_ms=100)
    async with LoopTurns() as turns:
        lease._add_lost_callback(lambda: at_loss.append(turns.count))
        workers = [asyncio.create_task(busy()) for _ in range(6)]

        async def body() -> None:
            scripted.renew_mode = "hang"
            try:
                await forever()
            except asyncio.CancelledError:
                at_cancel.append(turns.count)
                raise

        try:
            with pytest.raises(LeaseLost):
                await held(lease, body)
        finally:
            stop = True
            await asyncio.wait(workers)
    assert len(at_loss) == len(at_cancel) == 1
    assert at_cancel[0] - at_loss[0] <= 1


async def test_loop_turns_are_the_loops_own_turns_after_the_block_too() -> None:
    # The tests count turns once the block has ended: between() must still use the
    # turn starts recorded at the selector, not fall back to the ticking task's steps.
    async with LoopTurns() as turns:
        for _ in range(3):
            await asyncio.sleep(0.001)
    assert turns.starts
    turns.times.clear()
    assert turns.between(0.0, time.monotonic() + 1) == len(turns.starts)


class OutcomeRecorder:
    """Records the renewal outcomes hold() reports as events."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    @leasekit.hookimpl
    def leasekit_renewed(self, key: str) -> None:
        self.events.append(("renewed", key))

    @leasekit.hookimpl
    def leasekit_failed(self, operation: str, error: BaseException) -> None:
        self.events.append(("failed", f"{operation}: {type(error).__name__}"))

    @leasekit.hookimpl
    def leasekit_lost(self, reason: str) -> None:
        self.events.append(("lost", reason))


@pytest.fixture
def outcomes() -> Iterator[OutcomeRecorder]:
    recorder = OutcomeRecorder()
    leasekit.plugins.register(recorder)
    yield recorder
    leasekit.plugins.unregister(recorder)


async def test_the_three_renewal_outcomes_are_events_and_lost_reasons(
    scripted: ScriptedProvider, outcomes: OutcomeRecorder
) -> None:
    # renewed, then failed (unknown: retried), then renewed again, then refused.
    async with leasekit.hold(
        scripted, "k", "a", LONG_TTL_MS, renew_every_ms=FAST_RENEW_MS, on_lost="flag"
    ) as lease:
        await eventually(lambda: scripted.renewed >= 1, "a renewal")
        scripted.fail_renewals = 1
        calls = scripted.renew_calls
        await eventually(lambda: scripted.renew_calls > calls + 1, "a retry after the failure")
        await eventually(lambda: not lease.lost.is_set() and scripted.fail_renewals == 0, "retry")
        renewed = scripted.renewed
        await eventually(lambda: scripted.renewed > renewed, "renewed after the failure")
        scripted.renew_mode = "refuse"
        await asyncio.wait_for(lease.lost.wait(), PATIENCE_S)
        assert lease.lost_reason == "renew_refused"
    kinds = [kind for kind, _ in outcomes.events]
    failed_at = kinds.index("failed")
    assert "renewed" in kinds[:failed_at]
    assert "renewed" in kinds[failed_at:]
    assert ("failed", "renew: LeaseBackendError") in outcomes.events
    assert outcomes.events[-1] == ("lost", "renew_refused")


async def test_renewals_failing_to_the_deadline_report_failed_then_lost_expired(
    scripted: ScriptedProvider, outcomes: OutcomeRecorder
) -> None:
    async with leasekit.hold(
        scripted, "k", "a", 400, renew_every_ms=50, safety_margin_ms=100, on_lost="flag"
    ) as lease:
        scripted.renew_mode = "fail"
        await asyncio.wait_for(lease.lost.wait(), PATIENCE_S)
        assert lease.lost_reason == "expired"
        assert lease.remaining() == 0.0
    kinds = [kind for kind, _ in outcomes.events]
    assert "failed" in kinds
    assert outcomes.events[-1] == ("lost", "expired")
    assert kinds.index("failed") < len(kinds) - 1


# -- cancellation safety ------------------------------------------------------------------


async def test_cancelling_the_task_releases_and_stops_renewal(
    scripted: ScriptedProvider, other: LeaseProvider
) -> None:
    entered = asyncio.Event()

    async def worker() -> None:
        async with leasekit.hold(scripted, "k", "a", LONG_TTL_MS, renew_every_ms=5):
            entered.set()
            await forever()

    task = asyncio.create_task(worker())
    await entered.wait()
    await eventually(lambda: scripted.renewed >= 1, "a renewal")
    assert any(t.get_name().startswith("leasekit renewal") for t in leasekit_tasks())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await other.get_lease_owner("k") is None
    assert leasekit_tasks() == []


async def test_a_timeout_around_the_body_releases_and_stops_renewal(
    scripted: ScriptedProvider, other: LeaseProvider
) -> None:
    async def worker() -> None:
        async with leasekit.hold(scripted, "k", "a", LONG_TTL_MS, renew_every_ms=5):
            await forever()

    with pytest.raises((TimeoutError, asyncio.TimeoutError)):
        await asyncio.wait_for(worker(), 0.1)
    assert await other.get_lease_owner("k") is None
    assert leasekit_tasks() == []


@pytest.mark.skipif(sys.version_info < (3, 11), reason="needs Task.uncancel (3.11)")
async def test_an_outside_cancel_arriving_with_a_loss_stays_a_cancel(
    scripted: ScriptedProvider,
) -> None:
    gate = asyncio.Event()
    renewing = asyncio.Event()
    entered = asyncio.Event()

    class GatedRenewal(ScriptedProvider):
        async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
            renewing.set()
            await gate.wait()
            return False  # refused: the lease is lost

    gated = GatedRenewal(scripted.inner)

    async def worker() -> None:
        async with leasekit.hold(gated, "k", "a", LONG_TTL_MS, renew_every_ms=5):
            entered.set()
            await forever()

    task = asyncio.create_task(worker())
    await entered.wait()
    await renewing.wait()
    gate.set()  # the refusal lands on the next loop step...
    task.cancel()  # ...together with a cancel from outside, which must win
    with pytest.raises(asyncio.CancelledError):
        await task
    assert leasekit_tasks() == []


async def test_cancelling_a_waiting_hold_leaves_no_task(
    provider: LeaseProvider, other: LeaseProvider
) -> None:
    await other.acquire_lease("k", "first", LONG_TTL_MS)

    async def worker() -> None:
        async with leasekit.hold(provider, "k", "second", LONG_TTL_MS, wait_s=None):
            pytest.fail("the key never comes free")

    task = asyncio.create_task(worker())
    await asyncio.sleep(0.02)  # let it poll a few times
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert leasekit_tasks() == []
    assert await other.get_lease_owner("k") == "first"


# -- transfer -----------------------------------------------------------------------------


async def test_transfer_hands_the_lease_on_and_skips_the_release(
    scripted: ScriptedProvider, other: LeaseProvider
) -> None:
    async with leasekit.hold(
        scripted, "k", "a", LONG_TTL_MS, renew_every_ms=FAST_RENEW_MS
    ) as lease:
        await lease.transfer_to("b")
        assert lease.transferred_to == "b"
        assert leasekit_tasks() == []  # renewal stopped with the handover
        calls = scripted.renew_calls
        await asyncio.sleep(0.05)
        assert scripted.renew_calls == calls
        with pytest.raises(RuntimeError, match="already transferred"):
            await lease.transfer_to("c")
    assert await other.get_lease_owner("k") == "b"
    mine = await other.acquire_lease("k", "b", LONG_TTL_MS)
    assert mine.acquired
    assert mine.token is not None
    assert lease.token is not None
    assert mine.token > lease.token  # a transfer is a new grant: the old token is stale


async def test_transfer_of_a_lost_lease_raises_lease_lost(
    provider: LeaseProvider, other: LeaseProvider
) -> None:
    async with leasekit.hold(provider, "k", "a", LONG_TTL_MS, on_lost="flag") as lease:
        await other.release_lease("k", "a")
        await other.acquire_lease("k", "x", LONG_TTL_MS)
        with pytest.raises(LeaseLost):
            await lease.transfer_to("b")
        assert lease.lost_reason == "transfer_refused"
    assert await other.get_lease_owner("k") == "x"


async def test_a_transfer_that_never_reached_the_store_resumes_renewal(
    scripted: ScriptedProvider,
) -> None:
    class BrokenTransfer(ScriptedProvider):
        async def transfer_lease(
            self, key: str, from_owner: str, to_owner: str, ttl_ms: int
        ) -> bool:
            raise LeaseBackendUnreachable("connection refused", backend="scripted", key=key)

    broken = BrokenTransfer(scripted.inner)
    async with leasekit.hold(broken, "k", "a", LONG_TTL_MS, renew_every_ms=5) as lease:
        with pytest.raises(LeaseBackendUnreachable):
            await lease.transfer_to("b")
        assert not lease.lost.is_set()
        renewed = broken.renewed
        await eventually(lambda: broken.renewed > renewed, "renewal to resume")
        assert lease.transferred_to is None


async def test_a_transfer_with_an_unknown_outcome_loses_the_lease_before_raising(
    scripted: ScriptedProvider, other: LeaseProvider
) -> None:
    class TimedOutTransfer(ScriptedProvider):
        async def transfer_lease(
            self, key: str, from_owner: str, to_owner: str, ttl_ms: int
        ) -> bool:
            raise LeaseBackendTimeout("no answer", backend="scripted", key=key)

    broken = TimedOutTransfer(scripted.inner)
    async with leasekit.hold(broken, "k", "a", LONG_TTL_MS, renew_every_ms=5) as lease:
        with pytest.raises(LeaseLost) as caught:
            await lease.transfer_to("b")
        assert lease.lost.is_set()
        assert lease.lost_reason == caught.value.reason == "transfer_unknown"
        assert isinstance(caught.value.__cause__, LeaseBackendTimeout)
        assert lease.remaining() == 0.0
        assert lease.transferred_to is None
    # Not released either: for all this holder knows, the key is b's now.
    assert await other.get_lease_owner("k") == "a"
    assert leasekit_tasks() == []


@pytest.mark.parametrize("on_lost", ["cancel", "flag"])
async def test_a_hung_transfer_is_cut_off_at_the_deadline_with_lost_already_set(
    scripted: ScriptedProvider, on_lost: OnLost
) -> None:
    release = asyncio.Event()

    class HungTransfer(ScriptedProvider):
        async def transfer_lease(
            self, key: str, from_owner: str, to_owner: str, ttl_ms: int
        ) -> bool:
            await release.wait()
            return True

    hung = HungTransfer(scripted.inner)
    lease = leasekit.hold(
        hung, "k", "a", 300, renew_every_ms=50, safety_margin_ms=100, on_lost=on_lost
    )
    async with LoopTurns() as turns:
        at_loss: list[tuple[int, float]] = []
        lease._add_lost_callback(lambda: at_loss.append((turns.count, time.monotonic())))
        async with lease:
            deadline = lease.valid_until
            with pytest.raises(LeaseLost) as caught:
                await lease.transfer_to("b")
            raised_turn = turns.count
            assert lease.lost.is_set()
            assert caught.value.reason == lease.lost_reason == "transfer_unknown"
            ((lost_turn, lost_at),) = at_loss
            assert lost_at >= deadline
            assert raised_turn - lost_turn <= 1  # the next loop turn
        release.set()
    assert leasekit_tasks() == []


@pytest.mark.parametrize("outcome", ["hung", "refused"])
async def test_a_transfer_lost_in_a_side_task_cancels_the_body(
    scripted: ScriptedProvider, other: LeaseProvider, outcome: str
) -> None:
    # on_lost="cancel": a loss is a loss, whichever task called transfer_to().
    release = asyncio.Event()

    class SideTransfer(ScriptedProvider):
        async def transfer_lease(
            self, key: str, from_owner: str, to_owner: str, ttl_ms: int
        ) -> bool:
            if outcome == "hung":
                await release.wait()
            else:
                await other.transfer_lease(key, from_owner, "thief", ttl_ms)
            return await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)

    lease = leasekit.hold(SideTransfer(scripted.inner), "k", "a", 300, safety_margin_ms=100)
    side: list[BaseException] = []

    async def hand_over() -> None:
        try:
            await lease.transfer_to("b")
        except LeaseLost as exc:
            side.append(exc)

    async def body() -> None:
        task = asyncio.create_task(hand_over())
        try:
            await asyncio.wait_for(forever(), PATIENCE_S)  # cancelled long before
        finally:
            await task

    with pytest.raises(LeaseLost) as caught:
        await held(lease, body)
    release.set()
    (error,) = side
    reason = "transfer_unknown" if outcome == "hung" else "transfer_refused"
    assert error.reason == caught.value.reason == lease.lost_reason == reason
    assert leasekit_tasks() == []


async def test_transfer_arguments_are_checked(provider: LeaseProvider) -> None:
    lease = leasekit.hold(provider, "k", "a", LONG_TTL_MS)
    with pytest.raises(RuntimeError, match="inside"):
        await lease.transfer_to("b")
    async with lease:
        with pytest.raises(InvalidLeaseArgument, match="next_owner"):
            await lease.transfer_to("a")
        with pytest.raises(InvalidLeaseArgument, match="next_owner"):
            await lease.transfer_to("")
        with pytest.raises(InvalidLeaseArgument, match="ttl_ms"):
            await lease.transfer_to("b", ttl_ms=0)


# -- arguments ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "argument"),
    [
        (("", "a", 1000), {}, "key"),
        (("k", "", 1000), {}, "owner"),
        (("k", "a", 0), {}, "ttl_ms"),
        (("k", "a", 1000.0), {}, "ttl_ms"),
        (("k", "a", 1000), {"renew_every_ms": 1000}, "renew_every_ms"),
        (("k", "a", 1000), {"renew_every_ms": 0}, "renew_every_ms"),
        (("k", "a", 1), {}, "renew_every_ms"),
        (("k", "a", 1000), {"on_lost": "ignore"}, "on_lost"),
        (("k", "a", 1000), {"safety_margin_ms": -1}, "safety_margin_ms"),
        (("k", "a", 1000), {"safety_margin_ms": 10.0}, "safety_margin_ms"),
        (("k", "a", 1000), {"safety_margin_ms": True}, "safety_margin_ms"),
        (("k", "a", 1000), {"safety_margin_ms": 667}, "safety_margin_ms"),
        (("k", "a", 1000), {"renew_every_ms": 900, "safety_margin_ms": 100}, "safety_margin_ms"),
        (("k", "a", 1000), {"wait_s": -1}, "wait_s"),
        (("k", "a", 1000), {"wait_s": True}, "wait_s"),
    ],
)
async def test_hold_checks_arguments_before_any_io(
    args: tuple[object, ...], kwargs: dict[str, object], argument: str
) -> None:
    scripted = ScriptedProvider(leasekit.MemoryLeaseProvider())
    with pytest.raises(InvalidLeaseArgument) as caught:
        leasekit.hold(scripted, *args, **kwargs)  # type: ignore[arg-type]
    assert caught.value.argument == argument


# -- wait_for -----------------------------------------------------------------------------


async def test_wait_for_returns_the_grant_once_the_holder_lets_go(
    provider: LeaseProvider, other: LeaseProvider
) -> None:
    await other.acquire_lease("k", "first", LONG_TTL_MS)

    async def finish_soon() -> None:
        await asyncio.sleep(0.05)
        await other.release_lease("k", "first")

    releaser = asyncio.create_task(finish_soon())
    result = await leasekit.wait_for(provider, "k", "second", LONG_TTL_MS, timeout_s=30)
    assert result.acquired
    assert result.owner == "second"
    assert await other.get_lease_owner("k") == "second"
    await releaser


async def test_wait_for_times_out_with_lease_held(
    provider: LeaseProvider, other: LeaseProvider
) -> None:
    await other.acquire_lease("k", "first", LONG_TTL_MS)
    with pytest.raises(LeaseHeld) as caught:
        await leasekit.wait_for(provider, "k", "second", 1000, timeout_s=0.1, poll_s=0.01)
    assert caught.value.holder == "first"
    with pytest.raises(LeaseHeld):
        await leasekit.wait_for(provider, "k", "second", 1000, timeout_s=0)


async def test_wait_for_a_free_key_is_one_acquire(provider: LeaseProvider) -> None:
    result = await leasekit.wait_for(provider, "free", "a", 1000, timeout_s=0)
    assert (result.acquired, result.owner) == (True, "a")


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"timeout_s": -1}, "timeout_s"),
        ({"timeout_s": float("nan")}, "timeout_s"),
        ({"timeout_s": "1"}, "timeout_s"),
        ({"timeout_s": 1, "poll_s": 0}, "poll_s"),
        ({"timeout_s": 1, "max_poll_s": float("inf")}, "max_poll_s"),
    ],
)
async def test_wait_for_checks_its_arguments(kwargs: dict[str, object], argument: str) -> None:
    with pytest.raises(InvalidLeaseArgument) as caught:
        await leasekit.wait_for(leasekit.MemoryLeaseProvider(), "k", "a", 1000, **kwargs)  # type: ignore[arg-type]
    assert caught.value.argument == argument


# -- owner ids ----------------------------------------------------------------------------


def test_new_owner_id_is_unique_and_says_where_it_comes_from() -> None:
    ids = {leasekit.new_owner_id() for _ in range(1000)}
    assert len(ids) == 1000
    sample = leasekit.new_owner_id("worker")
    prefix, host, pid, rand = sample.split(":")
    assert (prefix, pid) == ("worker", str(os.getpid()))
    assert host == socket.gethostname()[:255]
    assert len(rand) == 16
    leasekit.validate_owner(sample)


@pytest.mark.parametrize("prefix", [1, "x" * 600])
def test_new_owner_id_checks_its_prefix(prefix: object) -> None:
    with pytest.raises(InvalidLeaseArgument, match="prefix"):
        leasekit.new_owner_id(prefix)  # type: ignore[arg-type]


# -- the documented example -----------------------------------------------------------------


def test_the_documented_example_prints_what_the_page_shows(tmp_path: Path) -> None:
    assert run_example("hold_example.py", tmp_path) == documented_output(
        "hold.md", "hold_example.py"
    )


async def test_leaving_waits_for_the_release_through_a_cancel_and_raises_it_after() -> None:
    # The exit's release is slow; the task is cancelled while it is in flight: the
    # release still happens, and the cancellation comes out of the block afterwards.
    releasing = asyncio.Event()
    finish = asyncio.Event()

    class SlowRelease(leasekit.MemoryLeaseProvider):
        async def release_lease(self, key: str, owner: str) -> None:
            releasing.set()
            await finish.wait()
            await super().release_lease(key, owner)

    provider = SlowRelease()

    async def body() -> None:
        async with leasekit.hold(provider, "k", "a", ttl_ms=10_000):
            pass

    task = asyncio.ensure_future(body())
    await releasing.wait()
    task.cancel()
    await asyncio.sleep(0)
    assert not task.done()  # still releasing
    finish.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await provider.get_lease_owner("k") is None
