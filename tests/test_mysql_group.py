"""MySQL/MariaDB: acquires, releases and renewals that arrive together are decided together.

The provider's groups (``leasekit_mysql._group`` on :mod:`leasekit.backend._group`):
calls made while their kind has statements in flight wait and go out as one
multi-statement transaction, each caller keeping its own answer, error and deadline.
The tests hold the provider's statements in flight with row locks of their own
(``SELECT ... FOR UPDATE`` on a connection of the test's) so that calls queue
deterministically, then let go.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from scenarios import LONG_MS
from servers import missing_extra

import leasekit

try:
    import pymysql
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("mysql", "the MySQL tests")

from leasekit_mysql import MySQLLeaseProvider
from leasekit_mysql._group import GroupStatements

from leasekit.backend import GROUP_IN_FLIGHT as IN_FLIGHT
from leasekit.backend import parse_url

pytestmark = pytest.mark.anyio


async def eventually(predicate: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def connect(url: str) -> Any:
    parsed = parse_url(url, schemes=("mysql", "mariadb"), default_port=3306)
    endpoint = parsed.endpoints[0]
    return pymysql.connect(
        host=endpoint.host,
        port=endpoint.port or 3306,
        user=parsed.username or "root",
        password=parsed.password or "",
        autocommit=True,
    )


def quoted(table: str) -> str:
    return ".".join(f"`{part}`" for part in table.split("."))


@contextmanager
def rows_locked(url: str, table: str, keys: list[str]) -> Iterator[Any]:
    """The rows of ``keys`` (which must exist) locked by a transaction of the test's own
    until the block ends (or its ``rollback()``)."""
    conn = connect(url)
    try:
        with conn.cursor() as cursor:
            cursor.execute("START TRANSACTION")
            for key in keys:  # one row at a time, by its primary key: no other row locked
                cursor.execute(
                    f"SELECT lease_key FROM {quoted(table)} WHERE lease_key = %s FOR UPDATE",
                    (key.encode(),),
                )
                assert cursor.fetchone() is not None
        yield conn
        conn.rollback()
    finally:
        conn.close()


def row_count(url: str, table: str, key: str) -> int:
    conn = connect(url)
    try:
        with conn.cursor() as cursor:
            cursor.execute(
                f"SELECT COUNT(*) FROM {quoted(table)} WHERE lease_key = %s",
                (key.encode(),),
            )
            (count,) = cursor.fetchone()
            return int(count)
    finally:
        conn.close()


async def held_up(p: MySQLLeaseProvider) -> list[asyncio.Future[Any]]:
    """Rows ``held-0``... created; the caller locks them, then calls this to fill the
    provider's acquires in flight with statements waiting for them."""
    tasks = [
        asyncio.ensure_future(p.acquire_lease(f"held-{i}", "blocked", LONG_MS))
        for i in range(IN_FLIGHT)
    ]
    await eventually(lambda: p._transport.acquires.in_flight == IN_FLIGHT, "acquires in flight")
    return tasks


async def make_rows(p: MySQLLeaseProvider, keys: list[str]) -> None:
    for key in keys:
        assert (await p.acquire_lease(key, "setup", LONG_MS)).acquired
        await p.release_lease(key, "setup")


@pytest.fixture
async def provider(mysql_url: str, mysql_table: str) -> Any:
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table, timeout_s=3.0) as p:
        yield p


async def test_a_group_mixing_grant_deny_and_error_gives_each_caller_its_own_answer(
    provider: MySQLLeaseProvider, mysql_url: str, mysql_table: str
) -> None:
    p = provider
    held = [f"held-{i}" for i in range(IN_FLIGHT)]
    await make_rows(p, [*held, "locked"])
    assert (await p.acquire_lease("taken", "other", LONG_MS, metadata=b"route")).acquired
    with (
        rows_locked(mysql_url, mysql_table, ["locked"]),
        rows_locked(mysql_url, mysql_table, held) as blocker,
    ):
        blocked = await held_up(p)
        free = asyncio.ensure_future(p.acquire_lease("free", "a", LONG_MS))
        taken = asyncio.ensure_future(p.acquire_lease("taken", "a", LONG_MS))
        locked = asyncio.ensure_future(p.acquire_lease("locked", "a", LONG_MS))
        await eventually(lambda: len(p._transport.acquires.waiting) == 3, "three waiting")
        blocker.rollback()  # the held-up statements end: the three go out together
        assert all(r.acquired for r in await asyncio.gather(*blocked))
        granted, denied = await asyncio.gather(free, taken)
        # "locked" kept the group waiting past its lock wait: each member went alone,
        # and only "locked" waits on, until its own deadline.
        with pytest.raises(leasekit.LeaseBackendTimeout):
            await locked
    assert p._transport.acquires.grouped >= 1
    assert granted.acquired
    assert granted.owner == "a"
    assert granted.token is not None
    assert not denied.acquired
    assert denied.owner == "other"
    assert denied.metadata == b"route"
    assert await p.get_lease_owner("free") == "a"
    assert await p.get_lease_owner("taken") == "other"
    # The timed-out grant may have landed: nothing else holds the key.
    assert await p.get_lease_owner("locked") in {None, "a"}


@pytest.mark.parametrize("tokens", ["sequence", "clock"])
async def test_a_group_decides_each_member_as_the_single_statement_would(
    mysql_url: str, mysql_table: str, tokens: str
) -> None:
    async with MySQLLeaseProvider.from_url(
        mysql_url, table=mysql_table, timeout_s=3.0, tokens=tokens
    ) as p:
        await decided_as_alone(p, mysql_url, mysql_table)


async def decided_as_alone(p: MySQLLeaseProvider, mysql_url: str, mysql_table: str) -> None:
    held = [f"held-{i}" for i in range(IN_FLIGHT)]
    await make_rows(p, held)
    mine = await p.acquire_lease("mine", "a", LONG_MS)
    assert (await p.acquire_lease("theirs", "b", LONG_MS)).acquired
    assert (await p.acquire_lease("lapsed", "b", 1)).acquired
    await asyncio.sleep(0.01)  # "lapsed" expires: a takeover draws a fresh token
    lapsed = await p.get_lease_record("lapsed")
    assert lapsed is None
    with rows_locked(mysql_url, mysql_table, held) as blocker:
        blocked = await held_up(p)
        calls = [
            asyncio.ensure_future(p.acquire_lease("mine", "a", LONG_MS, metadata="again")),
            asyncio.ensure_future(p.acquire_lease("theirs", "a", LONG_MS)),
            asyncio.ensure_future(p.acquire_lease("new", "a", LONG_MS, metadata=b"\x00m")),
            asyncio.ensure_future(p.acquire_lease("lapsed", "a", LONG_MS)),
        ]
        await eventually(lambda: len(p._transport.acquires.waiting) == 4, "four waiting")
        blocker.rollback()
        await asyncio.gather(*blocked)
        again, theirs, new, taken_over = await asyncio.gather(*calls)
    assert again.acquired
    assert again.token == mine.token
    assert not theirs.acquired
    assert theirs.owner == "b"
    assert new.acquired
    assert new.token is not None
    assert taken_over.acquired
    assert taken_over.token is not None
    assert mine.token is not None
    assert taken_over.token > mine.token
    record = await p.get_lease_record("mine")
    assert record is not None
    assert record.metadata == b"again"
    record = await p.get_lease_record("new")
    assert record is not None
    assert record.metadata == b"\x00m"
    # Renewals and releases, queued behind held-up ones of their kind.
    with rows_locked(mysql_url, mysql_table, held) as blocker:
        blocked = [
            asyncio.ensure_future(p.renew_lease(f"held-{i}", "blocked", LONG_MS))
            for i in range(IN_FLIGHT)
        ]
        await eventually(lambda: p._transport.renewals.in_flight == IN_FLIGHT, "renewals")
        renewals = [
            asyncio.ensure_future(p.renew_lease(key, "a", LONG_MS))
            for key in ["mine", "theirs", "new", "nothing"]
        ]
        await eventually(lambda: len(p._transport.renewals.waiting) == 4, "four waiting")
        blocker.rollback()
        assert await asyncio.gather(*blocked) == [True] * IN_FLIGHT
        assert await asyncio.gather(*renewals) == [True, False, True, False]
    assert p._transport.renewals.grouped >= 1
    with rows_locked(mysql_url, mysql_table, held) as blocker:
        blocked = [
            asyncio.ensure_future(p.release_if_held(f"held-{i}", "blocked"))
            for i in range(IN_FLIGHT)
        ]
        await eventually(lambda: p._transport.releases.in_flight == IN_FLIGHT, "releases")
        releases = [
            asyncio.ensure_future(p.release_if_held(key, "a"))
            for key in ["mine", "theirs", "new", "nothing"]
        ]
        await eventually(lambda: len(p._transport.releases.waiting) == 4, "four waiting")
        blocker.rollback()
        assert await asyncio.gather(*blocked) == [True] * IN_FLIGHT
        assert await asyncio.gather(*releases) == [True, False, True, False]
    assert p._transport.releases.grouped >= 1
    assert await p.get_lease_owner("theirs") == "b"
    assert await p.get_lease_owner("mine") is None
    assert await p.get_lease_record("new") is None
    # A released key is granted again with a fresh token.
    after = await p.acquire_lease("mine", "c", LONG_MS)
    assert after.token is not None
    assert after.token > mine.token


async def test_a_caller_cancelled_while_queued_is_never_left_holding(
    provider: MySQLLeaseProvider, mysql_url: str, mysql_table: str
) -> None:
    p = provider
    held = [f"held-{i}" for i in range(IN_FLIGHT)]
    await make_rows(p, [*held, "slow"])
    with rows_locked(mysql_url, mysql_table, held) as blocker:
        blocked = await held_up(p)
        waiting = asyncio.ensure_future(p.acquire_lease("queued", "a", LONG_MS))
        await eventually(lambda: len(p._transport.acquires.waiting) == 1, "one waiting")
        waiting.cancel()  # before anything of it was sent
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not p._transport.acquires.waiting
        blocker.rollback()
        await asyncio.gather(*blocked)
    # Nothing of it reached the store: the key has no row at all.
    assert row_count(mysql_url, mysql_table, "queued") == 0

    # Cancelled once its group was sent (the group waits for a row lock): the grant the
    # group made for it is undone by its token.
    with rows_locked(mysql_url, mysql_table, ["slow"]) as slow:
        with rows_locked(mysql_url, mysql_table, held) as blocker:
            blocked = await held_up(p)
            sent = asyncio.ensure_future(p.acquire_lease("sent", "a", LONG_MS))
            other = asyncio.ensure_future(p.acquire_lease("slow", "b", LONG_MS))
            await eventually(lambda: len(p._transport.acquires.waiting) == 2, "two waiting")
            blocker.rollback()
            await asyncio.gather(*blocked)
            await eventually(lambda: not p._transport.acquires.waiting, "the group sent")
            sent.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sent
            slow.rollback()
        await other
    await eventually_owner(p, "sent", None)


async def eventually_owner(p: MySQLLeaseProvider, key: str, owner: str | None) -> None:
    deadline = time.monotonic() + 10
    while (found := await p.get_lease_owner(key)) != owner:
        if time.monotonic() > deadline:
            raise AssertionError(f"{key} still held by {found}")
        await asyncio.sleep(0.01)


async def test_duplicate_keys_in_flight_are_decided_in_arrival_order(
    provider: MySQLLeaseProvider, mysql_url: str, mysql_table: str
) -> None:
    p = provider
    held = [f"held-{i}" for i in range(IN_FLIGHT)]
    await make_rows(p, held)
    owners = [f"o{i}" for i in range(6)]
    with rows_locked(mysql_url, mysql_table, held) as blocker:
        blocked = await held_up(p)
        calls = [asyncio.ensure_future(p.acquire_lease("k", o, LONG_MS)) for o in owners]
        others = [asyncio.ensure_future(p.acquire_lease(f"x{i}", "a", LONG_MS)) for i in range(4)]
        await eventually(lambda: len(p._transport.acquires.waiting) == 10, "ten waiting")
        blocker.rollback()
        await asyncio.gather(*blocked)
        results = await asyncio.gather(*calls)
        assert all(r.acquired for r in await asyncio.gather(*others))
    # The first caller to ask is granted; each later one finds it holding.
    assert results[0].acquired
    assert results[0].owner == "o0"
    assert all(not r.acquired and r.owner == "o0" for r in results[1:])
    # Then releases by the holder and others, queued together, in order.
    with rows_locked(mysql_url, mysql_table, held) as blocker:
        blocked = [
            asyncio.ensure_future(p.release_if_held(f"held-{i}", "blocked"))
            for i in range(IN_FLIGHT)
        ]
        await eventually(lambda: p._transport.releases.in_flight == IN_FLIGHT, "releases")
        releases = [asyncio.ensure_future(p.release_if_held("k", o)) for o in ["o1", "o0", "o0"]]
        await eventually(lambda: len(p._transport.releases.waiting) == 3, "three waiting")
        blocker.rollback()
        assert await asyncio.gather(*blocked) == [True] * IN_FLIGHT
        assert await asyncio.gather(*releases) == [False, True, False]


async def test_a_group_whose_connection_dies_retries_each_caller_by_its_own_policy(
    mysql_url: str, mysql_table: str
) -> None:
    async with MySQLLeaseProvider.from_url(mysql_url, table=mysql_table, timeout_s=5.0) as p:
        held = [f"held-{i}" for i in range(IN_FLIGHT)]
        await make_rows(p, [*held, "locked"])
        # The group waits on a locked row for as long as the test needs.
        statements = p._schema.statements()
        p._transport._group_sql = GroupStatements(statements, lock_wait_s=60)
        with rows_locked(mysql_url, mysql_table, ["locked"]) as locker:
            with rows_locked(mysql_url, mysql_table, held) as blocker:
                blocked = await held_up(p)
                calls = [
                    asyncio.ensure_future(p.acquire_lease(key, "a", LONG_MS))
                    for key in ["free", "locked"]
                ]
                await eventually(lambda: len(p._transport.acquires.waiting) == 2, "two waiting")
                blocker.rollback()
                await asyncio.gather(*blocked)
            await eventually(lambda: p._transport.acquires.grouped == 1, "the group sent")
            admin = connect(mysql_url)
            try:
                with admin.cursor() as cursor:
                    deadline = time.monotonic() + 10
                    while True:
                        cursor.execute(
                            "SELECT id FROM information_schema.processlist"
                            " WHERE info LIKE %s AND id <> CONNECTION_ID()",
                            ("%UNION ALL%",),
                        )
                        ids = [row[0] for row in cursor.fetchall()]
                        if ids:
                            break
                        assert time.monotonic() < deadline, "the group's statement never ran"
                        await asyncio.sleep(0.01)
                    for ident in ids:
                        cursor.execute(f"KILL {int(ident)}")
            finally:
                admin.close()
            # Each acquire runs once more on a fresh connection, alone: "free" at once,
            # "locked" once the row is free.
            free = await calls[0]
            assert free.acquired
            locker.rollback()
            assert (await calls[1]).acquired
        assert await p.get_lease_owner("locked") == "a"
        assert await p.get_lease_owner("free") == "a"


async def test_a_child_forked_while_calls_are_held_up_has_groups_of_its_own(
    provider: MySQLLeaseProvider, mysql_url: str, mysql_table: str
) -> None:
    p = provider
    held = [f"held-{i}" for i in range(IN_FLIGHT)]
    await make_rows(p, held)
    with rows_locked(mysql_url, mysql_table, held) as blocker:
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
