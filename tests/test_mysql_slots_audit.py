"""MySQL/MariaDB counting leases audited from the store (issue 26).

Never more than ``limit`` live slots of a key at any instant, as the table itself says;
an exclusive slot always alone. The conformance suite's racing checks record intervals
on the client side, which sit inside the store's: a brief excess in the table would be
invisible to them. Here, while callers race on one key exactly as the suite's checks do,
a connection of the test's own counts the key's live slots again and again (``AUDIT``,
expiry judged by the procedures' own clock, ``NOW_UTC``) and keeps the largest count.

A plain snapshot cannot be the auditor on MariaDB: one statement's read view is not a
point in time. It is built while transactions commit (MariaDB collects the active
transactions from a lock-free hash without stopping commits), so it may show a later
commit without an earlier one: with transaction R committed before T's ``COMMIT`` was
sent, 5 of 230,329 single-statement reads saw T's write without R's (MariaDB 10.11).
A take that frees nothing but follows a release would then be counted with the slot the
release freed: ``limit + 1`` slots that never existed together. So each count here is
one of two reads that are an instant:

- ``locking``: ``LOCK IN SHARE MODE``, autocommit: the newest committed version of each
  row, each row locked as it is read until the statement ends. Every row counted still
  exists, unchanged, when the last one is read: they were all live together then (the
  workload's 60 s TTL expires nothing within a read). It also makes the procedures wait
  for the auditor, another interleaving; a deadlock with one only repeats the read.
- ``key``: the key's row locked first (``SELECT ... FOR UPDATE`` on ``<table>_slot_keys``,
  the lock every take and transfer holds), then a snapshot at ``READ COMMITTED``. No
  grant commits while the snapshot is built, only releases, so whatever it shows was
  live when it began: the key between two takes, as the next take finds it.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from scenarios import connect_mysql
from servers import missing_extra

import leasekit

try:
    import asyncmy.errors
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("mysql", "the MySQL tests")

from leasekit_contract._slots import SlotJob, contend_in_process
from leasekit_contract._workers import run_in_processes
from leasekit_mysql._sql import NOW_UTC

pytestmark = pytest.mark.anyio

LIMIT = 3
PROCESSES = 4
TASKS = 16
"""64 callers on one key, as the suite's ``test_racing_processes_never_exceed_the_limit``."""
ROUNDS = 6
RW_ROUNDS = 30
READERS, WRITERS = 8, 3
MODES = ("locking", "key", "holders")
"""``holders``: what the API says, ``get_slot_holders`` through a provider of its own:
the list a caller routes by must be an instant too, never more than the limit."""

# %(key)s -> (live slots, live exclusive slots) of the key, by the server's clock.
AUDIT = (
    "SELECT COUNT(*), COALESCE(SUM(is_exclusive), 0) FROM {slots}"
    f" WHERE lease_key = %(key)s AND expires_at > {NOW_UTC}"
)
_RETRIED = (1205, 1213)  # lock wait timeout, deadlock: the read is repeated


def quoted(table: str, suffix: str) -> str:
    database, name = table.split(".")
    return f"`{database}`.`{name}{suffix}`"


def reads(table: str, mode: str) -> list[str]:
    """The statements of one read in ``mode``; the last but one (or only) counts."""
    count = AUDIT.format(slots=quoted(table, "_slots"))
    if mode == "locking":
        return [f"{count} LOCK IN SHARE MODE"]
    lock = f"SELECT 1 FROM {quoted(table, '_slot_keys')} WHERE lease_key = %(key)s FOR UPDATE"
    return ["START TRANSACTION", lock, count, "COMMIT"]


@dataclass
class Audit:
    """What the auditor saw: reads, the largest counts, and every impossible read."""

    reads: int = 0
    most: int = 0
    most_exclusive: int = 0
    problems: list[str] = field(default_factory=list)

    def saw(self, held: int, exclusive: int) -> None:
        self.reads += 1
        self.most = max(self.most, held)
        self.most_exclusive = max(self.most_exclusive, exclusive)
        if held > LIMIT or exclusive > 1 or (exclusive and held > 1):
            self.problems.append(f"read {self.reads}: {held} live slots, {exclusive} exclusive")


async def audit(url: str, table: str, key: str, mode: str, done: anyio.Event) -> Audit:
    """Count ``key``'s live slots in ``mode`` until ``done`` (and once more after)."""
    if mode == "holders":
        return await audit_holders(url, table, key, done)
    seen = Audit()
    statements = reads(table, mode)
    params = {"key": key.encode()}
    conn = await connect_mysql(url)
    try:
        async with conn.cursor() as cursor:
            await cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            while True:
                finished = done.is_set()
                try:
                    for statement in statements:
                        await cursor.execute(statement, params)
                        if statement.startswith("SELECT COUNT"):
                            held, exclusive = await cursor.fetchone()
                except asyncmy.errors.OperationalError as exc:
                    if exc.args[0] not in _RETRIED:
                        raise
                    await cursor.execute("ROLLBACK")
                    continue
                seen.saw(int(held), int(exclusive))
                if finished:
                    return seen
                await anyio.lowlevel.checkpoint()
    finally:
        conn.close()


async def audit_holders(url: str, table: str, key: str, done: anyio.Event) -> Audit:
    """Count the slots ``get_slot_holders`` lists until ``done`` (and once more after).

    A record does not say whether its slot is exclusive: only the count is checked.
    """
    seen = Audit()
    async with leasekit.connect(url, table=table) as provider:
        p: Any = provider
        while True:
            finished = done.is_set()
            seen.saw(len(await p.get_slot_holders(key)), 0)
            if finished:
                return seen
            await anyio.lowlevel.checkpoint()


async def audited(
    url: str, table: str, key: str, mode: str, workload: Callable[[], Awaitable[Any]]
) -> Audit:
    """Run ``workload`` with the auditor reading beside it; what the auditor saw."""
    done = anyio.Event()
    result: list[Audit] = []

    async def auditor() -> None:
        result.append(await audit(url, table, key, mode, done))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(auditor)
        try:
            await workload()
        finally:
            done.set()
    return result[0]


def check(seen: Audit, request: pytest.FixtureRequest) -> None:
    """``seen`` had nothing impossible. Its numbers are the test's properties, for runs
    that measure (``-o junit_family=xunit1 --junitxml=...``)."""
    for name in ("reads", "most", "most_exclusive"):
        request.node.user_properties.append((name, getattr(seen, name)))
    assert seen.problems == [], seen
    # The auditor read the right rows: with 64 callers someone always holds a slot.
    assert seen.reads > 0
    assert seen.most >= 1, seen


@pytest.mark.parametrize("mode", MODES)
async def test_the_auditor_sees_a_key_held_beyond_its_limit(
    mysql_url: str, mysql_table: str, mode: str
) -> None:
    """The auditor is not blind: slots written past the limit behind the procedures'
    back, and one exclusive among shared ones, are what it reports."""
    key = "forged"
    async with leasekit.connect(mysql_url, table=mysql_table) as provider:
        p: Any = provider
        for owner in ("a", "b", "c"):
            assert (await p.acquire_slot(key, owner, 60_000, limit=LIMIT)).acquired
    slots = quoted(mysql_table, "_slots")
    async with await connect_mysql(mysql_url) as conn, conn.cursor() as cursor:
        # A fourth slot, exclusive, beside the three shared ones.
        await cursor.execute(
            f"INSERT INTO {slots} SELECT lease_key, 'd', token + 1, expires_at, TRUE"
            f" FROM {slots} WHERE lease_key = %s AND owner = 'c'",
            (key.encode(),),
        )
    done = anyio.Event()
    done.set()
    seen = await audit(mysql_url, mysql_table, key, mode, done)
    exclusive = 0 if mode == "holders" else 1  # a record does not say
    assert (seen.reads, seen.most, seen.most_exclusive) == (1, 4, exclusive), seen
    assert len(seen.problems) == 1, seen


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
async def test_racing_processes_never_hold_more_than_the_limit_in_the_store(
    mysql_url: str,
    mysql_table: str,
    mode: str,
    request: pytest.FixtureRequest,
) -> None:
    """4 processes of 16 tasks taking and releasing slots of one key (limit 3)."""
    factory = functools.partial(leasekit.connect, mysql_url, table=mysql_table)
    key = "audited"
    async with factory() as provider:
        await provider.get_slot_holders(key)  # the schema, before the auditor reads it
    jobs = [
        SlotJob(factory, "asyncio", i, key, tuple(f"p{i}-t{t}" for t in range(TASKS)), 60_000)
        for i in range(PROCESSES)
    ]

    async def workload() -> list[Any]:
        return await anyio.to_thread.run_sync(run_in_processes, contend_in_process, jobs, 300)

    seen = await audited(mysql_url, mysql_table, key, mode, workload)
    check(seen, request)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
async def test_racing_readers_and_writers_never_share_the_key_in_the_store(
    mysql_url: str,
    mysql_table: str,
    mode: str,
    request: pytest.FixtureRequest,
) -> None:
    """8 readers and 3 writers (``exclusive=True``) on one key of limit 3: an exclusive
    slot is always alone, readers never more than 3."""
    key = "audited-rw"
    async with leasekit.connect(mysql_url, table=mysql_table) as provider:
        p: Any = provider
        await p.get_slot_holders(key)
        rng = random.Random(7)
        granted: list[bool] = []

        async def one(owner: str, exclusive: bool) -> None:
            for _ in range(RW_ROUNDS):
                while True:
                    got = await p.acquire_slot(key, owner, 60_000, limit=LIMIT, exclusive=exclusive)
                    if got.acquired:
                        break
                    await anyio.sleep(rng.uniform(0, 0.004))
                granted.append(exclusive)
                await anyio.sleep(rng.uniform(0, 0.002))
                assert await p.release_slot(key, owner)

        async def workload() -> None:
            async with anyio.create_task_group() as tasks:
                for i in range(READERS):
                    tasks.start_soon(one, f"reader-{i}", False)
                for i in range(WRITERS):
                    tasks.start_soon(one, f"writer-{i}", True)

        seen = await audited(mysql_url, mysql_table, key, mode, workload)
    assert len(granted) == (READERS + WRITERS) * RW_ROUNDS
    check(seen, request)
