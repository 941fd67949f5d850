"""Shared fixtures for leasekit's own tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import RedisClusterServer, RedisServer, missing_server


@pytest.fixture
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio, the loop every backend targets."""
    return "asyncio"


# -- real servers (tests/servers.py) ------------------------------------------------------
#
# Fixtures are session-scoped where a server can be shared, function-scoped where a test
# injects faults. A missing server binary skips the tests that need it, naming the install
# command, or fails them when LEASEKIT_REQUIRE_SERVERS=1 (CI).

REDIS_URL_ENV = "LEASEKIT_TEST_REDIS_URL"

RUN_ID = uuid.uuid4().hex[:10]
"""Unique to this test run: key prefixes on a shared server never collide across runs."""


def _redis_binary() -> str:
    binary = RedisServer.find()
    if binary is None:
        missing_server("redis-server is not installed", RedisServer.install_hint)
    return binary


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """This run's own redis-server (loopback, free port, no persistence), shared by tests.

    Do not inject faults here; take ``private_redis_server`` for that.
    """
    with RedisServer(_redis_binary(), tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A Redis URL to test against: ``$LEASEKIT_TEST_REDIS_URL``, else ``redis_server``'s.

    On a server given by URL, keys this run left under its prefixes are deleted at the end.
    """
    url = os.environ.get(REDIS_URL_ENV, "").strip()
    if not url:
        server: RedisServer = request.getfixturevalue("redis_server")
        yield server.url
        return
    yield url
    _delete_run_keys(url)


def _delete_run_keys(url: str) -> None:
    import redis  # noqa: PLC0415 (only tests that use a given server need the driver)

    with redis.Redis.from_url(url) as client:
        names = list(client.scan_iter(match=f"leasekit-test-{RUN_ID}-*", count=1000))
        for start in range(0, len(names), 500):
            client.unlink(*names[start : start + 500])


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix no other test (in this run or any other) uses."""
    return f"leasekit-test-{RUN_ID}-{uuid.uuid4().hex[:8]}:"


@pytest.fixture
def private_redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server for this test alone: pause, kill or restart it freely."""
    with RedisServer(_redis_binary(), tmp_path / "redis") as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServer]:
    """A three-primary Redis Cluster on loopback ports (about two seconds to settle)."""
    with RedisClusterServer(_redis_binary(), tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster
