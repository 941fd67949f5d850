"""Calls that arrive together, decided together: the queue a backend's grouped statements share.

A backend whose store can decide many keys in one statement (one round trip, one
transaction) gives each kind of call (acquires, releases, renewals) a :class:`Group`
and runs those calls through :func:`grouped`. A call made while nothing of its kind is
in flight goes out at once, alone, as it would without a group: a single task pays two
comparisons. A call made while its kind has statements in flight waits in the group,
and when a statement of that kind ends, everything waiting goes out together through
the group's ``send``, which turns the members' single requests into one statement
and its reply back into each member's reply, the one its single statement would have
given.

What each caller keeps (the backend's ``send`` must keep its part: each row decided
exactly as the single statement decides it):

- **Its own answer.** The group's replies are split by position; each is sent into the
  caller's own operation (a sans-I/O generator, :data:`~leasekit.backend.Operation`),
  which reads it as the single statement's and goes on alone if it must (a second read
  runs on a connection of its own, :meth:`GroupTransport.run_alone`).
- **Arrival order per key.** A group holds distinct keys; a call on a key that a
  statement of its kind in flight, or the group being formed, already carries waits
  for the next group. So calls on one key are decided in the order they were made. The
  members reach ``send`` sorted by key, so that every group locks its rows in one
  order.
- **Its own deadline.** A caller whose deadline passes (or who is cancelled) while it
  waits is taken out before anything is sent, and nothing of it reaches the store; once
  its group is sent, the call waits for the group's outcome and hands the toolkit the
  grant it made (which the toolkit then undoes by its token, like any grant whose
  caller stopped listening). Once every member of a group is gone, its statement is
  cancelled, as a single call's would be.
- **Its own errors.** When a group's statement fails, every member's reply is the
  failure, and the backend's :meth:`GroupTransport.recover` decides for each caller
  alone: run its own statement alone when the group's transaction was rolled back,
  or follow the operation's own retry policy when the connection died.

Only asyncio providers group: a blocking provider runs each call on a pooled
connection of its calling thread.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

__all__ = [
    "GROUP_IN_FLIGHT",
    "MAX_GROUP",
    "Group",
    "GroupTransport",
    "grouped",
    "join_group",
    "resume",
    "resume_with",
    "send_waiting",
]

_Q = TypeVar("_Q")
_T = TypeVar("_T")

MAX_GROUP = 256
"""The most calls one statement decides by default (the rest wait for the next)."""

GROUP_IN_FLIGHT = 2
"""Statements of one kind a provider has in flight at once by default, alone or grouped."""


class GroupTransport(Protocol):
    """What :func:`grouped` needs of a backend's transport.

    ``extra`` is whatever the backend passed to :func:`grouped` for the call (how to
    build its operation again for a retry, say), handed back unchanged; None for the
    rest of an operation after its group's reply.
    """

    def run_alone(self, operation: Generator[Any, Any, _T], extra: Any) -> Coroutine[Any, Any, _T]:
        """Run ``operation`` (from its first request on) on a connection of its own."""
        ...

    def recover(
        self,
        error: BaseException,
        alone: bool,
        request: Any,
        operation: Generator[Any, Any, _T],
        extra: Any,
    ) -> Coroutine[Any, Any, _T]:
        """What the caller answers after its statement failed with ``error``.

        ``alone``: the statement was the caller's own, sent alone, so the error is its
        own; else a group's. ``request`` is the operation's first request, already
        yielded and not answered (:func:`resume` resumes it; :func:`resume_with` throws the
        error into the operation, which follows its own retry policy).
        """
        ...

    def start(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a group's statement in a task of its own (stopped when the provider closes)."""
        ...


class _Member:
    """A waiting call: its key, the first request its operation yielded (not sent), and
    the future its reply (or the group's failure) arrives on; once sent, its group's
    statement (``sending``) and whether its caller is gone."""

    __slots__ = ("future", "gone", "key", "request", "sending")

    def __init__(self, key: str, request: Any, future: asyncio.Future[Any]) -> None:
        self.key = key
        self.request = request
        self.future = future
        self.sending: _Sending | None = None
        self.gone = False


class _Sending:
    """A group's statement in flight: its members, and the task that sends it."""

    __slots__ = ("members", "task")

    def __init__(self, members: list[_Member]) -> None:
        self.members = members
        self.task: asyncio.Task[Any] | None = None


class _Failed:
    """The reply of a member whose statement raised ``error``."""

    __slots__ = ("alone", "error")

    def __init__(self, error: BaseException, *, alone: bool) -> None:
        self.error = error
        self.alone = alone  # its own statement, sent alone: the error is its own


class Group(Generic[_Q]):
    """The calls of one kind: those in flight (by key) and those waiting.

    ``send(io, requests)`` sends the members' first requests (sorted by key; one
    request: the single statement, alone) through the transport ``io`` and returns each
    member's reply, in that order, as its single statement would have answered. At
    most ``in_flight`` statements of the kind are in flight at once, each deciding at
    most ``most`` calls.
    """

    __slots__ = ("busy", "grouped", "in_flight", "limit", "most", "send", "waiting")

    def __init__(
        self,
        send: Callable[[Any, list[_Q]], Coroutine[Any, Any, list[Any]]],
        *,
        in_flight: int = GROUP_IN_FLIGHT,
        most: int = MAX_GROUP,
    ) -> None:
        self.send = send
        self.limit = in_flight
        self.most = most
        self.in_flight = 0
        # Keys in flight. A key enters only when it is not in already (alone after
        # free(), or in a group that skips busy keys): one statement carries it at most.
        self.busy: set[str] = set()
        self.waiting: deque[_Member] = deque()
        self.grouped = 0  # statements sent for two calls or more (for tests and curiosity)

    def free(self, key: str) -> bool:
        """Whether a call on ``key`` may go out now, alone."""
        return self.in_flight < self.limit and not self.waiting and key not in self.busy

    def enter(self, key: str) -> None:
        """A call on ``key`` goes out alone (after :meth:`free`)."""
        self.in_flight += 1
        self.busy.add(key)

    def leave(self, key: str) -> None:
        """The call on ``key`` that went out alone ended."""
        self.in_flight -= 1
        self.busy.discard(key)

    def _take(self) -> list[_Member]:
        """The next group: waiting calls on distinct keys not in flight, in arrival order.

        Counted in flight as one statement, each of its keys busy until it ends.
        """
        chosen: list[_Member] = []
        kept: deque[_Member] = deque()
        busy, most = self.busy, self.most
        for member in self.waiting:
            key = member.key
            if len(chosen) < most and key not in busy:
                busy.add(key)
                chosen.append(member)
            else:
                kept.append(member)
        self.waiting = kept
        if chosen:
            self.in_flight += 1
        return chosen

    def _done(self, members: list[_Member]) -> None:
        """A group's statement ended: its keys are free again."""
        self.in_flight -= 1
        self.busy.difference_update(member.key for member in members)


async def grouped(
    io: GroupTransport,
    group: Group[Any],
    key: str,
    operation: Generator[Any, Any, _T],
    extra: Any = None,
) -> _T:
    """Run ``operation`` of ``group`` on ``key``: at once, alone, if nothing of its kind
    is in flight and nothing waits; else in the next group."""
    if not group.free(key):
        return await join_group(io, group, key, operation, extra)
    group.enter(key)
    try:
        return await io.run_alone(operation, extra)
    finally:
        group.leave(key)
        if group.waiting:
            send_waiting(io, group)


async def join_group(
    io: GroupTransport,
    group: Group[Any],
    key: str,
    operation: Generator[Any, Any, _T],
    extra: Any = None,
) -> _T:
    """Run ``operation`` in ``group``'s next statement; what the call answers.

    For a backend that checks :meth:`Group.free` itself (and runs a free call alone
    between :meth:`Group.enter` and :meth:`Group.leave`, then :func:`send_waiting`).
    """
    request = next(operation)  # the single statement, not sent: it joins a group
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    member = _Member(key, request, future)
    group.waiting.append(member)
    send_waiting(io, group)
    try:
        reply = await asyncio.shield(future)
    except asyncio.CancelledError:
        sending = member.sending
        if sending is None:
            # Taken out before anything was sent: nothing of it reaches the store.
            group.waiting.remove(member)
            operation.close()
            raise
        # Sent: the outcome is what the group decided for it; hand it on (to the
        # toolkit, which undoes a grant its caller never learned of). Once every
        # member is gone, the statement is cancelled, as a single call's would be.
        member.gone = True
        if sending.task is not None and all(m.gone for m in sending.members):
            sending.task.cancel()
        reply = await asyncio.shield(future)
    if isinstance(reply, _Failed):
        if member.gone:
            operation.close()
            raise asyncio.CancelledError  # nobody waits: the toolkit takes it as unknown
        return await io.recover(reply.error, reply.alone, request, operation, extra)
    try:
        follow_up = operation.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    # The operation goes on alone (a second read): on a connection of its own, and with
    # no ``extra`` (what it had sent is answered: it is not built and run again).
    return await io.run_alone(resume(follow_up, operation), None)


def resume(request: Any, operation: Generator[Any, Any, _T]) -> Generator[Any, Any, _T]:
    """``operation`` from ``request`` (already yielded, not answered) on: an operation again."""
    while True:
        try:
            reply = yield request
        except GeneratorExit:  # noqa: PERF203 (the loop is the operation's)
            operation.close()
            raise
        except BaseException as exc:  # noqa: BLE001 (thrown into the operation, as drive_async does)
            try:
                request = operation.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
        else:
            try:
                request = operation.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]


def resume_with(
    error: BaseException, operation: Generator[Any, Any, _T]
) -> Generator[Any, Any, _T]:
    """``operation`` with ``error`` thrown in at its pending request: it retries (its next
    request, run as an operation again) or raises."""
    try:
        request = operation.throw(error)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    return (yield from resume(request, operation))


def send_waiting(io: GroupTransport, group: Group[Any]) -> None:
    """Send the next group if its kind has room in flight and calls wait for it."""
    while group.waiting and group.in_flight < group.limit:
        members = group._take()
        if not members:
            return
        if len(members) > 1:
            group.grouped += 1
            members.sort(key=_by_key)
        sending = _Sending(members)
        for member in members:
            member.sending = sending
        sending.task = task = io.start(group.send(io, [member.request for member in members]))
        # A callback, not the task's own code: it runs even if the task is cancelled
        # before its first step.
        task.add_done_callback(partial(_sent, io, group, members))


def _sent(
    io: GroupTransport, group: Group[Any], members: list[_Member], task: asyncio.Task[Any]
) -> None:
    """A group's statement ended: hand out the replies (or the failure), free its keys."""
    if task.cancelled():
        replies: list[Any] = [_Failed(asyncio.CancelledError(), alone=True)] * len(members)
    elif (error := task.exception()) is not None:
        replies = [_Failed(error, alone=len(members) == 1)] * len(members)
    else:
        replies = task.result()
        if len(replies) != len(members):
            error = RuntimeError(f"a group of {len(members)} calls got {len(replies)} replies")
            replies = [_Failed(error, alone=False)] * len(members)
    for member, reply in zip(members, replies, strict=True):
        if not member.future.done():
            member.future.set_result(reply)
    group._done(members)
    send_waiting(io, group)


def _by_key(member: _Member) -> str:
    return member.key
