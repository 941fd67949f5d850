"""The fair-waiting extra: a queue of waiters per key in the store (``fair_waiting``)."""

from __future__ import annotations

from typing import Protocol

from .._contract import LeaseResult
from ._records import _register_extra

__all__ = ["FAIR_PLACE_TTL_MS", "SupportsFairWaiting"]

FAIR_PLACE_TTL_MS = 3000
"""How long a fair waiter's place in line lives after its last attempt: a waiter that
stops waiting loses it then, and the next moves up. :func:`leasekit.wait_for` with
``fair=True`` tries again at least every third of it."""


class SupportsFairWaiting(Protocol):
    """A backend that serves waiters for a key in arrival order.

    ``acquire_lease_in_turn`` is ``acquire_lease`` with a line: one atomic step that
    grants the key when it is free and nobody with a live place is ahead of the
    caller (or refreshes the caller's own lease, same token), and otherwise puts the
    caller at the end of the line (or keeps its place, its place's TTL reset to
    ``place_ttl_ms``) and denies. A grant takes the caller out of the line. Denied
    while the key is free (someone is ahead), the result's ``owner`` is ``None``.
    """

    async def acquire_lease_in_turn(
        self, key: str, owner: str, ttl_ms: int, *, place_ttl_ms: int
    ) -> LeaseResult:
        """Acquire ``key`` for ``owner`` in its turn; otherwise keep its place in line."""
        ...


_register_extra(SupportsFairWaiting, "acquire_lease_in_turn")
