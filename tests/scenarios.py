"""Scenarios the backend test files share: each asserts every answer it gets."""

from __future__ import annotations

from typing import Any

from leasekit import LeaseProvider, LeaseResult
from leasekit.backend import parse_url

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


async def connect_mysql(url: str, *, autocommit: bool = True, **kwargs: Any) -> Any:
    """A plain asyncmy connection to the ``mysql://``/``mariadb://`` server of ``url``
    (for the tests' own statements beside the provider's)."""
    import asyncmy  # noqa: PLC0415 (only the MySQL tests need the driver)

    parsed = parse_url(url, schemes=("mysql", "mariadb"), default_port=3306)
    endpoint = parsed.endpoints[0]
    return await asyncmy.connect(
        host=endpoint.host,
        port=endpoint.port or 3306,
        user=parsed.username or "root",
        password=parsed.password or "",
        autocommit=autocommit,
        **kwargs,
    )
