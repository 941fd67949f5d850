"""Batched renewal: ``renew_leases`` answers each item exactly as ``renew_lease`` would.

For backends with ``renew_leases`` (``leasekit.backend.SupportsRenewMany``), which
:func:`leasekit.hold` uses to renew many leases in one round trip; a backend without
it skips these checks. One batch mixes every outcome (renewed, held by another owner,
free, expired, released), and each item is checked against the store afterwards:
only the live holder's lease changed, and its TTL is its own item's.
"""

from __future__ import annotations

import time

import pytest

from leasekit import InvalidLeaseArgument, LeaseProvider
from leasekit.backend import RENEW_BATCH_LIMIT, SupportsRenewMany, supports

from ._base import ContractBase, KeySpace, Timing, check_granted, expect_expiry, token_of

__all__ = ["BATCHED_RENEWAL_CHECKS", "BatchedRenewalChecks"]


def _renew_many(provider: LeaseProvider) -> SupportsRenewMany:
    if not supports(provider, SupportsRenewMany):
        pytest.skip("the backend has no renew_leases (leasekit.backend.SupportsRenewMany)")
    return provider  # type: ignore[return-value]


def _check_results(results: object, expected: list[bool], what: str) -> None:
    assert type(results) is list, f"{what}: renew_leases must return a list, got {results!r}"
    assert all(type(r) is bool for r in results), (
        f"{what}: renew_leases must return one real bool per item, got {results!r}"
    )
    assert results == expected, f"{what}: expected {expected}, got {results}"


class BatchedRenewalChecks(ContractBase):
    """``renew_leases``: one owner-checked result per item, on the store's clock."""

    async def test_renew_leases_mixes_renewed_not_owner_free_and_expired(
        self, provider: LeaseProvider
    ) -> None:
        many = _renew_many(provider)
        t, keys = Timing.of(provider), KeySpace()
        mine, theirs, free = keys("mine"), keys("theirs"), keys("free")
        expired, released = keys("expired"), keys("released")
        await provider.acquire_lease(theirs, "bob", t.long_ttl_ms)
        await provider.acquire_lease(released, "alice", t.long_ttl_ms)
        await provider.release_lease(released, "alice")
        await provider.acquire_lease(expired, "alice", t.short_ttl_ms)
        await t.outlive(time.monotonic(), t.short_ttl_ms)
        # Held long; the batch renews it short.
        check_granted(
            await provider.acquire_lease(mine, "alice", t.long_ttl_ms), "alice", t.caps, "mine"
        )
        started = time.monotonic()
        results = await many.renew_leases(
            [
                (mine, "alice", t.short_ttl_ms),
                (theirs, "alice", t.long_ttl_ms),
                (free, "alice", t.long_ttl_ms),
                (expired, "alice", t.long_ttl_ms),
                (released, "alice", t.long_ttl_ms),
            ]
        )
        finished = time.monotonic()
        _check_results(results, [True, False, False, False, False], "a batch of mixed outcomes")
        # Nothing but the holder's own lease changed.
        assert await provider.get_lease_owner(theirs) == "bob"
        for key in (free, expired, released):
            assert await provider.get_lease_owner(key) is None, (
                f"renew_leases must not revive a free or expired lease ({key!r})"
            )
        # The holder's TTL is now its item's (short, not the long one it had).
        await expect_expiry(
            provider,
            mine,
            "alice",
            set_started=started,
            set_finished=finished,
            ttl_ms=t.short_ttl_ms,
            timing=t,
        )

    async def test_renew_leases_keeps_the_fencing_token_and_each_items_ttl(
        self, provider: LeaseProvider
    ) -> None:
        many = _renew_many(provider)
        t, keys = Timing.of(provider), KeySpace()
        for attempt in range(3):
            short, long = keys(f"short-{attempt}"), keys(f"long-{attempt}")
            await provider.acquire_lease(short, "alice", t.long_ttl_ms)
            token = check_granted(
                await provider.acquire_lease(long, "alice", t.short_ttl_ms),
                "alice",
                t.caps,
                "long",
            )
            started = time.monotonic()
            results = await many.renew_leases(
                [(long, "alice", t.long_ttl_ms), (short, "alice", t.short_ttl_ms)]
            )
            finished = time.monotonic()
            # `long` starts with the short TTL: a pause of this machine longer than that
            # between its grant and the batch lets it run out first, and False is then
            # the right answer. Set up again (the store itself says the key is free).
            if results[:1] != [False] or await provider.get_lease_owner(long) is not None:
                break
        _check_results(results, [True, True], "two renewals with their own TTLs")
        await expect_expiry(
            provider,
            short,
            "alice",
            set_started=started,
            set_finished=finished,
            ttl_ms=t.short_ttl_ms,
            timing=t,
        )
        assert await provider.get_lease_owner(long) == "alice", (
            "the long item's lease expired on its old, short TTL: renew_leases must set "
            "each item's own ttl_ms"
        )
        if t.caps.fencing:
            assert await token_of(provider, long, "alice", t.caps) == token, (
                "renew_leases must keep the fencing token, as renew_lease does"
            )

    async def test_renew_leases_answers_a_full_batch_in_order(
        self, provider: LeaseProvider
    ) -> None:
        many = _renew_many(provider)
        t, keys = Timing.of(provider), KeySpace()
        items = [(keys(f"k{i}"), f"owner-{i}", t.long_ttl_ms) for i in range(RENEW_BATCH_LIMIT)]
        expected = [i % 7 != 3 for i in range(len(items))]
        for (key, owner, ttl_ms), held in zip(items, expected, strict=True):
            if held:
                await provider.acquire_lease(key, owner, ttl_ms)
            else:
                await provider.acquire_lease(key, "someone-else", ttl_ms)
        _check_results(await many.renew_leases(items), expected, "a batch of the hold() limit")
        _check_results(await many.renew_leases([]), [], "an empty batch")

    @pytest.mark.parametrize(
        ("bad", "argument"),
        [
            (("", "alice", 1000), "items[1].key"),
            (("k", "alice", 0), "items[1].ttl_ms"),
            (("k", "alice", 1.5), "items[1].ttl_ms"),
            (("k", None, 1000), "items[1].owner"),
            (("k", "alice"), "items[1]"),
            ("first", "items[1].key"),  # the first item's key again
        ],
    )
    async def test_renew_leases_checks_every_item_before_any_io(
        self, provider: LeaseProvider, bad: object, argument: str
    ) -> None:
        many = _renew_many(provider)
        t, keys = Timing.of(provider), KeySpace()
        first = keys("first")
        started = time.monotonic()
        await provider.acquire_lease(first, "alice", t.short_ttl_ms)
        finished = time.monotonic()
        second = (first, "alice", t.long_ttl_ms) if bad == "first" else bad
        with pytest.raises(InvalidLeaseArgument) as caught:
            await many.renew_leases([(first, "alice", t.long_ttl_ms), second])  # type: ignore[list-item]
        assert caught.value.argument == argument
        # The valid first item was not renewed either: it expires on its acquire's TTL.
        await expect_expiry(
            provider,
            first,
            "alice",
            set_started=started,
            set_finished=finished,
            ttl_ms=t.short_ttl_ms,
            timing=t,
        )


BATCHED_RENEWAL_CHECKS = frozenset(
    name for name in vars(BatchedRenewalChecks) if name.startswith("test_")
)
"""The checks that skip on a backend without ``renew_leases``."""
