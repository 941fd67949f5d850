"""Counting leases above the slot methods: ``leasekit.counting()`` with hold(), wait_for(),
elect() and leasekit.sync, in a forked child, when the caller is cancelled, and refused
where a backend has no slots. The slot semantics themselves are the suite's SlotChecks."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from pathlib import Path

import pytest
from test_fork import collect, fork_child

import leasekit
import leasekit.sync
from leasekit import (
    BackendLacksCapability,
    InvalidLeaseArgument,
    LeaseHeld,
    MemoryLeaseProvider,
    SlotLimitMismatch,
)

pytestmark = pytest.mark.anyio

LONG_MS = 60_000


@pytest.fixture(params=["memory", "sqlite", "etcd", "mysql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://slots-{uuid.uuid4().hex}"  # named: every provider of it shares it
    if request.param == "mysql":
        mysql: str = request.getfixturevalue("mysql_url")
        table = request.getfixturevalue("mysql_table")
        return f"{mysql}{'&' if '?' in mysql else '?'}table={table}"
    if request.param == "etcd":
        server: str = request.getfixturevalue("etcd_url")
        return f"{server}?prefix={request.getfixturevalue('etcd_prefix')}"
    return f"sqlite:///{tmp_path}/slots.db"


async def test_hold_takes_one_of_the_slots_and_the_next_holder_is_refused(url: str) -> None:
    async with leasekit.connect(url) as provider:
        pool = leasekit.counting(provider, 2)
        async with leasekit.hold(pool, "pool", "a", LONG_MS) as a:
            async with leasekit.hold(pool, "pool", "b", LONG_MS) as b:
                assert (a.token or 0) < (b.token or 0)
                with pytest.raises(LeaseHeld) as refused:
                    async with leasekit.hold(pool, "pool", "c", LONG_MS):
                        pass  # pragma: no cover (refused)
                assert refused.value.holder == "a"
                holders = await provider.get_slot_holders("pool")  # type: ignore[attr-defined]
                assert [r.owner for r in holders] == ["a", "b"]
            # b left: its slot is free, a's is still held.
            async with leasekit.hold(pool, "pool", "c", LONG_MS):
                holders = await provider.get_slot_holders("pool")  # type: ignore[attr-defined]
                assert [r.owner for r in holders] == ["a", "c"]
        assert await provider.get_slot_holders("pool") == []  # type: ignore[attr-defined]


async def test_a_waiter_gets_the_first_slot_freed(url: str) -> None:
    async with leasekit.connect(url) as provider:
        pool = leasekit.counting(provider, 1 if url.startswith("memory") else 2)
        holders = [f"h{i}" for i in range(pool.limit)]
        for owner in holders:
            assert (await pool.acquire_lease("pool", owner, LONG_MS)).acquired
        waiting = asyncio.create_task(
            leasekit.wait_for(pool, "pool", "waiter", LONG_MS, 30, poll_s=0.01, max_poll_s=0.05)
        )
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await pool.release_lease("pool", holders[0])
        granted = await waiting
        assert granted.acquired
        assert granted.owner == "waiter"


async def test_elect_with_two_slots_elects_two_leaders() -> None:
    provider = MemoryLeaseProvider()
    pool = leasekit.counting(provider, 2)
    async with (
        leasekit.elect(pool, "leaders", "c1", LONG_MS),
        leasekit.elect(pool, "leaders", "c2", LONG_MS),
    ):
        with pytest.raises(LeaseHeld):
            async with leasekit.elect(pool, "leaders", "c3", LONG_MS, timeout_s=0):
                pass  # pragma: no cover (refused)
        holders = await provider.get_slot_holders("leaders")
        assert [r.owner for r in holders] == ["c1", "c2"]


def test_the_blocking_api_holds_slots_from_threads(url: str) -> None:
    limit, threads, rounds = 2, 6, 5
    counted = leasekit.sync.wrap(
        leasekit.counting(leasekit.connect(url), limit, close=True), close=True
    )
    with counted as pool, leasekit.sync.connect(url) as store:
        inside = most = 0
        problems: list[str] = []
        guard = threading.Lock()

        def work(index: int) -> None:
            nonlocal inside, most
            for round_ in range(rounds):
                owner = f"t{index}-{round_}"
                with leasekit.sync.hold(pool, "pool", owner, LONG_MS, wait_s=60):
                    with guard:
                        inside += 1
                        most = max(most, inside)
                    seen = [r.owner for r in store.get_slot_holders("pool")]
                    if owner not in seen or len(seen) > limit:
                        problems.append(f"{owner} holding saw {seen}")
                    with guard:
                        inside -= 1

        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(120)
        assert not any(worker.is_alive() for worker in workers)
        assert problems == []
        assert most <= limit
        assert store.get_slot_holders("pool") == []


def test_a_forked_child_takes_its_own_slot_not_the_parents(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/slots.db"
    with leasekit.sync.connect(url) as leases:
        assert leases.acquire_slot("pool", "parent", LONG_MS, limit=2).acquired

        def child() -> dict[str, object]:
            mine = leases.acquire_slot("pool", f"child-{os.getpid()}", LONG_MS, limit=2)
            full = leases.acquire_slot("pool", "third", LONG_MS, limit=2)
            released_parents = leases.release_slot("pool", "not-the-parent")
            return {
                "mine": mine.acquired,
                "full": (full.acquired, full.held, list(full.holders)[:1]),
                "released": released_parents,
            }

        (result,) = collect([fork_child(child)])
        assert result == {"mine": True, "full": [False, 2, ["parent"]], "released": False}
        assert next(r.owner for r in leases.get_slot_holders("pool")) == "parent"


async def test_a_cancelled_acquire_leaves_no_slot_held(tmp_path: Path) -> None:
    # Cancelled at every point of a slot acquire on SQLite (a thread runs it): each
    # cancelled call either granted and was undone, or granted nothing.
    async with leasekit.connect(f"sqlite:///{tmp_path}/slots.db") as provider:
        slots: object = provider
        for attempt in range(40):
            owner = f"o{attempt}"
            call = asyncio.create_task(
                slots.acquire_slot("pool", owner, LONG_MS, limit=1)  # type: ignore[attr-defined]
            )
            await asyncio.sleep(attempt * 0.0002)
            call.cancel()
            try:
                result = await call
            except asyncio.CancelledError:
                continue
            if result.acquired:
                assert await slots.release_slot("pool", owner)  # type: ignore[attr-defined]
        # The undos run in the background (aclose waits for them): wait until they did.
        for _ in range(200):
            if await slots.get_slot_holders("pool") == []:  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.02)
        assert await slots.get_slot_holders("pool") == []  # type: ignore[attr-defined]


async def test_counting_needs_a_backend_with_slots_and_a_good_limit() -> None:
    class FiveMethods:
        async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> object: ...
        async def get_lease_owner(self, key: str) -> object: ...
        async def release_lease(self, key: str, owner: str) -> None: ...
        async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool: ...
        async def transfer_lease(self, k: str, f: str, t: str, ttl_ms: int) -> bool: ...

    with pytest.raises(BackendLacksCapability) as lacking:
        leasekit.counting(FiveMethods(), 2)
    assert lacking.value.missing == ("slots",)
    with pytest.raises(InvalidLeaseArgument):
        leasekit.counting(MemoryLeaseProvider(), 0)
    with leasekit.sync.connect("noop://") as noop, pytest.raises(BackendLacksCapability):
        noop.acquire_slot("k", "a", 1000, limit=2)


async def test_a_limit_mismatch_names_both_limits_and_survives_pickling() -> None:
    import pickle  # noqa: PLC0415

    provider = MemoryLeaseProvider()
    await provider.acquire_slot("k", "a", LONG_MS, limit=2)
    with pytest.raises(SlotLimitMismatch) as caught:
        await provider.acquire_slot("k", "b", LONG_MS, limit=3)
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (type(copy), str(copy), copy.limit, copy.stored_limit) == (
        SlotLimitMismatch,
        str(caught.value),
        3,
        2,
    )
    assert "limit 2" in str(copy)
    assert isinstance(copy, ValueError)


def test_the_slot_benchmark_runs_and_reports_each_row(tmp_path: Path) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "slots.py"
    url = f"sqlite:///{tmp_path}/bench.db"
    done = subprocess.run(
        [sys.executable, "-W", "error", str(script), "memory://", url, "--cycles", "20"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split()[0:3] for line in done.stdout.splitlines() if "cycles/s" in line]
    assert len(rows) == 6, done.stdout


async def test_a_writer_waiting_in_hold_is_not_starved_by_new_readers(url: str) -> None:
    # Readers come and go on the key without a pause; a writer waiting in hold() gets
    # in as soon as the readers it found are gone, because its claim turns new ones away.
    async with leasekit.connect(url) as provider:
        readers = leasekit.counting(provider, 4)
        writer = leasekit.counting(provider, 4, exclusive=True)
        stop = asyncio.Event()
        turned_away = 0

        async def reader(index: int) -> None:
            nonlocal turned_away
            round_ = 0
            while not stop.is_set():
                round_ += 1
                result = await readers.acquire_lease("doc", f"r{index}-{round_}", LONG_MS)
                if not result.acquired:
                    turned_away += 1
                    await asyncio.sleep(0.005)
                    continue
                await asyncio.sleep(0.01)
                await readers.release_lease("doc", f"r{index}-{round_}")

        tasks = [asyncio.create_task(reader(i)) for i in range(4)]
        await asyncio.sleep(0.05)
        try:
            async with leasekit.hold(writer, "doc", "w", LONG_MS, wait_s=30) as held:
                seen = await provider.get_slot_holders("doc")  # type: ignore[attr-defined]
                assert [r.owner for r in seen] == ["w"]
                assert held.token is not None
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        assert turned_away > 0  # readers were turned away while the writer waited or held
