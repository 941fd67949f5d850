"""What the prefork test apps (gunicorn, Celery) do while they hold a key's lease.

Proves exclusivity with a marker file that only one holder at a time can create
(``O_EXCL``), and that the store still names this holder, then removes the marker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import leasekit.sync

PATIENCE_S = 10.0
"""As tests/faults.py's (this module is also imported by the apps, outside pytest)."""


def inside(
    leases: leasekit.sync.SyncLeaseProvider, key: str, owner: str, markers: str
) -> dict[str, Any]:
    """What the holder of ``key`` saw: ``overlap`` if another holder was inside too."""
    marker = os.path.join(markers, key)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return {"overlap": True}
    os.close(fd)
    time.sleep(0.002)
    still_owner = leases.get_lease_owner(key) == owner
    os.unlink(marker)
    return {"still_owner": still_owner}


def check_answers(answers: list[dict[str, Any]], expected: int) -> list[dict[str, Any]]:
    """Every request answered, no overlap, the holders still named; the granted ones."""
    assert len(answers) == expected
    assert not [a for a in answers if a.get("overlap")], "two holders of one key at once"
    granted = [a for a in answers if a.get("acquired", True)]
    assert granted, "no request got a lease"
    assert all(a["still_owner"] for a in granted)
    assert len({a["pid"] for a in answers}) > 1, "one worker served everything"
    return granted


def stop_on_sigterm(process: subprocess.Popen[bytes], log: Path, what: str) -> int:
    """SIGTERM ``process`` and wait for it (generously); a server that hangs fails the test."""
    import pytest  # noqa: PLC0415 (the apps import this module without pytest)

    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=6 * PATIENCE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"{what} did not stop on SIGTERM:\n{log.read_text()}")
