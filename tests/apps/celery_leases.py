"""A Celery app for tests/test_celery.py: a lease per task through leasekit.sync.

The facade is opened (and used) at import, in the worker's main process, before the
prefork pool forks its children. Each task takes the lease of its key, proves
exclusivity with a marker file only one holder at a time can create (``O_EXCL``), and
releases.
"""

from __future__ import annotations

import os
from typing import Any

import celery
from exclusive import inside

import leasekit
import leasekit.sync

MARKERS = os.environ["LEASEKIT_APP_MARKERS"]
TTL_MS = 30_000

app = celery.Celery(
    "celery_leases",
    broker=os.environ["LEASEKIT_APP_BROKER"],
    backend=os.environ["LEASEKIT_APP_BROKER"],
)
app.conf.broker_connection_retry_on_startup = True

leases = leasekit.sync.connect(os.environ["LEASEKIT_APP_URL"])
_warm_owner = leasekit.new_owner_id("celery-main")
assert leases.acquire_lease("warm-up", _warm_owner, TTL_MS).acquired
leases.release_lease("warm-up", _warm_owner)


@app.task(name="celery_leases.take")
def take(key: str) -> dict[str, Any]:
    owner = leasekit.new_owner_id("celery")
    answer: dict[str, Any] = {"pid": os.getpid(), "key": key}
    with leasekit.sync.hold(leases, key, owner, TTL_MS, wait_s=30.0) as lease:
        answer["token"] = lease.token
        answer.update(inside(leases, key, owner, MARKERS))
    return answer
