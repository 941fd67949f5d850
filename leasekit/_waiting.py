"""Waiting for a key: :class:`KeyWaiter`, :func:`wait_for`, and the polling defaults.

:class:`KeyWaiter` is how everything that waits for a key to change
(:func:`leasekit.wait_for`, ``hold(wait_s=...)``, :func:`leasekit.watch_owner`,
:func:`leasekit.elect`) waits. On a backend that declares ``release_notifications`` it
subscribes before the first look at the key, then sleeps until a hint arrives or until
the holder's lease would run out (read from the store where the backend offers
``lease_remaining_ms``), so a released key is retried within a round trip and a dead
holder's key at its expiry. Elsewhere it polls with jittered exponential backoff. A hint
is never a grant: the caller always asks again. The polling defaults are defined here,
once, for the async API and :mod:`leasekit.sync` alike.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from types import TracebackType
from typing import Any

from . import _hooks
from ._capabilities import capabilities_of
from ._clock import REAL_CLOCK, Clock
from ._contract import (
    LeaseProvider,
    LeaseResult,
    metadata_for,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)
from ._errors import (
    BackendLacksCapability,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseHeld,
)
from ._leaving import undo_grant
from .backend._fair import FAIR_PLACE_TTL_MS, SupportsFairWaiting
from .backend._notify import ReleaseWatch, SupportsRemaining
from .backend._records import supports
from .backend._undo import SupportsUndoGrant

__all__ = [
    "DEFAULT_MAX_POLL_S",
    "DEFAULT_POLL_S",
    "KeyWaiter",
    "acquire_polling",
    "check_fair",
    "check_interval",
    "check_poll_s",
    "check_wait_s",
    "wait_for",
]

_log = logging.getLogger("leasekit")

# The first pause between looks, and the most it doubles to: for every waiter here,
# hold(wait_s=...) and leasekit.sync alike (watch_owner() takes its own poll_s).
DEFAULT_POLL_S = 0.05
DEFAULT_MAX_POLL_S = 1.0
# After the holder's remaining time, look again a little later than the store's
# expiry: the store's clock decides, and a look a hair early is wasted.
_EXPIRY_SLACK_S = 0.002
# With notifications, look again at least this often anyway: a channel that died
# without anyone noticing must not leave a waiter asleep for a whole long TTL.
_SAFETY_S = 5.0
# A fair waiter tries again at least this often, keeping its place in line alive.
_PLACE_REFRESH_S = FAIR_PLACE_TTL_MS / 3000
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
        poll_s: float = DEFAULT_POLL_S,
        max_poll_s: float = DEFAULT_MAX_POLL_S,
        clock: Clock = REAL_CLOCK,
        grants: bool = False,
    ) -> None:
        self._provider = _hooks.unwrap(provider)
        # Also woken by grants (an owner watcher), where the backend tells of them.
        self._grants = grants and capabilities_of(self._provider).grant_notifications
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
                if self._grants:
                    self._watch = await provider.watch_release(self.key, grants=True)
                else:
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
        with notifications, since a new grant sends no hint, unless this waiter asked
        for ``grants`` and the backend sends them: then it waits for the hint.
        """
        if await self._subscribe():
            return True
        left = None if deadline is None else max(deadline - self._clock.monotonic(), 0.0)
        if self._watch is not None and (held or self._grants):
            limit = _SAFETY_S
            if held and self._remaining:
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


def check_interval(value: object, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be a number of seconds > 0, got {value!r}", value
        )
    return float(value)


def check_wait_s(value: object, argument: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be a number of seconds or None, got {value!r}"
        )
    if math.isnan(value) or value < 0:
        raise InvalidLeaseArgument.for_argument(argument, f"must be >= 0 seconds, got {value!r}")
    return None if math.isinf(value) else float(value)


def check_poll_s(value: object, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be a number of seconds, got {value!r}"
        )
    if not 0 < value < math.inf:
        raise InvalidLeaseArgument.for_argument(argument, f"must be > 0 seconds, got {value!r}")
    return float(value)


def _waited(provider: object, key: str, owner: str, acquired: bool, wait_s: float) -> None:
    if _hooks.relay() is not None:
        _hooks.emit(
            "leasekit_waited",
            key=key,
            owner=owner,
            backend=_hooks.backend_name(provider),
            acquired=acquired,
            wait_s=wait_s,
        )


async def acquire_polling(
    provider: LeaseProvider,
    key: str,
    owner: str,
    ttl_ms: int,
    *,
    timeout_s: float | None,
    poll_s: float,
    max_poll_s: float,
    clock: Clock = REAL_CLOCK,
    metadata: bytes | None = None,
    fair: bool = False,
) -> tuple[LeaseResult, float]:
    """Acquire, retrying with jittered exponential backoff; (result, start of the winning call).

    Returns the last denied result once ``timeout_s`` has passed (``0``: one attempt,
    ``None``: no limit). Errors from the store propagate at once. ``fair``: each
    attempt is ``acquire_lease_in_turn`` (the store's line of waiters), at least every
    third of :data:`FAIR_PLACE_TTL_MS`, so the caller keeps its place while it waits.
    """
    began = clock.monotonic()
    deadline = None if timeout_s is None else began + timeout_s
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
                    result = await _attempt(provider, key, owner, ttl_ms, metadata, fair=fair)
                except LeaseBackendTimeout:
                    undo_grant(provider, key, owner)  # it may have landed: as if cancelled
                    raise
                except asyncio.CancelledError:
                    if not supports(_hooks.unwrap(provider), SupportsUndoGrant):
                        undo_grant(provider, key, owner)  # else the provider undoes it
                    raise
                if result.acquired:
                    granted = True
                    _waited(provider, key, owner, True, clock.monotonic() - began)
                    return result, start
                if result.owner is None and not vanished and not fair:
                    # The holder expired between the check and the answer: the key is
                    # free now, so ask again at once (once: a store that keeps saying
                    # this is broken).
                    vanished = True
                    continue
                vanished = False
                now = clock.monotonic()
                if deadline is not None and now >= deadline:
                    _waited(provider, key, owner, False, now - began)
                    return result, start
                if fair:  # back before the place in line lapses
                    again = now + _PLACE_REFRESH_S
                    # Free, but not this waiter's turn: the ones ahead are served first,
                    # so wait a polling step (or a hint), not "free: look again now".
                    await waiter.pause(
                        again if deadline is None else min(deadline, again),
                        held=result.owner is not None,
                    )
                else:
                    await waiter.pause(deadline)
    except BaseException:
        if granted:  # cancelled while unsubscribing: the caller never hears of the grant
            undo_grant(provider, key, owner)
        raise


async def wait_for(
    provider: LeaseProvider,
    key: str,
    owner: str,
    ttl_ms: int,
    timeout_s: float | None,
    *,
    poll_s: float = DEFAULT_POLL_S,
    max_poll_s: float = DEFAULT_MAX_POLL_S,
    clock: Clock | None = None,
    metadata: bytes | str | None = None,
    fair: bool = False,
) -> LeaseResult:
    """Acquire ``key`` for ``owner``, waiting until it is free or ``timeout_s`` has passed.

    Returns the successful :class:`LeaseResult` (with its fencing token). Where the
    backend sends release notifications, the waiter sleeps until one arrives or the
    holder's lease would run out, and does not poll. Elsewhere, polls start ``poll_s``
    apart and double up to ``max_poll_s``, each randomly shortened by up to half so
    waiters spread out. The last attempt falls on the deadline. ``timeout_s=0``
    makes one attempt; ``None`` waits without limit.

    On timeout raises :class:`LeaseHeld` naming the holder at the last attempt (the
    same error :func:`hold` raises, so one ``except LeaseHeld`` routes work to the
    holder either way). A :class:`LeaseBackendError` from the store propagates at once.
    ``clock`` (default: the real monotonic clock) paces the polls and the timeout, as
    ``leasekit.testing.FakeClock`` does in tests. ``metadata`` is stored with the
    grant (``Capabilities.metadata``; see :meth:`LeaseProvider.acquire_lease`).
    ``fair=True`` serves the key's waiters in arrival order, through the line the store
    keeps (``Capabilities.fair_waiting``; :class:`BackendLacksCapability` otherwise): a
    waiter keeps its place while it waits, and loses it
    :data:`~leasekit.FAIR_PLACE_TTL_MS` after it stops.
    """
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    data = metadata_for(_hooks.unwrap(provider), metadata)
    in_turn = check_fair(provider, fair)
    limit = check_wait_s(timeout_s, "timeout_s")
    first = check_poll_s(poll_s, "poll_s")
    cap = check_poll_s(max_poll_s, "max_poll_s")
    ops = _hooks.HookedLeaseProvider(_hooks.unwrap(provider), _hooks.backend_name(provider))
    result, _ = await acquire_polling(
        ops,
        key,
        owner,
        ttl_ms,
        timeout_s=limit,
        poll_s=first,
        max_poll_s=max(first, cap),
        clock=REAL_CLOCK if clock is None else clock,
        metadata=data,
        fair=in_turn,
    )
    if not result.acquired:
        raise LeaseHeld(key=key, holder=result.owner, metadata=result.metadata)
    return result


async def _attempt(
    provider: Any, key: str, owner: str, ttl_ms: int, metadata: bytes | None, *, fair: bool
) -> LeaseResult:
    """One acquire: in turn (the store's line) when ``fair``; metadata only when given."""
    if not fair:
        if metadata is None:
            plain: LeaseResult = await provider.acquire_lease(key, owner, ttl_ms)
            return plain
        with_metadata: LeaseResult = await provider.acquire_lease(
            key, owner, ttl_ms, metadata=metadata
        )
        return with_metadata
    take = provider.acquire_lease_in_turn
    if metadata is None:
        result: LeaseResult = await take(key, owner, ttl_ms, place_ttl_ms=FAIR_PLACE_TTL_MS)
    else:
        result = await take(key, owner, ttl_ms, place_ttl_ms=FAIR_PLACE_TTL_MS, metadata=metadata)
    return result


def check_fair(provider: object, fair: object) -> bool:
    """Check ``fair=`` (a bool) and, when true, that ``provider`` can keep a line."""
    if not isinstance(fair, bool):
        raise InvalidLeaseArgument.for_argument(
            "fair", f"must be a bool, got {type(fair).__name__}", fair
        )
    inner = _hooks.unwrap(provider)
    if fair and not (capabilities_of(inner).fair_waiting and supports(inner, SupportsFairWaiting)):
        name = getattr(inner, "backend", None) or type(inner).__name__
        raise BackendLacksCapability(
            f"backend {name!r} cannot serve waiters in arrival order "
            "(Capabilities.fair_waiting is false)",
            backend=str(name),
            missing=("fair_waiting",),
        )
    return fair
