"""The clock seam: where hold(), wait_for() and the memory provider read time and wait.

Everything above the contract that waits or keeps a deadline does it through a
:class:`Clock`, so a test can swap the real one for ``leasekit.testing.FakeClock`` and
cover minutes of lease life in milliseconds. The real clock is the process's monotonic
clock and the running event loop's timers; code that gets no clock uses it directly,
so the seam costs nothing on the hot path.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["REAL_CLOCK", "Clock", "RealClock", "TimerHandle"]


class TimerHandle(Protocol):
    """What :meth:`Clock.call_at` returns: a pending callback that can be called off."""

    def cancel(self) -> None:
        """Call the callback off; a no-op once it ran or was cancelled."""


class Clock(Protocol):
    """Monotonic time, sleeping and timers, as hold() and wait_for() use them.

    A ``typing.Protocol``: implementers need not inherit from it. Times are seconds on
    one monotonic scale whose origin means nothing; only differences do.
    """

    def monotonic(self) -> float:
        """The current time, in seconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock (at once if ``<= 0``)."""
        ...

    def call_at(self, when: float, callback: Callable[[], object]) -> TimerHandle:
        """Run ``callback()`` on the running event loop once the clock reaches ``when``.

        It runs as one loop callback of its own, so what it does (set an event,
        cancel a task) takes effect in that loop turn.
        """
        ...


class RealClock:
    """The process's monotonic clock and the running loop's timers."""

    monotonic = staticmethod(time.monotonic)

    async def sleep(self, seconds: float) -> None:
        """:func:`asyncio.sleep`."""
        await asyncio.sleep(max(0.0, seconds))

    def call_at(self, when: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        """``loop.call_later`` to ``when`` on :func:`time.monotonic`'s scale.

        Converted through a delay rather than passed to ``loop.call_at``: a loop's own
        time (uvloop's, say) need not share ``time.monotonic``'s origin.
        """
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, when - time.monotonic()), callback)

    def __repr__(self) -> str:
        return "RealClock()"


REAL_CLOCK = RealClock()
"""The clock everything uses unless given another."""
