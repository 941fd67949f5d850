"""examples/routing.py, run as a user would: worker processes route each message to its
key's owner by the lease metadata and hand keys on; every message handled once, by the
owner at the time (the example checks it and exits 1 otherwise)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "routing.py"

pytestmark = pytest.mark.slow


def run_example(*args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    summary: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return summary


def check(summary: dict[str, object], messages: int) -> None:
    assert summary["problems"] == []
    assert summary["messages"] == messages
    # The run exercised what it is for: forwarding to owners, and handoffs.
    assert isinstance(summary["forwarded"], int)
    assert summary["forwarded"] > 0
    assert isinstance(summary["handoffs"], int)
    assert summary["handoffs"] > 0


def test_routing_example_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/leases.db"
    check(run_example(url, "--workers", "3", "--keys", "4", "--messages", "60"), 60)


def test_routing_example_on_redis(redis_url: str, redis_prefix: str) -> None:
    url = f"{redis_url}?prefix={redis_prefix}"
    check(run_example(url, "--workers", "3", "--keys", "4", "--messages", "60"), 60)
