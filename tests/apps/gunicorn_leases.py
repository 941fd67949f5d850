"""A WSGI app for tests/test_gunicorn.py: a lease per request through leasekit.sync.

Loaded by gunicorn with ``--preload``: the facade is opened (and used) at import, in the
master, before the workers are forked, as service code often does. Each request takes
the lease of ``?key=``, proves exclusivity with a marker file that only one holder at a
time can create (``O_EXCL``), and releases.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

from exclusive import inside

import leasekit
import leasekit.sync

MARKERS = os.environ["LEASEKIT_APP_MARKERS"]
TTL_MS = 30_000

leases = leasekit.sync.connect(os.environ["LEASEKIT_APP_URL"])
_warm_owner = leasekit.new_owner_id("master")
assert leases.acquire_lease("warm-up", _warm_owner, TTL_MS).acquired
leases.release_lease("warm-up", _warm_owner)


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    key = parse_qs(environ.get("QUERY_STRING", ""))["key"][0]
    owner = leasekit.new_owner_id("worker")
    answer: dict[str, Any] = {"pid": os.getpid(), "key": key}
    result = leases.acquire_lease(key, owner, TTL_MS)
    answer["acquired"] = result.acquired
    if result.acquired:
        answer.update(inside(leases, key, owner, MARKERS))
        leases.release_lease(key, owner)
    else:
        answer["holder"] = result.owner
    body = json.dumps(answer).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]
