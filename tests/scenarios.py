"""Scenarios the backend test files share: each asserts every answer it gets."""

from __future__ import annotations

from leasekit import LeaseProvider, LeaseResult

LONG_MS = 60_000
"""Leases the tests must not see expire."""

EXERCISE_OPERATIONS = 13
"""Calls that :func:`exercise_every_operation` makes (with ``renew_ttl_ms=None``)."""

EXERCISE_READS = 3
"""``get_lease_owner`` calls among them."""


async def exercise_every_operation(
    p: LeaseProvider, key: str, *, renew_ttl_ms: int | None = None
) -> None:
    """Every kind of operation, granted and refused, asserting the answers.

    ``renew_ttl_ms`` adds one renew with that TTL (for etcd: a new TTL is a new lease).
    """
    granted = await p.acquire_lease(key, "a", LONG_MS)
    assert granted.acquired
    assert granted.token is not None
    assert await p.acquire_lease(key, "a", LONG_MS) == granted
    assert await p.acquire_lease(key, "b", LONG_MS) == LeaseResult(False, "a", None)
    assert await p.get_lease_owner(key) == "a"
    assert await p.renew_lease(key, "a", LONG_MS)
    if renew_ttl_ms is not None:
        assert await p.renew_lease(key, "a", renew_ttl_ms)
    assert not await p.renew_lease(key, "b", LONG_MS)
    assert await p.transfer_lease(key, "a", "b", LONG_MS)
    assert not await p.transfer_lease(key, "a", "c", LONG_MS)
    moved = await p.acquire_lease(key, "b", LONG_MS)
    assert moved.token is not None
    assert moved.token > granted.token
    await p.release_lease(key, "a")
    assert await p.get_lease_owner(key) == "b"
    await p.release_lease(key, "b")
    assert await p.get_lease_owner(key) is None
