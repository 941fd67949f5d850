"""leasekit.sync: the blocking facade, driven from plain threads.

On memory:// through the loop thread, and on SQLite, Redis and PostgreSQL through
their native blocking providers (no thread hop): every test here holds on both paths.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from faults import PATIENCE_S, ScriptedProvider, documented_output, run_example, shared_url
from servers import require_module

import leasekit
import leasekit.sync
from leasekit import InvalidLeaseArgument, LeaseHeld, LeaseLost, LeaseProviderClosed
from leasekit.sync import SyncLeaseProvider

LONG_TTL_MS = 60_000
THREADS = 8


def backend_url(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of backend ``name`` on the session's server (or a temp file), unique keys."""
    if name == "postgres":
        postgres_url: str = request.getfixturevalue("postgres_url")
        table: str = request.getfixturevalue("postgres_table")
        return f"{postgres_url}{'&' if '?' in postgres_url else '?'}table={table}"
    if name == "redis":
        redis_url: str = request.getfixturevalue("redis_url")
        prefix: str = request.getfixturevalue("redis_prefix")
        return f"{redis_url}{'&' if '?' in redis_url else '?'}prefix={prefix}"
    if name == "etcd":
        require_module("aetcd", extra="etcd")
        etcd_url: str = request.getfixturevalue("etcd_url")
        return f"{etcd_url}?prefix={request.getfixturevalue('etcd_prefix')}"
    if name == "mysql":
        require_module("asyncmy", extra="mysql")
        mysql_url: str = request.getfixturevalue("mysql_url")
        table = request.getfixturevalue("mysql_table")
        return f"{mysql_url}{'&' if '?' in mysql_url else '?'}table={table}"
    return shared_url(name, str(tmp_path), f"sync-{uuid.uuid4().hex}")


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, request, tmp_path)


@pytest.fixture
def leases(url: str) -> Iterator[SyncLeaseProvider]:
    with leasekit.sync.connect(url) as facade:
        yield facade


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def facade_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("leasekit-sync")]


# -- the facade -----------------------------------------------------------------------------


def test_the_five_operations_block_and_answer(leases: SyncLeaseProvider) -> None:
    first = leases.acquire_lease("k", "a", LONG_TTL_MS)
    assert (first.acquired, first.owner) == (True, "a")
    assert isinstance(first.token, int)
    assert leases.acquire_lease("k", "b", LONG_TTL_MS).owner == "a"
    assert leases.get_lease_owner("k") == "a"
    assert leases.renew_lease("k", "a", LONG_TTL_MS) is True
    assert leases.renew_lease("k", "b", LONG_TTL_MS) is False
    assert leases.transfer_lease("k", "a", "b", LONG_TTL_MS) is True
    leases.release_lease("k", "b")
    assert leases.get_lease_owner("k") is None
    assert leases.capabilities.fencing
    assert leases.backend in {"memory", "sqlite", "redis", "postgresql"}
    assert leases.native == (leases.backend in {"redis", "postgresql", "sqlite"})


def test_errors_are_the_async_ones(leases: SyncLeaseProvider) -> None:
    with pytest.raises(InvalidLeaseArgument, match="key"):
        leases.acquire_lease("", "a", 1000)


def test_eight_threads_racing_for_one_key_make_one_winner(leases: SyncLeaseProvider) -> None:
    for round_no in range(5):
        key = f"race-{round_no}"
        start = threading.Barrier(THREADS)

        def contend(index: int, key: str = key, start: threading.Barrier = start) -> bool:
            start.wait()
            return leases.acquire_lease(key, f"worker-{index}", LONG_TTL_MS).acquired

        with ThreadPoolExecutor(THREADS) as pool:
            won = list(pool.map(contend, range(THREADS)))
        assert won.count(True) == 1, won


def test_threads_on_separate_facades_race_through_one_store(url: str) -> None:
    # Each thread its own facade (its own loop thread and connection), one store.
    start = threading.Barrier(THREADS)

    def contend(index: int) -> bool:
        with leasekit.sync.connect(url) as mine:
            start.wait()
            return mine.acquire_lease("shared", f"worker-{index}", LONG_TTL_MS).acquired

    with ThreadPoolExecutor(THREADS) as pool:
        won = list(pool.map(contend, range(THREADS)))
    assert won.count(True) == 1, won


def test_close_stops_the_thread_and_later_calls_raise(url: str) -> None:
    before = set(facade_threads())
    facade = leasekit.sync.connect(url, thread_name="leasekit-sync test-close")
    started = set(facade_threads()) - before
    # The loop path starts one thread at connect; a native provider none at all.
    assert len(started) == (0 if facade.native else 1)
    with facade:
        facade.acquire_lease("k", "a", LONG_TTL_MS)
    assert facade.closed
    assert not any(thread.is_alive() for thread in started)
    with pytest.raises(LeaseProviderClosed):
        facade.get_lease_owner("k")
    facade.close()  # idempotent


def test_a_bad_url_raises_at_connect_and_leaves_no_thread() -> None:
    before = set(facade_threads())
    with pytest.raises(leasekit.BackendUnavailable):
        leasekit.sync.connect("nosuchscheme://x")
    with pytest.raises(InvalidLeaseArgument):
        leasekit.sync.connect("memory://", bogus=1)
    assert set(facade_threads()) == before


def test_wrap_runs_any_provider_and_leaves_it_open_unless_asked() -> None:
    memory = leasekit.MemoryLeaseProvider()
    with leasekit.sync.wrap(memory) as facade:
        assert facade.acquire_lease("k", "a", 1000).acquired
    assert repr(memory) == "MemoryLeaseProvider(private)"  # not closed
    with leasekit.sync.wrap(memory, close=True) as facade:
        assert facade.get_lease_owner("k") == "a"
    assert "closed" in repr(memory)


def test_release_if_held_is_the_backends_one_atomic_step(leases: SyncLeaseProvider) -> None:
    # Natively on SQLite, Redis and PostgreSQL, through the loop thread on memory://.
    assert leases.reports_releases
    assert leases.acquire_lease("r", "a", LONG_TTL_MS).acquired
    assert leases.release_if_held("r", "b") is False
    assert leases.get_lease_owner("r") == "a"
    assert leases.release_if_held("r", "a") is True
    assert leases.get_lease_owner("r") is None
    assert leases.release_if_held("r", "a") is False
    with pytest.raises(InvalidLeaseArgument, match="key"):
        leases.release_if_held("", "a")


def test_release_if_held_on_a_backend_without_it_names_what_is_missing() -> None:
    # A provider with the five contract methods only, as a third party may write.
    with leasekit.sync.wrap(ScriptedProvider(leasekit.MemoryLeaseProvider())) as facade:
        assert not facade.reports_releases
        assert facade.acquire_lease("r", "a", LONG_TTL_MS).acquired
        with pytest.raises(leasekit.BackendLacksCapability, match="release_if_held"):
            facade.release_if_held("r", "a")
        assert facade.get_lease_owner("r") == "a"  # nothing was released


def test_run_reaches_what_the_facade_does_not_wrap(leases: SyncLeaseProvider) -> None:
    async def both_owners(provider: leasekit.LeaseProvider) -> tuple[str | None, str | None]:
        await provider.acquire_lease("x", "a", LONG_TTL_MS)
        return await provider.get_lease_owner("x"), await provider.get_lease_owner("y")

    assert leases.run(both_owners, leases.provider) == ("a", None)


def test_calling_the_facade_from_its_own_loop_thread_is_refused(
    leases: SyncLeaseProvider,
) -> None:
    async def reenter() -> None:
        leases.run(asyncio.sleep, 0)

    with pytest.raises(RuntimeError, match="own event-loop thread"):
        leases.run(reenter)


def test_an_abandoned_facade_stops_its_thread() -> None:
    before = set(facade_threads())
    facade = leasekit.sync.wrap(
        leasekit.MemoryLeaseProvider(), thread_name="leasekit-sync abandoned"
    )
    (thread,) = set(facade_threads()) - before
    del facade
    gc.collect()
    thread.join(PATIENCE_S)
    assert not thread.is_alive()


# -- hold ---------------------------------------------------------------------------------


def test_hold_renews_on_the_loop_while_the_thread_works() -> None:
    scripted = ScriptedProvider(leasekit.MemoryLeaseProvider())
    with (
        leasekit.sync.wrap(scripted) as leases,
        leasekit.sync.hold(leases, "job", "a", LONG_TTL_MS, renew_every_ms=5) as lease,
    ):
        assert (lease.key, lease.owner, lease.ttl_ms) == ("job", "a", LONG_TTL_MS)
        assert isinstance(lease.token, int)
        wait_until(lambda: scripted.renewed >= 3, "three renewals")  # a blocking body
        assert leases.get_lease_owner("job") == "a"
        assert not lease.lost.is_set()
        assert lease.lost_reason is None
    assert scripted.inner is not None


def test_hold_releases_on_exit_even_on_error(leases: SyncLeaseProvider) -> None:
    with pytest.raises(ZeroDivisionError), leasekit.sync.hold(leases, "k", "a", LONG_TTL_MS):
        _ = 1 / 0
    assert leases.get_lease_owner("k") is None


def test_hold_of_a_held_key_raises_lease_held_in_the_calling_thread(
    leases: SyncLeaseProvider,
) -> None:
    leases.acquire_lease("k", "b", LONG_TTL_MS)
    with pytest.raises(LeaseHeld) as caught, leasekit.sync.hold(leases, "k", "a", LONG_TTL_MS):
        pytest.fail("must not run")
    assert caught.value.holder == "b"


def test_a_lost_hold_sets_a_threading_event(leases: SyncLeaseProvider) -> None:
    with leasekit.sync.hold(leases, "k", "a", LONG_TTL_MS, renew_every_ms=5) as lease:
        assert isinstance(lease.lost, threading.Event)
        leases.transfer_lease("k", "a", "thief", LONG_TTL_MS)
        assert lease.lost.wait(PATIENCE_S)
        assert lease.lost_reason == "renew_refused"
    assert leases.get_lease_owner("k") == "thief"  # not released by the loser


def test_a_blocking_body_is_told_at_the_deadline_through_lost_and_remaining() -> None:
    # The store stops answering: the loop thread sets lost at valid_until (no later
    # than the TTL minus the margin), and remaining() reads 0 from the body's thread.
    scripted = ScriptedProvider(leasekit.MemoryLeaseProvider())
    with (
        leasekit.sync.wrap(scripted) as leases,
        leasekit.sync.hold(
            leases, "job", "a", 400, renew_every_ms=50, safety_margin_ms=100
        ) as lease,
    ):
        assert lease.safety_margin_ms == 100
        assert lease.remaining() <= 0.3
        scripted.renew_mode = "hang"
        assert lease.lost.wait(PATIENCE_S)
        told_at = time.monotonic()
        assert told_at >= lease.valid_until
        assert lease.remaining() == 0.0
        assert lease.lost_reason == "expired"
    assert scripted.hanging == 0


def test_a_sync_hold_checks_its_safety_margin(leases: SyncLeaseProvider) -> None:
    with pytest.raises(InvalidLeaseArgument) as caught:
        leasekit.sync.hold(leases, "k", "a", 1000, safety_margin_ms=1000)
    assert caught.value.argument == "safety_margin_ms"


def test_on_lost_raise_fails_the_block_after_a_loss(leases: SyncLeaseProvider) -> None:
    lease = leasekit.sync.hold(leases, "k", "a", LONG_TTL_MS, renew_every_ms=5, on_lost="raise")

    def body() -> None:
        with lease:
            leases.transfer_lease("k", "a", "thief", LONG_TTL_MS)
            lease.lost.wait(PATIENCE_S)

    with pytest.raises(LeaseLost) as caught:
        body()
    assert caught.value.reason == "renew_refused"


def test_cancel_is_refused_in_sync(leases: SyncLeaseProvider) -> None:
    with pytest.raises(InvalidLeaseArgument, match="cannot be cancelled"):
        leasekit.sync.hold(leases, "k", "a", 1000, on_lost="cancel")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sync facade"):
        leasekit.sync.hold(leasekit.MemoryLeaseProvider(), "k", "a", 1000)  # type: ignore[arg-type]


def test_transfer_from_a_thread(leases: SyncLeaseProvider) -> None:
    with leasekit.sync.hold(leases, "k", "a", LONG_TTL_MS) as lease:
        lease.transfer_to("b")
        assert lease.transferred_to == "b"
    assert leases.get_lease_owner("k") == "b"


def test_holds_in_many_threads_exclude_each_other(leases: SyncLeaseProvider) -> None:
    inside = 0
    most = 0
    guard = threading.Lock()

    def worker(index: int) -> None:
        nonlocal inside, most
        owner = leasekit.new_owner_id(f"t{index}")
        with leasekit.sync.hold(leases, "critical", owner, LONG_TTL_MS, wait_s=None):
            with guard:
                inside += 1
                most = max(most, inside)
            time.sleep(0.005)
            with guard:
                inside -= 1

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(worker, range(THREADS)))
    assert most == 1
    assert leases.get_lease_owner("critical") is None


def test_closing_the_facade_under_a_hold_releases_and_flags_it(url: str) -> None:
    facade = leasekit.sync.connect(url)
    held = threading.Event()
    closed = threading.Event()
    seen: list[object] = []

    def body() -> None:
        with leasekit.sync.hold(facade, "k", "a", LONG_TTL_MS) as lease:
            held.set()
            closed.wait(PATIENCE_S)
            seen.extend([lease.lost.is_set(), lease.lost_reason])

    thread = threading.Thread(target=body)
    thread.start()
    assert held.wait(PATIENCE_S)
    facade.close()
    closed.set()
    thread.join(PATIENCE_S)
    assert seen == [True, "closed"]
    with leasekit.sync.connect(url) as again:
        assert again.get_lease_owner("k") is None


def test_sync_wait_for(leases: SyncLeaseProvider) -> None:
    leases.acquire_lease("k", "first", LONG_TTL_MS)
    timer = threading.Timer(0.05, leases.release_lease, ("k", "first"))
    timer.start()
    try:
        result = leasekit.sync.wait_for(leases, "k", "second", LONG_TTL_MS, timeout_s=PATIENCE_S)
    finally:
        timer.join()
    assert (result.acquired, result.owner) == (True, "second")
    with pytest.raises(LeaseHeld):
        leasekit.sync.wait_for(leases, "k", "third", LONG_TTL_MS, timeout_s=0.05)


def test_the_facade_loop_is_not_the_callers() -> None:
    # Usable from code that runs its own loop elsewhere, e.g. inside asyncio.run's thread.
    async def main() -> bool:
        with leasekit.sync.connect("memory://") as leases:
            return leases.acquire_lease("k", "a", 1000).acquired

    assert asyncio.run(main())


# -- the documented example -----------------------------------------------------------------


def test_the_documented_example_prints_what_the_page_shows(tmp_path: Path) -> None:
    assert run_example("sync_example.py", tmp_path) == documented_output(
        "sync.md", "sync_example.py"
    )


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres", "etcd", "mysql"])
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every in-tree backend, for the blocking watch and election."""
    return backend_url(request.param, request, tmp_path)


def test_blocking_watch_owner_elect_and_leaders(any_url: str) -> None:
    with leasekit.sync.connect(any_url) as leases:
        changes = leasekit.sync.watch_owner(leases, "k", poll_s=0.01)
        assert next(changes) is None
        leases.acquire_lease("k", "alice", 60_000)
        assert next(changes) == "alice"
        leases.transfer_lease("k", "alice", "bob", 60_000)
        assert next(changes) == "bob"
        changes.close()

        with leasekit.sync.elect(leases, "scheduler", "node-a", 60_000) as term:
            assert term.owner == "node-a"
            assert isinstance(term.token, int)
            observed = leasekit.sync.leaders(leases, "scheduler", poll_s=0.01)
            assert next(observed) == "node-a"
            observed.close()
            with (
                pytest.raises(leasekit.LeaseHeld),
                leasekit.sync.elect(leases, "scheduler", "node-b", 60_000, timeout_s=0.05),
            ):
                pass
        assert leases.get_lease_owner("scheduler") is None  # resigned on exit
