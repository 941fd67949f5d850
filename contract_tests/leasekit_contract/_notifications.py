"""Release notifications and watching the owner.

:class:`NotificationChecks` runs its wake-up checks on a backend that declares
``release_notifications=True``: a waiter watching a key is woken by a release, by a
transfer to someone else (and is then still denied: a hint is never a grant), and
``wait_for`` takes a dead holder's key once it expires. With the optional
``break_notifications`` fixture (a coroutine function that kills the provider's
notification connection), it also checks that a lost channel wakes waiters and
degrades to polling instead of hanging. ``watch_owner`` is checked on every backend.

Timeouts here are generous upper bounds for a loaded machine, never the latency being
measured: a wake-up must come, and the order of events is what is asserted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

import leasekit
from leasekit import LeaseProvider

from ._base import (
    BLOCKING_DRIVER_REASON,
    ContractBase,
    KeySpace,
    Timing,
    check_denied,
    check_granted,
)

__all__ = ["WAKE_UP_CHECKS", "NotificationChecks"]

WAKE_UP_CHECKS = frozenset(
    {
        "test_a_release_wakes_a_waiter",
        "test_a_transfer_wakes_a_waiter_who_is_still_denied",
        "test_a_waiter_takes_a_dead_holders_key_after_its_expiry",
        "test_a_lost_channel_wakes_waiters_and_waiting_still_works",
    }
)
"""The checks that skip on a backend declaring ``release_notifications=False``."""

WAKE_TIMEOUT_S = 30.0
"""How long a waiter may wait for a wake-up that must come: far beyond any real latency."""


def _require_notifications(provider: Any) -> Timing:
    t = Timing.of(provider)
    if not t.caps.release_notifications:
        pytest.skip("the backend declares release_notifications=False")
    if not callable(getattr(provider, "watch_release", None)):
        pytest.fail(
            "the backend declares release_notifications=True but has no watch_release(key) "
            "coroutine method (see leasekit.backend.SupportsReleaseNotifications)"
        )
    return t


class NotificationChecks(ContractBase):
    """Wake-ups on release and transfer; a lost channel; watching the owner."""

    @pytest.fixture(autouse=True)
    def _not_blocking(self, request: pytest.FixtureRequest) -> None:
        if self.blocking_driver and getattr(request.function, "__name__", "") in WAKE_UP_CHECKS:
            pytest.skip(BLOCKING_DRIVER_REASON)

    @pytest.fixture
    def break_notifications(self) -> Callable[[Any], Awaitable[None]] | None:
        """Optional: a coroutine function that cuts ``provider``'s notification channel.

        For example, kill the connection a Redis provider subscribes on. With it, the
        suite checks that waiters are woken and fall back to polling when the channel is
        lost; without it that check is skipped.
        """
        return None

    async def test_a_release_wakes_a_waiter(self, provider: LeaseProvider) -> None:
        t = _require_notifications(provider)
        key = KeySpace()("released")
        check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, ""
        )
        watch = await provider.watch_release(key)  # type: ignore[attr-defined]
        try:
            check_denied(await provider.acquire_lease(key, "bob", t.long_ttl_ms), "alice", "")
            await provider.release_lease(key, "alice")
            woken = await watch.wait(WAKE_TIMEOUT_S)
            assert woken, f"release_lease did not wake the waiter within {WAKE_TIMEOUT_S:.0f} s"
            check_granted(
                await provider.acquire_lease(key, "bob", t.long_ttl_ms), "bob", t.caps, ""
            )
        finally:
            watch.close()

    async def test_a_transfer_wakes_a_waiter_who_is_still_denied(
        self, provider: LeaseProvider
    ) -> None:
        t = _require_notifications(provider)
        key = KeySpace()("transferred")
        check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, ""
        )
        watch = await provider.watch_release(key)  # type: ignore[attr-defined]
        try:
            assert await provider.transfer_lease(key, "alice", "carol", t.long_ttl_ms)
            woken = await watch.wait(WAKE_TIMEOUT_S)
            assert woken, f"transfer_lease did not wake the waiter within {WAKE_TIMEOUT_S:.0f} s"
            check_denied(await provider.acquire_lease(key, "bob", t.long_ttl_ms), "carol", "")
        finally:
            watch.close()

    async def test_a_waiter_takes_a_dead_holders_key_after_its_expiry(
        self, provider: LeaseProvider
    ) -> None:
        t = _require_notifications(provider)
        key = KeySpace()("expired")
        check_granted(
            await provider.acquire_lease(key, "alice", t.short_ttl_ms), "alice", t.caps, ""
        )
        with anyio.fail_after(WAKE_TIMEOUT_S):
            result = await leasekit.wait_for(provider, key, "bob", t.long_ttl_ms, timeout_s=None)
        check_granted(result, "bob", t.caps, "wait_for after the holder's expiry")

    async def test_a_lost_channel_wakes_waiters_and_waiting_still_works(
        self,
        provider: LeaseProvider,
        break_notifications: Callable[[Any], Awaitable[None]] | None,
    ) -> None:
        t = _require_notifications(provider)
        if break_notifications is None:
            pytest.skip("override the 'break_notifications' fixture to run this check")
        key = KeySpace()("lost-channel")
        check_granted(
            await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, ""
        )
        watch = await provider.watch_release(key)  # type: ignore[attr-defined]
        try:
            await break_notifications(provider)
            woken = await watch.wait(WAKE_TIMEOUT_S)
            assert woken, (
                "losing the notification channel must wake waiters (they may have missed a release)"
            )
        finally:
            watch.close()
        # And waiting goes on working: a release after the loss is still seen.
        async with anyio.create_task_group() as group:

            async def release_soon() -> None:
                await anyio.sleep(t.poll_s)
                await provider.release_lease(key, "alice")

            group.start_soon(release_soon)
            with anyio.fail_after(WAKE_TIMEOUT_S):
                result = await leasekit.wait_for(
                    provider, key, "bob", t.long_ttl_ms, timeout_s=None
                )
        check_granted(result, "bob", t.caps, "wait_for after the channel was lost")

    async def test_watch_owner_reports_each_change(self, provider: LeaseProvider) -> None:
        t = Timing.of(provider)
        key = KeySpace()("watched")
        seen: list[str | None] = []
        changes = leasekit.watch_owner(provider, key, poll_s=t.poll_s)
        try:
            with anyio.fail_after(WAKE_TIMEOUT_S):
                seen.append(await anext(changes))
                check_granted(
                    await provider.acquire_lease(key, "alice", t.long_ttl_ms), "alice", t.caps, ""
                )
                seen.append(await anext(changes))
                assert await provider.transfer_lease(key, "alice", "bob", t.long_ttl_ms)
                seen.append(await anext(changes))
                await provider.release_lease(key, "bob")
                seen.append(await anext(changes))
        finally:
            await changes.aclose()
        assert seen == [None, "alice", "bob", None]

    async def test_elect_passes_leadership_on_and_leaders_reports_it(
        self, provider: LeaseProvider
    ) -> None:
        t = Timing.of(provider)
        group = KeySpace()("election")
        terms: list[str] = []
        elected = {name: anyio.Event() for name in ("alice", "bob")}
        resign = {name: anyio.Event() for name in ("alice", "bob")}

        async def candidate(name: str) -> None:
            async with leasekit.elect(
                provider, group, name, t.long_ttl_ms, timeout_s=WAKE_TIMEOUT_S
            ) as term:
                assert term.owner == name
                terms.append(name)
                elected[name].set()
                await resign[name].wait()

        async def next_leader(changes: Any) -> str | None:
            leader: str | None = await anext(changes)
            while leader is None:
                leader = await anext(changes)
            return leader

        changes = leasekit.leaders(provider, group, poll_s=t.poll_s)
        try:
            with anyio.fail_after(WAKE_TIMEOUT_S):
                assert await anext(changes) is None
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(candidate, "alice")
                    await elected["alice"].wait()
                    assert await next_leader(changes) == "alice"
                    tasks.start_soon(candidate, "bob")
                    # Bob campaigns while Alice leads: nobody else is elected meanwhile.
                    await anyio.sleep(t.poll_s)
                    assert terms == ["alice"], "a second candidate was elected beside the leader"
                    check_denied(
                        await provider.acquire_lease(group, "carol", t.long_ttl_ms), "alice", ""
                    )
                    resign["alice"].set()  # Alice resigns: Bob's campaign ends in his term
                    await elected["bob"].wait()
                    assert await next_leader(changes) == "bob"
                    resign["bob"].set()
        finally:
            await changes.aclose()
        assert terms == ["alice", "bob"]
        assert await provider.get_lease_owner(group) is None, "a resigned leader kept the lease"
