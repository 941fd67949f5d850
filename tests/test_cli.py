"""The ``leasekit`` command line, driven as a user drives it: a subprocess."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from servers import require_module

import leasekit as leasekit_package
from leasekit._cli import main
from leasekit._demo import DemoReport, Holding, find_overlaps
from leasekit._memory import MemoryLeaseProvider
from leasekit._registry import BackendRegistry


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
    # A holder was killed mid-lease; the report names its key and the takeover.
    killed = next(line for line in run.stdout.splitlines() if line.startswith("killed "))
    assert re.fullmatch(
        r"killed +worker-\S+ while it held thread-\d; "
        r"(worker-\S+ took it over \d+\.\d\d s later \(its TTL of 400 ms ran out.*"
        r"|nobody took thread-\d over before the run ended)",
        killed,
    ), killed
    # The operation count is explained call by call.
    assert re.search(
        r"^operations +\d+ +calls to the store by the workers that were not killed:$",
        run.stdout,
        re.MULTILINE,
    )
    for part in ("acquires (", "denied", "renewals", "lookups (get_lease_owner", "transfers"):
        assert part in run.stdout
    assert "thread-0" in run.stdout  # the live view showed owners per key


def test_demo_on_memory_runs_tasks_in_one_process() -> None:
    run = leasekit("demo", "--quiet", "--seconds", "2", "--url", "memory://demo", "--ttl-ms", "300")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "tasks in one process" in run.stdout
    assert "verdict      OK" in run.stdout
    # Before anything else, the demo says what it demonstrates, in one sentence.
    second = run.stdout.splitlines()[1]
    assert second.startswith("A lease is a key that one owner at a time holds")
    assert second.count(". ") == 0
    assert second.endswith(".")


def test_demo_verdict_catches_a_provider_without_exclusion() -> None:
    # noop:// lets everybody win: the verdict must notice and fail the run.
    run = leasekit("demo", "--quiet", "--seconds", "1.5", "--ttl-ms", "300", "--url", "noop://")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "VIOLATED" in run.stdout
    assert "overlaps" in run.stdout


def test_demo_verdict_lists_ten_violations_then_counts_the_rest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from leasekit._cli._demo_view import print_report  # noqa: PLC0415 (the verdict, no run)

    holdings = [_h(f"w{i}", 0, 1) for i in range(13)]  # 13 owners at once
    overlaps, _ = find_overlaps(holdings)
    report = DemoReport(holdings=holdings, overlaps=overlaps)
    print_report(report, ttl_ms=600)
    out = capsys.readouterr().out
    assert f"VIOLATED: {len(overlaps)} overlapping ownerships" in out
    assert out.count("  overlaps  ") == 10
    assert out.rstrip().endswith(f"  and {len(overlaps) - 10} more")


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


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["acquire", "{url}", "", "a", "--ttl-ms", "1000"], "key"),
        (["acquire", "{url}", "k", "", "--ttl-ms", "1000"], "owner"),
        (["owner", "{url}", ""], "key"),
        (["renew", "{url}", "", "a", "--ttl-ms", "1000"], "key"),
        (["release", "{url}", "", "a"], "key"),
        (["transfer", "{url}", "k", "", "b", "--ttl-ms", "1000"], "from_owner"),
        (["transfer", "{url}", "k", "a", "", "--ttl-ms", "1000"], "to_owner"),
        (["acquire", "{url}", "k", "a", "--ttl-ms", "1000", "--metadata", "x" * 4097], "metadata"),
        (["acquire", "{url}", "k", "a", "--ttl-ms", "1000", "--metadata", "\ud800"], "metadata"),
        (
            ["transfer", "{url}", "k", "a", "b", "--ttl-ms", "1", "--metadata", "é" * 2049],
            "metadata",
        ),
    ],
)
def test_a_bad_argument_is_refused_before_the_store_is_created(
    argv: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "never.db"
    code = main([part.format(url=f"sqlite:///{store}") for part in argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"leasekit: error: invalid {named}"), err
    assert err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_json_output_is_machine_readable(url: str) -> None:
    first = json.loads(leasekit("acquire", url, "k", "a", "--ttl-ms", "60000", "--json").stdout)
    assert first == {
        "key": "k",
        "acquired": True,
        "owner": "a",
        "token": first["token"],
        "metadata": None,
    }
    assert isinstance(first["token"], int)
    second = json.loads(leasekit("acquire", url, "k", "b", "--ttl-ms", "60000", "--json").stdout)
    assert second == {"key": "k", "acquired": False, "owner": "a", "token": None, "metadata": None}
    # SQLite reads records: the owner's JSON is the whole record.
    owner = json.loads(leasekit("owner", url, "k", "--json").stdout)
    assert owner == {
        "key": "k",
        "owner": "a",
        "token": first["token"],
        "remaining_ms": owner["remaining_ms"],
        "metadata": None,
    }
    assert 0 < owner["remaining_ms"] <= 60_000
    assert json.loads(leasekit("owner", url, "free", "--json").stdout) == {
        "key": "free",
        "owner": None,
    }


def test_metadata_is_stored_with_the_grant_and_shown_to_the_denied(url: str) -> None:
    took = leasekit("acquire", url, "k", "a", "--ttl-ms", "60000", "--metadata", "10.0.0.7:8080")
    assert took.returncode == 0, took.stderr
    denied = leasekit("acquire", url, "k", "b", "--ttl-ms", "60000")
    assert (denied.returncode, denied.stdout.strip()) == (1, "held by a (metadata 10.0.0.7:8080)")
    record = json.loads(leasekit("owner", url, "k", "--json").stdout)
    assert (record["owner"], record["metadata"]) == ("a", "10.0.0.7:8080")
    moved = leasekit("transfer", url, "k", "a", "b", "--ttl-ms", "60000", "--metadata", "héllo")
    assert moved.returncode == 0, moved.stderr
    listed = json.loads(leasekit("inspect", url, "--json").stdout)
    assert [(r["key"], r["owner"], r["metadata"]) for r in listed] == [("k", "b", "héllo")]
    shown = leasekit("inspect", url).stdout
    assert "metadata=héllo" in shown


def test_metadata_on_a_backend_without_it_is_a_usage_error() -> None:
    run = leasekit("acquire", "noop://", "k", "a", "--ttl-ms", "1000", "--metadata", "x")
    assert run.returncode == 2
    assert (
        run.stderr.strip() == "leasekit: error: the backend for noop:// cannot store lease metadata"
    )


def test_inspect_lists_live_leases(url: str) -> None:
    leasekit("acquire", url, "jobs/1", "a", "--ttl-ms", "60000")
    leasekit("acquire", url, "jobs/2", "b", "--ttl-ms", "60000")
    leasekit("acquire", url, "other", "c", "--ttl-ms", "60000")
    run = leasekit("inspect", url, "--prefix", "jobs/", "--json")
    assert run.returncode == 0, run.stderr
    records = json.loads(run.stdout)
    assert [(r["key"], r["owner"]) for r in records] == [("jobs/1", "a"), ("jobs/2", "b")]
    assert all(0 < r["remaining_ms"] <= 60000 for r in records)


def test_inspect_of_an_empty_store_says_so(url: str) -> None:
    # The store exists (a read never creates one) and holds no live lease.
    leasekit("acquire", url, "gone", "c", "--ttl-ms", "60000")
    leasekit("release", url, "gone", "c")
    run = leasekit("inspect", url)
    assert (run.returncode, run.stdout.strip()) == (0, "no live leases"), run.stderr
    leasekit("acquire", url, "other", "c", "--ttl-ms", "60000")
    run = leasekit("inspect", url, "--prefix", "jobs/")
    assert run.stdout.strip() == "no live leases under the prefix 'jobs/'"
    assert json.loads(leasekit("inspect", url, "--prefix", "jobs/", "--json").stdout) == []


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


def _refused_port() -> int:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        return int(unused.getsockname()[1])


@pytest.mark.parametrize(
    ("driver", "command", "url", "status"),
    [
        (None, "owner", "redis:/user:s3cret@127.0.0.1", 2),
        (None, "owner", "nosuchscheme://user:s3cret@127.0.0.1", 3),
        ("redis", "owner", "redis://user:s3cret@127.0.0.1/abc", 2),
        ("redis", "owner", "redis://user:s3cret@127.0.0.1/0?colour=blue", 2),
        ("redis", "owner", "redis://user:s3cret@127.0.0.1:{port}/0", 3),
        ("psycopg", "owner", "postgresql://user:s3cret@127.0.0.1:{port}/db?timeout_s=2", 3),
        ("asyncmy", "owner", "mysql://user:s3cret@127.0.0.1:{port}/db?timeout_s=2", 3),
        ("aetcd", "owner", "etcd://user:s3cret@127.0.0.1:{port},[::1]:{port}?timeout_s=2", 3),
        ("redis", "check", "redis://user:s3cret@127.0.0.1:{port}/0", 3),
        ("redis", "inspect", "redis://user:s3cret@127.0.0.1:{port}/0", 3),
    ],
)
def test_no_cli_message_shows_the_urls_password(
    driver: str | None, command: str, url: str, status: int
) -> None:
    if driver is not None:
        require_module(driver, extra=driver)
    args = [command, url.format(port=_refused_port())] + (["k"] if command == "owner" else [])
    for debug in ([], ["--debug"]):  # --debug prints the whole chained traceback
        run = leasekit(*debug, *args)
        assert run.returncode == status, run.stdout + run.stderr
        assert run.stderr.strip().splitlines()[-1].startswith("leasekit: error: ")
        assert "s3cret" not in run.stdout + run.stderr


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


def test_backends_table_prints_the_install_hint_of_a_missing_extra_verbatim() -> None:
    # The redis driver made unimportable, as on a machine without the extra: the hint
    # must keep its "[redis]", which rich would otherwise read as markup and drop.
    hide_redis = (
        "import sys; sys.modules['redis'] = None; "
        "from leasekit._cli import main; sys.exit(main(['backends']))"
    )
    run = subprocess.run(
        [sys.executable, "-c", hide_redis],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        env={**os.environ, "COLUMNS": "400"},  # one table row per line
    )
    assert run.returncode == 0, run.stderr
    redis_rows = [line for line in run.stdout.splitlines() if line.split()[1:2] == ["redis"]]
    assert len(redis_rows) == 1, run.stdout
    assert "pip install 'leasekit[redis]'" in redis_rows[0]


def test_demo_live_view_prints_keys_and_owners_verbatim() -> None:
    from leasekit._cli._demo_view import render  # noqa: PLC0415 (the live view, off-screen)

    rich_console = require_module("rich.console", install="pip install rich")
    console = rich_console.Console(width=120, record=True, file=io.StringIO())
    console.print(render({"[bold]k": "[red]w", "k2": None}, 1.0, "[red]w"))
    text = console.export_text()
    assert "[bold]k" in text
    assert "[red]w (killed, expiring)" in text
    assert "killed [red]w while it held a lease" in text


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
        timeout=300,  # the selected checks run twice, through both drivers
        check=False,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert " passed" in run.stdout
    assert list(tmp_path.iterdir()) == []


def test_check_of_an_unknown_scheme_fails_like_every_command() -> None:
    run = leasekit("check", "nosuchscheme://x")
    assert run.returncode == 3, run.stdout + run.stderr
    assert run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        line for line in run.stderr.strip().splitlines() if line.startswith("leasekit: error: ")
    ]
    assert "no leasekit backend for scheme 'nosuchscheme'" in run.stderr


def test_check_of_a_store_that_refuses_fails_in_one_line() -> None:
    require_module("redis", extra="redis")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    # Nothing listens on the port now: every connection is refused.
    run = leasekit("check", f"redis://127.0.0.1:{port}")
    assert run.returncode == 3, run.stdout + run.stderr
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("leasekit: error: redis: ")


def test_check_of_a_store_that_never_answers_fails_in_one_line_within_the_timeout() -> None:
    require_module("redis", extra="redis")
    # A listener that accepts connections (the kernel completes the handshake) and
    # never reads or answers: a stalled store.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        run = leasekit("check", "--timeout-s", "1", f"redis://127.0.0.1:{port}")
    assert run.returncode == 3, run.stdout + run.stderr
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert lines == [
        "leasekit: error: redis: the store gave no answer within 1 s; "
        "the conformance suite did not run"
    ], run.stderr


def test_check_usage_shows_the_pytest_arguments_as_optional() -> None:
    run = leasekit("check", "--help")
    assert run.returncode == 0
    assert "URL [PYTEST_ARGS ...]" in run.stdout


def test_read_only_commands_pass_the_backends_read_only_options(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The CLI knows no backend: a backend's class names the options that keep a
    # read from creating its store (SQLite's create=False), and only reads pass them.
    opened: list[dict[str, object]] = []

    class ReadOnlyAware(MemoryLeaseProvider):
        read_only_options: ClassVar[dict[str, object]] = {"create": False}

        @classmethod
        def from_url(cls, url: str, **options: Any) -> MemoryLeaseProvider:
            opened.append(options)
            return MemoryLeaseProvider.from_url("memory://")

    registry = BackendRegistry()
    registry.register("readonlyaware", ReadOnlyAware)
    monkeypatch.setattr(leasekit_package, "_registry", registry)
    url = "readonlyaware://x"
    assert main(["owner", url, "k"]) == 1
    assert main(["inspect", url]) == 2  # memory cannot list, but opened it first
    assert main(["acquire", url, "k", "a", "--ttl-ms", "1000"]) == 0
    assert opened == [{"create": False}, {"create": False}, {}]
    # A backend without the attribute opens as it is (memory:// refuses unknown options).
    assert main(["owner", "memory://", "k"]) == 1
    assert "cannot list leases" in capsys.readouterr().err


def test_the_readme_says_check_needs_the_test_extra() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    paragraph = next(p for p in readme.split("\n\n") if "`leasekit check URL`" in p)
    assert "'.[test]'" in paragraph, paragraph
