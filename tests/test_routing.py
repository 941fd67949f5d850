"""Routing to the owner above the contract: metadata through hold(), wait_for(), elect()
and leasekit.sync, records, and metadata refused where a backend cannot keep it."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

import leasekit
import leasekit.sync
from leasekit import (
    BackendLacksCapability,
    Capabilities,
    InvalidLeaseArgument,
    LeaseHeld,
    LeaseResult,
    MemoryLeaseProvider,
)

pytestmark = pytest.mark.anyio


class WithoutMetadata:
    """A third party's provider: the five methods, no ``metadata`` capability."""

    capabilities = Capabilities(atomic_transfer=True)

    def __init__(self) -> None:
        self.inner = MemoryLeaseProvider()
        self.calls = 0

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        self.calls += 1
        return await self.inner.acquire_lease(key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        self.calls += 1
        return await self.inner.get_lease_owner(key)

    async def release_lease(self, key: str, owner: str) -> None:
        self.calls += 1
        await self.inner.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        self.calls += 1
        return await self.inner.renew_lease(key, owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        self.calls += 1
        return await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)


async def test_hold_stores_metadata_and_a_loser_reads_it_from_lease_held() -> None:
    provider = MemoryLeaseProvider()
    async with leasekit.hold(provider, "thread-1", "w1-ab12", 60_000, metadata="10.0.0.1:80") as h:
        assert h.metadata == b"10.0.0.1:80"
        with pytest.raises(LeaseHeld) as held:
            async with leasekit.hold(provider, "thread-1", "w2-cd34", 60_000):
                pass
        assert (held.value.holder, held.value.metadata) == ("w1-ab12", b"10.0.0.1:80")
        with pytest.raises(LeaseHeld) as waited:
            await leasekit.wait_for(provider, "thread-1", "w2-cd34", 60_000, 0)
        assert waited.value.metadata == b"10.0.0.1:80"
        record = await provider.get_lease_record("thread-1")
        assert record is not None
        assert (record.owner, record.token, record.metadata) == ("w1-ab12", h.token, b"10.0.0.1:80")


async def test_transfer_to_hands_the_successor_its_own_metadata() -> None:
    provider = MemoryLeaseProvider()
    async with leasekit.hold(provider, "k", "w1", 60_000, metadata=b"w1:80") as h:
        await h.transfer_to("w2", metadata=b"w2:80")
    record = await provider.get_lease_record("k")
    assert record is not None
    assert (record.owner, record.metadata) == ("w2", b"w2:80")


async def test_elect_publishes_the_leaders_address() -> None:
    provider = MemoryLeaseProvider()
    async with leasekit.elect(provider, "scheduler", "c1", 60_000, metadata=b"c1:9000"):
        record = await provider.get_lease_record("scheduler")
        assert record is not None
        assert record.metadata == b"c1:9000"


async def test_metadata_where_the_backend_cannot_keep_it_is_refused_before_any_io() -> None:
    provider = WithoutMetadata()
    with pytest.raises(BackendLacksCapability) as lacking:
        leasekit.hold(provider, "k", "w1", 60_000, metadata=b"w1:80")
    assert lacking.value.missing == ("metadata",)
    with pytest.raises(BackendLacksCapability):
        await leasekit.wait_for(provider, "k", "w1", 60_000, 0, metadata="w1:80")
    with pytest.raises(BackendLacksCapability):
        leasekit.elect(provider, "g", "w1", 60_000, metadata="w1:80")
    async with leasekit.hold(provider, "k", "w1", 60_000) as h:  # without metadata: fine
        calls = provider.calls
        with pytest.raises(BackendLacksCapability):
            await h.transfer_to("w2", metadata=b"w2:80")
        assert provider.calls == calls
    assert provider.calls > 0
    with leasekit.sync.wrap(provider) as leases:
        with pytest.raises(BackendLacksCapability):
            leases.acquire_lease("k", "w1", 60_000, metadata=b"x")
        with pytest.raises(BackendLacksCapability):
            leases.get_lease_record("k")


@pytest.mark.parametrize("bad", [b"x" * (leasekit.MAX_METADATA_BYTES + 1), 7, "\udc00"])
async def test_bad_metadata_is_refused_by_hold_before_any_io(bad: Any) -> None:
    provider = MemoryLeaseProvider()
    with pytest.raises(InvalidLeaseArgument) as refused:
        leasekit.hold(provider, "k", "w1", 60_000, metadata=bad)
    assert refused.value.argument == "metadata"
    assert await provider.get_lease_owner("k") is None


def test_the_blocking_api_stores_and_reads_metadata() -> None:
    with leasekit.sync.connect("memory://") as leases:
        granted = leases.acquire_lease("k", "w1", 60_000, metadata="w1:80")
        assert granted.metadata == b"w1:80"
        assert leases.acquire_lease("k", "w2", 60_000).metadata == b"w1:80"
        assert leases.transfer_lease("k", "w1", "w2", 60_000, metadata=b"w2:80")
        record = leases.get_lease_record("k")
        assert record is not None
        assert (record.owner, record.metadata) == ("w2", b"w2:80")
        with leasekit.sync.hold(leases, "j", "w3", 60_000, metadata=b"w3:80") as h:
            assert h.metadata == b"w3:80"
            with pytest.raises(LeaseHeld) as held:
                leasekit.sync.wait_for(leases, "j", "w4", 60_000, 0)
            assert held.value.metadata == b"w3:80"
            h.transfer_to("w4", metadata=b"w4:80")
        record = leases.get_lease_record("j")
        assert record is not None
        assert (record.owner, record.metadata) == ("w4", b"w4:80")


async def test_a_hold_with_metadata_cancelled_while_entering_leaves_nothing_held() -> None:
    provider = MemoryLeaseProvider()
    await provider.acquire_lease("k", "w0", 60_000, metadata=b"w0:80")

    async def enter() -> None:
        async with leasekit.hold(provider, "k", "w1", 60_000, wait_s=None, metadata=b"w1:80"):
            await asyncio.sleep(3600)

    task = asyncio.ensure_future(enter())
    for _ in range(10):
        await asyncio.sleep(0)
    await provider.release_lease("k", "w0")
    for _ in range(3):
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0)
    assert await provider.get_lease_record("k") is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_metadata_and_records_work_in_a_forked_child(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/leases.db"
    with leasekit.sync.connect(url) as leases:
        if not leases.capabilities.metadata:
            pytest.skip("SQLite declares no metadata yet")
        leases.acquire_lease("k", "parent", 60_000, metadata=b"parent:80")
        pid = os.fork()
        if pid == 0:  # the child: reads the parent's record, stores its own
            code = 1
            try:
                record = leases.get_lease_record("k")
                denied = leases.acquire_lease("k", "child", 60_000)
                mine = leases.acquire_lease("c", "child", 60_000, metadata=b"child:80")
                ok = (
                    record is not None
                    and record.metadata == b"parent:80"
                    and denied.metadata == b"parent:80"
                    and mine.metadata == b"child:80"
                )
                code = 0 if ok else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        record = leases.get_lease_record("c")
        assert record is not None
        assert record.metadata == b"child:80"
