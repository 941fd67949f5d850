"""The Redis backend's counting-lease operations (``leasekit.backend.SupportsSlots``).

Sans-I/O generators as in ``_ops``, one script of ``_lua`` each (``SLOT_*``): the
key's expired slots dropped, its state read and the decision written in one atomic
step on the server's clock, in one round trip. The sorted set of slots and the hash of
their tokens carry the lease name's hash tag, so on a Cluster they share a slot.
"""

from __future__ import annotations

from leasekit import (
    EXCLUSIVE_INTENT_MS,
    SlotLimitMismatch,
    SlotResult,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)
from leasekit.backend import LeaseRecord, Operation, check_slot_acquire

from . import _keys, _lua
from ._ops import (
    GarbledReply,
    OpContext,
    Request,
    ScriptCall,
    _check_acks,
    _flag,
    _garbled,
    _text,
    _writing,
)

__all__ = [
    "acquire_slot",
    "release_slot",
    "release_slot_grant",
    "renew_slot",
    "slot_holders",
    "transfer_slot",
]

SLOTS_SUFFIX = b":slots"
SLOT_INFO_SUFFIX = b":slotinfo"


def slot_names(prefix: bytes, key: str) -> tuple[bytes, bytes]:
    """The sorted set of ``key``'s slots and the hash of their tokens and state."""
    lease = _keys.lease_name(prefix, key)
    return lease + SLOTS_SUFFIX, lease + SLOT_INFO_SUFFIX


def _counter_ttl(ctx: OpContext) -> int:
    return -1 if ctx.counter_ttl_ms is None else ctx.counter_ttl_ms


def acquire_slot(
    ctx: OpContext, key: str, owner: str, ttl_ms: int, *, limit: int, exclusive: bool = False
) -> Operation[Request, SlotResult]:
    """``SLOT_ACQUIRE``: one of ``limit`` slots of ``key`` (with ``exclusive``, the key)."""
    check_slot_acquire(key, owner, ttl_ms, limit, exclusive)
    args = (
        owner.encode(),
        ttl_ms,
        limit,
        b"1" if exclusive else b"0",
        _counter_ttl(ctx),
        min(ttl_ms, EXCLUSIVE_INTENT_MS),
    )
    call = ScriptCall(_lua.SLOT_ACQUIRE, slot_names(ctx.raw_prefix, key), args)
    return _acquire_slot(ctx, _writing(ctx, call), key, owner, limit)


def _acquire_slot(
    ctx: OpContext, request: Request, key: str, owner: str, limit: int
) -> Operation[Request, SlotResult]:
    reply = yield request
    if ctx.wait is not None:
        reply, acks = reply
        if isinstance(reply, list) and reply and reply[0] == 1:
            _check_acks(ctx, key, acks)
    try:
        if not isinstance(reply, list) or not reply or not isinstance(reply[0], int):
            raise GarbledReply(f"unexpected reply {reply!r:.80}")
        if reply[0] == 2 and len(reply) == 2:
            raise SlotLimitMismatch(key=key, limit=limit, stored_limit=int(reply[1]))
        if reply[0] == 1 and len(reply) == 4:
            _, token, held, exclusive = reply
            return SlotResult(True, owner, int(token), int(held), limit, (), bool(exclusive))
        if reply[0] == 0 and len(reply) >= 5:
            _, held, stored, exclusive, waiting, *holders = reply
            return SlotResult(
                False,
                None,
                None,
                int(held),
                int(stored),
                tuple(_text(holder) for holder in holders),
                bool(exclusive),
                _text(waiting) or None,
            )
        raise GarbledReply(f"unexpected reply {reply!r:.80}")
    except GarbledReply as exc:
        raise _garbled(ctx, key, exc) from exc


def renew_slot(ctx: OpContext, key: str, owner: str, ttl_ms: int) -> Operation[Request, bool]:
    """``SLOT_RENEW`` of ``owner``'s live slot of ``key``: True when it held one."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    args = (owner.encode(), ttl_ms, _counter_ttl(ctx))
    call = ScriptCall(_lua.SLOT_RENEW, slot_names(ctx.raw_prefix, key), args)
    return _flag(ctx, _writing(ctx, call), key)


def release_slot(ctx: OpContext, key: str, owner: str) -> Operation[Request, bool]:
    """``SLOT_RELEASE`` of ``owner``'s live slot of ``key``: True when it held one."""
    validate_key(key)
    validate_owner(owner)
    call = ScriptCall(_lua.SLOT_RELEASE, slot_names(ctx.raw_prefix, key), (owner.encode(), b""))
    return _flag(ctx, call, key)


def release_slot_grant(
    ctx: OpContext, key: str, owner: str, token: int
) -> Operation[Request, bool]:
    """``SLOT_RELEASE`` of ``owner``'s slot of ``key`` only if it carries ``token``."""
    validate_key(key)
    validate_owner(owner)
    args = (owner.encode(), b"%d" % token)
    call = ScriptCall(_lua.SLOT_RELEASE, slot_names(ctx.raw_prefix, key), args)
    return _flag(ctx, call, key)


def transfer_slot(
    ctx: OpContext, key: str, from_owner: str, to_owner: str, ttl_ms: int
) -> Operation[Request, bool]:
    """``SLOT_TRANSFER`` of ``from_owner``'s live slot to ``to_owner`` (a new token)."""
    validate_key(key)
    validate_owner(from_owner, "from_owner")
    validate_owner(to_owner, "to_owner")
    validate_ttl_ms(ttl_ms)
    args = (from_owner.encode(), to_owner.encode(), ttl_ms, _counter_ttl(ctx))
    call = ScriptCall(_lua.SLOT_TRANSFER, slot_names(ctx.raw_prefix, key), args)
    return _flag(ctx, _writing(ctx, call), key)


def slot_holders(ctx: OpContext, key: str) -> Operation[Request, list[LeaseRecord]]:
    """``SLOT_HOLDERS``: the live slots of ``key``, in grant order."""
    validate_key(key)
    call = ScriptCall(_lua.SLOT_HOLDERS, slot_names(ctx.raw_prefix, key), ())
    return _slot_holders(ctx, call, key)


def _slot_holders(
    ctx: OpContext, call: ScriptCall, key: str
) -> Operation[Request, list[LeaseRecord]]:
    reply = yield call
    try:
        if not isinstance(reply, list) or len(reply) % 3:
            raise GarbledReply(f"unexpected reply {reply!r:.80}")
        slots: list[tuple[int, str, int]] = []
        for owner, token, left in zip(reply[::3], reply[1::3], reply[2::3], strict=True):
            if not isinstance(token, int) or not isinstance(left, int):
                raise GarbledReply(f"unexpected reply {reply!r:.80}")
            slots.append((token, _text(owner), max(1, left)))
    except GarbledReply as exc:
        raise _garbled(ctx, key, exc) from exc
    slots.sort()
    return [LeaseRecord(key, owner, token, left) for token, owner, left in slots]
