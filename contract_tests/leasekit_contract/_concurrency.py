"""Concurrency: racing acquirers, gapless transfer, and mutual exclusion under churn.

Tasks share the test's provider; processes (``multiprocessing`` ``spawn``) each open
their own from ``provider_factory`` and run when the backend declares
``shared_across_processes=True``.
"""

from __future__ import annotations

import functools

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from leasekit import LeaseProvider

from ._base import (
    ContractBase,
    KeySpace,
    ProviderFactory,
    Timing,
    check_granted,
    require_factory,
    run_concurrently,
)
from ._history import Interval, find_overlap, find_token_disorder
from ._semantics import owner_of, release, transfer
from ._workers import (
    ChurnJob,
    ChurnPlan,
    ChurnReport,
    RaceJob,
    churn,
    churn_in_process,
    race_in_process,
    run_in_processes,
)

__all__ = ["ConcurrencyChecks"]

RACE_TASKS = 8
RACE_TASK_ROUNDS = 25
RACE_PROCESSES = 4
RACE_PROCESS_ROUNDS = 10
TRANSFERS = 200
RACERS = 6
CHURN_TASKS = 5
CHURN_PROCESSES = 4
PROCESS_START_TIMEOUT_S = 120.0

Outcome = tuple[bool, str | None, int | None]


def judge_round(key: str, outcomes: dict[str, Outcome], fencing: bool) -> str:
    """Assert exactly one racer won ``key`` and every loser was told its name; return it."""
    winners = sorted(owner for owner, (acquired, _, _) in outcomes.items() if acquired)
    assert len(winners) == 1, (
        f"{len(outcomes)} racers acquired {key!r} at once: exactly one must win, "
        f"but {len(winners)} did: {winners}"
    )
    winner = winners[0]
    _, named, token = outcomes[winner]
    assert named == winner, f"the winner {winner!r} was told the owner is {named!r}"
    if fencing:
        assert type(token) is int, f"the winner got fencing token {token!r}, not an int"
    for owner, outcome in sorted(outcomes.items()):
        if owner != winner:
            assert outcome == (False, winner, None), (
                f"racer {owner!r} lost {key!r} to {winner!r} and must get "
                f"LeaseResult(False, {winner!r}, None), got {outcome}"
            )
    return winner


async def race_tasks(
    provider: LeaseProvider, key: str, owners: list[str], ttl_ms: int
) -> dict[str, Outcome]:
    """Let one task per owner acquire ``key`` at the same moment; return what each got."""
    start = anyio.Event()
    outcomes: dict[str, Outcome] = {}

    async def contend(owner: str) -> None:
        await start.wait()
        result = await provider.acquire_lease(key, owner, ttl_ms)
        outcomes[owner] = (result.acquired, result.owner, result.token)

    async def go() -> None:
        await anyio.lowlevel.checkpoint()  # let every contender reach the start line
        start.set()

    await run_concurrently(go, *(functools.partial(contend, owner) for owner in owners))
    return outcomes


def churn_plans(key: str, count: int, label: str, t: Timing) -> list[ChurnPlan]:
    owners = [f"{label}-{i}" for i in range(count)]
    duration_s = max(1.0, 6 * t.short_s)
    return [
        ChurnPlan(
            key=key,
            owner=owner,
            peers=tuple(peer for peer in owners if peer != owner),
            ttl_ms=t.short_ttl_ms,
            effective_ttl_s=t.short_s,
            duration_s=duration_s,
            seed=index,
            atomic_transfer=t.caps.atomic_transfer,
            fencing=t.caps.fencing,
        )
        for index, owner in enumerate(owners)
    ]


def judge_history(reports: list[ChurnReport], fencing: bool) -> None:
    """Assert the churn broke no rule, no two owners overlapped, tokens agree with time."""
    problems = [problem for report in reports for problem in report.problems]
    assert not problems, "workers saw the contract broken:\n" + "\n".join(problems)
    intervals: list[Interval] = [i for report in reports for i in report.intervals]
    overlap = find_overlap(intervals)
    assert overlap is None, overlap
    if fencing:
        disorder = find_token_disorder(intervals)
        assert disorder is None, disorder
    holders = {interval.owner for interval in intervals if interval.end > interval.start}
    assert len(holders) >= 2, (
        f"the churn never moved the key between owners ({len(intervals)} holding "
        f"intervals, all by {sorted(holders)}); the check proved nothing"
    )


class ConcurrencyChecks(ContractBase):
    """Many contenders at once: tasks on one provider, and processes on their own."""

    # -- exactly one winner --------------------------------------------------------

    async def test_racing_tasks_get_exactly_one_winner_per_round(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        owners = [f"task-{i}" for i in range(RACE_TASKS)]
        for round_number in range(RACE_TASK_ROUNDS):
            key = keys(f"round-{round_number}")
            outcomes = await race_tasks(provider, key, owners, t.long_ttl_ms)
            winner = judge_round(key, outcomes, t.caps.fencing)
            assert await owner_of(provider, key) == winner

    async def test_racing_processes_get_exactly_one_winner_per_round(
        self,
        provider: LeaseProvider,
        provider_factory: ProviderFactory | None,
        anyio_backend_name: str,
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        factory = require_factory(provider_factory, t.caps, for_processes=True)
        round_keys = [keys(f"round-{r}") for r in range(RACE_PROCESS_ROUNDS)]
        owners = [f"process-{i}" for i in range(RACE_PROCESSES)]
        jobs = [
            RaceJob(factory, anyio_backend_name, index, round_keys, owner, t.long_ttl_ms)
            for index, owner in enumerate(owners)
        ]
        payloads = await anyio.to_thread.run_sync(
            run_in_processes, race_in_process, jobs, PROCESS_START_TIMEOUT_S
        )
        for round_number, key in enumerate(round_keys):
            outcomes: dict[str, Outcome] = {
                owner: tuple(payloads[i][round_number]) for i, owner in enumerate(owners)
            }
            winner = judge_round(key, outcomes, t.caps.fencing)
            assert await owner_of(provider, key) == winner, (
                "the test's own provider must see the lease a process won through "
                "provider_factory: does the factory connect to the same store?"
            )

    # -- transfer under fire -------------------------------------------------------

    async def test_transfer_never_lets_racing_acquirers_in(self, provider: LeaseProvider) -> None:
        """With ``atomic_transfer=True`` a handed-on key is never free, not even briefly."""
        t, keys = Timing.of(provider), KeySpace()
        if not t.caps.atomic_transfer:
            pytest.skip(
                "the backend declares atomic_transfer=False; "
                "test_transfer_under_racing_acquirers_hands_over_or_fails_cleanly covers it"
            )
        key = keys("handed-on")
        chain = [f"holder-{i}" for i in range(4)]
        check_granted(
            await provider.acquire_lease(key, chain[0], t.long_ttl_ms), chain[0], t.caps, "acquire"
        )
        problems: list[str] = []
        done = anyio.Event()

        async def race(racer: str) -> None:
            while not done.is_set() and not problems:
                result = await provider.acquire_lease(key, racer, t.long_ttl_ms)
                if result.acquired:
                    problems.append(f"{racer!r} acquired the key while it was being handed on")
                elif result.owner not in chain:
                    problems.append(
                        f"{racer!r} was told the holder is {result.owner!r} while the key "
                        f"was being handed on between {chain}: it was seen free"
                    )
                await anyio.lowlevel.checkpoint()

        async def hand_on() -> None:
            try:
                for i in range(TRANSFERS):
                    if problems:
                        return
                    source, target = chain[i % len(chain)], chain[(i + 1) % len(chain)]
                    if not await transfer(provider, key, source, target, t.long_ttl_ms):
                        problems.append(
                            f"transfer {i} by the live holder {source!r} returned False"
                        )
                        return
                    await anyio.lowlevel.checkpoint()
            finally:
                done.set()

        with anyio.fail_after(60 + 10 * t.short_s):
            await run_concurrently(
                hand_on, *(functools.partial(race, f"racer-{i}") for i in range(RACERS))
            )
        assert not problems, problems[0]
        assert await owner_of(provider, key) == chain[TRANSFERS % len(chain)]

    async def test_transfer_under_racing_acquirers_hands_over_or_fails_cleanly(
        self, provider: LeaseProvider
    ) -> None:
        """Any backend, atomic transfer or not: a transfer that returns True leaves
        ``to_owner`` holding; one that returns False leaves ``to_owner`` without it.

        Racers release at once whatever they win. They may only win at all when the
        backend declares ``atomic_transfer=False``, where a transfer may let the key go
        free for a moment (its caller then acquires afresh, as this test does).
        """
        t, keys = Timing.of(provider), KeySpace()
        atomic = t.caps.atomic_transfer
        key = keys("handed-on")
        chain = [f"holder-{i}" for i in range(4)]
        check_granted(
            await provider.acquire_lease(key, chain[0], t.long_ttl_ms), chain[0], t.caps, "acquire"
        )
        problems: list[str] = []
        done = anyio.Event()

        async def race(racer: str) -> None:
            while not done.is_set() and not problems:
                result = await provider.acquire_lease(key, racer, t.long_ttl_ms)
                if result.acquired:
                    if atomic:
                        problems.append(
                            f"{racer!r} acquired the key while it was being handed on, "
                            "though the backend declares atomic_transfer=True"
                        )
                    await release(provider, key, racer)
                await anyio.lowlevel.checkpoint()

        async def hand_on() -> None:
            holder = chain[0]
            try:
                for _ in range(TRANSFERS):
                    if problems:
                        return
                    target = chain[(chain.index(holder) + 1) % len(chain)]
                    moved = await transfer(provider, key, holder, target, t.long_ttl_ms)
                    now_held_by = await owner_of(provider, key)
                    if moved:
                        if now_held_by != target:
                            problems.append(
                                f"transfer {holder!r} -> {target!r} returned True, but the "
                                f"holder right after is {now_held_by!r}"
                            )
                        holder = target
                        continue
                    if atomic:
                        problems.append(f"transfer by the live holder {holder!r} returned False")
                    if now_held_by == target:
                        problems.append(
                            f"transfer {holder!r} -> {target!r} returned False, but "
                            f"{target!r} holds the key"
                        )
                    # The key may have gone free and been taken: acquire it afresh.
                    while not (await provider.acquire_lease(key, holder, t.long_ttl_ms)).acquired:
                        await anyio.lowlevel.checkpoint()
            finally:
                done.set()

        with anyio.fail_after(60 + 10 * t.short_s):
            await run_concurrently(
                hand_on, *(functools.partial(race, f"racer-{i}") for i in range(RACERS))
            )
        assert not problems, problems[0]

    # -- mutual exclusion under churn ----------------------------------------------

    async def test_churning_tasks_never_overlap_as_holders(self, provider: LeaseProvider) -> None:
        """Tasks acquire, renew, stall past the TTL, release and transfer at random; the
        times each believed it held the key never overlap (see ``_history``)."""
        t, keys = Timing.of(provider), KeySpace()
        reports: list[ChurnReport] = []

        async def work(plan: ChurnPlan) -> None:
            reports.append(await churn(provider, plan))

        plans = churn_plans(keys("churned"), CHURN_TASKS, "task", t)
        with anyio.fail_after(60 + 2 * plans[0].duration_s):
            await run_concurrently(*(functools.partial(work, plan) for plan in plans))
        judge_history(reports, t.caps.fencing)

    async def test_churning_processes_never_overlap_as_holders(
        self,
        provider: LeaseProvider,
        provider_factory: ProviderFactory | None,
        anyio_backend_name: str,
    ) -> None:
        """The churn above, with each worker in its own process and connection."""
        t, keys = Timing.of(provider), KeySpace()
        factory = require_factory(provider_factory, t.caps, for_processes=True)
        plans = churn_plans(keys("churned"), CHURN_PROCESSES, "process", t)
        jobs = [
            ChurnJob(factory, anyio_backend_name, index, plan) for index, plan in enumerate(plans)
        ]
        payloads = await anyio.to_thread.run_sync(
            run_in_processes,
            churn_in_process,
            jobs,
            PROCESS_START_TIMEOUT_S + 2 * plans[0].duration_s,
        )
        reports = [
            ChurnReport(intervals=[Interval(*i) for i in intervals], problems=problems)
            for intervals, problems in payloads
        ]
        judge_history(reports, t.caps.fencing)
