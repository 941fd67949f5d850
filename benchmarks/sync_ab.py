"""Blocking contenders on Redis, interleaved: leasekit.sync against redis-py's sync Lock.

``leasekit bench`` runs each contender for a whole scenario, so on a shared machine a
slow spell lands on one of them. This runs every sync contender of ``leasekit bench``
(the very same cyclers) for a short slice, one after another, many times, and reports
the median cycles/s, the median CPU per cycle (this process's CPU time) and the median
of the per-repetition ratios to redis-py's sync ``Lock``::

    python benchmarks/sync_ab.py redis://127.0.0.1:6379/0 --threads 1 16 --reps 10
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid

from leasekit_redis._bench import BENCH

from leasekit.bench import BenchTarget

CONTENDERS = ("leasekit-sync", "redis-py-lock-sync", "redis-raw-sync")
REFERENCE = "redis-py-lock-sync"


def measure(cycle: object, threads: int, seconds: float, namespace: str) -> tuple[float, float]:
    """Cycles/s and CPU µs per cycle, ``threads`` threads on keys of their own."""
    counts = [0] * threads
    stop = time.perf_counter() + seconds
    start = threading.Barrier(threads + 1)

    def work(index: int) -> None:
        keys = [f"{namespace}:t{index}:k{n}" for n in range(64)]
        owner = f"{namespace}:owner-{index}"
        done = 0
        start.wait()
        while time.perf_counter() < stop:
            if cycle(keys[done % 64], owner):  # type: ignore[operator]
                done += 1
        counts[index] = done

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    cpu = time.process_time()
    began = time.perf_counter()
    start.wait()
    for thread in pool:
        thread.join()
    elapsed = time.perf_counter() - began
    total = max(1, sum(counts))
    return total / elapsed, (time.process_time() - cpu) / total * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    namespace = f"leasekit-bench-{uuid.uuid4().hex[:10]}"
    target = BenchTarget(args.url, 30_000, namespace)
    chosen = {c.id: c for c in BENCH.contenders if c.id in CONTENDERS}
    cyclers = {}
    for name in CONTENDERS:
        opener = chosen[name].open_sync
        assert opener is not None
        cyclers[name] = opener(target)
    try:
        for threads in args.threads:
            rates: dict[str, list[float]] = {name: [] for name in CONTENDERS}
            cpus: dict[str, list[float]] = {name: [] for name in CONTENDERS}
            for cycler in cyclers.values():  # warm up
                measure(cycler.cycle, threads, 0.2, namespace)
            for rep in range(args.reps):
                order = CONTENDERS if rep % 2 == 0 else CONTENDERS[::-1]
                for name in order:
                    rate, cpu = measure(cyclers[name].cycle, threads, args.seconds, namespace)
                    rates[name].append(rate)
                    cpus[name].append(cpu)
            print(f"{threads} thread(s), {args.reps} interleaved reps of {args.seconds:g} s:")
            for name in CONTENDERS:
                ratios = [a / b for a, b in zip(rates[name], rates[REFERENCE], strict=True)]
                cpu_ratios = [a / b for a, b in zip(cpus[name], cpus[REFERENCE], strict=True)]
                print(
                    f"  {name:20} {statistics.median(rates[name]):8.0f} cycles/s  "
                    f"{statistics.median(cpus[name]):5.0f} us CPU/cycle  "
                    f"x Lock {statistics.median(ratios):.2f} (cycles), "
                    f"{statistics.median(cpu_ratios):.2f} (CPU)"
                )
    finally:
        for cycler in cyclers.values():
            cycler.close()
        import redis  # noqa: PLC0415

        with redis.Redis.from_url(args.url) as client:
            names = list(client.scan_iter(match=f"*{namespace}*", count=1000))
            for at in range(0, len(names), 500):
                client.unlink(*names[at : at + 500])


if __name__ == "__main__":
    main()
