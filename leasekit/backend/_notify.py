"""Wake-ups when a key may have become free: the optional interface and its bookkeeping.

A backend that can tell waiters about releases declares
``Capabilities(release_notifications=True)`` and offers :meth:`watch_release`
(:class:`SupportsReleaseNotifications`). Its native channel (Redis pub/sub, PostgreSQL
``LISTEN``, an etcd watch) feeds a :class:`ReleaseHub`, which fans each hint out to the
waiters of that key. A wake-up is a hint to retry the acquire, never a grant: it is
sent on release, on transfer (the key is not free then, but the waiter must look
again), on expiry where the store reports it, and to everyone when the channel was
lost and may have missed something.

Waiters subscribe *before* their acquire, so a release that lands between a denied
acquire and the wait is not missed: :meth:`ReleaseHub.watch` registers at once and
:meth:`ReleaseWatch.wait` returns immediately for a hint that came in meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from ._records import _register_extra

__all__ = [
    "ReleaseHub",
    "ReleaseWatch",
    "SupportsReleaseNotifications",
    "SupportsRemaining",
    "stop_task",
]


async def stop_task(task: asyncio.Task[Any] | None, timeout_s: float) -> None:
    """Cancel a listener's reader ``task`` and wait for it to end, at most ``timeout_s``.

    For a release listener's ``aclose``: whatever the task ends with (its cancellation,
    an error, a result) is dropped, and a task that does not end in time (a driver that
    ignores the cancel) is left to the event loop rather than waited for.
    """
    if task is None:
        return
    task.cancel()
    # asyncio.wait, not wait_for: at its timeout wait_for cancels again and then waits
    # for the task to end, without a bound.
    await asyncio.wait((task,), timeout=timeout_s)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it as never retrieved


class ReleaseWatch:
    """One waiter's interest in one key, from :meth:`ReleaseHub.watch` until closed."""

    __slots__ = ("_event", "_hub", "_loop", "closed", "grants", "key")

    def __init__(self, hub: ReleaseHub, key: str, *, grants: bool = False) -> None:
        self._hub = hub
        self.key = key
        self.grants = grants
        """Whether grant hints wake it too (an owner watcher), not only release hints."""
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self.closed = False

    def _wake(self) -> None:
        # Hints may come from another thread (a listener thread, or a store shared by
        # several event loops): the event belongs to the waiter's loop.
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is self._loop:
            self._event.set()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self, timeout_s: float | None) -> bool:
        """Wait for a hint, at most ``timeout_s`` (``None``: no limit); True if one came.

        A hint that arrived since the last wait (or since the watch began) returns at
        once. Either way, the caller's next step is to try the acquire again.
        """
        if not self._event.is_set():
            if timeout_s is not None and timeout_s <= 0:
                return False
            try:
                await asyncio.wait_for(self._event.wait(), timeout_s)
            except (TimeoutError, asyncio.TimeoutError):
                return False
        self._event.clear()
        return True

    def close(self) -> None:
        """Stop watching (idempotent)."""
        if not self.closed:
            self.closed = True
            self._hub._forget(self)

    def __enter__(self) -> ReleaseWatch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ReleaseHub:
    """Fans release hints out to the waiters of each key, for one provider.

    ``on_first(key)`` and ``on_last(key)`` run when a key gains its first waiter and
    loses its last one, for backends that subscribe per key (an etcd watch, a Redis
    channel per key); backends with one channel for everything can ignore them.
    """

    def __init__(
        self,
        *,
        on_first: Callable[[str], None] | None = None,
        on_last: Callable[[str], None] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[ReleaseWatch]] = {}
        self._on_first = on_first
        self._on_last = on_last

    def watch(self, key: str, *, grants: bool = False) -> ReleaseWatch:
        """Start watching ``key`` now; close the watch (or use ``with``) when done.

        Called from a coroutine: the watch wakes on that event loop. ``grants=True``
        wakes it on grant hints too (:meth:`notify` with ``granted=True``).
        """
        watch = ReleaseWatch(self, key, grants=grants)
        with self._lock:
            waiters = self._waiters.get(key)
            first = waiters is None
            if waiters is None:
                waiters = self._waiters[key] = set()
            waiters.add(watch)
        if first and self._on_first is not None:
            self._on_first(key)
        return watch

    def _forget(self, watch: ReleaseWatch) -> None:
        with self._lock:
            waiters = self._waiters.get(watch.key)
            if waiters is None:
                return
            waiters.discard(watch)
            last = not waiters
            if last:
                del self._waiters[watch.key]
        if last and self._on_last is not None:
            self._on_last(watch.key)

    @property
    def keys(self) -> frozenset[str]:
        """The keys someone is waiting for now."""
        return frozenset(self._waiters)

    def notify(self, key: str, *, granted: bool = False) -> int:
        """Wake the waiters of ``key``; returns how many it woke.

        A release hint (the default) wakes every waiter. ``granted=True`` is a grant
        hint (the key was taken, so no acquire can succeed now): it wakes only the
        watches that asked for grants, so acquirers are not sent to be denied again.
        """
        with self._lock:
            waiters = self._waiters.get(key)
            if not waiters:
                return 0
            woken = [w for w in waiters if w.grants] if granted else list(waiters)
        for watch in woken:
            watch._wake()
        return len(woken)

    def notify_all(self) -> int:
        """Wake every waiter of every key: the channel was lost and may have missed hints."""
        with self._lock:
            everyone = [watch for waiters in self._waiters.values() for watch in waiters]
        for watch in everyone:
            watch._wake()
        return len(everyone)


class SupportsReleaseNotifications(Protocol):
    """A backend that wakes waiters when a key may have become free.

    Declared with ``Capabilities(release_notifications=True)``. The watch must be live
    when the call returns (the backend's subscription confirmed), so that a release
    after it is never missed. A backend that also declares ``grant_notifications``
    accepts ``grants=True``, and its watch then wakes on grants and transfers as well
    (callers pass ``grants`` only to such a backend).
    """

    async def watch_release(self, key: str, *, grants: bool = False) -> ReleaseWatch:
        """Start watching ``key`` for hints that it may have become free (or, with
        ``grants``, that it changed hands)."""
        ...


class SupportsRemaining(Protocol):
    """A backend that can say how long the current holder's lease has left."""

    async def lease_remaining_ms(self, key: str) -> int | None:
        """The live lease's remaining time in ms by the store's clock; ``None`` if free."""
        ...


_register_extra(SupportsReleaseNotifications, "watch_release")
_register_extra(SupportsRemaining, "lease_remaining_ms")
