"""Lifecycle: the provider is what ``connect`` promises, and closing it is final.

After ``aclose()`` (or leaving ``async with``) every operation raises a
:class:`leasekit.LeaseError` (``LeaseProviderClosed``), never a driver's exception,
and never hangs. Closing twice is harmless: the suite closes the fixture's provider
in a test and the fixture closes it again.
"""

from __future__ import annotations

import pickle
from typing import Any

import anyio
import pytest

from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseError,
    LeaseProvider,
    is_lease_provider,
)

from ._base import (
    ContractBase,
    KeySpace,
    ProviderFactory,
    Timing,
    check_denied,
    check_granted,
    require_factory,
)
from ._semantics import owner_of, release
from ._workers import open_provider

__all__ = ["LifecycleChecks"]

CLOSED_CALL_TIMEOUT_S = 30.0


async def expect_closed(provider: Any, key: str, ttl_ms: int, how: str) -> None:
    """Assert each of the five operations raises a :class:`LeaseError` on ``provider``."""
    calls: dict[str, tuple[object, ...]] = {
        "acquire_lease": (key, "alice", ttl_ms),
        "get_lease_owner": (key,),
        "release_lease": (key, "alice"),
        "renew_lease": (key, "alice", ttl_ms),
        "transfer_lease": (key, "alice", "bob", ttl_ms),
    }
    for name, args in calls.items():
        with anyio.move_on_after(CLOSED_CALL_TIMEOUT_S) as scope:
            try:
                outcome = await getattr(provider, name)(*args)
            except LeaseError as exc:
                raised: LeaseError = exc
            except Exception as exc:  # noqa: BLE001  (the failure names what was raised)
                pytest.fail(
                    f"{name} after {how} raised {type(exc).__module__}."
                    f"{type(exc).__qualname__}: {exc}; it must raise a leasekit.LeaseError "
                    "(leasekit.LeaseProviderClosed), never a driver's exception"
                )
            else:
                pytest.fail(
                    f"{name} after {how} returned {outcome!r}; it must raise "
                    "leasekit.LeaseProviderClosed (a leasekit.LeaseError)"
                )
        if scope.cancelled_caught:
            pytest.fail(f"{name} after {how} hung for {CLOSED_CALL_TIMEOUT_S:.0f} s")
        assert not isinstance(raised, InvalidLeaseArgument), (
            f"{name} with valid arguments after {how} raised {raised!r}; expected "
            "leasekit.LeaseProviderClosed (or another LeaseError), not InvalidLeaseArgument"
        )


class LifecycleChecks(ContractBase):
    """What the provider object is, and what closing it does."""

    async def test_provider_is_detected_and_declares_capabilities(
        self, provider: LeaseProvider
    ) -> None:
        assert is_lease_provider(provider), (
            "leasekit.is_lease_provider must recognise the provider: it needs the five "
            "contract methods, each callable"
        )
        declared = getattr(provider, "capabilities", None)
        assert isinstance(declared, Capabilities), (
            f"the provider must declare .capabilities as a leasekit.Capabilities "
            f"(the suite adapts its timing and checks to it), got {declared!r}"
        )

    async def test_provider_factory_reaches_the_same_store(
        self, provider: LeaseProvider, provider_factory: ProviderFactory | None
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        factory = require_factory(provider_factory, t.caps, for_processes=False)
        try:
            pickle.dumps(factory)
        except Exception as exc:  # noqa: BLE001  (the failure names what was raised)
            pytest.fail(
                f"provider_factory must be picklable (child processes receive it), "
                f"pickling {factory!r} raised {type(exc).__name__}: {exc}"
            )
        key = keys("shared")
        check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, "acquire"
        )
        async with open_provider(factory) as other:
            assert other is not provider, "provider_factory must return a new provider"
            assert await owner_of(other, key) == "alice", (
                "a provider from provider_factory must see the leases of the test's "
                "provider: it must connect to the same store"
            )
            check_denied(
                await other.acquire_lease(key, "bob", t.long_ttl_ms),
                "alice",
                "acquire through provider_factory's provider of a key held through the fixture's",
            )
            await release(other, key, "alice")
        assert await owner_of(provider, key) is None

    async def test_operations_after_aclose_raise_lease_error(self, provider: LeaseProvider) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("closed")
        check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, "acquire"
        )
        aclose = getattr(provider, "aclose", None)
        assert callable(aclose), "the provider must have an aclose() coroutine method"
        await aclose()
        await expect_closed(provider, key, t.long_ttl_ms, "aclose()")

    async def test_leaving_async_with_closes_the_provider(
        self, provider: LeaseProvider, provider_factory: ProviderFactory | None
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("closed")
        exit_ = getattr(provider, "__aexit__", None)
        assert callable(exit_), "the provider must be an async context manager"
        await exit_(None, None, None)  # what leaving the fixture's `async with` does
        await expect_closed(provider, key, t.long_ttl_ms, "leaving async with")
        if provider_factory is not None:
            async with open_provider(provider_factory) as fresh:
                check_granted(
                    await fresh.acquire_lease(key, "alice", t.long_ttl_ms),
                    "alice",
                    t.caps,
                    "acquire",
                )
                await release(fresh, key, "alice")
            await expect_closed(fresh, key, t.long_ttl_ms, "leaving async with")
