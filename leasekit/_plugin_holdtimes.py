"""How long leases are held, as the metrics plugins measure it from the lease events.

A grant (``leasekit_acquired``, or the receiving side of ``leasekit_transferred``)
starts a hold; a release, a transfer away or a loss ends it. An idempotent re-acquire
by the same owner keeps the hold's start. Only what this process saw: a lease that
simply expires without anyone here noticing has no end event and is forgotten once
more than ``limit`` holds are open (the oldest first), so memory stays bounded.
"""

from __future__ import annotations

import threading
import time

__all__ = ["HoldTimes"]


class HoldTimes:
    """Open holds by ``(backend, key, owner)``, on :func:`time.perf_counter`; thread-safe."""

    def __init__(self, limit: int = 100_000) -> None:
        self._limit = limit
        self._started: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()

    def start(self, backend: str, key: str, owner: str) -> None:
        now = time.perf_counter()
        with self._lock:
            started = self._started
            if (backend, key, owner) in started:
                return  # an idempotent re-acquire: the same hold goes on
            started[backend, key, owner] = now
            if len(started) > self._limit:
                del started[next(iter(started))]

    def end(self, backend: str, key: str, owner: str) -> float | None:
        """Seconds since the hold started, or ``None`` if no hold of it was seen."""
        now = time.perf_counter()
        with self._lock:
            started = self._started.pop((backend, key, owner), None)
        return None if started is None else now - started

    def __len__(self) -> int:
        return len(self._started)
