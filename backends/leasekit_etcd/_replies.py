"""How to read etcd's replies to the requests in ``_txn``: pure functions, no I/O.

``_txn`` says what to send, this module what the answer means, and ``_operation``
only sends and receives, so the same operations can be driven by a blocking gRPC
channel as well as an asyncio one. Each function takes the protobuf reply (typed by
the protocols in ``_rpc``) and returns plain values; a record that leasekit did not
write raises :class:`~leasekit.LeaseBackendError` instead of being misread.
"""

from __future__ import annotations

from leasekit import LeaseBackendError

from . import _keys, _rpc

__all__ = [
    "Listed",
    "denied_holder",
    "detached_leases",
    "granted",
    "holder",
    "listed",
    "moved_from",
    "owner_of",
]

Listed = tuple[str, str, int, int]
"""A record as ``inspect`` first reads it: key, owner, token, etcd lease."""


def owner_of(prefix: bytes, kv: _rpc.KeyValue, key: str | None) -> str:
    """The owner a record names, checked against its value and its etcd lease."""
    parsed = _keys.split_record_name(prefix, kv.key)
    if parsed is None or parsed[1].encode() != kv.value or not kv.lease:
        raise LeaseBackendError(
            f"unexpected data at etcd key {kv.key!r:.80} ({kv.value!r:.40}); is another "
            f"program writing under the prefix {prefix.decode(errors='replace')!r}?",
            backend="etcd",
            key=key,
        )
    return parsed[1]


def holder(prefix: bytes, reply: _rpc.RangeResponse, key: str) -> _rpc.KeyValue | None:
    """The holder's record from ``_txn.read_holder``'s reply (checked), or None if free."""
    if not reply.kvs:
        return None
    owner_of(prefix, reply.kvs[0], key)
    return reply.kvs[0]


def denied_holder(prefix: bytes, reply: _rpc.TxnResponse, key: str) -> str | None:
    """Who held the key when ``_txn.acquire_free`` took its failure branch, read in
    that same transaction: the holder that denied it."""
    kvs = reply.responses[0].response_range.kvs
    return owner_of(prefix, kvs[0], key) if kvs else None


def granted(reply: _rpc.LeaseGrantResponse) -> tuple[int, int]:
    """``(lease ID, granted TTL in seconds)`` of a grant, or LeaseBackendError if refused."""
    if reply.error:
        raise LeaseBackendError(f"lease grant refused: {reply.error}", backend="etcd")
    return reply.ID, reply.TTL


def moved_from(reply: _rpc.TxnResponse, fresh: int) -> tuple[int, int | None]:
    """After ``_txn.relet`` succeeded: the record's token, and the etcd lease it left.

    The lease is None when there is nothing to revoke (the record was already on
    ``fresh``, or on none).
    """
    previous = reply.responses[0].response_put.prev_kv
    left = previous.lease if previous.lease and previous.lease != fresh else None
    return previous.create_revision, left


def detached_leases(reply: _rpc.TxnResponse, bound: int = 0) -> list[int]:
    """The etcd leases whose records a release or transfer deleted (not ``bound``)."""
    deleted = reply.responses[0].response_delete_range.prev_kvs
    return [kv.lease for kv in deleted if kv.lease and kv.lease != bound]


def listed(prefix: bytes, reply: _rpc.RangeResponse) -> list[Listed]:
    """The records in one ``inspect`` batch; what leasekit did not write is skipped."""
    found: list[Listed] = []
    for kv in reply.kvs:
        parsed = _keys.split_record_name(prefix, kv.key)
        if parsed is None or parsed[1].encode() != kv.value or not kv.lease:
            continue  # not ours; inspect reports, it does not judge
        found.append((parsed[0], parsed[1], kv.create_revision, kv.lease))
    return found
