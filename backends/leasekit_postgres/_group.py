"""Operations that arrive together, decided together: the asyncio provider's groups.

The queueing is the toolkit's (:mod:`leasekit.backend._group`, shared with MySQL);
this module is what is PostgreSQL's: the grouped statements' parameters, how their
rows split into each member's reply, and what a member does after its group failed.

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

from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import psycopg

from leasekit.backend import GROUP_IN_FLIGHT, MAX_GROUP, Group, resume

from . import _ops
from ._sql import Statements

__all__ = ["IN_FLIGHT", "MAX_GROUP", "Groups", "recover"]

_T = TypeVar("_T")

IN_FLIGHT = GROUP_IN_FLIGHT
"""Statements of one kind a provider has in flight at once, alone or grouped."""


class Groups:
    """The provider's three groups, built for its statements and notification channel.

    ``lock_wait_ms``: how long a group's statement waits for a row another transaction
    keeps locked before its members go alone.
    """

    __slots__ = ("acquire", "release", "renew")

    def __init__(self, sql: Statements, channel: str | None, lock_wait_ms: int) -> None:
        extra: dict[str, Any] = {"lock_timeout": f"{lock_wait_ms}ms"}
        self.acquire: Group[_ops.Query] = Group(
            partial(
                _send,
                sql.acquire_group if channel is None else sql.acquire_group_notify,
                partial(_with, _acquire_params, extra),
                _rows_in_order,
            )
        )
        if channel is None:
            release = partial(_with, _release_params, extra)
            self.release: Group[_ops.Query] = Group(
                partial(_send, sql.release_group, release, _positions)
            )
        else:
            release = partial(_with, _release_params, {**extra, "channel": channel})
            self.release = Group(partial(_send, sql.release_group_notify, release, _positions))
        self.renew: Group[_ops.Query] = Group(
            partial(_send, sql.renew_group, partial(_with, _renew_params, extra), _positions)
        )


async def _send(
    statement: bytes,
    params: Callable[[list[_ops.Query]], dict[str, Any]],
    replies: Callable[[list[Any], int], list[Any]],
    io: Any,
    queries: list[_ops.Query],
) -> list[Any]:
    """Send ``queries`` (sorted by key) as one statement (one query: its own); each
    member's reply."""
    if len(queries) == 1:
        return [await io.exchange_once(queries[0])]
    grouped = _ops.Query(statement, params(queries), "rows")
    return replies(await io.exchange_once(grouped), len(queries))


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


async def recover(  # noqa: PLR0917 (the member's own, passed on)
    io: Any,
    error: BaseException,
    alone: bool,
    query: _ops.Query,
    operation: _ops.Operation[_T],
    again: Callable[..., _ops.Operation[_T]] | None,
    args: tuple[Any, ...],
) -> _T:
    """After the member's statement (or its group's) failed: its own policy, alone."""
    if isinstance(error, _ops.RETRIED):
        operation.close()
        if again is None:
            raise error  # it may have landed: an operation that may not run twice
        return await io.retry(again(*args), error)  # type: ignore[no-any-return]
    if alone or not isinstance(error, psycopg.Error):
        operation.close()
        raise error  # its own statement's error, or the outcome is unknown
    # The group's transaction was rolled back: this member's statement, alone.
    return await io.run(resume(query, operation), again, args)  # type: ignore[no-any-return]
