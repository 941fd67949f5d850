"""Fencing tokens (when the backend declares ``fencing=True``).

Every successful acquire returns an ``int`` token strictly greater than every token
issued before for that key, across release, transfer, expiry and reconnects; a
re-acquire by the live holder (and a renew) keeps it. A transfer issues a new token,
which the new holder reads with an idempotent re-acquire.
"""

from __future__ import annotations

import itertools
import time

import pytest

from leasekit import LeaseProvider

from ._base import (
    ContractBase,
    KeySpace,
    ProviderFactory,
    Timing,
    check_granted,
    expect_expiry,
    require_factory,
    token_of,
)
from ._semantics import owner_of, release, renew, transfer
from ._workers import open_provider

__all__ = ["FencingChecks"]


def fencing_timing(provider: LeaseProvider) -> Timing:
    t = Timing.of(provider)
    if not t.caps.fencing:
        pytest.skip("the backend declares fencing=False")
    return t


def strictly_increasing(tokens: list[int], what: str) -> None:
    for before, after in itertools.pairwise(tokens):
        assert after > before, (
            f"fencing tokens must strictly increase {what}; got {tokens} ({before} then {after})"
        )


class FencingChecks(ContractBase):
    """Fencing tokens order every lease ever granted on a key."""

    async def test_fencing_tokens_increase_across_release_and_reacquire(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = fencing_timing(provider), KeySpace()
        key = keys("fenced")
        tokens: list[int] = []
        for owner in ["alice", "bob", "bob", "alice", "carol"]:
            result = await provider.acquire_lease(key, owner, t.long_ttl_ms)
            token = check_granted(result, owner, t.caps, f"acquire by {owner!r}")
            assert token is not None
            tokens.append(token)
            await release(provider, key, owner)
        strictly_increasing(tokens, "from one acquire to the next, across releases")

    async def test_fencing_token_is_kept_by_reacquire_renew_and_self_transfer(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = fencing_timing(provider), KeySpace()
        key = keys("fenced")
        token = check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, "acquire"
        )
        seen = [await token_of(provider, key, "alice", t.caps)]
        assert await renew(provider, key, "alice", t.long_ttl_ms) is True
        seen.append(await token_of(provider, key, "alice", t.caps))
        assert await transfer(provider, key, "alice", "alice", t.long_ttl_ms) is True
        seen.append(await token_of(provider, key, "alice", t.caps))
        assert seen == [token] * 3, (
            f"the live holder's token {token} must survive re-acquire, renew and a transfer "
            f"to itself; got {seen} after each"
        )

    async def test_fencing_tokens_increase_across_transfers(self, provider: LeaseProvider) -> None:
        t, keys = fencing_timing(provider), KeySpace()
        key = keys("fenced")
        first = check_granted(
            await provider.acquire_lease(key, "owner-0", t.long_ttl_ms),
            "owner-0",
            t.caps,
            "acquire",
        )
        assert first is not None
        tokens = [first]
        for i in range(1, 5):
            assert await transfer(provider, key, f"owner-{i - 1}", f"owner-{i}", t.long_ttl_ms)
            tokens.append(await token_of(provider, key, f"owner-{i}", t.caps))
        strictly_increasing(tokens, "with every transfer to a new owner")

    async def test_fencing_tokens_increase_across_expiry(self, provider: LeaseProvider) -> None:
        t, keys = fencing_timing(provider), KeySpace()
        key = keys("fenced")
        tokens: list[int] = []
        for owner in ["alice", "bob", "bob"]:
            started = time.monotonic()
            result = await provider.acquire_lease(key, owner, t.short_ttl_ms)
            finished = time.monotonic()
            token = check_granted(result, owner, t.caps, f"acquire by {owner!r}")
            assert token is not None
            tokens.append(token)
            # Polled until free (within its TTL plus grace), not slept for the whole
            # allowance: on etcd's whole seconds that saves 1-2 s a lease.
            await expect_expiry(
                provider,
                key,
                owner,
                set_started=started,
                set_finished=finished,
                ttl_ms=t.short_ttl_ms,
                timing=t,
            )
            assert await owner_of(provider, key) is None
        strictly_increasing(tokens, "from one lease to the next, across expiry")

    async def test_fencing_tokens_continue_after_reconnecting(
        self, provider: LeaseProvider, provider_factory: ProviderFactory | None
    ) -> None:
        """A new provider object on the same store goes on from the old one's tokens."""
        t, keys = fencing_timing(provider), KeySpace()
        factory = require_factory(provider_factory, t.caps, for_processes=False)
        key = keys("fenced")
        before = check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, "acquire"
        )
        await release(provider, key, "alice")
        assert before is not None
        tokens = [before]
        for round_number in range(2):
            async with open_provider(factory) as reconnected:
                owner = f"reconnected-{round_number}"
                result = await reconnected.acquire_lease(key, owner, t.long_ttl_ms)
                token = check_granted(result, owner, t.caps, "acquire through a new provider")
                assert token is not None
                tokens.append(token)
                await release(reconnected, key, owner)
        after = check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, "acquire"
        )
        assert after is not None
        tokens.append(after)
        strictly_increasing(tokens, "across provider objects connected to the same store")
