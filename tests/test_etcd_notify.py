"""The etcd release listener: per-key delete watches feeding the toolkit's hub.

Driven with raw puts and deletes through aetcd on a real etcd, apart from the provider.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from servers import EtcdServer, missing_extra

import leasekit

try:
    import aetcd
except ImportError:  # pragma: no cover
    missing_extra("etcd", "tests/test_etcd_notify.py")

from leasekit_etcd._notify import EtcdReleaseListener

pytestmark = pytest.mark.anyio


def _watcher_of(client: Any) -> Any:
    async def watcher() -> Any:
        await client.connect()
        return client._watcher

    return watcher


BOUND_S = 20.0


@pytest.fixture
async def client(etcd_url: str) -> AsyncIterator[Any]:
    host, _, port = etcd_url.removeprefix("etcd://").partition(":")
    connection = aetcd.Client(host=host, port=int(port))
    async with connection:
        yield connection


async def test_a_delete_in_the_range_wakes_the_keys_waiters_and_a_put_does_not(
    client: Any, etcd_prefix: str
) -> None:
    listener = EtcdReleaseListener(_watcher_of(client), timeout_s=5)
    start = f"{etcd_prefix}k\0".encode()
    end = f"{etcd_prefix}k\1".encode()
    try:
        watch = await listener.watch("k", start, end)
        await client.put(start + b"alice", b"1")
        assert not await watch.wait(0.2)
        await client.delete(start + b"alice")
        assert await watch.wait(BOUND_S)
        await client.put(f"{etcd_prefix}other".encode(), b"1")
        await client.delete(f"{etcd_prefix}other".encode())
        assert not await watch.wait(0.2)
    finally:
        await listener.aclose()


async def test_a_created_record_wakes_grant_watchers_only_and_a_re_put_nobody(
    client: Any, etcd_prefix: str
) -> None:
    listener = EtcdReleaseListener(_watcher_of(client), timeout_s=5)
    start = f"{etcd_prefix}k\0".encode()
    end = f"{etcd_prefix}k\1".encode()
    try:
        release = await listener.watch("k", start, end)
        grants = await listener.watch("k", start, end, grants=True)
        await client.put(start + b"alice", b"alice")  # created: a grant
        assert await grants.wait(BOUND_S)
        assert not await release.wait(0.2), "a grant woke a waiter for a release"
        grants = await listener.watch("k", start, end, grants=True)
        await client.put(start + b"alice", b"alice\0m")  # the holder's re-put: no grant
        assert not await grants.wait(0.2)
        await client.delete(start + b"alice")  # a release wakes both
        assert await grants.wait(BOUND_S)
        assert await release.wait(BOUND_S)
    finally:
        await listener.aclose()


async def test_renewals_and_re_acquires_send_no_grant_hint_and_transfers_do(
    etcd_url: str, etcd_prefix: str
) -> None:
    async with leasekit.connect(etcd_url, prefix=etcd_prefix) as provider:
        grants = await provider.watch_release("k", grants=True)
        assert (await provider.acquire_lease("k", "alice", 10_000, metadata=b"a")).acquired
        assert await grants.wait(BOUND_S)
        grants.close()
        grants = await provider.watch_release("k", grants=True)
        # Each moves alice's record to another etcd lease, or rewrites its value.
        assert await provider.renew_lease("k", "alice", 20_000)
        assert (await provider.acquire_lease("k", "alice", 20_000, metadata=b"b")).acquired
        assert await provider.transfer_lease("k", "alice", "alice", 12_000, metadata=b"c")
        assert not await grants.wait(0.5), "the holder's own writes sent a grant hint"
        record = await provider.get_lease_record("k")
        assert record is not None
        assert (record.owner, record.metadata) == ("alice", b"c")
        assert await provider.transfer_lease("k", "alice", "bob", 10_000)
        assert await grants.wait(BOUND_S)
        grants.close()
        await provider.release_lease("k", "bob")


async def test_closing_wakes_every_waiter(client: Any, etcd_prefix: str) -> None:
    listener = EtcdReleaseListener(_watcher_of(client), timeout_s=5)
    watch = await listener.watch("k", etcd_prefix.encode(), etcd_prefix.encode() + b"\xff")
    await listener.aclose()
    assert await watch.wait(0)


def _watchers_on(server: EtcdServer) -> int:
    """The watches the server holds now, from its own metrics (every client's)."""
    url = f"http://{server.host}:{server.port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("etcd_debugging_mvcc_watcher_total "):
                return int(float(line.split()[1]))
    raise AssertionError("etcd reports no etcd_debugging_mvcc_watcher_total")


async def test_waiters_of_one_key_arriving_together_share_one_watch(
    private_etcd_server: EtcdServer,
) -> None:
    """Ten waiters of one key in the same loop turn: one watch at the server, and none
    once they have all left (each used to create its own, and nine outlived them)."""
    server = private_etcd_server
    async with leasekit.connect(server.url) as provider:
        assert (await provider.acquire_lease("k", "alice", 60_000)).acquired
        before = await asyncio.to_thread(_watchers_on, server)
        watches = await asyncio.gather(*(provider.watch_release("k") for _ in range(10)))
        assert await asyncio.to_thread(_watchers_on, server) == before + 1
        await provider.release_lease("k", "alice")
        for watch in watches:
            assert await watch.wait(BOUND_S)
            watch.close()
        with anyio.fail_after(BOUND_S):  # the cancel goes out in the background
            while await asyncio.to_thread(_watchers_on, server) != before:  # noqa: ASYNC110 (the server's count)
                await asyncio.sleep(0.01)
