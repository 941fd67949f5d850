"""The etcd backend's line of waiters (``leasekit.backend.SupportsFairWaiting``).

A sans-I/O generator as in ``_ops``. The line for the lease on ``k`` is the range
``L(k)`` (``_keys.line_range``): a waiter ``o``'s place is ``L(k)o``, empty, bound to an
etcd lease of ``place_ttl_ms`` (whole seconds, at least etcd's minimum) of its own.
Arrival order is ``create_revision`` order, as in etcd's own election and lock
recipes: a place that is kept (its etcd lease kept alive, or the place moved onto
another one for another TTL) keeps its ``create_revision`` and so its place, and one
whose etcd lease ran out is deleted with it, by etcd, on the leader's clock: a waiter
that comes back after that joins again at the end.

One attempt reads the key's holder range and its line side by side (one round trip,
two linearizable reads). Held by the caller: its lease refreshed as ``acquire`` does,
and its place, if any, dropped. Held by another, or free with a place ahead of the
caller's: the caller keeps its place (a keep-alive) or joins the line (an etcd lease
and a put-if-absent), and is denied. Free, and the caller first in line (or the line
empty): one transaction that compares that the key is free, that the caller's place
is as read and every place in the line was created no earlier (with no place: that the
line is empty), then creates the record and deletes the place. Its failure branch
reads both ranges again, and the attempt decides anew on that.
"""

from __future__ import annotations

from collections.abc import Sequence

from leasekit import (
    LeaseResult,
    validate_key,
    validate_metadata,
    validate_owner,
    validate_ttl_ms,
)
from leasekit.backend import Operation

from . import _keys, _rpc
from ._ops import (
    Call,
    Context,
    Op,
    Request,
    _bind,
    _reset_ttl,
    holder_of,
    read_holder,
    ttl_s,
)

__all__ = ["acquire_in_turn", "turn_txn"]


def acquire_in_turn(
    ctx: Context,
    key: str,
    owner: str,
    ttl_ms: int,
    *,
    place_ttl_ms: int,
    metadata: object = None,
) -> Operation[Request, LeaseResult]:
    """Acquire ``key`` for ``owner`` in its turn; otherwise keep (or take) its place."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    validate_ttl_ms(place_ttl_ms, "place_ttl_ms")
    data = None if metadata is None else validate_metadata(metadata)
    return _acquire_in_turn(ctx, key, owner, ttl_s(ttl_ms), ttl_s(place_ttl_ms), data)


def turn_txn(  # noqa: PLR0917 (the names and what was read of them)
    ctx: Context,
    key: str,
    record: bytes,
    value: bytes,
    place: _rpc.KeyValue | None,
    lease: int,
) -> _rpc.Request:
    """Grant ``key`` to the first in line.

    Compare: no record in ``H(k)`` (free); with the caller's ``place``, that it is as
    read (its ``create_revision``) and that every place in ``L(k)`` was created no
    earlier (a place only ever joins at the end, so none can have come in ahead);
    without one, that ``L(k)`` is empty. Success: put the record on ``lease`` (the
    header's revision is its token) and delete the place (``prev_kv``: its etcd lease).
    Failure: read ``H(k)``'s holder and ``L(k)`` again.
    """
    start, end = _keys.holder_range(ctx.prefix, key)
    line, line_end = _keys.line_range(ctx.prefix, key)
    compare = [_rpc.compare_create(start, end, 0)]
    success = [_rpc.put_op(record, value, lease)]
    if place is None:
        compare.append(_rpc.compare_create(line, line_end, 0))
    else:
        joined = place.create_revision
        compare.append(_rpc.compare_create(place.key, b"", joined))
        compare.append(_rpc.compare_created_after(line, line_end, joined - 1))
        success.append(_rpc.delete_op(place.key, prev_kv=True))
    return _rpc.txn_request(
        compare, success, [_rpc.range_op(start, end, limit=1), _rpc.range_op(line, line_end)]
    )


def _read(ctx: Context, key: str) -> Call | tuple[Call, ...]:
    start, end = _keys.holder_range(ctx.prefix, key)
    line, line_end = _keys.line_range(ctx.prefix, key)
    return (
        Call("Range", read_holder(start, end), safe=True),
        Call("Range", _rpc.range_request(line, line_end), safe=True),
    )


def _acquire_in_turn(  # noqa: PLR0917 (acquire_in_turn's arguments, checked)
    ctx: Context, key: str, owner: str, ttl_s: int, place_s: int, metadata: bytes | None
) -> Op:
    record = _keys.record_name(ctx.prefix, key, owner)
    place_name = _keys.line_range(ctx.prefix, key)[0] + owner.encode()
    value = _keys.record_value(owner.encode(), metadata)
    held_read, line_read = yield _read(ctx, key)
    held: Sequence[_rpc.KeyValue] = held_read.kvs
    line: Sequence[_rpc.KeyValue] = line_read.kvs
    while True:
        places = sorted(line, key=lambda kv: kv.create_revision)
        mine = next((kv for kv in places if kv.key == place_name), None)
        if held:
            holder, holder_metadata = holder_of(ctx.prefix, held[0], key)
            if holder != owner:
                yield from _keep_place(ctx, place_name, mine, place_s)
                return LeaseResult(False, holder, None, holder_metadata)
            # The caller's own: a full TTL again (and the metadata given now), as
            # ``acquire`` does; it leaves the line.
            kv = held[0]
            rewrite = None if kv.value == value else value
            if (yield from _reset_ttl(ctx, record, kv.lease, ttl_s, rewrite)):
                if mine is not None:
                    ctx.revoke(mine.lease)
                ctx.seen_held.add(key, kv.lease)
                return LeaseResult(True, owner, kv.create_revision, metadata)
            held_read, line_read = yield _read(ctx, key)  # it expired meanwhile
            held, line = held_read.kvs, line_read.kvs
            continue
        if places and places[0] is not mine:
            yield from _keep_place(ctx, place_name, mine, place_s)
            return LeaseResult(False, None, None)  # free, but another goes first

        def build(lease: int, mine: _rpc.KeyValue | None = mine) -> _rpc.Request:
            return turn_txn(ctx, key, record, value, mine, lease)

        reply, lease, _ = yield from _bind(ctx, ttl_s, build)
        if reply.succeeded:
            ctx.bindings.bound(record, lease)
            ctx.seen_held.add(key, lease)
            if mine is not None:
                for left in reply.responses[1].response_delete_range.prev_kvs:
                    if left.lease:
                        ctx.left_empty(left.lease)  # the place's, empty now
            return LeaseResult(True, owner, reply.header.revision, metadata)
        ctx.left_empty(lease)  # never bound
        held = reply.responses[0].response_range.kvs
        line = reply.responses[1].response_range.kvs


def _keep_place(ctx: Context, name: bytes, mine: _rpc.KeyValue | None, place_s: int) -> Op:
    """Keep the caller's place (a full ``place_s`` again), or join the line at its end
    if it has none or it lapsed: a put that only creates (``create_revision`` 0)."""
    if mine is not None and (yield from _reset_ttl(ctx, name, mine.lease, place_s, None)):
        return

    def build(lease: int) -> _rpc.Request:
        return _rpc.txn_request(
            [_rpc.compare_create(name, b"", 0)], [_rpc.put_op(name, b"", lease)], []
        )

    reply, lease, _ = yield from _bind(ctx, place_s, build)
    if not reply.succeeded:
        ctx.left_empty(lease)  # the same owner joined meanwhile, from elsewhere
