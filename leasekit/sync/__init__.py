"""The blocking API, for code without an event loop: Flask views, Celery tasks, scripts.

::

    with leasekit.sync.connect("sqlite:///leases.db") as leases:
        result = leases.acquire_lease("thread-42", owner, ttl_ms=30_000)

A facade (:class:`SyncLeaseProvider`) drives the backend one of two ways. Where the
backend offers a native blocking provider (:class:`leasekit.backend.SupportsSyncProvider`:
Redis, PostgreSQL, SQLite), the five operations run on the driver's own blocking client in
the calling thread, with no thread hop; that provider shares the backend's scripts
or statements, options, validation, errors and reply parsing with its async one.
Otherwise (and for :func:`wrap`, ``native=False``, or while an event plugin is
registered) the facade runs one event loop in one background thread and runs the
async provider there; each blocking call submits one coroutine to that loop and
waits for it. Nothing is written twice either way: :func:`hold` is
:func:`leasekit.hold` running on the facade's loop (started on first use on a native
facade). Any number of threads may share one facade.
"""

from __future__ import annotations

from ._facade import SyncLeaseProvider
from ._factories import connect, wrap
from ._holding import SyncLeaseHold, SyncOnLost, elect, hold, leaders, wait_for, watch_owner
from ._lock import Lock

__all__ = [
    "Lock",
    "SyncLeaseHold",
    "SyncLeaseProvider",
    "SyncOnLost",
    "connect",
    "elect",
    "hold",
    "leaders",
    "wait_for",
    "watch_owner",
    "wrap",
]
