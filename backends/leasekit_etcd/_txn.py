"""Every etcd transaction the backend runs, each in one place with why it is atomic.

etcd applies a transaction as one step of its replicated log: the comparisons and the
chosen branch see and change one revision of the store, with nothing in between, on
every member alike. So each write below is decided and done atomically, cluster-wide.

Layout (``_keys``): a live lease on key ``k`` held by ``o`` is the record
``R(k, o) = <prefix><escaped k>\\x00<o>`` with value ``o``, bound to an etcd lease
whose TTL is the lease's TTL in whole seconds (one more with ``reuse_leases``, see
``_pool``), carrying no other record. All records of ``k`` sit in the holder
range ``H(k)``; the transactions keep at most one there. When the etcd lease expires
or is revoked, etcd deletes the record in the same step: that is expiry, on the
leader's clock.

The fencing token is the record's ``create_revision``: the revision of the transaction
that created it, which is a grant of a free key or a transfer. etcd revisions grow
strictly across the whole cluster and survive restarts and leader changes, so tokens
do too. Re-putting the same record (the holder moving to a new etcd lease for a new
TTL) keeps ``create_revision``, so the holder keeps its token.

etcd refuses a transaction that puts and deletes the same key; these never do (a
transfer deletes ``R(k, from)`` and puts ``R(k, to)``, two names).
"""

from __future__ import annotations

from . import _rpc

__all__ = [
    "acquire_free",
    "read_holder",
    "read_record",
    "release",
    "release_grant",
    "relet",
    "transfer",
]


def read_holder(start: bytes, end: bytes) -> _rpc.Request:
    """The holder's record of a key: the first (and only) key in ``H(k)``.

    A linearizable read (it goes through the leader's read index), so an acquire that
    sees a holder here is denied on current data, without writing anything.
    """
    return _rpc.range_request(start, end, limit=1)


def read_record(record: bytes) -> _rpc.Request:
    """One owner's record, ``R(k, o)``: present exactly while ``o`` holds ``k``."""
    return _rpc.range_request(record)


def acquire_free(start: bytes, end: bytes, record: bytes, owner: bytes, lease: int) -> _rpc.Request:
    """Grant a free key: if ``H(k)`` is empty, create ``R(k, o)`` on ``lease``.

    Compare: ``create_revision == 0`` over all of ``H(k)`` (no record at all).
    Success: put ``R(k, o) = o`` with ``lease``; the response header's revision is the
    record's ``create_revision``, the new token. Failure: read the holder's record in
    the same transaction, so the holder a denied caller is told about is the one that
    denied it, never a second read's.
    """
    return _rpc.txn_request(
        [_rpc.compare_create(start, end, 0)],
        [_rpc.put_op(record, owner, lease)],
        [_rpc.range_op(start, end, limit=1)],
    )


def relet(record: bytes, owner: bytes, lease: int) -> _rpc.Request:
    """Move ``o``'s live record to a fresh ``lease`` (a new TTL), keeping its token.

    Compare: ``R(k, o)`` still has value ``o`` (false if it is gone: expired, released,
    transferred). Success: put it again on ``lease`` with ``prev_kv``, which names the
    old etcd lease for the caller to revoke; ``create_revision`` is unchanged, so the
    token is too. Failure: nothing.
    """
    return _rpc.txn_request(
        [_rpc.compare_value(record, owner)],
        [_rpc.put_op(record, owner, lease, prev_kv=True)],
        [],
    )


def release(record: bytes, owner: bytes) -> _rpc.Request:
    """Free the key if ``o`` holds it: compare ``R(k, o) == o``, then delete it.

    ``prev_kv`` names the etcd lease the record was on, for the caller to revoke.
    Anyone else's release finds no such record and changes nothing.
    """
    return _rpc.txn_request(
        [_rpc.compare_value(record, owner)],
        [_rpc.delete_op(record, prev_kv=True)],
        [],
    )


def release_grant(record: bytes, owner: bytes, token: int) -> _rpc.Request:
    """Free the key if ``o`` holds it with fencing token ``token``: compare ``R(k, o) ==
    o`` and its ``create_revision == token``, then delete it.

    The undo of a grant whose caller was cancelled (``leasekit.backend.SupportsReleaseGrant``):
    a later grant of the key to ``o`` is a new record with a new ``create_revision`` and
    is left alone. ``prev_kv`` names the etcd lease to revoke, as for :func:`release`.
    """
    return _rpc.txn_request(
        [_rpc.compare_value(record, owner), _rpc.compare_create(record, b"", token)],
        [_rpc.delete_op(record, prev_kv=True)],
        [],
    )


def transfer(
    from_record: bytes, from_owner: bytes, to_record: bytes, to_owner: bytes, lease: int
) -> _rpc.Request:
    """Hand a held key on without a gap: compare ``R(k, from) == from``, then in the
    same step delete it and create ``R(k, to)`` on ``lease``.

    ``H(k)`` is never empty in between (there is no in between). The new record's
    ``create_revision`` (the response header's revision) is a new, larger token;
    ``prev_kv`` of the delete names the old etcd lease, for the caller to revoke. The
    caller handles ``from == to`` as a renewal, since both names would be the same key.
    """
    return _rpc.txn_request(
        [_rpc.compare_value(from_record, from_owner)],
        [_rpc.delete_op(from_record, prev_kv=True), _rpc.put_op(to_record, to_owner, lease)],
        [],
    )
