"""Counting leases and the line of waiters on a real etcd: round trips counted by the
server, no etcd lease left behind, and ``inspect`` listing leases only.

The semantics are the suite's (``SlotChecks``, ``SharedExclusiveChecks``,
``FairWaitingChecks`` in ``test_contract_etcd``); here is what is etcd's own.
"""

from __future__ import annotations

import asyncio

import pytest
from servers import EtcdServer, missing_extra
from test_etcd import client_calls, delta, grpc_calls

try:
    from leasekit_etcd import EtcdLeaseProvider
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("etcd", "the etcd tests")

pytestmark = pytest.mark.anyio

TTL_MS = 10_000  # long enough for the reuse of etcd leases


async def test_a_warm_slot_cycle_is_a_read_and_two_transactions(
    private_etcd_server: EtcdServer, etcd_prefix: str, wide_reuse_window: int
) -> None:
    """A grant reads the key's range and writes in one transaction (on the etcd lease
    the last release left idle); a release is one transaction; a denial one read."""
    server = private_etcd_server
    async with EtcdLeaseProvider.from_url(server.url, prefix=etcd_prefix) as p:
        assert (await p.acquire_slot("k", "other", TTL_MS, limit=2)).acquired
        assert (await p.acquire_slot("k", "warm", TTL_MS, limit=2)).acquired
        assert await p.release_slot("k", "warm")  # its etcd lease is idle now
        before = grpc_calls(server)
        for i in range(10):
            assert (await p.acquire_slot("k", f"o{i}", TTL_MS, limit=2)).acquired
            assert await p.release_slot("k", f"o{i}")
        await asyncio.sleep(0)
        assert client_calls(delta(grpc_calls(server), before)) == {"Range": 10, "Txn": 20}
        assert (await p.acquire_slot("k", "full", TTL_MS, limit=2)).acquired
        before = grpc_calls(server)
        denied = await p.acquire_slot("k", "late", TTL_MS, limit=2)
        assert (denied.acquired, denied.holders) == (False, ("other", "full"))
        assert client_calls(delta(grpc_calls(server), before)) == {"Range": 1}


async def test_no_etcd_lease_is_left_behind_by_slots_claims_or_places(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    async with EtcdLeaseProvider.from_url(private_etcd_server.url, prefix=etcd_prefix) as p:
        for i in range(5):
            ttl_ms = 3000 + 4000 * (i % 3)  # short ones granted exactly, long ones reused
            assert (await p.acquire_slot("s", "r", ttl_ms, limit=3)).acquired
            assert (await p.acquire_slot("s", "r", ttl_ms + 1000, limit=3)).acquired
            claimed = await p.acquire_slot("s", "w", ttl_ms, limit=3, exclusive=True)
            assert not claimed.acquired  # its claim is on an etcd lease of its own
            assert await p.transfer_slot("s", "r", "r2", ttl_ms)
            assert await p.renew_slot("s", "r2", ttl_ms + 2000)
            assert await p.release_slot("s", "r2")
            assert (await p.acquire_slot("s", "w", ttl_ms, limit=3, exclusive=True)).acquired
            assert await p.release_slot("s", "w")
            assert (await p.acquire_lease("f", "holder", ttl_ms)).acquired
            waiter = await p.acquire_lease_in_turn("f", "w", ttl_ms, place_ttl_ms=ttl_ms)
            assert waiter.owner == "holder"  # it has a place now
            await p.release_lease("f", "holder")
            assert (await p.acquire_lease_in_turn("f", "w", ttl_ms, place_ttl_ms=ttl_ms)).acquired
            await p.release_lease("f", "w")
        assert await p.lease_ids() == []
    assert private_etcd_server.lease_ids() == []


async def test_inspect_lists_leases_not_slots_nor_places(etcd_url: str, etcd_prefix: str) -> None:
    async with EtcdLeaseProvider.from_url(etcd_url, prefix=etcd_prefix) as p:
        assert (await p.acquire_slot("a", "s1", TTL_MS, limit=2)).acquired
        assert (await p.acquire_lease("a", "holder", TTL_MS)).acquired
        await p.acquire_lease_in_turn("a", "waiter", TTL_MS, place_ttl_ms=TTL_MS)
        assert [(r.key, r.owner) for r in await p.inspect()] == [("a", "holder")]
        assert [(r.key, r.owner) for r in await p.inspect("a")] == [("a", "holder")]
        assert [r.owner for r in await p.get_slot_holders("a")] == ["s1"]


async def test_a_shared_holders_exclusive_acquire_keeps_its_token(
    etcd_url: str, etcd_prefix: str
) -> None:
    """etcd refuses a transaction that deletes and puts one key, so the slot that
    becomes the key keeps its ``create_revision``: its token (documented)."""
    async with EtcdLeaseProvider.from_url(etcd_url, prefix=etcd_prefix) as p:
        shared = await p.acquire_slot("k", "a", TTL_MS, limit=2)
        alone = await p.acquire_slot("k", "a", TTL_MS, limit=2, exclusive=True)
        assert (alone.acquired, alone.exclusive, alone.token) == (True, True, shared.token)
        assert not (await p.acquire_slot("k", "b", TTL_MS, limit=2)).acquired
