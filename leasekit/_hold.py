"""Above the contract: hold() with background renewal and loss detection, wait_for(), owner ids.

Everything here is built from the five contract operations, so it works on every
backend. Time on this side is the holder's monotonic clock, used only to decide when
the holder must *stop believing* it holds a lease; the store's clock still decides
expiry.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import socket
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal

from . import _hooks
from ._clock import REAL_CLOCK, Clock, TimerHandle
from ._contract import LeaseProvider, LeaseResult, validate_key, validate_owner, validate_ttl_ms
from ._errors import (
    InvalidLeaseArgument,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
    LeaseError,
    LeaseHeld,
    LeaseLost,
    LeaseProviderClosed,
)
from ._renewals import batcher_for
from ._watch import KeyWaiter
from .backend._records import supports
from .backend._undo import SupportsUndoGrant

__all__ = ["LeaseHold", "OnLost", "hold", "new_owner_id", "wait_for"]

OnLost = Literal["cancel", "flag"]
"""What :func:`hold` does when the lease is lost: cancel the body, or only set ``.lost``."""

# Reports renewal failures and losses when no event plugin is registered: they are
# never silent. With plugins registered, the events go to them instead (the logging
# plugin writes them to this same logger), so nothing is reported twice.
_log = logging.getLogger("leasekit")

_DEFAULT_POLL_S = 0.05
# The most a batched renewal is sent ahead of its schedule (a twentieth of the
# interval below 5 s): the window in which due renewals of many holds coalesce.
_MAX_LEAD_S = 0.25
_DEFAULT_MAX_POLL_S = 1.0
# What bounds leaving a hold (and an undo of ours) on a provider without timeout_s.
_DEFAULT_TIMEOUT_S = 5.0

# Releases of grants nobody learned of, on providers that do not undo them themselves:
# referenced here until done, so the loop does not collect them.
_undoing: set[asyncio.Task[None]] = set()


def new_owner_id(prefix: str = "") -> str:
    """Return a fresh owner id, unique to this call: ``[prefix:]host:pid:random``.

    Owners must be unique per holder. Acquire is idempotent for its owner, so two
    processes that both use, say, the run id as owner would both "win" the same
    lease. Make one id per holder (per process, or per task that holds leases
    independently) and keep it for that holder's lifetime. The host and pid make ids
    readable in ``get_lease_owner`` answers; 64 random bits make them unique.
    """
    checked: object = prefix
    if not isinstance(checked, str):
        raise InvalidLeaseArgument.for_argument(
            "prefix", f"must be a str, got {type(checked).__name__}"
        )
    if prefix:
        validate_owner(prefix, "prefix")
        if len(prefix.encode("utf-8")) > 512:  # leaves room for host, pid and randomness
            raise InvalidLeaseArgument.for_argument("prefix", "must be at most 512 UTF-8 bytes")
    host = (socket.gethostname() or "localhost")[:255]
    parts = [prefix, host, str(os.getpid()), os.urandom(8).hex()]
    return ":".join(part for part in parts if part)


def _check_wait_s(value: object, argument: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be a number of seconds or None, got {value!r}"
        )
    if math.isnan(value) or value < 0:
        raise InvalidLeaseArgument.for_argument(argument, f"must be >= 0 seconds, got {value!r}")
    return None if math.isinf(value) else float(value)


def _check_poll_s(value: object, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be a number of seconds, got {value!r}"
        )
    if not 0 < value < math.inf:
        raise InvalidLeaseArgument.for_argument(argument, f"must be > 0 seconds, got {value!r}")
    return float(value)


async def _acquire_polling(
    provider: LeaseProvider,
    key: str,
    owner: str,
    ttl_ms: int,
    *,
    timeout_s: float | None,
    poll_s: float,
    max_poll_s: float,
    clock: Clock = REAL_CLOCK,
) -> tuple[LeaseResult, float]:
    """Acquire, retrying with jittered exponential backoff; (result, start of the winning call).

    Returns the last denied result once ``timeout_s`` has passed (``0``: one attempt,
    ``None``: no limit). Errors from the store propagate at once.
    """
    deadline = None if timeout_s is None else clock.monotonic() + timeout_s
    vanished = False
    granted = False
    try:
        # Subscribed before the first attempt, so a release right after a denial still wakes.
        async with KeyWaiter(
            provider, key, poll_s=poll_s, max_poll_s=max_poll_s, clock=clock
        ) as waiter:
            while True:
                start = clock.monotonic()
                try:
                    result = await provider.acquire_lease(key, owner, ttl_ms)
                except LeaseBackendTimeout:
                    undo_grant(provider, key, owner)  # it may have landed: as if cancelled
                    raise
                except asyncio.CancelledError:
                    if not supports(_hooks.unwrap(provider), SupportsUndoGrant):
                        undo_grant(provider, key, owner)  # else the provider undoes it
                    raise
                if result.acquired:
                    granted = True
                    return result, start
                if result.owner is None and not vanished:
                    # The holder expired between the check and the answer: the key is
                    # free now, so ask again at once (once: a store that keeps saying
                    # this is broken).
                    vanished = True
                    continue
                vanished = False
                if deadline is not None and clock.monotonic() >= deadline:
                    return result, start
                await waiter.pause(deadline)
    except BaseException:
        if granted:  # cancelled while unsubscribing: the caller never hears of the grant
            undo_grant(provider, key, owner)
        raise


def undo_grant(provider: LeaseProvider, key: str, owner: str) -> None:
    """Release, in the background, a grant of ``key`` to ``owner`` nobody will use.

    Through the provider's own ``undo_grant`` (:class:`leasekit.backend.SupportsUndoGrant`,
    which every toolkit backend has: exact, and ordered before its next grant of the same
    key and owner); on any other provider, a ``release_lease`` in a task of its own,
    bounded by the provider's ``timeout_s``.
    """
    target: Any = _hooks.unwrap(provider)
    if supports(target, SupportsUndoGrant):
        target.undo_grant(key, owner)
        return
    task = asyncio.get_running_loop().create_task(
        _release_quietly(provider, key, owner, _timeout_of(provider))
    )
    _undoing.add(task)
    task.add_done_callback(_undoing.discard)


async def _release_quietly(provider: LeaseProvider, key: str, owner: str, bound_s: float) -> None:
    try:
        await asyncio.wait_for(provider.release_lease(key, owner), bound_s)
    except (LeaseError, asyncio.TimeoutError) as exc:
        _log.warning(
            "releasing a grant of %r to %r nobody learned of failed (%r); it expires after its TTL",
            key,
            owner,
            exc,
        )


def _timeout_of(provider: LeaseProvider) -> float:
    """The provider's ``timeout_s`` (what bounds each of its calls), else a default."""
    timeout_s = getattr(_hooks.unwrap(provider), "timeout_s", None)
    if isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool) and timeout_s > 0:
        return float(timeout_s)
    return _DEFAULT_TIMEOUT_S


async def _uninterrupted(leaving: asyncio.Task[None], bound_s: float, clock: Clock) -> None:
    """Wait for ``leaving`` even if cancelled meanwhile (then re-raise), at most ``bound_s``.

    The bound runs on the hold's ``clock``: with a fake clock, nothing waits in real time.
    """

    def give_up() -> None:
        if not leaving.done():
            leaving.cancel()  # bounded: what is left of the release is given up
            leaving.add_done_callback(_retrieve)

    bound = clock.call_at(clock.monotonic() + bound_s, give_up)
    cancelled: asyncio.CancelledError | None = None
    try:
        while not leaving.done():
            try:
                await asyncio.wait((leaving,))
            except asyncio.CancelledError as exc:  # noqa: PERF203 (rare: a cancel while leaving)
                cancelled = exc  # delivered once leaving is done
    finally:
        bound.cancel()
    if cancelled is not None:
        if not leaving.cancelled():
            leaving.exception()  # retrieved: the cancellation is what the caller asked for
        raise cancelled
    if not leaving.cancelled():
        leaving.result()


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # a release given up on: the lease expires after its TTL


async def wait_for(
    provider: LeaseProvider,
    key: str,
    owner: str,
    ttl_ms: int,
    timeout_s: float | None,
    *,
    poll_s: float = _DEFAULT_POLL_S,
    max_poll_s: float = _DEFAULT_MAX_POLL_S,
    clock: Clock | None = None,
) -> LeaseResult:
    """Acquire ``key`` for ``owner``, polling until it is free or ``timeout_s`` has passed.

    Returns the successful :class:`LeaseResult` (with its fencing token). Polls start
    ``poll_s`` apart and double up to ``max_poll_s``, each randomly shortened by up to
    half so waiters spread out; the last attempt falls on the deadline. ``timeout_s=0``
    makes one attempt; ``None`` waits without limit.

    On timeout raises :class:`LeaseHeld` naming the holder at the last attempt (the
    same error :func:`hold` raises, so one ``except LeaseHeld`` routes work to the
    holder either way). A :class:`LeaseBackendError` from the store propagates at once.
    ``clock`` (default: the real monotonic clock) paces the polls and the timeout, as
    ``leasekit.testing.FakeClock`` does in tests.
    """
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    limit = _check_wait_s(timeout_s, "timeout_s")
    first = _check_poll_s(poll_s, "poll_s")
    cap = _check_poll_s(max_poll_s, "max_poll_s")
    ops = _hooks.HookedLeaseProvider(_hooks.unwrap(provider), _hooks.backend_name(provider))
    result, _ = await _acquire_polling(
        ops,
        key,
        owner,
        ttl_ms,
        timeout_s=limit,
        poll_s=first,
        max_poll_s=max(first, cap),
        clock=REAL_CLOCK if clock is None else clock,
    )
    if not result.acquired:
        raise LeaseHeld(key=key, holder=result.owner)
    return result


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _default_safety_margin_ms(ttl_ms: int, renew_every_ms: int) -> int:
    # A tenth of the TTL covers clock-rate drift between host and store (specified at
    # a few hundred ppm, so far below a tenth) and the time the news takes to reach
    # the body on a busy loop; 20 ms is a floor for short TTLs, where one slow loop
    # turn is already a large part of the margin. Never more than half of what lies
    # between a renewal and the TTL, so a renewal always has time to happen.
    return min(max(ttl_ms // 10, 20), (ttl_ms - renew_every_ms) // 2)


class LeaseHold:
    """A lease held by :func:`hold`: acquired on ``async with``, renewed in the background.

    Attributes: ``key``, ``owner``, ``ttl_ms``, ``renew_every_ms``,
    ``safety_margin_ms``, ``on_lost``; ``token``, the fencing token of the grant
    (``None`` without fencing); ``lost``, an :class:`asyncio.Event` set when the lease
    is lost; ``lost_reason`` (``"renew_refused"``, ``"expired"``,
    ``"transfer_refused"``, ``"transfer_unknown"`` or ``"error"``); ``transferred_to``,
    the owner it was handed to by :meth:`transfer_to`; :attr:`valid_until` and
    :meth:`remaining`, the holder's deadline on the monotonic clock.
    """

    def __init__(
        self,
        provider: LeaseProvider,
        key: str,
        owner: str,
        ttl_ms: int,
        *,
        renew_every_ms: int | None = None,
        safety_margin_ms: int | None = None,
        on_lost: OnLost = "cancel",
        wait_s: float | None = 0.0,
        clock: Clock | None = None,
    ) -> None:
        self.key = validate_key(key)
        self.owner = validate_owner(owner)
        self.ttl_ms = validate_ttl_ms(ttl_ms)
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
        self.renew_every_ms = renew_every_ms
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
        self.safety_margin_ms = safety_margin_ms
        checked: object = on_lost
        if checked not in ("cancel", "flag"):
            raise InvalidLeaseArgument.for_argument(
                "on_lost", f"must be 'cancel' or 'flag', got {on_lost!r}"
            )
        self.on_lost = on_lost
        self._wait_s = _check_wait_s(wait_s, "wait_s")
        self._clock: Clock = REAL_CLOCK if clock is None else clock
        # Operations go through the emitting wrapper whether or not plugins exist now
        # (it costs two clock reads per operation, nothing for a hold); an emitting
        # provider from connect() is unwrapped so each event is emitted once.
        self._ops = _hooks.HookedLeaseProvider(
            _hooks.unwrap(provider),
            _hooks.backend_name(provider),
        )
        # Renewals go out in batches with other holds' on a backend that can renew many
        # leases at once; each is then submitted up to this lead *before* it is due, so
        # that renewals falling due close together share a call (see _renewals).
        self._batched = callable(getattr(self._ops.wrapped, "renew_leases", None))
        self._lead_s = min(renew_every_ms / 20_000, _MAX_LEAD_S) if self._batched else 0.0
        self.token: int | None = None
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None
        self.transferred_to: str | None = None
        self._entered = False
        self._exiting = False
        self._renewed_at = 0.0  # clock time at the start of the last successful grant or renewal
        self._valid_until = -math.inf  # when the holder stops believing; see valid_until
        self._deadline_timer: TimerHandle | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._renewing = False  # cleared to stop the renewer (with a cancel)
        self._transfer: asyncio.Future[None] | None = None  # set while transfer_to() waits
        self._transfer_op: asyncio.Task[bool] | None = None
        # A loss during transfer_to() cancels the body (on_lost="cancel") unless the body
        # is the caller, which hears of it as transfer_to()'s LeaseLost.
        self._cancel_on_transfer_loss = False
        self._body: asyncio.Task[object] | None = None
        self._cancelled_body = False
        self._cancelling_at_entry = 0  # the body task's cancellation count (3.11+)
        self._lost_cause: BaseException | None = None
        self._lost_callbacks: list[Callable[[], object]] = []

    @property
    def backend(self) -> str:
        """The backend name events carry (the URL scheme for providers from connect())."""
        return self._ops.backend

    @property
    def valid_until(self) -> float:
        """The moment, on the hold's clock (:func:`time.monotonic` by default), the holder
        stops believing it holds the lease: the start of the last successful acquire or
        renewal + ``ttl_ms`` - ``safety_margin_ms``.

        The store started the TTL no earlier than that call did, so this lies at least
        the margin before the earliest moment the store can give the key to someone
        else. Once the lease is lost or handed on it is the moment that happened (in
        the past); before the block is entered, ``-inf``.
        """
        return self._valid_until

    def remaining(self) -> float:
        """Seconds until :attr:`valid_until`, ``0.0`` once it passed or the lease is gone.

        Check it before a side effect that must not happen without the lease (and pass
        ``token`` along to a store that can refuse stale writers; see docs/hold.md).
        """
        return max(0.0, self._valid_until - self._clock.monotonic())

    async def __aenter__(self) -> LeaseHold:
        if self._entered:
            raise RuntimeError("a LeaseHold is entered once; call leasekit.hold() again")
        self._entered = True
        result, start = await _acquire_polling(
            self._ops,
            self.key,
            self.owner,
            self.ttl_ms,
            timeout_s=self._wait_s,
            poll_s=_DEFAULT_POLL_S,
            max_poll_s=_DEFAULT_MAX_POLL_S,
            clock=self._clock,
        )
        if not result.acquired:
            raise LeaseHeld(key=self.key, holder=result.owner)
        self.token = result.token
        self._body = body = asyncio.current_task()
        if sys.version_info >= (3, 11) and body is not None:
            # Nonzero if the hold runs in cleanup code of a task already being cancelled.
            self._cancelling_at_entry = body.cancelling()
        self._believe_from(start)
        self._start_renewer()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exiting = True  # from here on, a loss no longer cancels the body
        external_cancel = self._take_back_cancel()
        # Leaving runs to its end even if the task is cancelled meanwhile (that
        # cancellation is raised afterwards): a release cut off half way would leave the
        # key held for its whole TTL. Stopping the renewer and releasing are each
        # bounded by the provider's timeout_s.
        leaving = asyncio.get_running_loop().create_task(self._leave(exc, external_cancel))
        await _uninterrupted(leaving, 2 * _timeout_of(self._ops) + 1.0, self._clock)

    async def _leave(self, exc: BaseException | None, external_cancel: bool) -> None:
        await self._stop_renewer()
        self._disarm_deadline()
        await self._settle_transfer_op()
        if self._cancelled_body:
            if external_cancel:
                return  # someone else cancelled the task too: that cancellation wins
            if exc is None or isinstance(exc, asyncio.CancelledError):
                raise LeaseLost(
                    key=self.key, owner=self.owner, reason=self.lost_reason
                ) from self._lost_cause
            return  # the body's own error says more; .lost tells the rest
        if self.lost.is_set() or self.transferred_to is not None:
            return  # nothing of ours to release
        self._valid_until = min(self._valid_until, self._clock.monotonic())
        try:
            await self._ops.release_lease(self.key, self.owner)
        except Exception:
            if exc is not None:
                # Keep the body's error; the lease expires by itself. The failed event
                # went to plugins; without any, say it here.
                if _hooks.relay() is None:
                    _log.warning(
                        "releasing lease on %r held by %r failed; it expires after its TTL",
                        self.key,
                        self.owner,
                        exc_info=True,
                    )
                return
            raise

    def _take_back_cancel(self) -> bool:
        """Undo our own cancel() of the body; True if another cancellation is pending too."""
        body = self._body
        if not self._cancelled_body or body is None:
            return False
        if sys.version_info >= (3, 11):
            # uncancel() keeps the task's cancellation count exact for enclosing
            # asyncio.timeout() and TaskGroup; a count left above the one at entry is
            # someone else's (the same bookkeeping asyncio.timeout does).
            return body.uncancel() > self._cancelling_at_entry
        # 3.10 cannot tell cancellations apart: a loss and a cancel arriving together
        # surface as LeaseLost.
        return False  # pragma: no cover (3.10 only)

    # -- the deadline ----------------------------------------------------------------------

    def _believe_from(self, start: float) -> None:
        """A grant or renewal that began at ``start`` succeeded: move the deadline on."""
        self._renewed_at = start
        self._valid_until = start + (self.ttl_ms - self.safety_margin_ms) / 1000
        # One timer: at the deadline its single callback sets .lost and cancels the
        # body, so the news costs one loop turn however busy the loop is, and does not
        # wait for the renewer to be scheduled. A timer already armed (for an earlier
        # deadline) stays: when it fires it finds the deadline moved on and follows it,
        # so a hold costs one timer per TTL rather than one per renewal, which is what
        # keeps 10,000 holds cheap (asyncio keeps cancelled timers in its heap).
        if self._deadline_timer is None:
            self._deadline_timer = self._clock.call_at(self._valid_until, self._on_deadline)

    def _disarm_deadline(self) -> None:
        timer, self._deadline_timer = self._deadline_timer, None
        if timer is not None:
            timer.cancel()

    def _on_deadline(self) -> None:
        self._deadline_timer = None
        if self.lost.is_set() or self.transferred_to is not None or self._exiting:
            return
        if self._clock.monotonic() < self._valid_until:
            # Renewed since this timer was armed: follow the deadline.
            self._deadline_timer = self._clock.call_at(self._valid_until, self._on_deadline)
            return
        transfer = self._transfer
        if transfer is not None:
            # transfer_to() is waiting for an answer that has not come: whether the
            # key moved is unknown, so this holder must assume it did.
            self._declare_lost(
                "transfer_unknown", self._lost_cause, cancel=self._cancel_on_transfer_loss
            )
            if not transfer.done():
                transfer.set_exception(self._lost_error())
        else:
            self._declare_lost("expired", self._lost_cause)
        renewer = self._renewer
        if renewer is not None:
            renewer.cancel()  # a renewal still in flight is cut off here, too

    def _lost_error(self) -> LeaseLost:
        error = LeaseLost(key=self.key, owner=self.owner, reason=self.lost_reason)
        error.__cause__ = self._lost_cause
        return error

    # -- the renewer -----------------------------------------------------------------------

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
        self._lost_cause = None
        self._believe_from(start)

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

    # -- loss ------------------------------------------------------------------------------

    def _declare_lost(
        self, reason: str, cause: BaseException | None, *, cancel: bool = True
    ) -> None:
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self._lost_cause = cause
        self._valid_until = min(self._valid_until, self._clock.monotonic())
        self._disarm_deadline()
        self.lost.set()
        for callback in self._lost_callbacks:
            callback()
        body = self._body
        wanted = cancel and self.on_lost == "cancel" and not self._exiting
        if wanted and body is not None and not body.done():
            self._cancelled_body = True
            body.cancel(f"leasekit: lease on {self.key!r} was lost ({reason})")
        # Reported after the body was told: the news comes first.
        if reason not in ("renew_refused", "transfer_refused"):
            # Refusals were already reported by the operation that was refused.
            _hooks.emit(
                "leasekit_lost",
                key=self.key,
                owner=self.owner,
                backend=self.backend,
                reason=reason,
                latency_s=None,
            )
        if _hooks.relay() is None:
            _log.warning(
                "lease on %r held by %r was lost (%s)%s",
                self.key,
                self.owner,
                reason,
                "; cancelling the body" if wanted else "",
            )

    def _add_lost_callback(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` on the event loop when the lease is lost (for leasekit.sync)."""
        self._lost_callbacks.append(callback)

    # -- handing over ----------------------------------------------------------------------

    async def transfer_to(self, next_owner: str, ttl_ms: int | None = None) -> None:
        """Hand the lease to ``next_owner`` (atomically where the backend declares it).

        Renewal stops first; after a successful transfer this holder no longer owns the
        key and leaving the ``async with`` does not release it. ``ttl_ms`` defaults to
        this hold's TTL. The new owner learns its fencing token by acquiring (an
        idempotent re-acquire for it).

        Bounded by :attr:`valid_until`: a store that has not answered by then is cut
        off. Raises :class:`LeaseLost` (with ``.lost`` already set) if this holder no
        longer held the lease (``"transfer_refused"``), or if the outcome is unknown
        (``"transfer_unknown"``: cut off at the deadline, a timeout, or any store error
        after which the key may have moved; the store's error is the ``__cause__``).
        Only an error that proves nothing was sent (:class:`LeaseBackendUnreachable`,
        :class:`LeaseProviderClosed`) propagates as itself, and renewal resumes. Called
        from a task other than the body, a loss here also cancels the body (with
        ``on_lost="cancel"``), as any other loss does.
        """
        validate_owner(next_owner, "next_owner")
        ttl_ms = self.ttl_ms if ttl_ms is None else validate_ttl_ms(ttl_ms)
        if next_owner == self.owner:
            raise InvalidLeaseArgument.for_argument(
                "next_owner", "must differ from the holder (to extend the lease, just keep it)"
            )
        if not self._entered or self._exiting or self._body is None:
            raise RuntimeError("transfer_to() is called inside the hold's async with block")
        if self.transferred_to is not None:
            raise RuntimeError(f"the lease was already transferred to {self.transferred_to!r}")
        if not self.lost.is_set() and self._clock.monotonic() >= self._valid_until:
            self._on_deadline()  # due, but the loop has not run the timer yet
        if self.lost.is_set():
            raise self._lost_error()
        await self._stop_renewer()
        if self.lost.is_set():
            raise self._lost_error()  # the deadline passed while the renewer stopped
        cancel = self._cancel_on_transfer_loss = asyncio.current_task() is not self._body
        waiter = self._transfer = asyncio.get_running_loop().create_future()
        op = self._transfer_op = asyncio.ensure_future(
            self._ops.transfer_lease(self.key, self.owner, next_owner, ttl_ms)
        )
        op.add_done_callback(lambda _: _resolve(waiter))
        try:
            # Resolved by the answer or, at the deadline, by the timer with LeaseLost.
            await waiter
        except BaseException:
            op.cancel()
            # Cancelled from outside mid-flight: the key may have moved.
            self._declare_lost("transfer_unknown", None, cancel=cancel)
            raise
        finally:
            self._transfer = None
        self._transfer_op = None
        try:
            handed = op.result()
        except (LeaseBackendUnreachable, LeaseProviderClosed):
            self._start_renewer()  # nothing reached the store: we still hold it
            raise
        except Exception as exc:
            self._declare_lost("transfer_unknown", exc, cancel=cancel)
            raise self._lost_error() from exc
        if not handed:
            self._declare_lost("transfer_refused", None, cancel=cancel)
            raise self._lost_error()
        self.transferred_to = next_owner
        self._valid_until = min(self._valid_until, self._clock.monotonic())
        self._disarm_deadline()

    async def _settle_transfer_op(self) -> None:
        op, self._transfer_op = self._transfer_op, None
        if op is not None and not op.done():
            op.cancel()
            await asyncio.wait([op])
        if op is not None and not op.cancelled():
            op.exception()  # retrieved: transfer_to() reported the outcome

    def __repr__(self) -> str:
        if self.transferred_to is not None:
            state = f"transferred to {self.transferred_to!r}"
        elif self.lost.is_set():
            state = f"lost ({self.lost_reason})"
        elif self._renewer is not None:
            state = "held"
        else:
            state = "not held"
        return f"<LeaseHold {self.key!r} owner={self.owner!r} {state}>"


def hold(
    provider: LeaseProvider,
    key: str,
    owner: str,
    ttl_ms: int,
    *,
    renew_every_ms: int | None = None,
    safety_margin_ms: int | None = None,
    on_lost: OnLost = "cancel",
    wait_s: float | None = 0.0,
    clock: Clock | None = None,
) -> LeaseHold:
    """Hold ``key`` for ``owner`` for the duration of an ``async with`` block.

    ::

        async with leasekit.hold(provider, "thread-42", owner, ttl_ms=30_000) as lease:
            await work(fencing_token=lease.token)

    Entering acquires (raising :class:`LeaseHeld`, carrying the holder, if someone
    else holds it; with ``wait_s`` it first polls that long, ``None`` without limit).
    A background task renews every ``renew_every_ms`` (default ``ttl_ms // 3``).
    Leaving releases, unless the lease was handed on with :meth:`LeaseHold.transfer_to`
    or lost.

    The holder believes it holds the lease until :attr:`LeaseHold.valid_until`: the
    start of the last successful acquire or renewal + ``ttl_ms`` - ``safety_margin_ms``
    (default a tenth of the TTL, at least 20 ms, at most half of ``ttl_ms -
    renew_every_ms``; ``renew_every_ms + safety_margin_ms`` must be less than
    ``ttl_ms``). The lease is *lost* when a renewal is refused, or when renewals keep
    failing until that deadline (failures are retried with backoff meanwhile and
    reported as ``leasekit_failed`` events, or logged when no plugin is registered).
    Then ``.lost`` is set, and with ``on_lost="cancel"`` (the default) the body is
    cancelled in the same loop callback and :class:`LeaseLost` raised out of the
    ``async with``; with ``on_lost="flag"`` the body runs on and should check
    ``.lost`` or :meth:`LeaseHold.remaining`. A ``leasekit_lost`` event follows.

    Cancelling the body or its task stops renewal and releases the lease; a cancel
    that arrives while leaving waits for the release (bounded by the provider's
    ``timeout_s``) and is raised after it. A cancel while entering leaves nothing held:
    a grant that landed anyway, or an acquire that timed out, is undone in the
    background. No renewal task outlives the block.
    ``clock`` (default: the real monotonic clock) drives renewals and the deadline,
    as ``leasekit.testing.FakeClock`` does in tests. Arguments are validated here,
    before any I/O.
    """
    return LeaseHold(
        provider,
        key,
        owner,
        ttl_ms,
        renew_every_ms=renew_every_ms,
        safety_margin_ms=safety_margin_ms,
        on_lost=on_lost,
        wait_s=wait_s,
        clock=clock,
    )
