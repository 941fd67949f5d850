"""The optional extras through each backend's native blocking provider.

What the async providers offer beyond the contract (``release_grant``,
``release_if_held``, batched
``renew_leases``, ``lease_remaining_ms``, ``inspect``, ``sweep``, ``row_count``,
``migrate``), run on the blocking ones from the same operations: each backend where
its async provider offers the extra, on a real server (or file). Facts are read back
through the provider or the server, never timed.
"""

from __future__ import annotations

import importlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from servers import with_options
from test_sync import backend_url

import leasekit
import leasekit.sync
from leasekit import InvalidLeaseArgument, LeaseBackendError
from leasekit.backend import LeaseRecord, sync_factory

LONG_TTL_MS = 60_000
PATIENCE_S = 30.0  # a bound only a broken expiry reaches

# Which extras each backend's async provider offers (and so its blocking one must).
RELEASE_GRANT = ["sqlite", "redis", "postgres", "etcd", "mysql"]
RENEW_MANY = ["sqlite", "redis", "postgres"]
REMAINING = ["sqlite", "redis", "postgres"]
INSPECT = ["sqlite", "postgres", "etcd", "mysql"]
SWEEP = ["sqlite", "postgres", "mysql"]


def native(url: str) -> Any:
    """The backend's native blocking provider for ``url``, as ``leasekit.sync`` builds it."""
    scheme = url.split(":", 1)[0]
    [info] = [info for info in leasekit.available_backends() if info.scheme == scheme]
    module, _, name = info.target.partition(":")
    factory = sync_factory(getattr(importlib.import_module(module), name))
    assert factory is not None, f"{scheme}: no native blocking provider"
    return factory(url)


def open_native(name: str, request: pytest.FixtureRequest, tmp_path: Path, **options: Any) -> Any:
    url = backend_url(name, request, tmp_path)
    return native(with_options(url, **options) if options else url).open()


@pytest.fixture
def leases(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    provider = open_native(request.param, request, tmp_path)
    try:
        yield provider
    finally:
        provider.close()


def fresh_key() -> str:
    return f"extras-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("leases", RELEASE_GRANT, indirect=True)
def test_release_grant_ends_that_grant_only(leases: Any) -> None:
    key = fresh_key()
    first = leases.acquire_lease(key, "a", LONG_TTL_MS)
    assert first.acquired
    assert isinstance(first.token, int)
    leases.release_grant(key, "a", first.token + 1000)  # another grant's token
    leases.release_grant(key, "b", first.token)  # another owner
    assert leases.get_lease_owner(key) == "a"
    leases.release_grant(key, "a", first.token)
    assert leases.get_lease_owner(key) is None
    with pytest.raises(InvalidLeaseArgument, match="key"):
        leases.release_grant("", "a", first.token)


@pytest.mark.parametrize("leases", RELEASE_GRANT, indirect=True)
def test_release_if_held_says_whether_it_released(leases: Any) -> None:
    key = fresh_key()
    assert not leases.release_if_held(key, "a")  # free
    assert leases.acquire_lease(key, "a", LONG_TTL_MS).acquired
    assert not leases.release_if_held(key, "b")  # another owner's: untouched
    assert leases.get_lease_owner(key) == "a"
    assert leases.release_if_held(key, "a")
    assert leases.get_lease_owner(key) is None
    assert not leases.release_if_held(key, "a")


@pytest.mark.parametrize("leases", RENEW_MANY, indirect=True)
def test_renew_leases_answers_each_item_as_renew_lease_would(leases: Any) -> None:
    held, other, free = fresh_key(), fresh_key(), fresh_key()
    assert leases.acquire_lease(held, "a", LONG_TTL_MS).acquired
    assert leases.acquire_lease(other, "b", LONG_TTL_MS).acquired
    items = [(held, "a", LONG_TTL_MS), (other, "a", LONG_TTL_MS), (free, "a", LONG_TTL_MS)]
    assert leases.renew_leases(items) == [True, False, False]
    assert leases.renew_leases([]) == []
    assert leases.get_lease_owner(other) == "b"  # a refused renewal changes nothing
    assert leases.get_lease_owner(free) is None
    with pytest.raises(InvalidLeaseArgument, match="ttl_ms"):
        leases.renew_leases([(held, "a", 0)])


@pytest.mark.parametrize("leases", REMAINING, indirect=True)
def test_lease_remaining_ms_is_the_servers_time_left(leases: Any) -> None:
    key = fresh_key()
    assert leases.lease_remaining_ms(key) is None
    assert leases.acquire_lease(key, "a", LONG_TTL_MS).acquired
    left = leases.lease_remaining_ms(key)
    assert left is not None
    assert 0 < left <= LONG_TTL_MS
    leases.release_lease(key, "a")
    assert leases.lease_remaining_ms(key) is None


@pytest.mark.parametrize("leases", INSPECT, indirect=True)
def test_inspect_lists_live_leases_by_prefix_in_key_order(leases: Any) -> None:
    prefix = fresh_key() + "/"
    tokens = {}
    for name in ("c", "a", "b"):
        result = leases.acquire_lease(prefix + name, f"o-{name}", LONG_TTL_MS)
        assert result.acquired
        tokens[name] = result.token
    assert leases.acquire_lease(fresh_key(), "elsewhere", LONG_TTL_MS).acquired
    leases.release_lease(prefix + "c", "o-c")
    records = leases.inspect(prefix)
    assert all(isinstance(record, LeaseRecord) for record in records)
    assert [(r.key, r.owner, r.token) for r in records] == [
        (prefix + "a", "o-a", tokens["a"]),
        (prefix + "b", "o-b", tokens["b"]),
    ]
    assert all(0 < r.remaining_ms <= LONG_TTL_MS for r in records)
    assert [r.key for r in leases.inspect(prefix, limit=1)] == [prefix + "a"]
    with pytest.raises(InvalidLeaseArgument, match="limit"):
        leases.inspect(prefix, limit=0)


@pytest.mark.parametrize("name", SWEEP)
def test_sweep_deletes_expired_rows_and_row_count_sees_it(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    options: dict[str, Any] = {}
    if name != "sqlite":  # rows expired longer ago than the grace (> timeout_s) go
        options = {"sweep_every": 0, "timeout_s": 1, "sweep_grace_s": 1.1}
    leases = open_native(name, request, tmp_path, **options)
    try:
        keys = [fresh_key() for _ in range(3)]
        for key in keys:
            assert leases.acquire_lease(key, "a", 1).acquired
        before = leases.row_count()
        assert before >= len(keys)
        deadline = time.monotonic() + PATIENCE_S
        while any(leases.get_lease_owner(key) for key in keys):
            assert time.monotonic() < deadline, "the 1 ms leases never expired"
            time.sleep(0.01)
        deleted = 0
        while leases.row_count() > before - len(keys):
            assert time.monotonic() < deadline, f"swept {deleted} rows of {len(keys)}"
            deleted += leases.sweep()
            time.sleep(0.05)
        assert deleted >= len(keys)
    finally:
        leases.close()


def test_postgres_migrate_through_the_blocking_provider(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """With ``create_schema=false`` a missing table names ``migrate``; the blocking
    provider's ``migrate`` then creates it (without first checking for it)."""
    url = backend_url("postgres", request, tmp_path)
    leases = native(with_options(url, create_schema="false"))
    try:
        with pytest.raises(LeaseBackendError, match="migrate"):
            leases.acquire_lease("k", "a", LONG_TTL_MS)
        assert leases.migrate() >= 1
        assert leases.acquire_lease("k", "a", LONG_TTL_MS).acquired
        assert leases.migrate() >= 1  # idempotent
    finally:
        leases.close()


def test_renew_leases_on_a_redis_cluster_sends_one_script_per_slot(
    redis_cluster: Any, redis_prefix: str
) -> None:
    """Keys rarely share a slot: each slot's items go in a script of their own, and
    the answers come back in the items' order."""
    leases = native(f"{redis_cluster.url}?cluster=true&prefix={redis_prefix}").open()
    try:
        keys = [fresh_key() for _ in range(8)]
        for key in keys[::2]:
            assert leases.acquire_lease(key, "a", LONG_TTL_MS).acquired
        slots = {leases.client.keyslot(f"{redis_prefix}{{{key}}}") for key in keys}
        assert len(slots) > 1  # more than one slot, so more than one script
        answers = leases.renew_leases([(key, "a", LONG_TTL_MS) for key in keys])
        assert answers == [True, False] * 4
    finally:
        leases.close()


@pytest.mark.anyio
async def test_the_suites_blocking_adapter_offers_the_extras_its_provider_has(
    tmp_path: Path,
) -> None:
    """So the suite's checks of an extra run through the blocking driver too, when
    a backend's test class hands it the native provider."""
    from leasekit_contract import BlockingProviderAsAsync  # noqa: PLC0415

    from leasekit.backend import SupportsInspect, SupportsRenewMany, supports  # noqa: PLC0415

    async with BlockingProviderAsAsync(native(f"sqlite:///{tmp_path / 'x.db'}")) as wrapped:
        assert supports(wrapped, SupportsRenewMany)
        assert supports(wrapped, SupportsInspect)
        assert (await wrapped.acquire_lease("k", "a", LONG_TTL_MS)).acquired
        assert await wrapped.renew_leases([("k", "a", LONG_TTL_MS)]) == [True]  # type: ignore[attr-defined]
        [record] = await wrapped.inspect("k", limit=5)  # type: ignore[attr-defined]
        assert (record.key, record.owner) == ("k", "a")
    facade = BlockingProviderAsAsync(leasekit.sync.connect("memory://"))
    assert not supports(facade, SupportsRenewMany)  # the facade offers none of them
    await facade.aclose()
