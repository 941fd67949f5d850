"""The MySQL/MariaDB backend's counting leases and fair waiting, as operations (no I/O).

Each acquire, slot transfer and fair acquire is one ``CALL`` of a stored procedure
(``_sql.Statements._slots``): one round trip, one transaction inside it that locks the
key's row first; renew, release and the holders' read are one plain statement each.
Retried as the contract's operations are (``_ops._retrying``): after a deadlock, and
once after a lost connection unless the operation may not run twice (a transfer).
"""

from __future__ import annotations

from typing import Any

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

from ._ops import Op, Statement, Statements, _retrying
from ._options import BACKEND

_HOLDERS_ATTEMPTS = 20
"""How many times a ``get_slot_holders`` read runs when it is a deadlock's victim."""

__all__ = [
    "acquire_in_turn",
    "acquire_slot",
    "release_slot",
    "release_slot_grant",
    "renew_slot",
    "slot_holders",
    "transfer_slot",
]


def acquire_slot(  # noqa: PLR0917 (the protocol's arguments)
    sql: Statements, key: str, owner: str, ttl_ms: int, limit: int, exclusive: bool = False
) -> Op[SlotResult]:
    """Take one of ``limit`` slots of ``key`` (or, ``exclusive``, the key) for ``owner``:
    one procedure call, which locks the key's row, then counts, decides and writes."""
    check_slot_acquire(key, owner, ttl_ms, limit, exclusive)
    params = {
        "key": key.encode(),
        "owner": owner.encode(),
        "ttl_us": ttl_ms * 1000,
        "limit": limit,
        "exclusive": exclusive,
        "intent_us": min(ttl_ms, EXCLUSIVE_INTENT_MS) * 1000,
        "shown": SLOT_HOLDERS_SHOWN,
    }
    return _retrying(_acquire_slot, sql, key, owner, limit, params)


def _acquire_slot(
    sql: Statements, key: str, owner: str, limit: int, params: dict[str, Any]
) -> Op[SlotResult]:
    row = yield Statement(sql().slot_acquire, params, "call")
    if row is None:
        raise LeaseBackendError("the server returned no row", backend=BACKEND, key=key)
    acquired, token, held, stored_limit, holders, exclusive, waiting = row
    if int(stored_limit) != limit:
        raise SlotLimitMismatch(key=key, limit=limit, stored_limit=int(stored_limit))
    if acquired:
        return SlotResult(True, owner, int(token), int(held), limit, (), bool(exclusive))
    names = (
        ()
        if not holders
        else tuple(bytes.fromhex(str(holder)).decode() for holder in str(holders).split(","))
    )
    return SlotResult(
        False,
        None,
        None,
        int(held),
        limit,
        names,
        bool(exclusive),
        None if waiting is None else bytes(waiting).decode(),
    )


def renew_slot(sql: Statements, key: str, owner: str, ttl_ms: int) -> Op[bool]:
    """Reset the TTL of ``owner``'s live slot of ``key``; whether it held one."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    params = {"key": key.encode(), "owner": owner.encode(), "ttl_us": ttl_ms * 1000}
    return _retrying(_changed, sql, "slot_renew", params)


def release_slot(sql: Statements, key: str, owner: str) -> Op[bool]:
    """Free ``owner``'s live slot of ``key``; whether it held one (not retried after a
    lost connection: a release that ran would answer False the second time)."""
    validate_key(key)
    validate_owner(owner)
    params = {"key": key.encode(), "owner": owner.encode()}
    return _retrying(_changed, sql, "slot_release", params, idempotent=False)


def release_slot_grant(sql: Statements, key: str, owner: str, token: int) -> Op[bool]:
    """Free ``owner``'s live slot of ``key`` only if it carries fencing token ``token``."""
    validate_key(key)
    validate_owner(owner)
    params = {"key": key.encode(), "owner": owner.encode(), "token": token}
    return _retrying(_changed, sql, "slot_release_grant", params)


def _changed(sql: Statements, name: str, params: dict[str, Any]) -> Op[bool]:
    changed = yield Statement(getattr(sql(), name), params, "rowcount")
    return bool(changed == 1)


def transfer_slot(
    sql: Statements, key: str, from_owner: str, to_owner: str, ttl_ms: int
) -> Op[bool]:
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
        "ttl_us": ttl_ms * 1000,
    }
    return _retrying(_transfer_slot, sql, params, idempotent=False)


def _transfer_slot(sql: Statements, params: dict[str, Any]) -> Op[bool]:
    row = yield Statement(sql().slot_transfer, params, "call")
    return row is not None and bool(row[0])


def slot_holders(sql: Statements, key: str) -> Op[list[LeaseRecord]]:
    """The live slots of ``key`` (time left by the server's clock), in grant order."""
    validate_key(key)
    # A locking read (one instant, see _sql.slot_records): its shared locks can close a
    # cycle with a take that deletes an expired slot, and the read, which wrote
    # nothing, is the victim. It only runs again, as often as it takes on a hot key
    # (3 attempts in a row were victims with 64 callers on one key).
    return _retrying(_slot_holders, sql, key, attempts=_HOLDERS_ATTEMPTS)


def _slot_holders(sql: Statements, key: str) -> Op[list[LeaseRecord]]:
    rows = yield Statement(sql().slot_records, {"key": key.encode()}, "rows")
    return [
        LeaseRecord(key, bytes(owner).decode(), int(token), max(1, int(left)))
        for owner, token, left in rows
    ]


def acquire_in_turn(  # noqa: PLR0917 (the protocol's arguments, and the metadata)
    sql: Statements,
    key: str,
    owner: str,
    ttl_ms: int,
    place_ttl_ms: int,
    metadata: bytes | str | None = None,
) -> Op[LeaseResult]:
    """``acquire`` in arrival order: one procedure call that locks the key's line (its
    row in ``<table>_line_keys``), grants the lease if it is free and nobody with a
    live place is ahead, and otherwise keeps or adds the caller's place."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    validate_ttl_ms(place_ttl_ms, "place_ttl_ms")
    data = None if metadata is None else validate_metadata(metadata)
    params = {
        "key": key.encode(),
        "owner": owner.encode(),
        "ttl_us": ttl_ms * 1000,
        "place_us": place_ttl_ms * 1000,
        "metadata": data,
    }
    return _retrying(_acquire_in_turn, sql, key, owner, data, params)


def _acquire_in_turn(
    sql: Statements, key: str, owner: str, data: bytes | None, params: dict[str, Any]
) -> Op[LeaseResult]:
    row = yield Statement(sql().acquire_in_turn, params, "call")
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
