"""Test helpers for code that uses leases: a fake clock, a memory store on it, faults.

::

    clock = leasekit.testing.FakeClock()
    leases = leasekit.testing.FaultyProvider(leasekit.testing.memory_provider(clock))
    async with leasekit.hold(leases, "job", owner, ttl_ms=30_000, clock=clock) as lease:
        leases.fail_next(1000, operation="renew")  # the store stops answering
        await clock.advance(60_000)                # a minute, in microseconds

- :class:`FakeClock` is a :class:`leasekit.Clock` whose time moves only when a test
  calls :meth:`FakeClock.advance` (or, with ``ticking=True``, also at the real rate).
  :func:`leasekit.hold` and :func:`leasekit.wait_for` take it as ``clock=``: their
  renewal timers, deadlines and polls then follow it.
- :func:`memory_provider` is a ``memory://`` store whose expiry follows that clock
  (``leasekit.connect("memory://", clock=clock)`` is the same).
- :class:`FaultyProvider` wraps any provider and makes chosen operations fail with
  :class:`leasekit.LeaseBackendTimeout` (or another error), or stall until the clock
  passes a point, so loss handling can be tested.

With pytest, the ``lease_clock`` and ``fake_leases`` fixtures give a fresh clock and a
faulty memory provider on it (leasekit registers them as a pytest plugin).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

from ._capabilities import Capabilities, capabilities_of
from ._clock import Clock
from ._contract import LeaseProvider, LeaseResult
from ._errors import InvalidLeaseArgument, LeaseBackendError, LeaseBackendTimeout
from ._memory import MemoryLeaseProvider

__all__ = ["OPERATIONS", "FakeClock", "FaultyProvider", "memory_provider"]

# Loop turns without any clock activity after which advance() takes the woken tasks
# to have settled (each turn is one asyncio.sleep(0): microseconds).
_SETTLE_TURNS = 3


class _FakeTimer:
    """A callback waiting for a :class:`FakeClock` to reach ``when``."""

    __slots__ = ("_real", "callback", "cancelled", "done", "when")

    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False
        self.done = False
        self._real: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        """Call the callback off; a no-op once it ran."""
        self.cancelled = True
        if self._real is not None:
            self._real.cancel()

    def fire(self) -> None:
        if self.cancelled or self.done:
            return
        self.done = True
        if self._real is not None:
            self._real.cancel()
        self.callback()


class FakeClock:
    """A :class:`leasekit.Clock` for tests: time moves when the test says so.

    Starts at ``start`` seconds. :meth:`advance` moves it forward, firing every
    timer and waking every :meth:`sleep` that falls due, in time order, and letting
    the woken tasks run before moving on. With ``ticking=True`` time also passes at
    the real rate (timers fire on the real loop too), for code that must also work
    in real time, such as the conformance suite.

    Use one clock per test, on one event loop. ``monotonic()`` and
    ``monotonic_ns()`` may be read from any thread.
    """

    def __init__(self, start: float = 0.0, *, ticking: bool = False) -> None:
        checked: object = start
        if isinstance(checked, bool) or not isinstance(checked, (int, float)):
            raise InvalidLeaseArgument.for_argument("start", "must be a number of seconds", start)
        self._offset = float(start)
        self._ticking = ticking
        self._origin = time.monotonic() if ticking else 0.0
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._order = itertools.count()
        self._activity = 0  # bumped by every timer armed or fired: advance() settles on it

    # -- reading ---------------------------------------------------------------------------

    def monotonic(self) -> float:
        """The clock's time, in seconds."""
        if self._ticking:
            return self._offset + (time.monotonic() - self._origin)
        return self._offset

    def monotonic_ns(self) -> int:
        """The clock's time, in integer nanoseconds (what the memory store reads)."""
        return round(self.monotonic() * 1e9)

    @property
    def pending(self) -> int:
        """How many timers and sleeps are waiting for the clock."""
        return sum(1 for _, _, timer in self._timers if not (timer.cancelled or timer.done))

    # -- waiting ---------------------------------------------------------------------------

    def call_at(self, when: float, callback: Callable[[], object]) -> _FakeTimer:
        """Run ``callback()`` once the clock reaches ``when`` (on the running loop)."""
        loop = asyncio.get_running_loop()
        timer = _FakeTimer(when, callback)
        self._activity += 1
        delay = when - self.monotonic()
        if delay <= 0:
            timer._real = loop.call_soon(timer.fire)  # type: ignore[assignment]
            return timer
        heapq.heappush(self._timers, (when, next(self._order), timer))
        if self._ticking:
            timer._real = loop.call_later(delay, timer.fire)
        return timer

    async def sleep(self, seconds: float) -> None:
        """Return once the clock has moved ``seconds`` on (one loop turn if ``<= 0``)."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        woken = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        timer = self.call_at(self.monotonic() + seconds, wake)
        try:
            await woken
        finally:
            timer.cancel()

    # -- moving ----------------------------------------------------------------------------

    async def advance(self, ms: float) -> None:
        """Move the clock ``ms`` milliseconds on, firing what falls due in order.

        Before each due timer the clock stands at that timer's time, and after each the
        loop runs until the tasks it woke have settled (no clock activity for a few loop
        turns), so a renewal scheduled by a renewal that just ran fires too if it falls
        within ``ms``. Cancellation of the calling task (a hold cancelling its body)
        propagates from here.
        """
        checked: object = ms
        if isinstance(checked, bool) or not isinstance(checked, (int, float)):
            raise InvalidLeaseArgument.for_argument("ms", "must be a number of milliseconds", ms)
        if math.isnan(ms) or ms < 0 or math.isinf(ms):
            raise InvalidLeaseArgument.for_argument("ms", "must be finite and >= 0", ms)
        target = self.monotonic() + ms / 1000
        await self._settle()
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            if timer.cancelled or timer.done:
                continue
            self._move_to(when)
            self._activity += 1
            timer.fire()
            await self._settle()
        self._move_to(target)
        await self._settle()

    def _move_to(self, when: float) -> None:
        now = self.monotonic()
        if when > now:
            self._offset += when - now

    async def _settle(self) -> None:
        idle = 0
        while idle < _SETTLE_TURNS:
            before = self._activity
            await asyncio.sleep(0)
            idle = idle + 1 if self._activity == before else 0

    def __repr__(self) -> str:
        ticking = ", ticking" if self._ticking else ""
        return f"FakeClock({self.monotonic():.6f}{ticking}, {self.pending} pending)"


def memory_provider(clock: Clock) -> MemoryLeaseProvider:
    """A private ``memory://`` store whose leases expire on ``clock``.

    The same as ``leasekit.connect("memory://", clock=clock)``; ``.clock`` is the clock.
    """
    return MemoryLeaseProvider(clock=clock)


OPERATIONS = ("acquire", "owner", "release", "renew", "transfer")
"""The operation names :class:`FaultyProvider` takes (those of ``leasekit_failed``)."""


def _operations(operation: str | Iterable[str] | None) -> frozenset[str]:
    if operation is None:
        return frozenset(OPERATIONS)
    names = frozenset([operation] if isinstance(operation, str) else operation)
    unknown = sorted(names - set(OPERATIONS))
    if unknown or not names:
        raise InvalidLeaseArgument.for_argument(
            "operation", f"must be among {', '.join(OPERATIONS)}, got {unknown or 'none'}"
        )
    return names


class _Fault:
    __slots__ = ("error", "healed", "operations", "remaining", "until")

    def __init__(
        self,
        operations: frozenset[str],
        remaining: float,
        error: type[LeaseBackendError] | None,
        until: float | None,
    ) -> None:
        self.operations = operations
        self.remaining = remaining
        self.error = error
        self.until = until
        self.healed: asyncio.Event | None = None


class FaultyProvider:
    """Any provider, with faults a test switches on: failures and stalls.

    :meth:`fail_next` makes the next ``n`` matching operations raise
    :class:`leasekit.LeaseBackendTimeout` (or the given :class:`LeaseBackendError`
    subclass, such as :class:`leasekit.LeaseBackendUnreachable`) without reaching the
    store; :meth:`stall_until` makes matching operations wait until ``clock`` reaches
    a time, then run. :meth:`heal` ends every fault. ``calls`` counts operations by
    name, faulted or not. Works with :func:`leasekit.hold` and the sync facade alike.
    """

    def __init__(self, inner: LeaseProvider, *, clock: Clock | None = None) -> None:
        self.inner = inner
        self.clock = clock if clock is not None else getattr(inner, "clock", None)
        self.calls: dict[str, int] = dict.fromkeys(OPERATIONS, 0)
        self._faults: list[_Fault] = []

    @property
    def capabilities(self) -> Capabilities:
        """The wrapped provider's capabilities."""
        return capabilities_of(self.inner)

    @property
    def backend(self) -> str:
        """The name events carry for operations through this wrapper."""
        return "faulty"

    # -- switching faults ------------------------------------------------------------------

    def fail_next(
        self,
        n: int = 1,
        *,
        operation: str | Iterable[str] | None = None,
        error: type[LeaseBackendError] = LeaseBackendTimeout,
    ) -> None:
        """Make the next ``n`` operations named ``operation`` (default: any) raise ``error``."""
        checked: object = n
        if isinstance(checked, bool) or not isinstance(checked, int) or n < 1:
            raise InvalidLeaseArgument.for_argument("n", "must be an int >= 1", n)
        checked_error: object = error
        if not (isinstance(checked_error, type) and issubclass(checked_error, LeaseBackendError)):
            raise InvalidLeaseArgument.for_argument(
                "error", "must be a LeaseBackendError subclass", error
            )
        self._faults.append(_Fault(_operations(operation), n, error, None))

    def fail_always(
        self,
        *,
        operation: str | Iterable[str] | None = None,
        error: type[LeaseBackendError] = LeaseBackendTimeout,
    ) -> None:
        """Make every operation named ``operation`` raise ``error`` until :meth:`heal`."""
        self.fail_next(1, operation=operation, error=error)
        self._faults[-1].remaining = math.inf

    def stall_until(self, when: float, *, operation: str | Iterable[str] | None = None) -> None:
        """Make operations named ``operation`` wait until the clock reaches ``when``, then run.

        ``when`` is on the provider's clock (``clock=``, or the wrapped memory
        provider's); ``math.inf`` stalls until :meth:`heal`. Stalled calls can be
        cancelled, as a hold cancels a renewal at its deadline.
        """
        if self.clock is None:
            raise InvalidLeaseArgument.for_argument(
                "clock", "stall_until needs FaultyProvider(..., clock=...) or a clocked store"
            )
        self._faults.append(_Fault(_operations(operation), math.inf, None, float(when)))

    def heal(self) -> None:
        """End every fault; stalled calls go on to the store."""
        for fault in self._faults:
            if fault.healed is not None:
                fault.healed.set()
        self._faults.clear()

    # -- the contract ----------------------------------------------------------------------

    async def _enter(self, operation: str, key: str) -> None:
        self.calls[operation] += 1
        for fault in list(self._faults):
            if operation not in fault.operations or fault.remaining <= 0:
                continue
            if fault.error is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._faults.remove(fault)
                raise fault.error(f"injected fault in {operation}", backend="faulty", key=key)
            await self._stall(fault)

    async def _stall(self, fault: _Fault) -> None:
        clock = self.clock
        assert clock is not None  # checked by stall_until
        until = math.inf if fault.until is None else fault.until
        if clock.monotonic() >= until:
            return
        if fault.healed is None:
            fault.healed = asyncio.Event()
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(fault.healed.wait())]
        if not math.isinf(until):
            waits.append(asyncio.ensure_future(clock.sleep(until - clock.monotonic())))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.wait(waits)

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        """``acquire_lease`` of the wrapped provider, unless a fault says otherwise."""
        await self._enter("acquire", key)
        return await self.inner.acquire_lease(key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        """``get_lease_owner`` of the wrapped provider, unless a fault says otherwise."""
        await self._enter("owner", key)
        return await self.inner.get_lease_owner(key)

    async def release_lease(self, key: str, owner: str) -> None:
        """``release_lease`` of the wrapped provider, unless a fault says otherwise."""
        await self._enter("release", key)
        await self.inner.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """``renew_lease`` of the wrapped provider, unless a fault says otherwise."""
        await self._enter("renew", key)
        return await self.inner.renew_lease(key, owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """``transfer_lease`` of the wrapped provider, unless a fault says otherwise."""
        await self._enter("transfer", key)
        return await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)

    async def aclose(self) -> None:
        """Close the wrapped provider, if it can be closed."""
        close: Any = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()

    async def __aenter__(self) -> FaultyProvider:
        enter: Any = getattr(self.inner, "__aenter__", None)
        if enter is not None:
            await enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"FaultyProvider({self.inner!r}, {len(self._faults)} faults)"
