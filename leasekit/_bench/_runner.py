"""The timing loops: every contender through every scenario, one round after another.

A *contender* is one way to take and give back a lease on the store under test:
leasekit itself (:data:`LEASEKIT`, the same for every scheme, through
:func:`leasekit.connect`), the scheme's raw-driver *floor*, and *peers* (other lock
libraries), which the scheme's :class:`~leasekit.bench.SchemeBench` brings (found
by :mod:`._schemes`). Each one opens a *cycler* whose ``cycle(key, owner)`` tries to
acquire ``key`` without waiting and, if that worked, releases it: one
acquire+release cycle. Async cyclers run as asyncio tasks on one event loop; sync
ones run one thread per task, sharing one client.

Every contender runs every scenario for a short warmup, then for a fixed duration,
timing each cycle with :func:`time.perf_counter_ns`. Each contender gets its own
event loop and its own client, opened before and closed after its scenarios. With
several rounds, the whole sequence repeats and each row keeps its fastest round.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import platform
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._errors import InvalidLeaseArgument
from .._registry import scheme_of
from ..backend import redact_url
from ._leasekit import LEASEKIT
from ._model import (
    DEFAULT_SCENARIOS,
    DEFAULT_TTL_MS,
    KEYS_PER_TASK,
    SCENARIOS,
    AsyncCycler,
    BenchReport,
    BenchTarget,
    Contender,
    ContenderResult,
    Scenario,
    SyncCycler,
)
from ._schemes import scheme_bench

__all__ = ["run_bench"]

_MAX_WARMUP_S = 0.5


# -- the runner --------------------------------------------------------------------------


@dataclass(slots=True)
class _TaskSample:
    latencies_ns: list[int]
    cycles: int
    denied: int
    finished_ns: int
    cpu_start_s: float  # the process's CPU time when this task's warmup ended


@dataclass(frozen=True, slots=True)
class _Plan:
    target: BenchTarget
    scenarios: tuple[Scenario, ...]
    seconds: float
    warmup_s: float
    progress: Callable[[str], None]

    def workload(
        self, contender: Contender, scenario: Scenario
    ) -> tuple[list[list[str]], list[str]]:
        """Each task's keys and owner: its own keys, or the one shared key."""
        base = f"{self.target.namespace}:{contender.id}:{scenario.name}"
        if scenario.shared_key:
            keys = [[f"{base}:shared"] for _ in range(scenario.tasks)]
        else:
            keys = [
                [f"{base}:{task}:{k}" for k in range(KEYS_PER_TASK)]
                for task in range(scenario.tasks)
            ]
        owners = [f"{self.target.namespace}:owner-{task}" for task in range(scenario.tasks)]
        return keys, owners

    def deadlines_ns(self) -> tuple[int, int]:
        warm_end = time.perf_counter_ns() + int(self.warmup_s * 1e9)
        return warm_end, warm_end + int(self.seconds * 1e9)


def run_bench(
    url: str,
    *,
    seconds: float = 2.0,
    scenarios: Sequence[str] = DEFAULT_SCENARIOS,
    rounds: int = 1,
    ttl_ms: int = DEFAULT_TTL_MS,
    warmup_s: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> BenchReport:
    """Measure leasekit, the floor and every installed peer on ``url``; see the module doc.

    With ``rounds`` > 1 the whole sequence of contenders runs that many times, one
    round after another, and each row reports its fastest round: other load on the
    machine only ever slows a round down, so the fastest is the least disturbed (as
    :mod:`timeit` advises), and interleaving spreads a slow spell over every
    contender instead of landing it on one.

    Blocking: each contender runs on its own event loop (or threads), so call this
    outside any running loop. Raises :class:`~leasekit.InvalidLeaseArgument` for a bad
    URL or argument and the backend's errors (:class:`~leasekit.BackendUnavailable`,
    :class:`~leasekit.LeaseBackendError`) when leasekit cannot open or use the store;
    a failing floor or peer is reported in its rows instead. Keys the run wrote are
    deleted at the end where the scheme knows how.
    """
    scheme = scheme_of(url)
    chosen = _check_arguments(seconds, rounds, scenarios)
    if warmup_s is None:
        warmup_s = min(_MAX_WARMUP_S, seconds / 4)
    bench = scheme_bench(scheme)
    target = BenchTarget(url, ttl_ms, f"leasekit-bench-{uuid.uuid4().hex[:10]}")
    plan = _Plan(target, chosen, float(seconds), float(warmup_s), progress or (lambda _: None))
    contenders, skipped = _installed((LEASEKIT, *bench.contenders))
    measured: dict[tuple[str, str], list[ContenderResult]] = {}
    failed: dict[str, list[ContenderResult]] = {}
    notes: list[str] = []
    server: str | None = None
    try:
        for round_ in range(1, rounds + 1):
            prefix = f"round {round_}/{rounds}: " if rounds > 1 else ""
            _run_round(contenders, plan, prefix, measured, failed)
        if bench.describe_server is not None:
            server = asyncio.run(bench.describe_server(target))
    finally:
        if measured and bench.cleanup is not None:
            try:
                asyncio.run(bench.cleanup(target))
            except Exception as exc:  # noqa: BLE001 (the numbers stand; say what was left behind)
                notes.append(f"cleanup of keys containing {target.namespace!r} failed: {exc}")
    rows: list[ContenderResult] = []
    for contender in contenders:
        if contender.id in failed:
            rows.extend(failed[contender.id])
        else:
            rows.extend(_fastest_round(measured[contender.id, s.name]) for s in chosen)
    return BenchReport(
        url=redact_url(url),
        scheme=scheme,
        namespace=target.namespace,
        server=server,
        seconds=plan.seconds,
        warmup_s=plan.warmup_s,
        rounds=rounds,
        ttl_ms=ttl_ms,
        scenarios=tuple(s.name for s in chosen),
        results=tuple(_with_ratios(rows)),
        contenders=tuple(
            {"id": c.id, "label": c.label, "role": c.role, "mode": c.mode, "how": c.how}
            for c in contenders
        ),
        skipped=tuple(skipped),
        notes=tuple(notes),
        machine=_machine(),
    )


def _check_arguments(
    seconds: object, rounds: object, scenarios: Sequence[str]
) -> tuple[Scenario, ...]:
    """The scenarios to run, in order; bad arguments raise before anything connects."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise InvalidLeaseArgument.for_argument("seconds", f"must be a number > 0, got {seconds!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise InvalidLeaseArgument.for_argument("rounds", f"must be an int >= 1, got {rounds!r}")
    if not scenarios or any(name not in SCENARIOS for name in scenarios):
        raise InvalidLeaseArgument.for_argument(
            "scenarios", f"choose from {', '.join(SCENARIOS)}, got {list(scenarios)!r}"
        )
    return tuple(SCENARIOS[name] for name in dict.fromkeys(scenarios))


def _installed(
    candidates: Sequence[Contender],
) -> tuple[list[Contender], list[dict[str, str]]]:
    """The contenders whose modules import here, and a reason for each one skipped."""
    ready: list[Contender] = []
    skipped: list[dict[str, str]] = []
    for contender in candidates:
        missing = contender.missing()
        if missing:
            reason = f"{', '.join(missing)} not installed: {contender.install}"
            skipped.append({"contender": contender.id, "label": contender.label, "reason": reason})
        else:
            ready.append(contender)
    return ready, skipped


def _run_round(
    contenders: Sequence[Contender],
    plan: _Plan,
    prefix: str,
    measured: dict[tuple[str, str], list[ContenderResult]],
    failed: dict[str, list[ContenderResult]],
) -> None:
    """Every contender once through every scenario; results go into ``measured``.

    A floor or peer that fails is recorded in ``failed`` and left out of later
    rounds; leasekit failing is the command's error and propagates.
    """
    for contender in contenders:
        if contender.id in failed:
            continue
        try:
            results = _measure(contender, plan, prefix)
        except Exception as exc:
            if contender.role == "leasekit":
                raise
            failed[contender.id] = [_failure(contender, s, exc) for s in plan.scenarios]
            continue
        for result in results:
            measured.setdefault((result.contender, result.scenario), []).append(result)


def _failure(contender: Contender, scenario: Scenario, exc: Exception) -> ContenderResult:
    return ContenderResult(
        contender.id,
        contender.label,
        contender.role,
        contender.mode,
        scenario.name,
        scenario.tasks,
        error=f"{type(exc).__name__}: {exc}".splitlines()[0],
    )


def _fastest_round(results: list[ContenderResult]) -> ContenderResult:
    """The round with the most cycles/s, noting every round's rate."""
    fastest = max(results, key=lambda r: r.cycles_per_s)
    return replace(fastest, round_cycles_per_s=tuple(r.cycles_per_s for r in results))


def _measure(contender: Contender, plan: _Plan, prefix: str) -> list[ContenderResult]:
    if contender.open_async is not None:
        return asyncio.run(_measure_async(contender, contender.open_async, plan, prefix))
    assert contender.open_sync is not None
    return _measure_sync(contender, contender.open_sync, plan, prefix)


async def _measure_async(
    contender: Contender,
    open_async: Callable[[BenchTarget], Coroutine[Any, Any, AsyncCycler]],
    plan: _Plan,
    prefix: str,
) -> list[ContenderResult]:
    cycler = await open_async(plan.target)
    try:
        out = []
        for scenario in plan.scenarios:
            plan.progress(f"{prefix}{contender.label}: {scenario.label}")
            keys, owners = plan.workload(contender, scenario)
            warm_end, end = plan.deadlines_ns()
            samples = await asyncio.gather(
                *(
                    _async_task(cycler.cycle, keys[task], owners[task], warm_end, end)
                    for task in range(scenario.tasks)
                )
            )
            out.append(_summarize(contender, scenario, samples, warm_end, time.process_time()))
        return out
    finally:
        await cycler.aclose()


async def _async_task(
    cycle: Callable[[str, str], Awaitable[bool]],
    keys: list[str],
    owner: str,
    warm_end_ns: int,
    end_ns: int,
) -> _TaskSample:
    clock = time.perf_counter_ns
    count = len(keys)
    i = 0
    while clock() < warm_end_ns:
        await cycle(keys[i % count], owner)
        i += 1
    cpu_start_s = time.process_time()
    latencies: list[int] = []
    cycles = denied = 0
    # At least one measured attempt per task, however slow the contender: a cycle
    # that outlasts the whole window (a loaded machine, a store's fsync) is measured,
    # not lost in the warmup.
    while (start := clock()) < end_ns or not latencies:
        acquired = await cycle(keys[i % count], owner)
        latencies.append(clock() - start)
        i += 1
        if acquired:
            cycles += 1
        else:
            denied += 1
    return _TaskSample(latencies, cycles, denied, clock(), cpu_start_s)


def _sync_task(
    cycle: Callable[[str, str], bool],
    keys: list[str],
    owner: str,
    warm_end_ns: int,
    end_ns: int,
) -> _TaskSample:
    # The same loop as _async_task, minus the awaits; kept apart so that neither pays
    # for the other's indirection inside the timed region.
    clock = time.perf_counter_ns
    count = len(keys)
    i = 0
    while clock() < warm_end_ns:
        cycle(keys[i % count], owner)
        i += 1
    cpu_start_s = time.process_time()
    latencies: list[int] = []
    cycles = denied = 0
    while (start := clock()) < end_ns or not latencies:  # one at least, as above
        acquired = cycle(keys[i % count], owner)
        latencies.append(clock() - start)
        i += 1
        if acquired:
            cycles += 1
        else:
            denied += 1
    return _TaskSample(latencies, cycles, denied, clock(), cpu_start_s)


def _measure_sync(
    contender: Contender,
    open_sync: Callable[[BenchTarget], SyncCycler],
    plan: _Plan,
    prefix: str,
) -> list[ContenderResult]:
    cycler = open_sync(plan.target)
    try:
        out = []
        for scenario in plan.scenarios:
            plan.progress(f"{prefix}{contender.label}: {scenario.label}")
            keys, owners = plan.workload(contender, scenario)
            warm_end, end = plan.deadlines_ns()
            samples = _in_threads(cycler.cycle, keys, owners, warm_end, end)
            out.append(_summarize(contender, scenario, samples, warm_end, time.process_time()))
        return out
    finally:
        cycler.close()


def _in_threads(
    cycle: Callable[[str, str], bool],
    keys: list[list[str]],
    owners: list[str],
    warm_end_ns: int,
    end_ns: int,
) -> list[_TaskSample]:
    """One thread per task, all sharing ``cycle``; the first error is raised here."""
    samples: list[_TaskSample | None] = [None] * len(keys)
    errors: list[BaseException] = []

    def work(task: int) -> None:
        try:
            samples[task] = _sync_task(cycle, keys[task], owners[task], warm_end_ns, end_ns)
        except BaseException as exc:  # noqa: BLE001 (handed to the calling thread, raised there)
            errors.append(exc)

    threads = [
        threading.Thread(target=work, args=(task,), name=f"leasekit-bench-{task}", daemon=True)
        for task in range(len(keys))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [sample for sample in samples if sample is not None]


def _summarize(
    contender: Contender,
    scenario: Scenario,
    samples: Sequence[_TaskSample],
    start_ns: int,
    cpu_end_s: float,
) -> ContenderResult:
    latencies = sorted(itertools.chain.from_iterable(s.latencies_ns for s in samples))
    cycles = sum(s.cycles for s in samples)
    denied = sum(s.denied for s in samples)
    elapsed_s = max(1, max(s.finished_ns for s in samples) - start_ns) / 1e9
    # Process CPU time from the first task leaving warmup to the end of the scenario.
    cpu_s = cpu_end_s - min(s.cpu_start_s for s in samples)
    return ContenderResult(
        contender.id,
        contender.label,
        contender.role,
        contender.mode,
        scenario.name,
        scenario.tasks,
        attempts=len(latencies),
        cycles=cycles,
        denied=denied,
        seconds=round(elapsed_s, 4),
        cycles_per_s=round(cycles / elapsed_s, 1),
        denied_per_s=round(denied / elapsed_s, 1),
        p50_ms=round(_percentile(latencies, 0.50) / 1e6, 4),
        p99_ms=round(_percentile(latencies, 0.99) / 1e6, 4),
        cpu_us=round(cpu_s / max(1, len(latencies)) * 1e6, 1),
    )


def _percentile(ordered: Sequence[int], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0 when empty)."""
    if not ordered:
        return 0.0
    return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])


def _with_ratios(results: list[ContenderResult]) -> list[ContenderResult]:
    floors = {
        r.scenario: r.cycles_per_s
        for r in results
        if r.role == "floor" and r.error is None and r.cycles_per_s > 0
    }
    out = []
    for r in results:
        floor = floors.get(r.scenario)
        ratio = None if floor is None or r.error is not None else round(r.cycles_per_s / floor, 3)
        out.append(replace(r, ratio_to_floor=ratio))
    return out


def _machine() -> dict[str, Any]:
    return {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
