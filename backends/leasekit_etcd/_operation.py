"""One contract operation on etcd: its round trips, sharing one deadline and one member list.

Each method is one operation's sequence of requests (built in ``_txn`` and ``_rpc``) and
the reading of their replies; :class:`~leasekit_etcd.EtcdLeaseProvider` bounds the whole
operation by ``timeout_s`` and maps its errors. What each operation costs in round
trips, and why release is a transaction rather than a bare revoke, is on the etcd page
of the documentation (``docs/backends/etcd.md``).

An etcd lease that an operation leaves without a record (detached by a transaction,
never bound by one, or granted by an operation that then failed) is handed to
``provider._revoke_later``, which revokes it in the background.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from leasekit import LeaseResult
from leasekit.backend import LeaseRecord

from . import _keys, _replies, _rpc, _txn
from ._members import Members

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
        request = _rpc.lease_grant_request(ttl_s)
        response: _rpc.LeaseGrantResponse = await self._call(
            lambda s, md, t: s.lease.LeaseGrant(request, timeout=t, metadata=md), safe=False
        )
        lease, granted_s = _replies.granted(response)
        self.provider._learn_min_ttl(ttl_s, granted_s)
        return lease

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

        return await self._call(invoke, safe=True)

    # -- the operations -------------------------------------------------------------------

    async def owner(self, key: str) -> str | None:
        start, end = _keys.holder_range(self.prefix, key)
        kv = _replies.holder(self.prefix, await self.range(_txn.read_holder(start, end)), key)
        return None if kv is None else kv.value.decode()

    async def acquire(self, key: str, owner: str, ttl_s: int) -> LeaseResult:
        start, end = _keys.holder_range(self.prefix, key)
        record = _keys.record_name(self.prefix, key, owner)
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
            # Otherwise expect it free: grant, then take it in one transaction.
            lease = await self.grant(ttl_s)
            try:
                reply = await self.txn(_txn.acquire_free(start, end, record, owner.encode(), lease))
            except BaseException:
                self.provider._revoke_later(lease)
                raise
            if reply.succeeded:
                seen.add(key)
                return LeaseResult(True, owner, reply.header.revision)
            holder_now = _replies.denied_holder(self.prefix, reply, key)
            if holder_now == owner:
                # Already ours: move our record onto the lease just granted (the
                # requested TTL), keeping its token.
                token = await self._relet_onto(record, owner, lease)
                if token is not None:
                    seen.add(key)
                    return LeaseResult(True, owner, token)
            else:
                # Never bound (the transaction took its failure branch): revoking it
                # can delete nothing, so the answer need not wait for it.
                self.provider._revoke_later(lease)
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
        granted_s = await self.keep_alive(lease)
        if granted_s <= 0:
            return False  # the etcd lease expired: the record is gone with it
        if granted_s == self.provider._granted_ttl_s(ttl_s):
            return True
        # A keep-alive restores the TTL the etcd lease was granted with; a different
        # TTL needs a new etcd lease, and the record moved onto it.
        return await self._relet_onto(record, owner, await self.grant(ttl_s)) is not None

    async def _relet_onto(self, record: bytes, owner: str, fresh: int) -> int | None:
        """Move ``owner``'s live record onto the etcd lease ``fresh`` and revoke the old
        one; returns the (unchanged) token, or None (and revokes ``fresh``) if it ended.

        Both revocations run in the background: neither lease carries a record then.
        """
        try:
            reply = await self.txn(_txn.relet(record, owner.encode(), fresh))
        except BaseException:
            self.provider._revoke_later(fresh)
            raise
        if not reply.succeeded:
            self.provider._revoke_later(fresh)
            return None
        token, left = _replies.moved_from(reply, fresh)
        if left is not None:
            self.provider._revoke_later(left)
        return token

    async def release(self, key: str, owner: str) -> None:
        record = _keys.record_name(self.prefix, key, owner)
        reply = await self.txn(_txn.release(record, owner.encode()))
        if reply.succeeded:
            # The key is free from this transaction on. The etcd lease the record was
            # on now carries nothing: revoking it is housekeeping, off the caller's path.
            self.provider._seen_held.discard(key)
            for lease in _replies.detached_leases(reply):
                self.provider._revoke_later(lease)

    async def transfer(self, key: str, from_owner: str, to_owner: str, ttl_s: int) -> bool:
        from_record = _keys.record_name(self.prefix, key, from_owner)
        to_record = _keys.record_name(self.prefix, key, to_owner)
        lease = await self.grant(ttl_s)
        try:
            reply = await self.txn(
                _txn.transfer(from_record, from_owner.encode(), to_record, to_owner.encode(), lease)
            )
        except BaseException:
            self.provider._revoke_later(lease)
            raise
        if not reply.succeeded:
            self.provider._revoke_later(lease)  # never bound
            return False
        for detached in _replies.detached_leases(reply, bound=lease):
            self.provider._revoke_later(detached)  # its record was just deleted
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
