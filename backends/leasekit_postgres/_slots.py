"""The PostgreSQL backend's counting leases and fair waiting, as operations (no I/O).

Each acquire, slot transfer and fair acquire is one call of a PL/pgSQL function (see
``_sql._SLOT_SCHEMA``): one statement, one round trip, one transaction, with the key's
lock taken first; renew, release and the holders' read are one plain statement each.
"""

from __future__ import annotations

from leasekit import (
    EXCLUSIVE_INTENT_MS,
    SLOT_HOLDERS_SHOWN,
    LeaseBackendError,
    LeaseResult,
    SlotLimitMismatch,
    SlotResult,
    validate_key,
    validate_metadata,
    validate_owner,
    validate_ttl_ms,
)
from leasekit.backend import LeaseRecord, check_slot_acquire

from . import _sql
from ._ops import Operation, Query
from ._options import BACKEND

__all__ = [
    "acquire_in_turn",
    "acquire_slot",
    "release_slot",
    "release_slot_grant",
    "renew_slot",
    "slot_holders",
    "transfer_slot",
]


def acquire_slot(  # noqa: PLR0917 (its retry rebuilds it from one tuple of arguments)
    sql: _sql.Statements, key: str, owner: str, ttl_ms: int, limit: int, exclusive: bool = False
) -> Operation[SlotResult]:
    """Take one of ``limit`` slots of ``key`` (or, ``exclusive``, the key) for ``owner``:
    one function call, which locks the key's row, then counts, decides and writes."""
    check_slot_acquire(key, owner, ttl_ms, limit, exclusive)
    params = {
        "key": key.encode(),
        "owner": owner.encode(),
        "ttl_ms": ttl_ms,
        "limit": limit,
        "exclusive": exclusive,
        "intent_ms": min(ttl_ms, EXCLUSIVE_INTENT_MS),
        "shown": SLOT_HOLDERS_SHOWN,
    }
    return _acquire_slot(sql, key, owner, limit, params)


def _acquire_slot(
    sql: _sql.Statements, key: str, owner: str, limit: int, params: dict[str, object]
) -> Operation[SlotResult]:
    row = yield Query(sql.slot_acquire, params)
    if row is None:
        raise LeaseBackendError("the server returned no row", backend=BACKEND, key=key)
    acquired, token, held, stored_limit, holders, exclusive, waiting = row
    if stored_limit != limit:
        raise SlotLimitMismatch(key=key, limit=limit, stored_limit=int(stored_limit))
    if acquired:
        return SlotResult(True, owner, int(token), int(held), limit, (), bool(exclusive))
    return SlotResult(
        False,
        None,
        None,
        int(held),
        limit,
        tuple(bytes(holder).decode() for holder in holders or ()),
        bool(exclusive),
        None if waiting is None else bytes(waiting).decode(),
    )


def renew_slot(sql: _sql.Statements, key: str, owner: str, ttl_ms: int) -> Operation[bool]:
    """Reset the TTL of ``owner``'s live slot of ``key``; whether it held one."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    params = {"key": key.encode(), "owner": owner.encode(), "ttl_ms": ttl_ms}
    return _changed(Query(sql.slot_renew, params, "rowcount"))


def release_slot(sql: _sql.Statements, key: str, owner: str) -> Operation[bool]:
    """Free ``owner``'s live slot of ``key``; whether it held one."""
    validate_key(key)
    validate_owner(owner)
    params = {"key": key.encode(), "owner": owner.encode()}
    return _changed(Query(sql.slot_release, params, "rowcount"))


def release_slot_grant(sql: _sql.Statements, key: str, owner: str, token: int) -> Operation[bool]:
    """Free ``owner``'s live slot of ``key`` only if it carries fencing token ``token``."""
    validate_key(key)
    validate_owner(owner)
    params = {"key": key.encode(), "owner": owner.encode(), "token": token}
    return _changed(Query(sql.slot_release_grant, params, "rowcount"))


def _changed(query: Query) -> Operation[bool]:
    changed: int = yield query
    return changed == 1


def transfer_slot(
    sql: _sql.Statements, key: str, from_owner: str, to_owner: str, ttl_ms: int
) -> Operation[bool]:
    """Hand ``from_owner``'s live slot to ``to_owner`` with a new token; whether it moved.

    False, nothing changed, if ``to_owner`` holds a slot of its own already.
    """
    validate_key(key)
    validate_owner(from_owner, "from_owner")
    validate_owner(to_owner, "to_owner")
    validate_ttl_ms(ttl_ms)
    if from_owner == to_owner:
        return renew_slot(sql, key, from_owner, ttl_ms)
    params = {
        "key": key.encode(),
        "from_owner": from_owner.encode(),
        "to_owner": to_owner.encode(),
        "ttl_ms": ttl_ms,
    }
    return _transfer_slot(Query(sql.slot_transfer, params))


def _transfer_slot(query: Query) -> Operation[bool]:
    row = yield query
    return row is not None and bool(row[0])


def slot_holders(sql: _sql.Statements, key: str) -> Operation[list[LeaseRecord]]:
    """The live slots of ``key`` (time left by the server's clock), in grant order."""
    validate_key(key)
    return _slot_holders(sql, key)


def _slot_holders(sql: _sql.Statements, key: str) -> Operation[list[LeaseRecord]]:
    rows = yield Query(sql.slot_records, {"key": key.encode()}, "rows")
    return [
        LeaseRecord(key, bytes(owner).decode(), int(token), max(1, int(left)))
        for owner, token, left in rows
    ]


def acquire_in_turn(  # noqa: PLR0917 (its retry rebuilds it from one tuple of arguments)
    sql: _sql.Statements,
    key: str,
    owner: str,
    ttl_ms: int,
    place_ttl_ms: int,
    metadata: bytes | str | None = None,
    channel: str | None = None,
) -> Operation[LeaseResult]:
    """``acquire`` in arrival order: one function call that locks the key's line (an
    advisory lock), grants the lease if it is free and nobody with a live place is
    ahead, and otherwise keeps or adds the caller's place. With a ``channel``, a grant
    that changed hands sends the grant hint, as ``acquire`` does."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    validate_ttl_ms(place_ttl_ms, "place_ttl_ms")
    data = None if metadata is None else validate_metadata(metadata)
    params = {
        "key": key.encode(),
        "owner": owner.encode(),
        "ttl_ms": ttl_ms,
        "place_ttl_ms": place_ttl_ms,
        "metadata": data,
        "channel": channel,
    }
    return _acquire_in_turn(sql, key, owner, data, params)


def _acquire_in_turn(
    sql: _sql.Statements,
    key: str,
    owner: str,
    data: bytes | None,
    params: dict[str, object],
) -> Operation[LeaseResult]:
    row = yield Query(sql.acquire_in_turn, params)
    if row is None:
        raise LeaseBackendError("the server returned no row", backend=BACKEND, key=key)
    token, holder, held_with = row
    if token is not None:
        return LeaseResult(True, owner, int(token), data)
    if holder is None:
        return LeaseResult(False, None, None)
    return LeaseResult(
        False, bytes(holder).decode(), None, None if held_with is None else bytes(held_with)
    )
