"""The tooz driver (leasekit.tooz): tooz's own functional tests, unmodified, on each backend.

tooz ships ``tooz/tests/test_coordination.py`` (and ``test_partitioner.py``) in its
wheel; each test here runs those installed modules with pytest in a subprocess,
``TOOZ_TEST_URL`` pointing at a ``leasekit+<scheme>://`` URL of a server the harness
started, and reads the outcome of every test from its JUnit report: none may fail, and
exactly the tests listed in ``SKIPS`` may skip, each for the reason given (docs/tooz.md
has the same table). Then the driver's own behaviour that tooz's modules do not check:
URL and id validation, a dead or stalled store, heartbeats observed by the server,
forked children, stop() from another thread.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import traceback
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
from servers import RedisServer, free_port

tooz_coordination = pytest.importorskip("tooz.coordination", reason="needs leasekit[tooz]")

import tooz  # noqa: E402

import leasekit  # noqa: E402 (after the importorskip of tooz)
import leasekit.sync  # noqa: E402

# tooz's test module itself imports these (its other drivers' clients, its test base).
for _module in ("testtools", "fixtures", "etcd3gw", "pymemcache", "sysv_ipc"):
    pytest.importorskip(_module, reason="needs the self-test extra (tooz's test module)")

SHARED_LOCKS = "leasekit's tooz locks are exclusive only"
SKIPS_EVERYWHERE = {
    "test_get_shared_lock": SHARED_LOCKS,
    "test_get_shared_lock_locking_same_lock_twice": SHARED_LOCKS,
    "test_get_shared_lock_locking_two_lock": SHARED_LOCKS,
    "test_get_lock_locking_shared_and_exclusive": SHARED_LOCKS,
    "test_get_lock_locking_exclusive_and_shared": SHARED_LOCKS,
    # The test names the drivers it runs on (etcd3gw, memcached, redis): a skipTest of its own.
    "test_watch_join_group_disappear": "only works with coordinators that have the ability",
}
SKIPS = {
    "sqlite": {
        **SKIPS_EVERYWHERE,
        # One file on one host: the driver does not declare DISTRIBUTED_ACROSS_HOSTS.
        "test_connection_error_bad_host": "not distributed across hosts",
    },
    "redis": SKIPS_EVERYWHERE,
    "postgresql": SKIPS_EVERYWHERE,
    "etcd": SKIPS_EVERYWHERE,
    "mysql": SKIPS_EVERYWHERE,
}

# tooz's module takes 25 s to 2 min per backend (its process and timeout tests, and a
# connection pool per coordinator); the suite runs it on SQLite and Redis, and on
# PostgreSQL, etcd and MySQL/MariaDB too with LEASEKIT_TOOZ_ALL_BACKENDS=1 (docs/tooz.md).
every_backend = pytest.mark.skipif(
    os.environ.get("LEASEKIT_TOOZ_ALL_BACKENDS", "") != "1",
    reason="tooz's tests on PostgreSQL, etcd and MySQL run with LEASEKIT_TOOZ_ALL_BACKENDS=1",
)

TOOZ_TESTS = Path(sys.modules["tooz.coordination"].__file__ or "").parent / "tests"
TOOZ_MODULES = (TOOZ_TESTS / "test_coordination.py", TOOZ_TESTS / "test_partitioner.py")
# Their tests that run against TOOZ_TEST_URL: test_coordination's TestAPI (81 tests) and
# test_partitioner's TestPartitioner (5; its IPC and File subclasses only repeat it).
TOOZ_SELECTION = "TestAPI or (TestPartitioner and not IPCTest and not FileTest)"
TOOZ_TEST_COUNT = 86


def run_tooz_tests(url: str, workdir: Path) -> dict[str, tuple[str, str]]:
    """Run tooz's tests against ``url``: ``{test name: (outcome, message)}``."""
    report = workdir / "tooz-report.xml"
    env = {**os.environ, "TOOZ_TEST_URL": url, "PYTHONDONTWRITEBYTECODE": "1"}
    # A directory of its own as rootdir: none of leasekit's pytest settings apply to
    # tooz's module, and nothing is written beside it. Three processes, as tooz's own
    # runner (stestr) runs its tests in parallel: they mostly wait (heartbeats,
    # timeouts), and one process took 36 s of wall time for 6 s of CPU on SQLite;
    # three take 14 s (25 s -> 20 s on Redis).
    command = [
        sys.executable, "-m", "pytest", *map(str, TOOZ_MODULES), "-q", "-p", "no:cacheprovider",
        "-n", "3", f"--rootdir={workdir}", f"--junitxml={report}", "-o",
        "junit_family=xunit2", "-k", TOOZ_SELECTION,
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if not report.exists():
        pytest.fail(f"tooz's tests did not run:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    outcomes: dict[str, tuple[str, str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "failed" if child.tag != "skipped" else "skipped"
                message = (child.get("message") or "") + (child.text or "")
        outcomes[case.get("name", "")] = (outcome, message)
    assert len(outcomes) == len(ET.parse(report).getroot().findall(".//testcase")), "names clash"
    assert outcomes, done.stdout[-4000:]
    return outcomes


def check_outcomes(outcomes: dict[str, tuple[str, str]], scheme: str) -> None:
    failed = {name: msg[-2000:] for name, (outcome, msg) in outcomes.items() if outcome == "failed"}
    assert not failed, failed
    skipped = {name: msg for name, (outcome, msg) in outcomes.items() if outcome == "skipped"}
    expected = SKIPS[scheme]
    assert set(skipped) == set(expected), (sorted(skipped), sorted(expected))
    for name, reason in expected.items():
        assert reason in skipped[name], (name, skipped[name])
    passed = sum(outcome == "passed" for outcome, _ in outcomes.values())
    # Every selected test ran: as many as tooz 9.1.0's modules define (or more, later).
    assert passed + len(skipped) == len(outcomes) >= TOOZ_TEST_COUNT
    print(f"tooz on leasekit+{scheme}: {passed} passed, {len(skipped)} skipped, 0 failed")  # noqa: T201 (-s shows the counts)


def tooz_url(url: str, **options: str) -> str:
    url = url.replace("://", "+tooz-sep+", 1).replace("+tooz-sep+", "://", 1)
    query = "&".join(f"{name}={quote(value, safe='')}" for name, value in options.items())
    separator = "&" if "?" in url else "?"
    return f"leasekit+{url}{separator}{query}" if query else f"leasekit+{url}"


# -- tooz's own tests ------------------------------------------------------------------------


@pytest.mark.slow
def test_tooz_suite_on_sqlite(tmp_path: Path) -> None:
    check_outcomes(run_tooz_tests(f"leasekit+sqlite:///{tmp_path}/tooz.db", tmp_path), "sqlite")


@pytest.mark.slow
def test_tooz_suite_on_redis(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    url = tooz_url(redis_url, prefix=redis_prefix)
    check_outcomes(run_tooz_tests(url, tmp_path), "redis")


@pytest.mark.slow
@every_backend
def test_tooz_suite_on_postgresql(tmp_path: Path, postgres_url: str, postgres_table: str) -> None:
    url = tooz_url(postgres_url, table=postgres_table)
    check_outcomes(run_tooz_tests(url, tmp_path), "postgresql")


@pytest.mark.slow
@every_backend
def test_tooz_suite_on_etcd(tmp_path: Path, etcd_url: str, etcd_prefix: str) -> None:
    url = tooz_url(etcd_url, prefix=etcd_prefix)
    check_outcomes(run_tooz_tests(url, tmp_path), "etcd")


@pytest.mark.slow
@every_backend
def test_tooz_suite_on_mysql(tmp_path: Path, mysql_url: str, mysql_table: str) -> None:
    url = tooz_url(mysql_url, table=mysql_table)
    check_outcomes(run_tooz_tests(url, tmp_path), "mysql")


# -- the driver's own behaviour --------------------------------------------------------------


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"leasekit+sqlite:///{tmp_path}/tooz.db"


def started(url: str, member: bytes | str = b"") -> tooz_coordination.CoordinationDriver:
    coordinator = tooz_coordination.get_coordinator(url, member or uuid.uuid4().hex.encode())
    coordinator.start()
    return coordinator


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("timeout=-1", "timeout"),
        ("lock_timeout=soon", "lock_timeout"),
        ("namespace=a/b", "namespace"),
        ("no_such_option=1", "no_such_option"),
    ],
)
def test_a_bad_option_is_refused_by_get_coordinator_before_any_io(
    tmp_path: Path, query: str, named: str
) -> None:
    database = tmp_path / "never.db"
    with pytest.raises(leasekit.InvalidLeaseArgument, match=named):
        tooz_coordination.get_coordinator(f"leasekit+sqlite:///{database}?{query}", b"m")
    assert not database.exists()


def test_bad_ids_are_refused_before_any_io(sqlite_url: str) -> None:
    coordinator = started(sqlite_url)
    try:
        for call in (
            lambda: coordinator.create_group(42),
            lambda: coordinator.join_group(b""),
            lambda: coordinator.get_lock(None),
            lambda: coordinator.join_group(b"g", {"blob": "x" * 2000}),
        ):
            with pytest.raises(leasekit.InvalidLeaseArgument):
                call()
        assert coordinator.get_groups().get() == []  # nothing was written
    finally:
        coordinator.stop()


def test_a_dead_store_is_a_tooz_connection_error_at_start() -> None:
    url = f"leasekit+redis://127.0.0.1:{free_port()}?timeout_s=2"
    coordinator = tooz_coordination.get_coordinator(url, b"m")
    with pytest.raises(tooz_coordination.ToozConnectionError) as raised:
        coordinator.start()
    assert isinstance(raised.value.__cause__, leasekit.LeaseBackendUnreachable)
    assert not coordinator.is_started


def test_ids_of_any_bytes_round_trip(sqlite_url: str) -> None:
    coordinator = started(sqlite_url, b"member/\x00\xff")
    try:
        group = b"group/with\x00slash\xfe"
        coordinator.create_group(group).get()
        coordinator.create_group(b"group").get()  # a prefix of the other's key
        coordinator.join_group(group, {"b": b"\x00"}).get()
        assert set(coordinator.get_groups().get()) == {group, b"group"}
        assert coordinator.get_members(group).get() == {b"member/\x00\xff"}
        assert coordinator.get_members(b"group").get() == set()
        assert coordinator.get_members_with_capabilities(group).get() == {
            b"member/\x00\xff": {"b": b"\x00"}
        }
    finally:
        coordinator.stop()


def test_heartbeat_renews_a_held_lock_as_the_server_sees_it(sqlite_url: str) -> None:
    coordinator = started(sqlite_url + "?lock_timeout=1000")
    lock = coordinator.get_lock(b"renewed")
    key = "tooz/lock/renewed"
    with leasekit.sync.connect(sqlite_url.removeprefix("leasekit+")) as leases:
        try:
            assert lock.acquire()
            holder = leases.get_lease_owner(key)
            assert holder is not None
            # Shorten the lease from outside; the heartbeat must put lock_timeout back.
            assert leases.renew_lease(key, holder, 60_000)
            (before,) = leases.run(leases.provider.inspect, key)  # type: ignore[attr-defined]
            assert before.remaining_ms <= 60_000
            coordinator.heartbeat()
            (after,) = leases.run(leases.provider.inspect, key)  # type: ignore[attr-defined]
            assert after.remaining_ms > 60_000
            assert after.owner == holder
            assert lock.release()
            assert not lock.heartbeat()  # released: nothing to renew
            assert leases.get_lease_owner(key) is None
        finally:
            coordinator.stop()


def test_a_timed_acquire_gives_up_and_a_blocking_one_wakes_on_release(sqlite_url: str) -> None:
    first, second = started(sqlite_url), started(sqlite_url)
    try:
        held = first.get_lock(b"contended")
        waiting = second.get_lock(b"contended")
        assert held.acquire()
        assert not waiting.acquire(blocking=False)
        assert not waiting.acquire(timeout=0.2)
        assert not waiting.acquire(blocking=0.2)
        with pytest.raises(leasekit.InvalidLeaseArgument, match="timeout"):
            waiting.acquire(timeout=-1)
        assert held.is_still_owner()
        assert waiting.break_()
        assert not held.is_still_owner()
        assert not held.release()  # broken: it no longer held it
        assert waiting.acquire(timeout=5)
        assert waiting.release()
    finally:
        first.stop()
        second.stop()


def test_stop_releases_locks_and_leadership(sqlite_url: str) -> None:
    leader = started(sqlite_url, b"leader")
    other = started(sqlite_url, b"other")
    try:
        leader.create_group(b"g").get()
        elected: list[bytes] = []
        leader.watch_elected_as_leader(b"g", lambda event: elected.append(event.member_id))
        leader.run_watchers()
        assert elected == [b"leader"]
        assert leader.get_lock(b"l").acquire()
        leader.stop()
        assert other.get_leader(b"g").get() is None
        assert other.get_lock(b"l").acquire(blocking=False)
    finally:
        other.stop()


def _in_child(check: Callable[[], bool]) -> int:
    """Run ``check`` in a forked child: its exit code (0: true, 1: false, 2: it raised)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 2
        try:
            code = 0 if check() else 1
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_coordinator_in_a_forked_child_excludes_the_parent(sqlite_url: str) -> None:
    def fresh_coordinator_takes_it() -> bool:
        coordinator = started(sqlite_url)
        try:
            return bool(coordinator.get_lock(b"forked").acquire(blocking=False))
        finally:
            coordinator.stop()

    parent = started(sqlite_url)
    try:
        lock = parent.get_lock(b"forked")
        assert lock.acquire()
        assert _in_child(fresh_coordinator_takes_it) == 1  # the parent holds it
        assert lock.release()
        assert _in_child(fresh_coordinator_takes_it) == 0
    finally:
        parent.stop()


def test_a_started_coordinator_forked_leaves_the_parents_holdings_alone(sqlite_url: str) -> None:
    parent = started(sqlite_url, b"parent")
    try:
        parent.create_group(b"g").get()
        parent.join_group(b"g").get()
        lock = parent.get_lock(b"held")
        assert lock.acquire()
        parent.watch_elected_as_leader(b"g", lambda event: None)
        parent.run_watchers()

        def child() -> bool:
            # The parent's lock object is not held here; the parent still holds the
            # lease; group calls run (a new executor); stop() leaves what the parent holds.
            assert not lock.release()
            assert not parent.get_lock(b"held").acquire(blocking=False)
            assert parent.get_members(b"g").get() == {b"parent"}
            assert not parent.stand_down_group_leader(b"g")
            parent.stop()
            return True

        assert _in_child(child) == 0
        assert lock.is_still_owner()
        assert parent.get_members(b"g").get() == {b"parent"}
        assert parent.get_leader(b"g").get() == b"parent"
        assert lock.release()
    finally:
        parent.stop()


def test_a_stalled_store_is_a_tooz_connection_error_within_its_timeout(
    private_redis_server: RedisServer,
) -> None:
    url = tooz_url(private_redis_server.url, timeout_s="1")
    coordinator = started(url)
    try:
        coordinator.create_group(b"g").get()
        lock = coordinator.get_lock(b"l")
        private_redis_server.pause()
        try:
            with pytest.raises(tooz_coordination.ToozConnectionError):
                lock.acquire(blocking=False)
            with pytest.raises(tooz_coordination.ToozConnectionError):
                coordinator.get_members(b"g").get()
        finally:
            private_redis_server.resume()
        assert lock.acquire(blocking=False)  # the store is back
        assert lock.release()
    finally:
        coordinator.stop()


def test_stop_ends_a_blocking_acquire_waiting_in_another_thread(sqlite_url: str) -> None:
    holder, waiter = started(sqlite_url), started(sqlite_url)
    try:
        assert holder.get_lock(b"busy").acquire()
        outcome: list[object] = []
        waiting = waiter.get_lock(b"busy")
        thread = threading.Thread(target=lambda: outcome.append(_outcome(waiting.acquire)))
        thread.start()
        # The waiter is blocked in the store's wait (its facade's loop thread runs it).
        while not any(t.name == "leasekit-tooz sqlite" for t in threading.enumerate()):
            time.sleep(0.01)
        waiter.stop()
        thread.join(30)
        assert not thread.is_alive()
        assert len(outcome) == 1
        assert isinstance(outcome[0], tooz.ToozError)
        assert holder.get_lock(b"busy").acquire(blocking=False) is False  # still the holder's
    finally:
        holder.stop()


def _outcome(call: Callable[[], object]) -> object:
    try:
        return call()
    except Exception as exc:
        return exc


def test_a_lapsed_session_leaving_never_boots_out_the_one_that_rejoined(sqlite_url: str) -> None:
    lapsed = started(sqlite_url + "?timeout=0.2", b"same")
    rejoined = started(sqlite_url, b"same")
    try:
        lapsed.create_group(b"g").get()
        lapsed.join_group(b"g").get()
        while lapsed.get_members(b"g").get():  # no heartbeat: the membership expires
            time.sleep(0.05)
        rejoined.join_group(b"g").get()
        with pytest.raises(tooz_coordination.MemberNotJoined):
            lapsed.leave_group(b"g").get()
        assert rejoined.get_members(b"g").get() == {b"same"}
        # A session that never joined may still leave for the member id (tooz's rule).
        bystander = started(sqlite_url, b"same")
        try:
            bystander.leave_group(b"g").get()
        finally:
            bystander.stop()
        assert rejoined.get_members(b"g").get() == set()
    finally:
        lapsed.stop()
        rejoined.stop()


def test_a_listing_over_the_limit_is_an_error_not_a_partial_list(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leasekit.tooz import _driver  # noqa: PLC0415

    monkeypatch.setattr(_driver, "_LIST_LIMIT", 2)
    coordinator = started(sqlite_url)
    try:
        for group in (b"a", b"b"):
            coordinator.create_group(group).get()
        assert sorted(coordinator.get_groups().get()) == [b"a", b"b"]
        coordinator.create_group(b"c").get()
        with pytest.raises(tooz.ToozError, match="more than 2"):
            coordinator.get_groups().get()
    finally:
        coordinator.stop()
