"""One timer per provider bounds every operation by ``timeout_s``.

``async with asyncio.timeout()`` arms and cancels a timer per call, a cost that shows
up beside a loopback round trip (``leasekit bench``). Every operation of a provider has
the same ``timeout_s``, so deadlines fall due in the order the operations began: a FIFO
of open operations and one timer, set for the oldest, bound them all.

Two ways to be bounded, one mechanism:

- :meth:`Deadlines.open` / :meth:`Deadlines.close` time the *current task*: at the
  deadline the timer cancels it, as ``asyncio.timeout`` would, and ``close`` says the
  cancellation was the deadline's own so the caller can raise a timeout instead. A
  cancellation from elsewhere still propagates. For drivers that unwind promptly when
  cancelled (redis-py, grpc).
- :meth:`Deadlines.start` times a *waiter future*: at the deadline the waiter fails
  with :class:`Overdue` and the caller moves on at once, abandoning the driver call
  (which goes on in its own task, or thread, and is drained by ``aclose``). For
  drivers whose cancellation itself waits on the server (psycopg sends a cancel
  request and waits for it) or cannot cancel at all (a thread running sqlite3).
"""

from __future__ import annotations

import asyncio
import sys
import time
from asyncio import base_events, events
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["Deadlines", "Overdue"]


class Overdue(Exception):
    """Set on a waiter by :class:`Deadlines` when its deadline passes; never shown to users."""


class _Open:
    """One operation in flight: what to stop at its deadline, and whether it ran out.

    ``cancelling`` counts the cancellations already requested of ``task`` when the
    operation began (asyncio.timeout's bookkeeping): a deadline's own cancel is taken
    back only if it is the one that arrived, so a cancel from elsewhere still
    propagates as ``CancelledError``.
    """

    __slots__ = ("cancelling", "closed", "deadline", "expired", "task", "waiter")

    def __init__(
        self,
        deadline: float,
        task: asyncio.Task[Any] | None,
        waiter: asyncio.Future[Any] | None,
        cancelling: int,
    ) -> None:
        self.deadline = deadline
        self.task = task
        self.waiter = waiter
        self.cancelling = cancelling
        self.closed = False
        self.expired = False

    def cancel_requested(self) -> bool:
        """Whether the timed task was asked to cancel (by anyone) since the operation began."""
        if sys.version_info >= (3, 11) and self.task is not None:
            return self.task.cancelling() > self.cancelling
        return False


_UNCANCEL = sys.version_info >= (3, 11)  # Task.uncancel() exists from 3.11
_new_open = object.__new__

# The running loop, or None outside one: what asyncio.get_running_loop() reads, without
# the exception.
_running_loop = events._get_running_loop
if sys.version_info >= (3, 12):
    _current_task: Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None] = (
        asyncio.current_task  # implemented in C from 3.12
    )
else:
    # Python 3.11's asyncio.current_task() is a Python function around this lookup (in
    # the table the C tasks keep), and costs as much again as the rest of open().
    _current_task = asyncio.tasks._current_tasks.get  # type: ignore[attr-defined]


class Deadlines:
    """The deadline of every operation in flight of one provider, on a single timer.

    :meth:`open` and :meth:`close` run for every operation, so they do only what they
    must: no timer is armed or cancelled per operation, only a record appended to (and
    later dropped from the front of) a FIFO.
    """

    __slots__ = ("_loop", "_now", "_open", "_timer", "timeout_s")

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._open: deque[_Open] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._now: Callable[[], float] = time.monotonic
        self._timer: asyncio.TimerHandle | None = None

    @property
    def can_cancel_tasks(self) -> bool:
        """Whether :meth:`open` works here (Python 3.11+ inside a task)."""
        return _UNCANCEL and asyncio.current_task() is not None

    def open(self) -> _Open | None:
        """Time the current task's operation; ``None`` where that cannot be done.

        ``None`` (Python 3.10, or outside a task) means the caller must bound the call
        another way: :meth:`start` with a waiter, or ``asyncio.wait_for``.
        """
        if not _UNCANCEL:
            return None
        loop = _running_loop()
        if loop is None:
            return None
        task = _current_task(loop)
        if task is None:
            return None
        if loop is not self._loop:
            self._switch(loop)
        # The record without a call to _Open.__init__: this runs for every operation.
        watch = _new_open(_Open)
        watch.deadline = self._now() + self.timeout_s
        watch.task, watch.waiter, watch.cancelling = task, None, task.cancelling()
        watch.closed = watch.expired = False
        self._open.append(watch)
        if self._timer is None:
            self._timer = loop.call_at(watch.deadline, self._expire, loop)
        return watch

    def start(self, waiter: asyncio.Future[Any]) -> _Open:
        """Time ``waiter``: it fails with :class:`Overdue` at the deadline unless done."""
        loop = waiter.get_loop()
        if loop is not self._loop:
            self._switch(loop)
        watch = _Open(self._now() + self.timeout_s, None, waiter, 0)
        self._open.append(watch)
        if self._timer is None:
            self._timer = loop.call_at(watch.deadline, self._expire, loop)
        return watch

    def close(self, watch: _Open | None) -> bool:
        """End ``watch`` (idempotent); True if its deadline alone cancelled the task."""
        if watch is None or watch.closed:
            return False
        watch.closed = True
        pending = self._open
        while pending and pending[0].closed:
            pending.popleft()
        if watch.expired and sys.version_info >= (3, 11) and watch.task is not None:
            return bool(watch.task.uncancel() <= watch.cancelling)
        return False

    def _switch(self, loop: asyncio.AbstractEventLoop) -> None:
        # First use, or the provider now runs on another loop: what was open on the old
        # one is forgotten (its timer, if it ever fires, finds itself stale).
        self._loop, self._open, self._timer = loop, deque(), None
        # asyncio's own loops read time.monotonic(); calling it directly saves a Python
        # call per operation. A loop with a clock of its own is asked.
        own_clock = getattr(type(loop), "time", None) is base_events.BaseEventLoop.time
        self._now = time.monotonic if own_clock else loop.time

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:
            return  # a timer left on a loop the provider no longer runs on
        self._timer = None
        now = loop.time()
        pending = self._open
        while pending and (pending[0].closed or pending[0].deadline <= now):
            watch = pending.popleft()
            if watch.closed:
                continue
            watch.expired = True
            if watch.task is not None:
                watch.task.cancel()
            elif watch.waiter is not None and not watch.waiter.done():
                watch.waiter.set_exception(Overdue())
        if pending:
            self._timer = loop.call_at(pending[0].deadline, self._expire, loop)
