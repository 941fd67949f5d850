"""The etcd backend's counting-lease operations (``leasekit.backend.SupportsSlots``).

Sans-I/O generators as in ``_ops``, run by the same transports. The layout, in the
slot range ``S(k)`` of the counting key ``k`` (``_keys.slot_range``), apart from the
key's lease records:

- ``S(k)h<o>``: owner ``o``'s slot, bound to an etcd lease of its own (the slot's
  TTL, as a lease record's), with the value ``<limit>`` (``<limit> x`` when held
  exclusively). Its ``create_revision`` is the slot's fencing token, and etcd deletes
  it when its etcd lease runs out: that is the slot's expiry, on the leader's clock.
  The key's limit is the one its live slots carry, so it goes with the last of them.
- ``S(k)c``: a denied exclusive acquirer's claim to go next, valued its owner, bound
  to an etcd lease of ``min(ttl_ms, EXCLUSIVE_INTENT_MS)`` (whole seconds, at least
  etcd's minimum): it lapses with that etcd lease.
- ``S(k)g``: the key's generation, on no etcd lease, rewritten by every transaction
  that grants a slot or places a claim.

Why a read, then a transaction. etcd's transactions compare single keys (a value, a
version, a create or mod revision), never how many keys a range holds, so "fewer than
``limit`` slots are live" cannot be a comparison. An acquire reads the whole of
``S(k)`` (one linearizable range read: every slot, the claim, the generation), decides
as the memory store does, and writes its decision in one transaction that compares
the generation's ``mod_revision`` with the one it read: that holds only if no grant
and no claim landed since the read. Whatever else changes ``S(k)`` meanwhile only
takes holders or a claim away (a release, an expiry, a lapsed claim) or swaps one
holder for another (a transfer, which compares its two names itself), so a grant
decided on the read never exceeds the limit or breaks exclusion: at worst it denies a
slot freed a moment after the read, as if it had come a moment earlier. A transaction
that finds the generation moved reads ``S(k)`` again in its failure branch, and the
acquire decides anew on that: one more round trip per lost race, never a wrong grant.

Round trips: a grant is the read and the transaction (and an etcd lease grant before
it, unless an idle etcd lease of this provider is reused: ``reuse_leases``, TTLs of
10 s and more); a denial is the read alone (an exclusive one also places its claim:
an etcd lease grant and a transaction); a refresh of one's own slot is the read and a
keep-alive. ``docs/backends/etcd.md`` has the measurements.

A shared holder's exclusive acquire (granted when nobody else holds a slot) rewrites
its own slot: etcd refuses a transaction that deletes and puts one key, so the slot
keeps its ``create_revision``, and its token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from leasekit import (
    EXCLUSIVE_INTENT_MS,
    SLOT_HOLDERS_SHOWN,
    LeaseBackendError,
    SlotLimitMismatch,
    SlotResult,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)
from leasekit.backend import LeaseRecord, Operation, check_slot_acquire

from . import _keys, _rpc
from ._ops import (
    Context,
    Op,
    Request,
    _bind,
    _range,
    _reset_ttl,
    _time_to_live,
    _txn,
    detached_leases,
    release_grant_txn,
    release_txn,
    ttl_s,
)

__all__ = [
    "acquire_slot",
    "release_slot",
    "release_slot_grant",
    "renew_slot",
    "slot_holders",
    "transfer_slot",
]

_SLOT = b"h"
_CLAIM = b"c"
_GENERATION = b"g"
_EXCLUSIVE = b" x"


@dataclass(frozen=True, slots=True)
class _Slot:
    """A live slot as read: its owner, token, whether exclusive, limit and etcd lease."""

    owner: str
    token: int
    exclusive: bool
    limit: int
    lease: int


@dataclass(frozen=True, slots=True)
class _State:
    """What one read of ``S(k)`` found: the slots in grant order, the claimant (or
    None), and the generation's ``mod_revision`` (0 if never written)."""

    slots: list[_Slot]
    claimant: str | None
    generation: int


def _slot_name(start: bytes, owner: str) -> bytes:
    return start + _SLOT + owner.encode()


def _slot_value(limit: int, exclusive: bool) -> bytes:
    return b"%d%s" % (limit, _EXCLUSIVE if exclusive else b"")


def _unexpected(kv: _rpc.KeyValue, key: str) -> LeaseBackendError:
    return LeaseBackendError(
        f"unexpected data at etcd key {kv.key!r:.80} ({kv.value!r:.40}); is another "
        "program writing under the prefix?",
        backend="etcd",
        key=key,
    )


def _slot_of(start: bytes, kv: _rpc.KeyValue, key: str) -> _Slot:
    """The slot an ``S(k)h<o>`` record holds, checked."""
    limit, _, flag = kv.value.partition(b" ")
    try:
        owner = kv.key[len(start) + len(_SLOT) :].decode()
        if not (owner and kv.lease and limit.isdigit() and flag in (b"", b"x")):
            raise ValueError
    except ValueError:  # UnicodeDecodeError included
        raise _unexpected(kv, key) from None
    return _Slot(owner, kv.create_revision, flag == b"x", int(limit), kv.lease)


def _state(start: bytes, kvs: Sequence[_rpc.KeyValue], key: str) -> _State:
    slots: list[_Slot] = []
    claimant: str | None = None
    generation = 0
    for kv in kvs:
        kind = kv.key[len(start) : len(start) + 1]
        if kind == _SLOT:
            slots.append(_slot_of(start, kv, key))
        elif kind == _CLAIM:
            try:
                claimant = kv.value.decode() or None
            except UnicodeDecodeError:
                raise _unexpected(kv, key) from None
        elif kind == _GENERATION:
            generation = kv.mod_revision
    slots.sort(key=lambda slot: slot.token)
    return _State(slots, claimant, generation)


# -- the transactions ---------------------------------------------------------------------------


def grant_txn(  # noqa: PLR0917 (the decision's parts, in order)
    start: bytes,
    end: bytes,
    generation: int,
    record: bytes,
    token: int,
    value: bytes,
    lease: int,
    spend_claim: bool,
) -> _rpc.Request:
    """Grant a slot as decided on the read of ``S(k)`` at ``generation``.

    Compare: the generation's ``mod_revision`` is still ``generation`` (no grant and no
    claim since the read), and the caller's slot is as read (``create_revision`` its
    token, 0 when it had none). Success: put ``S(k)h<o>`` on ``lease`` with
    ``prev_kv`` (the etcd lease it left, when a shared holder takes the key), rewrite
    the generation, and with ``spend_claim`` delete the caller's claim (``prev_kv``: its
    etcd lease). A new slot's ``create_revision`` is the response header's revision,
    the new token. Failure: read ``S(k)`` again, to decide anew.
    """
    success = [
        _rpc.put_op(record, value, lease, prev_kv=True),
        _rpc.put_op(start + _GENERATION, b"", 0),
    ]
    if spend_claim:
        success.append(_rpc.delete_op(start + _CLAIM, prev_kv=True))
    return _rpc.txn_request(
        [
            _rpc.compare_mod(start + _GENERATION, generation),
            _rpc.compare_create(record, b"", token),
        ],
        success,
        [_rpc.range_op(start, end)],
    )


def claim_txn(start: bytes, end: bytes, generation: int, owner: bytes, lease: int) -> _rpc.Request:
    """Place (or renew) ``owner``'s claim to go next, as decided at ``generation``.

    Compare: the generation is unchanged since the read. Success: put ``S(k)c`` on
    ``lease`` (``prev_kv``: the etcd lease of the claim it replaces) and rewrite the
    generation, so that a grant decided before the claim cannot land after it.
    Failure: read ``S(k)`` again.
    """
    return _rpc.txn_request(
        [_rpc.compare_mod(start + _GENERATION, generation)],
        [
            _rpc.put_op(start + _CLAIM, owner, lease, prev_kv=True),
            _rpc.put_op(start + _GENERATION, b"", 0),
        ],
        [_rpc.range_op(start, end)],
    )


def transfer_slot_txn(from_kv: _rpc.KeyValue, to_record: bytes, lease: int) -> _rpc.Request:
    """Hand a slot on: compare that ``S(k)h<from>`` is as read (its ``mod_revision``)
    and that ``S(k)h<to>`` does not exist, then delete the one (``prev_kv``: its etcd
    lease) and create the other with the same value on ``lease``, in one step: the
    count never changes. Failure: read ``S(k)h<to>`` (whether ``to`` holds one)."""
    return _rpc.txn_request(
        [
            _rpc.compare_mod(from_kv.key, from_kv.mod_revision),
            _rpc.compare_create(to_record, b"", 0),
        ],
        [
            _rpc.delete_op(from_kv.key, prev_kv=True),
            _rpc.put_op(to_record, from_kv.value, lease),
        ],
        [_rpc.range_op(to_record)],
    )


# -- the operations -----------------------------------------------------------------------------


def acquire_slot(
    ctx: Context, key: str, owner: str, ttl_ms: int, *, limit: int, exclusive: bool = False
) -> Operation[Request, SlotResult]:
    """One of ``limit`` slots of ``key`` for ``owner`` (with ``exclusive``, the key)."""
    check_slot_acquire(key, owner, ttl_ms, limit, exclusive)
    claim_s = ttl_s(min(ttl_ms, EXCLUSIVE_INTENT_MS))
    return _acquire_slot(ctx, key, owner, ttl_s(ttl_ms), limit, exclusive, claim_s)


def renew_slot(ctx: Context, key: str, owner: str, ttl_ms: int) -> Operation[Request, bool]:
    """Give ``owner``'s live slot of ``key`` a full ``ttl_ms`` again; False if none."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    return _renew_slot(ctx, key, owner, ttl_s(ttl_ms))


def release_slot(ctx: Context, key: str, owner: str) -> Operation[Request, bool]:
    """Free ``owner``'s live slot of ``key``; whether it held one."""
    validate_key(key)
    validate_owner(owner)
    start, _ = _keys.slot_range(ctx.prefix, key)
    return _release_slot(ctx, _slot_name(start, owner), None)


def release_slot_grant(ctx: Context, key: str, owner: str, token: int) -> Operation[Request, bool]:
    """Free ``owner``'s slot of ``key`` only if it carries ``token`` (an undo)."""
    validate_key(key)
    validate_owner(owner)
    start, _ = _keys.slot_range(ctx.prefix, key)
    return _release_slot(ctx, _slot_name(start, owner), token)


def transfer_slot(
    ctx: Context, key: str, from_owner: str, to_owner: str, ttl_ms: int
) -> Operation[Request, bool]:
    """Hand ``from_owner``'s live slot of ``key`` to ``to_owner`` (a new token); to
    oneself, a renewal."""
    validate_key(key)
    validate_owner(from_owner, "from_owner")
    validate_owner(to_owner, "to_owner")
    validate_ttl_ms(ttl_ms)
    if from_owner == to_owner:
        return _renew_slot(ctx, key, from_owner, ttl_s(ttl_ms))
    return _transfer_slot(ctx, key, from_owner, to_owner, ttl_s(ttl_ms))


def slot_holders(ctx: Context, key: str) -> Operation[Request, list[LeaseRecord]]:
    """The live slots of ``key`` (owner, token, time left), in grant order."""
    validate_key(key)
    return _slot_holders(ctx, key)


# -- their round trips --------------------------------------------------------------------------


def _acquire_slot(  # noqa: PLR0917 (acquire_slot's arguments, checked)
    ctx: Context, key: str, owner: str, ttl_s: int, limit: int, exclusive: bool, claim_s: int
) -> Op:
    start, end = _keys.slot_range(ctx.prefix, key)
    record = _slot_name(start, owner)
    read: _rpc.RangeResponse = yield from _range(_rpc.range_request(start, end))
    kvs: Sequence[_rpc.KeyValue] = read.kvs
    while True:
        state = _state(start, kvs, key)
        slots = state.slots
        if slots and slots[0].limit != limit:
            raise SlotLimitMismatch(key=key, limit=limit, stored_limit=slots[0].limit)
        mine = next((slot for slot in slots if slot.owner == owner), None)
        if mine is not None and (mine.exclusive or not exclusive):
            # The caller's own: a full TTL again, same token (nothing else changes).
            if (yield from _reset_ttl(ctx, record, mine.lease, ttl_s, None)):
                return SlotResult(True, owner, mine.token, len(slots), limit, (), mine.exclusive)
            kvs = (yield from _range(_rpc.range_request(start, end))).kvs  # it expired
            continue
        claimant = state.claimant
        others = len(slots) - (mine is not None)
        held_exclusively = any(slot.exclusive for slot in slots)
        if (exclusive and not others and claimant in (None, owner)) or (
            not exclusive and not held_exclusively and claimant is None and others < limit
        ):
            value = _slot_value(limit, exclusive)
            granted = yield from _grant(ctx, start, end, state, record, mine, ttl_s, value)
            if isinstance(granted, int):
                held = 1 if exclusive else len(slots) + 1
                return SlotResult(True, owner, granted, held, limit, (), exclusive)
            kvs = granted
            continue
        if exclusive and claimant in (None, owner):
            # Goes next: its claim stops new grants to others while it lives.
            placed = yield from _claim(ctx, start, end, state.generation, owner, claim_s)
            if placed is not None:
                kvs = placed
                continue
        return SlotResult(
            False,
            None,
            None,
            len(slots),
            limit,
            tuple(slot.owner for slot in slots[:SLOT_HOLDERS_SHOWN]),
            held_exclusively,
            claimant if claimant != owner else None,
        )


def _grant(  # noqa: PLR0917 (the decision's parts)
    ctx: Context,
    start: bytes,
    end: bytes,
    state: _State,
    record: bytes,
    mine: _Slot | None,
    ttl_s: int,
    value: bytes,
) -> Op:
    """:func:`grant_txn` on an etcd lease for the slot: the token if it landed, else
    what the failure branch read of ``S(k)``. An exclusive grant spends a claim (only
    ever the caller's, or it would not have been decided)."""
    spend_claim = value.endswith(_EXCLUSIVE) and state.claimant is not None
    token = 0 if mine is None else mine.token

    def build(lease: int) -> _rpc.Request:
        return grant_txn(start, end, state.generation, record, token, value, lease, spend_claim)

    reply, lease, _ = yield from _bind(ctx, ttl_s, build)
    if not reply.succeeded:
        ctx.left_empty(lease)  # never bound
        return reply.responses[0].response_range.kvs
    previous = reply.responses[0].response_put.prev_kv
    if previous.lease and previous.lease != lease:
        ctx.left_empty(previous.lease)  # a shared holder's slot, now the key's
    if spend_claim:
        for claim in reply.responses[2].response_delete_range.prev_kvs:
            if claim.lease:
                ctx.revoke(claim.lease)
    ctx.bindings.bound(record, lease)
    return token or reply.header.revision


def _claim(  # noqa: PLR0917 (the claim's parts)
    ctx: Context, start: bytes, end: bytes, generation: int, owner: str, claim_s: int
) -> Op:
    """:func:`claim_txn` on a fresh etcd lease of ``claim_s``: None if placed, else what
    the failure branch read of ``S(k)``."""

    def build(lease: int) -> _rpc.Request:
        return claim_txn(start, end, generation, owner.encode(), lease)

    reply, lease, _ = yield from _bind(ctx, claim_s, build)
    if not reply.succeeded:
        ctx.left_empty(lease)
        return reply.responses[0].response_range.kvs
    previous = reply.responses[0].response_put.prev_kv
    if previous.lease and previous.lease != lease:
        ctx.revoke(previous.lease)  # the claim it renewed (or a lapsing one's)
    return None


def _renew_slot(ctx: Context, key: str, owner: str, ttl_s: int) -> Op:
    start, _ = _keys.slot_range(ctx.prefix, key)
    record = _slot_name(start, owner)
    reply: _rpc.RangeResponse = yield from _range(_rpc.range_request(record))
    if not reply.kvs:
        return False
    slot = _slot_of(start, reply.kvs[0], key)
    return bool((yield from _reset_ttl(ctx, record, slot.lease, ttl_s, None)))


def _release_slot(ctx: Context, record: bytes, token: int | None) -> Op:
    bindings = ctx.bindings
    txn = release_txn(record) if token is None else release_grant_txn(record, token)
    try:
        reply = yield from _txn(txn)
    except BaseException:
        # Its outcome unknown: revoking the etcd lease this provider bound the slot to
        # ends the slot if the release did not land, as ``_ops`` does for a lease.
        lease = bindings.pop(record)
        if lease is not None:
            ctx.revoke(lease)
        raise
    if reply.succeeded:
        bindings.pop(record)
        for lease in detached_leases(reply):
            ctx.left_empty(lease)
    return bool(reply.succeeded)


def _transfer_slot(ctx: Context, key: str, from_owner: str, to_owner: str, ttl_s: int) -> Op:
    start, _ = _keys.slot_range(ctx.prefix, key)
    from_record = _slot_name(start, from_owner)
    to_record = _slot_name(start, to_owner)
    while True:
        read: _rpc.RangeResponse = yield from _range(_rpc.range_request(from_record))
        if not read.kvs:
            return False
        from_kv = read.kvs[0]
        _slot_of(start, from_kv, key)

        def build(lease: int, from_kv: _rpc.KeyValue = from_kv) -> _rpc.Request:
            return transfer_slot_txn(from_kv, to_record, lease)

        reply, lease, _ = yield from _bind(ctx, ttl_s, build)
        if reply.succeeded:
            ctx.bindings.pop(from_record)
            for detached in detached_leases(reply, bound=lease):
                ctx.left_empty(detached)
            ctx.bindings.bound(to_record, lease)
            return True
        ctx.left_empty(lease)  # never bound
        if reply.responses[0].response_range.kvs:
            return False  # to_owner holds a slot already
        # from_owner's slot changed since the read (renewed onto another etcd lease,
        # released, expired): look again.


def _slot_holders(ctx: Context, key: str) -> Op:
    start, _ = _keys.slot_range(ctx.prefix, key)
    first = start + _SLOT
    reply: _rpc.RangeResponse = yield from _range(_rpc.range_request(first, _keys.range_end(first)))
    slots = sorted((_slot_of(start, kv, key) for kv in reply.kvs), key=lambda s: s.token)
    if not slots:
        return []
    # The time left is each slot's etcd lease's (whole seconds, rounded down), asked
    # side by side; one that ran out (-1) is a slot that expired since the read.
    ttls: list[_rpc.LeaseTimeToLiveResponse] = yield tuple(
        _time_to_live(slot.lease) for slot in slots
    )
    return [
        LeaseRecord(key, slot.owner, slot.token, max(ttl.TTL * 1000, 1))
        for slot, ttl in zip(slots, ttls, strict=True)
        if ttl.TTL >= 0
    ]
