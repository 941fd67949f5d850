"""Above the contract: hold(), the state machine of a held lease (deadline, loss, handover).

Waiting for the key (``wait_s``) is :mod:`leasekit._waiting`'s, the renew loop
:mod:`leasekit._renewer`'s. Everything here is built from the five contract operations,
so it works on every backend. Time on this side is the holder's monotonic clock, used
only to decide when the holder must *stop believing* it holds a lease; the store's clock
still decides expiry.

One module, over 500 lines: the held lease's states (entering, held, lost, handed on,
left) and the hold() that documents them are read together; the waiting and the renew
loop already live apart.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Literal

from . import _hooks
from ._clock import REAL_CLOCK, Clock, TimerHandle
from ._contract import (
    LeaseProvider,
    metadata_for,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)
from ._errors import (
    InvalidLeaseArgument,
    LeaseBackendUnreachable,
    LeaseHeld,
    LeaseLost,
    LeaseProviderClosed,
)
from ._leaving import timeout_of, uninterrupted
from ._renewer import Renewing, schedule
from ._waiting import (
    DEFAULT_MAX_POLL_S,
    DEFAULT_POLL_S,
    acquire_polling,
    check_fair,
    check_wait_s,
)

__all__ = ["LeaseHold", "OnLost", "hold"]

OnLost = Literal["cancel", "flag"]
"""What :func:`hold` does when the lease is lost: cancel the body, or only set ``.lost``."""

# Reports renewal failures and losses when no event plugin is registered: they are
# never silent. With plugins registered, the events go to them instead (the logging
# plugin writes them to this same logger), so nothing is reported twice.
_log = logging.getLogger("leasekit")


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class LeaseHold(Renewing):
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
        poll_s: float = DEFAULT_POLL_S,
        max_poll_s: float = DEFAULT_MAX_POLL_S,
        metadata: bytes | str | None = None,
        fair: bool = False,
    ) -> None:
        self.key = validate_key(key)
        self.owner = validate_owner(owner)
        self.ttl_ms = validate_ttl_ms(ttl_ms)
        self.metadata = metadata_for(_hooks.unwrap(provider), metadata)
        """The metadata stored with this holder's grant (as ``bytes``), or ``None``."""
        self.renew_every_ms, self.safety_margin_ms = schedule(
            ttl_ms, renew_every_ms, safety_margin_ms
        )
        checked: object = on_lost
        if checked not in ("cancel", "flag"):
            raise InvalidLeaseArgument.for_argument(
                "on_lost", f"must be 'cancel' or 'flag', got {on_lost!r}"
            )
        self.on_lost = on_lost
        self._wait_s = check_wait_s(wait_s, "wait_s")
        self._fair = check_fair(provider, fair)
        # How a wait polls where the store does not notify (leasekit.Lock passes its sleep).
        self._poll_s = poll_s
        self._max_poll_s = max(poll_s, max_poll_s)
        self._clock: Clock = REAL_CLOCK if clock is None else clock
        # Operations go through the emitting wrapper whether or not plugins exist now
        # (it costs two clock reads per operation, nothing for a hold); an emitting
        # provider from connect() is unwrapped so each event is emitted once.
        self._ops = _hooks.HookedLeaseProvider(
            _hooks.unwrap(provider),
            _hooks.backend_name(provider),
        )
        self._plan_renewals()
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
        result, start = await acquire_polling(
            self._ops,
            self.key,
            self.owner,
            self.ttl_ms,
            timeout_s=self._wait_s,
            poll_s=self._poll_s,
            max_poll_s=self._max_poll_s,
            clock=self._clock,
            metadata=self.metadata,
            fair=self._fair,
        )
        if not result.acquired:
            raise LeaseHeld(key=self.key, holder=result.owner, metadata=result.metadata)
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
        await uninterrupted(leaving, 2 * timeout_of(self._ops) + 1.0, self._clock)

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

    async def transfer_to(
        self,
        next_owner: str,
        ttl_ms: int | None = None,
        *,
        metadata: bytes | str | None = None,
    ) -> None:
        """Hand the lease to ``next_owner`` (atomically where the backend declares it).

        Renewal stops first; after a successful transfer this holder no longer owns the
        key and leaving the ``async with`` does not release it. ``ttl_ms`` defaults to
        this hold's TTL. ``metadata`` replaces this holder's (``None`` clears it): the
        successor's address, on backends with ``Capabilities.metadata``. The new owner
        learns its fencing token by acquiring (an idempotent re-acquire for it, passing
        the same metadata).

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
        data = metadata_for(self._ops.wrapped, metadata)
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
            self._ops.transfer_lease(self.key, self.owner, next_owner, ttl_ms, metadata=data)
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
    metadata: bytes | str | None = None,
    fair: bool = False,
) -> LeaseHold:
    """Hold ``key`` for ``owner`` for the duration of an ``async with`` block.

    ::

        async with leasekit.hold(provider, "thread-42", owner, ttl_ms=30_000) as lease:
            await work(fencing_token=lease.token)

    Entering acquires (raising :class:`LeaseHeld`, carrying the holder, if someone
    else holds it; with ``wait_s`` it first waits that long as :func:`wait_for` does,
    woken by release notifications where the store has them, ``None`` without limit).
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
    as ``leasekit.testing.FakeClock`` does in tests. ``metadata`` (bytes or str, at
    most :data:`~leasekit.MAX_METADATA_BYTES`) is stored with the grant where the
    backend declares ``Capabilities.metadata`` (else :class:`BackendLacksCapability`):
    where to route work for ``key``, read by others from a denied acquire,
    :attr:`LeaseHeld.metadata` or ``get_lease_record``. ``fair=True`` waits in the
    store's line, served in arrival order (``Capabilities.fair_waiting``; see
    :func:`wait_for`). Arguments are validated here, before any I/O.
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
        metadata=metadata,
        fair=fair,
    )
