"""``FifoGate``: at most ``size`` holders at a time, waiters served first come, first served.

A backend whose driver pool hands a freed connection to whoever asks next, rather than
to whoever has waited longest, can starve waiters: a task that checks a connection in
and at once out again (acquire, renew, release in a loop) keeps taking it back before
a waiter wakes up, and the waiter runs out its whole ``timeout_s``. asyncmy's pool
does that. A gate of the pool's size in front of it fixes the order without replacing
the pool: only a holder of the gate asks the pool, so the pool always has a connection
(or room to open one) for it, and the gate hands each freed place straight to the
oldest waiter, never to a newcomer.

Waiting is bounded by whatever bounds the caller: inside
:meth:`BackendProvider._call <leasekit.backend.BackendProvider._call>`, the
operation's deadline (``timeout_s``), which cancels the wait. A waiter that is
cancelled leaves the queue; one cancelled just as a place was handed to it passes the
place on to the next waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from types import TracebackType

__all__ = ["FifoGate"]


class FifoGate:
    """A fair semaphore: at most ``size`` holders; waiters served in arrival order.

    ``await gate.acquire()`` returns at once while a place is free and nobody waits;
    otherwise it waits its turn behind every earlier caller. ``gate.release()``
    (synchronous) hands the place to the oldest waiter, or frees it. ``async with
    gate:`` does both. Typical use, in front of a driver's pool of ``size``
    connections::

        await gate.acquire()
        try:
            conn = await pool.acquire()
        except BaseException:
            gate.release()
            raise
        ...
        pool.release(conn)  # first the connection, then the place
        gate.release()

    Not thread-safe: use it from one event loop.
    """

    __slots__ = ("_free", "_size", "_waiters")

    def __init__(self, size: int) -> None:
        if type(size) is not int or size < 1:
            raise ValueError(f"size must be an int of at least 1, got {size!r}")
        self._size = size
        self._free = size
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def size(self) -> int:
        """How many may hold the gate at once."""
        return self._size

    @property
    def held(self) -> int:
        """How many hold it now."""
        return self._size - self._free

    @property
    def waiting(self) -> int:
        """How many wait for a place."""
        return len(self._waiters)

    def try_acquire(self) -> bool:
        """Take a place if one is free and nobody waits, without waiting; True if taken.

        The uncontended path without a coroutine: ``if not gate.try_acquire(): await
        gate.acquire()`` is ``await gate.acquire()``, for code that runs on every call.
        """
        if self._free and not self._waiters:
            self._free -= 1
            return True
        return False

    async def acquire(self) -> None:
        """Take a place, after every caller that began waiting earlier.

        A cancellation (the caller's deadline, say) ends the wait with the caller's
        place given up; a place handed over at that moment goes to the next waiter.
        """
        if self._free and not self._waiters:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a place just as it gave up: pass it on
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):  # release() may have dropped it
                    self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give a place back: to the oldest waiter if there is one, else free it."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the place passes straight to it
                return
        if self._free >= self._size:
            raise RuntimeError("FifoGate released more often than acquired")
        self._free += 1

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"FifoGate(size={self._size}, held={self.held}, waiting={self.waiting})"
