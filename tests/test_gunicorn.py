"""A real gunicorn (``--preload``, 4 sync workers) serving leases through leasekit.sync.

The app (tests/apps/gunicorn_leases.py) opens ``leasekit.sync.connect(url)`` at import
and uses it there, in the master; the workers are forked from it. Driven by concurrent
HTTP requests on loopback: every request is answered, no key ever has two holders at
once (a marker file only one holder can create), and on SIGTERM every worker exits and
the master with them, without gunicorn killing any.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from apps.exclusive import check_answers, stop_on_sigterm
from faults import PATIENCE_S
from servers import LOOPBACK, free_port, require_module
from test_sync import backend_url

REQUESTS = 200
THREADS = 12
KEYS = 4
WORKERS = 4


@pytest.fixture(params=["sqlite", "redis", "postgres", "mysql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, request, tmp_path)


def wait_until_serving(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 3 * PATIENCE_S
    while time.monotonic() < deadline:
        assert server.poll() is None, "gunicorn exited at start"
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/?key=probe", timeout=5):
                return
        except OSError:
            time.sleep(0.05)
    pytest.fail("gunicorn did not answer")


@pytest.mark.slow
def test_gunicorn_preload_workers_share_a_facade_opened_in_the_master(
    url: str, tmp_path: Path
) -> None:
    require_module("gunicorn", extra="self-test")
    markers = tmp_path / "markers"
    markers.mkdir()
    port = free_port()
    log = tmp_path / "gunicorn.log"
    env = {
        **os.environ,
        "LEASEKIT_APP_URL": url,
        "LEASEKIT_APP_MARKERS": str(markers),
        "PYTHONPATH": str(Path(__file__).parent / "apps"),
    }
    argv = [
        sys.executable, "-m", "gunicorn", "--preload", "--workers", str(WORKERS),
        "--worker-class", "sync", "--bind", f"{LOOPBACK}:{port}",
        "--graceful-timeout", str(int(3 * PATIENCE_S)), "--timeout", str(int(3 * PATIENCE_S)),
        "--log-level", "info", "--error-logfile", str(log), "gunicorn_leases:app",
    ]  # fmt: skip
    server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_until_serving(port, server)

        def request(index: int) -> dict[str, Any]:
            key = f"thread-{index % KEYS}"
            with urllib.request.urlopen(
                f"http://{LOOPBACK}:{port}/?key={key}", timeout=3 * PATIENCE_S
            ) as reply:
                answer: dict[str, Any] = json.load(reply)
                return answer

        with ThreadPoolExecutor(THREADS) as pool:
            answers = list(pool.map(request, range(REQUESTS)))
    finally:
        code = stop_on_sigterm(server, log, "gunicorn")
    text = log.read_text()
    check_answers(answers, REQUESTS)
    assert "WORKER TIMEOUT" not in text, text
    assert "SIGKILL" not in text, text
    assert "Traceback" not in text, text
    assert code == 0, text
