"""The ``leasekit`` command line, run as a user runs it: a subprocess."""

from __future__ import annotations

import subprocess
import sys

from leasekit._demo import Holding, find_overlaps


def leasekit(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leasekit", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_demo_on_memory_reports_exclusive_ownership() -> None:
    run = leasekit("demo", "--seconds", "3", "--workers", "4", "--keys", "2", "--ttl-ms", "300")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "verdict      OK: zero overlapping ownerships" in run.stdout
    assert "handoffs" in run.stdout
    assert "thread-0" in run.stdout  # the live view printed owners per key


def test_demo_verdict_catches_a_provider_without_exclusion() -> None:
    # noop:// lets everybody win: the verdict must notice and fail the run.
    run = leasekit("demo", "--quiet", "--seconds", "1", "--ttl-ms", "300", "--url", "noop://")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "VIOLATED" in run.stdout
    assert "overlaps" in run.stdout


def test_demo_with_unknown_scheme_is_a_backend_error() -> None:
    run = leasekit("demo", "--url", "nosuchscheme://x")
    assert run.returncode == 3
    assert "nosuchscheme" in run.stderr
    assert "memory" in run.stderr  # the known schemes are listed


def test_demo_with_malformed_url_is_a_usage_error() -> None:
    run = leasekit("demo", "--url", "not a url")
    assert run.returncode == 2
    assert "invalid url" in run.stderr


def test_demo_rejects_nonpositive_numbers() -> None:
    run = leasekit("demo", "--workers", "0")
    assert run.returncode == 2
    assert "must be at least 1" in run.stderr


def test_backends_lists_builtin_schemes_as_loadable() -> None:
    run = leasekit("backends")
    assert run.returncode == 0, run.stderr
    lines = {line.split()[0]: line for line in run.stdout.splitlines()[1:]}
    assert lines["memory"].rstrip().endswith("yes")
    assert lines["noop"].rstrip().endswith("yes")


def _h(owner: str, start: float, end: float, token: int | None = None) -> Holding:
    return Holding("k", owner, token, start, end, "acquired", "released")


def test_find_overlaps_flags_two_owners_at_once_only() -> None:
    overlaps, disorder = find_overlaps(
        [_h("a", 0, 1, 1), _h("b", 1, 2, 2), _h("c", 1.5, 3, 3), _h("c", 2.5, 4, 3)]
    )
    assert [(x.owner, y.owner) for x, y in overlaps] == [("b", "c")]
    assert disorder == []


def test_find_overlaps_flags_tokens_out_of_time_order() -> None:
    _, disorder = find_overlaps([_h("a", 0, 1, 5), _h("b", 2, 3, 4)])
    assert [(x.token, y.token) for x, y in disorder] == [(4, 5)]
