"""Where one task's acquire+release cycle spends the client's CPU: leasekit against the floor.

    python benchmarks/profile_cycle.py URL [--cycles N] [--rounds R] [--top K]

For the URL's scheme, runs ``N`` cycles of leasekit and of the scheme's raw-driver floor
(the contender ``leasekit bench`` calls the floor), one task cycling 16 keys as the
bench's 1-task scenario does. For each it prints:

- the wall and CPU time per cycle (``time.perf_counter``, ``time.process_time``)
  without a profiler, from the fastest of ``R`` interleaved rounds, so the two are
  measured alike; wall less CPU is the time the process waited, mostly for the server;
- the profiler's split of its own time by layer: leasekit (core and backend), the
  driver, asyncio and the event loop, socket sends and receives, other built-ins, the
  rest, and the time spent in the selector's poll, which is mostly waiting for the
  server (wall time, not CPU: the server's share of a cycle). cProfile slows Python
  code more than C code, so the split is a guide to where the difference lies, not a
  second measurement of it;
- the ``K`` leasekit functions with the most time of their own.

Point it at a server you can spare (it writes keys named ``leasekit-bench-<id>...``
and deletes them); ``docs/benchmarks.md`` has the numbers this gave.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import time
import uuid
from collections import defaultdict

from leasekit.bench import LEASEKIT, AsyncCycler, BenchTarget, Contender, scheme_bench

TTL_MS = 30_000
KEYS = 16
_DRIVERS = ("redis", "psycopg", "aetcd", "grpc", "sqlite3", "asyncmy", "aiosqlite")


def layer(filename: str, function: str) -> str:
    """Which layer a profiled function belongs to, from where it is defined."""
    if filename == "~":
        if any(word in function for word in ("select", "epoll", "poll")):
            name = "poll (waiting)"
        else:
            name = "socket I/O" if "socket" in function else "other built-ins"
        return name
    path = filename.replace("\\", "/")
    if "/leasekit/" in path or "/leasekit_" in path:
        name = "leasekit"
    elif any(f"/{driver}" in path for driver in _DRIVERS):
        name = "driver"
    elif "/asyncio/" in path or path.endswith("selectors.py"):
        name = "asyncio"
    else:
        name = "rest"
    return name


def floor_of(url: str) -> Contender:
    bench = scheme_bench(url.split("://", 1)[0])
    floors = [c for c in bench.contenders if c.role == "floor" and c.open_async is not None]
    if not floors:
        raise SystemExit(f"no async floor declared for {url.split('://', 1)[0]}://")
    return floors[0]


async def _cycles(cycler: AsyncCycler, namespace: str, n: int) -> None:
    keys = [f"{namespace}:profile:{i}" for i in range(KEYS)]
    owner = f"{namespace}:owner"
    for i in range(n):
        await cycler.cycle(keys[i % KEYS], owner)


def measure(
    contender: Contender, target: BenchTarget, cycles: int, profiler: cProfile.Profile | None
) -> tuple[float, float]:
    """CPU and wall µs per cycle of ``cycles`` cycles (after a warmup), maybe profiled."""
    open_async = contender.open_async
    assert open_async is not None

    async def run() -> tuple[float, float]:
        cycler = await open_async(target)
        try:
            await _cycles(cycler, target.namespace, min(cycles, 500))  # warm up
            start, wall = time.process_time(), time.perf_counter()
            if profiler is not None:
                profiler.enable()
            await _cycles(cycler, target.namespace, cycles)
            if profiler is not None:
                profiler.disable()
            cpu_s, wall_s = time.process_time() - start, time.perf_counter() - wall
            return cpu_s * 1e6 / cycles, wall_s * 1e6 / cycles
        finally:
            await cycler.aclose()

    return asyncio.run(run())


Split = tuple[dict[str, float], list[tuple[float, str]]]


def split(profiler: cProfile.Profile, cycles: int) -> Split:
    """Profiled µs per cycle by layer, and leasekit's functions by their own time."""
    stats = pstats.Stats(profiler)
    by_layer: dict[str, float] = defaultdict(float)
    own: list[tuple[float, str]] = []
    for (filename, line, function), row in stats.stats.items():  # type: ignore[attr-defined]
        tottime = row[2] * 1e6 / cycles
        name = layer(filename, function)
        by_layer[name] += tottime
        if name == "leasekit":
            short = filename.rsplit("/", 2)
            own.append((tottime, f"{'/'.join(short[-2:])}:{line} {function}"))
    own.sort(reverse=True)
    return by_layer, own


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("url")
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    contenders = {"leasekit": LEASEKIT, "floor": floor_of(args.url)}
    target = BenchTarget(args.url, TTL_MS, f"leasekit-bench-{uuid.uuid4().hex[:10]}")
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.rounds):
        for name, contender in contenders.items():
            cpu, wall = measure(contender, target, args.cycles, None)
            if name not in best or wall < best[name][1]:
                best[name] = (cpu, wall)
    profiles: dict[str, Split] = {}
    for name, contender in contenders.items():
        profiler = cProfile.Profile()
        measure(contender, target, args.cycles, profiler)
        profiles[name] = split(profiler, args.cycles)
    cleanup = scheme_bench(args.url.split("://", 1)[0]).cleanup
    if cleanup is not None:
        asyncio.run(cleanup(target))

    print(f"{args.url.split('://', 1)[0]}://, {args.cycles} cycles, 1 task")
    print(f"per cycle, unprofiled (the fastest of {args.rounds} rounds), µs:")
    print(f"  {'':16} {'leasekit':>9} {'floor':>9} {'ratio':>11}")
    ours, theirs = best["leasekit"], best["floor"]
    for index, label in enumerate(("CPU", "wall")):
        ratio = ours[index] / theirs[index]
        print(f"  {label:16} {ours[index]:9.1f} {theirs[index]:9.1f} {ratio:10.2f}x")
    waiting = (ours[1] - ours[0], theirs[1] - theirs[0])
    print(f"  {'wall - CPU':16} {waiting[0]:9.1f} {waiting[1]:9.1f} {'':>11}")
    print("profiled time per cycle by layer, µs (cProfile inflates Python code):")
    layers = [
        "leasekit",
        "driver",
        "asyncio",
        "socket I/O",
        "other built-ins",
        "rest",
        "poll (waiting)",
    ]
    print(f"  {'layer':16} {'leasekit':>9} {'floor':>9} {'difference':>11}")
    for name in layers:
        mine, floor = profiles["leasekit"][0][name], profiles["floor"][0][name]
        print(f"  {name:16} {mine:9.1f} {floor:9.1f} {mine - floor:+11.1f}")
    total = [sum(profiles[c][0].values()) for c in ("leasekit", "floor")]
    print(f"  {'total':16} {total[0]:9.1f} {total[1]:9.1f} {total[0] - total[1]:+11.1f}")
    print("leasekit's own functions with the most time of their own, µs per cycle:")
    for tottime, where in profiles["leasekit"][1][: args.top]:
        print(f"  {tottime:6.2f}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
