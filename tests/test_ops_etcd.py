"""The etcd operations without a server: each request checked, each reply fed by hand.

The operations of ``leasekit_etcd._ops`` are generators that yield etcd calls and are
sent the replies (etcd's own protobuf messages, built here) or thrown gRPC errors; no
channel is involved, so the decisions between round trips are checked one by one.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from servers import missing_extra

from leasekit import InvalidLeaseArgument, LeaseBackendError, LeaseResult

try:
    from aetcd import rpc as pb  # type: ignore[import-untyped]
    from leasekit_etcd import _ops
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("etcd", "the etcd tests")

PREFIX = b"p/"
TTL_MS = 60_000


class NoTimer:
    """A pool timer that never runs (the operations here never keep a lease idle)."""

    def cancel(self) -> None:
        pass

    def pending(self) -> bool:
        return True


class Ctx:
    """A context whose background revocations are only recorded."""

    def __init__(self) -> None:
        self.revoked: list[int] = []
        self.ctx = _ops.Context(
            PREFIX,
            reuse=False,
            revoke_later=self.revoked.append,
            now=lambda: 0.0,
            call_at=lambda when, callback: NoTimer(),
            min_ttl_s=2,
        )


class Refused(grpc.RpcError):  # type: ignore[misc]
    """A gRPC failure as a transport throws it in: a status code and etcd's words."""

    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def record(key: str, owner: str) -> bytes:
    return PREFIX + key.encode() + b"\0" + owner.encode()


def kv(key: str, owner: str, *, lease: int, token: int = 10, metadata: bytes | None = None) -> Any:
    value = owner.encode() if metadata is None else owner.encode() + b"\0" + metadata
    return pb.KeyValue(key=record(key, owner), value=value, lease=lease, create_revision=token)


def finish(operation: Any, reply: Any) -> Any:
    with pytest.raises(StopIteration) as stop:
        operation.send(reply)
    return stop.value.value


def test_owner_is_one_range_read_of_the_holder_range() -> None:
    c = Ctx()
    op = _ops.owner(c.ctx, "k")
    call = next(op)
    assert (call.method, call.safe) == ("Range", True)
    assert (call.request.key, call.request.range_end) == (b"p/k\0", b"p/k\1")
    assert call.request.limit == 1
    assert finish(op, pb.RangeResponse()) is None
    op = _ops.owner(c.ctx, "k")
    next(op)
    assert finish(op, pb.RangeResponse(kvs=[kv("k", "a", lease=7)])) == "a"


def test_a_record_leasekit_did_not_write_is_an_error_not_a_holder() -> None:
    op = _ops.owner(Ctx().ctx, "k")
    next(op)
    stranger = pb.KeyValue(key=record("k", "a"), value=b"someone else", lease=7)
    with pytest.raises(LeaseBackendError, match="unexpected data"):
        op.send(pb.RangeResponse(kvs=[stranger]))


def test_acquiring_a_free_key_grants_then_binds_in_one_transaction() -> None:
    c = Ctx()
    op = _ops.acquire(c.ctx, "k", "a", 1500)
    grant = next(op)
    assert (grant.method, grant.safe, grant.request.TTL) == ("LeaseGrant", False, 2)  # rounded up
    txn = op.send(pb.LeaseGrantResponse(ID=7, TTL=2))
    assert (txn.method, txn.safe) == ("Txn", False)
    [compare] = txn.request.compare
    assert (compare.key, compare.range_end, compare.create_revision) == (b"p/k\0", b"p/k\1", 0)
    put = txn.request.success[0].request_put
    assert (put.key, put.value, put.lease) == (record("k", "a"), b"a", 7)
    reply = pb.TxnResponse(succeeded=True, header=pb.ResponseHeader(revision=42))
    assert finish(op, reply) == LeaseResult(True, "a", 42)
    assert c.revoked == []


def test_a_denied_acquire_names_the_holder_and_revokes_the_unbound_lease() -> None:
    c = Ctx()
    op = _ops.acquire(c.ctx, "k", "b", TTL_MS)
    next(op)
    op.send(pb.LeaseGrantResponse(ID=7, TTL=60))
    held = pb.ResponseOp(response_range=pb.RangeResponse(kvs=[kv("k", "a", lease=3)]))
    assert finish(op, pb.TxnResponse(succeeded=False, responses=[held])) == LeaseResult(
        False, "a", None
    )
    assert c.revoked == [7]
    # A key seen held is looked at first next time: one read, nothing written.
    op = _ops.acquire(c.ctx, "k", "b", TTL_MS)
    assert next(op).method == "Range"
    assert finish(op, pb.RangeResponse(kvs=[kv("k", "a", lease=3)])) == LeaseResult(
        False, "a", None
    )


def test_metadata_goes_after_the_owner_in_the_value_the_grant_puts() -> None:
    c = Ctx()
    op = _ops.acquire(c.ctx, "k", "a\0b", TTL_MS, b"\0host:1\xff")
    next(op)
    txn = op.send(pb.LeaseGrantResponse(ID=7, TTL=60))
    assert txn.request.success[0].request_put.value == b"a\0b\0\0host:1\xff"
    reply = pb.TxnResponse(succeeded=True, header=pb.ResponseHeader(revision=42))
    assert finish(op, reply) == LeaseResult(True, "a\0b", 42, b"\0host:1\xff")
    op = _ops.acquire(c.ctx, "j", "a", TTL_MS, "\u00fc")
    next(op)
    txn = op.send(pb.LeaseGrantResponse(ID=8, TTL=60))
    assert txn.request.success[0].request_put.value == b"a\0\xc3\xbc"


def test_a_denied_acquire_returns_the_holders_metadata_from_the_same_reply() -> None:
    c = Ctx()
    op = _ops.acquire(c.ctx, "k", "b", TTL_MS)
    next(op)
    op.send(pb.LeaseGrantResponse(ID=7, TTL=60))
    held = pb.ResponseOp(response_range=pb.RangeResponse(kvs=[kv("k", "a", lease=3, metadata=b"")]))
    assert finish(op, pb.TxnResponse(succeeded=False, responses=[held])) == LeaseResult(
        False, "a", None, b""
    )
    op = _ops.acquire(c.ctx, "k", "b", TTL_MS)
    assert next(op).method == "Range"
    reply = pb.RangeResponse(kvs=[kv("k", "a", lease=3, metadata=b"a:1")])
    assert finish(op, reply) == LeaseResult(False, "a", None, b"a:1")
    # A record written before metadata existed (the value is the owner alone) has none.
    op = _ops.acquire(c.ctx, "k", "b", TTL_MS)
    next(op)
    assert finish(op, pb.RangeResponse(kvs=[kv("k", "a", lease=3)])) == LeaseResult(
        False, "a", None
    )


def test_a_value_that_is_not_the_owner_and_its_metadata_is_an_error() -> None:
    for value in (b"ab", b"a\1m", b"b\0m"):
        op = _ops.owner(Ctx().ctx, "k")
        next(op)
        stranger = pb.KeyValue(key=record("k", "a"), value=value, lease=7)
        with pytest.raises(LeaseBackendError, match="unexpected data"):
            op.send(pb.RangeResponse(kvs=[stranger]))


def test_the_holders_reacquire_with_other_metadata_moves_its_record_with_the_new_value() -> None:
    c = Ctx()
    c.ctx.seen_held.add("k")
    # The same metadata: a keep-alive, as without metadata.
    op = _ops.acquire(c.ctx, "k", "a", TTL_MS, b"m")
    next(op)
    keep = op.send(pb.RangeResponse(kvs=[kv("k", "a", lease=7, token=5, metadata=b"m")]))
    assert keep.method == "LeaseKeepAlive"
    assert finish(op, pb.LeaseKeepAliveResponse(ID=7, TTL=60)) == LeaseResult(True, "a", 5, b"m")
    # Other metadata (None included: it clears): the record moves to a fresh etcd lease,
    # with the new value, in one transaction that keeps its token.
    op = _ops.acquire(c.ctx, "k", "a", TTL_MS, None)
    next(op)
    grant = op.send(pb.RangeResponse(kvs=[kv("k", "a", lease=7, token=5, metadata=b"m")]))
    assert grant.method == "LeaseGrant"
    relet = op.send(pb.LeaseGrantResponse(ID=8, TTL=60))
    put = relet.request.success[0].request_put
    assert (put.key, put.value, put.lease, put.ignore_value) == (record("k", "a"), b"a", 8, False)
    moved = pb.ResponseOp(response_put=pb.PutResponse(prev_kv=kv("k", "a", lease=7, token=5)))
    assert finish(op, pb.TxnResponse(succeeded=True, responses=[moved])) == LeaseResult(
        True, "a", 5
    )
    assert c.revoked == [7]


def test_a_renewal_that_moves_the_record_keeps_its_value() -> None:
    op = _ops.renew(Ctx().ctx, "k", "a", 65_000)
    next(op)
    op.send(pb.RangeResponse(kvs=[kv("k", "a", lease=7, metadata=b"m")]))
    op.send(pb.LeaseKeepAliveResponse(ID=7, TTL=60))
    relet = op.send(pb.LeaseGrantResponse(ID=8, TTL=65))
    put = relet.request.success[0].request_put
    assert (put.value, put.ignore_value, put.lease) == (b"", True, 8)


def test_transfer_puts_the_metadata_given_for_the_new_owner() -> None:
    c = Ctx()
    op = _ops.transfer(c.ctx, "k", "a", "b", TTL_MS, b"b:2")
    next(op)
    txn = op.send(pb.LeaseGrantResponse(ID=8, TTL=60))
    assert txn.request.success[1].request_put.value == b"b\0b:2"
    op = _ops.transfer(c.ctx, "k", "a", "b", TTL_MS)
    next(op)
    txn = op.send(pb.LeaseGrantResponse(ID=9, TTL=60))
    assert txn.request.success[1].request_put.value == b"b"


def test_a_record_is_the_holders_range_then_its_etcd_leases_time_left() -> None:
    op = _ops.record(Ctx().ctx, "k")
    read = next(op)
    assert (read.method, read.request.key, read.request.limit) == ("Range", b"p/k\0", 1)
    ttl = op.send(pb.RangeResponse(kvs=[kv("k", "a", lease=7, token=5, metadata=b"m")]))
    assert (ttl.method, ttl.safe, ttl.request.ID) == ("LeaseTimeToLive", True, 7)
    record_ = finish(op, pb.LeaseTimeToLiveResponse(ID=7, TTL=12))
    assert (record_.key, record_.owner, record_.token, record_.remaining_ms, record_.metadata) == (
        "k",
        "a",
        5,
        12_000,
        b"m",
    )
    op = _ops.record(Ctx().ctx, "k")
    next(op)
    assert finish(op, pb.RangeResponse()) is None
    # The etcd lease ended between the calls: the record is looked at again.
    op = _ops.record(Ctx().ctx, "k")
    next(op)
    op.send(pb.RangeResponse(kvs=[kv("k", "a", lease=7)]))
    again = op.send(pb.LeaseTimeToLiveResponse(ID=7, TTL=-1))
    assert again.method == "Range"
    op.send(pb.RangeResponse(kvs=[kv("k", "a", lease=8)]))
    assert finish(op, pb.LeaseTimeToLiveResponse(ID=8, TTL=0)).remaining_ms == 1
    # Ran out, and still there on a second look: about to be deleted, not looked at again.
    op = _ops.record(Ctx().ctx, "k")
    next(op)
    op.send(pb.RangeResponse(kvs=[kv("k", "a", lease=7)]))
    op.send(pb.LeaseTimeToLiveResponse(ID=7, TTL=-2))
    op.send(pb.RangeResponse(kvs=[kv("k", "a", lease=7)]))
    assert finish(op, pb.LeaseTimeToLiveResponse(ID=7, TTL=-1)).remaining_ms == 1


def test_a_record_on_the_etcd_lease_it_was_seen_on_is_one_round_trip() -> None:
    c = Ctx()
    op = _ops.record(c.ctx, "k")
    next(op)
    op.send(pb.RangeResponse(kvs=[kv("k", "a", lease=7, token=5)]))
    finish(op, pb.LeaseTimeToLiveResponse(ID=7, TTL=12))
    # Seen on etcd lease 7: the range and that lease's time left, side by side.
    op = _ops.record(c.ctx, "k")
    both = next(op)
    assert [(call.method, call.safe) for call in both] == [
        ("Range", True),
        ("LeaseTimeToLive", True),
    ]
    assert both[1].request.ID == 7
    reply = [
        pb.RangeResponse(kvs=[kv("k", "a", lease=7, token=5)]),
        pb.LeaseTimeToLiveResponse(TTL=9),
    ]
    assert finish(op, reply).remaining_ms == 9_000
    # Moved to etcd lease 8 meanwhile: the guess's answer is dropped, lease 8 asked.
    op = _ops.record(c.ctx, "k")
    next(op)
    reply = [
        pb.RangeResponse(kvs=[kv("k", "a", lease=8, token=5)]),
        pb.LeaseTimeToLiveResponse(TTL=-1),
    ]
    again = op.send(reply)
    assert (again.method, again.request.ID) == ("LeaseTimeToLive", 8)
    assert finish(op, pb.LeaseTimeToLiveResponse(ID=8, TTL=30)).remaining_ms == 30_000
    # A denied acquire learns the holder's etcd lease too.
    c = Ctx()
    op = _ops.acquire(c.ctx, "k", "b", TTL_MS)
    next(op)
    op.send(pb.LeaseGrantResponse(ID=9, TTL=60))
    held = pb.ResponseOp(response_range=pb.RangeResponse(kvs=[kv("k", "a", lease=3)]))
    finish(op, pb.TxnResponse(succeeded=False, responses=[held]))
    op = _ops.record(c.ctx, "k")
    assert next(op)[1].request.ID == 3


def test_bad_input_is_refused_when_the_operation_is_built() -> None:
    ctx = Ctx().ctx
    for build, argument in (
        (lambda: _ops.acquire(ctx, "", "a", TTL_MS), "key"),
        (lambda: _ops.acquire(ctx, "k", "a", 0), "ttl_ms"),
        (lambda: _ops.acquire(ctx, "k", "a", True), "ttl_ms"),
        (lambda: _ops.renew(ctx, "k", "", TTL_MS), "owner"),
        (lambda: _ops.transfer(ctx, "k", "a", "", TTL_MS), "to_owner"),
        (lambda: _ops.release(ctx, "k" * 1025, "a"), "key"),
        (lambda: _ops.inspect(ctx, None, 0), "limit"),
        (lambda: _ops.acquire(ctx, "k", "a", TTL_MS, b"x" * 4097), "metadata"),
        (lambda: _ops.transfer(ctx, "k", "a", "b", TTL_MS, 5), "metadata"),
        (lambda: _ops.record(ctx, ""), "key"),
    ):
        with pytest.raises(InvalidLeaseArgument) as caught:
            build()
        assert caught.value.argument == argument


def test_release_frees_the_key_and_revokes_the_lease_it_left_empty() -> None:
    c = Ctx()
    op = _ops.release(c.ctx, "k", "a")
    txn = next(op)
    [compare] = txn.request.compare
    # That the record exists, whatever its value (which may carry metadata).
    assert (compare.key, compare.target, compare.result, compare.create_revision) == (
        record("k", "a"),
        pb.Compare.CREATE,
        pb.Compare.GREATER,
        0,
    )
    deleted = pb.ResponseOp(
        response_delete_range=pb.DeleteRangeResponse(prev_kvs=[kv("k", "a", lease=9)])
    )
    assert finish(op, pb.TxnResponse(succeeded=True, responses=[deleted])) is True
    assert c.revoked == [9]
    op = _ops.release(c.ctx, "k", "a")
    next(op)
    assert finish(op, pb.TxnResponse(succeeded=False)) is False  # "a" held nothing


def acquired(c: Ctx, lease: int) -> None:
    op = _ops.acquire(c.ctx, "k", "a", TTL_MS)
    next(op)
    op.send(pb.LeaseGrantResponse(ID=lease, TTL=60))
    finish(op, pb.TxnResponse(succeeded=True, header=pb.ResponseHeader(revision=5)))


def test_a_release_whose_outcome_is_lost_revokes_the_lease_the_record_was_bound_to() -> None:
    c = Ctx()
    acquired(c, 7)
    op = _ops.release(c.ctx, "k", "a")
    next(op)
    with pytest.raises(Refused):
        op.throw(Refused(grpc.StatusCode.UNAVAILABLE, "connection lost"))
    assert c.revoked == [7]


def test_a_cancelled_release_revokes_that_lease_too() -> None:
    c = Ctx()
    acquired(c, 7)
    op = _ops.release(c.ctx, "k", "a")
    next(op)
    op.close()  # what the asyncio driver does when its caller is cancelled
    assert c.revoked == [7]


def test_a_grant_whose_transaction_failed_is_revoked() -> None:
    c = Ctx()
    op = _ops.acquire(c.ctx, "k", "a", TTL_MS)
    next(op)
    op.send(pb.LeaseGrantResponse(ID=7, TTL=60))
    with pytest.raises(Refused):
        op.throw(Refused(grpc.StatusCode.DEADLINE_EXCEEDED))
    assert c.revoked == [7]


def test_a_refused_grant_is_a_backend_error() -> None:
    op = _ops.acquire(Ctx().ctx, "k", "a", TTL_MS)
    next(op)
    with pytest.raises(LeaseBackendError, match="lease grant refused: too many"):
        op.send(pb.LeaseGrantResponse(error="too many"))


def test_renew_keeps_the_lease_alive_and_moves_the_record_for_a_new_ttl() -> None:
    c = Ctx()
    op = _ops.renew(c.ctx, "k", "a", TTL_MS)
    read = next(op)
    assert (read.method, read.request.key) == ("Range", record("k", "a"))
    keep = op.send(pb.RangeResponse(kvs=[kv("k", "a", lease=7, token=5)]))
    assert (keep.method, keep.safe, keep.request.ID) == ("LeaseKeepAlive", True, 7)
    assert finish(op, pb.LeaseKeepAliveResponse(ID=7, TTL=60)) is True
    # 65 s asked of a lease granted 60 s: a new etcd lease, and the record moved onto it.
    op = _ops.renew(c.ctx, "k", "a", 65_000)
    next(op)
    op.send(pb.RangeResponse(kvs=[kv("k", "a", lease=7, token=5)]))
    grant = op.send(pb.LeaseKeepAliveResponse(ID=7, TTL=60))
    assert (grant.method, grant.request.TTL) == ("LeaseGrant", 65)
    relet = op.send(pb.LeaseGrantResponse(ID=8, TTL=65))
    assert relet.request.success[0].request_put.lease == 8
    moved = pb.ResponseOp(response_put=pb.PutResponse(prev_kv=kv("k", "a", lease=7, token=5)))
    assert finish(op, pb.TxnResponse(succeeded=True, responses=[moved])) is True
    assert c.revoked == [7]


def test_renew_of_a_record_that_is_gone_is_false_and_writes_nothing() -> None:
    op = _ops.renew(Ctx().ctx, "k", "a", TTL_MS)
    next(op)
    assert finish(op, pb.RangeResponse()) is False
    op = _ops.renew(Ctx().ctx, "k", "a", TTL_MS)
    next(op)
    op.send(pb.RangeResponse(kvs=[kv("k", "a", lease=7)]))
    assert finish(op, pb.LeaseKeepAliveResponse(ID=7, TTL=0)) is False  # expired meanwhile


def test_transfer_deletes_one_record_and_creates_the_other_in_one_transaction() -> None:
    c = Ctx()
    op = _ops.transfer(c.ctx, "k", "a", "b", TTL_MS)
    next(op)
    txn = op.send(pb.LeaseGrantResponse(ID=8, TTL=60))
    assert [o.WhichOneof("request") for o in txn.request.success] == [
        "request_delete_range",
        "request_put",
    ]
    assert txn.request.success[1].request_put.key == record("k", "b")
    deleted = pb.ResponseOp(
        response_delete_range=pb.DeleteRangeResponse(prev_kvs=[kv("k", "a", lease=7)])
    )
    assert finish(op, pb.TxnResponse(succeeded=True, responses=[deleted, pb.ResponseOp()]))
    assert c.revoked == [7]
    # By a non-holder: False, and the unbound lease is revoked.
    op = _ops.transfer(c.ctx, "k", "x", "b", TTL_MS)
    next(op)
    op.send(pb.LeaseGrantResponse(ID=9, TTL=60))
    assert finish(op, pb.TxnResponse(succeeded=False)) is False
    assert c.revoked == [7, 9]


def test_transfer_to_the_same_owner_is_a_renewal() -> None:
    op = _ops.transfer(Ctx().ctx, "k", "a", "a", TTL_MS)
    assert next(op).method == "Range"


def test_inspect_asks_every_lease_its_remaining_time_side_by_side() -> None:
    op = _ops.inspect(Ctx().ctx, None, 10)
    read = next(op)
    assert (read.request.key, read.request.range_end) == (b"p/", b"p0")
    batch = pb.RangeResponse(
        kvs=[kv("j", "a", lease=1, token=3), kv("k", "b", lease=2, token=4)], more=False
    )
    ttls = op.send(batch)
    assert [(call.method, call.request.ID) for call in ttls] == [
        ("LeaseTimeToLive", 1),
        ("LeaseTimeToLive", 2),
    ]
    records = finish(op, [pb.LeaseTimeToLiveResponse(TTL=30), pb.LeaseTimeToLiveResponse(TTL=0)])
    assert [(r.key, r.owner, r.token, r.remaining_ms) for r in records] == [("j", "a", 3, 30_000)]


def test_revoking_a_lease_that_is_gone_already_is_fine() -> None:
    op = _ops.revoke(7)
    call = next(op)
    assert (call.method, call.safe, call.request.ID) == ("LeaseRevoke", True, 7)
    with pytest.raises(StopIteration):
        op.throw(Refused(grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found"))
    op = _ops.revoke(7)
    next(op)
    with pytest.raises(Refused):
        op.throw(Refused(grpc.StatusCode.UNAVAILABLE))
