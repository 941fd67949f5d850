"""leasekit.sync: leases from plain threads, no event loop in sight (think Flask or Celery).

Run it from a checkout after ``pip install -e .``::

    python examples/sync_example.py

Eight threads share one blocking facade over a SQLite file in a temporary directory.
"""

# ruff: noqa: T201  (an example program reports what it does by printing)

from __future__ import annotations

import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import leasekit
import leasekit.sync

THREADS = 8


def main(url: str) -> None:
    with leasekit.sync.connect(url) as leases:
        # 1. Eight threads race for one key at the same moment: exactly one wins, the
        #    others learn who did and would route their work there.
        start = threading.Barrier(THREADS)
        everyone_tried = threading.Barrier(THREADS)

        def contend(index: int) -> str:
            owner = leasekit.new_owner_id(f"thread{index}")  # unique per holder
            start.wait()
            try:
                with leasekit.sync.hold(leases, "nightly-report", owner, ttl_ms=10_000):
                    everyone_tried.wait()  # keep it while the others try
                    return "won"
            except leasekit.LeaseHeld as busy:
                everyone_tried.wait()
                return "told" if busy.holder is not None else "denied"

        with ThreadPoolExecutor(THREADS) as pool:
            outcomes = list(pool.map(contend, range(THREADS)))
        print(f"winners: {outcomes.count('won')}, told the holder: {outcomes.count('told')}")

        # 2. A critical section across threads: each waits its turn (wait_s=None) and
        #    checks .lost between steps, since a thread cannot be interrupted.
        inside, most = 0, 0
        guard = threading.Lock()

        def critical(index: int) -> None:
            nonlocal inside, most
            owner = leasekit.new_owner_id(f"thread{index}")
            with leasekit.sync.hold(leases, "ledger", owner, ttl_ms=10_000, wait_s=None) as lease:
                with guard:
                    inside += 1
                    most = max(most, inside)
                for _step in range(3):
                    if lease.lost.is_set():
                        break  # someone else may own the ledger now: stop writing
                    time.sleep(0.001)  # one step of work
                with guard:
                    inside -= 1

        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(critical, range(THREADS)))
        print(f"threads inside the critical section at once, at most: {most}")

        # 3. The plain operations block and return what the async ones return.
        first = leases.acquire_lease("config", "admin", ttl_ms=5_000)
        print(
            f"admin acquired config: {first.acquired}; owner now {leases.get_lease_owner('config')}"
        )
        leases.release_lease("config", "admin")
    print("facade closed, its loop thread stopped")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as directory:
        main(f"sqlite:///{directory}/leases.db")
