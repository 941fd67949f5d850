"""The SQLite backend's group commit: writes handed over together share one transaction.

The async provider runs every operation in one thread; writes that callers hand over
while that thread is busy are run together at its next turn, in one ``BEGIN
IMMEDIATE`` ... ``COMMIT`` (one write lock, one sync), each in a savepoint of its own.
These tests hold the thread with a call that waits for an event, hand over the calls
to group, let the thread go, and read what the connection executed (its trace) and
what each caller was answered. The blocking provider runs one operation per call, as
before (``leasekit.sync``'s callers wait for their own statement).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Generator
from pathlib import Path
from typing import Any

import pytest
from leasekit_sqlite import SQLiteLeaseProvider, _ops
from test_fork import collect, fork_child

import leasekit
from leasekit import LeaseResult, SlotLimitMismatch

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the transport is asyncio's (SQLite's thread, the loop's futures)


@pytest.fixture
async def provider(tmp_path: Path) -> AsyncIterator[SQLiteLeaseProvider]:
    async with SQLiteLeaseProvider(tmp_path / "group.db", timeout_s=10.0) as p:
        yield p


class Held:
    """The provider's thread, held by a call that waits for :meth:`go`; its trace."""

    def __init__(self, provider: SQLiteLeaseProvider) -> None:
        self.provider = provider
        self.started = threading.Event()
        self.release = threading.Event()
        self.statements: list[str] = []

    def _wait(self) -> Generator[_ops.Query, Any, None]:
        self.started.set()
        if not self.release.wait(30):
            raise AssertionError("the test never let the thread go")
        conn = self.provider._connection._connection._conn
        assert conn is not None
        conn.set_trace_callback(self.statements.append)
        yield from ()

    async def __aenter__(self) -> Held:
        self.waiting = asyncio.ensure_future(self.provider._connection.run(self._wait()))
        await asyncio.get_running_loop().run_in_executor(None, self.started.wait, 30)
        return self

    async def go(self) -> None:
        await asyncio.sleep(0)  # the calls gathered so far have handed their operations over
        self.release.set()
        await self.waiting

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        await self.waiting
        conn = self.provider._connection._connection._conn
        assert conn is not None
        conn.set_trace_callback(None)

    def count(self, prefix: str) -> int:
        return sum(1 for s in self.statements if s.strip().upper().startswith(prefix))


async def test_writes_handed_over_together_are_one_transaction_each_with_its_own_answer(
    provider: SQLiteLeaseProvider,
) -> None:
    assert (await provider.acquire_slot("slots", "s0", 60_000, limit=2)).acquired
    async with Held(provider) as held:
        calls = [
            asyncio.ensure_future(c)
            for c in (
                provider.acquire_lease("k", "a", 60_000),
                provider.acquire_lease("k", "b", 60_000),  # after a's, so denied
                provider.acquire_slot("slots", "s1", 60_000, limit=3),  # the wrong limit
                provider.release_lease("k", "a"),
                provider.acquire_lease("k", "c", 60_000, metadata=b"\0c:1"),  # after a's release
                provider.renew_lease("k", "b", 60_000),  # b never held it
            )
        ]
        await held.go()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    first, denied, mismatch, released, taken, renewed = outcomes
    assert isinstance(first, LeaseResult)
    assert first.acquired
    assert isinstance(denied, LeaseResult)
    assert (denied.acquired, denied.owner) == (False, "a")
    assert isinstance(mismatch, SlotLimitMismatch)
    assert released is None
    assert isinstance(taken, LeaseResult)
    assert (taken.acquired, taken.owner, taken.metadata) == (True, "c", b"\0c:1")
    assert first.token is not None
    assert taken.token is not None
    assert taken.token > first.token
    assert renewed is False
    # One write lock and one sync for the six, each in its own savepoint; the refused
    # slot acquire was rolled back alone.
    assert held.count("BEGIN") == 1
    assert held.count("COMMIT") == 1
    assert held.count("SAVEPOINT") == 6
    assert held.count("ROLLBACK TO") >= 1
    assert await provider.get_lease_owner("k") == "c"
    holders = await provider.get_slot_holders("slots")
    assert [h.owner for h in holders] == ["s0"]  # nothing of the refused one written


async def test_a_caller_cancelled_while_its_write_waits_is_dropped_before_it_starts(
    provider: SQLiteLeaseProvider,
) -> None:
    async with Held(provider) as held:
        cancelled = asyncio.ensure_future(provider.acquire_lease("k", "gone", 60_000))
        kept = asyncio.ensure_future(provider.acquire_lease("other", "stays", 60_000))
        await asyncio.sleep(0)
        cancelled.cancel()
        await held.go()
        assert (await kept).acquired
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert await provider.get_lease_owner("k") is None
    # Its acquire was never sent (owners are bound as blobs: x'...' in the trace); the
    # toolkit, which cannot know that, sent the undo of a grant that might have been.
    acquires = [s for s in held.statements if "INSERT INTO" in s and b"gone".hex() in s]
    assert acquires == []


async def test_a_deadline_passed_in_the_queue_times_out_and_leaves_nothing_held(
    tmp_path: Path,
) -> None:
    async with SQLiteLeaseProvider(tmp_path / "deadline.db", timeout_s=0.2) as provider:
        async with Held(provider) as held:
            late = asyncio.ensure_future(provider.acquire_lease("k", "late", 60_000))
            with pytest.raises(leasekit.LeaseBackendTimeout):
                await late
            await held.go()
        assert await provider.get_lease_owner("k") is None


async def test_group_commit_in_a_forked_child(provider: SQLiteLeaseProvider) -> None:
    """A child forked while the parent's provider is in use groups its own writes, on a
    connection and thread of its own, and sees the parent's lease."""
    assert (await provider.acquire_lease("parent", "p", 60_000)).acquired

    def child() -> list[bool]:
        async def work() -> list[bool]:
            results = await asyncio.gather(
                *(provider.acquire_lease(f"child-{i}", "c", 60_000) for i in range(8)),
                provider.acquire_lease("parent", "c", 60_000),
            )
            return [r.acquired for r in results]

        return asyncio.run(work())

    (result,) = await asyncio.get_running_loop().run_in_executor(
        None, lambda: collect([fork_child(child)])
    )
    assert result == [True] * 8 + [False]
    assert await provider.get_lease_owner("child-3") == "c"
