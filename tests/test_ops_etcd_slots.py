"""The etcd slot and in-turn operations without a server: each request, each reply by hand.

As ``test_ops_etcd``: the generators of ``leasekit_etcd._slots`` and ``_fair`` are sent
etcd's own protobuf replies, so what each round trip asks and what the operation
decides from the answer are checked one by one.
"""

from __future__ import annotations

from typing import Any

import pytest
from servers import missing_extra
from test_ops_etcd import PREFIX, TTL_MS, Ctx, finish, kv

from leasekit import LeaseResult, SlotLimitMismatch, SlotResult

try:
    from aetcd import rpc as pb  # type: ignore[import-untyped]
    from leasekit_etcd import _fair, _ops, _slots
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("etcd", "the etcd tests")

S = PREFIX + b"\xffk\0"  # the slot range of "k"
L = PREFIX + b"\xfek\0"  # the line of waiters for "k"


def slot(owner: str, *, token: int, lease: int, value: bytes = b"3") -> Any:
    return pb.KeyValue(
        key=S + b"h" + owner.encode(), value=value, lease=lease, create_revision=token
    )


def generation(revision: int) -> Any:
    return pb.KeyValue(key=S + b"g", value=b"", mod_revision=revision, create_revision=1)


def place(owner: str, *, joined: int, lease: int) -> Any:
    return pb.KeyValue(key=L + owner.encode(), value=b"", lease=lease, create_revision=joined)


def failed_with(*kvs: Any) -> Any:
    read = pb.ResponseOp(response_range=pb.RangeResponse(kvs=list(kvs)))
    return pb.TxnResponse(succeeded=False, responses=[read])


def test_a_grant_is_a_read_of_the_keys_range_then_one_transaction_on_its_generation() -> None:
    c = Ctx()
    op = _slots.acquire_slot(c.ctx, "k", "b", TTL_MS, limit=3)
    read = next(op)
    assert (read.method, read.safe) == ("Range", True)
    assert (read.request.key, read.request.range_end) == (S, PREFIX + b"\xffk\1")
    grant = op.send(pb.RangeResponse(kvs=[generation(20), slot("a", token=9, lease=5)]))
    assert grant.method == "LeaseGrant"
    txn = op.send(pb.LeaseGrantResponse(ID=7, TTL=60))
    assert (txn.method, txn.safe) == ("Txn", False)
    gen, mine = txn.request.compare
    assert (gen.key, gen.target, gen.mod_revision) == (S + b"g", pb.Compare.MOD, 20)
    assert (mine.key, mine.target, mine.create_revision) == (S + b"hb", pb.Compare.CREATE, 0)
    put, bump = (op.request_put for op in txn.request.success)
    assert (put.key, put.value, put.lease) == (S + b"hb", b"3", 7)
    assert (bump.key, bump.lease) == (S + b"g", 0)
    reply = pb.TxnResponse(
        succeeded=True,
        header=pb.ResponseHeader(revision=42),
        responses=[pb.ResponseOp(response_put=pb.PutResponse()), pb.ResponseOp()],
    )
    assert finish(op, reply) == SlotResult(True, "b", 42, 2, 3)
    assert c.revoked == []


def test_a_lost_race_decides_again_on_what_the_failure_branch_read() -> None:
    c = Ctx()
    op = _slots.acquire_slot(c.ctx, "k", "c", TTL_MS, limit=2)
    next(op)
    a = slot("a", token=9, lease=5, value=b"2")
    op.send(pb.RangeResponse(kvs=[generation(20), a]))
    op.send(pb.LeaseGrantResponse(ID=7, TTL=60))
    # b took the last slot meanwhile: no second read, a denial naming both holders, and
    # the etcd lease that was never bound revoked.
    now = [generation(21), a, slot("b", token=21, lease=6, value=b"2")]
    assert finish(op, failed_with(*now)) == SlotResult(False, None, None, 2, 2, ("a", "b"))
    assert c.revoked == [7]


def test_a_denial_names_holders_in_grant_order_and_writes_nothing() -> None:
    op = _slots.acquire_slot(Ctx().ctx, "k", "d", TTL_MS, limit=2)
    next(op)
    # Key order ("a" < "z") is not grant order (create revisions): the token decides.
    found = [slot("a", token=30, lease=5, value=b"2"), slot("z", token=12, lease=6, value=b"2")]
    assert finish(op, pb.RangeResponse(kvs=found)) == SlotResult(
        False, None, None, 2, 2, ("z", "a")
    )


def test_another_limit_is_refused_before_anything_is_written() -> None:
    op = _slots.acquire_slot(Ctx().ctx, "k", "b", TTL_MS, limit=5)
    next(op)
    with pytest.raises(SlotLimitMismatch) as caught:
        op.send(pb.RangeResponse(kvs=[slot("a", token=9, lease=5)]))
    assert (caught.value.limit, caught.value.stored_limit) == (5, 3)


def test_a_denied_exclusive_acquire_places_its_claim_on_a_short_etcd_lease() -> None:
    c = Ctx()
    op = _slots.acquire_slot(c.ctx, "k", "w", TTL_MS, limit=3, exclusive=True)
    next(op)
    grant = op.send(pb.RangeResponse(kvs=[generation(20), slot("r", token=9, lease=5)]))
    assert (grant.method, grant.request.TTL) == ("LeaseGrant", 3)  # EXCLUSIVE_INTENT_MS
    txn = op.send(pb.LeaseGrantResponse(ID=8, TTL=3))
    [gen] = txn.request.compare
    assert gen.mod_revision == 20
    claim, bump = (op.request_put for op in txn.request.success)
    assert (claim.key, claim.value, claim.lease) == (S + b"c", b"w", 8)
    assert bump.key == S + b"g"
    reply = pb.TxnResponse(
        succeeded=True, responses=[pb.ResponseOp(response_put=pb.PutResponse()), pb.ResponseOp()]
    )
    assert finish(op, reply) == SlotResult(False, None, None, 1, 3, ("r",))


def test_the_holders_acquire_keeps_its_slot_alive_and_its_token() -> None:
    op = _slots.acquire_slot(Ctx().ctx, "k", "a", TTL_MS, limit=3)
    next(op)
    keep = op.send(pb.RangeResponse(kvs=[slot("a", token=9, lease=5)]))
    assert (keep.method, keep.request.ID) == ("LeaseKeepAlive", 5)
    reply = pb.LeaseKeepAliveResponse(ID=5, TTL=60)
    assert finish(op, reply) == SlotResult(True, "a", 9, 1, 3)


def test_slot_and_line_names_are_not_listed_as_leases() -> None:
    found = pb.RangeResponse(kvs=[slot("a", token=9, lease=5), place("w", joined=3, lease=6)])
    assert _ops.listed(PREFIX, found) == []


def test_the_first_in_line_is_granted_in_one_transaction_over_the_key_and_its_line() -> None:
    c = Ctx()
    op = _fair.acquire_in_turn(c.ctx, "k", "w1", TTL_MS, place_ttl_ms=3000)
    held, line = next(op)
    assert (held.request.key, line.request.key, line.request.range_end) == (
        PREFIX + b"k\0",
        L,
        PREFIX + b"\xfek\1",
    )
    mine = place("w1", joined=10, lease=4)
    grant = op.send(
        [pb.RangeResponse(), pb.RangeResponse(kvs=[place("w2", joined=11, lease=5), mine])]
    )
    txn = op.send(pb.LeaseGrantResponse(ID=7, TTL=60))
    free, as_read, after = txn.request.compare
    assert (free.key, free.create_revision) == (PREFIX + b"k\0", 0)
    assert (as_read.key, as_read.create_revision) == (L + b"w1", 10)
    assert (after.key, after.result, after.create_revision) == (L, pb.Compare.GREATER, 9)
    put = txn.request.success[0].request_put
    gone = txn.request.success[1].request_delete_range
    assert (put.key, put.lease, gone.key) == (PREFIX + b"k\0w1", 7, L + b"w1")
    deleted = pb.DeleteRangeResponse(prev_kvs=[mine])
    reply = pb.TxnResponse(
        succeeded=True,
        header=pb.ResponseHeader(revision=42),
        responses=[pb.ResponseOp(), pb.ResponseOp(response_delete_range=deleted)],
    )
    assert finish(op, reply) == LeaseResult(True, "w1", 42)
    assert c.revoked == [4]  # the place's etcd lease, empty now
    assert grant.method == "LeaseGrant"


def test_a_free_key_with_someone_ahead_keeps_the_callers_place_and_names_nobody() -> None:
    op = _fair.acquire_in_turn(Ctx().ctx, "k", "w2", TTL_MS, place_ttl_ms=3000)
    next(op)
    line = [place("w1", joined=10, lease=4), place("w2", joined=11, lease=5)]
    keep = op.send([pb.RangeResponse(), pb.RangeResponse(kvs=line)])
    assert (keep.method, keep.request.ID) == ("LeaseKeepAlive", 5)
    assert finish(op, pb.LeaseKeepAliveResponse(ID=5, TTL=3)) == LeaseResult(False, None, None)


def test_a_waiter_without_a_place_joins_the_line_while_the_key_is_held() -> None:
    op = _fair.acquire_in_turn(Ctx().ctx, "k", "w", TTL_MS, place_ttl_ms=3000)
    next(op)
    grant = op.send([pb.RangeResponse(kvs=[kv("k", "a", lease=3)]), pb.RangeResponse()])
    assert (grant.method, grant.request.TTL) == ("LeaseGrant", 3)
    txn = op.send(pb.LeaseGrantResponse(ID=9, TTL=3))
    [absent] = txn.request.compare
    assert (absent.key, absent.create_revision) == (L + b"w", 0)
    assert txn.request.success[0].request_put.lease == 9
    assert finish(op, pb.TxnResponse(succeeded=True)) == LeaseResult(False, "a", None)
