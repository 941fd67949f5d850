"""Coalescing the renewals of many holds on one provider into batched ``renew_leases`` calls.

A :class:`LeaseHold` whose backend offers ``renew_leases``
(:class:`leasekit.backend.SupportsRenewMany`) does not call ``renew_lease`` itself: it
hands its renewal to the :class:`RenewalBatcher` of its provider, clock and event
loop, with the latest moment it must be sent (``send_by``). The hold submits a little
*before* that moment (its lead, a twentieth of ``renew_every_ms`` at most), so
renewals only ever move earlier than the hold's own schedule, never later: every
deadline the hold keeps is unchanged. The batcher sends whatever is pending when the
earliest ``send_by`` comes, in calls of at most ``RENEW_BATCH_LIMIT`` items, each in a
task of its own, and answers every hold with its own item's result and the moment the
batch was sent (the hold's deadline counts from there: the store started the TTL no
earlier).

A batch that fails answers every item with the error: no hold believes it renewed,
each retries on its own schedule while its deadline allows (and those retries
coalesce again). A hold that stops waiting (its deadline passed, it is leaving) drops
its item; a batch in flight that nobody waits for any more is cancelled, and the last
hold to leave waits for it to end, so no task outlives the holds.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from . import _hooks
from ._clock import Clock, TimerHandle
from ._errors import InvalidLeaseArgument, LeaseBackendError
from .backend._batch import RENEW_BATCH_LIMIT, RenewItem

__all__ = ["RenewalBatcher", "batcher_for"]

RenewMany = Callable[[Sequence[RenewItem]], Any]


class _Item:
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


class _Batch:
    __slots__ = ("items", "task")

    def __init__(self, items: list[_Item]) -> None:
        self.items = items
        self.task: asyncio.Task[None] | None = None


class RenewalBatcher:
    """The pending and in-flight renewals of one provider, on one clock and event loop."""

    def __init__(
        self, renew_many: RenewMany, clock: Clock, forget: Callable[[RenewalBatcher], None]
    ) -> None:
        self._renew_many = renew_many
        self._clock = clock
        self._forget = forget
        self._loop = asyncio.get_running_loop()
        self._pending: list[_Item] = []
        self._send_at = float("inf")  # when the armed timer fires
        self._timer: TimerHandle | None = None
        self._in_flight: set[_Batch] = set()
        self.calls = 0  # renew_leases calls made (for benchmarks and tests)

    async def renew(
        self, key: str, owner: str, ttl_ms: int, backend: str, send_by: float
    ) -> tuple[bool, float]:
        """Renew in the next batch, sent no later than ``send_by`` (on the clock).

        Returns ``(renewed, sent_at)``, ``sent_at`` being the clock's time just before
        the batch went out; raises what the batch raised.
        """
        future: asyncio.Future[tuple[bool, float]] = self._loop.create_future()
        item = _Item(key, owner, ttl_ms, backend, future)
        self._pending.append(item)
        if len(self._pending) >= RENEW_BATCH_LIMIT:
            self._flush()
        elif send_by < self._send_at:
            self._arm(send_by)
        try:
            return await future
        except asyncio.CancelledError:
            await self._abandon(item)
            raise

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._send_at = when
        self._timer = self._clock.call_at(when, self._flush)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._send_at = float("inf")
        pending, self._pending = self._pending, []
        live = [item for item in pending if not item.future.done()]
        for start in range(0, len(live), RENEW_BATCH_LIMIT):
            batch = _Batch(live[start : start + RENEW_BATCH_LIMIT])
            for item in batch.items:
                item.batch = batch
            self._in_flight.add(batch)
            batch.task = self._loop.create_task(self._send(batch), name="leasekit renewal batch")
        self._forget_if_idle()

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
            for item in items:
                if not item.future.done():
                    item.future.set_exception(exc)
        else:
            _report_outcomes(items, results, time.perf_counter() - started)
            for item, renewed in zip(items, results, strict=True):
                if not item.future.done():
                    item.future.set_result((renewed is True, sent_at))
        finally:
            self._in_flight.discard(batch)
            self._forget_if_idle()

    async def _abandon(self, item: _Item) -> None:
        """``item``'s hold stopped waiting: drop it, and its batch if nobody else waits."""
        batch = item.batch
        if batch is None:
            if item in self._pending:
                self._pending.remove(item)
                if not self._pending and self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                    self._send_at = float("inf")
                    self._forget_if_idle()
            return
        task = batch.task
        if task is None or task.done():
            return
        if all(other.future.done() for other in batch.items):
            task.cancel()
            # The call in flight is cut off, as a hold's own renew_lease would be.
            await asyncio.wait([task])

    def _forget_if_idle(self) -> None:
        if not self._pending and not self._in_flight:
            self._forget(self)


def _report_outcomes(items: list[_Item], results: list[Any], latency_s: float) -> None:
    if _hooks.relay() is None:
        return
    for item, renewed in zip(items, results, strict=True):
        if item.future.done():
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
        if item.future.done():
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
# provider alive. Keyed by id(): the batcher holds the provider and the clock, so
# neither id can be reused while the entry exists.
_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[int, int], Any]] = (
    weakref.WeakKeyDictionary()
)


def batcher_for(provider: object, clock: Clock) -> RenewalBatcher | None:
    """The batcher for ``provider`` (a backend's own, unwrapped) on ``clock``, on this loop.

    ``None`` when the provider has no ``renew_leases``: it is then renewed lease by lease.
    """
    renew_many = getattr(provider, "renew_leases", None)
    if not callable(renew_many):
        return None
    loop = asyncio.get_running_loop()
    table = _batchers.get(loop)
    if table is None:
        table = _batchers[loop] = {}
    slot = (id(provider), id(clock))
    entry = table.get(slot)
    if entry is not None:
        return entry[0]  # type: ignore[no-any-return]

    def forget(batcher: RenewalBatcher) -> None:
        current = table.get(slot)
        if current is not None and current[0] is batcher:
            del table[slot]

    batcher = RenewalBatcher(renew_many, clock, forget)
    table[slot] = (batcher, provider, clock)
    return batcher
