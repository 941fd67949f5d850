"""A real Celery worker (prefork pool, 4 children, Redis broker) taking a lease per task.

The task module (tests/apps/celery_leases.py) opens ``leasekit.sync.connect(url)`` at
import, in the worker's main process, and uses it there; the pool's children are
forked from it, and each task waits for its key's lease in ``leasekit.sync.hold()``.
Every task finishes, no key ever has two holders at once, and the worker stops on
``SIGTERM``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from apps.exclusive import check_answers, stop_on_sigterm
from faults import PATIENCE_S
from servers import require_module
from test_sync import backend_url

TASKS = 60
KEYS = 3


@pytest.fixture(params=["redis", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, request, tmp_path)


@pytest.mark.slow
def test_celery_prefork_children_share_a_facade_opened_in_the_main_process(
    url: str, redis_url: str, tmp_path: Path
) -> None:
    celery = require_module("celery", extra="self-test")
    markers = tmp_path / "markers"
    markers.mkdir()
    queue = f"leasekit-test-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "celery.log"
    broker = redis_url.split("?", 1)[0]
    env = {
        **os.environ,
        "LEASEKIT_APP_URL": url,
        "LEASEKIT_APP_MARKERS": str(markers),
        "LEASEKIT_APP_BROKER": broker,
        "PYTHONPATH": str(Path(__file__).parent / "apps"),
    }
    argv = [
        sys.executable, "-m", "celery", "-A", "celery_leases", "worker", "--pool", "prefork",
        "--concurrency", "4", "--queues", queue, "--without-heartbeat", "--without-gossip",
        "--without-mingle", "--loglevel", "INFO", "--logfile", str(log),
    ]  # fmt: skip
    worker = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    client = celery.Celery("client", broker=broker, backend=broker)
    try:
        results = [
            client.send_task("celery_leases.take", args=[f"thread-{index % KEYS}"], queue=queue)
            for index in range(TASKS)
        ]
        answers: list[dict[str, Any]] = [result.get(timeout=12 * PATIENCE_S) for result in results]
    finally:
        client.close()
        code = stop_on_sigterm(worker, log, "the Celery worker")
    text = log.read_text()
    check_answers(answers, TASKS)
    for key in {a["key"] for a in answers}:
        tokens = [a["token"] for a in answers if a["key"] == key]
        assert len(set(tokens)) == len(tokens), f"a token of {key} was issued twice"
    assert "Traceback" not in text, text
    assert code == 0, text
