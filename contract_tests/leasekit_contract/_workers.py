"""The workers of the concurrency checks, as tasks and as spawned OS processes.

The process entry points are top-level functions so ``multiprocessing``'s ``spawn``
start method can import them by name; each child opens its own provider from the
test's ``provider_factory`` and runs its own event loop. Children report through a
queue, never by raising: the parent turns a child's traceback into a test failure.
"""

from __future__ import annotations

import multiprocessing
import queue
import random
import time
import traceback
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any, cast

import anyio
import anyio.lowlevel
import anyio.to_thread

from leasekit import LeaseProvider, LeaseResult

from ._base import CLOCK_TOLERANCE_S, ProviderFactory
from ._history import Interval

__all__ = [
    "ChurnJob",
    "ChurnPlan",
    "ChurnReport",
    "RaceJob",
    "churn",
    "churn_in_process",
    "open_provider",
    "race_in_process",
    "run_in_processes",
]

BARRIER_TIMEOUT_S = 120.0
"""How long a child waits for its siblings; spawning and importing can be slow on CI."""

LOST_CHILD_S = 5.0
"""How long after a child exits its report may still be in flight."""

Report = tuple[str, int, Any]  # ("ok" | "error", child index, payload or traceback)


@asynccontextmanager
async def open_provider(factory: ProviderFactory) -> AsyncIterator[LeaseProvider]:
    """Open a provider from ``factory`` the way ``async with`` would, and close it after."""
    manager = cast("Any", factory())
    provider = await manager.__aenter__()
    try:
        yield cast("LeaseProvider", provider)
    finally:
        await manager.__aexit__(None, None, None)


# -- the parent's side ---------------------------------------------------------------


def run_in_processes(
    target: Callable[[Any, Barrier, Queue[Report]], None], jobs: list[Any], timeout_s: float
) -> list[Any]:
    """Run ``target(job, barrier, results)`` in one spawned process per job.

    Blocking; call it from a worker thread. Returns each child's payload in job order.
    A child that fails (its traceback), dies without reporting (its exit code), or a
    run that does not finish in ``timeout_s`` fails the test with an ``AssertionError``.
    """
    context = multiprocessing.get_context("spawn")
    results: Queue[Report] = context.Queue()
    barrier = context.Barrier(len(jobs))
    processes = [
        context.Process(target=target, args=(job, barrier, results), daemon=True) for job in jobs
    ]
    for process in processes:
        process.start()
    payloads: dict[int, Any] = {}
    failures: list[str] = []
    try:
        _collect(
            processes,
            results,
            barrier,
            deadline=time.monotonic() + timeout_s,
            payloads=payloads,
            failures=failures,
        )
    finally:
        # Children that reported exit at once; stragglers after a failure are stopped.
        complete = len(payloads) + len(failures) >= len(processes)
        for process in processes:
            process.join(timeout=10 if complete else 0.1)
            if process.is_alive():
                process.terminate()
                process.join(timeout=10)
        results.close()
    if failures:
        # A failing child breaks the barrier for its siblings: show the root cause in
        # full, then one line for each other failure.
        failures.sort(key=lambda failure: "BrokenBarrierError" in failure)
        first, *others = failures
        lines = [
            first.rstrip(),
            *(f"{o.splitlines()[0]} {o.strip().splitlines()[-1]}" for o in others),
        ]
        raise AssertionError("\n".join(lines))
    return [payloads[index] for index in range(len(processes))]


def _collect(
    processes: Sequence[multiprocessing.process.BaseProcess],
    results: Queue[Report],
    barrier: Barrier,
    *,
    deadline: float,
    payloads: dict[int, Any],
    failures: list[str],
) -> None:
    exited_at: dict[int, float] = {}
    while len(payloads) + len(failures) < len(processes):
        try:
            status, index, payload = results.get(timeout=0.2)
        except queue.Empty:
            now = time.monotonic()
            if now > deadline:
                failures.append("the child processes did not finish in time")
                return
            for index, process in enumerate(processes):
                if process.exitcode is None or index in payloads:
                    continue
                if now - exited_at.setdefault(index, now) > LOST_CHILD_S:
                    failures.append(
                        f"child process {index} exited with code {process.exitcode} "
                        "without reporting"
                    )
                    barrier.abort()
                    return
            continue
        if status == "ok":
            payloads[index] = payload
        else:
            failures.append(f"child process {index} failed:\n{payload}")


# -- racing --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RaceJob:
    """One racing process: acquire each key in turn, in step with its siblings."""

    factory: ProviderFactory
    backend: str
    index: int
    keys: list[str]
    owner: str
    ttl_ms: int


async def _race(job: RaceJob, barrier: Barrier) -> list[tuple[bool, str | None, int | None]]:
    outcomes: list[tuple[bool, str | None, int | None]] = []
    async with open_provider(job.factory) as provider:
        for key in job.keys:
            await anyio.to_thread.run_sync(barrier.wait, BARRIER_TIMEOUT_S)
            result = await provider.acquire_lease(key, job.owner, job.ttl_ms)
            if not isinstance(result, LeaseResult):
                raise TypeError(f"acquire_lease returned {result!r}, not a LeaseResult")
            outcomes.append((result.acquired, result.owner, result.token))
    return outcomes


def race_in_process(job: RaceJob, barrier: Barrier, results: Queue[Report]) -> None:
    """Child process: for each key in turn, wait for every sibling, then acquire it."""
    try:
        outcomes = anyio.run(_race, job, barrier, backend=job.backend)
    except Exception:  # noqa: BLE001  (reported to the parent, which fails the test)
        barrier.abort()
        results.put(("error", job.index, traceback.format_exc()))
    else:
        results.put(("ok", job.index, outcomes))


# -- churning ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChurnPlan:
    """What one churn worker does: its name, its peers, the TTL, and for how long."""

    key: str
    owner: str
    peers: tuple[str, ...]
    ttl_ms: int
    effective_ttl_s: float
    duration_s: float
    seed: int
    atomic_transfer: bool
    fencing: bool


@dataclass(slots=True)
class ChurnReport:
    """What a churn worker saw: its holding intervals, and any rule it saw broken."""

    intervals: list[Interval] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Belief:
    start: float
    cap: float
    token: int | None


class _ChurnWorker:
    """One contender; see :func:`churn`."""

    def __init__(self, provider: LeaseProvider, plan: ChurnPlan) -> None:
        self.provider = provider
        self.plan = plan
        self.rng = random.Random(plan.seed)
        self.report = ChurnReport()
        self.held: _Belief | None = None

    def problem(self, text: str) -> None:
        self.report.problems.append(f"{self.plan.owner!r}: {text}")

    def close(self, at: float) -> None:
        """We stop believing we hold the key at ``at`` (or earlier, when our TTL ran out)."""
        held = self.held
        assert held is not None
        end = min(at, held.cap)
        self.report.intervals.append(Interval(self.plan.owner, held.start, end, held.token))
        self.held = None

    def cap_from(self, started: float) -> float:
        """When a lease whose TTL was set by a call begun at ``started`` may end."""
        return started + self.plan.effective_ttl_s - CLOCK_TOLERANCE_S

    def believe(self, started: float, finished: float, result: LeaseResult) -> None:
        """A granted acquire that began at ``started`` returned at ``finished``."""
        if result.owner != self.plan.owner:
            self.problem(f"a granted acquire named {result.owner!r} as owner")
        if self.plan.fencing and type(result.token) is not int:
            self.problem(f"a granted acquire returned token {result.token!r} despite fencing")
        self.held = _Belief(start=finished, cap=self.cap_from(started), token=result.token)

    async def acquire(self, started: float) -> None:
        plan = self.plan
        result = await self.provider.acquire_lease(plan.key, plan.owner, plan.ttl_ms)
        finished = time.monotonic()
        if result.acquired:
            self.believe(started, finished, result)
            return
        if result.owner == plan.owner:
            self.problem("a denied acquire named the caller itself as the holder")
        await anyio.sleep(self.rng.uniform(0, plan.effective_ttl_s / 20))

    async def renew(self, started: float, held: _Belief) -> None:
        plan = self.plan
        renewed = await self.provider.renew_lease(plan.key, plan.owner, plan.ttl_ms)
        finished = time.monotonic()
        if renewed:
            held.cap = self.cap_from(started)
            return
        if finished < held.cap:
            self.problem("renew_lease refused the holder before its TTL could have run out")
        self.close(finished)

    async def renew_at_the_last_moment(self, held: _Belief) -> None:
        """Renew just before our TTL runs out, where expiry races with the renewal."""
        margin = self.rng.uniform(0, self.plan.effective_ttl_s / 40)
        await anyio.sleep(max(0.0, held.cap - margin - time.monotonic()))
        started = time.monotonic()
        if started >= held.cap:
            self.close(held.cap)
        else:
            await self.renew(started, held)

    async def reacquire(self, started: float, held: _Belief) -> None:
        plan = self.plan
        result = await self.provider.acquire_lease(plan.key, plan.owner, plan.ttl_ms)
        finished = time.monotonic()
        if not result.acquired:
            if finished < held.cap:
                self.problem(f"acquire by the live holder was denied, naming {result.owner!r}")
            self.close(finished)
            return
        # The token says whether it is still our lease; without fencing, only the clock.
        same_lease = result.token == held.token if plan.fencing else finished < held.cap
        if same_lease:
            held.cap = self.cap_from(started)
        else:
            # A new lease: ours expired during the call (and someone may have held the
            # key meanwhile). Without fencing we cannot tell, so assume so.
            if plan.fencing and finished < held.cap:
                self.problem(
                    f"re-acquire by the live holder changed the fencing token from "
                    f"{held.token} to {result.token}"
                )
            self.close(held.cap)
            self.believe(started, finished, result)

    async def release(self, started: float) -> None:
        self.close(started)
        await self.provider.release_lease(self.plan.key, self.plan.owner)

    async def transfer(self, started: float, held: _Belief) -> None:
        plan = self.plan
        self.close(started)
        peer = self.rng.choice(plan.peers)
        moved = await self.provider.transfer_lease(plan.key, plan.owner, peer, plan.ttl_ms)
        finished = time.monotonic()
        # A non-atomic transfer may fail when the key is taken in its gap.
        if not moved and plan.atomic_transfer and finished < held.cap:
            self.problem("transfer_lease refused the holder before its TTL could have run out")

    async def run(self) -> ChurnReport:
        plan, rng = self.plan, self.rng
        end = time.monotonic() + plan.duration_s
        while time.monotonic() < end and not self.report.problems:
            await anyio.lowlevel.checkpoint()
            started = time.monotonic()
            held = self.held
            if held is not None and started >= held.cap:
                self.close(held.cap)  # our TTL may have run out: stop believing
                held = None
            if held is None:
                await self.acquire(started)
                continue
            action = rng.random()
            if action < 0.20:  # work while holding
                await anyio.sleep(rng.uniform(0, plan.effective_ttl_s / 4))
            elif action < 0.35:
                await self.renew(started, held)
            elif action < 0.50:
                await self.renew_at_the_last_moment(held)
            elif action < 0.60:
                await self.reacquire(started, held)
            elif action < 0.68:  # stall past the TTL, like a paused process
                await anyio.sleep(plan.effective_ttl_s * rng.uniform(1.0, 1.5))
            elif action < 0.83:
                await self.release(started)
            else:
                await self.transfer(started, held)
        if self.held is not None:
            await self.release(time.monotonic())
        return self.report


async def churn(provider: LeaseProvider, plan: ChurnPlan) -> ChurnReport:
    """Contend for ``plan.key`` until the time is up, recording when we held it.

    While not holding, the worker tries to acquire. While holding, it picks at random:
    do some work, renew (now, or at the last moment before its TTL runs out),
    re-acquire, stall past the TTL (so others take over by expiry), release, or
    transfer to a peer (who finds out by its next acquire, which
    is idempotent). Each holding interval runs from the return of the granting call
    to the start of the call that gives the lease up, capped at the start of the call
    that last set its TTL plus that TTL. A call that refuses the live holder before
    that cap is reported as a problem on the spot.
    """
    return await _ChurnWorker(provider, plan).run()


@dataclass(frozen=True, slots=True)
class ChurnJob:
    """One churning process."""

    factory: ProviderFactory
    backend: str
    index: int
    plan: ChurnPlan


async def _churn_in_child(job: ChurnJob, barrier: Barrier) -> ChurnReport:
    async with open_provider(job.factory) as provider:
        await anyio.to_thread.run_sync(barrier.wait, BARRIER_TIMEOUT_S)
        return await churn(provider, job.plan)


def churn_in_process(job: ChurnJob, barrier: Barrier, results: Queue[Report]) -> None:
    """Child process: wait for every sibling, then :func:`churn` and report."""
    try:
        report = anyio.run(_churn_in_child, job, barrier, backend=job.backend)
    except Exception:  # noqa: BLE001  (reported to the parent, which fails the test)
        barrier.abort()
        results.put(("error", job.index, traceback.format_exc()))
    else:
        results.put(("ok", job.index, (report.intervals, report.problems)))
