"""The ``leasekit`` command line, driven as a user drives it: a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from leasekit._demo import Holding, find_overlaps


def leasekit(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leasekit", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# -- demo -------------------------------------------------------------------------------


def test_demo_default_runs_processes_on_sqlite_and_reports_no_overlap() -> None:
    run = leasekit("demo", "--seconds", "4", "--workers", "4", "--keys", "2", "--ttl-ms", "400")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "(processes)" in run.stdout
    assert "sqlite:///" in run.stdout
    assert "verdict      OK: zero overlapping ownerships" in run.stdout
    assert "killed       worker-" in run.stdout  # a holder was killed mid-lease
    assert "thread-0" in run.stdout  # the live view showed owners per key


def test_demo_on_memory_runs_tasks_in_one_process() -> None:
    run = leasekit("demo", "--quiet", "--seconds", "2", "--url", "memory://demo", "--ttl-ms", "300")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "tasks in one process" in run.stdout
    assert "verdict      OK" in run.stdout


def test_demo_verdict_catches_a_provider_without_exclusion() -> None:
    # noop:// lets everybody win: the verdict must notice and fail the run.
    run = leasekit("demo", "--quiet", "--seconds", "1.5", "--ttl-ms", "300", "--url", "noop://")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "VIOLATED" in run.stdout
    assert "overlaps" in run.stdout


def test_demo_rejects_nonpositive_numbers() -> None:
    run = leasekit("demo", "--workers", "0")
    assert run.returncode == 2
    assert "must be at least 1" in run.stderr


# -- one-shot commands -------------------------------------------------------------------


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def test_acquire_owner_transfer_renew_release_exit_codes(url: str) -> None:
    assert leasekit("acquire", url, "job", "alice", "--ttl-ms", "60000").returncode == 0
    denied = leasekit("acquire", url, "job", "bob", "--ttl-ms", "60000")
    assert denied.returncode == 1
    assert denied.stdout.strip() == "held by alice"
    owner = leasekit("owner", url, "job")
    assert (owner.returncode, owner.stdout.strip()) == (0, "alice")
    assert leasekit("transfer", url, "job", "bob", "carol", "--ttl-ms", "1000").returncode == 1
    assert leasekit("transfer", url, "job", "alice", "bob", "--ttl-ms", "60000").returncode == 0
    assert leasekit("renew", url, "job", "alice", "--ttl-ms", "1000").returncode == 1
    assert leasekit("renew", url, "job", "bob", "--ttl-ms", "60000").returncode == 0
    assert leasekit("release", url, "job", "alice").returncode == 0  # not the holder: no-op
    assert leasekit("owner", url, "job").stdout.strip() == "bob"
    assert leasekit("release", url, "job", "bob").returncode == 0
    free = leasekit("owner", url, "job")
    assert (free.returncode, free.stdout.strip()) == (1, "free")


def test_json_output_is_machine_readable(url: str) -> None:
    first = json.loads(leasekit("acquire", url, "k", "a", "--ttl-ms", "60000", "--json").stdout)
    assert first == {"key": "k", "acquired": True, "owner": "a", "token": first["token"]}
    assert isinstance(first["token"], int)
    second = json.loads(leasekit("acquire", url, "k", "b", "--ttl-ms", "60000", "--json").stdout)
    assert second == {"key": "k", "acquired": False, "owner": "a", "token": None}
    owner = json.loads(leasekit("owner", url, "k", "--json").stdout)
    assert owner == {"key": "k", "owner": "a"}


def test_inspect_lists_live_leases(url: str) -> None:
    leasekit("acquire", url, "jobs/1", "a", "--ttl-ms", "60000")
    leasekit("acquire", url, "jobs/2", "b", "--ttl-ms", "60000")
    leasekit("acquire", url, "other", "c", "--ttl-ms", "60000")
    run = leasekit("inspect", url, "--prefix", "jobs/", "--json")
    assert run.returncode == 0, run.stderr
    records = json.loads(run.stdout)
    assert [(r["key"], r["owner"]) for r in records] == [("jobs/1", "a"), ("jobs/2", "b")]
    assert all(0 < r["remaining_ms"] <= 60000 for r in records)


def test_inspect_on_a_backend_that_cannot_list_is_a_usage_error() -> None:
    run = leasekit("inspect", "memory://")
    assert run.returncode == 2
    assert run.stderr.strip() == "leasekit: error: the backend for memory:// cannot list leases"


# -- errors: one line, the right exit status, a traceback only with --debug ---------------


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (("owner", "nosuchscheme://x", "k"), 3, "no leasekit backend for scheme 'nosuchscheme'"),
        (("owner", "not a url", "k"), 2, "invalid url"),
        (("acquire", "memory://", "", "a", "--ttl-ms", "5"), 2, "invalid key: must not be empty"),
        (("owner", "sqlite:///:memory:", "k"), 2, "memory://"),
        (("owner", "sqlite:////nonexistent-dir/x.db", "k"), 3, "sqlite:"),
    ],
)
def test_errors_are_one_line_with_a_documented_exit_status(
    args: tuple[str, ...], status: int, message: str
) -> None:
    run = leasekit(*args)
    assert run.returncode == status, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("leasekit: error: ")
    assert message in lines[0]


def test_debug_shows_the_traceback() -> None:
    run = leasekit("--debug", "owner", "nosuchscheme://x", "k")
    assert run.returncode == 3
    assert "Traceback" in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("leasekit: error: ")


def test_missing_ttl_is_a_usage_error() -> None:
    run = leasekit("acquire", "memory://", "k", "a")
    assert run.returncode == 2
    assert "--ttl-ms" in run.stderr


def test_backends_lists_schemes_with_capabilities() -> None:
    run = leasekit("backends", "--json")
    assert run.returncode == 0, run.stderr
    rows = {row["scheme"]: row for row in json.loads(run.stdout)}
    assert rows["memory"]["loadable"] is True
    assert rows["sqlite"]["loadable"] is True
    assert rows["sqlite"]["capabilities"]["fencing"] is True
    assert rows["sqlite"]["capabilities"]["shared_across_processes"] is True
    table = leasekit("backends")
    assert "sqlite" in table.stdout
    assert "yes" in table.stdout


# -- the verdict's checker ---------------------------------------------------------------


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


def test_check_runs_the_conformance_suite_and_leaves_nothing_behind(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "leasekit", "check", "memory://", "-k", "release"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert " passed" in run.stdout
    assert list(tmp_path.iterdir()) == []


def test_check_of_an_unknown_scheme_fails() -> None:
    run = leasekit("check", "nosuchscheme://x")
    assert run.returncode != 0
    assert "nosuchscheme" in run.stdout + run.stderr
