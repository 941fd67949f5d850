"""Counting leases: ``limit`` slots per key, each with its own owner, TTL and token.

A key of a counting lease admits up to ``limit`` live holders at once (a semaphore
with expiry, as kazoo's ``Semaphore`` or Redisson's ``RPermitExpirableSemaphore``).
Each slot is held by one owner: ``acquire_slot`` takes one (or refreshes the caller's
own, keeping its token), ``renew_slot``, ``release_slot`` and ``transfer_slot`` act
on the caller's slot only, and every grant carries a fencing token greater than every
token issued for the key before. Counting keys live apart from the single-holder
leases of the contract: the same key string names two unrelated things there.

The store keeps the key's ``limit`` while any slot is live; an acquire with another
limit raises :class:`~leasekit.SlotLimitMismatch` and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._contract import validate_key, validate_owner, validate_ttl_ms
from ._errors import InvalidLeaseArgument

__all__ = [
    "EXCLUSIVE_INTENT_MS",
    "MAX_SLOT_LIMIT",
    "SLOT_HOLDERS_SHOWN",
    "SlotResult",
    "check_exclusive",
    "validate_limit",
]

MAX_SLOT_LIMIT = 1024
"""The largest ``limit`` a counting lease may have: each slot is a record in the store,
and a denial reads them."""

SLOT_HOLDERS_SHOWN = 16
"""How many holders a denied ``acquire_slot`` names at most (:attr:`SlotResult.holders`)."""


EXCLUSIVE_INTENT_MS = 3000
"""How long a denied exclusive acquirer's claim to go next lives (or its ``ttl_ms``, if
shorter): while it does, no new slot is granted to anyone else, so a writer waiting for
the readers to leave is not starved by new readers. A waiter retrying within it keeps
its claim; one that stops waiting loses it when it runs out."""


@dataclass(frozen=True, slots=True)
class SlotResult:
    """What ``acquire_slot`` decided.

    Granted: ``acquired`` is true, ``owner`` is the caller, ``token`` its slot's
    fencing token. Denied: ``owner`` and ``token`` are ``None``. Either way ``held`` is
    how many slots were live when the store decided (the caller's included when
    granted), ``limit`` the key's limit, and ``holders`` the owners of live slots (at
    most :data:`SLOT_HOLDERS_SHOWN`, in grant order; empty when granted).

    ``exclusive``: the key is held exclusively (by the caller when granted, by the
    holder when denied). ``waiting``: a denial's cause when it is not the count: the
    owner of a live claim of a waiting exclusive acquirer, which goes next (``None``
    otherwise, and on every grant).
    """

    acquired: bool
    owner: str | None
    token: int | None
    held: int
    limit: int
    holders: tuple[str, ...] = ()
    exclusive: bool = False
    waiting: str | None = None


def validate_limit(limit: object, argument: str = "limit") -> int:
    """Check a counting lease's ``limit``: an ``int`` from 1 to :data:`MAX_SLOT_LIMIT`."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be an int, got {type(limit).__name__}", limit
        )
    if not 1 <= limit <= MAX_SLOT_LIMIT:
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be between 1 and {MAX_SLOT_LIMIT}, got {limit}", limit
        )
    return limit


def check_exclusive(exclusive: object) -> bool:
    """Check ``acquire_slot``'s ``exclusive``: a ``bool``."""
    if not isinstance(exclusive, bool):
        raise InvalidLeaseArgument.for_argument(
            "exclusive", f"must be a bool, got {type(exclusive).__name__}", exclusive
        )
    return exclusive


def check_slot_acquire(key: str, owner: str, ttl_ms: int, limit: int, exclusive: object) -> None:
    """Check every argument of ``acquire_slot`` before any I/O (``InvalidLeaseArgument``)."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    validate_limit(limit)
    check_exclusive(exclusive)
