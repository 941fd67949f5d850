"""Routing: lease metadata, lease records and grant notifications.

:class:`RoutingChecks` runs on a backend that declares ``metadata=True``: a small
payload stored atomically with a grant (exotic bytes and the size limit included),
kept by renew, replaced by transfer, cleared by release, returned to a denied caller in
the same answer, and ``get_lease_record`` consistent with what acquire said. On a
backend that also declares ``grant_notifications=True`` it checks that a watcher of a
free key is woken by a grant, and that ``watch_owner`` sees the new owner without
polling.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import leasekit
from leasekit import MAX_METADATA_BYTES, InvalidLeaseArgument, LeaseProvider, LeaseResult
from leasekit.backend import LeaseRecord

from ._base import BLOCKING_DRIVER_REASON, ContractBase, KeySpace, Timing, check_granted

__all__ = ["GRANT_HINT_CHECKS", "ROUTING_CHECKS", "RoutingChecks"]

GRANT_HINT_CHECKS = frozenset(
    {
        "test_a_grant_wakes_a_watcher_that_asked_for_grants",
        "test_watch_owner_sees_a_grant_of_a_free_key_without_polling",
    }
)
"""The checks that need ``watch_release``: an async provider's extra, so they skip
through the blocking driver."""

WAKE_TIMEOUT_S = 30.0
"""How long a watcher may wait for a hint that must come: far beyond any real latency."""

NO_POLLING_S = 3600.0
"""The ``poll_s`` given to ``watch_owner`` where a grant must be seen through a hint."""

EXOTIC_METADATA = (
    b"",
    b"\x00",
    bytes(range(256)),
    b"\xff" * MAX_METADATA_BYTES,
    b"10.0.0.7:8080",
)


def _require_metadata(provider: Any) -> Timing:
    t = Timing.of(provider)
    if not t.caps.metadata:
        pytest.skip("the backend declares metadata=False")
    if not callable(getattr(provider, "get_lease_record", None)):
        pytest.fail(
            "the backend declares metadata=True but has no get_lease_record(key) coroutine "
            "method (see leasekit.backend.SupportsRecords)"
        )
    return t


def _require_grant_hints(provider: Any) -> Timing:
    t = Timing.of(provider)
    if not t.caps.grant_notifications:
        pytest.skip("the backend declares grant_notifications=False")
    if not t.caps.release_notifications or not callable(getattr(provider, "watch_release", None)):
        pytest.fail(
            "grant_notifications=True needs release_notifications=True and a "
            "watch_release(key, *, grants=False) coroutine method: grant hints travel on "
            "the release channel"
        )
    return t


async def _record(provider: Any, key: str) -> LeaseRecord | None:
    record = await provider.get_lease_record(key)
    assert record is None or isinstance(record, LeaseRecord), (
        f"get_lease_record must return a leasekit.LeaseRecord or None, got {record!r}"
    )
    return record


async def _metadata_of(provider: Any, key: str) -> bytes | None:
    record = await _record(provider, key)
    assert record is not None, f"get_lease_record({key!r}) found no live lease"
    return record.metadata


class RoutingChecks(ContractBase):
    """Metadata with the grant, lease records, and hints of grants."""

    @pytest.fixture(autouse=True)
    def _not_blocking_hints(self, request: pytest.FixtureRequest) -> None:
        if self.blocking_driver and getattr(request.function, "__name__", "") in GRANT_HINT_CHECKS:
            pytest.skip(BLOCKING_DRIVER_REASON)

    @pytest.mark.parametrize("metadata", EXOTIC_METADATA, ids=lambda m: f"{len(m)}-bytes")
    async def test_metadata_round_trips_and_reaches_the_denied_caller(
        self, provider: LeaseProvider, metadata: bytes
    ) -> None:
        t = _require_metadata(provider)
        key = KeySpace()("routed")
        acquire: Any = provider.acquire_lease
        granted = await acquire(key, "alice", t.long_ttl_ms, metadata=metadata)
        check_granted(granted, "alice", t.caps, "acquire with metadata")
        assert granted.metadata == metadata, (
            f"a granted acquire returns the metadata it stored, got {granted.metadata!r}"
        )
        denied = await provider.acquire_lease(key, "bob", t.long_ttl_ms)
        assert denied == LeaseResult(False, "alice", None, metadata), (
            f"a denied acquire names the holder and returns its metadata in the same "
            f"answer, got {denied!r}"
        )
        assert await _metadata_of(provider, key) == metadata

    async def test_a_str_is_stored_as_its_utf8_bytes(self, provider: LeaseProvider) -> None:
        t = _require_metadata(provider)
        key = KeySpace()("routed-str")
        text = "worker-7 \u00fc\u2603\U0001f600\x00 :9000"
        acquire: Any = provider.acquire_lease
        check_granted(
            await acquire(key, "alice", t.long_ttl_ms, metadata=text), "alice", t.caps, ""
        )
        assert await _metadata_of(provider, key) == text.encode()

    async def test_bad_metadata_is_refused_before_any_io(self, provider: LeaseProvider) -> None:
        t = _require_metadata(provider)
        keys = KeySpace()
        acquire: Any = provider.acquire_lease
        transfer: Any = provider.transfer_lease
        held = keys("held")
        check_granted(
            await acquire(held, "alice", t.long_ttl_ms, metadata=b"a"), "alice", t.caps, ""
        )
        too_big = b"x" * (MAX_METADATA_BYTES + 1)
        for bad in (too_big, "\u00e9" * (MAX_METADATA_BYTES // 2 + 1), 5, ["a"], "\ud800"):
            with pytest.raises(InvalidLeaseArgument) as refused:
                await acquire(keys("free"), "alice", t.long_ttl_ms, metadata=bad)
            assert refused.value.argument == "metadata"
            with pytest.raises(InvalidLeaseArgument):
                await transfer(held, "alice", "bob", t.long_ttl_ms, metadata=bad)
        assert await provider.get_lease_owner(keys("free")) is None, "bad metadata wrote a lease"
        record = await _record(provider, held)
        assert record is not None, "a refused transfer freed the key"
        assert (record.owner, record.metadata) == ("alice", b"a"), (
            f"a refused transfer changed the lease: {record!r}"
        )

    async def test_renew_keeps_the_metadata(self, provider: LeaseProvider) -> None:
        t = _require_metadata(provider)
        key = KeySpace()("renewed")
        acquire: Any = provider.acquire_lease
        check_granted(
            await acquire(key, "alice", t.long_ttl_ms, metadata=b"here"), "alice", t.caps, ""
        )
        assert await provider.renew_lease(key, "alice", t.long_ttl_ms)
        assert await _metadata_of(provider, key) == b"here"

    async def test_transfer_replaces_the_metadata(self, provider: LeaseProvider) -> None:
        t = _require_metadata(provider)
        key = KeySpace()("handed")
        acquire: Any = provider.acquire_lease
        transfer: Any = provider.transfer_lease
        check_granted(
            await acquire(key, "alice", t.long_ttl_ms, metadata=b"alice:1"), "alice", t.caps, ""
        )
        assert await transfer(key, "alice", "bob", t.long_ttl_ms, metadata=b"bob:2")
        record = await _record(provider, key)
        assert record is not None
        assert (record.owner, record.metadata) == ("bob", b"bob:2")
        denied = await provider.acquire_lease(key, "carol", t.long_ttl_ms)
        assert denied == LeaseResult(False, "bob", None, b"bob:2"), denied
        # Without metadata the successor has none: the predecessor's never carries over.
        assert await provider.transfer_lease(key, "bob", "carol", t.long_ttl_ms)
        record = await _record(provider, key)
        assert record is not None
        assert (record.owner, record.metadata) == ("carol", None)
        # A refused transfer changes nothing.
        assert not await transfer(key, "alice", "dave", t.long_ttl_ms, metadata=b"no")
        assert await _metadata_of(provider, key) is None

    async def test_release_clears_the_metadata(self, provider: LeaseProvider) -> None:
        t = _require_metadata(provider)
        key = KeySpace()("cleared")
        acquire: Any = provider.acquire_lease
        check_granted(
            await acquire(key, "alice", t.long_ttl_ms, metadata=b"gone"), "alice", t.caps, ""
        )
        await provider.release_lease(key, "alice")
        assert await _record(provider, key) is None, "a released key has no record"
        granted = await provider.acquire_lease(key, "bob", t.long_ttl_ms)
        check_granted(granted, "bob", t.caps, "")
        assert granted.metadata is None
        assert await _metadata_of(provider, key) is None

    async def test_the_holders_reacquire_sets_its_metadata(self, provider: LeaseProvider) -> None:
        t = _require_metadata(provider)
        key = KeySpace()("again")
        acquire: Any = provider.acquire_lease
        first = await acquire(key, "alice", t.long_ttl_ms, metadata=b"one")
        second = await acquire(key, "alice", t.long_ttl_ms, metadata=b"two")
        check_granted(second, "alice", t.caps, "the holder's re-acquire")
        assert second.token == first.token
        assert second.metadata == b"two"
        assert await _metadata_of(provider, key) == b"two"

    async def test_the_record_agrees_with_the_grant(self, provider: LeaseProvider) -> None:
        t = _require_metadata(provider)
        key = KeySpace()("record")
        assert await _record(provider, key) is None, "a key never taken has no record"
        acquire: Any = provider.acquire_lease
        granted = await acquire(key, "alice", t.long_ttl_ms, metadata=b"m")
        record = await _record(provider, key)
        assert record is not None
        assert (record.key, record.owner, record.token, record.metadata) == (
            key,
            "alice",
            granted.token,
            b"m",
        ), f"the record disagrees with the grant {granted!r}: {record!r}"
        assert 0 < record.remaining_ms <= t.caps.effective_ttl_ms(t.long_ttl_ms), record
        assert await provider.get_lease_owner(key) == record.owner

    async def test_a_grant_wakes_a_watcher_that_asked_for_grants(
        self, provider: LeaseProvider
    ) -> None:
        t = _require_grant_hints(provider)
        key = KeySpace()("granted")
        watcher: Any = provider
        watch = await watcher.watch_release(key, grants=True)
        try:
            check_granted(
                await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, ""
            )
            woken = await watch.wait(WAKE_TIMEOUT_S)
            assert woken, f"a grant of a free key sent no hint within {WAKE_TIMEOUT_S:.0f} s"
        finally:
            watch.close()

    async def test_watch_owner_sees_a_grant_of_a_free_key_without_polling(
        self, provider: LeaseProvider
    ) -> None:
        t = _require_grant_hints(provider)
        key = KeySpace()("observed")
        changes = leasekit.watch_owner(provider, key, poll_s=NO_POLLING_S)
        try:
            with anyio.fail_after(WAKE_TIMEOUT_S):
                assert await anext(changes) is None
                for owner in ("alice", "bob"):
                    check_granted(
                        await provider.acquire_lease(key, owner, t.long_ttl_ms), owner, t.caps, ""
                    )
                    assert await anext(changes) == owner
                    await provider.release_lease(key, owner)
                    assert await anext(changes) is None
        finally:
            await changes.aclose()


ROUTING_CHECKS = frozenset(name for name in vars(RoutingChecks) if name.startswith("test_"))
"""Every check here: they skip on a backend declaring ``metadata=False`` (and the grant
hint checks on one declaring ``grant_notifications=False``)."""
