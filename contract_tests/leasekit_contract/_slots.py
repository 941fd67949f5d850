"""Counting leases: ``limit`` slots per key (``Capabilities(slots=True)``).

:class:`SlotChecks` runs on a backend that declares ``slots=True``: up to ``limit``
holders at once and never more (tasks racing on one provider, and 4 processes of 16
tasks each, judged from what the store reports while each holds and from the
recorded histories), each slot with its own owner, TTL, renewal, release, transfer and
fencing token, a denial that counts and names the holders, a ``limit`` that disagrees
with the key's refused with :class:`leasekit.SlotLimitMismatch` and nothing written,
and bad input refused before any I/O.
"""

from __future__ import annotations

import functools
import random
import time
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

import anyio
import pytest

from leasekit import (
    MAX_SLOT_LIMIT,
    SLOT_HOLDERS_SHOWN,
    InvalidLeaseArgument,
    LeaseProvider,
    SlotLimitMismatch,
    SlotResult,
)
from leasekit.backend import LeaseRecord

from ._base import (
    ContractBase,
    KeySpace,
    ProviderFactory,
    Timing,
    require_factory,
    run_concurrently,
)
from ._concurrency import PROCESS_START_TIMEOUT_S
from ._workers import BARRIER_TIMEOUT_S, Report, open_provider, run_in_processes

__all__ = ["SLOT_CHECKS", "SharedExclusiveChecks", "SlotChecks"]

LIMIT = 3
TASKS = 16
PROCESSES = 4
ROUNDS = 6

_SLOT_METHODS = ("acquire_slot", "renew_slot", "release_slot", "transfer_slot", "get_slot_holders")


def _require_slots(provider: Any) -> Timing:
    t = Timing.of(provider)
    if not t.caps.slots:
        pytest.skip("the backend declares slots=False")
    missing = [name for name in _SLOT_METHODS if not callable(getattr(provider, name, None))]
    if missing:
        pytest.fail(
            f"the backend declares slots=True but lacks {', '.join(missing)} "
            "(see leasekit.backend.SupportsSlots)"
        )
    return t


@dataclass(frozen=True, slots=True)
class _Grant:
    token: int
    held: int
    limit: int


def _granted(result: object, owner: str, what: str) -> _Grant:
    assert isinstance(result, SlotResult), f"{what}: acquire_slot must return a SlotResult"
    assert result.acquired, f"{what}: expected a slot for {owner!r}, got {result!r}"
    assert result.owner == owner, f"{what}: a grant names its owner, got {result!r}"
    assert isinstance(result.token, int), f"{what}: a grant carries a fencing token"
    assert result.holders == (), f"{what}: a grant names no holders, got {result!r}"
    return _Grant(result.token, result.held, result.limit)


async def _holders(provider: Any, key: str) -> list[str]:
    records: list[LeaseRecord] = await provider.get_slot_holders(key)
    assert all(isinstance(r, LeaseRecord) for r in records), records
    assert all(r.key == key for r in records), records
    tokens = [r.token or 0 for r in records]
    assert tokens == sorted(tokens), f"get_slot_holders lists slots in grant order: {records}"
    return [r.owner for r in records]


@dataclass
class _Interval:
    start: float
    end: float
    owner: str


def _most_at_once(intervals: list[_Interval]) -> int:
    """The largest number of intervals that overlap at one instant."""
    events = sorted(
        [(i.start, 1) for i in intervals] + [(i.end, -1) for i in intervals],
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


async def _contend(
    provider: Any, key: str, owners: list[str], ttl_ms: int, seed: int
) -> tuple[list[_Interval], list[str]]:
    """Each owner takes a slot ROUNDS times; what each believed it held, and problems.

    An interval runs from the return of the grant to the start of the release, so the
    store's own interval contains it: more than LIMIT of them at once means more than
    LIMIT holders at once in the store.
    """
    intervals: list[_Interval] = []
    problems: list[str] = []
    rng = random.Random(seed)

    async def one(owner: str) -> None:
        for _ in range(ROUNDS):
            while True:
                result = await provider.acquire_slot(key, owner, ttl_ms, limit=LIMIT)
                if result.acquired:
                    break
                if result.held > LIMIT or len(result.holders) > LIMIT:
                    problems.append(f"a denial counted more than {LIMIT}: {result!r}")
                await anyio.sleep(rng.uniform(0, 0.005))
            start = time.monotonic()
            seen = await provider.get_slot_holders(key)
            if len(seen) > LIMIT or owner not in [r.owner for r in seen]:
                problems.append(f"{owner} holding a slot saw {seen!r}")
            await anyio.sleep(rng.uniform(0, 0.003))
            end = time.monotonic()
            if not await provider.release_slot(key, owner):
                problems.append(f"{owner} released a slot it did not hold")
            intervals.append(_Interval(start, end, owner))

    await run_concurrently(*(functools.partial(one, owner) for owner in owners))
    return intervals, problems


@dataclass(frozen=True, slots=True)
class SlotJob:
    """One contending process: its tasks' owners on one key."""

    factory: ProviderFactory
    backend: str
    index: int
    key: str
    owners: tuple[str, ...]
    ttl_ms: int


async def _contend_in_child(job: SlotJob, barrier: Barrier) -> Any:
    async with open_provider(job.factory) as provider:
        await anyio.to_thread.run_sync(barrier.wait, BARRIER_TIMEOUT_S)
        intervals, problems = await _contend(
            provider, job.key, list(job.owners), job.ttl_ms, job.index
        )
        return [(i.start, i.end, i.owner) for i in intervals], problems


def contend_in_process(job: SlotJob, barrier: Barrier, results: Queue[Report]) -> None:
    """Child process: wait for every sibling, then :func:`_contend` and report."""
    import traceback  # noqa: PLC0415 (only children need it)

    try:
        payload = anyio.run(_contend_in_child, job, barrier, backend=job.backend)
    except Exception:  # noqa: BLE001 (reported to the parent, which fails the test)
        barrier.abort()
        results.put(("error", job.index, traceback.format_exc()))
    else:
        results.put(("ok", job.index, payload))


class SlotChecks(ContractBase):
    """Counting leases: slots, their limit, and what each slot does alone."""

    async def test_up_to_limit_holders_each_with_a_greater_token(
        self, provider: LeaseProvider
    ) -> None:
        t = _require_slots(provider)
        p: Any = provider
        key = KeySpace()("slots")
        tokens = []
        for held, owner in enumerate(["a", "b", "c"], start=1):
            result = _granted(
                await p.acquire_slot(key, owner, t.long_ttl_ms, limit=3), owner, "a free slot"
            )
            assert (result.held, result.limit) == (held, 3), result
            tokens.append(result.token)
        assert tokens == sorted(set(tokens)), tokens
        denied = await p.acquire_slot(key, "d", t.long_ttl_ms, limit=3)
        assert denied == SlotResult(False, None, None, 3, 3, ("a", "b", "c")), denied
        assert await _holders(p, key) == ["a", "b", "c"]
        # The holder's acquire refreshes its own slot, with the same token.
        again = _granted(await p.acquire_slot(key, "b", t.long_ttl_ms, limit=3), "b", "again")
        assert (again.token, again.held) == (tokens[1], 3), again
        # A released slot is free for the next, with a token above every earlier one.
        assert await p.release_slot(key, "a") is True
        assert await p.release_slot(key, "a") is False
        assert await p.release_slot(key, "nobody") is False
        d = _granted(await p.acquire_slot(key, "d", t.long_ttl_ms, limit=3), "d", "freed")
        assert d.token > max(tokens)
        assert await _holders(p, key) == ["b", "c", "d"]

    async def test_a_denial_names_a_bounded_list_of_holders(self, provider: LeaseProvider) -> None:
        t = _require_slots(provider)
        p: Any = provider
        key = KeySpace()("slots-many")
        limit = SLOT_HOLDERS_SHOWN + 4
        owners = [f"o{i:02d}" for i in range(limit)]
        for owner in owners:
            _granted(await p.acquire_slot(key, owner, t.long_ttl_ms, limit=limit), owner, "fill")
        denied = await p.acquire_slot(key, "late", t.long_ttl_ms, limit=limit)
        assert (denied.acquired, denied.held, denied.limit) == (False, limit, limit), denied
        assert denied.holders == tuple(owners[:SLOT_HOLDERS_SHOWN]), denied

    async def test_each_slot_renews_and_expires_alone(self, provider: LeaseProvider) -> None:
        t = _require_slots(provider)
        p: Any = provider
        key = KeySpace()("slots-ttl")
        _granted(await p.acquire_slot(key, "short", t.short_ttl_ms, limit=2), "short", "")
        set_at = time.monotonic()
        _granted(await p.acquire_slot(key, "long", t.short_ttl_ms, limit=2), "long", "")
        assert await p.renew_slot(key, "long", t.long_ttl_ms) is True
        assert await p.renew_slot(key, "nobody", t.long_ttl_ms) is False
        await t.outlive(set_at, t.short_ttl_ms)
        assert await _holders(p, key) == ["long"]
        assert await p.renew_slot(key, "short", t.long_ttl_ms) is False  # it expired
        _granted(await p.acquire_slot(key, "next", t.long_ttl_ms, limit=2), "next", "expired")

    async def test_transfer_moves_one_slot_with_a_new_token(self, provider: LeaseProvider) -> None:
        t = _require_slots(provider)
        p: Any = provider
        key = KeySpace()("slots-transfer")
        a = _granted(await p.acquire_slot(key, "a", t.long_ttl_ms, limit=2), "a", "")
        b = _granted(await p.acquire_slot(key, "b", t.long_ttl_ms, limit=2), "b", "")
        assert await p.transfer_slot(key, "a", "b", t.long_ttl_ms) is False  # b holds one
        assert await p.transfer_slot(key, "nobody", "c", t.long_ttl_ms) is False
        assert await p.transfer_slot(key, "a", "a", t.long_ttl_ms) is True  # a renewal
        assert await p.transfer_slot(key, "a", "c", t.long_ttl_ms) is True
        records = await p.get_slot_holders(key)
        assert [r.owner for r in records] == ["b", "c"], records
        assert records[0].token == b.token
        assert (records[1].token or 0) > max(a.token, b.token), records
        assert await p.release_slot(key, "a") is False

    async def test_a_limit_other_than_the_keys_is_refused_and_writes_nothing(
        self, provider: LeaseProvider
    ) -> None:
        t = _require_slots(provider)
        p: Any = provider
        key = KeySpace()("slots-limit")
        _granted(await p.acquire_slot(key, "a", t.long_ttl_ms, limit=2), "a", "")
        with pytest.raises(SlotLimitMismatch) as caught:
            await p.acquire_slot(key, "b", t.long_ttl_ms, limit=5)
        assert (caught.value.key, caught.value.limit, caught.value.stored_limit) == (key, 5, 2)
        assert await _holders(p, key) == ["a"]
        # Once every slot is free, the next acquire sets the limit anew.
        assert await p.release_slot(key, "a") is True
        again = _granted(await p.acquire_slot(key, "b", t.long_ttl_ms, limit=5), "b", "")
        assert again.limit == 5

    @pytest.mark.parametrize(
        "limit", [0, -1, True, MAX_SLOT_LIMIT + 1, 2**63, "3", None, 2.0], ids=repr
    )
    async def test_a_bad_limit_is_refused_before_any_io(
        self, provider: LeaseProvider, limit: object
    ) -> None:
        t = _require_slots(provider)
        p: Any = provider
        key = KeySpace()("slots-bad")
        with pytest.raises(InvalidLeaseArgument) as caught:
            await p.acquire_slot(key, "a", t.long_ttl_ms, limit=limit)
        assert caught.value.argument == "limit"
        assert await _holders(p, key) == []

    async def test_bad_keys_owners_and_ttls_are_refused(self, provider: LeaseProvider) -> None:
        t = _require_slots(provider)
        p: Any = provider
        key = KeySpace()("slots-args")
        calls = [
            (p.acquire_slot, ("", "a", t.long_ttl_ms), {"limit": 2}, "key"),
            (p.acquire_slot, (key, "", t.long_ttl_ms), {"limit": 2}, "owner"),
            (p.acquire_slot, (key, "a", 0), {"limit": 2}, "ttl_ms"),
            (p.renew_slot, (key, "a", -5), {}, "ttl_ms"),
            (p.release_slot, (key, 7), {}, "owner"),
            (p.transfer_slot, (key, "a", "", t.long_ttl_ms), {}, "to_owner"),
            (p.get_slot_holders, (b"k",), {}, "key"),
        ]
        for method, args, kwargs, argument in calls:
            with pytest.raises(InvalidLeaseArgument) as caught:
                await method(*args, **kwargs)
            assert caught.value.argument == argument, (method, args)
        assert await _holders(p, key) == []

    async def test_racing_tasks_never_exceed_the_limit(self, provider: LeaseProvider) -> None:
        t = _require_slots(provider)
        key = KeySpace()("slots-race")
        owners = [f"task-{i}" for i in range(TASKS)]
        with anyio.fail_after(120):
            intervals, problems = await _contend(provider, key, owners, t.long_ttl_ms, 0)
        assert problems == []
        assert len(intervals) == TASKS * ROUNDS
        assert _most_at_once(intervals) <= LIMIT

    async def test_racing_processes_never_exceed_the_limit(
        self,
        provider: LeaseProvider,
        provider_factory: ProviderFactory | None,
        anyio_backend_name: str,
    ) -> None:
        """4 processes of 16 tasks each, every task taking a slot ROUNDS times."""
        t = _require_slots(provider)
        factory = require_factory(provider_factory, t.caps, for_processes=True)
        key = KeySpace()("slots-processes")
        jobs = [
            SlotJob(
                factory,
                anyio_backend_name,
                index,
                key,
                tuple(f"p{index}-t{i}" for i in range(TASKS)),
                t.long_ttl_ms,
            )
            for index in range(PROCESSES)
        ]
        payloads = await anyio.to_thread.run_sync(
            run_in_processes, contend_in_process, jobs, PROCESS_START_TIMEOUT_S + 120
        )
        intervals = [_Interval(*i) for found, _ in payloads for i in found]
        problems = [p for _, found in payloads for p in found]
        assert problems == []
        assert len(intervals) == PROCESSES * TASKS * ROUNDS
        assert _most_at_once(intervals) <= LIMIT
        assert await _holders(provider, key) == []


class SharedExclusiveChecks(ContractBase):
    """``acquire_slot(..., exclusive=True)``: one writer alone, readers share, and a
    waiting writer is not starved by new readers."""

    async def test_exclusive_waits_for_every_holder_then_holds_alone(
        self, provider: LeaseProvider
    ) -> None:
        t = _require_slots(provider)
        p: Any = provider
        key = KeySpace()("rw")
        _granted(await p.acquire_slot(key, "r1", t.long_ttl_ms, limit=4), "r1", "reader")
        denied = await p.acquire_slot(key, "w", t.long_ttl_ms, limit=4, exclusive=True)
        assert (denied.acquired, denied.held, denied.exclusive, denied.holders) == (
            False,
            1,
            False,
            ("r1",),
        ), denied
        assert await p.release_slot(key, "r1") is True
        w = await p.acquire_slot(key, "w", t.long_ttl_ms, limit=4, exclusive=True)
        assert (w.acquired, w.exclusive, w.held) == (True, True, 1), w
        # Held exclusively: nobody else gets a slot, shared or exclusive.
        reader = await p.acquire_slot(key, "r2", t.long_ttl_ms, limit=4)
        assert (reader.acquired, reader.exclusive, reader.holders) == (False, True, ("w",))
        other = await p.acquire_slot(key, "w2", t.long_ttl_ms, limit=4, exclusive=True)
        assert (other.acquired, other.exclusive) == (False, True), other
        # The writer's own acquire refreshes it, exclusive still, same token.
        again = await p.acquire_slot(key, "w", t.long_ttl_ms, limit=4)
        assert (again.acquired, again.token, again.exclusive) == (True, w.token, True), again
        assert await p.release_slot(key, "w") is True
        # w2's denied exclusive acquire claimed the next turn: r2 waits for it.
        late = await p.acquire_slot(key, "r2", t.long_ttl_ms, limit=4)
        assert (late.acquired, late.waiting) == (False, "w2"), late
        w2 = await p.acquire_slot(key, "w2", t.long_ttl_ms, limit=4, exclusive=True)
        assert (w2.acquired, w2.exclusive) == (True, True), w2
        assert await p.release_slot(key, "w2") is True
        _granted(await p.acquire_slot(key, "r2", t.long_ttl_ms, limit=4), "r2", "after")

    async def test_a_waiting_writer_stops_new_readers_and_goes_next(
        self, provider: LeaseProvider
    ) -> None:
        t = _require_slots(provider)
        p: Any = provider
        key = KeySpace()("rw-starve")
        _granted(await p.acquire_slot(key, "r1", t.long_ttl_ms, limit=4), "r1", "")
        waiting = await p.acquire_slot(key, "w", t.long_ttl_ms, limit=4, exclusive=True)
        assert not waiting.acquired
        assert waiting.waiting is None, "the claimant itself is not told to wait for itself"
        # Slots are free, but the writer goes next: a new reader is refused, and told why.
        late = await p.acquire_slot(key, "r2", t.long_ttl_ms, limit=4)
        assert (late.acquired, late.held, late.waiting) == (False, 1, "w"), late
        rival = await p.acquire_slot(key, "w2", t.long_ttl_ms, limit=4, exclusive=True)
        assert (rival.acquired, rival.waiting) == (False, "w"), rival
        # The reader it waits for keeps its slot, and renews it.
        assert await p.renew_slot(key, "r1", t.long_ttl_ms) is True
        assert await p.release_slot(key, "r1") is True
        w = await p.acquire_slot(key, "w", t.long_ttl_ms, limit=4, exclusive=True)
        assert (w.acquired, w.exclusive) == (True, True), w
        assert await p.release_slot(key, "w") is True
        # The claim was spent on the grant: readers come in again.
        _granted(await p.acquire_slot(key, "r2", t.long_ttl_ms, limit=4), "r2", "claim spent")

    async def test_a_writer_that_stops_waiting_loses_its_claim(
        self, provider: LeaseProvider
    ) -> None:
        t = _require_slots(provider)
        p: Any = provider
        key = KeySpace()("rw-lapse")
        _granted(await p.acquire_slot(key, "r1", t.long_ttl_ms, limit=4), "r1", "")
        claimed_at = time.monotonic()
        # Its claim lives min(ttl_ms, EXCLUSIVE_INTENT_MS): the short TTL here.
        gone = await p.acquire_slot(key, "w", t.short_ttl_ms, limit=4, exclusive=True)
        assert not gone.acquired
        await t.outlive(claimed_at, t.short_ttl_ms)
        _granted(await p.acquire_slot(key, "r2", t.long_ttl_ms, limit=4), "r2", "claim lapsed")

    async def test_a_bad_exclusive_is_refused_before_any_io(self, provider: LeaseProvider) -> None:
        t = _require_slots(provider)
        p: Any = provider
        key = KeySpace()("rw-bad")
        for bad in (1, "yes", None):
            with pytest.raises(InvalidLeaseArgument) as caught:
                await p.acquire_slot(key, "a", t.long_ttl_ms, limit=2, exclusive=bad)
            assert caught.value.argument == "exclusive"
        assert await _holders(p, key) == []

    async def test_racing_readers_and_writers_never_overlap(self, provider: LeaseProvider) -> None:
        t = _require_slots(provider)
        p: Any = provider
        key = KeySpace()("rw-race")
        limit = 3
        spans: list[tuple[float, float, bool]] = []
        problems: list[str] = []
        rng = random.Random(7)

        async def one(owner: str, exclusive: bool) -> None:
            for _ in range(ROUNDS):
                while True:
                    got = await p.acquire_slot(
                        key, owner, t.long_ttl_ms, limit=limit, exclusive=exclusive
                    )
                    if got.acquired:
                        break
                    await anyio.sleep(rng.uniform(0, 0.004))
                start = time.monotonic()
                seen = await p.get_slot_holders(key)
                if (exclusive and len(seen) != 1) or len(seen) > limit:
                    problems.append(f"{owner} (exclusive={exclusive}) holding saw {seen!r}")
                await anyio.sleep(rng.uniform(0, 0.002))
                spans.append((start, time.monotonic(), exclusive))
                await p.release_slot(key, owner)

        owners = [(f"reader-{i}", False) for i in range(8)] + [
            (f"writer-{i}", True) for i in range(3)
        ]
        with anyio.fail_after(120):
            await run_concurrently(*(functools.partial(one, o, x) for o, x in owners))
        assert problems == []
        writers = [s for s in spans if s[2]]
        assert len(writers) == 3 * ROUNDS
        for w_start, w_end, _ in writers:
            overlapping = [s for s in spans if s[0] < w_end and w_start < s[1]]
            assert len(overlapping) == 1, f"a writer's span overlapped others: {overlapping}"
        readers = [_Interval(a, b, "r") for a, b, x in spans if not x]
        assert _most_at_once(readers) <= limit


SLOT_CHECKS = frozenset(
    name
    for checks in (SlotChecks, SharedExclusiveChecks)
    for name in vars(checks)
    if name.startswith("test_")
)
"""Every check here: they skip on a backend declaring ``slots=False``."""
