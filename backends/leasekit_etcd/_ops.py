# A module over 500 lines: the transactions, their replies and the operations are one layer.
"""etcd's transactions and every operation built on them, as sans-I/O generators.

Each operation (:func:`acquire`, :func:`owner`, :func:`release`, :func:`release_grant`,
:func:`renew`, :func:`transfer`, and the extras :func:`record`, :func:`inspect`,
:func:`lease_ids`, :func:`revoke`, :func:`ping`) is a
:data:`leasekit.backend.Operation`: it yields a :class:`Call` (one etcd RPC and its
request; a tuple of them for calls that may run side by side) and is sent the reply,
or thrown the ``grpc.RpcError``. It knows no channel: the asyncio transport (``_aio``)
and the blocking one (``_blocking``) send the calls, with failover and one deadline
per operation. What an operation needs beyond
its arguments (the key prefix, the provider's etcd leases) is a :class:`Context`.
Each public factory validates its arguments before returning the generator, so
neither provider repeats that, and nothing is sent on bad input.

An etcd lease that a transaction leaves without a record (detached, or never bound)
goes back to the context's pool for the next acquire if the provider granted it, and
to ``Context.revoke`` (revoked in the background) if not. One that an operation
may have bound before it failed (its outcome unknown) is revoked, with whatever it
carries; so is, when a release's outcome is lost, the lease this provider bound the
record to (``_pool.Bindings``). What each operation costs in round trips, and why
release is a transaction rather than a bare revoke, is on the etcd page of the
documentation (``docs/backends/etcd.md``).

The transactions
----------------


etcd applies a transaction as one step of its replicated log: the comparisons and the
chosen branch see and change one revision of the store, with nothing in between, on
every member alike. So each write below is decided and done atomically, cluster-wide.

Layout (``_keys``): a live lease on key ``k`` held by ``o`` is the record
``R(k, o) = <prefix><escaped k>\\x00<o>`` with value ``o`` (``o\\x00m`` when the holder
stored metadata ``m`` with its grant), bound to an etcd lease whose TTL is the lease's
TTL in whole seconds (one more with ``reuse_leases``, see ``_pool``), carrying no other
record. Metadata is part of the record, so it is granted, handed on and deleted in the
same transaction as the record, and a denied acquire reads it with the holder. All
records of ``k`` sit in the holder range ``H(k)``; the transactions keep at most one
there. When the etcd lease expires or is revoked, etcd deletes the record in the same
step: that is expiry, on the leader's clock.

The fencing token is the record's ``create_revision``: the revision of the transaction
that created it, which is a grant of a free key or a transfer. etcd revisions grow
strictly across the whole cluster and survive restarts and leader changes, so tokens
do too. Re-putting the same record (the holder moving to a new etcd lease for a new
TTL) keeps ``create_revision``, so the holder keeps its token.

The writes by a holder compare that its record exists (``create_revision > 0``), not
its value: the name says whose it is, and the value may carry metadata. A renewal
that moves the record to another etcd lease puts it with ``ignore_value``, so it keeps
its metadata.

etcd refuses a transaction that puts and deletes the same key; these never do (a
transfer deletes ``R(k, from)`` and puts ``R(k, to)``, two names).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeAlias

from leasekit import (
    LeaseBackendError,
    LeaseResult,
    validate_key,
    validate_metadata,
    validate_owner,
    validate_ttl_ms,
)
from leasekit.backend import LeaseRecord, Operation

from . import _keys, _rpc
from ._members import status
from ._options import LIMIT
from ._pool import Bindings, CallAt, LeasePool

__all__ = [
    "Call",
    "Context",
    "Request",
    "acquire",
    "inspect",
    "lease_ids",
    "owner",
    "ping",
    "record",
    "release",
    "release_grant",
    "renew",
    "revoke",
    "transfer",
    "ttl_s",
]

_INSPECT_BATCH = 256
_SEEN_HELD_KEYS = 4096


@dataclass(frozen=True, slots=True)
class Call:
    """One etcd RPC to send: ``method`` names it on its service (``Range`` and ``Txn``
    on KV; ``LeaseGrant``, ``LeaseRevoke``, ``LeaseKeepAlive`` (one request, one reply
    on its stream), ``LeaseTimeToLive`` and ``LeaseLeases`` on Lease).

    ``safe``: sending it twice changes nothing (a read, a keep-alive, a revoke), so a
    transport may repeat it on another member after a timeout or a lost connection.
    """

    method: str
    request: _rpc.Request
    safe: bool


Request: TypeAlias = Call | tuple[Call, ...]
"""What an operation yields: a call (sent its reply) or calls that may run side by
side (sent the list of their replies, in order)."""

Op: TypeAlias = Generator[Request, Any, Any]


class Context:
    """What the operations of one provider share: the prefix and its etcd leases.

    ``pool`` keeps the etcd leases this provider granted for reuse (``reuse=False``:
    none, every empty lease is revoked); ``revoke_later(lease)`` is the transport's way
    to revoke one in the background; ``now()`` is the clock the pool's times are on,
    ``call_at(when, callback)`` the driver's way to run its timers on that clock.
    ``seen_held`` remembers keys seen held and the etcd lease their record was on, only
    hints: whether to look before granting, and which etcd lease to ask the time left
    of while the record is read. ``min_ttl_s`` is the shortest TTL etcd grants, as last learnt.
    """

    __slots__ = (
        "_revoke_later",
        "bindings",
        "min_ttl_s",
        "now",
        "pool",
        "prefix",
        "seen_held",
    )

    def __init__(
        self,
        prefix: bytes,
        *,
        reuse: bool,
        revoke_later: Callable[[int], None],
        now: Callable[[], float],
        call_at: CallAt,
        min_ttl_s: int,
    ) -> None:
        self.prefix = prefix
        self._revoke_later = revoke_later
        self.now = now
        self.pool = LeasePool(self.revoke, now=now, call_at=call_at, enabled=reuse)
        self.bindings = Bindings()
        self.seen_held = _RecentKeys(_SEEN_HELD_KEYS)
        self.min_ttl_s = min_ttl_s

    def revoke(self, lease: int) -> None:
        """Revoke ``lease`` in the background, forgotten here first: either one that no
        record is bound to, or one that a failed operation may have left."""
        self.pool.forget(lease)
        self.bindings.drop_lease(lease)
        self._revoke_later(lease)

    def granted_ttl_s(self, ttl_s: int) -> int:
        """The TTL etcd grants for a request of ``ttl_s``: never below its minimum."""
        return max(ttl_s, self.min_ttl_s)

    def learn_min_ttl(self, requested_s: int, granted_s: int) -> None:
        # etcd raises a short TTL to its minimum (1.5 election timeouts) and says so in
        # the grant; remembering it tells whether a keep-alive gives the TTL asked for.
        if granted_s > requested_s or granted_s == requested_s < self.min_ttl_s:
            self.min_ttl_s = granted_s

    def left_empty(self, lease: int) -> None:
        """``lease`` carries no record now: keep it for reuse if ours, else revoke it."""
        self.bindings.drop_lease(lease)
        if not self.pool.give_back(lease, self.now()):
            self.revoke(lease)


class _RecentKeys:
    """The last ``size`` keys this provider saw held (by anyone), oldest forgotten first,
    each with the etcd lease its record was seen on (0 if not known).

    Only hints, for how to acquire (look first, or grant first) and for which etcd
    lease to ask about while a record is read: a stale entry costs a round trip, never a
    wrong answer (and a lost update between threads no more).
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._keys: OrderedDict[str, int] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def lease_of(self, key: str) -> int:
        """The etcd lease ``key``'s record was last seen on, 0 if not known."""
        return self._keys.get(key, 0)

    def add(self, key: str, lease: int = 0) -> None:
        keys = self._keys
        keys[key] = lease
        try:
            keys.move_to_end(key)
            if len(keys) > self._size:
                keys.popitem(last=False)
        except KeyError:  # another thread changed it meanwhile: a hint, so let it be
            pass

    def discard(self, key: str) -> None:
        self._keys.pop(key, None)


def ttl_s(ttl_ms: int) -> int:
    """Whole seconds, rounded up: etcd lease TTLs are seconds."""
    return math.ceil(ttl_ms / 1000)


# -- the requests -------------------------------------------------------------------------------


def read_holder(start: bytes, end: bytes) -> _rpc.Request:
    """The holder's record of a key: the first (and only) key in ``H(k)``.

    A linearizable read (it goes through the leader's read index), so an acquire that
    sees a holder here is denied on current data, without writing anything.
    """
    return _rpc.range_request(start, end, limit=1)


def read_record(record: bytes) -> _rpc.Request:
    """One owner's record, ``R(k, o)``: present exactly while ``o`` holds ``k``."""
    return _rpc.range_request(record)


def acquire_free_txn(
    start: bytes, end: bytes, record: bytes, value: bytes, lease: int
) -> _rpc.Request:
    """Grant a free key: if ``H(k)`` is empty, create ``R(k, o)`` on ``lease``.

    Compare: ``create_revision == 0`` over all of ``H(k)`` (no record at all).
    Success: put ``R(k, o) = value`` (the owner, and its metadata) with ``lease``; the
    response header's revision is the record's ``create_revision``, the new token.
    Failure: read the holder's record in the same transaction, so the holder a denied
    caller is told about, and its metadata, are the ones that denied it, never a second
    read's.
    """
    return _rpc.txn_request(
        [_rpc.compare_create(start, end, 0)],
        [_rpc.put_op(record, value, lease)],
        [_rpc.range_op(start, end, limit=1)],
    )


def relet_txn(record: bytes, value: bytes | None, lease: int) -> _rpc.Request:
    """Move ``o``'s live record to a fresh ``lease`` (a new TTL), keeping its token.

    Compare: ``R(k, o)`` still exists (false if it is gone: expired, released,
    transferred). Success: put it again on ``lease`` with ``prev_kv``, which names the
    old etcd lease for the caller to revoke; ``create_revision`` is unchanged, so the
    token is too. The value becomes ``value`` (the holder's re-acquire sets its
    metadata), or stays as it is with ``None`` (a renewal keeps it). Failure: nothing.
    """
    return _rpc.txn_request(
        [_rpc.compare_exists(record)],
        [_rpc.put_op(record, value, lease, prev_kv=True)],
        [],
    )


def release_txn(record: bytes) -> _rpc.Request:
    """Free the key if ``o`` holds it: compare that ``R(k, o)`` exists, then delete it
    (and its metadata with it).

    ``prev_kv`` names the etcd lease the record was on, for the caller to revoke.
    Anyone else's release finds no such record and changes nothing.
    """
    return _rpc.txn_request(
        [_rpc.compare_exists(record)],
        [_rpc.delete_op(record, prev_kv=True)],
        [],
    )


def release_grant_txn(record: bytes, token: int) -> _rpc.Request:
    """Free the key if ``o`` holds it with fencing token ``token``: compare that
    ``R(k, o)`` has ``create_revision == token`` (so it exists), then delete it.

    The undo of a grant whose caller was cancelled (``leasekit.backend.SupportsReleaseGrant``):
    a later grant of the key to ``o`` is a new record with a new ``create_revision`` and
    is left alone. ``prev_kv`` names the etcd lease to revoke, as for :func:`release_txn`.
    """
    return _rpc.txn_request(
        [_rpc.compare_create(record, b"", token)],
        [_rpc.delete_op(record, prev_kv=True)],
        [],
    )


def transfer_txn(from_record: bytes, to_record: bytes, to_value: bytes, lease: int) -> _rpc.Request:
    """Hand a held key on without a gap: compare that ``R(k, from)`` exists, then in the
    same step delete it and create ``R(k, to) = to_value`` (the new owner and the
    metadata given for it, never the old holder's) on ``lease``.

    ``H(k)`` is never empty in between (there is no in between). The new record's
    ``create_revision`` (the response header's revision) is a new, larger token;
    ``prev_kv`` of the delete names the old etcd lease, for the caller to revoke. The
    caller handles ``from == to`` as a renewal, since both names would be the same key.
    """
    return _rpc.txn_request(
        [_rpc.compare_exists(from_record)],
        [_rpc.delete_op(from_record, prev_kv=True), _rpc.put_op(to_record, to_value, lease)],
        [],
    )


# -- reading the replies ------------------------------------------------------------------------

Listed = tuple[str, str, int, int, bytes | None]
"""A record as ``inspect`` first reads it: key, owner, token, etcd lease, metadata."""

Holder = tuple[str, bytes | None]
"""Who holds a key, and the metadata stored with its grant."""


def parsed(prefix: bytes, kv: _rpc.KeyValue) -> tuple[str, str, bytes | None] | None:
    """``(key, owner, metadata)`` of a record leasekit wrote, or None if it is not one:
    a name of ours, a value that starts with its owner, bound to an etcd lease."""
    names = _keys.split_record_name(prefix, kv.key)
    if names is None or not kv.lease:
        return None
    ours, metadata = _keys.split_record_value(names[1].encode(), kv.value)
    return (names[0], names[1], metadata) if ours else None


def holder_of(prefix: bytes, kv: _rpc.KeyValue, key: str | None) -> Holder:
    """The owner a record names and its metadata, checked against its value and its
    etcd lease."""
    found = parsed(prefix, kv)
    if found is None:
        raise LeaseBackendError(
            f"unexpected data at etcd key {kv.key!r:.80} ({kv.value!r:.40}); is another "
            f"program writing under the prefix {prefix.decode(errors='replace')!r}?",
            backend="etcd",
            key=key,
        )
    return found[1], found[2]


def holder(prefix: bytes, reply: _rpc.RangeResponse, key: str) -> _rpc.KeyValue | None:
    """The holder's record from :func:`read_holder`'s reply (checked), or None if free."""
    if not reply.kvs:
        return None
    holder_of(prefix, reply.kvs[0], key)
    return reply.kvs[0]


def denied_holder(prefix: bytes, reply: _rpc.TxnResponse, key: str) -> Holder | None:
    """Who held the key, and its metadata, when :func:`acquire_free_txn` took its failure
    branch, read in that same transaction: the holder that denied it."""
    kvs = reply.responses[0].response_range.kvs
    return holder_of(prefix, kvs[0], key) if kvs else None


def granted(reply: _rpc.LeaseGrantResponse) -> tuple[int, int]:
    """``(lease ID, granted TTL in seconds)`` of a grant, or LeaseBackendError if refused."""
    if reply.error:
        raise LeaseBackendError(f"lease grant refused: {reply.error}", backend="etcd")
    return reply.ID, reply.TTL


def moved_from(reply: _rpc.TxnResponse, fresh: int) -> tuple[int, int | None]:
    """After :func:`relet_txn` succeeded: the record's token, and the etcd lease it left.

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
        record = parsed(prefix, kv)
        if record is None:
            continue  # not ours; inspect reports, it does not judge
        key, owner, metadata = record
        found.append((key, owner, kv.create_revision, kv.lease, metadata))
    return found


# -- the operations -----------------------------------------------------------------------------


def owner(ctx: Context, key: str) -> Operation[Request, str | None]:
    """The live holder of ``key``, or None: one linearizable read."""
    validate_key(key)
    return _owner(ctx, key)


def acquire(
    ctx: Context, key: str, owner: str, ttl_ms: int, metadata: object = None
) -> Operation[Request, LeaseResult]:
    """Acquire ``key`` for ``owner`` (a :class:`~leasekit.LeaseResult`), storing
    ``metadata`` with the grant (the holder's re-acquire sets it; None clears it)."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    data = None if metadata is None else validate_metadata(metadata)
    return _acquire(ctx, key, owner, ttl_s(ttl_ms), data)


def record(ctx: Context, key: str) -> Operation[Request, LeaseRecord | None]:
    """The live lease of ``key`` (owner, token, metadata, time left), or None if free."""
    validate_key(key)
    return _record(ctx, key)


def renew(ctx: Context, key: str, owner: str, ttl_ms: int) -> Operation[Request, bool]:
    """Give ``owner``'s live lease on ``key`` a full ``ttl_ms`` again; False if not held."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    return _renew(ctx, key, owner, ttl_s(ttl_ms))


def release(ctx: Context, key: str, owner: str) -> Operation[Request, bool]:
    """Free ``key`` if ``owner`` holds it; whether it did (anyone else's changes nothing)."""
    validate_key(key)
    validate_owner(owner)
    return _release(ctx, key, owner)


def release_grant(ctx: Context, key: str, owner: str, token: int) -> Operation[Request, None]:
    """Free ``key`` if ``owner`` holds it with fencing token ``token`` (an undo)."""
    validate_key(key)
    validate_owner(owner)
    return _release_grant(ctx, key, owner, token)


def transfer(  # noqa: PLR0917 (the contract's arguments, in its order)
    ctx: Context, key: str, from_owner: str, to_owner: str, ttl_ms: int, metadata: object = None
) -> Operation[Request, bool]:
    """Hand ``key`` from ``from_owner`` to ``to_owner`` in one transaction, with
    ``metadata`` for the new owner (a renewal that sets the metadata when they are the
    same); False if ``from_owner`` does not hold it."""
    validate_key(key)
    validate_owner(from_owner, "from_owner")
    validate_owner(to_owner, "to_owner")
    validate_ttl_ms(ttl_ms)
    data = None if metadata is None else validate_metadata(metadata)
    value = _keys.record_value(to_owner.encode(), data)
    if from_owner == to_owner:
        return _renew(ctx, key, from_owner, ttl_s(ttl_ms), value)
    return _transfer(ctx, key, from_owner, to_owner, ttl_s(ttl_ms), value)


def inspect(
    ctx: Context, key_prefix: str | None, limit: int
) -> Operation[Request, list[LeaseRecord]]:
    """The live leases in key order (those of keys starting with ``key_prefix``)."""
    if key_prefix is not None:
        validate_key(key_prefix, "prefix")
    return _inspect(ctx, key_prefix, LIMIT.validate(limit))


def lease_ids() -> Operation[Request, list[int]]:
    """Every etcd lease in the cluster (``LeaseLeases``), sorted."""
    reply: _rpc.LeaseLeasesResponse = yield Call(
        "LeaseLeases", _rpc.lease_leases_request(), safe=True
    )
    return sorted(lease.ID for lease in reply.leases)


def ping(ctx: Context) -> Operation[Request, None]:
    """A cheap read (a check that the cluster answers)."""
    yield Call("Range", _rpc.range_request(ctx.prefix, keys_only=True), safe=True)


def revoke(lease_id: int) -> Operation[Request, None]:
    """Revoke an etcd lease (and delete what is bound to it); gone already is fine."""
    try:
        # Safe to repeat on another member: revoking twice ends the same way.
        yield Call("LeaseRevoke", _rpc.lease_revoke_request(lease_id), safe=True)
    except _rpc.RpcError as exc:
        if status(exc)[0] != _rpc.StatusCode.NOT_FOUND:
            raise


# -- their round trips --------------------------------------------------------------------------


def _range(request: _rpc.Request) -> Op:
    reply: _rpc.RangeResponse = yield Call("Range", request, safe=True)
    return reply


def _txn(request: _rpc.Request) -> Op:
    reply: _rpc.TxnResponse = yield Call("Txn", request, safe=False)
    return reply


def _grant(ctx: Context, ttl_s: int) -> Op:
    """A fresh etcd lease for a record of ``ttl_s`` (one second longer if reused)."""
    extra_s = ctx.pool.extra_s(ttl_s)
    sent_at = ctx.now()
    reply = yield Call("LeaseGrant", _rpc.lease_grant_request(ttl_s + extra_s), safe=False)
    lease, granted_s = granted(reply)
    ctx.learn_min_ttl(ttl_s + extra_s, granted_s)
    if extra_s:
        ctx.pool.granted(lease, granted_s, sent_at)
    return lease


def _keep_alive(ctx: Context, lease_id: int) -> Op:
    """Reset a lease's TTL to its granted TTL; returns that TTL, 0 if the lease is gone."""
    sent_at = ctx.now()
    reply: _rpc.LeaseKeepAliveResponse = yield Call(
        "LeaseKeepAlive", _rpc.lease_keep_alive_request(lease_id), safe=True
    )
    granted_s = reply.TTL
    if granted_s > 0:
        ctx.pool.kept_alive(lease_id, granted_s, sent_at)
    return granted_s


def _lease_for(ctx: Context, ttl_s: int) -> Op:
    """An etcd lease to bind a record of ``ttl_s`` to: an idle one of this provider's
    that still has the whole TTL ahead of it, else a fresh grant; and whether it was
    idle (its binding may find it gone, and then takes a fresh one)."""
    extra_s = ctx.pool.extra_s(ttl_s)
    if extra_s:
        idle = ctx.pool.take(ctx.granted_ttl_s(ttl_s + extra_s), ttl_s, ctx.now())
        if idle is not None:
            return idle, True
    return (yield from _grant(ctx, ttl_s)), False


def _bind(ctx: Context, ttl_s: int, build: Callable[[int], _rpc.Request]) -> Op:
    """The transaction ``build(lease)`` on a lease from :func:`_lease_for`; its reply,
    the lease, and whether that lease was idle before (the failure branch of a
    transaction does not check that etcd still has it).

    An idle lease that etcd no longer has (revoked by hand, or ended early) fails the
    whole transaction with "lease not found", so nothing was written: it is forgotten
    and the transaction sent again on a fresh grant. Any other failure leaves the
    outcome unknown, so the lease is revoked (with whatever it may carry).
    """
    lease, idle = yield from _lease_for(ctx, ttl_s)
    return (yield from _txn_on(ctx, ttl_s, lease, idle, build))


def _txn_on(
    ctx: Context, ttl_s: int, lease: int, idle: bool, build: Callable[[int], _rpc.Request]
) -> Op:
    """:func:`_bind`'s transaction on a lease already chosen."""
    while True:
        try:
            return (yield from _txn(build(lease))), lease, idle
        except _rpc.RpcError as exc:
            if not (idle and _lease_gone(exc)):
                ctx.revoke(lease)
                raise
            ctx.pool.forget(lease)
        except BaseException:  # cancelled (closed), or not a gRPC failure
            ctx.revoke(lease)
            raise
        lease, idle = (yield from _grant(ctx, ttl_s)), False


def _owner(ctx: Context, key: str) -> Op:
    start, end = _keys.holder_range(ctx.prefix, key)
    kv = holder(ctx.prefix, (yield from _range(read_holder(start, end))), key)
    return None if kv is None else holder_of(ctx.prefix, kv, key)[0]


def _time_to_live(lease: int) -> Call:
    return Call("LeaseTimeToLive", _rpc.lease_time_to_live_request(lease), safe=True)


def _record(ctx: Context, key: str) -> Op:
    start, end = _keys.holder_range(ctx.prefix, key)
    seen = ctx.seen_held
    ended = 0
    while True:
        # The time left is the etcd lease's, by etcd's lessor (whole seconds, rounded
        # down, so never more than is left), which no read of the record can return. If
        # this provider knows which etcd lease the record was on, both are asked side by
        # side: one round trip while the record stays there (renewed by keep-alives).
        guess = seen.lease_of(key)
        ttl: _rpc.LeaseTimeToLiveResponse | None = None
        if guess:
            reply, ttl = yield (
                Call("Range", read_holder(start, end), safe=True),
                _time_to_live(guess),
            )
        else:
            reply = yield from _range(read_holder(start, end))
        kv = holder(ctx.prefix, reply, key)
        if kv is None:
            seen.discard(key)
            return None
        seen.add(key, kv.lease)
        if ttl is None or kv.lease != guess:
            ttl = yield _time_to_live(kv.lease)
        if ttl.TTL >= 0 or kv.lease == ended:
            owner, metadata = holder_of(ctx.prefix, kv, key)
            # Under a second left; or the etcd lease ran out (twice on the same one) and
            # its record, still there, is about to be deleted with it.
            return LeaseRecord(key, owner, kv.create_revision, max(ttl.TTL * 1000, 1), metadata)
        # The etcd lease is gone or ran out: the record expired with it (etcd deletes it
        # within half a second), or moved to another etcd lease between the two calls (a
        # renewal for another TTL). Look again.
        ended = kv.lease
        seen.add(key)


def _acquire(ctx: Context, key: str, owner: str, ttl_s: int, metadata: bytes | None) -> Op:
    start, end = _keys.holder_range(ctx.prefix, key)
    record = _keys.record_name(ctx.prefix, key, owner)
    value = _keys.record_value(owner.encode(), metadata)
    seen = ctx.seen_held
    look_first = key in seen
    while True:
        if look_first:
            # A key this provider saw held: look before granting, so a held key costs
            # one read and writes nothing.
            kv = holder(ctx.prefix, (yield from _range(read_holder(start, end))), key)
            if kv is not None:
                holder_now, holder_metadata = holder_of(ctx.prefix, kv, key)
                if holder_now != owner:
                    seen.add(key, kv.lease)
                    return LeaseResult(False, holder_now, None, holder_metadata)
                # Ours: a full TTL again, and the metadata given now if it differs.
                rewrite = None if kv.value == value else value
                on = yield from _reset_ttl(ctx, record, kv.lease, ttl_s, rewrite)
                if on:
                    seen.add(key, on)
                    return LeaseResult(True, owner, kv.create_revision, metadata)
                continue  # our record ended meanwhile (expired): look again
        # Otherwise expect it free: take it in one transaction, on an idle etcd lease of
        # this provider's, or on one granted first.
        reply, lease, idle = yield from _bind(
            ctx, ttl_s, lambda lease: acquire_free_txn(start, end, record, value, lease)
        )
        if reply.succeeded:
            ctx.bindings.bound(record, lease)
            seen.add(key, lease)
            return LeaseResult(True, owner, reply.header.revision, metadata)
        holder_then = denied_holder(ctx.prefix, reply, key)
        if holder_then is not None and holder_then[0] == owner:
            # Already ours: move our record onto that lease (the requested TTL), keeping
            # its token, with the metadata given now.
            moved = yield from _relet_onto(ctx, record, ttl_s, lease, value, idle=idle)
            if moved is not None:
                seen.add(key, moved[1])
                return LeaseResult(True, owner, moved[0], metadata)
        else:
            # Never bound (the transaction took its failure branch): it carries
            # nothing, so it can be bound again.
            ctx.left_empty(lease)
            if holder_then is not None:
                seen.add(key, reply.responses[0].response_range.kvs[0].lease)
                return LeaseResult(False, holder_then[0], None, holder_then[1])
        look_first = True  # it changed under us: look, then decide


def _renew(ctx: Context, key: str, owner: str, ttl_s: int, value: bytes | None = None) -> Op:
    record = _keys.record_name(ctx.prefix, key, owner)
    kv = holder(ctx.prefix, (yield from _range(read_record(record))), key)
    if kv is None:
        return False
    rewrite = None if value is None or kv.value == value else value
    return bool((yield from _reset_ttl(ctx, record, kv.lease, ttl_s, rewrite)))


def _reset_ttl(ctx: Context, record: bytes, lease: int, ttl_s: int, value: bytes | None) -> Op:
    """Give a live record a full ``ttl_s`` again, and the value ``value`` (None: keep
    the one it has); returns the etcd lease it is on then, 0 if it ended."""
    if value is None:
        ctx.bindings.keep_if_on(record, lease)
        granted_s = yield from _keep_alive(ctx, lease)
        if granted_s <= 0:
            return 0  # the etcd lease expired: the record is gone with it
        granted = ctx.granted_ttl_s
        if granted(ttl_s) <= granted_s <= granted(ttl_s + ctx.pool.extra_s(ttl_s)):
            return lease
    # A keep-alive restores the TTL the etcd lease was granted with; a different TTL
    # needs another etcd lease, and the record moved onto it. A new value needs a put
    # anyway, so it moves too, in the same transaction (and needs no keep-alive).
    fresh, idle = yield from _lease_for(ctx, ttl_s)
    moved = yield from _relet_onto(ctx, record, ttl_s, fresh, value, idle=idle)
    return 0 if moved is None else moved[1]


def _relet_onto(
    ctx: Context, record: bytes, ttl_s: int, fresh: int, value: bytes | None, *, idle: bool
) -> Op:
    """Move a live record onto the etcd lease ``fresh`` (with the value ``value``, or
    the one it has if None) and let the old lease go; returns the (unchanged) token and
    the etcd lease it is on now, or None if it ended (``fresh`` unused).

    Neither lease carries a record then: either is kept for reuse if it is this
    provider's, revoked in the background if not. An ``idle`` lease that etcd no longer
    has fails the move with nothing written; the move is retried on a fresh grant
    (:func:`_bind`).
    """
    reply, fresh, _ = yield from _txn_on(
        ctx, ttl_s, fresh, idle, lambda lease: relet_txn(record, value, lease)
    )
    if not reply.succeeded:
        ctx.left_empty(fresh)
        return None
    token, left = moved_from(reply, fresh)
    if left is not None:
        ctx.left_empty(left)
    ctx.bindings.bound(record, fresh)
    return token, fresh


def _release(ctx: Context, key: str, owner: str) -> Op:
    record = _keys.record_name(ctx.prefix, key, owner)
    bindings = ctx.bindings
    try:
        reply = yield from _txn(release_txn(record))
    except BaseException:
        # Cancelled (the operation closed), or failed after the transaction may have
        # been sent: it may land now, later or never. Revoking the etcd lease this
        # provider bound the record to ends the record if it did not, and the lease it
        # left empty if it did (which no reply will name).
        lease = bindings.pop(record)
        if lease is not None:
            ctx.revoke(lease)
        raise
    bindings.pop(record)
    if reply.succeeded:
        # The key is free from this transaction on. The etcd lease the record was on
        # now carries nothing: revoking it is housekeeping, off the caller's path.
        ctx.seen_held.discard(key)
        for lease in detached_leases(reply):
            ctx.left_empty(lease)
    return bool(reply.succeeded)


def _release_grant(ctx: Context, key: str, owner: str, token: int) -> Op:
    record = _keys.record_name(ctx.prefix, key, owner)
    reply = yield from _txn(release_grant_txn(record, token))
    if reply.succeeded:
        ctx.seen_held.discard(key)
        for lease in detached_leases(reply):
            ctx.left_empty(lease)


def _transfer(  # noqa: PLR0917 (transfer's arguments, in its order)
    ctx: Context, key: str, from_owner: str, to_owner: str, ttl_s: int, value: bytes
) -> Op:
    from_record = _keys.record_name(ctx.prefix, key, from_owner)
    to_record = _keys.record_name(ctx.prefix, key, to_owner)
    reply, lease, _ = yield from _bind(
        ctx, ttl_s, lambda lease: transfer_txn(from_record, to_record, value, lease)
    )
    if not reply.succeeded:
        ctx.left_empty(lease)  # never bound
        return False
    ctx.bindings.pop(from_record)
    for detached in detached_leases(reply, bound=lease):
        ctx.left_empty(detached)  # its record was just deleted
    ctx.bindings.bound(to_record, lease)
    return True


def _inspect(ctx: Context, key_prefix: str | None, limit: int) -> Op:
    start, end = _keys.prefix_range(ctx.prefix, key_prefix)
    found: list[Listed] = []
    while len(found) < limit:
        batch = yield from _range(
            _rpc.range_request(start, end, limit=min(_INSPECT_BATCH, limit - len(found)))
        )
        found.extend(listed(ctx.prefix, batch))
        if not batch.more or not batch.kvs:
            break
        start = batch.kvs[-1].key + b"\x00"
    # The remaining time of every lease found, asked side by side.
    ttls: list[_rpc.LeaseTimeToLiveResponse] = (
        (
            yield tuple(
                Call("LeaseTimeToLive", _rpc.lease_time_to_live_request(lease), safe=True)
                for _, _, _, lease, _ in found
            )
        )
        if found
        else []
    )
    return [
        LeaseRecord(key, owner, token, ttl.TTL * 1000, metadata)
        for (key, owner, token, _, metadata), ttl in zip(found, ttls, strict=True)
        if ttl.TTL > 0
    ]


def _lease_gone(exc: Exception) -> bool:
    """Whether etcd refused a transaction for naming a lease it does not have (then the
    whole transaction was refused: nothing was written)."""
    code, details = status(exc)
    return code == _rpc.StatusCode.NOT_FOUND and "lease not found" in details
