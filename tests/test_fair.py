"""Fair waiting above the contract: wait_for/hold(fair=True), async and blocking, in a
forked child, when a waiter is cancelled, and refused where a backend keeps no line.
The line's semantics are the suite's FairWaitingChecks."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path

import pytest
from test_fork import collect, fork_child

import leasekit
import leasekit.sync
from leasekit import (
    FAIR_PLACE_TTL_MS,
    BackendLacksCapability,
    InvalidLeaseArgument,
    LeaseHeld,
)

pytestmark = pytest.mark.anyio

LONG_MS = 60_000


@pytest.fixture(params=["memory", "sqlite", "etcd", "mysql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://fair-{uuid.uuid4().hex}"
    if request.param == "mysql":
        mysql: str = request.getfixturevalue("mysql_url")
        table = request.getfixturevalue("mysql_table")
        return f"{mysql}{'&' if '?' in mysql else '?'}table={table}"
    if request.param == "etcd":
        server: str = request.getfixturevalue("etcd_url")
        return f"{server}?prefix={request.getfixturevalue('etcd_prefix')}"
    return f"sqlite:///{tmp_path}/fair.db"


def test_blocking_waiters_in_threads_are_served_in_line_order(url: str) -> None:
    with leasekit.sync.connect(url) as leases:
        assert leases.acquire_lease("hot", "holder", LONG_MS).acquired
        waiters = [f"w{i}" for i in range(6)]
        for waiter in waiters:  # the line, in this order
            place = leases.acquire_lease_in_turn("hot", waiter, LONG_MS, place_ttl_ms=LONG_MS)
            assert place.owner == "holder"
        served: list[str] = []
        guard = threading.Lock()

        def wait(owner: str) -> None:
            with leasekit.sync.hold(leases, "hot", owner, LONG_MS, wait_s=60, fair=True), guard:
                served.append(owner)

        threads = [threading.Thread(target=wait, args=(w,)) for w in reversed(waiters)]
        for thread in threads:
            thread.start()
        leases.release_lease("hot", "holder")
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
        assert served == waiters


@pytest.mark.slow
async def test_a_cancelled_waiter_loses_its_place_and_the_next_is_served(url: str) -> None:
    async with leasekit.connect(url) as provider:
        line: object = provider
        assert (await provider.acquire_lease("hot", "holder", LONG_MS)).acquired
        for owner in ("first", "second"):  # the line: first, then second
            joined = await line.acquire_lease_in_turn(  # type: ignore[attr-defined]
                "hot", owner, LONG_MS, place_ttl_ms=FAIR_PLACE_TTL_MS
            )
            assert joined.owner == "holder"
        first = asyncio.create_task(
            leasekit.wait_for(provider, "hot", "first", LONG_MS, 60, fair=True)
        )
        await asyncio.sleep(0.05)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await provider.release_lease("hot", "holder")
        # Free, but "first" still has its place: "second" is refused for now.
        behind = await line.acquire_lease_in_turn(  # type: ignore[attr-defined]
            "hot", "second", LONG_MS, place_ttl_ms=FAIR_PLACE_TTL_MS
        )
        assert (behind.acquired, behind.owner) == (False, None)
        # The place lapses FAIR_PLACE_TTL_MS after first's last attempt; then second is
        # served, and nothing was left held by the cancelled waiter.
        got = await leasekit.wait_for(provider, "hot", "second", LONG_MS, 30, fair=True)
        assert got.acquired
        assert await provider.get_lease_owner("hot") == "second"


def test_a_forked_child_waits_in_the_same_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/fair.db"
    with leasekit.sync.connect(url) as leases:
        assert leases.acquire_lease("hot", "parent", LONG_MS).acquired
        assert not leases.acquire_lease_in_turn("hot", "w0", LONG_MS, place_ttl_ms=LONG_MS).acquired

        def child() -> list[object]:
            # Behind w0: refused even once the key is free, w0 still having its place.
            before = leases.acquire_lease_in_turn("hot", "child", LONG_MS, place_ttl_ms=LONG_MS)
            leases.release_lease("hot", "parent")
            after = leases.acquire_lease_in_turn("hot", "child", LONG_MS, place_ttl_ms=LONG_MS)
            return [before.owner, after.acquired, after.owner]

        (result,) = collect([fork_child(child)])
        assert result == ["parent", False, None]
        assert leases.acquire_lease_in_turn("hot", "w0", LONG_MS, place_ttl_ms=LONG_MS).acquired


async def test_fair_needs_a_backend_with_a_line_and_a_bool() -> None:
    with leasekit.sync.connect("noop://") as noop:
        with pytest.raises(BackendLacksCapability) as lacking:
            leasekit.sync.wait_for(noop, "k", "a", 1000, 1, fair=True)
        assert lacking.value.missing == ("fair_waiting",)
        with pytest.raises(BackendLacksCapability):
            leasekit.sync.hold(noop, "k", "a", 1000, fair=True)
    provider = leasekit.MemoryLeaseProvider()
    with pytest.raises(InvalidLeaseArgument) as bad:
        leasekit.hold(provider, "k", "a", 1000, fair="yes")  # type: ignore[arg-type]
    assert bad.value.argument == "fair"
    # Without fair, nothing changes: the same provider, no line.
    async with leasekit.hold(provider, "k", "a", 1000):
        with pytest.raises(LeaseHeld):
            await leasekit.wait_for(provider, "k", "b", 1000, 0, fair=True)


def test_the_fair_benchmark_runs_and_reports_both_modes(tmp_path: Path) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "fair.py"
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            str(script),
            "memory://",
            "--waiters",
            "4",
            "--handoffs",
            "40",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if "grants/s" in line]
    assert [row.split()[0] for row in rows] == ["fair=False", "fair=True"], done.stdout
