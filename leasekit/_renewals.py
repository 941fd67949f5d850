"""Coalescing the renewals of many holds on one provider into batched ``renew_leases`` calls.

A :class:`LeaseHold` whose backend offers ``renew_leases``
(:class:`leasekit.backend.SupportsRenewMany`) does not renew itself: its renewer hands
the hold to the :class:`RenewalBatcher` of its provider, clock and event loop
(:meth:`RenewalBatcher.keep`) and sleeps until a renewal is refused or fails. The
batcher keeps every such hold on one schedule (a heap of due times, one timer), so a
renewal period costs each hold no task wake-up and no timer of its own, only its share
of a batch: 10,000 holds cost a few ``renew_leases`` calls per period and a few
microseconds of CPU each.

When the earliest due renewal comes, every renewal due within its hold's *lead* (a
twentieth of ``renew_every_ms``, at most ``_MAX_LEAD_S`` in ``_hold``) goes out with
it, in calls of at most ``RENEW_BATCH_LIMIT`` items, each in a task of its own.
Renewals therefore only ever move earlier than the hold's own schedule, never later:
every deadline the hold keeps is unchanged. A renewed hold believes from the moment
the batch was sent (the store started the TTL no earlier) and is scheduled again;
a refused one wakes its renewer, which declares the loss; a failed batch wakes the
renewer of every hold in it with the error, and none of them believes it renewed.
Each then retries on its own backoff schedule while its deadline allows
(:meth:`RenewalBatcher.renew`, one renewal sent by a given moment, so the retries of
many holds coalesce again), and after a success goes back on the shared schedule.

A hold that stops (its deadline passed, it leaves, it transfers) cancels its renewer,
which takes the hold off the schedule; a batch in flight that nobody waits for any more
is cancelled, and the last hold to leave waits for it to end, so no task outlives the
holds.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from . import _hooks
from ._clock import Clock, TimerHandle
from ._errors import InvalidLeaseArgument, LeaseBackendError
from .backend._batch import RENEW_BATCH_LIMIT, RenewItem

__all__ = ["Renewable", "RenewalBatcher", "batcher_for"]

RenewMany = Callable[[Sequence[RenewItem]], Any]

_INF = float("inf")


class Renewable(Protocol):
    """What the batcher needs of a hold it keeps renewed (``LeaseHold``)."""

    key: str
    owner: str
    ttl_ms: int
    renew_every_ms: int

    @property
    def backend(self) -> str: ...

    @property
    def _renewed_at(self) -> float: ...

    @property
    def _lead_s(self) -> float: ...

    def _stopped(self) -> bool: ...

    def _renewed(self, start: float) -> None: ...


class _Item:
    """One renewal in a batch: a single one (a retry), or a kept hold's next one."""

    __slots__ = ("backend", "batch", "future", "key", "owner", "ttl_ms")

    def __init__(
        self, key: str, owner: str, ttl_ms: int, backend: str, future: asyncio.Future[Any]
    ) -> None:
        self.key = key
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.backend = backend
        self.future = future
        self.batch: _Batch | None = None

    @property
    def waiting(self) -> bool:
        return not self.future.done()


class _Kept(_Item):
    """A hold on the shared schedule: ``future`` resolves only on refusal or failure."""

    __slots__ = ("hold",)

    def __init__(self, hold: Renewable, future: asyncio.Future[Any]) -> None:
        super().__init__(hold.key, hold.owner, hold.ttl_ms, hold.backend, future)
        self.hold = hold


class _Batch:
    __slots__ = ("items", "task")

    def __init__(self, items: list[_Item]) -> None:
        self.items = items
        self.task: asyncio.Task[None] | None = None


class RenewalBatcher:
    """The scheduled, pending and in-flight renewals of one provider, clock and loop."""

    def __init__(
        self, renew_many: RenewMany, clock: Clock, forget: Callable[[RenewalBatcher], None]
    ) -> None:
        self._renew_many = renew_many
        self._clock = clock
        self._forget = forget
        self._loop = asyncio.get_running_loop()
        # Kept holds by due time; entries of holds that stopped are skipped when popped.
        self._schedule: list[tuple[float, int, _Kept]] = []
        self._order = itertools.count()
        self._kept = 0  # holds on the schedule or in a batch
        self._pending: list[tuple[float, _Item]] = []  # single renewals: (send by, item)
        self._send_at = _INF  # when the armed timer fires
        self._timer: TimerHandle | None = None
        self._in_flight: set[_Batch] = set()
        self.calls = 0  # renew_leases calls made (for benchmarks and tests)

    # -- the two ways in ---------------------------------------------------------------

    async def keep(self, hold: Renewable) -> Exception | None:
        """Keep ``hold`` renewed on the shared schedule until a renewal is not renewed.

        Returns ``None`` when a renewal was refused (the lease is lost), or the error of
        the batch that failed (the outcome is unknown: the caller retries). Successes
        move the hold's deadline on (``hold._renewed``) without waking the caller.
        Cancelling the caller takes the hold off the schedule.
        """
        future: asyncio.Future[Exception | None] = self._loop.create_future()
        entry = _Kept(hold, future)
        self._kept += 1
        self._plan(entry, hold._renewed_at + hold.renew_every_ms / 1000)
        try:
            return await future
        except asyncio.CancelledError:
            await self._abandon(entry)
            raise
        finally:
            self._kept -= 1
            self._forget_if_idle()

    async def renew(
        self, key: str, owner: str, ttl_ms: int, backend: str, send_by: float
    ) -> tuple[bool, float]:
        """One renewal in the next batch, sent no later than ``send_by`` (on the clock).

        Returns ``(renewed, sent_at)``, ``sent_at`` being the clock's time just before
        the batch went out; raises what the batch raised.
        """
        future: asyncio.Future[tuple[bool, float]] = self._loop.create_future()
        item = _Item(key, owner, ttl_ms, backend, future)
        self._pending.append((send_by, item))
        if len(self._pending) >= RENEW_BATCH_LIMIT:
            self._fire()
        elif send_by < self._send_at:
            self._arm(send_by)
        try:
            return await future
        except asyncio.CancelledError:
            await self._abandon(item)
            raise
        finally:
            self._forget_if_idle()

    # -- the schedule ------------------------------------------------------------------

    def _plan(self, entry: _Kept, due: float) -> None:
        heapq.heappush(self._schedule, (due, next(self._order), entry))
        if due < self._send_at:
            self._arm(due)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._send_at = when
        self._timer = self._clock.call_at(when, self._fire)

    def _fire(self) -> None:
        """Send every renewal that is due, or due within its hold's lead."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._send_at = _INF
        now = self._clock.monotonic()
        pending, self._pending = self._pending, []
        # Single renewals go now, however early: none of them is asked for long before.
        due: list[_Item] = [item for _, item in pending if item.waiting]
        schedule = self._schedule
        while schedule:
            when, _, entry = schedule[0]
            if entry.waiting and when - entry.hold._lead_s > now:
                break
            heapq.heappop(schedule)
            if entry.waiting and not entry.hold._stopped():
                due.append(entry)
        for start in range(0, len(due), RENEW_BATCH_LIMIT):
            batch = _Batch(due[start : start + RENEW_BATCH_LIMIT])
            for item in batch.items:
                item.batch = batch
            self._in_flight.add(batch)
            batch.task = self._loop.create_task(self._send(batch), name="leasekit renewal batch")
        if schedule:
            self._arm(schedule[0][0])
        self._forget_if_idle()

    # -- one batch ---------------------------------------------------------------------

    async def _send(self, batch: _Batch) -> None:
        items = batch.items
        sent_at = self._clock.monotonic()
        started = time.perf_counter()
        try:
            self.calls += 1
            results = await self._renew_many([(i.key, i.owner, i.ttl_ms) for i in items])
            if not isinstance(results, list) or len(results) != len(items):
                raise LeaseBackendError(
                    f"renew_leases answered {len(items)} items with {results!r:.100}",
                    backend=items[0].backend,
                )
        except asyncio.CancelledError:
            for item in items:
                item.future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 (every hold in the batch hears of it)
            _report_failure(items, exc, time.perf_counter() - started)
            _fail(items, exc)
        else:
            _report_outcomes(items, results, time.perf_counter() - started)
            self._settle(items, results, sent_at)
        finally:
            self._in_flight.discard(batch)
            self._forget_if_idle()

    def _settle(self, items: list[_Item], results: list[Any], sent_at: float) -> None:
        for item, renewed in zip(items, results, strict=True):
            if not item.waiting:
                continue
            item.batch = None
            if not isinstance(item, _Kept):
                item.future.set_result((renewed is True, sent_at))
            elif renewed is not True:
                item.future.set_result(None)  # refused: the hold's renewer declares the loss
            elif not item.hold._stopped():
                item.hold._renewed(sent_at)
                self._plan(item, sent_at + item.hold.renew_every_ms / 1000)

    async def _abandon(self, item: _Item) -> None:
        """``item``'s hold stopped waiting: its batch goes on, unless nobody else waits."""
        batch = item.batch
        if batch is None:
            return  # still on the schedule or pending: skipped when it comes up
        task = batch.task
        if task is None or task.done():
            return
        if not any(other.waiting for other in batch.items):
            task.cancel()
            # The call in flight is cut off, as a hold's own renew_lease would be.
            await asyncio.wait([task])

    def _forget_if_idle(self) -> None:
        if self._kept or self._in_flight or any(item.waiting for _, item in self._pending):
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._send_at = _INF
        self._schedule.clear()
        self._pending.clear()
        self._forget(self)


def _fail(items: list[_Item], exc: Exception) -> None:
    # No hold believes a failed batch: kept holds' renewers wake to retry, single
    # renewals raise.
    for item in items:
        if item.waiting:
            item.batch = None
            if isinstance(item, _Kept):
                item.future.set_result(exc)
            else:
                item.future.set_exception(exc)


def _report_outcomes(items: list[_Item], results: list[Any], latency_s: float) -> None:
    if _hooks.relay() is None:
        return
    for item, renewed in zip(items, results, strict=True):
        if not item.waiting:
            continue  # its hold stopped waiting: as for a cancelled renew_lease, no event
        if renewed is True:
            _hooks.emit(
                "leasekit_renewed",
                key=item.key,
                owner=item.owner,
                backend=item.backend,
                latency_s=latency_s,
            )
        else:
            _hooks.emit(
                "leasekit_lost",
                key=item.key,
                owner=item.owner,
                backend=item.backend,
                reason="renew_refused",
                latency_s=latency_s,
            )


def _report_failure(items: list[_Item], exc: Exception, latency_s: float) -> None:
    if _hooks.relay() is None or isinstance(exc, InvalidLeaseArgument):
        return
    for item in items:
        if not item.waiting:
            continue
        _hooks.emit(
            "leasekit_failed",
            operation="renew",
            key=item.key,
            owner=item.owner,
            backend=item.backend,
            error=exc,
            latency_s=latency_s,
        )


# One batcher per (provider, clock) on each event loop, while it has work: it is
# dropped when idle and made again on the next renewal, so nothing here keeps a
# provider alive. Keyed by id(): the entry holds the provider and the clock, so
# neither id can be reused while it exists.
_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[int, int], Any]] = (
    weakref.WeakKeyDictionary()
)


def batcher_for(provider: object, clock: Clock) -> RenewalBatcher | None:
    """The batcher for ``provider`` (a backend's own, unwrapped) on ``clock``, on this loop.

    ``None`` when the provider has no ``renew_leases``: it is then renewed lease by lease.
    """
    loop = asyncio.get_running_loop()
    table = _batchers.get(loop)
    if table is None:
        table = _batchers[loop] = {}
    slot = (id(provider), id(clock))
    entry = table.get(slot)
    if entry is not None:
        return entry[0]  # type: ignore[no-any-return]
    renew_many = getattr(provider, "renew_leases", None)
    if not callable(renew_many):
        return None

    def forget(batcher: RenewalBatcher) -> None:
        current = table.get(slot)
        if current is not None and current[0] is batcher:
            del table[slot]

    batcher = RenewalBatcher(renew_many, clock, forget)
    table[slot] = (batcher, provider, clock)
    return batcher
