"""The renew loop of a :class:`leasekit.LeaseHold`: renewing on schedule, retrying failures.

:class:`Renewing` is a base class of ``LeaseHold`` holding only the renewer: when to
renew, alone or in a batch (:mod:`leasekit._renewals`), how failures are retried until
the hold's deadline, and what counts as a refusal. The hold's state, its deadline and
what a loss does stay in :mod:`leasekit._hold`.
"""

from __future__ import annotations

import asyncio
import logging
import random

from . import _hooks
from ._clock import Clock
from ._contract import validate_ttl_ms
from ._errors import InvalidLeaseArgument
from ._renewals import batcher_for

__all__ = ["Renewing", "schedule"]

# Reports renewal failures when no event plugin is registered (see leasekit._hold).
_log = logging.getLogger("leasekit")

# The most a batched renewal is sent ahead of its schedule (a twentieth of the
# interval below 5 s): the window in which due renewals of many holds coalesce.
_MAX_LEAD_S = 0.25


def schedule(
    ttl_ms: int, renew_every_ms: int | None, safety_margin_ms: int | None
) -> tuple[int, int]:
    """A hold's ``(renew_every_ms, safety_margin_ms)``: the defaults, or the given ones checked."""
    if renew_every_ms is None:
        renew_every_ms = max(1, ttl_ms // 3)
    else:
        validate_ttl_ms(renew_every_ms, "renew_every_ms")
    if renew_every_ms >= ttl_ms:
        raise InvalidLeaseArgument.for_argument(
            "renew_every_ms",
            f"must be shorter than ttl_ms ({ttl_ms} ms) so renewals come before expiry, "
            f"got {renew_every_ms}",
        )
    if safety_margin_ms is None:
        safety_margin_ms = _default_safety_margin_ms(ttl_ms, renew_every_ms)
    else:
        checked_margin: object = safety_margin_ms
        if isinstance(checked_margin, bool) or not isinstance(checked_margin, int):
            raise InvalidLeaseArgument.for_argument(
                "safety_margin_ms", "must be an int number of milliseconds", safety_margin_ms
            )
        if safety_margin_ms < 0 or renew_every_ms + safety_margin_ms >= ttl_ms:
            raise InvalidLeaseArgument.for_argument(
                "safety_margin_ms",
                f"must be >= 0 and leave room to renew: renew_every_ms "
                f"({renew_every_ms}) + safety_margin_ms must be less than ttl_ms "
                f"({ttl_ms})",
                safety_margin_ms,
            )
    return renew_every_ms, safety_margin_ms


def _default_safety_margin_ms(ttl_ms: int, renew_every_ms: int) -> int:
    # A tenth of the TTL covers clock-rate drift between host and store (specified at
    # a few hundred ppm, so far below a tenth) and the time the news takes to reach
    # the body on a busy loop; 20 ms is a floor for short TTLs, where one slow loop
    # turn is already a large part of the margin. Never more than half of what lies
    # between a renewal and the TTL, so a renewal always has time to happen.
    return min(max(ttl_ms // 10, 20), (ttl_ms - renew_every_ms) // 2)


class Renewing:
    """The renewer of a hold; ``LeaseHold`` supplies the state declared here."""

    key: str
    owner: str
    ttl_ms: int
    renew_every_ms: int
    lost: asyncio.Event
    _ops: _hooks.HookedLeaseProvider
    _clock: Clock
    _batched: bool
    _lead_s: float
    _renewer: asyncio.Task[None] | None
    _renewing: bool
    _renewed_at: float
    _valid_until: float
    _lost_cause: BaseException | None

    @property
    def backend(self) -> str:
        raise NotImplementedError

    def _believe_from(self, start: float) -> None:
        raise NotImplementedError

    def _declare_lost(
        self, reason: str, cause: BaseException | None, *, cancel: bool = True
    ) -> None:
        raise NotImplementedError

    def _plan_renewals(self) -> None:
        # Renewals go out in batches with other holds' on a backend that can renew many
        # leases at once; each is then submitted up to this lead *before* it is due, so
        # that renewals falling due close together share a call (see _renewals).
        self._batched = callable(getattr(self._ops.wrapped, "renew_leases", None))
        self._lead_s = min(self.renew_every_ms / 20_000, _MAX_LEAD_S) if self._batched else 0.0

    def _start_renewer(self) -> None:
        self._renewing = True
        self._renewer = asyncio.create_task(
            self._renew_loop(), name=f"leasekit renewal of {self.key!r} for {self.owner!r}"
        )

    async def _stop_renewer(self) -> None:
        task, self._renewer = self._renewer, None
        if task is None:
            return
        # The flag as well as cancel(): on 3.11 asyncio.wait_for (a backend's) can
        # swallow a cancellation that races its result; the loop then sees the flag.
        self._renewing = False
        task.cancel()
        # wait() never raises the task's outcome; it raises only if *we* are cancelled,
        # and then the renewer, already told to stop, ends on its next step regardless.
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # retrieved: _renew_loop reports its own errors

    async def _renew_loop(self) -> None:
        try:
            await self._renew_until_lost()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 (whatever it is, the body must hear of it)
            # A bug here must not leave the body running unguarded until the deadline.
            self._declare_lost("error", exc)

    def _stopped(self) -> bool:
        return not self._renewing or self.lost.is_set()

    async def _renew_once(self, due: float) -> tuple[bool, float]:
        """One renewal, sent by ``due`` at the latest: (renewed, when it was sent)."""
        batcher = batcher_for(self._ops.wrapped, self._clock) if self._batched else None
        if batcher is None:
            start = self._clock.monotonic()
            return await self._ops.renew_lease(self.key, self.owner, self.ttl_ms), start
        # In a batch with other holds' renewals; `start` is when the batch went out.
        return await batcher.renew(self.key, self.owner, self.ttl_ms, self.backend, due)

    def _renewed(self, start: float) -> None:
        """A renewal sent at ``start`` succeeded (called by the batcher, too)."""
        due = self._renewed_at + self.renew_every_ms / 1000
        self._lost_cause = None
        self._believe_from(start)
        if _hooks.relay() is not None:
            _hooks.emit(
                "leasekit_renewal_lag",
                key=self.key,
                owner=self.owner,
                backend=self.backend,
                lag_s=max(0.0, self._clock.monotonic() - due),
            )

    async def _renew_until_lost(self) -> None:
        """Renew every ``renew_every_ms``; retry failures while the deadline allows.

        Each renewal has one of three outcomes: renewed (the deadline moves on),
        refused (the lease is lost, for certain: ``"renew_refused"``), or failed (the
        outcome is unknown: retried with backoff until the deadline timer declares the
        lease ``"expired"`` and cancels whatever attempt is still in flight). With
        batched renewals the batcher renews on schedule and this task sleeps until a
        renewal is refused or fails; retries are this task's, as without batching.
        """
        clock = self._clock
        interval_s = self.renew_every_ms / 1000
        while True:
            batcher = batcher_for(self._ops.wrapped, clock) if self._batched else None
            failure: Exception | None = None
            if batcher is not None:
                cause = await batcher.keep(self)
                if self._stopped():
                    return
                if cause is None:
                    self._declare_lost("renew_refused", None)
                    return
                failure = cause
            else:
                await clock.sleep(self._renewed_at + interval_s - clock.monotonic())
                if self._stopped():
                    return
            if not await self._renew_with_retries(failure):
                return

    async def _renew_with_retries(self, failure: Exception | None) -> bool:
        """Renew now (or, after ``failure``, retry): True once renewed, False when done."""
        clock = self._clock
        interval_s = self.renew_every_ms / 1000
        lead_s = self._lead_s
        due = clock.monotonic()
        backoff_s = interval_s / 8
        attempt = 0
        last_chance = False
        while True:
            attempt += 1
            if failure is None:
                try:
                    renewed, start = await self._renew_once(due)
                except Exception as exc:  # noqa: BLE001 (any failure is retried until the deadline)
                    failure = exc
            if failure is not None:
                error, failure = failure, None
                if self._stopped():
                    return False
                pause, last_chance, give_up = self._after_failure(
                    error, attempt, backoff_s, last_chance
                )
                if give_up:
                    return False  # the deadline timer declares the loss
                due = clock.monotonic() + max(0.0, pause)
                await clock.sleep(pause - min(lead_s, pause / 2))
                if self._stopped():
                    return False
                backoff_s = min(backoff_s * 2, interval_s)
                continue
            if self._stopped():
                return False  # a reply after the deadline (or a stop) changes nothing
            if not renewed:
                self._declare_lost("renew_refused", None)
                return False
            self._renewed(start)
            return True

    def _after_failure(
        self, exc: Exception, attempt: int, backoff_s: float, last_chance: bool
    ) -> tuple[float, bool, bool]:
        """A renewal failed: (pause before the next attempt, last_chance, give up)."""
        self._lost_cause = exc
        remaining_s = self._valid_until - self._clock.monotonic()
        pause = backoff_s * random.uniform(0.5, 1.0)
        give_up = pause >= remaining_s and last_chance
        if pause >= remaining_s:
            # One last attempt halfway to the deadline, not a storm of ever closer ones.
            last_chance = True
            pause = remaining_s / 2
        if _hooks.relay() is None:
            _log.warning(
                "renewal %d of lease on %r held by %r failed (%s: %s); %s, "
                "the lease is believed valid for %.3f s more",
                attempt,
                self.key,
                self.owner,
                type(exc).__name__,
                exc,
                "no time left to retry" if give_up else f"retrying in {max(0.0, pause):.3f} s",
                max(0.0, remaining_s),
            )
        return pause, last_chance, give_up
