"""``leasekit demo --fencing``: a holder paused past its TTL must have its late write rejected.

Run as a user runs it (a subprocess), on the SQLite default and on the harness's Redis;
the verdict logic is checked on its own for the outcomes a working guard never shows.
"""

from __future__ import annotations

import subprocess
import sys
from urllib.parse import quote

import pytest
from servers import free_port, require_module

from leasekit._demo_fencing import judge_fencing

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGSTOP is POSIX only")

VERDICT = "verdict: fenced: the stale write was rejected"


def leasekit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leasekit", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _assert_scenario(out: str) -> None:
    lines = out.splitlines()
    steps = [
        "worker-a  acquired the lease, fencing token",
        "driver    SIGSTOP worker-a",
        "worker-b  acquired the lease, fencing token",
        ": accepted",
        "driver    SIGCONT worker-a",
        ": REJECTED (fencing token",
    ]
    found = [next(i for i, line in enumerate(lines) if step in line) for step in steps]
    assert found == sorted(found), out  # in this order
    assert lines[-1] == VERDICT


def test_fencing_demo_on_the_sqlite_default_rejects_the_stale_write() -> None:
    run = leasekit("demo", "--fencing", "--ttl-ms", "300")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "resource: SQLite table" in run.stdout
    _assert_scenario(run.stdout)
    assert run.stderr == ""


def test_fencing_demo_on_redis_rejects_the_stale_write_and_cleans_up(
    redis_url: str, redis_prefix: str
) -> None:
    redis = require_module("redis", extra="redis")
    separator = "&" if "?" in redis_url else "?"
    # Every option of the lease store's URL is the backend's to read, the last two
    # included (the demo's own list of them once lacked both, and redis-py refused).
    options = f"prefix={quote(redis_prefix)}&max_connections=4&autopipeline=false"
    url = f"{redis_url}{separator}{options}"
    run = leasekit("demo", "--fencing", "--ttl-ms", "300", "--url", url)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "resource: Redis key" in run.stdout
    _assert_scenario(run.stdout)
    # The document and its fence are gone; only the lease backend's own token counter
    # stays, under the lease prefix.
    with redis.Redis.from_url(redis_url) as client:
        left = [k.decode() for k in client.scan_iter(match="*leasekit-demo-fencing-*")]
    assert [k for k in left if not k.startswith(redis_prefix)] == []


def test_fencing_demo_quiet_prints_only_the_verdict() -> None:
    run = leasekit("demo", "--fencing", "--quiet", "--ttl-ms", "200")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines() == [VERDICT]


def test_fencing_demo_refuses_stores_that_cannot_show_it() -> None:
    shared = leasekit("demo", "--fencing", "--url", "memory://")
    assert shared.returncode == 2
    assert "worker processes share" in shared.stderr
    tokens = leasekit("demo", "--fencing", "--url", "noop://")
    assert tokens.returncode == 3
    assert "fencing" in tokens.stderr


def test_fencing_demo_reports_an_unreachable_store_as_a_backend_error() -> None:
    require_module("redis", extra="redis")
    run = leasekit("demo", "--fencing", "--url", f"redis://127.0.0.1:{free_port()}/0")
    assert run.returncode == 3, run.stdout + run.stderr
    assert "leasekit: error: redis" in run.stderr


GRANT_A, GRANT_B = {"token": 4}, {"token": 9}
REJECTED = {"event": "rejected", "token": 4, "current": 9}
B_WROTE = "written by worker-b with token 9"


def test_verdict_is_fenced_only_when_the_stale_write_was_rejected() -> None:
    verdict = judge_fencing(GRANT_A, GRANT_B, REJECTED, B_WROTE)
    assert verdict.fenced
    assert verdict.summary == "fenced: the stale write was rejected"
    assert (verdict.stale_token, verdict.fresh_token) == (4, 9)


@pytest.mark.parametrize(
    ("stale", "fresh", "late", "final", "reason"),
    [
        (GRANT_A, GRANT_B, {"event": "written", "token": 4}, "written by worker-a", "went through"),
        ({"token": 9}, {"token": 9}, REJECTED, B_WROTE, "did not increase"),
        (GRANT_A, {"token": None}, REJECTED, B_WROTE, "did not increase"),
        (GRANT_A, GRANT_B, REJECTED, None, "not worker-b's write"),
    ],
)
def test_verdict_catches_every_way_fencing_can_fail(
    stale: dict[str, object],
    fresh: dict[str, object],
    late: dict[str, object],
    final: str | None,
    reason: str,
) -> None:
    verdict = judge_fencing(stale, fresh, late, final)
    assert not verdict.fenced
    assert verdict.summary.startswith("NOT FENCED")
    assert reason in verdict.summary
