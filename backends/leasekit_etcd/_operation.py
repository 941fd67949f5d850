"""One contract operation on etcd: its round trips, sharing one deadline and one member list.

Each method is one operation's sequence of requests (built in ``_txn`` and ``_rpc``) and
the reading of their replies; :class:`~leasekit_etcd.EtcdLeaseProvider` bounds the whole
operation by ``timeout_s`` and maps its errors. What each operation costs in round
trips, and why release is a transaction rather than a bare revoke, is on the etcd page
of the documentation (``docs/backends/etcd.md``).

An etcd lease that a transaction leaves without a record (detached, or never bound)
goes back to the provider's ``_pool`` for the next acquire if the provider granted
it, and to ``provider._revoke_later`` (revoked in the background) if not. One that an
operation may have bound before it failed (its outcome unknown) is revoked, with
whatever it carries; so is, when a release's outcome is lost, the lease this provider
bound the record to (``_pool.Bindings``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from leasekit import LeaseResult
from leasekit.backend import LeaseRecord

from . import _keys, _replies, _rpc, _txn
from ._members import Members, status

if TYPE_CHECKING:
    from ._provider import EtcdLeaseProvider

__all__ = ["Operation"]

_T = TypeVar("_T")
_INSPECT_BATCH = 256
_INSPECT_PARALLEL = 32


class Operation:
    """One contract operation: its round trips share one deadline and one member list."""

    def __init__(self, provider: EtcdLeaseProvider, members: Members, deadline: float) -> None:
        self.provider = provider
        self.members = members
        self.deadline = deadline
        self.prefix = provider._prefix

    # -- round trips ------------------------------------------------------------------

    async def _call(
        self, invoke: Callable[[_rpc.Stubs, Any, float], Awaitable[_T]], *, safe: bool
    ) -> _T:
        return await self.members.call(invoke, deadline=self.deadline, safe=safe)

    async def range(self, request: _rpc.Request) -> _rpc.RangeResponse:
        response: _rpc.RangeResponse = await self._call(
            lambda s, md, t: s.kv.Range(request, timeout=t, metadata=md), safe=True
        )
        return response

    async def txn(self, request: _rpc.Request) -> _rpc.TxnResponse:
        response: _rpc.TxnResponse = await self._call(
            lambda s, md, t: s.kv.Txn(request, timeout=t, metadata=md), safe=False
        )
        return response

    async def grant(self, ttl_s: int) -> int:
        """A fresh etcd lease for a record of ``ttl_s`` (one second longer if reused)."""
        extra_s = self.provider._pool.extra_s(ttl_s)
        request = _rpc.lease_grant_request(ttl_s + extra_s)
        sent_at = asyncio.get_running_loop().time()
        response: _rpc.LeaseGrantResponse = await self._call(
            lambda s, md, t: s.lease.LeaseGrant(request, timeout=t, metadata=md), safe=False
        )
        lease, granted_s = _replies.granted(response)
        self.provider._learn_min_ttl(ttl_s + extra_s, granted_s)
        if extra_s:
            self.provider._pool.granted(lease, granted_s, sent_at)
        return lease

    async def lease_for(self, ttl_s: int) -> tuple[int, bool]:
        """An etcd lease to bind a record of ``ttl_s`` to: an idle one of this provider's
        that still has the whole TTL ahead of it, else a fresh grant; and whether it
        was idle (its binding may find it gone, and then takes a fresh one)."""
        pool = self.provider._pool
        extra_s = pool.extra_s(ttl_s)
        if extra_s:
            granted_s = self.provider._granted_ttl_s(ttl_s + extra_s)
            idle = pool.take(granted_s, ttl_s, asyncio.get_running_loop().time())
            if idle is not None:
                return idle, True
        return await self.grant(ttl_s), False

    async def bind(
        self, ttl_s: int, build: Callable[[int], _rpc.Request]
    ) -> tuple[_rpc.TxnResponse, int, bool]:
        """The transaction ``build(lease)`` on a lease from :meth:`lease_for`; its reply,
        the lease, and whether that lease was idle before (the failure branch of a
        transaction does not check that etcd still has it).

        An idle lease that etcd no longer has (revoked by hand, or ended early) fails
        the whole transaction with "lease not found", so nothing was written: it is
        forgotten and the transaction sent again on a fresh grant. Any other failure
        leaves the outcome unknown, so the lease is revoked (with whatever it may carry).
        """
        lease, idle = await self.lease_for(ttl_s)
        return await self._txn_on(ttl_s, lease, idle, build)

    async def _txn_on(
        self, ttl_s: int, lease: int, idle: bool, build: Callable[[int], _rpc.Request]
    ) -> tuple[_rpc.TxnResponse, int, bool]:
        """:meth:`bind`'s transaction on a lease already chosen."""
        try:
            return await self.txn(build(lease)), lease, idle
        except _rpc.AioRpcError as exc:
            if not (idle and _lease_gone(exc)):
                self.provider._revoke_later(lease)
                raise
            self.provider._pool.forget(lease)
        except BaseException:
            self.provider._revoke_later(lease)
            raise
        return await self._txn_on(ttl_s, await self.grant(ttl_s), False, build)

    def left_empty(self, lease: int) -> None:
        """``lease`` carries no record now: keep it for reuse if ours, else revoke it."""
        self.provider._bindings.drop_lease(lease)
        now = asyncio.get_running_loop().time()
        if not self.provider._pool.give_back(lease, now):
            self.provider._revoke_later(lease)

    async def revoke(self, lease_id: int) -> None:
        """Revoke an etcd lease (and delete what is bound to it); gone already is fine."""
        request = _rpc.lease_revoke_request(lease_id)

        async def invoke(stubs: _rpc.Stubs, metadata: Any, timeout_s: float) -> None:
            try:
                await stubs.lease.LeaseRevoke(request, timeout=timeout_s, metadata=metadata)
            except _rpc.AioRpcError as exc:
                if exc.code() != _rpc.StatusCode.NOT_FOUND:  # type: ignore[attr-defined]
                    raise

        # Safe to repeat on another member: revoking twice ends the same way.
        await self._call(invoke, safe=True)

    async def keep_alive(self, lease_id: int) -> int:
        """Reset a lease's TTL to its granted TTL; returns that TTL, 0 if the lease is gone."""
        request = _rpc.lease_keep_alive_request(lease_id)

        async def invoke(stubs: _rpc.Stubs, metadata: Any, timeout_s: float) -> int:
            call = stubs.lease.LeaseKeepAlive(timeout=timeout_s, metadata=metadata)
            try:
                await call.write(request)
                response: _rpc.LeaseKeepAliveResponse = await call.read()
                # Half-close and wait for etcd to end the stream, so that no event of
                # this call is still in flight when the caller's event loop closes.
                await call.done_writing()
                await call.code()
            except BaseException:
                call.cancel()
                raise
            return response.TTL

        sent_at = asyncio.get_running_loop().time()
        granted_s = await self._call(invoke, safe=True)
        if granted_s > 0:
            self.provider._pool.kept_alive(lease_id, granted_s, sent_at)
        return granted_s

    # -- the operations -------------------------------------------------------------------

    async def owner(self, key: str) -> str | None:
        start, end = _keys.holder_range(self.prefix, key)
        kv = _replies.holder(self.prefix, await self.range(_txn.read_holder(start, end)), key)
        return None if kv is None else kv.value.decode()

    async def acquire(self, key: str, owner: str, ttl_s: int) -> LeaseResult:
        start, end = _keys.holder_range(self.prefix, key)
        record = _keys.record_name(self.prefix, key, owner)
        owner_b = owner.encode()
        seen = self.provider._seen_held
        look_first = key in seen
        while True:
            if look_first:
                # A key this provider saw held: look before granting, so a held key
                # costs one read and writes nothing.
                found = await self.range(_txn.read_holder(start, end))
                kv = _replies.holder(self.prefix, found, key)
                if kv is not None:
                    holder = kv.value.decode()
                    if holder != owner:
                        seen.add(key)
                        return LeaseResult(False, holder, None)
                    if await self._reset_ttl(record, owner, kv.lease, ttl_s):
                        seen.add(key)
                        return LeaseResult(True, owner, kv.create_revision)
                    continue  # our record ended meanwhile (expired): look again
            # Otherwise expect it free: take it in one transaction, on an idle etcd
            # lease of this provider's, or on one granted first.
            reply, lease, idle = await self.bind(
                ttl_s, lambda lease: _txn.acquire_free(start, end, record, owner_b, lease)
            )
            if reply.succeeded:
                self.provider._bindings.bound(record, lease)
                seen.add(key)
                return LeaseResult(True, owner, reply.header.revision)
            holder_now = _replies.denied_holder(self.prefix, reply, key)
            if holder_now == owner:
                # Already ours: move our record onto that lease (the requested TTL),
                # keeping its token.
                token = await self._relet_onto(record, owner, ttl_s, lease, idle)
                if token is not None:
                    seen.add(key)
                    return LeaseResult(True, owner, token)
            else:
                # Never bound (the transaction took its failure branch): it carries
                # nothing, so it can be bound again.
                self.left_empty(lease)
                if holder_now is not None:
                    seen.add(key)
                    return LeaseResult(False, holder_now, None)
            look_first = True  # it changed under us: look, then decide

    async def renew(self, key: str, owner: str, ttl_s: int) -> bool:
        record = _keys.record_name(self.prefix, key, owner)
        kv = _replies.holder(self.prefix, await self.range(_txn.read_record(record)), key)
        if kv is None:
            return False
        return await self._reset_ttl(record, owner, kv.lease, ttl_s)

    async def _reset_ttl(self, record: bytes, owner: str, lease: int, ttl_s: int) -> bool:
        """Give ``owner``'s live record a full ``ttl_s`` again; False if it ended."""
        self.provider._bindings.keep_if_on(record, lease)
        granted_s = await self.keep_alive(lease)
        if granted_s <= 0:
            return False  # the etcd lease expired: the record is gone with it
        granted = self.provider._granted_ttl_s
        if granted(ttl_s) <= granted_s <= granted(ttl_s + self.provider._pool.extra_s(ttl_s)):
            return True
        # A keep-alive restores the TTL the etcd lease was granted with; a different
        # TTL needs another etcd lease, and the record moved onto it.
        fresh, idle = await self.lease_for(ttl_s)
        return await self._relet_onto(record, owner, ttl_s, fresh, idle) is not None

    async def _relet_onto(
        self, record: bytes, owner: str, ttl_s: int, fresh: int, idle: bool
    ) -> int | None:
        """Move ``owner``'s live record onto the etcd lease ``fresh`` and let the old one
        go; returns the (unchanged) token, or None if it ended (``fresh`` unused).

        Neither lease carries a record then: either is kept for reuse if it is this
        provider's, revoked in the background if not. An ``idle`` lease that etcd no
        longer has fails the move with nothing written; the move is retried on a
        fresh grant (:meth:`bind`).
        """
        owner_b = owner.encode()
        reply, fresh, _ = await self._txn_on(
            ttl_s, fresh, idle, lambda lease: _txn.relet(record, owner_b, lease)
        )
        if not reply.succeeded:
            self.left_empty(fresh)
            return None
        token, left = _replies.moved_from(reply, fresh)
        if left is not None:
            self.left_empty(left)
        self.provider._bindings.bound(record, fresh)
        return token

    async def release(self, key: str, owner: str) -> None:
        record = _keys.record_name(self.prefix, key, owner)
        bindings = self.provider._bindings
        try:
            reply = await self.txn(_txn.release(record, owner.encode()))
        except (Exception, asyncio.CancelledError):
            # Cancelled, or failed after the transaction may have been sent: it may land
            # now, later or never. Revoking the etcd lease this provider bound the
            # record to ends the record if it did not, and the lease it left empty if
            # it did (which no reply will name).
            lease = bindings.pop(record)
            if lease is not None:
                self.provider._revoke_later(lease)
            raise
        bindings.pop(record)
        if reply.succeeded:
            # The key is free from this transaction on. The etcd lease the record was
            # on now carries nothing: revoking it is housekeeping, off the caller's path.
            self.provider._seen_held.discard(key)
            for lease in _replies.detached_leases(reply):
                self.left_empty(lease)

    async def release_grant(self, key: str, owner: str, token: int) -> None:
        record = _keys.record_name(self.prefix, key, owner)
        reply = await self.txn(_txn.release_grant(record, owner.encode(), token))
        if reply.succeeded:
            self.provider._seen_held.discard(key)
            for lease in _replies.detached_leases(reply):
                self.left_empty(lease)

    async def transfer(self, key: str, from_owner: str, to_owner: str, ttl_s: int) -> bool:
        from_record = _keys.record_name(self.prefix, key, from_owner)
        to_record = _keys.record_name(self.prefix, key, to_owner)
        from_b, to_b = from_owner.encode(), to_owner.encode()
        reply, lease, _ = await self.bind(
            ttl_s, lambda lease: _txn.transfer(from_record, from_b, to_record, to_b, lease)
        )
        if not reply.succeeded:
            self.left_empty(lease)  # never bound
            return False
        self.provider._bindings.pop(from_record)
        for detached in _replies.detached_leases(reply, bound=lease):
            self.left_empty(detached)  # its record was just deleted
        self.provider._bindings.bound(to_record, lease)
        return True

    async def inspect(self, key_prefix: str | None, limit: int) -> list[LeaseRecord]:
        start, end = _keys.prefix_range(self.prefix, key_prefix)
        found: list[_replies.Listed] = []
        while len(found) < limit:
            batch = await self.range(
                _rpc.range_request(start, end, limit=min(_INSPECT_BATCH, limit - len(found)))
            )
            found.extend(_replies.listed(self.prefix, batch))
            if not batch.more or not batch.kvs:
                break
            start = batch.kvs[-1].key + b"\x00"
        gate = asyncio.Semaphore(_INSPECT_PARALLEL)

        async def remaining_s(lease_id: int) -> int:
            request = _rpc.lease_time_to_live_request(lease_id)
            async with gate:
                response: _rpc.LeaseTimeToLiveResponse = await self._call(
                    lambda s, md, t: s.lease.LeaseTimeToLive(request, timeout=t, metadata=md),
                    safe=True,
                )
            return response.TTL

        ttls = await asyncio.gather(*(remaining_s(lease) for *_, lease in found))
        return [
            LeaseRecord(key, owner, token, ttl * 1000)
            for (key, owner, token, _), ttl in zip(found, ttls, strict=True)
            if ttl > 0
        ]

    async def lease_ids(self) -> list[int]:
        request = _rpc.lease_leases_request()
        response: _rpc.LeaseLeasesResponse = await self._call(
            lambda s, md, t: s.lease.LeaseLeases(request, timeout=t, metadata=md), safe=True
        )
        return sorted(status.ID for status in response.leases)

    async def ping(self) -> None:
        await self.range(_rpc.range_request(self.prefix, keys_only=True))


def _lease_gone(exc: Exception) -> bool:
    """Whether etcd refused a transaction for naming a lease it does not have (then
    the whole transaction was refused: nothing was written)."""
    code, details = status(exc)
    return code == _rpc.StatusCode.NOT_FOUND and "lease not found" in details
