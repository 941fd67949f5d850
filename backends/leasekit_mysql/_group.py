"""Acquires, releases and renewals that arrive together, decided together (asyncio only).

The queueing is the toolkit's (:mod:`leasekit.backend._group`: arrival order per key,
each caller's own deadline and cancellation, a failed group's members alone). This
module is what is MySQL's: the grouped statements and how their replies split into
each member's reply, the one its single statement (``_sql``) would have given.

A group is one multi-statement request (asyncmy always connects with
``CLIENT_MULTI_STATEMENTS``): one round trip, one transaction. The members' parameters
form a derived table ``j`` (``SELECT %(k0)s AS k, ... UNION ALL SELECT ...``, one row
per member, keys distinct and sorted), so the text is rendered once per group size.

- **Acquire**: ``INSERT ... SELECT ... FROM j ON DUPLICATE KEY UPDATE`` with the single
  statement's expressions, row by row: each row's ``token`` assignment decides (after
  its row lock, by ``SYSDATE``) and records the decision in ``LAST_INSERT_ID``, and
  that row's later assignments read it back, exactly as in the single statement (the
  session's ``LAST_INSERT_ID`` is set anew for every row). Then ``SELECT`` of the keys,
  in the same transaction, under the locks the insert took: a key's row names the
  member's owner if and only if it was granted (a denial leaves a live lease of another
  owner; a grant of any kind writes the member's owner), and its token is the grant's.
  The rows are inserted in key order, so every acquire group locks in one order.
- **Release, renewal**: the rows locked first (``SELECT ... FOR UPDATE`` by primary key,
  in key order), then the server's time read once (``@leasekit_now``) and the decision
  made against it by a ``SELECT`` of the members' rows that are live and theirs (each
  row's member found by its key's position, ``FIELD``/``ELT``), and the ``UPDATE``
  applied to exactly those rows (the same condition, the same instant, rows still
  locked). A renewal's new expiry is computed after, by ``SYSDATE``, as alone.

The transaction is ``READ COMMITTED`` (no gap locks for missing keys) and waits at most
:data:`LOCK_WAIT_S` for a row another transaction keeps locked, after which the group
fails and each member runs its own statement alone. A group whose request failed is
never reused: its connection is closed, so an unfinished transaction is rolled back.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from typing import Any, Protocol

from ._ops import Request
from ._sql import NOW_UTC, Statements


class AioTransport(Protocol):
    """What a group is sent through: ``_aio.AioTransport`` (a protocol, so this module
    does not import the transport that imports it)."""

    def group_statements(self) -> GroupStatements: ...

    def exchange_one(self, request: Request) -> Coroutine[Any, Any, Any]: ...

    async def exchange_group(self, sql: str, params: Mapping[str, Any]) -> list[Any]: ...


__all__ = ["LOCK_WAIT_S", "GroupStatements", "send_acquires", "send_releases", "send_renewals"]

LOCK_WAIT_S = 1
"""How long (whole seconds: ``innodb_lock_wait_timeout``) a group's statement waits for
a row another transaction keeps locked before its members go alone."""

_BEGIN = (
    "SET @leasekit_wait = @@innodb_lock_wait_timeout,"
    " innodb_lock_wait_timeout = {lock_wait_s};\n"
    "SET TRANSACTION ISOLATION LEVEL READ COMMITTED;\n"
    "START TRANSACTION;\n"
)
_END = ";\nCOMMIT;\nSET innodb_lock_wait_timeout = @leasekit_wait"


def _rows(count: int, columns: tuple[str, ...]) -> str:
    """The derived table of ``count`` members: ``columns`` (k, o, ...), each
    ``%(<column><position>)s``."""
    first = ", ".join(f"%({c}0)s AS {c}" for c in columns)
    rows = [f"SELECT {first}"]
    rows.extend("SELECT " + ", ".join(f"%({c}{n})s" for c in columns) for n in range(1, count))
    return " UNION ALL ".join(rows)


def _keys(count: int) -> str:
    return ", ".join(f"%(k{n})s" for n in range(count))


def _pick(count: int, column: str) -> str:
    """The member's ``column`` parameter for the row's key (its position among the keys)."""
    values = ", ".join(f"%({column}{n})s" for n in range(count))
    return f"ELT(FIELD(lease_key, {_keys(count)}), {values})"


class GroupStatements:
    """The grouped statements of one table, rendered once per group size.

    ``lock_wait_s``: how long a group waits for a row lock (:data:`LOCK_WAIT_S`).
    """

    __slots__ = ("_acquire", "_begin", "_end", "_release", "_renew", "sql")

    def __init__(self, sql: Statements, lock_wait_s: int = LOCK_WAIT_S) -> None:
        self.sql = sql
        self._begin = _BEGIN.format(lock_wait_s=int(lock_wait_s))
        self._end = _END
        self._acquire: dict[int, str] = {}
        self._release: dict[int, str] = {}
        self._renew: dict[int, str] = {}

    def acquire(self, count: int) -> str:
        """``count`` acquires -> the rows ``(lease_key, owner, token)`` of their keys."""
        text = self._acquire.get(count)
        if text is None:
            t, s = self.sql.table.quoted(), self.sql
            expires = f"{NOW_UTC} + INTERVAL j.ttl MICROSECOND"
            text = self._acquire[count] = (
                f"{self._begin}"
                f"INSERT INTO {t} (lease_key, owner, token, expires_at, metadata)"
                f" SELECT j.k, j.o, LAST_INSERT_ID({s.fresh_row}), {expires}, j.m"
                f" FROM ({_rows(count, ('k', 'o', 'ttl', 'm'))}) AS j"
                " ON DUPLICATE KEY UPDATE"
                f" token = IF(expires_at <= {NOW_UTC}, LAST_INSERT_ID({s.fresh}),"
                " IF(owner = j.o, LAST_INSERT_ID(token), token + LAST_INSERT_ID(0))),"
                " owner = IF(LAST_INSERT_ID() = 0, owner, j.o),"
                f" expires_at = IF(LAST_INSERT_ID() = 0, expires_at, {expires}),"
                " metadata = IF(LAST_INSERT_ID() = 0, metadata, j.m);\n"
                f"SELECT lease_key, owner, token FROM {t} WHERE lease_key IN ({_keys(count)})"
                f"{self._end}"
            )
        return text

    def _update(self, count: int, assignments: str) -> str:
        t, keys = self.sql.table.quoted(), _keys(count)
        mine = f"lease_key IN ({keys}) AND owner = {_pick(count, 'o')}"
        return (
            f"{self._begin}"
            f"SELECT 1 FROM {t} FORCE INDEX (PRIMARY) WHERE lease_key IN ({keys})"
            " ORDER BY lease_key FOR UPDATE;\n"
            f"SET @leasekit_now = {NOW_UTC};\n"
            f"SELECT FIELD(lease_key, {keys}) - 1 FROM {t}"
            f" WHERE {mine} AND expires_at > @leasekit_now;\n"
            f"UPDATE {t} SET {assignments} WHERE {mine} AND expires_at > @leasekit_now"
            f"{self._end}"
        )

    def release(self, count: int) -> str:
        """``count`` releases -> the positions ``(i,)`` of the members released."""
        text = self._release.get(count)
        if text is None:
            assignments = f"expires_at = {NOW_UTC}, metadata = NULL"
            text = self._release[count] = self._update(count, assignments)
        return text

    def renew(self, count: int) -> str:
        """``count`` renewals -> the positions ``(i,)`` of the members renewed."""
        text = self._renew.get(count)
        if text is None:
            assignments = f"expires_at = {NOW_UTC} + INTERVAL {_pick(count, 'ttl')} MICROSECOND"
            text = self._renew[count] = self._update(count, assignments)
        return text


def _params(requests: list[Request], names: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for n, (_, values, _) in enumerate(requests):
        assert values is not None
        for short, name in names:
            params[f"{short}{n}"] = values.get(name)
    return params


_ACQUIRE = (("k", "key"), ("o", "owner"), ("ttl", "ttl_us"), ("m", "metadata"))
_RELEASE = (("k", "key"), ("o", "owner"))
_RENEW = (("k", "key"), ("o", "owner"), ("ttl", "ttl_us"))


async def send_acquires(io: AioTransport, requests: list[Request]) -> list[Any]:
    """Each acquire's reply as its single statement's: the token if granted, else 0."""
    if len(requests) == 1:
        return [await io.exchange_one(requests[0])]
    text = io.group_statements().acquire(len(requests))
    rows = await io.exchange_group(text, _params(requests, _ACQUIRE))
    decided = {bytes(key): (bytes(owner), int(token)) for key, owner, token in rows}
    replies: list[Any] = []
    for _, params, _ in requests:
        assert params is not None
        owner, token = decided[params["key"]]
        replies.append(token if owner == params["owner"] else 0)
    return replies


async def send_releases(io: AioTransport, requests: list[Request]) -> list[Any]:
    """Each release's reply as its single statement's: its row count, 1 or 0."""
    if len(requests) == 1:
        return [await io.exchange_one(requests[0])]
    text = io.group_statements().release(len(requests))
    return _positions(await io.exchange_group(text, _params(requests, _RELEASE)), len(requests))


async def send_renewals(io: AioTransport, requests: list[Request]) -> list[Any]:
    """Each renewal's reply as its single statement's: its row count, 1 or 0."""
    if len(requests) == 1:
        return [await io.exchange_one(requests[0])]
    text = io.group_statements().renew(len(requests))
    return _positions(await io.exchange_group(text, _params(requests, _RENEW)), len(requests))


def _positions(rows: list[Any], count: int) -> list[int]:
    counts = [0] * count
    for (position,) in rows:
        counts[int(position)] = 1
    return counts
