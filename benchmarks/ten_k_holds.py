"""10k holds: one process holding 10,000 leases through hold() on one provider.

    python benchmarks/ten_k_holds.py [--holds 10000] [--ttl-ms 3000] [--periods 5]
        [--backends memory,sqlite,postgres,redis] [--modes one_by_one,batched] [--json]

Each backend runs twice in the same run, so the ratio is what matters on a shared
machine: ``one_by_one`` renews every lease with its own ``renew_lease`` (leasekit
before batched renewals, and any backend without ``renew_leases`` today), and
``batched`` lets hold() coalesce renewals into ``renew_leases`` calls. Redis and
PostgreSQL are private servers started with the test harness (``tests/servers.py``):
loopback, temporary directories, stopped afterwards. SQLite is a file in a temporary
directory.

Per mode, after the holds are entered and one renewal period has passed:

- ``round trips / period``: calls that reached the provider (``renew_lease`` plus
  ``renew_leases``) per ``renew_every_ms``, counted by a thin proxy in front of it;
- ``client CPU``: this process's CPU time (every thread: the SQLite worker and the
  drivers included) over wall time, in % of one core;
- ``CPU/renewal``: the same CPU time per lease renewed, the figure that does not
  depend on how much of a core a shared machine lets the process have;
- ``worst lag``: the latest any renewal went out after its schedule (previous renewal
  + ``renew_every_ms``), in ms; negative when every renewal went out early (batched
  renewals are sent up to a twentieth of the interval ahead, so that they coalesce);
- ``memory / lease``: growth of this process's resident memory from before the
  holds to after the warm-up period, per held lease (hold objects, timers, tasks,
  driver buffers; for ``memory://`` the store too);
- ``lost``: holds that lost their lease while measured (must be 0); the JSON also
  has those lost while the holds were being entered, 32 at a time, and those that
  could not be entered at all (an acquire that timed out behind 10,000 renewals one
  by one, say). Each loss is counted here rather than logged: leasekit's own warning
  per lost lease is turned off for the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import leasekit
from leasekit import LeaseHold, LeaseResult

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the harness that starts private servers


class CountingProvider:
    """Forwards the contract to ``inner``, counting calls and each key's renewal times."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0
        self.items = 0
        self.interval_s = 1.0
        self.last: dict[str, float] = {}
        self.worst_lag_s = -float("inf")
        self.capabilities = inner.capabilities

    def reset(self) -> None:
        self.calls = self.items = 0
        self.worst_lag_s = -float("inf")

    def _seen(self, key: str, now: float) -> None:
        last = self.last.get(key)
        if last is not None:
            lag = now - last - self.interval_s
            self.worst_lag_s = max(self.worst_lag_s, lag)
        self.last[key] = now

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        result = await self.inner.acquire_lease(key, owner, ttl_ms)
        self.last[key] = time.monotonic()
        return result  # type: ignore[no-any-return]

    async def get_lease_owner(self, key: str) -> str | None:
        return await self.inner.get_lease_owner(key)  # type: ignore[no-any-return]

    async def release_lease(self, key: str, owner: str) -> None:
        await self.inner.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        self.calls += 1
        self.items += 1
        self._seen(key, time.monotonic())
        return await self.inner.renew_lease(key, owner, ttl_ms)  # type: ignore[no-any-return]

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)  # type: ignore[no-any-return]


class BatchingCountingProvider(CountingProvider):
    """The same, offering the inner provider's ``renew_leases`` to hold()."""

    async def renew_leases(self, items: Sequence[tuple[str, str, int]]) -> list[bool]:
        self.calls += 1
        self.items += len(items)
        now = time.monotonic()
        for key, _, _ in items:
            self._seen(key, now)
        return await self.inner.renew_leases(items)  # type: ignore[no-any-return]


@dataclass
class Result:
    backend: str
    mode: str
    holds: int
    periods: float
    round_trips_per_period: float
    renewals_per_period: float
    cpu_percent: float
    cpu_us_per_renewal: float
    worst_lag_ms: float
    memory_per_lease_bytes: float
    lost: int
    lost_while_entering: int
    failed_to_enter: int
    enter_s: float


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def run_mode(
    backend: str, url: str, options: dict[str, Any], mode: str, args: argparse.Namespace
) -> Result:
    async with leasekit.connect(url, **options) as inner:
        if mode == "batched" and not callable(getattr(inner, "renew_leases", None)):
            print(f"  {backend}: no renew_leases, batched = one by one", file=sys.stderr)
        wrapper = BatchingCountingProvider if mode == "batched" else CountingProvider
        provider = wrapper(inner)
        renew_every_ms = args.ttl_ms // 3
        provider.interval_s = renew_every_ms / 1000
        tag = os.urandom(4).hex()
        rss_before = rss_bytes()
        entered = time.monotonic()
        holds, failed_to_enter = await enter_holds(provider, tag, args)
        enter_s = time.monotonic() - entered
        try:
            await asyncio.sleep(provider.interval_s * 1.5)  # every hold renewed once
            rss_after = rss_bytes()
            lost_before = sum(lease.lost.is_set() for lease in holds)
            provider.reset()
            cpu0, wall0 = time.process_time(), time.monotonic()
            await asyncio.sleep(provider.interval_s * args.periods)
            cpu1, wall1 = time.process_time(), time.monotonic()
            calls, items, worst_lag_s = provider.calls, provider.items, provider.worst_lag_s
            lost = sum(lease.lost.is_set() for lease in holds) - lost_before
        finally:
            await exit_holds(holds)
        periods = (wall1 - wall0) / provider.interval_s
        return Result(
            backend=backend,
            mode=mode,
            holds=args.holds,
            periods=round(periods, 2),
            round_trips_per_period=round(calls / periods, 1),
            renewals_per_period=round(items / periods, 1),
            cpu_percent=round(100 * (cpu1 - cpu0) / (wall1 - wall0), 1),
            cpu_us_per_renewal=round(1e6 * (cpu1 - cpu0) / max(items, 1), 1),
            worst_lag_ms=round(worst_lag_s * 1000, 1),
            memory_per_lease_bytes=round((rss_after - rss_before) / args.holds),
            lost=lost,
            lost_while_entering=lost_before,
            failed_to_enter=failed_to_enter,
            enter_s=round(enter_s, 2),
        )


ENTER_TASKS = 32
"""Holds entered (and left) at once: 10,000 acquires one after another take minutes on
a loaded machine, and a process holding 10,000 leases takes them from many tasks."""


async def enter_holds(
    provider: CountingProvider, tag: str, args: argparse.Namespace
) -> tuple[list[LeaseHold], int]:
    """The holds entered, and how many could not be (their acquire failed)."""
    holds: list[LeaseHold] = []
    failed = 0
    names = iter(range(args.holds))

    async def enter() -> None:
        nonlocal failed
        for i in names:
            lease = leasekit.hold(
                provider, f"10k-{tag}-{i}", f"bench-{tag}", args.ttl_ms, on_lost="flag"
            )
            try:
                holds.append(await lease.__aenter__())
            except leasekit.LeaseError:
                failed += 1

    await asyncio.gather(*(enter() for _ in range(ENTER_TASKS)))
    return holds, failed


async def exit_holds(holds: list[LeaseHold]) -> None:
    leaving = iter(holds)

    async def leave() -> None:
        for lease in leaving:
            await lease.__aexit__(None, None, None)

    await asyncio.gather(*(leave() for _ in range(ENTER_TASKS)))


@contextlib.asynccontextmanager
async def backend_url(name: str, workdir: Path) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    if name == "memory":
        yield "memory://", {}
    elif name == "sqlite":
        yield f"sqlite:///{workdir}/10k.db", {}
    elif name == "redis":
        from servers import RedisServer  # noqa: PLC0415 (after the sys.path entry)

        binary = RedisServer.find()
        if binary is None:
            raise SystemExit("redis-server not found")
        with RedisServer(binary, workdir / "redis") as server:
            yield server.url, {}
    elif name == "postgres":
        from servers import PostgresServer  # noqa: PLC0415

        binary = PostgresServer.find()
        if binary is None:
            raise SystemExit("postgres not found")
        (workdir / "pg").mkdir()
        with PostgresServer(binary, workdir / "pg") as server:
            yield server.url, {}
    else:
        raise SystemExit(f"unknown backend {name!r}")


async def main_async(args: argparse.Namespace) -> list[Result]:
    results = []
    for name in args.backends.split(","):
        with tempfile.TemporaryDirectory(prefix="leasekit-10k-") as tmp:
            workdir = Path(tmp)
            (workdir / "redis").mkdir()
            async with backend_url(name, workdir) as (url, options):
                for mode in args.modes.split(","):
                    result = await run_mode(name, url, options, mode, args)
                    print(format_row(result), file=sys.stderr, flush=True)
                    results.append(result)
    return results


COLUMNS: list[tuple[str, str, Callable[[Result], object]]] = [
    ("backend", "<9", lambda r: r.backend),
    ("mode", "<10", lambda r: r.mode),
    ("round trips/period", ">18", lambda r: f"{r.round_trips_per_period:,.1f}"),
    ("renewals/period", ">15", lambda r: f"{r.renewals_per_period:,.0f}"),
    ("client CPU", ">10", lambda r: f"{r.cpu_percent:.1f} %"),
    ("CPU/renewal", ">11", lambda r: f"{r.cpu_us_per_renewal:.1f} us"),
    ("worst lag", ">10", lambda r: f"{r.worst_lag_ms:.1f} ms"),
    ("memory/lease", ">12", lambda r: f"{r.memory_per_lease_bytes:,.0f} B"),
    ("lost", ">4", lambda r: r.lost),
]


def format_row(result: Result) -> str:
    return "  ".join(format(str(get(result)), spec) for _, spec, get in COLUMNS)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holds", type=int, default=10_000)
    parser.add_argument("--ttl-ms", type=int, default=3000)
    parser.add_argument("--periods", type=float, default=5)
    parser.add_argument("--backends", default="memory,postgres,redis")
    parser.add_argument("--modes", default="one_by_one,batched")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    unknown = set(args.modes.split(",")) - {"one_by_one", "batched"}
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(sorted(unknown))}: one_by_one, batched")
    logging.getLogger("leasekit").setLevel(logging.ERROR)  # losses are counted instead
    print("  ".join(format(title, spec) for title, spec, _ in COLUMNS), file=sys.stderr)
    results = asyncio.run(main_async(args))
    by_backend: dict[str, dict[str, Result]] = {}
    for result in results:
        by_backend.setdefault(result.backend, {})[result.mode] = result
    print("\nbatched / one_by_one, same run:", file=sys.stderr)
    for name, modes in by_backend.items():
        if len(modes) < 2:  # one mode only: nothing to compare
            continue
        before, after = modes["one_by_one"], modes["batched"]
        trips = after.round_trips_per_period / max(before.round_trips_per_period, 1e-9)
        print(
            f"  {name:<9} round trips {100 * trips:.2f} % of one-by-one, "
            f"CPU {after.cpu_percent:.1f} % vs {before.cpu_percent:.1f} % of one core",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
