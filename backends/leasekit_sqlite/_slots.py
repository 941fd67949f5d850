"""The SQLite backend's counting-lease operations (``leasekit.backend.SupportsSlots``).

Sans-I/O generators over :class:`~leasekit_sqlite._ops.Query`, as in ``_ops``: each
acquire and transfer is one ``BEGIN IMMEDIATE`` transaction (``_ops.transaction``)
that drops the key's expired slots, reads its state and writes its decision, with no
other writer in between; renew and release are one conditional statement each.
"""

from __future__ import annotations

from typing import Any

from leasekit import (
    EXCLUSIVE_INTENT_MS,
    SLOT_HOLDERS_SHOWN,
    SlotLimitMismatch,
    SlotResult,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)
from leasekit.backend import LeaseRecord, check_slot_acquire

from . import _sql
from ._ops import Op, Query, _changed, key_params, transaction

__all__ = [
    "acquire_slot",
    "release_slot",
    "release_slot_grant",
    "renew_slot",
    "slot_holders",
    "transfer_slot",
]


def acquire_slot(
    key: str, owner: str, ttl_ms: int, limit: int, exclusive: bool = False
) -> Op[SlotResult]:
    """Take one of ``limit`` slots of ``key`` (or, ``exclusive``, the key) for ``owner``.

    One IMMEDIATE transaction: the key's expired slots dropped, its state read, and the
    decision (the rules of ``leasekit.backend.SupportsSlots``) written.
    """
    check_slot_acquire(key, owner, ttl_ms, limit, exclusive)
    params = {**key_params(key, owner=owner), "ttl_ms": ttl_ms, "limit": limit}
    return transaction(_acquire_slot(key, owner, limit, exclusive, params))


def _acquire_slot(
    key: str, owner: str, limit: int, exclusive: bool, params: dict[str, Any]
) -> Op[SlotResult]:
    yield Query(_sql.SLOT_DROP_EXPIRED, params, "rowcount")
    state = yield Query(_sql.SLOT_STATE, params)
    stored_limit, last_token, held, mine, mine_exclusive, exclusives, claim = state
    if held and stored_limit != limit:
        # Raised inside the transaction: it rolls back, so nothing is written.
        raise SlotLimitMismatch(key=key, limit=limit, stored_limit=stored_limit)
    if mine is not None and (mine_exclusive or not exclusive):
        yield Query(_sql.SLOT_REFRESH, params, "rowcount")  # the caller's own, as it holds it
        return SlotResult(True, owner, int(mine), int(held), limit, (), bool(mine_exclusive))
    claimant = None if claim is None else bytes(claim).decode()
    others = int(held) - (mine is not None)
    token = (last_token or 0) + 1
    key_set = {"key": params["key"], "limit": limit, "token": token}
    if exclusive and not others and claimant in (None, owner):
        yield Query(_sql.SLOT_DROP_MINE, params, "rowcount")  # its shared slot, if any
        yield Query(_sql.SLOT_KEY_SET, key_set, "rowcount")
        yield Query(_sql.SLOT_INSERT, {**params, "token": token, "exclusive": 1}, "rowcount")
        return SlotResult(True, owner, token, 1, limit, (), True)
    if not exclusive and not exclusives and claimant is None and others < limit:
        yield Query(_sql.SLOT_KEY_SET, key_set, "rowcount")
        yield Query(_sql.SLOT_INSERT, {**params, "token": token, "exclusive": 0}, "rowcount")
        return SlotResult(True, owner, token, int(held) + 1, limit)
    if exclusive and claimant in (None, owner):
        claim_params = {**params, "intent_ms": min(params["ttl_ms"], EXCLUSIVE_INTENT_MS)}
        yield Query(_sql.SLOT_CLAIM, claim_params, "rowcount")
    window = {"key": params["key"], "holders": SLOT_HOLDERS_SHOWN}
    rows = yield Query(_sql.SLOT_HOLDERS, window, "rows")
    holders = tuple(bytes(row[0]).decode() for row in rows)
    waiting = claimant if claimant != owner else None
    return SlotResult(False, None, None, int(held), limit, holders, bool(exclusives), waiting)


def renew_slot(key: str, owner: str, ttl_ms: int) -> Op[bool]:
    """Reset the TTL of ``owner``'s live slot of ``key``; whether it held one."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    return _changed(_sql.SLOT_RENEW, {**key_params(key, owner=owner), "ttl_ms": ttl_ms})


def release_slot(key: str, owner: str) -> Op[bool]:
    """Free ``owner``'s live slot of ``key``; whether it held one."""
    validate_key(key)
    validate_owner(owner)
    return _changed(_sql.SLOT_RELEASE, key_params(key, owner=owner))


def release_slot_grant(key: str, owner: str, token: int) -> Op[bool]:
    """Free ``owner``'s live slot of ``key`` only if it carries fencing token ``token``."""
    validate_key(key)
    validate_owner(owner)
    return _changed(_sql.SLOT_RELEASE_GRANT, {**key_params(key, owner=owner), "token": token})


def transfer_slot(key: str, from_owner: str, to_owner: str, ttl_ms: int) -> Op[bool]:
    """Hand ``from_owner``'s live slot to ``to_owner`` with a new token; whether it moved."""
    validate_key(key)
    validate_owner(from_owner, "from_owner")
    validate_owner(to_owner, "to_owner")
    validate_ttl_ms(ttl_ms)
    if from_owner == to_owner:
        return renew_slot(key, from_owner, ttl_ms)
    params = {**key_params(key, from_owner=from_owner, to_owner=to_owner), "ttl_ms": ttl_ms}
    return transaction(_transfer_slot(params))


def _transfer_slot(params: dict[str, Any]) -> Op[bool]:
    yield Query(_sql.SLOT_DROP_EXPIRED, params, "rowcount")
    from_state = yield Query(_sql.SLOT_STATE, {**params, "owner": params["from_owner"]})
    last_token, mine = from_state[1], from_state[3]
    if mine is None:
        return False
    to_state = yield Query(_sql.SLOT_STATE, {**params, "owner": params["to_owner"]})
    if to_state[3] is not None:
        return False  # the successor holds a slot of its own already
    token = int(last_token) + 1
    yield Query(_sql.SLOT_ADVANCE, {"key": params["key"], "token": token}, "rowcount")
    moved: int = yield Query(_sql.SLOT_TRANSFER, {**params, "token": token}, "rowcount")
    return moved == 1


def slot_holders(key: str) -> Op[list[LeaseRecord]]:
    """The live slots of ``key`` (time left by the host clock), in grant order."""
    validate_key(key)
    return _slot_holders(key, key_params(key))


def _slot_holders(key: str, params: dict[str, Any]) -> Op[list[LeaseRecord]]:
    rows = yield Query(_sql.SLOT_RECORDS, params, "rows")
    return [
        LeaseRecord(key, bytes(owner_).decode(), int(token), max(1, int(left)))
        for owner_, token, left in rows
    ]
