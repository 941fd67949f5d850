"""Cancellation: a caller cancelled mid-acquire, mid-``hold()``, leaves no key held.

A client disconnects, a ``TaskGroup`` fails, a request timeout fires: the task is
cancelled 0-4 ms into ``acquire_lease``, into entering ``hold()`` or into leaving it.
Afterwards no key may be held by an owner that never got ``acquired=True`` back (nor
by a holder whose block was left): a grant that landed after its caller stopped
listening is undone in the background. The undo is given the provider's
``timeout_s`` (5 s for a provider without one) to land; every key is read from the
store, nothing is timed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest

import leasekit
from leasekit import LeaseProvider
from leasekit.backend import SupportsReleaseGrant, supports

from ._base import BLOCKING_DRIVER_REASON, ContractBase, KeySpace, Timing

_MAX_DELAY_S = 0.004
RELEASE_GRANT_CHECK = "test_release_grant_releases_only_the_grant_with_that_token"
"""The check that skips on a backend without ``release_grant`` (or without fencing)."""

CANCEL_CHECKS = frozenset(
    {
        "test_a_cancelled_acquire_strands_no_key",
        "test_a_cancelled_transfer_strands_no_key",
        "test_a_grant_after_a_cancelled_acquire_is_never_undone",
        "test_a_hold_cancelled_while_entering_strands_no_key",
        "test_a_hold_cancelled_while_leaving_strands_no_key",
    }
)
"""The checks that cancel calls mid-flight: asyncio only, and not through the blocking driver."""

_FEW = 60
MANY = 300
# Both counts, unmarked: a third party's --strict-markers would refuse a mark the suite
# cannot register (leasekit's own tests mark the MANY runs slow).
_CANCELS = [_FEW, MANY]
_AGAIN = 40
_LATE_UNDO_S = 0.3


def _patience_s(provider: object) -> float:
    # An undo waits for the interrupted call to settle (at most timeout_s), then sends
    # its release, once more on a timeout (leasekit's toolkit: 3 tries of timeout_s):
    # waiting only ends this early when a key is still held, and a loaded machine's
    # busy pool can time out a release.
    timeout_s = getattr(provider, "timeout_s", None)
    return 5 * (timeout_s if isinstance(timeout_s, (int, float)) else 5.0) + 1.0


class _Delays:
    """Random delays: every other one 0-4 ms, the others within twice an acquire's time.

    A store that answers in 0.3 ms sees most 0-4 ms cancels arrive after the call has
    ended, or at its very start; the others, spread over the call's own time, fall
    inside it, at every stage.
    """

    def __init__(self, seed: int, span_s: float) -> None:
        self._rng = random.Random(seed)
        self.span_s = span_s
        self._short = False

    @classmethod
    async def of(cls, provider: LeaseProvider, seed: int) -> _Delays:
        t, keys = Timing.of(provider), KeySpace()
        loop = asyncio.get_running_loop()
        took: list[float] = []
        for i in range(5):
            start = loop.time()
            await provider.acquire_lease(keys(f"timing-{i}"), "timing", t.long_ttl_ms)
            took.append(loop.time() - start)
            await provider.release_lease(keys(f"timing-{i}"), "timing")
        return cls(seed, min(_MAX_DELAY_S, 2 * sorted(took)[len(took) // 2]))

    def __call__(self) -> float:
        self._short = not self._short
        return self._rng.uniform(0, self.span_s if self._short else _MAX_DELAY_S)


async def _cancel_at_random(
    provider: LeaseProvider, work: Callable[[], Awaitable[object]], delays: _Delays
) -> bool:
    """Run ``work`` in a task cancelled after one of ``delays``; True if it was interrupted."""
    task = asyncio.ensure_future(work())
    await asyncio.sleep(delays())
    task.cancel()
    if not (await asyncio.wait((task,), timeout=_patience_s(provider)))[0]:
        task.cancel()
        await asyncio.wait((task,))
        pytest.fail(f"the cancellation of a task was swallowed: it ran on ({task!r})")
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


async def _stranded(provider: LeaseProvider, held: dict[str, str]) -> dict[str, str]:
    """Keys still held by the owner named in ``held``, once undos had time to land."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _patience_s(provider)
    while True:
        owners = await asyncio.gather(*(provider.get_lease_owner(key) for key in held))
        left = {
            key: owner
            for (key, owner), now in zip(held.items(), owners, strict=True)
            if now == owner
        }
        if not left or loop.time() >= deadline:
            return left
        await asyncio.sleep(0.05)


class CancellationChecks(ContractBase):
    """Cancels at random points leave no key held by an owner that was not told it holds it."""

    @pytest.fixture(autouse=True)
    def _only_asyncio(self, anyio_backend: str, request: pytest.FixtureRequest) -> None:
        if getattr(request.function, "__name__", "") not in CANCEL_CHECKS:
            return
        if self.blocking_driver:
            pytest.skip(BLOCKING_DRIVER_REASON)
        if anyio_backend != "asyncio":
            pytest.skip("cancelling at random points uses asyncio tasks")

    @pytest.mark.parametrize("cancels", _CANCELS)
    async def test_a_cancelled_acquire_strands_no_key(
        self, provider: LeaseProvider, cancels: int
    ) -> None:
        t, keys, delays = Timing.of(provider), KeySpace(), await _Delays.of(provider, cancels)
        suspects: dict[str, str] = {}
        for i in range(cancels):
            key, owner = keys(f"acquire-{i}"), f"owner-{i}"
            answers: list[leasekit.LeaseResult] = []

            async def acquire(
                key: str = key, owner: str = owner, out: list[leasekit.LeaseResult] = answers
            ) -> None:
                out.append(await provider.acquire_lease(key, owner, t.long_ttl_ms))

            if await _cancel_at_random(provider, acquire, delays):
                suspects[key] = owner
            elif answers and answers[0].acquired:
                await provider.release_lease(key, owner)
        stranded = await _stranded(provider, suspects)
        assert not stranded, (
            f"{len(stranded)} of {len(suspects)} cancelled acquires left their key held "
            f"by an owner that never got acquired=True: {sorted(stranded)[:5]}"
        )

    async def test_a_cancelled_transfer_strands_no_key(self, provider: LeaseProvider) -> None:
        """A transfer cancelled mid-flight leaves the key with its holder, or free.

        Never with the new owner, who was not told: a transfer that landed is undone.
        """
        t, keys, delays = Timing.of(provider), KeySpace(), await _Delays.of(provider, 11)
        suspects: dict[str, str] = {}
        for i in range(_FEW):
            key, holder, successor = keys(f"transfer-{i}"), f"holder-{i}", f"successor-{i}"
            assert (await provider.acquire_lease(key, holder, t.long_ttl_ms)).acquired
            moved: list[bool] = []

            async def transfer(
                key: str = key,
                holder: str = holder,
                successor: str = successor,
                out: list[bool] = moved,
            ) -> None:
                out.append(await provider.transfer_lease(key, holder, successor, t.long_ttl_ms))

            if await _cancel_at_random(provider, transfer, delays):
                suspects[key] = successor
            await provider.release_lease(key, successor if moved and moved[0] else holder)
        stranded = await _stranded(provider, suspects)
        assert not stranded, (
            f"{len(stranded)} of {len(suspects)} cancelled transfers left their key held "
            f"by a successor that was never told: {sorted(stranded)[:5]}"
        )

    async def test_a_grant_after_a_cancelled_acquire_is_never_undone(
        self, provider: LeaseProvider
    ) -> None:
        """The undo of a cancelled acquire never releases the same owner's next grant.

        The owner acquires again at once, and is told it holds the key; an idempotent
        re-acquire keeps the token, so only the order of the two can tell them apart.
        """
        t, keys, delays = Timing.of(provider), KeySpace(), await _Delays.of(provider, 7)

        async def cancel_then_acquire(i: int) -> tuple[str, str, leasekit.LeaseResult]:
            key, owner = keys(f"again-{i}"), f"owner-{i}"
            await _cancel_at_random(
                provider, lambda: provider.acquire_lease(key, owner, t.long_ttl_ms), delays
            )
            return key, owner, await provider.acquire_lease(key, owner, t.long_ttl_ms)

        answers = await asyncio.gather(*(cancel_then_acquire(i) for i in range(_AGAIN)))
        assert all(result.acquired for _, _, result in answers), answers
        await asyncio.sleep(_LATE_UNDO_S)  # an undo wrongly left behind would land by now
        owners = await asyncio.gather(*(provider.get_lease_owner(key) for key, _, _ in answers))
        released = [
            key for (key, owner, _), now in zip(answers, owners, strict=True) if now != owner
        ]
        assert not released, f"granted after a cancelled acquire, then released: {released[:5]}"
        for key, owner, _ in answers:
            await provider.release_lease(key, owner)

    async def test_release_grant_releases_only_the_grant_with_that_token(
        self, provider: LeaseProvider
    ) -> None:
        """``release_grant(key, owner, token)``, where offered: that grant, nothing else."""
        if not supports(provider, SupportsReleaseGrant):
            pytest.skip("the backend does not offer release_grant (SupportsReleaseGrant)")
        t, keys = Timing.of(provider), KeySpace()
        key = keys("by-token")
        release_grant = provider.release_grant  # type: ignore[attr-defined]
        granted = await provider.acquire_lease(key, "a", t.long_ttl_ms)
        assert granted.acquired
        if granted.token is None:
            pytest.skip("release_grant names a grant by its fencing token; this backend has none")
        await release_grant(key, "a", granted.token + 1)  # a later grant's token
        await release_grant(key, "b", granted.token)  # someone else
        assert await provider.get_lease_owner(key) == "a"
        await release_grant(key, "a", granted.token)
        assert await provider.get_lease_owner(key) is None
        again = await provider.acquire_lease(key, "a", t.long_ttl_ms)
        assert again.acquired
        await release_grant(key, "a", granted.token)  # the earlier grant: gone already
        assert await provider.get_lease_owner(key) == "a"
        await provider.release_lease(key, "a")

    @pytest.mark.parametrize("cancels", _CANCELS)
    async def test_a_hold_cancelled_while_entering_strands_no_key(
        self, provider: LeaseProvider, cancels: int
    ) -> None:
        t, keys, delays = Timing.of(provider), KeySpace(), await _Delays.of(provider, cancels)
        everyone: dict[str, str] = {}
        for i in range(cancels):
            key, owner = keys(f"enter-{i}"), f"owner-{i}"
            everyone[key] = owner

            async def enter(key: str = key, owner: str = owner) -> None:
                async with leasekit.hold(provider, key, owner, t.long_ttl_ms):
                    await asyncio.sleep(3600)  # held until cancelled

            await _cancel_at_random(provider, enter, delays)
        stranded = await _stranded(provider, everyone)
        assert not stranded, (
            f"{len(stranded)} of {cancels} holds cancelled while entering left their key "
            f"held: {sorted(stranded)[:5]}"
        )

    @pytest.mark.parametrize("cancels", _CANCELS)
    async def test_a_hold_cancelled_while_leaving_strands_no_key(
        self, provider: LeaseProvider, cancels: int
    ) -> None:
        t, keys, delays = Timing.of(provider), KeySpace(), await _Delays.of(provider, cancels)
        everyone: dict[str, str] = {}
        for i in range(cancels):
            key, owner = keys(f"leave-{i}"), f"owner-{i}"
            everyone[key] = owner
            entered = asyncio.Event()
            leave = asyncio.Event()

            async def held(
                key: str = key,
                owner: str = owner,
                entered: asyncio.Event = entered,
                leave: asyncio.Event = leave,
            ) -> None:
                async with leasekit.hold(provider, key, owner, t.long_ttl_ms):
                    entered.set()
                    await leave.wait()

            task = asyncio.ensure_future(held())
            waiting = asyncio.ensure_future(entered.wait())
            await asyncio.wait((task, waiting), return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            leave.set()  # the block ends now; the cancel falls into leaving it
            await asyncio.sleep(delays())
            task.cancel()
            await asyncio.wait((task,))
            if not task.cancelled():
                task.exception()
        stranded = await _stranded(provider, everyone)
        assert not stranded, (
            f"{len(stranded)} of {cancels} holds cancelled while leaving left their key "
            f"held: {sorted(stranded)[:5]}"
        )
