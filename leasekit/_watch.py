"""Watching the owner of a key, and leader election: :func:`watch_owner`, :func:`elect`.

Both wait through :class:`leasekit._waiting.KeyWaiter` (woken by release notifications
where the backend has them); :func:`elect` is a :func:`leasekit.hold` that waits.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from ._clock import REAL_CLOCK, Clock
from ._contract import LeaseProvider, validate_key, validate_owner, validate_ttl_ms
from ._hold import LeaseHold, OnLost, hold
from ._waiting import KeyWaiter, check_interval

__all__ = ["elect", "leaders", "watch_owner"]


async def watch_owner(
    provider: LeaseProvider, key: str, *, poll_s: float = 0.5, clock: Clock | None = None
) -> AsyncGenerator[str | None, None]:
    """Yield the owner of ``key`` now, then again each time it changes (``None``: free).

    On a backend with ``release_notifications`` a release, transfer or expiry is seen
    within a round trip and a held key costs the store no requests while nobody
    touches it; with ``grant_notifications`` too, so is a grant of a free key, and a
    free key costs nothing either. Without grant notifications a free key is looked at
    every ``poll_s``; without any notifications the key is polled every ``poll_s``.
    Each yield is the owner read after a change (an observer sees states: an owner
    who held the key for less than a round trip may be missed). Store errors propagate.
    ``clock`` (default: the real monotonic clock) paces the looks, as
    ``leasekit.testing.FakeClock`` does in tests.
    """
    validate_key(key)
    interval = check_interval(poll_s, "poll_s")
    unset: Any = object()
    last: str | None = unset
    async with KeyWaiter(
        provider,
        key,
        poll_s=interval,
        max_poll_s=interval,
        clock=REAL_CLOCK if clock is None else clock,
        grants=True,
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
    renew_every_ms: int | None = None,
    safety_margin_ms: int | None = None,
    on_lost: OnLost = "cancel",
    clock: Clock | None = None,
    metadata: bytes | str | None = None,
) -> LeaseHold:
    """Campaign for leadership of ``group``; an async context manager holding it.

    ``async with leasekit.elect(provider, "scheduler", me, ttl_ms=10_000) as term:``
    waits (woken by release notifications where the backend has them) until
    ``candidate`` holds the group's lease, or ``timeout_s`` passes
    (:class:`~leasekit.LeaseHeld`). Inside, leadership is a :func:`leasekit.hold`:
    renewed in the background, the body cancelled (or ``term.lost`` set, with
    ``on_lost="flag"``) before anyone else can be elected, resigned on exit or handed
    on with ``term.transfer_to(successor)``. ``renew_every_ms``, ``safety_margin_ms``,
    ``on_lost``, ``clock`` and ``metadata`` (the leader's address, for followers to
    read from ``get_lease_record``) are :func:`leasekit.hold`'s.
    """
    validate_key(group, "group")
    validate_owner(candidate, "candidate")
    validate_ttl_ms(ttl_ms)
    return hold(
        provider,
        group,
        candidate,
        ttl_ms,
        renew_every_ms=renew_every_ms,
        safety_margin_ms=safety_margin_ms,
        on_lost=on_lost,
        wait_s=timeout_s,
        clock=clock,
        metadata=metadata,
    )
