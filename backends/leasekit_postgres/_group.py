"""Operations that arrive together, decided together: the asyncio provider's groups.

An acquire (or release, or renewal) made while the provider already has one of its kind
in flight is not sent on a connection of its own: it waits in its kind's :class:`Group`,
and when a statement of that kind ends, everything waiting goes out as one statement
(``_sql``: ``acquire_group``, ``release_group``, ``renew_many``), one round trip and one
transaction, whose rows are each decided exactly as the single statement would decide
them. A call made while nothing of its kind is in flight goes out at once, alone, as
before: a single task pays two comparisons.

What each caller keeps:

- **Its own answer.** The group's reply is split by position, and each caller's reply is
  sent into its own operation (``_ops``), which reads it as it reads the single
  statement's and goes on alone if it must (a denied acquire whose holder the snapshot
  could not see reads the owner once more, as after the single statement).
- **Arrival order per key.** A group holds distinct keys; a call on a key that a
  statement of its kind in flight, or the group being formed, already carries waits for
  the next group. So calls on one key are decided in the order they were made.
  Keys are sorted in the statement, so every acquire group locks its rows in one
  order (a release or renewal group locks them in its plan's order; see ``_sql``).
- **Its own deadline.** A caller whose deadline passes (or who is cancelled) while it
  waits is taken out before anything is sent, and nothing of it reaches the store; once
  its group is sent, the call goes on in the background (``_call_detached``) and hands
  the toolkit the grant it made, which is then undone by its token like any grant
  whose caller stopped listening.
- **Its own errors.** When a group's statement fails on the server (a deadlock with
  another process's statement, a timeout), nothing of it was committed, and each caller
  runs its own statement alone; only what fails then fails it. When the connection
  died under it, each caller follows its own retry policy (``_ops.attempts``): once
  more on a fresh connection, or, for an operation that may not run twice, the error.
  An unacknowledged commit (``synchronous_commit``) is every member's timeout.

Only the asyncio provider groups: the blocking one runs each call on a pooled
connection of its calling thread, as before.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, Protocol, TypeVar

import psycopg

from . import _ops
from ._sql import Statements

__all__ = ["Group", "Groups"]

_T = TypeVar("_T")

MAX_GROUP = 256
"""The most calls one statement decides (the rest wait for the next)."""

IN_FLIGHT = 2
"""Statements of one kind a provider has in flight at once, alone or grouped."""


class AsyncTransport(Protocol):
    """What a group needs of the provider's transport (``_aio.AsyncTransport``)."""

    def run(
        self,
        operation: _ops.Operation[_T],
        again: Callable[..., _ops.Operation[_T]] | None = None,
        args: tuple[Any, ...] = (),
    ) -> Coroutine[Any, Any, _T]: ...

    def retry(
        self, operation: _ops.Operation[_T], exc: BaseException
    ) -> Coroutine[Any, Any, _T]: ...

    def exchange_once(self, query: _ops.Query) -> Coroutine[Any, Any, Any]: ...

    def start(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...


class _Member:
    """A waiting call: its key, the first query its operation yielded (not sent), and
    the future its reply (or the group's error) arrives on; once sent, its group's
    statement (``sending``) and whether its caller is gone."""

    __slots__ = ("future", "gone", "key", "query", "sending")

    def __init__(self, key: str, query: _ops.Query, future: asyncio.Future[Any]) -> None:
        self.key = key
        self.query = query
        self.future = future
        self.sending: _Sending | None = None
        self.gone = False


class _Sending:
    """A group's statement in flight: its members, and the task that sends it."""

    __slots__ = ("members", "task")

    def __init__(self, members: list[_Member]) -> None:
        self.members = members
        self.task: asyncio.Task[None] | None = None


class _Failed:
    """The reply of a member whose group's statement raised ``error``."""

    __slots__ = ("alone", "error")

    def __init__(self, error: BaseException, *, alone: bool) -> None:
        self.error = error
        self.alone = alone  # its own statement, sent alone: the error is its own


class Group:
    """The calls of one kind: those in flight (by key) and those waiting.

    ``statement`` is the grouped statement, ``params`` builds its parameters from the
    members' single queries, and ``replies`` splits its rows into each member's reply.
    """

    __slots__ = ("busy", "grouped", "in_flight", "params", "replies", "statement", "waiting")

    def __init__(
        self,
        statement: bytes,
        params: Callable[[list[_ops.Query]], dict[str, Any]],
        replies: Callable[[list[Any], int], list[Any]],
    ) -> None:
        self.statement = statement
        self.params = params
        self.replies = replies
        self.in_flight = 0
        self.busy: dict[str, int] = {}  # keys in flight: how many statements carry each
        self.waiting: deque[_Member] = deque()
        self.grouped = 0  # statements sent for two calls or more (for tests and curiosity)

    def free(self, key: str) -> bool:
        """Whether a call on ``key`` may go out now, alone."""
        return self.in_flight < IN_FLIGHT and not self.waiting and key not in self.busy

    def enter(self, key: str) -> None:
        self.in_flight += 1
        self.busy[key] = self.busy.get(key, 0) + 1

    def leave(self, key: str) -> None:
        self.in_flight -= 1
        left = self.busy[key] - 1
        if left:
            self.busy[key] = left
        else:
            del self.busy[key]

    def take(self) -> list[_Member]:
        """The next group: waiting calls on distinct keys not in flight, in arrival order.

        Counted in flight as one statement, each of its keys busy until it ends.
        """
        chosen: list[_Member] = []
        kept: deque[_Member] = deque()
        busy = self.busy
        for member in self.waiting:
            key = member.key
            if len(chosen) < MAX_GROUP and key not in busy:
                busy[key] = 1
                chosen.append(member)
            else:
                kept.append(member)
        self.waiting = kept
        if chosen:
            self.in_flight += 1
        return chosen

    def done(self, members: list[_Member]) -> None:
        """A group's statement ended: its keys are free again."""
        self.in_flight -= 1
        busy = self.busy
        for member in members:
            left = busy[member.key] - 1
            if left:
                busy[member.key] = left
            else:
                del busy[member.key]


class Groups:
    """The provider's three groups, built for its statements and notification channel.

    ``lock_wait_ms``: how long a group's statement waits for a row another transaction
    keeps locked before its members go alone.
    """

    __slots__ = ("acquire", "release", "renew")

    def __init__(self, sql: Statements, channel: str | None, lock_wait_ms: int) -> None:
        extra: dict[str, Any] = {"lock_timeout": f"{lock_wait_ms}ms"}
        self.acquire = Group(
            sql.acquire_group if channel is None else sql.acquire_group_notify,
            partial(_with, _acquire_params, extra),
            _rows_in_order,
        )
        if channel is None:
            self.release = Group(
                sql.release_group, partial(_with, _release_params, extra), _positions
            )
        else:
            self.release = Group(
                sql.release_group_notify,
                partial(_with, _release_params, {**extra, "channel": channel}),
                _positions,
            )
        self.renew = Group(sql.renew_group, partial(_with, _renew_params, extra), _positions)


def _with(
    params: Callable[[list[_ops.Query]], dict[str, Any]],
    extra: dict[str, Any],
    queries: list[_ops.Query],
) -> dict[str, Any]:
    return {**params(queries), **extra}


def _acquire_params(queries: list[_ops.Query]) -> dict[str, Any]:
    params = [query.params for query in queries]
    return {
        "keys": [p["key"] for p in params],  # type: ignore[index]
        "owners": [p["owner"] for p in params],  # type: ignore[index]
        "ttls_ms": [p["ttl_ms"] for p in params],  # type: ignore[index]
        "metadata": [p["metadata"] for p in params],  # type: ignore[index]
    }


def _release_params(queries: list[_ops.Query]) -> dict[str, Any]:
    params = [query.params for query in queries]
    return {
        "keys": [p["key"] for p in params],  # type: ignore[index]
        "owners": [p["owner"] for p in params],  # type: ignore[index]
    }


def _renew_params(queries: list[_ops.Query]) -> dict[str, Any]:
    return {**_release_params(queries), "ttls_ms": [q.params["ttl_ms"] for q in queries]}  # type: ignore[index]


def _rows_in_order(rows: list[Any], count: int) -> list[Any]:
    """One row per item, in item order: each member's row, as the single statement's."""
    if len(rows) != count:
        raise psycopg.DataError(f"a grouped statement returned {len(rows)} rows for {count}")
    return rows


def _positions(rows: list[Any], count: int) -> list[Any]:
    """Rows naming the items changed (1-based): each member's row count, 1 or 0."""
    counts = [0] * count
    for row in rows:
        counts[int(row[0]) - 1] = 1
    return counts


# -- running a group ---------------------------------------------------------------------


async def queued(  # noqa: PLR0917 (the provider's _send arguments, passed on)
    io: AsyncTransport,
    group: Group,
    key: str,
    operation: _ops.Operation[_T],
    again: Callable[..., _ops.Operation[_T]] | None,
    args: tuple[Any, ...],
) -> _T:
    """Run ``operation`` in ``group``'s next statement; what the call answers."""
    query = next(operation)  # the single statement, not sent: its parameters join a group
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    member = _Member(key, query, future)
    group.waiting.append(member)
    pump(io, group)
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
        return await _alone(io, reply, query, operation, again, args)
    try:
        follow_up = operation.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    # The operation goes on alone (a second read): on a connection of its own.
    return await io.run(_rest(follow_up, operation))


async def _alone(  # noqa: PLR0917 (the member's own, passed on)
    io: AsyncTransport,
    failed: _Failed,
    query: _ops.Query,
    operation: _ops.Operation[_T],
    again: Callable[..., _ops.Operation[_T]] | None,
    args: tuple[Any, ...],
) -> _T:
    """After the group's statement failed: the member's own policy, alone."""
    error = failed.error
    if isinstance(error, _ops.RETRIED):
        operation.close()
        if again is None:
            raise error  # it may have landed: an operation that may not run twice
        return await io.retry(again(*args), error)
    if failed.alone or not isinstance(error, psycopg.Error):
        operation.close()
        raise error  # its own statement's error, or the outcome is unknown
    # The group's transaction was rolled back: this member's statement, alone.
    return await io.run(_rest(query, operation), again, args)


def _rest(query: _ops.Query, operation: _ops.Operation[_T]) -> _ops.Operation[_T]:
    """``operation`` from its query ``query`` (already yielded) on: an operation again."""
    while True:
        try:
            reply = yield query
        except GeneratorExit:  # noqa: PERF203 (the loop is the operation's)
            operation.close()
            raise
        except BaseException as exc:  # noqa: BLE001 (thrown into the operation, as drive_async does)
            try:
                query = operation.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
        else:
            try:
                query = operation.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]


def pump(io: AsyncTransport, group: Group) -> None:
    """Send the next group if its kind has room in flight and calls wait for it."""
    while group.waiting and group.in_flight < IN_FLIGHT:
        members = group.take()
        if not members:
            return
        if len(members) > 1:
            group.grouped += 1
        sending = _Sending(members)
        for member in members:
            member.sending = sending
        sending.task = task = io.start(_send(io, group, members))
        # A callback, not the task's own code: it runs even if the task is cancelled
        # before its first step.
        task.add_done_callback(partial(_sent, io, group, members))


async def _send(io: AsyncTransport, group: Group, members: list[_Member]) -> list[Any]:
    """Send ``members`` as one statement (one member: its own); each member's reply."""
    if len(members) == 1:
        return [await io.exchange_once(members[0].query)]
    members.sort(key=_by_key)
    queries = [member.query for member in members]
    grouped = _ops.Query(group.statement, group.params(queries), "rows")
    return group.replies(await io.exchange_once(grouped), len(members))


def _sent(
    io: AsyncTransport, group: Group, members: list[_Member], task: asyncio.Task[Any]
) -> None:
    """A group's statement ended: hand out the replies (or the failure), free its keys."""
    if task.cancelled():
        replies: list[Any] = [_Failed(asyncio.CancelledError(), alone=True)] * len(members)
    elif (error := task.exception()) is not None:
        replies = [_Failed(error, alone=len(members) == 1)] * len(members)
    else:
        replies = task.result()
    _hand_out(members, replies)
    group.done(members)
    pump(io, group)


def _by_key(member: _Member) -> bytes:
    return member.query.params["key"]  # type: ignore[index,no-any-return]


def _hand_out(members: list[_Member], replies: list[Any]) -> None:
    for member, reply in zip(members, replies, strict=True):
        if not member.future.done():
            member.future.set_result(reply)


async def grouped(  # noqa: PLR0917 (the provider's _send arguments, passed on)
    io: AsyncTransport,
    group: Group,
    key: str,
    operation: _ops.Operation[_T],
    again: Callable[..., _ops.Operation[_T]] | None,
    args: tuple[Any, ...],
) -> _T:
    """Run ``operation`` of ``group`` on ``key``: at once, alone, if nothing of its kind
    is in flight and nothing waits; else in the next group."""
    if not group.free(key):
        return await queued(io, group, key, operation, again, args)
    group.enter(key)
    try:
        return await io.run(operation, again, args)
    finally:
        group.leave(key)
        if group.waiting:
            pump(io, group)
