"""One test per row of the semantics table (docs/contract.md), named as the rule it checks.

A test whose next calls rely on a short lease still being live wraps them in
``ShortLease.live``: on a machine too slow to make them in time it tries again with a
longer TTL (``with_short_lease``) instead of failing a correct backend.

Every test checks the exact return types too: ``renew_lease``/``transfer_lease``
return a real ``bool`` (not a driver's ``1``), ``get_lease_owner`` a ``str`` (not
``bytes``) or ``None``, ``release_lease`` ``None``.
"""

from __future__ import annotations

import time

from leasekit import LeaseProvider

from ._base import (
    ContractBase,
    KeySpace,
    ShortLease,
    Timing,
    check_denied,
    check_granted,
    expect_expiry,
    token_of,
    with_short_lease,
)

__all__ = ["SemanticsChecks"]


async def owner_of(provider: LeaseProvider, key: str) -> str | None:
    owner = await provider.get_lease_owner(key)
    assert owner is None or type(owner) is str, (
        f"get_lease_owner must return a str or None, got {type(owner).__name__} {owner!r}"
    )
    return owner


async def renew(provider: LeaseProvider, key: str, owner: str, ttl_ms: int) -> bool:
    result = await provider.renew_lease(key, owner, ttl_ms)
    assert type(result) is bool, (
        f"renew_lease must return a bool, got {type(result).__name__} {result!r}"
    )
    return result


async def transfer(
    provider: LeaseProvider, key: str, from_owner: str, to_owner: str, ttl_ms: int
) -> bool:
    result = await provider.transfer_lease(key, from_owner, to_owner, ttl_ms)
    assert type(result) is bool, (
        f"transfer_lease must return a bool, got {type(result).__name__} {result!r}"
    )
    return result


async def release(provider: LeaseProvider, key: str, owner: str) -> None:
    result = await provider.release_lease(key, owner)  # type: ignore[func-returns-value]
    assert result is None, f"release_lease must return None, got {result!r}"


class SemanticsChecks(ContractBase):
    """The semantics table, row by row."""

    # -- acquire -------------------------------------------------------------------

    async def test_acquire_free_key_grants_lease_to_caller(self, provider: LeaseProvider) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("free")
        result = await provider.acquire_lease(key, "alice", t.long_ttl_ms)
        check_granted(result, "alice", t.caps, "acquire of a free key")
        assert await owner_of(provider, key) == "alice"

    async def test_reacquire_by_holder_succeeds_and_keeps_token(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("held")
        first = await provider.acquire_lease(key, "alice", t.long_ttl_ms)
        token = check_granted(first, "alice", t.caps, "first acquire")
        again = await provider.acquire_lease(key, "alice", t.long_ttl_ms)
        again_token = check_granted(again, "alice", t.caps, "re-acquire by the holder")
        if t.caps.fencing:
            assert again_token == token, (
                f"re-acquiring a lease its owner already holds must keep the fencing token: "
                f"first {token}, then {again_token}"
            )
        assert await owner_of(provider, key) == "alice"

    async def test_reacquire_by_holder_resets_ttl_to_the_new_value(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("held")
        check_granted(
            await provider.acquire_lease(key, "alice", t.short_ttl_ms), "alice", t.caps, "acquire"
        )
        # Lengthen: the short TTL passes, the lease lives on.
        check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, "re-acquire"
        )
        await t.outlive(time.monotonic(), t.short_ttl_ms)
        assert await owner_of(provider, key) == "alice", (
            "re-acquiring with a longer TTL must extend the lease: it expired on the old TTL"
        )
        # Shorten: the TTL is reset, not maxed with the old one.
        started = time.monotonic()
        result = await provider.acquire_lease(key, "alice", t.short_ttl_ms)
        finished = time.monotonic()
        check_granted(result, "alice", t.caps, "re-acquire with a shorter TTL")
        await expect_expiry(
            provider,
            key,
            "alice",
            set_started=started,
            set_finished=finished,
            ttl_ms=t.short_ttl_ms,
            timing=t,
        )

    async def test_acquire_held_key_is_denied_and_names_holder(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("held")
        token = check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, "acquire"
        )
        denied = await provider.acquire_lease(key, "bob", t.long_ttl_ms)
        check_denied(denied, "alice", "acquire of a key held by another owner")
        assert await owner_of(provider, key) == "alice"
        if t.caps.fencing:
            assert await token_of(provider, key, "alice", t.caps) == token, (
                "a denied acquire must not change the holder's fencing token"
            )

    async def test_denied_acquire_leaves_holders_ttl_alone(self, provider: LeaseProvider) -> None:
        t = Timing.of(provider)

        async def check(lease: ShortLease) -> None:
            key = KeySpace()("held")
            started = time.monotonic()
            result = await provider.acquire_lease(key, "alice", lease.ttl_ms)
            finished = time.monotonic()
            lease.granted(started)
            check_granted(result, "alice", t.caps, "acquire")
            denied = await lease.live(provider.acquire_lease(key, "bob", t.long_ttl_ms))
            check_denied(denied, "alice", "acquire of a key held by another owner")
            # The holder's lease must still end on its own TTL, not the denied caller's.
            await expect_expiry(
                provider,
                key,
                "alice",
                set_started=started,
                set_finished=finished,
                ttl_ms=lease.ttl_ms,
                timing=t,
            )

        await with_short_lease(t, check)

    # -- get_lease_owner -----------------------------------------------------------

    async def test_get_lease_owner_returns_live_holder(self, provider: LeaseProvider) -> None:
        t, keys = Timing.of(provider), KeySpace()
        first, second = keys("first"), keys("second")
        check_granted(
            await provider.acquire_lease(first, "alice", t.long_ttl_ms), "alice", t.caps, "acquire"
        )
        check_granted(
            await provider.acquire_lease(second, "bob", t.long_ttl_ms), "bob", t.caps, "acquire"
        )
        assert await owner_of(provider, first) == "alice"
        assert await owner_of(provider, second) == "bob"

    async def test_get_lease_owner_of_unused_key_is_none(self, provider: LeaseProvider) -> None:
        keys = KeySpace()
        assert await owner_of(provider, keys("never-used")) is None

    # -- release -------------------------------------------------------------------

    async def test_release_by_holder_frees_key_at_once(self, provider: LeaseProvider) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("held")
        check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, "acquire"
        )
        await release(provider, key, "alice")
        assert await owner_of(provider, key) is None, "release by the holder must free the key"
        result = await provider.acquire_lease(key, "bob", t.long_ttl_ms)
        check_granted(result, "bob", t.caps, "acquire by another owner right after a release")

    async def test_release_by_non_owner_leaves_holder_in_place(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("held")
        token = check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, "acquire"
        )
        await release(provider, key, "mallory")
        assert await owner_of(provider, key) == "alice", (
            "release by someone who is not the holder must leave the holder in place"
        )
        check_denied(
            await provider.acquire_lease(key, "mallory", t.long_ttl_ms),
            "alice",
            "acquire after a release by a non-owner",
        )
        assert await renew(provider, key, "alice", t.long_ttl_ms) is True
        if t.caps.fencing:
            assert await token_of(provider, key, "alice", t.caps) == token

    async def test_release_by_non_owner_leaves_holders_ttl_alone(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("held")
        started = time.monotonic()
        result = await provider.acquire_lease(key, "alice", t.short_ttl_ms)
        finished = time.monotonic()
        check_granted(result, "alice", t.caps, "acquire")
        await release(provider, key, "mallory")
        await expect_expiry(
            provider,
            key,
            "alice",
            set_started=started,
            set_finished=finished,
            ttl_ms=t.short_ttl_ms,
            timing=t,
        )

    async def test_release_of_free_key_is_a_noop(self, provider: LeaseProvider) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("free")
        await release(provider, key, "alice")
        assert await owner_of(provider, key) is None
        check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, "acquire"
        )
        await release(provider, key, "alice")
        await release(provider, key, "alice")  # twice: still nothing happens
        assert await owner_of(provider, key) is None
        check_granted(
            await provider.acquire_lease(key, "bob", t.long_ttl_ms), "bob", t.caps, "acquire"
        )

    # -- renew ---------------------------------------------------------------------

    async def test_renew_by_holder_returns_true_and_keeps_token(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("held")
        token = check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, "acquire"
        )
        assert await renew(provider, key, "alice", t.long_ttl_ms) is True, (
            "renew by the live holder must return True"
        )
        assert await owner_of(provider, key) == "alice"
        if t.caps.fencing:
            assert await token_of(provider, key, "alice", t.caps) == token, (
                "renewing must keep the lease's fencing token"
            )

    async def test_renew_by_holder_resets_ttl_to_the_new_value(
        self, provider: LeaseProvider
    ) -> None:
        t = Timing.of(provider)

        async def check(lease: ShortLease) -> None:
            key = KeySpace()("held")
            started = time.monotonic()
            result = await provider.acquire_lease(key, "alice", lease.ttl_ms)
            lease.granted(started)
            check_granted(result, "alice", t.caps, "acquire")
            assert await lease.live(renew(provider, key, "alice", t.long_ttl_ms)) is True
            await t.outlive(time.monotonic(), lease.ttl_ms)
            assert await owner_of(provider, key) == "alice", (
                "renewing with a longer TTL must extend the lease: it expired on the old TTL"
            )
            started = time.monotonic()
            renewed = await renew(provider, key, "alice", t.short_ttl_ms)
            finished = time.monotonic()
            assert renewed is True
            await expect_expiry(
                provider,
                key,
                "alice",
                set_started=started,
                set_finished=finished,
                ttl_ms=t.short_ttl_ms,
                timing=t,
            )

        await with_short_lease(t, check)

    async def test_renew_by_non_owner_returns_false_and_changes_nothing(
        self, provider: LeaseProvider
    ) -> None:
        t = Timing.of(provider)

        async def check(lease: ShortLease) -> None:
            key = KeySpace()("held")
            started = time.monotonic()
            result = await provider.acquire_lease(key, "alice", lease.ttl_ms)
            finished = time.monotonic()
            lease.granted(started)
            check_granted(result, "alice", t.caps, "acquire")
            assert await renew(provider, key, "mallory", t.long_ttl_ms) is False, (
                "renew by someone who is not the holder must return False"
            )
            assert await lease.live(owner_of(provider, key)) == "alice"
            # The holder's TTL must not have been extended by the refused renew.
            await expect_expiry(
                provider,
                key,
                "alice",
                set_started=started,
                set_finished=finished,
                ttl_ms=lease.ttl_ms,
                timing=t,
            )

        await with_short_lease(t, check)

    async def test_renew_of_free_key_returns_false_and_does_not_acquire(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("free")
        assert await renew(provider, key, "alice", t.long_ttl_ms) is False, (
            "renew of a free key must return False"
        )
        assert await owner_of(provider, key) is None, "renew of a free key must not acquire it"

    # -- transfer ------------------------------------------------------------------

    async def test_transfer_by_holder_hands_lease_to_new_owner(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("held")
        token = check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, "acquire"
        )
        assert await transfer(provider, key, "alice", "bob", t.long_ttl_ms) is True, (
            "transfer by the live holder must return True"
        )
        assert await owner_of(provider, key) == "bob"
        check_denied(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms),
            "bob",
            "acquire by the former holder after a transfer",
        )
        assert await renew(provider, key, "alice", t.long_ttl_ms) is False, (
            "after a transfer the former holder must no longer be able to renew"
        )
        assert await renew(provider, key, "bob", t.long_ttl_ms) is True
        if t.caps.fencing:
            assert token is not None
            new_token = await token_of(provider, key, "bob", t.caps)
            assert new_token > token, (
                f"a transfer to a new owner must issue a greater fencing token: "
                f"{token} then {new_token}"
            )

    async def test_transfer_by_holder_sets_fresh_ttl_for_new_owner(
        self, provider: LeaseProvider
    ) -> None:
        t = Timing.of(provider)

        async def check(lease: ShortLease) -> None:
            keys = KeySpace()
            longer, shorter = keys("longer"), keys("shorter")
            started = time.monotonic()
            result = await provider.acquire_lease(longer, "alice", lease.ttl_ms)
            lease.granted(started)
            check_granted(result, "alice", t.caps, "acquire")
            moved = await lease.live(transfer(provider, longer, "alice", "bob", t.long_ttl_ms))
            assert moved is True
            check_granted(
                await provider.acquire_lease(shorter, "alice", t.long_ttl_ms),
                "alice",
                t.caps,
                "acquire",
            )
            started = time.monotonic()
            moved = await transfer(provider, shorter, "alice", "bob", t.short_ttl_ms)
            finished = time.monotonic()
            assert moved is True
            await expect_expiry(
                provider,
                shorter,
                "bob",
                set_started=started,
                set_finished=finished,
                ttl_ms=t.short_ttl_ms,
                timing=t,
            )
            await t.outlive(finished, lease.ttl_ms)
            assert await owner_of(provider, longer) == "bob", (
                "a transfer must give the new owner the TTL passed to transfer_lease; "
                "the lease expired on the old owner's TTL instead"
            )

        await with_short_lease(t, check)

    async def test_transfer_by_non_owner_returns_false_and_changes_nothing(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("held")
        token = check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, "acquire"
        )
        assert await transfer(provider, key, "mallory", "mallory", t.long_ttl_ms) is False
        assert await transfer(provider, key, "mallory", "bob", t.long_ttl_ms) is False, (
            "transfer by someone who is not the holder must return False"
        )
        assert await owner_of(provider, key) == "alice"
        assert await renew(provider, key, "bob", t.long_ttl_ms) is False
        if t.caps.fencing:
            assert await token_of(provider, key, "alice", t.caps) == token

    async def test_refused_transfer_leaves_holders_ttl_alone(self, provider: LeaseProvider) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("held")
        started = time.monotonic()
        result = await provider.acquire_lease(key, "alice", t.short_ttl_ms)
        finished = time.monotonic()
        check_granted(result, "alice", t.caps, "acquire")
        assert await transfer(provider, key, "mallory", "bob", t.long_ttl_ms) is False
        assert await transfer(provider, key, "mallory", "alice", t.long_ttl_ms) is False
        assert await transfer(provider, key, "mallory", "mallory", t.long_ttl_ms) is False
        # The holder's lease must still end on its own TTL, not the refused caller's.
        await expect_expiry(
            provider,
            key,
            "alice",
            set_started=started,
            set_finished=finished,
            ttl_ms=t.short_ttl_ms,
            timing=t,
        )

    async def test_transfer_of_free_key_returns_false_and_does_not_acquire(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("free")
        assert await transfer(provider, key, "alice", "bob", t.long_ttl_ms) is False, (
            "transfer of a free key must return False"
        )
        assert await owner_of(provider, key) is None, (
            "transfer of a free key must not give it to anyone"
        )

    async def test_transfer_to_same_owner_behaves_like_renew(self, provider: LeaseProvider) -> None:
        t = Timing.of(provider)

        async def check(lease: ShortLease) -> None:
            key = KeySpace()("held")
            started = time.monotonic()
            result = await provider.acquire_lease(key, "alice", lease.ttl_ms)
            lease.granted(started)
            token = check_granted(result, "alice", t.caps, "acquire")
            moved = await lease.live(transfer(provider, key, "alice", "alice", t.long_ttl_ms))
            assert moved is True, (
                "transfer to the same owner by the live holder must return True, like renew"
            )
            await t.outlive(time.monotonic(), lease.ttl_ms)
            assert await owner_of(provider, key) == "alice", (
                "transfer to the same owner must reset the TTL like renew; the lease "
                "expired on the old TTL"
            )
            if t.caps.fencing:
                assert await token_of(provider, key, "alice", t.caps) == token, (
                    "transfer to the same owner must keep the fencing token, like renew"
                )

        await with_short_lease(t, check)

    async def test_transfer_to_same_owner_by_non_holder_returns_false(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        held, free = keys("held"), keys("free")
        check_granted(
            await provider.acquire_lease(held, "alice", t.long_ttl_ms), "alice", t.caps, "acquire"
        )
        assert await transfer(provider, held, "bob", "bob", t.long_ttl_ms) is False
        assert await owner_of(provider, held) == "alice"
        assert await transfer(provider, free, "bob", "bob", t.long_ttl_ms) is False
        assert await owner_of(provider, free) is None
