"""Expiry: a lease is live while the store's time is before its expiry, and free from then on.

Every wait is scaled to the declared ``ttl_resolution_ms``/``min_ttl_ms``. A lease
must stay live for its whole (rounded-up) TTL and be free within a grace period
after it: ``max(50 ms, 2 * ttl_resolution_ms)``.
"""

from __future__ import annotations

import functools
import time

from leasekit import LeaseProvider

from ._base import (
    ContractBase,
    KeySpace,
    Timing,
    check_granted,
    expect_expiry,
    run_concurrently,
)
from ._semantics import owner_of, renew, transfer

__all__ = ["ExpiryChecks"]


async def acquire_and_let_expire(
    provider: LeaseProvider, key: str, owner: str, t: Timing
) -> int | None:
    """Acquire ``key`` with the short TTL, wait until it must be free; return its token."""
    result = await provider.acquire_lease(key, owner, t.short_ttl_ms)
    finished = time.monotonic()
    token = check_granted(result, owner, t.caps, "acquire with a short TTL")
    await t.outlive(finished, t.short_ttl_ms)
    return token


class ExpiryChecks(ContractBase):
    """Leases end on their own once their TTL has passed."""

    async def test_lease_is_free_once_its_ttl_has_passed(self, provider: LeaseProvider) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("expiring")
        started = time.monotonic()
        result = await provider.acquire_lease(key, "alice", t.short_ttl_ms)
        finished = time.monotonic()
        check_granted(result, "alice", t.caps, "acquire with a short TTL")
        await expect_expiry(
            provider,
            key,
            "alice",
            set_started=started,
            set_finished=finished,
            ttl_ms=t.short_ttl_ms,
            timing=t,
        )
        assert await owner_of(provider, key) is None, "an expired lease must stay free"

    async def test_ttl_is_rounded_up_never_down(self, provider: LeaseProvider) -> None:
        """A TTL below the minimum, or between two resolution steps, is rounded up."""
        t, keys = Timing.of(provider), KeySpace()
        requests = sorted({1, t.caps.ttl_resolution_ms + 1, t.caps.min_ttl_ms + 1})

        async def check(ttl_ms: int) -> None:
            key = keys(f"ttl-{ttl_ms}")
            started = time.monotonic()
            result = await provider.acquire_lease(key, "alice", ttl_ms)
            finished = time.monotonic()
            check_granted(result, "alice", t.caps, f"acquire with ttl_ms={ttl_ms}")
            await expect_expiry(
                provider,
                key,
                "alice",
                set_started=started,
                set_finished=finished,
                ttl_ms=ttl_ms,
                timing=t,
            )

        await run_concurrently(*(functools.partial(check, ttl_ms) for ttl_ms in requests))

    async def test_acquire_after_expiry_by_new_owner_succeeds(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("expired")
        old_token = await acquire_and_let_expire(provider, key, "alice", t)
        result = await provider.acquire_lease(key, "bob", t.long_ttl_ms)
        new_token = check_granted(result, "bob", t.caps, "acquire of an expired key")
        assert await owner_of(provider, key) == "bob"
        if t.caps.fencing:
            assert old_token is not None
            assert new_token is not None
            assert new_token > old_token, (
                f"a lease granted after expiry must carry a greater fencing token: "
                f"{old_token} then {new_token}"
            )

    async def test_acquire_after_expiry_by_former_holder_starts_a_new_lease(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("expired")
        old_token = await acquire_and_let_expire(provider, key, "alice", t)
        result = await provider.acquire_lease(key, "alice", t.long_ttl_ms)
        new_token = check_granted(result, "alice", t.caps, "re-acquire of an expired key")
        if t.caps.fencing:
            assert old_token is not None
            assert new_token is not None
            assert new_token > old_token, (
                f"once a lease has expired, acquiring the key again (even by the same "
                f"owner) starts a new lease with a greater fencing token: "
                f"{old_token} then {new_token}"
            )

    async def test_renew_after_expiry_returns_false_and_does_not_revive(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("expired")
        await acquire_and_let_expire(provider, key, "alice", t)
        assert await renew(provider, key, "alice", t.long_ttl_ms) is False, (
            "renew after the lease expired must return False"
        )
        assert await owner_of(provider, key) is None, "renew after expiry must not revive it"

    async def test_transfer_after_expiry_returns_false_and_does_not_revive(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("expired")
        await acquire_and_let_expire(provider, key, "alice", t)
        assert await transfer(provider, key, "alice", "bob", t.long_ttl_ms) is False, (
            "transfer after the lease expired must return False"
        )
        assert await owner_of(provider, key) is None, (
            "transfer after expiry must not give the key to anyone"
        )
        assert await transfer(provider, key, "alice", "alice", t.long_ttl_ms) is False, (
            "transfer to the same owner after expiry must return False, like renew"
        )
        assert await owner_of(provider, key) is None
