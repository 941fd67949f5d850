"""Fair waiting: the store's line of waiters (``Capabilities(fair_waiting=True)``).

:class:`FairWaitingChecks` runs on a backend that declares ``fair_waiting=True``:
``acquire_lease_in_turn`` grants a free key only to the first live place in its line,
keeps each waiter's place while it comes back in time and drops it when it does not,
refreshes the holder's own lease like ``acquire_lease``, and ``leasekit.wait_for(...,
fair=True)`` serves eight waiters in the order they joined the line.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import anyio
import pytest

import leasekit
from leasekit import InvalidLeaseArgument, LeaseProvider, LeaseResult

from ._base import ContractBase, KeySpace, Timing, check_granted, run_concurrently

__all__ = ["FAIR_WAITING_CHECKS", "FairWaitingChecks"]

PLACE_TTL_MS = 60_000
"""A place that must not lapse during a check."""


def _require_fair(provider: Any) -> Timing:
    t = Timing.of(provider)
    if not t.caps.fair_waiting:
        pytest.skip("the backend declares fair_waiting=False")
    if not callable(getattr(provider, "acquire_lease_in_turn", None)):
        pytest.fail(
            "the backend declares fair_waiting=True but has no acquire_lease_in_turn "
            "(see leasekit.backend.SupportsFairWaiting)"
        )
    return t


class FairWaitingChecks(ContractBase):
    """Arrival order through the store's line of waiters."""

    async def test_a_free_key_goes_to_the_first_place_in_line(
        self, provider: LeaseProvider
    ) -> None:
        t = _require_fair(provider)
        p: Any = provider
        key = KeySpace()("line")
        turn = functools.partial(p.acquire_lease_in_turn, key, place_ttl_ms=PLACE_TTL_MS)
        held = await turn("holder", t.long_ttl_ms)
        check_granted(held, "holder", t.caps, "an empty line")
        for waiter in ("w1", "w2", "w3"):
            denied = await turn(waiter, t.long_ttl_ms)
            assert denied == LeaseResult(False, "holder", None), denied
        # The holder's own call refreshes its lease, same token, as acquire_lease does.
        again = await turn("holder", t.long_ttl_ms)
        assert (again.acquired, again.token) == (True, held.token), again
        await provider.release_lease(key, "holder")
        # Free, but w1 is first: w3 and w2 are refused (told of no holder), w1 gets it.
        for waiter in ("w3", "w2"):
            assert await turn(waiter, t.long_ttl_ms) == LeaseResult(False, None, None)
        check_granted(await turn("w1", t.long_ttl_ms), "w1", t.caps, "first in line")
        await provider.release_lease(key, "w1")
        # w1 left the line with its grant; w2 is next, though w3 asked first this time.
        assert await turn("w3", t.long_ttl_ms) == LeaseResult(False, None, None)
        check_granted(await turn("w2", t.long_ttl_ms), "w2", t.caps, "second in line")
        await provider.release_lease(key, "w2")
        check_granted(await turn("w3", t.long_ttl_ms), "w3", t.caps, "third in line")

    async def test_a_waiter_that_stops_coming_back_loses_its_place(
        self, provider: LeaseProvider
    ) -> None:
        t = _require_fair(provider)
        p: Any = provider
        key = KeySpace()("line-lapse")
        check_granted(
            await p.acquire_lease_in_turn(key, "holder", t.long_ttl_ms, place_ttl_ms=PLACE_TTL_MS),
            "holder",
            t.caps,
            "",
        )
        joined = time.monotonic()
        await p.acquire_lease_in_turn(key, "gone", t.long_ttl_ms, place_ttl_ms=t.short_ttl_ms)
        await p.acquire_lease_in_turn(key, "stays", t.long_ttl_ms, place_ttl_ms=PLACE_TTL_MS)
        await provider.release_lease(key, "holder")
        await t.outlive(joined, t.short_ttl_ms)
        stays = await p.acquire_lease_in_turn(
            key, "stays", t.long_ttl_ms, place_ttl_ms=PLACE_TTL_MS
        )
        check_granted(stays, "stays", t.caps, "the place ahead lapsed")

    async def test_the_plain_acquire_and_the_line_agree_on_the_holder(
        self, provider: LeaseProvider
    ) -> None:
        t = _require_fair(provider)
        p: Any = provider
        key = KeySpace()("line-plain")
        check_granted(await provider.acquire_lease(key, "a", t.long_ttl_ms), "a", t.caps, "")
        denied = await p.acquire_lease_in_turn(key, "b", t.long_ttl_ms, place_ttl_ms=PLACE_TTL_MS)
        assert denied == LeaseResult(False, "a", None), denied
        assert await provider.get_lease_owner(key) == "a"

    async def test_bad_arguments_are_refused(self, provider: LeaseProvider) -> None:
        t = _require_fair(provider)
        p: Any = provider
        key = KeySpace()("line-bad")
        for args, kwargs, argument in (
            (("", "a", t.long_ttl_ms), {"place_ttl_ms": 1000}, "key"),
            ((key, "", t.long_ttl_ms), {"place_ttl_ms": 1000}, "owner"),
            ((key, "a", 0), {"place_ttl_ms": 1000}, "ttl_ms"),
            ((key, "a", t.long_ttl_ms), {"place_ttl_ms": 0}, "place_ttl_ms"),
            ((key, "a", t.long_ttl_ms), {"place_ttl_ms": True}, "place_ttl_ms"),
        ):
            with pytest.raises(InvalidLeaseArgument) as caught:
                await p.acquire_lease_in_turn(*args, **kwargs)
            assert caught.value.argument == argument, (args, kwargs)
        assert await provider.get_lease_owner(key) is None
        with pytest.raises(InvalidLeaseArgument):
            await leasekit.wait_for(provider, key, "a", t.long_ttl_ms, 0, fair=1)  # type: ignore[arg-type]

    async def test_wait_for_fair_serves_waiters_in_the_order_they_joined(
        self, provider: LeaseProvider
    ) -> None:
        t = _require_fair(provider)
        p: Any = provider
        key = KeySpace()("line-wait")
        check_granted(
            await provider.acquire_lease(key, "holder", t.long_ttl_ms), "holder", t.caps, ""
        )
        waiters = [f"w{i}" for i in range(8)]
        for waiter in waiters:  # join the line in this order
            await p.acquire_lease_in_turn(key, waiter, t.long_ttl_ms, place_ttl_ms=PLACE_TTL_MS)
        served: list[str] = []

        async def wait(owner: str) -> None:
            await leasekit.wait_for(provider, key, owner, t.long_ttl_ms, 60, fair=True)
            served.append(owner)
            await provider.release_lease(key, owner)

        # Started in reverse: the line, not who asks first, decides.
        with anyio.fail_after(120):
            await run_concurrently(
                *(functools.partial(wait, w) for w in reversed(waiters)),
                functools.partial(provider.release_lease, key, "holder"),
            )
        assert served == waiters


FAIR_WAITING_CHECKS = frozenset(
    name for name in vars(FairWaitingChecks) if name.startswith("test_")
)
"""Every check here: they skip on a backend declaring ``fair_waiting=False``."""
