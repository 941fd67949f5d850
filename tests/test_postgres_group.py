"""PostgreSQL: calls that arrive together are decided together, each caller answered alone.

Every test first holds up the provider's statements of one kind (rows locked by a
transaction of the test's own, outside the code under test), so that the calls made
next wait and go out as one group once a held-up statement ends; what each caller
gets, and what the store holds, is then checked.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from scenarios import LONG_MS
from servers import missing_extra

import leasekit

try:
    import psycopg
    from psycopg import sql
except ImportError:  # pragma: no cover
    missing_extra("postgres", "the PostgreSQL tests")

from leasekit_postgres import PostgresLeaseProvider
from leasekit_postgres._group import IN_FLIGHT, Groups
from leasekit_postgres._sql import GRANT_PREFIX, channel_for

pytestmark = pytest.mark.anyio


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    """Wait until ``predicate()`` is true; fail after a limit only a hung test reaches."""
    deadline = time.monotonic() + 10
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@contextmanager
def rows_locked(url: str, table: str, keys: list[str]) -> Iterator[psycopg.Connection[Any]]:
    """The rows of ``keys`` (which must exist) locked by a transaction of the test's own
    until the block ends (or its ``rollback()``)."""
    with psycopg.connect(url) as conn:
        conn.execute(
            sql.SQL("SELECT key FROM {} WHERE key = ANY(%s) FOR UPDATE").format(
                sql.Identifier(*table.split("."))
            ),
            ([key.encode() for key in keys],),
        )
        yield conn
        conn.rollback()


async def held_up(p: PostgresLeaseProvider) -> list[asyncio.Future[Any]]:
    """Rows ``held-0``... created; the caller locks them, then calls this to fill the
    provider's acquires in flight with statements waiting for them."""
    tasks = [
        asyncio.ensure_future(p.acquire_lease(f"held-{i}", "blocked", LONG_MS))
        for i in range(IN_FLIGHT)
    ]
    await eventually(lambda: p._groups.acquire.in_flight == IN_FLIGHT, "acquires in flight")
    return tasks


async def make_rows(p: PostgresLeaseProvider, keys: list[str]) -> None:
    for key in keys:
        assert (await p.acquire_lease(key, "setup", LONG_MS)).acquired
        await p.release_lease(key, "setup")


@pytest.fixture
async def provider(postgres_url: str, postgres_table: str) -> Any:
    async with PostgresLeaseProvider.from_url(
        postgres_url, table=postgres_table, timeout_s=2.0
    ) as p:
        yield p


async def test_a_group_mixing_grant_deny_and_error_gives_each_caller_its_own_answer(
    provider: PostgresLeaseProvider, postgres_url: str, postgres_table: str
) -> None:
    p = provider
    held = [f"held-{i}" for i in range(IN_FLIGHT)]
    await make_rows(p, [*held, "locked"])
    assert (await p.acquire_lease("taken", "other", LONG_MS, metadata=b"route")).acquired
    with (
        rows_locked(postgres_url, postgres_table, ["locked"]),
        rows_locked(postgres_url, postgres_table, held) as blocker,
    ):
        blocked = await held_up(p)
        free = asyncio.ensure_future(p.acquire_lease("free", "a", LONG_MS))
        taken = asyncio.ensure_future(p.acquire_lease("taken", "a", LONG_MS))
        locked = asyncio.ensure_future(p.acquire_lease("locked", "a", LONG_MS))
        await eventually(lambda: len(p._groups.acquire.waiting) == 3, "three waiting")
        blocker.rollback()  # the held-up statements end: the three go out together
        assert all(r.acquired for r in await asyncio.gather(*blocked))
        granted, denied = await asyncio.gather(free, taken)
        # "locked" kept the group waiting past its lock timeout: each member went
        # alone, and only "locked" waits on, until its own deadline.
        with pytest.raises(leasekit.LeaseBackendTimeout):
            await locked
    assert p._groups.acquire.grouped >= 1
    assert granted.acquired
    assert granted.owner == "a"
    assert granted.token is not None
    assert not denied.acquired
    assert denied.owner == "other"
    assert denied.metadata == b"route"
    assert await p.get_lease_owner("free") == "a"
    assert await p.get_lease_owner("taken") == "other"
    # The timed-out grant may have landed (its statement ran once the lock went): the
    # toolkit keeps it unsettled, as for any timeout; nothing else holds the key.
    assert await p.get_lease_owner("locked") in {None, "a"}


async def test_a_group_decides_each_member_as_the_single_statement_would(
    provider: PostgresLeaseProvider, postgres_url: str, postgres_table: str
) -> None:
    p = provider
    held = [f"held-{i}" for i in range(IN_FLIGHT)]
    await make_rows(p, held)
    mine = await p.acquire_lease("mine", "a", LONG_MS)
    assert (await p.acquire_lease("theirs", "b", LONG_MS)).acquired
    with rows_locked(postgres_url, postgres_table, held) as blocker:
        blocked = await held_up(p)
        calls = [
            asyncio.ensure_future(p.acquire_lease("mine", "a", LONG_MS, metadata="again")),
            asyncio.ensure_future(p.acquire_lease("theirs", "a", LONG_MS)),
            asyncio.ensure_future(p.acquire_lease("new", "a", LONG_MS)),
        ]
        renewals = [
            asyncio.ensure_future(p.renew_lease("held-x", "a", LONG_MS)),
        ]
        await eventually(lambda: len(p._groups.acquire.waiting) == 3, "three waiting")
        blocker.rollback()
        await asyncio.gather(*blocked)
        again, theirs, new = await asyncio.gather(*calls)
        assert await asyncio.gather(*renewals) == [False]
    assert again.acquired
    assert again.token == mine.token
    assert not theirs.acquired
    assert theirs.owner == "b"
    assert new.acquired
    assert new.token is not None
    record = await p.get_lease_record("mine")
    assert record is not None
    assert record.metadata == b"again"
    releases = await asyncio.gather(
        p.release_if_held("mine", "a"),
        p.release_if_held("theirs", "a"),
        p.release_if_held("new", "a"),
        p.release_if_held("nothing", "a"),
    )
    assert releases == [True, False, True, False]
    assert await p.get_lease_owner("theirs") == "b"
    assert await p.get_lease_owner("mine") is None


async def test_a_caller_cancelled_while_queued_is_never_left_holding(
    provider: PostgresLeaseProvider, postgres_url: str, postgres_table: str
) -> None:
    p = provider
    held = [f"held-{i}" for i in range(IN_FLIGHT)]
    await make_rows(p, [*held, "slow"])
    with rows_locked(postgres_url, postgres_table, held) as blocker:
        blocked = await held_up(p)
        waiting = asyncio.ensure_future(p.acquire_lease("queued", "a", LONG_MS))
        await eventually(lambda: len(p._groups.acquire.waiting) == 1, "one waiting")
        waiting.cancel()  # before anything of it was sent
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not p._groups.acquire.waiting
        blocker.rollback()
        await asyncio.gather(*blocked)
    # Nothing of it reached the store: the key has no row at all.
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE key = %s").format(
                sql.Identifier(*postgres_table.split("."))
            ),
            (b"queued",),
        ).fetchone()
    assert row == (0,)

    # Cancelled once its group was sent (the group waits for a row lock): the grant the
    # group made for it is undone by its token.
    with rows_locked(postgres_url, postgres_table, ["slow"]) as slow:
        with rows_locked(postgres_url, postgres_table, held) as blocker:
            blocked = await held_up(p)
            sent = asyncio.ensure_future(p.acquire_lease("sent", "a", LONG_MS))
            other = asyncio.ensure_future(p.acquire_lease("slow", "b", LONG_MS))
            await eventually(lambda: len(p._groups.acquire.waiting) == 2, "two waiting")
            blocker.rollback()
            await asyncio.gather(*blocked)
            await eventually(lambda: not p._groups.acquire.waiting, "the group sent")
            sent.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sent
            slow.rollback()
        await other
    await eventually_owner(p, "sent", None)


async def eventually_owner(p: PostgresLeaseProvider, key: str, owner: str | None) -> None:
    deadline = time.monotonic() + 10
    while (found := await p.get_lease_owner(key)) != owner:
        if time.monotonic() > deadline:
            raise AssertionError(f"{key} still held by {found}")
        await asyncio.sleep(0.01)


async def test_duplicate_keys_in_flight_are_decided_in_arrival_order(
    provider: PostgresLeaseProvider, postgres_url: str, postgres_table: str
) -> None:
    p = provider
    held = [f"held-{i}" for i in range(IN_FLIGHT)]
    await make_rows(p, held)
    owners = [f"o{i}" for i in range(6)]
    with rows_locked(postgres_url, postgres_table, held) as blocker:
        blocked = await held_up(p)
        calls = [asyncio.ensure_future(p.acquire_lease("k", o, LONG_MS)) for o in owners]
        others = [asyncio.ensure_future(p.acquire_lease(f"x{i}", "a", LONG_MS)) for i in range(4)]
        await eventually(lambda: len(p._groups.acquire.waiting) == 10, "ten waiting")
        blocker.rollback()
        await asyncio.gather(*blocked)
        results = await asyncio.gather(*calls)
        assert all(r.acquired for r in await asyncio.gather(*others))
    # The first caller to ask is granted; each later one finds it holding.
    assert results[0].acquired
    assert results[0].owner == "o0"
    assert all(not r.acquired and r.owner == "o0" for r in results[1:])
    # Then releases by the holder and re-acquires, queued together, in order.
    with rows_locked(postgres_url, postgres_table, held) as blocker:
        blocked = [
            asyncio.ensure_future(p.release_if_held(f"held-{i}", "blocked"))
            for i in range(IN_FLIGHT)
        ]
        await eventually(lambda: p._groups.release.in_flight == IN_FLIGHT, "releases in flight")
        releases = [asyncio.ensure_future(p.release_if_held("k", o)) for o in ["o1", "o0", "o0"]]
        await eventually(lambda: len(p._groups.release.waiting) == 3, "three waiting")
        blocker.rollback()
        assert await asyncio.gather(*blocked) == [True] * IN_FLIGHT
        assert await asyncio.gather(*releases) == [False, True, False]


async def test_a_group_sends_each_grant_hint_and_release_notification_once(
    provider: PostgresLeaseProvider, postgres_url: str, postgres_table: str
) -> None:
    p = provider
    held = [f"held-{i}" for i in range(IN_FLIGHT)]
    await make_rows(p, held)
    assert (await p.acquire_lease("mine", "a", LONG_MS)).acquired
    with psycopg.connect(postgres_url, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel_for(postgres_table))))
        with rows_locked(postgres_url, postgres_table, held) as blocker:
            blocked = await held_up(p)
            calls = [
                asyncio.ensure_future(p.acquire_lease(key, "a", LONG_MS))
                for key in ["new-1", "new-2", "mine"]  # two grants, one refresh
            ]
            await eventually(lambda: len(p._groups.acquire.waiting) == 3, "three waiting")
            blocker.rollback()
            await asyncio.gather(*blocked)
            assert all(r.acquired for r in await asyncio.gather(*calls))
        assert p._groups.acquire.grouped >= 1
        released = await asyncio.gather(
            *(p.release_if_held(key, "a") for key in ["new-1", "new-2", "mine", "nothing"])
        )
        assert released == [True, True, True, False]
        payloads = sorted(n.payload for n in listener.notifies(timeout=1.0))
    hinted = [f"{GRANT_PREFIX}{key.encode().hex()}" for key in ["new-1", "new-2"]]
    blocked_hints = [f"{GRANT_PREFIX}{key.encode().hex()}" for key in held]
    releases = [key.encode().hex() for key in ["new-1", "new-2", "mine"]]
    assert payloads == sorted([*hinted, *blocked_hints, *releases])


async def test_a_group_whose_connection_dies_retries_each_caller_by_its_own_policy(
    postgres_url: str, postgres_table: str
) -> None:
    app = f"leasekit-group-{uuid.uuid4().hex[:8]}"
    url = f"{postgres_url}{'&' if '?' in postgres_url else '?'}application_name={app}"
    async with PostgresLeaseProvider.from_url(url, table=postgres_table, timeout_s=5.0) as p:
        # The group waits on a locked row for as long as the test needs.
        p._groups = Groups(p._settings.statements, p._settings.channel, 60_000)
        held = [f"held-{i}" for i in range(IN_FLIGHT)]
        await make_rows(p, [*held, "locked"])
        with rows_locked(postgres_url, postgres_table, ["locked"]) as locker:
            with rows_locked(postgres_url, postgres_table, held) as blocker:
                blocked = await held_up(p)
                calls = [
                    asyncio.ensure_future(p.acquire_lease(key, "a", LONG_MS))
                    for key in ["free", "locked"]
                ]
                await eventually(lambda: len(p._groups.acquire.waiting) == 2, "two waiting")
                blocker.rollback()
                await asyncio.gather(*blocked)
            await eventually(lambda: p._groups.acquire.grouped == 1, "the group sent")
            with psycopg.connect(postgres_url, autocommit=True) as admin:
                query = (
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = %s AND state = 'active' AND query LIKE %s"
                )
                deadline = time.monotonic() + 10
                while not admin.execute(query, (app, "%unnest%")).fetchall():
                    assert time.monotonic() < deadline, "the group's statement never ran"
                    await asyncio.sleep(0.01)
            # Each acquire runs once more on a fresh connection, alone: "free" at once,
            # "locked" once the row is free.
            free = await calls[0]
            assert free.acquired
            locker.rollback()
            assert (await calls[1]).acquired
        assert await p.get_lease_owner("locked") == "a"


async def test_a_child_forked_while_calls_are_held_up_has_groups_of_its_own(
    provider: PostgresLeaseProvider, postgres_url: str, postgres_table: str
) -> None:
    p = provider
    held = [f"held-{i}" for i in range(IN_FLIGHT)]
    await make_rows(p, held)
    with rows_locked(postgres_url, postgres_table, held) as blocker:
        blocked = await held_up(p)  # the parent's acquires in flight: its groups are full
        read_fd, write_fd = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
            pid = os.fork()
        if pid == 0:  # pragma: no cover (the child's coverage is not collected)
            os.close(read_fd)

            async def child() -> bool:
                try:
                    return (await p.acquire_lease("child", "c", LONG_MS)).acquired
                finally:
                    await p.aclose()

            try:
                answer = b"1" if asyncio.run(child()) else b"0"
            except BaseException:
                answer = b"E"
            os.write(write_fd, answer)
            os._exit(0)
        os.close(write_fd)
        deadline = time.monotonic() + 20
        while os.waitpid(pid, os.WNOHANG) == (0, 0):  # noqa: ASYNC222 (WNOHANG: never blocks)
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)  # noqa: ASYNC222 (killed: returns at once)
                break
            await asyncio.sleep(0.02)
        with os.fdopen(read_fd, "rb") as stream:
            answer = stream.read()
        blocker.rollback()
        await asyncio.gather(*blocked)
    assert answer == b"1"
    assert await p.get_lease_owner("child") == "c"
