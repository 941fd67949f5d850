"""leasekit.sync's two paths on one store: the native blocking provider against the loop thread.

Interleaved short slices, medians of cycles/s and CPU per cycle (this process's CPU)::

    python benchmarks/sync_paths.py sqlite:///bench.db postgresql://u@127.0.0.1/db --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import leasekit.sync


def measure(
    leases: leasekit.sync.SyncLeaseProvider, threads: int, seconds: float, tag: str
) -> tuple[float, float]:
    """Cycles/s and CPU µs per cycle, ``threads`` threads on keys of their own."""
    counts = [0] * threads
    stop = time.perf_counter() + seconds

    def work(index: int) -> None:
        done = 0
        owner = f"{tag}-owner-{index}"
        while time.perf_counter() < stop:
            key = f"{tag}-t{index}-k{done % 32}"
            if leases.acquire_lease(key, owner, 30_000).acquired:
                leases.release_lease(key, owner)
                done += 1
        counts[index] = done

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    cpu, began = time.process_time(), time.perf_counter()
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    total = max(1, sum(counts))
    return total / (time.perf_counter() - began), (time.process_time() - cpu) / total * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("urls", nargs="+")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    for url in args.urls:
        facades = {
            "native": leasekit.sync.connect(url).open(),
            "loop": leasekit.sync.connect(url, native=False).open(),
        }
        try:
            for threads in args.threads:
                results: dict[str, list[tuple[float, float]]] = {name: [] for name in facades}
                for name, facade in facades.items():
                    measure(facade, threads, 0.3, f"warm-{name}")
                for rep in range(args.reps):
                    order = list(facades) if rep % 2 == 0 else list(facades)[::-1]
                    for name in order:
                        results[name].append(measure(facades[name], threads, args.seconds, name))
                for name, samples in results.items():
                    rate = statistics.median(r for r, _ in samples)
                    cpu = statistics.median(c for _, c in samples)
                    print(
                        f"{facades[name].backend:10} {threads:2} thread(s) {name:6}: "
                        f"{rate:7.0f} cycles/s {cpu:6.0f} us CPU/cycle"
                    )
        finally:
            for facade in facades.values():
                facade.close()


if __name__ == "__main__":
    main()
