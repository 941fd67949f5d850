"""leasekit.testing: the fake clock, the memory store on it, fault injection, the fixtures.

Every test here covers seconds to minutes of lease life on a fake clock without
sleeping: no assertion waits for real time.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import leasekit
from leasekit import (
    InvalidLeaseArgument,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
    LeaseHeld,
    LeaseLost,
)
from leasekit.testing import FakeClock, FaultyProvider, memory_provider

pytestmark = pytest.mark.anyio


async def forever() -> None:
    await asyncio.Event().wait()


# -- the clock ---------------------------------------------------------------------------------


async def test_time_moves_only_when_advanced() -> None:
    clock = FakeClock(start=100.0)
    assert clock.monotonic() == 100.0
    await asyncio.sleep(0)
    assert clock.monotonic() == 100.0
    await clock.advance(1500)
    assert clock.monotonic() == 101.5
    assert clock.monotonic_ns() == 101_500_000_000
    await clock.advance(0)
    assert clock.monotonic() == 101.5


async def test_sleepers_and_timers_wake_in_time_order_with_the_clock_at_their_time() -> None:
    clock = FakeClock()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.monotonic()))

    tasks = [asyncio.create_task(sleeper(n, s)) for n, s in [("c", 3), ("a", 1), ("b", 2)]]
    clock.call_at(1.5, lambda: woke.append(("timer", clock.monotonic())))
    cancelled = clock.call_at(1.7, lambda: woke.append(("cancelled", clock.monotonic())))
    cancelled.cancel()
    await clock.advance(2500)
    assert woke == [("a", 1.0), ("timer", 1.5), ("b", 2.0)]
    assert clock.pending == 1
    await clock.advance(10_000)
    assert woke[-1] == ("c", 3.0)
    await asyncio.gather(*tasks)


async def test_a_timer_armed_by_a_timer_fires_within_the_same_advance() -> None:
    clock = FakeClock()
    fired: list[float] = []

    def again() -> None:
        fired.append(clock.monotonic())
        if len(fired) < 5:
            clock.call_at(clock.monotonic() + 1, again)

    clock.call_at(1, again)
    await clock.advance(10_000)
    assert fired == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("ms", [-1, math.nan, math.inf, True, "1"])
async def test_advance_refuses_what_is_not_a_forward_step(ms: object) -> None:
    with pytest.raises(InvalidLeaseArgument) as caught:
        await FakeClock().advance(ms)  # type: ignore[arg-type]
    assert caught.value.argument == "ms"


async def test_a_ticking_clock_also_follows_real_time() -> None:
    clock = FakeClock(ticking=True)
    start = clock.monotonic()
    await clock.advance(60_000)
    assert clock.monotonic() >= start + 60
    before = clock.monotonic()
    await asyncio.sleep(0.01)
    assert clock.monotonic() > before
    await clock.sleep(0.001)  # woken by the real loop, no advance needed


# -- the memory store on the clock ------------------------------------------------------------


async def test_a_lease_expires_when_the_clock_passes_its_ttl() -> None:
    clock = FakeClock()
    leases = memory_provider(clock)
    assert leases.clock is clock
    assert (await leases.acquire_lease("k", "a", 30_000)).acquired
    await clock.advance(29_999)
    assert await leases.get_lease_owner("k") == "a"
    await clock.advance(1)
    assert await leases.get_lease_owner("k") is None
    assert (await leases.acquire_lease("k", "b", 30_000)).acquired


async def test_connect_memory_takes_the_clock_as_an_option() -> None:
    clock = FakeClock()
    async with leasekit.connect("memory://", clock=clock) as leases:
        await leases.acquire_lease("k", "a", 1000)
        await clock.advance(1000)
        assert await leases.get_lease_owner("k") is None
    with pytest.raises(InvalidLeaseArgument) as caught:
        leasekit.connect("memory://shared", clock=clock)
    assert caught.value.argument == "clock"
    with pytest.raises(InvalidLeaseArgument, match="only the clock option"):
        leasekit.connect("memory://", tick=1)


# -- hold() and wait_for() on the clock ------------------------------------------------------


async def test_a_hold_on_the_clock_keeps_its_lease_for_an_hour_of_renewals() -> None:
    clock = FakeClock()
    leases = FaultyProvider(memory_provider(clock))
    async with leasekit.hold(leases, "job", "a", 30_000, clock=clock) as lease:
        await clock.advance(3_600_000)
        assert not lease.lost.is_set()
        assert await leases.get_lease_owner("job") == "a"
        assert leases.calls["renew"] == 360  # every 10 s for an hour
        assert lease.valid_until == pytest.approx(3600 + 27)
    assert await leases.get_lease_owner("job") is None


async def test_failing_renewals_lose_the_lease_at_the_deadline_in_fake_time() -> None:
    clock = FakeClock()
    leases = FaultyProvider(memory_provider(clock))
    lease = leasekit.hold(leases, "job", "a", 30_000, clock=clock)

    async def work() -> None:
        async with lease:
            leases.fail_always(operation="renew")
            await clock.advance(300_000)  # cancelled out of here at the deadline

    with pytest.raises(LeaseLost) as caught:
        await work()
    assert caught.value.reason == lease.lost_reason == "expired"
    assert isinstance(caught.value.__cause__, LeaseBackendTimeout)
    assert leases.calls["renew"] >= 3  # retried until the deadline, not given up at once
    # Lost at the deadline: 30 s - the 3 s margin after the grant, not one tick later.
    assert clock.monotonic() == pytest.approx(27.0)
    # The store still has it until its TTL: hold() stopped believing first.
    assert await leases.get_lease_owner("job") == "a"
    await clock.advance(3_000)
    assert await leases.get_lease_owner("job") is None


async def test_the_loss_path_waits_on_no_real_timer_while_the_fake_clock_covers_minutes() -> None:
    # Three healthy minutes, then renewals fail until the lease is lost: all of it on the
    # fake clock. Proof that nothing waits in real time: no timer is armed on the real
    # event loop at all, and the thread spends well under 100 ms of CPU, so the test's
    # wall time is bounded by that work alone (a few ms; pytest --durations shows it).
    loop = asyncio.get_running_loop()
    real_call_at = loop.call_at
    real_timers: list[float] = []

    def recording_call_at(when: float, callback: Any, *args: Any, context: Any = None) -> Any:
        real_timers.append(when - loop.time())
        return real_call_at(when, callback, *args, context=context)

    clock = FakeClock()
    leases = FaultyProvider(memory_provider(clock))
    lease = leasekit.hold(leases, "job", "a", 30_000, clock=clock)
    healthy_renewals = 0

    async def work() -> None:
        nonlocal healthy_renewals
        async with lease:
            await clock.advance(180_000)
            healthy_renewals = leases.calls["renew"]
            leases.fail_always(operation="renew")
            await clock.advance(300_000)  # cancelled out of here at the deadline

    cpu_s = time.thread_time()
    loop.call_at = recording_call_at  # type: ignore[method-assign]
    try:
        with pytest.raises(LeaseLost) as caught:
            await work()
    finally:
        del loop.call_at  # the instance attribute; the loop's own method again
    cpu_s = time.thread_time() - cpu_s
    assert real_timers == []
    assert cpu_s < 0.1
    assert caught.value.reason == "expired"
    assert healthy_renewals == 18  # every 10 s for three minutes
    assert leases.calls["renew"] > healthy_renewals  # then retried until the deadline
    # Lost at the last good renewal (180 s) + 30 s TTL - the 3 s margin: 3 min 27 s.
    assert clock.monotonic() == pytest.approx(207.0)


async def test_three_failed_renewals_then_one_that_works_keep_the_lease() -> None:
    clock = FakeClock()
    leases = FaultyProvider(memory_provider(clock))
    async with leasekit.hold(leases, "job", "a", 30_000, clock=clock) as lease:
        leases.fail_next(3, operation="renew", error=LeaseBackendUnreachable)
        await clock.advance(20_000)  # first renewal at 10 s, retries back off from 1.25 s
        assert leases.calls["renew"] >= 4
        assert lease.valid_until > 27  # the fourth renewal moved the deadline on
        assert not lease.lost.is_set()


async def test_a_stalled_renewal_is_cut_off_at_the_deadline() -> None:
    clock = FakeClock()
    leases = FaultyProvider(memory_provider(clock))
    async with leasekit.hold(leases, "job", "a", 30_000, on_lost="flag", clock=clock) as lease:
        leases.stall_until(math.inf, operation="renew")
        await clock.advance(60_000)
        assert lease.lost_reason == "expired"
        assert lease.remaining() == 0.0
    assert clock.pending == 0  # the stalled call was cancelled with the renewer


async def test_a_stall_until_a_point_then_runs() -> None:
    clock = FakeClock()
    leases = FaultyProvider(memory_provider(clock))
    leases.stall_until(5.0, operation="acquire")
    attempt = asyncio.create_task(leases.acquire_lease("k", "a", 60_000))
    await clock.advance(4_999)
    assert not attempt.done()
    await clock.advance(1)
    assert (await attempt).acquired
    leases.heal()
    assert (await leases.acquire_lease("k", "a", 60_000)).acquired


async def test_heal_ends_a_stall_at_once() -> None:
    clock = FakeClock()
    leases = FaultyProvider(memory_provider(clock))
    leases.stall_until(math.inf)
    attempt = asyncio.create_task(leases.get_lease_owner("k"))
    await clock.advance(1000)
    assert not attempt.done()
    leases.heal()
    assert await attempt is None


async def test_wait_for_on_the_clock_gets_the_key_when_the_holder_expires() -> None:
    clock = FakeClock()
    leases = memory_provider(clock)
    await leases.acquire_lease("k", "first", 60_000)
    waiter = asyncio.create_task(
        leasekit.wait_for(leases, "k", "second", 60_000, timeout_s=120, clock=clock)
    )
    await clock.advance(59_000)
    assert not waiter.done()
    await clock.advance(2_000)  # the poll after the expiry
    assert (await waiter).owner == "second"
    late = asyncio.create_task(
        leasekit.wait_for(leases, "k", "third", 1000, timeout_s=10, clock=clock)
    )
    await clock.advance(11_000)
    with pytest.raises(LeaseHeld):
        await late


async def test_watch_owner_on_the_clock_sees_the_holder_expire() -> None:
    clock = FakeClock()
    leases = memory_provider(clock)
    await leases.acquire_lease("k", "first", 60_000)
    owners = leasekit.watch_owner(leases, "k", clock=clock)
    assert await anext(owners) == "first"
    change = asyncio.create_task(anext(owners))
    await clock.advance(59_000)
    assert not change.done()
    await clock.advance(2_000)
    assert await change is None
    await owners.aclose()


async def test_elect_passes_the_clock_to_its_hold() -> None:
    clock = FakeClock()
    leases = FaultyProvider(memory_provider(clock))

    async def lead() -> None:
        async with leasekit.elect(leases, "scheduler", "me", 30_000, clock=clock):
            leases.fail_always(operation="renew")
            await clock.advance(60_000)

    with pytest.raises(LeaseLost):
        await lead()


async def test_fail_next_checks_its_arguments() -> None:
    leases = FaultyProvider(memory_provider(FakeClock()))
    with pytest.raises(InvalidLeaseArgument, match="operation"):
        leases.fail_next(1, operation="renwe")
    with pytest.raises(InvalidLeaseArgument) as caught:
        leases.fail_next(0)
    assert caught.value.argument == "n"
    with pytest.raises(InvalidLeaseArgument) as caught:
        leases.fail_next(1, error=ValueError)  # type: ignore[arg-type]
    assert caught.value.argument == "error"
    with pytest.raises(InvalidLeaseArgument) as caught:
        FaultyProvider(leasekit.MemoryLeaseProvider()).stall_until(1.0)
    assert caught.value.argument == "clock"


async def test_faults_fail_without_touching_the_store() -> None:
    leases = FaultyProvider(memory_provider(FakeClock()))
    leases.fail_next(2, error=LeaseBackendUnreachable)
    for _ in range(2):
        with pytest.raises(LeaseBackendUnreachable) as caught:
            await leases.acquire_lease("k", "a", 1000)
        assert caught.value.key == "k"
    assert await leases.get_lease_owner("k") is None
    assert leases.calls["acquire"] == 2
    assert leasekit.is_lease_provider(leases)


async def test_faults_wrap_a_real_store_too(tmp_path: Path) -> None:
    clock = FakeClock()
    async with leasekit.connect(f"sqlite:///{tmp_path / 'leases.db'}") as sqlite:
        leases = FaultyProvider(sqlite, clock=clock)
        assert leases.capabilities == leasekit.capabilities_of(sqlite)
        leases.fail_next(1, operation="acquire", error=LeaseBackendUnreachable)
        with pytest.raises(LeaseBackendUnreachable):
            await leases.acquire_lease("k", "a", 60_000)
        assert await sqlite.get_lease_owner("k") is None  # the fault never reached the store
        granted = await leases.acquire_lease("k", "a", 60_000)
        assert granted.acquired
        assert granted.token is not None
        leases.stall_until(5.0, operation="renew")
        renewal = asyncio.create_task(leases.renew_lease("k", "a", 60_000))
        await clock.advance(4_999)
        assert not renewal.done()
        await clock.advance(1)
        assert await renewal is True  # then it ran on the store
        leases.fail_always(operation="owner")
        with pytest.raises(LeaseBackendTimeout):
            await leases.get_lease_owner("k")
        leases.heal()
        assert await leases.get_lease_owner("k") == "a"
        assert leases.calls == {"acquire": 2, "owner": 2, "release": 0, "renew": 1, "transfer": 0}


def test_faults_reach_code_on_the_sync_facade() -> None:
    leases = FaultyProvider(leasekit.MemoryLeaseProvider())
    with leasekit.sync.wrap(leases, close=True) as blocking:
        leases.fail_next(2, operation="renew")
        assert blocking.acquire_lease("k", "a", 60_000).acquired
        for _ in range(2):
            with pytest.raises(LeaseBackendTimeout):
                blocking.renew_lease("k", "a", 60_000)
        assert blocking.renew_lease("k", "a", 60_000)


# -- the pytest fixtures ----------------------------------------------------------------------


async def test_the_fixtures_give_a_clock_and_a_faulty_store_on_it(
    lease_clock: FakeClock, fake_leases: FaultyProvider
) -> None:
    assert lease_clock.monotonic() == 0.0
    assert fake_leases.clock is lease_clock
    await fake_leases.acquire_lease("k", "a", 1000)
    await lease_clock.advance(1000)
    assert await fake_leases.get_lease_owner("k") is None


def test_the_docs_pytest_example_passes_in_a_pytest_of_its_own(tmp_path: Path) -> None:
    # The other examples on the page are programs that the docs tests run; this one is a
    # test module, so it runs the way a user runs it: pytest, with the fixtures found
    # through leasekit's pytest11 entry point alone.
    page = Path(__file__).resolve().parent.parent / "docs" / "testing-your-code.md"
    fence = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
    blocks = fence.findall(page.read_text("utf-8"))
    (example,) = [block for block in blocks if "lease_clock" in block]
    (tmp_path / "test_example.py").write_text(example, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W", "error", "-q"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
