"""``leasekit bench``: the report's shape, never its timings.

Runs are a fraction of a second per scenario, driven as a user drives the command (a
subprocess), against ``memory://``, a SQLite file and the harness's Redis and
PostgreSQL. Nothing here compares rates between contenders: on a shared machine that would be flaky.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from servers import free_port, require_module

import leasekit
from leasekit._bench import _schemes as bench_schemes
from leasekit._bench._handoff import run_handoff
from leasekit.bench import (
    SCENARIOS,
    BenchTarget,
    Contender,
    HandoffPeer,
    SchemeBench,
    run_bench,
)

SHORT = ("--seconds", "0.15")
REPORT_KEYS = {
    "url",
    "scheme",
    "namespace",
    "server",
    "seconds",
    "warmup_s",
    "rounds",
    "ttl_ms",
    "machine",
    "scenarios",
    "contenders",
    "results",
    "skipped",
    "notes",
}
RESULT_KEYS = {
    "contender",
    "label",
    "role",
    "mode",
    "scenario",
    "tasks",
    "attempts",
    "cycles",
    "denied",
    "seconds",
    "cycles_per_s",
    "denied_per_s",
    "p50_ms",
    "p99_ms",
    "cpu_us",
    "ratio_to_floor",
    "round_cycles_per_s",
    "error",
}
# Redis peers by id, and the module each needs.
REDIS_PEERS = {
    "leasekit-sync": "redis",
    "redis-raw-sync": "redis",
    "redis-py-lock-async": "redis",
    "redis-py-lock-sync": "redis",
    "python-redis-lock": "redis_lock",
    "tooz": "tooz",
}
SYNC_PEERS = {"leasekit-sync", "redis-raw-sync", "redis-py-lock-sync", "python-redis-lock", "tooz"}


def leasekit_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leasekit", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def bench_json(url: str, *args: str) -> dict[str, Any]:
    run = leasekit_cli("bench", url, *SHORT, "--json", *args)
    assert run.returncode == 0, run.stdout + run.stderr
    report: dict[str, Any] = json.loads(run.stdout)
    assert set(report) == REPORT_KEYS
    for result in report["results"]:
        assert set(result) == RESULT_KEYS
    return report


def rows(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["contender"], r["scenario"]): r for r in report["results"]}


def assert_measured(result: dict[str, Any]) -> None:
    """Numbers that any working contender produces, however slow the machine."""
    assert result["error"] is None, result
    assert result["attempts"] >= result["tasks"]  # one measured attempt per task at least
    if not SCENARIOS[result["scenario"]].shared_key:
        # On one shared key, a window a loaded machine fills with a few attempts may
        # see each of them denied; on keys of its own every attempt succeeds.
        assert result["cycles"] > 0
        assert result["cycles_per_s"] > 0
    assert result["attempts"] == result["cycles"] + result["denied"]
    assert 0 < result["p50_ms"] <= result["p99_ms"]
    assert result["cpu_us"] > 0
    assert len(result["round_cycles_per_s"]) == 1
    if SCENARIOS[result["scenario"]].shared_key:
        assert result["denied_per_s"] >= 0
    else:
        assert result["denied"] == 0  # every task has keys of its own


def test_memory_reports_leasekit_in_every_scenario() -> None:
    report = bench_json("memory://")
    assert report["scheme"] == "memory"
    assert report["scenarios"] == [
        {"name": "single", "label": "1 task", "tasks": 1, "shared_key": False},
        {"name": "concurrent", "label": "64 tasks", "tasks": 64, "shared_key": False},
        {"name": "contended", "label": "16 tasks, 1 key", "tasks": 16, "shared_key": True},
    ]
    assert [(r["contender"], r["scenario"], r["tasks"]) for r in report["results"]] == [
        ("leasekit", "single", 1),
        ("leasekit", "concurrent", 64),
        ("leasekit", "contended", 16),
    ]
    for result in report["results"]:
        assert_measured(result)
        assert result["ratio_to_floor"] is None  # memory:// has no raw-driver floor
    assert report["machine"]["cpus"] >= 1


def test_the_table_has_a_row_per_contender_and_scenario() -> None:
    run = leasekit_cli("bench", "memory://", *SHORT)
    assert run.returncode == 0, run.stderr
    for text in ("leasekit bench memory://", "1 task", "64 tasks", "16 tasks", "cycles/s"):
        assert text in run.stdout


def test_scenarios_and_rounds_are_chosen_on_the_command_line() -> None:
    report = bench_json("memory://", "--scenarios", "contended", "single", "--rounds", "2")
    assert [r["scenario"] for r in report["results"]] == ["contended", "single"]
    assert report["rounds"] == 2
    for result in report["results"]:
        rates = result["round_cycles_per_s"]
        assert len(rates) == 2
        assert result["cycles_per_s"] == max(rates)  # each row is its fastest round


def test_the_parallel_scenario_runs_sixteen_tasks_on_keys_of_their_own() -> None:
    report = bench_json("memory://", "--scenarios", "parallel")
    (result,) = report["results"]
    assert (result["scenario"], result["tasks"]) == ("parallel", 16)
    assert_measured(result)


def test_sqlite_has_a_raw_sqlite3_floor_and_drops_its_table(tmp_path: Path) -> None:
    path = tmp_path / "bench.db"
    report = bench_json(f"sqlite:///{path}", "--scenarios", "single", "contended")
    measured = rows(report)
    assert set(measured) == {
        (contender, scenario)
        for contender in ("leasekit", "sqlite-raw")
        for scenario in ("single", "contended")
    }
    for result in measured.values():
        assert result["error"] is None, result
        assert result["cycles_per_s"] > 0
    assert measured["sqlite-raw", "single"]["ratio_to_floor"] == 1.0
    assert measured["leasekit", "single"]["ratio_to_floor"] > 0
    with sqlite3.connect(path) as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert "leasekit_bench_floor" not in tables
    assert "leasekit_leases" in tables


def test_redis_measures_leasekit_the_floor_and_every_installed_peer(redis_url: str) -> None:
    import redis  # noqa: PLC0415 (the Redis tests' own dependency)

    report = bench_json(redis_url)
    assert report["server"].startswith(("redis ", "valkey "))
    installed = {peer for peer, module in REDIS_PEERS.items() if importlib.util.find_spec(module)}
    expected = {"leasekit", "redis-raw", *installed}
    measured = rows(report)
    assert {contender for contender, _ in measured} == expected
    assert {s["contender"] for s in report["skipped"]} == set(REDIS_PEERS) - installed
    for skipped in report["skipped"]:
        assert "pip install" in skipped["reason"]
    for (contender, scenario), result in measured.items():
        assert_measured(result)
        assert result["ratio_to_floor"] > 0
        sync = contender in SYNC_PEERS
        assert result["mode"] == ("sync, one thread per task" if sync else "async")
        if contender == "redis-raw":
            assert result["role"] == "floor"
            assert result["ratio_to_floor"] == 1.0
        assert result["tasks"] == SCENARIOS[scenario].tasks
    # Every key the run wrote is gone again, whoever wrote it.
    with redis.Redis.from_url(redis_url) as client:
        assert list(client.scan_iter(match=f"*{report['namespace']}*", count=1000)) == []


def test_postgres_measures_leasekit_the_psycopg_floor_and_tooz(
    postgres_url: str, postgres_schema: str
) -> None:
    import psycopg  # noqa: PLC0415 (the PostgreSQL tests' own dependency)
    from psycopg import sql  # noqa: PLC0415

    # leasekit's table, and so the floor's, in this run's schema; the bench strips the
    # option before handing the URL to psycopg and tooz.
    separator = "&" if "?" in postgres_url else "?"
    url = f"{postgres_url}{separator}table={postgres_schema}.bench_leases"
    # Not 64 tasks: tooz maps lock names onto 65,536 advisory locks, so two of its tasks
    # may collide on distinct keys and see denials there.
    report = bench_json(url, "--scenarios", "single", "contended")
    assert report["server"].startswith("PostgreSQL ")
    tooz = all(importlib.util.find_spec(module) for module in ("tooz", "psycopg2"))
    measured = rows(report)
    assert {contender for contender, _ in measured} == {
        "leasekit",
        "postgres-raw",
        *(("tooz",) if tooz else ()),
    }
    assert [s["contender"] for s in report["skipped"]] == ([] if tooz else ["tooz"])
    for skipped in report["skipped"]:
        assert "pip install tooz psycopg2-binary" in skipped["reason"]
    for (contender, _), result in measured.items():
        assert_measured(result)
        assert result["ratio_to_floor"] > 0
        sync = contender == "tooz"
        assert result["mode"] == ("sync, one thread per task" if sync else "async")
    assert measured["postgres-raw", "single"]["role"] == "floor"
    assert measured["postgres-raw", "single"]["ratio_to_floor"] == 1.0
    # leasekit's rows for the run's keys are deleted, the floor's table dropped.
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        tables = {
            name
            for (name,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s", (postgres_schema,)
            )
        }
        left = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE position(%s IN key) > 0").format(
                sql.Identifier(postgres_schema, "bench_leases")
            ),
            (report["namespace"].encode(),),
        ).fetchone()
    assert "bench_leases" in tables
    assert f"{report['namespace'].replace('-', '_')}_floor" not in tables
    assert left == (0,)
    assert bench_schemes.scheme_bench("postgres") is bench_schemes.scheme_bench("postgresql")


def test_the_postgres_floor_reads_the_url_as_the_provider_does(
    postgres_url: str, postgres_schema: str
) -> None:
    """Every provider option is the provider's to the floor too; a refused URL is refused."""
    import asyncio  # noqa: PLC0415
    import uuid  # noqa: PLC0415

    import psycopg  # noqa: PLC0415 (the PostgreSQL tests' own dependency)

    options = {
        "table": f"{postgres_schema}.floor_leases",
        "notifications": "false",  # never a libpq parameter
        "sweep_every": "0",
        "pool_max_size": "2",
        "server_timeout": "false",
    }
    separator = "&" if "?" in postgres_url else "?"
    url = postgres_url + separator + "&".join(f"{k}={v}" for k, v in options.items())
    bench = bench_schemes.scheme_bench("postgresql")
    (floor,) = [c for c in bench.contenders if c.role == "floor"]
    assert floor.open_async is not None
    assert bench.cleanup is not None
    target = BenchTarget(url, 30_000, f"leasekit-bench-{uuid.uuid4().hex[:10]}")
    table = f"{target.namespace.replace('-', '_')}_floor"

    async def cycles() -> tuple[list[bool], bool]:
        assert floor.open_async is not None
        assert bench.cleanup is not None
        cycler = await floor.open_async(target)
        try:
            done = [await cycler.cycle(f"{target.namespace}:k", "o") for _ in range(3)]
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                found = conn.execute(
                    "SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename = %s",
                    (postgres_schema, table),
                ).fetchone()
            return done, found == (1,)
        finally:
            await cycler.aclose()
            await bench.cleanup(target)

    # The floor's table sits beside leasekit's, in the schema of the URL's table option.
    assert asyncio.run(cycles()) == ([True, True, True], True)
    refused = BenchTarget(f"{url}&sweep_grace_s=1&timeout_s=5", 30_000, target.namespace)
    with pytest.raises(leasekit.InvalidLeaseArgument, match="sweep_grace_s"):
        asyncio.run(floor.open_async(refused))


def test_the_postgres_floor_releases_with_pg_notify_as_leasekit_does(
    postgres_url: str, postgres_schema: str
) -> None:
    """With notifications on (the default), leasekit's acquire (a grant hint) and release
    call pg_notify; the floor runs the same statements, so a listener on the floor
    table's channel hears both."""
    import asyncio  # noqa: PLC0415
    import uuid  # noqa: PLC0415

    import psycopg  # noqa: PLC0415
    from leasekit_postgres._notify import channel_for, decode_payload  # noqa: PLC0415
    from leasekit_postgres._sql import TableName  # noqa: PLC0415

    separator = "&" if "?" in postgres_url else "?"
    url = f"{postgres_url}{separator}table={postgres_schema}.notify_leases"
    bench = bench_schemes.scheme_bench("postgresql")
    (floor,) = [c for c in bench.contenders if c.role == "floor"]
    assert floor.open_async is not None
    assert bench.cleanup is not None
    target = BenchTarget(url, 30_000, f"leasekit-bench-{uuid.uuid4().hex[:10]}")
    table = TableName(postgres_schema, f"{target.namespace.replace('-', '_')}_floor")
    channel = channel_for(str(table))

    async def one_cycle() -> bool:
        assert floor.open_async is not None
        cycler = await floor.open_async(target)
        try:
            return await cycler.cycle(f"{target.namespace}:k", "o")
        finally:
            await cycler.aclose()

    with psycopg.connect(postgres_url, autocommit=True) as listener:
        listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        try:
            assert asyncio.run(one_cycle())
            heard = list(listener.notifies(timeout=10.0, stop_after=2))
        finally:
            assert bench.cleanup is not None
            asyncio.run(bench.cleanup(target))
    assert [n.channel for n in heard] == [channel, channel]
    key = f"{target.namespace}:k"
    assert [decode_payload(n.payload) for n in heard] == [(key, True), (key, False)]


def test_errors_exit_like_the_other_commands() -> None:
    bad_url = leasekit_cli("bench", "not a url", *SHORT)
    assert bad_url.returncode == 2
    assert bad_url.stderr.startswith("leasekit: error:")
    unreachable = leasekit_cli("bench", f"redis://127.0.0.1:{free_port()}/0", *SHORT)
    assert unreachable.returncode == 3
    assert unreachable.stderr.count("\n") == 1, unreachable.stderr  # one line, no traceback
    unknown = leasekit_cli("bench", "memory://", "--scenarios", "sideways")
    assert unknown.returncode == 2


# -- the core, in process: how a backend plugs in its floor and peers --------------------


class _DictLock:
    """A stand-in peer: a blocking lock table shared by threads."""

    def __init__(self) -> None:
        self._held: dict[str, str] = {}
        self._mutex = threading.Lock()

    def cycle(self, key: str, owner: str) -> bool:
        with self._mutex:
            if key in self._held:
                return False
            self._held[key] = owner
        with self._mutex:
            del self._held[key]
        return True

    def close(self) -> None:
        assert not self._held


class _Floor:
    async def cycle(self, key: str, owner: str) -> bool:
        return True

    async def aclose(self) -> None:
        pass


async def _open_floor(target: BenchTarget) -> _Floor:
    return _Floor()


def test_a_scheme_plugs_in_a_floor_and_a_sync_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    cleaned: list[str] = []

    async def cleanup(target: BenchTarget) -> None:
        cleaned.append(target.namespace)

    bench = SchemeBench(
        contenders=(
            Contender("floor", "floor", "floor", open_async=_open_floor),
            Contender("dict-lock", "dict lock", "peer", open_sync=lambda _: _DictLock()),
            Contender(
                "absent",
                "absent",
                "peer",
                open_sync=lambda _: _DictLock(),
                requires=("no_such_module_here",),
                install="pip install nothing",
            ),
        ),
        cleanup=cleanup,
    )
    monkeypatch.setitem(bench_schemes._REGISTERED, "memory", bench)
    report = run_bench("memory://", seconds=0.05, scenarios=["single", "contended"])
    assert cleaned == [report.namespace]
    assert [(r.contender, r.scenario) for r in report.results] == [
        ("leasekit", "single"),
        ("leasekit", "contended"),
        ("floor", "single"),
        ("floor", "contended"),
        ("dict-lock", "single"),
        ("dict-lock", "contended"),
    ]
    reason = "no_such_module_here not installed: pip install nothing"
    assert report.skipped == ({"contender": "absent", "label": "absent", "reason": reason},)
    for result in report.results:
        assert result.error is None
        assert result.cycles > 0
        assert result.ratio_to_floor is not None
    dict_lock = report.result("dict-lock", "contended")
    assert dict_lock is not None
    assert dict_lock.mode == "sync, one thread per task"


def test_a_failing_peer_is_reported_and_a_failing_leasekit_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(target: BenchTarget) -> _DictLock:
        raise RuntimeError("peer exploded\nsecond line")

    bench = SchemeBench(contenders=(Contender("broken", "broken", "peer", open_sync=broken),))
    monkeypatch.setitem(bench_schemes._REGISTERED, "memory", bench)
    report = run_bench("memory://", seconds=0.05, scenarios=["single"])
    failed = report.result("broken", "single")
    assert failed is not None
    assert failed.error == "RuntimeError: peer exploded"
    assert failed.cycles_per_s == 0
    with pytest.raises(leasekit.BackendUnavailable):
        run_bench("nosuchscheme://x", seconds=0.05)


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"seconds": 0}, "seconds"),
        ({"seconds": True}, "seconds"),
        ({"rounds": 0}, "rounds"),
        ({"scenarios": ["sideways"]}, "scenarios"),
        ({"scenarios": []}, "scenarios"),
    ],
)
def test_bad_arguments_raise_before_anything_runs(options: dict[str, Any], argument: str) -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument, match=argument):
        run_bench("memory://", **options)


def test_etcd_measures_leasekit_the_aetcd_floor_and_python_etcd3(etcd_url: str) -> None:
    import asyncio  # noqa: PLC0415 (only this test reads etcd afterwards)

    aetcd = require_module("aetcd", extra="etcd")

    report = bench_json(etcd_url)
    assert report["server"].startswith("etcd ")
    etcd3 = importlib.util.find_spec("etcd3") is not None
    measured = rows(report)
    assert {contender for contender, _ in measured} == {
        "leasekit",
        "aetcd-raw",
        *(("etcd3-lock",) if etcd3 else ()),
    }
    assert [s["contender"] for s in report["skipped"]] == ([] if etcd3 else ["etcd3-lock"])
    for (contender, scenario), result in measured.items():
        assert_measured(result)
        assert result["ratio_to_floor"] > 0
        sync = contender == "etcd3-lock"  # in a child process, one thread per task
        assert result["mode"] == ("sync, one thread per task" if sync else "async")
        assert result["tasks"] == SCENARIOS[scenario].tasks
    assert measured["aetcd-raw", "single"]["role"] == "floor"
    assert measured["aetcd-raw", "single"]["ratio_to_floor"] == 1.0

    # Every key the run wrote is gone: leasekit's, the floor's and python-etcd3's.
    host, _, port = etcd_url.split("://", 1)[1].split(",", maxsplit=1)[0].rpartition(":")

    async def left_behind() -> list[bytes]:
        async with aetcd.Client(host=host, port=int(port)) as client:
            found = []
            for prefix in ("leasekit/", "", "/locks/"):
                got = await client.get_prefix(f"{prefix}{report['namespace']}".encode())
                found.extend(kv.key for kv in got.kvs)
            return found

    assert asyncio.run(left_behind()) == []


def test_handoff_scenario_reports_notifications_beside_polling() -> None:
    report = run_handoff("memory://", handoffs=5, takeovers=1, load_s=0.2, peers=False)
    rows = {row["contender"]: row for row in report.rows()}
    assert set(rows) == {"leasekit, notifications", "leasekit, polling"}
    for row in rows.values():
        assert row["rounds"] == 5
        assert row["handoff_p50_ms"] is not None
        assert row["takeover_p50_ms"] is not None
        assert row["takeover_p50_ms"] >= 0  # taken after the TTL, never before
    # Waiters on a held key send (next to) nothing while they wait with notifications.
    assert rows["leasekit, notifications"]["waiting_requests_per_s_per_waiter"] < 1


def test_handoff_peers_come_from_the_schemes_bench_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    targets: list[tuple[BenchTarget, int]] = []

    async def measure(target: BenchTarget, handoffs: int) -> list[float]:
        targets.append((target, handoffs))
        return [1.0] * handoffs

    bench = SchemeBench(
        handoff_peers=(
            HandoffPeer("a peer", measure),
            HandoffPeer("not installed", measure, requires=("no_such_module_here",)),
        )
    )
    monkeypatch.setitem(bench_schemes._REGISTERED, "memory", bench)
    report = run_handoff("memory://", handoffs=3, takeovers=1, load_s=0.1)
    rows = {row["contender"]: row for row in report.rows()}
    assert set(rows) == {"leasekit, notifications", "leasekit, polling", "a peer"}
    assert rows["a peer"]["rounds"] == 3
    [(target, handoffs)] = targets
    assert (target.url, handoffs) == ("memory://", 3)
    assert target.namespace.startswith("leasekit-bench-handoff-")
    # peers=False measures leasekit alone.
    alone = run_handoff("memory://", handoffs=1, takeovers=1, load_s=0.1, peers=False)
    assert len(targets) == 1
    assert len(alone.rows()) == 2


# -- where the floors and peers come from: the leasekit.bench entry-point group -----------

ROOT = Path(__file__).resolve().parent.parent
CORE_BENCH = [*sorted((ROOT / "leasekit" / "_bench").glob("*.py")), ROOT / "leasekit" / "bench.py"]
# Every in-tree scheme and the backend package that must serve its benchmark.
IN_TREE = {
    "sqlite": "leasekit_sqlite",
    "redis": "leasekit_redis",
    "rediss": "leasekit_redis",
    "postgresql": "leasekit_postgres",
    "postgres": "leasekit_postgres",
    "etcd": "leasekit_etcd",
    "etcds": "leasekit_etcd",
    "mysql": "leasekit_mysql",
    "mariadb": "leasekit_mysql",
}
BACKEND_PACKAGES = sorted(set(IN_TREE.values()))


def _names_used(path: Path) -> set[str]:
    """Modules ``path`` imports, and every string in its code that is not a docstring.

    A docstring is any string standing alone as a statement (an attribute's included).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            names.add(node.value)
    return names


# A store, its driver or its peer, in a module name or a string (a URL scheme included).
STORE_WORDS = re.compile(r"redis|postgres|psycopg|sqlite|etcd|mysql|mariadb", re.IGNORECASE)


def test_the_core_benchmark_names_no_backend() -> None:
    assert len(CORE_BENCH) >= 6  # the package's modules and leasekit/bench.py
    for path in CORE_BENCH:
        named = {name for name in _names_used(path) if STORE_WORDS.search(name)}
        # Its peers (the handoff scenario's included) are the backend's bench plugin's.
        assert not named, f"{path.relative_to(ROOT)} names {sorted(named)}"


def test_running_the_core_imports_no_backend() -> None:
    script = (
        "import sys\n"
        "import leasekit.bench\n"
        "from leasekit._bench import _handoff, _model, _report, _runner, _schemes\n"
        "report = leasekit.bench.run_bench('memory://', seconds=0.02, scenarios=['single'])\n"
        "leasekit.bench.render_table(report)\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] in sys.argv[1:]))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, *BACKEND_PACKAGES],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_only_the_bench_of_the_scheme_under_test_is_imported(tmp_path: Path) -> None:
    drivers = ("redis", "psycopg", "psycopg_pool", "aetcd", "asyncmy", "tooz", "etcd3")
    script = (
        "import sys\n"
        "from leasekit.bench import run_bench\n"
        "report = run_bench(sys.argv[1], seconds=0.02, scenarios=['single'])\n"
        "print([r.contender for r in report.results])\n"
        "print(sorted(m for m in sys.modules if m.startswith('leasekit_') and '_bench' in m))\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] in sys.argv[2:]))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, f"sqlite:///{tmp_path / 'lazy.db'}", *drivers],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    contenders, benches, loaded_drivers = run.stdout.splitlines()
    assert contenders == "['leasekit', 'sqlite-raw']"
    assert benches == "['leasekit_sqlite._bench']"
    assert loaded_drivers == "[]"


def test_every_in_tree_scheme_declares_its_bench_in_its_own_backend() -> None:
    from importlib import metadata  # noqa: PLC0415

    declared = {
        ep.name: ep
        for ep in metadata.entry_points(group=bench_schemes.ENTRY_POINT_GROUP)
        if ep.dist is not None and ep.dist.name == "leasekit"
    }
    assert set(declared) == set(IN_TREE)
    backends = {
        ep.name: ep
        for ep in metadata.entry_points(group="leasekit.backends")
        if ep.dist is not None and ep.dist.name == "leasekit"
    }
    for scheme, package in IN_TREE.items():
        entry = declared[scheme]
        assert entry.module == f"{package}._bench", entry
        assert entry.extras == backends[scheme].extras  # the backend's extra, no other
        bench = bench_schemes.scheme_bench(scheme)
        floors = [c for c in bench.contenders if c.role == "floor"]
        assert len(floors) == 1, scheme
        opener = floors[0].open_async or floors[0].open_sync
        assert getattr(opener, "__module__", None) == f"{package}._bench"
        assert bench.contenders  # and every contender is the backend's own
    assert bench_schemes.scheme_bench("memory") == SchemeBench()  # leasekit alone


def _distribution(root: Path, name: str, entry_points: str, module: str = "") -> None:
    """A minimal installed distribution under ``root``: its metadata and one module."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    if module:
        (root / f"{name}.py").write_text(module)


_THIRD_PARTY_BENCH = """
from leasekit.bench import BenchTarget, Contender, SchemeBench


class Floor:
    async def cycle(self, key: str, owner: str) -> bool:
        return True

    async def aclose(self) -> None:
        pass


async def open_floor(target: BenchTarget) -> Floor:
    OPENED.append(target.url)
    return Floor()


OPENED: list[str] = []
BENCH = SchemeBench(
    contenders=(Contender("joined-floor", "joined floor", "floor", open_async=open_floor),)
)
"""


def test_a_third_party_scheme_joins_through_the_entry_point_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _distribution(
        tmp_path,
        "bench_joiner",
        "[leasekit.bench]\nmemory = bench_joiner:BENCH\n",
        _THIRD_PARTY_BENCH,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        report = run_bench("memory://", seconds=0.05, scenarios=["single"])
        joiner = sys.modules["bench_joiner"]
    finally:
        sys.modules.pop("bench_joiner", None)
    assert [r.contender for r in report.results] == ["leasekit", "joined-floor"]
    floor = report.result("joined-floor", "single")
    assert floor is not None
    assert (floor.role, floor.ratio_to_floor, floor.error) == ("floor", 1.0, None)
    assert joiner.OPENED == ["memory://"]


def test_register_scheme_wins_over_an_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _distribution(tmp_path, "bench_loser", "[leasekit.bench]\nmemory = bench_loser:BENCH\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mine = SchemeBench(contenders=(Contender("mine", "mine", "floor", open_async=_open_floor),))
    monkeypatch.setitem(bench_schemes._REGISTERED, "memory", mine)
    assert bench_schemes.scheme_bench("MEMORY") is mine  # bench_loser is never imported


def test_a_scheme_claimed_twice_or_broken_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("bench_one", "bench_two"):
        _distribution(tmp_path / name, name, f"[leasekit.bench]\nmemory = {name}:BENCH\n")
        monkeypatch.syspath_prepend(str(tmp_path / name))
    with pytest.raises(leasekit.BackendUnavailable, match="claimed twice") as twice:
        run_bench("memory://", seconds=0.05)
    for name in ("bench_one", "bench_two"):
        assert f"{name}:BENCH from distribution {name!r}" in str(twice.value)

    broken = tmp_path / "broken"
    entry_points = "[leasekit.bench]\nnoop = bench_needs:BENCH [fast]\nmem0 = bench_wrong:BENCH\n"
    entry_points += "mem1 = bench_gone:BENCH\n"
    _distribution(broken, "bench_needs", entry_points, "import no_such_dependency_here\n")
    (broken / "bench_wrong.py").write_text("BENCH = 1\n")
    monkeypatch.syspath_prepend(str(broken))
    try:
        with pytest.raises(leasekit.BackendUnavailable, match=r"pip install 'bench.needs\[fast\]'"):
            bench_schemes.scheme_bench("noop")
        with pytest.raises(leasekit.BackendUnavailable, match=r"not a leasekit\.bench\.Scheme"):
            bench_schemes.scheme_bench("mem0")
        with pytest.raises(leasekit.BackendUnavailable, match=r"'bench_gone' is not installed"):
            bench_schemes.scheme_bench("mem1")
    finally:
        sys.modules.pop("bench_wrong", None)


def test_a_cycle_longer_than_the_window_is_still_measured_once_per_task() -> None:
    # A loaded machine, or a store's fsync, can make one cycle outlast the whole
    # window: each task's last warmup cycle then ends after the window closed. The
    # task still makes one measured attempt, so a slow contender reports a slow rate
    # rather than none (it reported 0 cycles before).
    import asyncio  # noqa: PLC0415
    import time  # noqa: PLC0415

    from leasekit._bench import _runner  # noqa: PLC0415

    calls: list[str] = []

    async def slow_cycle(key: str, owner: str) -> bool:
        calls.append(key)
        await asyncio.sleep(0.01)
        return True

    def blocking_cycle(key: str, owner: str) -> bool:
        calls.append(key)
        return True

    closed = time.perf_counter_ns()  # warmup and window both over before the task starts
    sample = asyncio.run(_runner._async_task(slow_cycle, ["a", "b"], "o", closed, closed))
    assert (sample.cycles, sample.denied, len(sample.latencies_ns)) == (1, 0, 1)
    assert calls == ["a"]
    sample = _runner._sync_task(blocking_cycle, ["a", "b"], "o", closed, closed)
    assert (sample.cycles, sample.denied, len(sample.latencies_ns)) == (1, 0, 1)
