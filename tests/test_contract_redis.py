"""The conformance suite against Redis: a single server and a three-node Cluster.

Each through both drivers: the async provider, and the native blocking one that
``leasekit.sync.connect`` opens. Keys live under a prefix of the test's own. The
servers are this run's own (``tests/servers.py``) or ``$LEASEKIT_TEST_REDIS_URL``; the
suite on a server restarted under the client is ``test_redis.py``'s
``TestRedisContractAfterRestart``.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from servers import RedisClusterServer, missing_extra

import leasekit
import leasekit.sync

try:
    import redis  # noqa: F401 (the backend's dependency: skip cleanly without it)
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("redis", "the Redis tests")

from leasekit_contract import BlockingLeaseProviderContract, LeaseProviderContract
from leasekit_redis import RedisLeaseProvider


def cut_notifications() -> Callable[[RedisLeaseProvider], Awaitable[None]]:
    async def cut(provider: RedisLeaseProvider) -> None:
        await provider.break_notifications()  # on a cluster: every node's pub/sub connection

    return cut


@pytest.fixture
def cluster_url(redis_cluster: RedisClusterServer) -> str:
    return f"{redis_cluster.url}?cluster=true"


class TestRedisContract(LeaseProviderContract):
    """The whole suite against the session's redis-server (or $LEASEKIT_TEST_REDIS_URL)."""

    @pytest.fixture
    async def provider(self, redis_url: str, redis_prefix: str) -> AsyncIterator[Any]:
        async with RedisLeaseProvider.from_url(redis_url, prefix=redis_prefix) as provider:
            yield provider

    @pytest.fixture
    def provider_factory(self, redis_url: str, redis_prefix: str) -> Any:
        return functools.partial(leasekit.connect, redis_url, prefix=redis_prefix)

    @pytest.fixture
    def break_notifications(self) -> Any:
        return cut_notifications()


class TestRedisContractBlocking(BlockingLeaseProviderContract):
    """The whole suite through ``leasekit.sync.connect`` on the session's redis-server."""

    @pytest.fixture
    def blocking_factory(self, redis_url: str, redis_prefix: str) -> Any:
        return functools.partial(leasekit.sync.connect, redis_url, prefix=redis_prefix)


class TestRedisClusterContract(LeaseProviderContract):
    """The whole suite against a three-node Redis Cluster: every script respects slots."""

    @pytest.fixture
    async def provider(self, cluster_url: str, redis_prefix: str) -> AsyncIterator[Any]:
        async with RedisLeaseProvider.from_url(cluster_url, prefix=redis_prefix) as provider:
            yield provider

    @pytest.fixture
    def provider_factory(self, cluster_url: str, redis_prefix: str) -> Any:
        return functools.partial(leasekit.connect, cluster_url, prefix=redis_prefix)

    @pytest.fixture
    def break_notifications(self) -> Any:
        return cut_notifications()


class TestRedisClusterContractBlocking(BlockingLeaseProviderContract):
    """The whole suite through ``leasekit.sync.connect`` on the three-node Cluster."""

    @pytest.fixture
    def blocking_factory(self, cluster_url: str, redis_prefix: str) -> Any:
        return functools.partial(leasekit.sync.connect, cluster_url, prefix=redis_prefix)
