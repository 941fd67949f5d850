"""Recipe: a Celery task that never runs twice at once, on any number of workers.

``rebuild_index`` takes one lease, ``rebuild-index``, for as long as it runs: a second
invocation (on another child of the prefork pool, or on another machine) waits for
the first to finish, then runs. Run a worker from this directory::

    LEASEKIT_URL=redis://localhost:6379/0 CELERY_BROKER_URL=redis://localhost:6379/0 \\
        celery -A celery_single_run worker --pool prefork --concurrency 4

and send it work from anywhere with ``rebuild_index.delay("run-1")``. The stand-in
work appends ``start`` and ``end`` entries to a Redis list, ``RUNS_LIST``, so the
order the Redis server saw them in shows that runs never interleave.
"""

from __future__ import annotations

import os
from typing import Any

import celery
import redis

import leasekit
import leasekit.sync

LEASES_URL = os.environ.get("LEASEKIT_URL", "redis://localhost:6379/0")
BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://localhost:6379/0")
RUNS_LIST = os.environ.get("RECIPE_RUNS_LIST", "recipe:rebuild-index:runs")

app = celery.Celery("celery_single_run", broker=BROKER_URL, backend=BROKER_URL)
app.conf.broker_connection_retry_on_startup = True

# One blocking provider per worker process, opened at import in the worker's main
# process: the prefork children inherit it, and leasekit.sync reopens its connections
# in each child after the fork.
leases = leasekit.sync.connect(LEASES_URL)


@app.task(name="recipes.rebuild_index")
def rebuild_index(run_id: str) -> dict[str, Any]:
    """Rebuild the index; a second invocation waits until the running one is done."""
    owner = leasekit.new_owner_id("rebuild-index")  # unique per invocation
    # ttl_ms bounds how long a crashed worker blocks the next run; hold() renews the
    # lease every ttl_ms / 3 while the body runs. wait_s: how long to queue for it
    # (leasekit.LeaseHeld after that; None waits as long as it takes).
    with leasekit.sync.hold(
        leases, "rebuild-index", owner, ttl_ms=30_000, wait_s=120, on_lost="raise"
    ) as lease:
        _work(run_id, lease)
    return {"run_id": run_id, "token": lease.token, "pid": os.getpid()}


def _work(run_id: str, lease: leasekit.sync.SyncLeaseHold) -> None:
    """The stand-in work: two entries in a Redis list, with a few round trips between."""
    with redis.Redis.from_url(BROKER_URL) as server:
        server.rpush(RUNS_LIST, f"start {run_id} {lease.token}")
        for _ in range(20):
            if lease.lost.is_set():  # stop before any further side effect
                return
            server.ping()
        server.rpush(RUNS_LIST, f"end {run_id} {lease.token}")
