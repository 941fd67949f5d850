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


def kv(key: str, owner: str, *, lease: int, token: int = 10) -> Any:
    return pb.KeyValue(
        key=record(key, owner), value=owner.encode(), lease=lease, create_revision=token
    )


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
    ):
        with pytest.raises(InvalidLeaseArgument) as caught:
            build()
        assert caught.value.argument == argument


def test_release_frees_the_key_and_revokes_the_lease_it_left_empty() -> None:
    c = Ctx()
    op = _ops.release(c.ctx, "k", "a")
    txn = next(op)
    [compare] = txn.request.compare
    assert (compare.key, compare.value) == (record("k", "a"), b"a")
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
