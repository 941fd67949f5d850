"""Lifecycle: the provider is what ``connect`` promises, and closing it is final.

After ``aclose()`` (or leaving ``async with``) every operation raises a
:class:`leasekit.LeaseError` (``LeaseProviderClosed``), never a driver's exception,
and never hangs. Closing twice is harmless: the suite closes the fixture's provider
in a test and the fixture closes it again. Closing with operations in flight settles
every caller, with a result or a ``LeaseError`` (never a bare ``CancelledError`` that
nobody asked for), within the provider's ``timeout_s`` plus half a second.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

import anyio
import anyio.lowlevel
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

IN_FLIGHT = 50
"""How many operations are in flight when the lifecycle checks call ``aclose()``."""

DEFAULT_TIMEOUT_S = 5.0
"""The operation timeout assumed for a provider without a ``timeout_s`` attribute."""

CLOSE_ALLOWANCE_S = 0.5
"""How much longer than ``timeout_s`` an ``aclose()`` with operations in flight may take."""


def timeout_of(provider: object) -> float:
    """The provider's ``timeout_s`` (a positive number), else :data:`DEFAULT_TIMEOUT_S`."""
    timeout_s = getattr(provider, "timeout_s", None)
    if isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool) and timeout_s > 0:
        return float(timeout_s)
    return DEFAULT_TIMEOUT_S


def describe_outcome(outcome: object) -> str:
    if isinstance(outcome, BaseException):
        return f"{type(outcome).__module__}.{type(outcome).__qualname__}: {outcome}"
    return repr(outcome)


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

    async def test_aclose_with_operations_in_flight_settles_every_caller(
        self, provider: LeaseProvider
    ) -> None:
        """50 operations of every kind in flight, then ``aclose()``.

        Every caller gets its result or a :class:`leasekit.LeaseError` (never a bare
        ``CancelledError`` it did not ask for, never a driver's exception), ``aclose()``
        returns within ``timeout_s`` + 0.5 s, and every operation afterwards raises.
        """
        t, keys = Timing.of(provider), KeySpace()
        timeout_s = timeout_of(provider)
        aclose = getattr(provider, "aclose", None)
        assert callable(aclose), "the provider must have an aclose() coroutine method"
        held = [keys(f"held-{i}") for i in range(10)]
        for key in held:
            check_granted(
                await provider.acquire_lease(key, "alice", t.long_ttl_ms),
                "alice",
                t.caps,
                "acquire",
            )
        calls: list[tuple[str, tuple[object, ...]]] = []
        for i in range(IN_FLIGHT):
            key = held[i % len(held)]
            calls.append(
                [
                    ("acquire_lease", (keys(f"free-{i}"), "bob", t.long_ttl_ms)),
                    ("get_lease_owner", (key,)),
                    ("renew_lease", (key, "alice", t.long_ttl_ms)),
                    ("transfer_lease", (key, "alice", "alice", t.long_ttl_ms)),
                    ("release_lease", (keys(f"free-{i}"), "carol")),
                ][i % 5]
            )
        outcomes: dict[int, object] = {}
        settled = anyio.Event()

        async def call(index: int) -> None:
            name, args = calls[index]
            try:
                outcomes[index] = await getattr(provider, name)(*args)
            except BaseException as exc:  # noqa: BLE001  (judged below, naming what was raised)
                outcomes[index] = exc
            if len(outcomes) == IN_FLIGHT:
                settled.set()

        settle_s = timeout_s + CLOSE_ALLOWANCE_S
        async with anyio.create_task_group() as tg:
            for index in range(IN_FLIGHT):
                tg.start_soon(call, index)
            await anyio.lowlevel.checkpoint()  # every caller now runs, waiting on the store
            started = time.monotonic()
            with anyio.move_on_after(settle_s + CLOSED_CALL_TIMEOUT_S) as scope:
                await aclose()
            closed_s = time.monotonic() - started
            if scope.cancelled_caught:
                tg.cancel_scope.cancel()
                pytest.fail(
                    f"aclose() with {IN_FLIGHT} operations in flight hung for {closed_s:.1f} s"
                )
            with anyio.move_on_after(settle_s):
                await settled.wait()
            settled_outcomes = dict(outcomes)  # before cancelling the callers still waiting
            tg.cancel_scope.cancel()
        pending = sorted(set(range(IN_FLIGHT)) - set(settled_outcomes))
        assert not pending, (
            f"{len(pending)} of {IN_FLIGHT} callers in flight at aclose() were still waiting "
            f"{settle_s:.1f} s after it returned (timeout_s={timeout_s:g}), for example "
            f"{calls[pending[0]][0]}"
        )
        for index, outcome in sorted(settled_outcomes.items()):
            name = calls[index][0]
            if isinstance(outcome, BaseException):
                assert isinstance(outcome, LeaseError), (
                    f"{name} in flight at aclose() raised {describe_outcome(outcome)}; every "
                    "caller must get its result or a leasekit.LeaseError "
                    "(leasekit.LeaseProviderClosed), never a bare CancelledError nobody asked "
                    "for, nor a driver's exception"
                )
                assert not isinstance(outcome, InvalidLeaseArgument), (
                    f"{name} with valid arguments in flight at aclose() raised {outcome!r}"
                )
        assert closed_s <= settle_s, (
            f"aclose() with {IN_FLIGHT} operations in flight took {closed_s:.2f} s; it must "
            f"return within timeout_s + {CLOSE_ALLOWANCE_S:g} s ({settle_s:.2f} s, "
            f"timeout_s={timeout_s:g}{'' if hasattr(provider, 'timeout_s') else ', assumed'})"
        )
        await expect_closed(
            provider, keys("after"), t.long_ttl_ms, "aclose() with operations in flight"
        )

    async def test_second_aclose_is_a_no_op(self, provider: LeaseProvider) -> None:
        """``aclose()`` again returns at once without raising; the provider stays closed."""
        t, keys = Timing.of(provider), KeySpace()
        aclose = getattr(provider, "aclose", None)
        assert callable(aclose), "the provider must have an aclose() coroutine method"
        await aclose()
        with anyio.move_on_after(CLOSE_ALLOWANCE_S) as scope:
            try:
                await aclose()
            except Exception as exc:  # noqa: BLE001  (the failure names what was raised)
                pytest.fail(f"a second aclose() raised {describe_outcome(exc)}; it must be a no-op")
        assert not scope.cancelled_caught, (
            f"a second aclose() did not return within {CLOSE_ALLOWANCE_S:g} s; it must be a no-op"
        )
        await expect_closed(provider, keys("twice"), t.long_ttl_ms, "a second aclose()")
