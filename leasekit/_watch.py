"""Waiting without polling: wake-ups on release, watching the owner, leader election.

:class:`KeyWaiter` is how everything here (and :func:`leasekit.wait_for`,
``hold(wait_s=...)``) waits for a key to change. On a backend that declares
``release_notifications`` it subscribes before the first look at the key, then sleeps
until a hint arrives or until the holder's lease would run out (read from the store
where the backend offers ``lease_remaining_ms``), so a released key is retried within
a round trip and a dead holder's key at its expiry. Elsewhere it polls with jittered
exponential backoff, as before. A hint is never a grant: the caller always asks again.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncGenerator
from types import TracebackType
from typing import Any

from . import _hooks
from ._capabilities import capabilities_of
from ._clock import REAL_CLOCK, Clock
from ._contract import LeaseProvider, validate_key, validate_owner, validate_ttl_ms
from ._errors import InvalidLeaseArgument, LeaseBackendError
from .backend._notify import ReleaseWatch, SupportsRemaining
from .backend._records import supports

__all__ = ["KeyWaiter", "elect", "leaders", "watch_owner"]

_log = logging.getLogger("leasekit")

_DEFAULT_POLL_S = 0.05
_DEFAULT_MAX_POLL_S = 1.0
# After the holder's remaining time, look again a little later than the store's
# expiry: the store's clock decides, and a look a hair early is wasted.
_EXPIRY_SLACK_S = 0.002
# With notifications, look again at least this often anyway: a channel that died
# without anyone noticing must not leave a waiter asleep for a whole long TTL.
_SAFETY_S = 5.0
# Shorter polling pauses are not worth a request to learn the holder's remaining time.
_REMAINING_WORTH_S = 0.1


class KeyWaiter:
    """Waits between looks at one key: notifications where offered, else backoff polling.

    Use as ``async with KeyWaiter(provider, key) as waiter:`` around the loop, and
    ``await waiter.pause(deadline)`` between attempts (``deadline`` on ``clock``,
    :func:`time.monotonic` by default, or ``None``). The subscription starts at the first pause,
    so an acquire that succeeds at once costs nothing extra; that first pause returns
    at once (the caller looks again, now subscribed, so no release is missed).
    :attr:`notified` says whether the backend's channel is in use.
    """

    def __init__(
        self,
        provider: object,
        key: str,
        *,
        poll_s: float = _DEFAULT_POLL_S,
        max_poll_s: float = _DEFAULT_MAX_POLL_S,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self._provider = _hooks.unwrap(provider)
        self._clock = clock
        self.key = key
        self._first = poll_s
        self._delay = poll_s
        self._cap = max(poll_s, max_poll_s)
        self._watch: ReleaseWatch | None = None
        self._subscribed = False
        self._remaining = supports(self._provider, SupportsRemaining)

    @property
    def notified(self) -> bool:
        return self._watch is not None

    async def __aenter__(self) -> KeyWaiter:
        return self

    async def _subscribe(self) -> bool:
        """Start watching, once; True if this call did (the caller should look again)."""
        if self._subscribed:
            return False
        self._subscribed = True
        provider: Any = self._provider
        if capabilities_of(provider).release_notifications and callable(
            getattr(provider, "watch_release", None)
        ):
            try:
                self._watch = await provider.watch_release(self.key)
            except LeaseBackendError as exc:
                # No channel for this wait (the server refused the subscription, e.g. an
                # ACL user without pub/sub rights, or it could not be opened): poll, as
                # without notifications. The acquires still report a store that is down.
                _log.debug("release notifications unavailable for this wait (%s)", exc)
                return False
            return True
        return False

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def reset(self) -> None:
        """Start the backoff over (the key changed hands: look again soon)."""
        self._delay = self._first

    async def pause(self, deadline: float | None, *, held: bool = True) -> bool:
        """Wait until the key may have changed, or ``deadline``; True if a hint woke us.

        ``held=False`` (the key was free at the last look) waits a polling step even
        with notifications, since a new grant sends no hint.
        """
        if await self._subscribe():
            return True
        left = None if deadline is None else max(deadline - self._clock.monotonic(), 0.0)
        if self._watch is not None and held:
            limit = _SAFETY_S
            if self._remaining:
                remaining_ms = await self._provider.lease_remaining_ms(self.key)
                if remaining_ms is None:
                    return True  # free already: look again at once
                limit = min(remaining_ms / 1000 + _EXPIRY_SLACK_S, _SAFETY_S)
            return await self._hint(limit if left is None else min(limit, left))
        # Jittered, so waiters that were denied together do not all retry together.
        pause = self._delay * random.uniform(0.5, 1.0)
        self._delay = min(self._delay * 2, self._cap)
        if held and self._remaining and pause > _REMAINING_WORTH_S:
            # Without notifications, still never sleep past a (possibly dead) holder's
            # expiry: its key is taken then, not at the next poll.
            remaining_ms = await self._provider.lease_remaining_ms(self.key)
            if remaining_ms is None:
                return False
            pause = min(pause, remaining_ms / 1000 + _EXPIRY_SLACK_S)
        if left is not None:
            pause = min(pause, left)  # the last attempt falls on the deadline
        if self._watch is not None:
            return await self._hint(pause)
        await self._clock.sleep(pause)
        return False

    async def _hint(self, timeout_s: float) -> bool:
        """The watch's hint, or ``timeout_s`` on the clock: True if a hint came."""
        watch = self._watch
        assert watch is not None
        if self._clock is REAL_CLOCK:
            return await watch.wait(timeout_s)
        # Another clock (a test's fake one) decides the timeout: race the two.
        hint = asyncio.ensure_future(watch.wait(None))
        timer = asyncio.ensure_future(self._clock.sleep(timeout_s))
        try:
            await asyncio.wait([hint, timer], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (hint, timer):
                waiting.cancel()
            await asyncio.wait([hint, timer])
        return hint.done() and not hint.cancelled() and hint.result()


def _check_interval(value: object, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be a number of seconds > 0, got {value!r}", value
        )
    return float(value)


async def watch_owner(
    provider: LeaseProvider, key: str, *, poll_s: float = 0.5, clock: Clock | None = None
) -> AsyncGenerator[str | None, None]:
    """Yield the owner of ``key`` now, then again each time it changes (``None``: free).

    On a backend with ``release_notifications`` a release, transfer or expiry is seen
    within a round trip and a held key costs the store no requests while nobody
    touches it; a free key is looked at every ``poll_s`` (a new grant sends no hint).
    Elsewhere the key is polled every ``poll_s``. Changes quicker than a look may be
    missed (an observer sees states, not every transition). Store errors propagate.
    ``clock`` (default: the real monotonic clock) paces the looks, as
    ``leasekit.testing.FakeClock`` does in tests.
    """
    validate_key(key)
    interval = _check_interval(poll_s, "poll_s")
    unset: Any = object()
    last: str | None = unset
    async with KeyWaiter(
        provider,
        key,
        poll_s=interval,
        max_poll_s=interval,
        clock=REAL_CLOCK if clock is None else clock,
    ) as waiter:
        while True:
            owner = await provider.get_lease_owner(key)
            if owner != last:
                last = owner
                yield owner
            waiter.reset()
            await waiter.pause(None, held=owner is not None)


def leaders(
    provider: LeaseProvider, group: str, *, poll_s: float = 0.5, clock: Clock | None = None
) -> AsyncGenerator[str | None, None]:
    """The leader of ``group`` now and at each change, for observers: :func:`watch_owner`."""
    return watch_owner(provider, group, poll_s=poll_s, clock=clock)


def elect(
    provider: LeaseProvider,
    group: str,
    candidate: str,
    ttl_ms: int,
    *,
    timeout_s: float | None = None,
    **hold_options: Any,
) -> Any:
    """Campaign for leadership of ``group``; an async context manager holding it.

    ``async with leasekit.elect(provider, "scheduler", me, ttl_ms=10_000) as term:``
    waits (woken by release notifications where the backend has them) until
    ``candidate`` holds the group's lease, or ``timeout_s`` passes
    (:class:`~leasekit.LeaseHeld`). Inside, leadership is a :func:`leasekit.hold`:
    renewed in the background, the body cancelled (or ``term.lost`` set, with
    ``on_lost="flag"``) before anyone else can be elected, resigned on exit or handed
    on with ``term.transfer_to(successor)``. Other ``hold_options`` pass through.
    """
    from ._hold import hold  # noqa: PLC0415 (hold builds on this module's waiter)

    validate_key(group, "group")
    validate_owner(candidate, "candidate")
    validate_ttl_ms(ttl_ms)
    return hold(provider, group, candidate, ttl_ms, wait_s=timeout_s, **hold_options)
