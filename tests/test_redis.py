"""The Redis backend: URLs and options, binary-safe names, fencing across restarts, one
round trip per operation, and faults (a paused, killed or restarted server, a flushed
script cache). The conformance suite is in ``test_contract_redis.py``, apart from its
run on a server restarted under the client (``TestRedisContractAfterRestart``, here).

Servers come from the harness in ``tests/servers.py`` via ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
from faults import eventually
from scenarios import EXERCISE_OPERATIONS, EXERCISE_READS, LONG_MS, exercise_every_operation
from servers import (
    RedisClusterServer,
    RedisServer,
    RespError,
    free_port,
    missing_extra,
    missing_server,
)

import leasekit
from leasekit import LeaseResult

try:
    import redis.asyncio
    from redis.crc import key_slot
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("redis", "the Redis tests")

from leasekit_contract import LeaseProviderContract
from leasekit_redis import LeaseRecord, RedisLeaseProvider

pytestmark = pytest.mark.anyio


# -- helpers -------------------------------------------------------------------------------


@pytest.fixture
async def provider(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisLeaseProvider]:
    async with RedisLeaseProvider.from_url(redis_url, prefix=redis_prefix) as p:
        yield p


@pytest.fixture
async def own_client(
    private_redis_server: RedisServer,
) -> AsyncIterator[redis.asyncio.Redis]:
    """A caller's client on the private server, with redis-py's defaults (no timeouts)."""
    client = redis.asyncio.Redis(host=private_redis_server.host, port=private_redis_server.port)
    yield client
    await client.aclose()


def command_calls(server: RedisServer) -> dict[str, int]:
    """Calls per command so far, from ``INFO commandstats`` (``{"evalsha": 3, ...}``)."""
    calls = {}
    for name, value in server.info("commandstats").items():
        fields = dict(part.split("=", 1) for part in value.split(","))
        calls[name.removeprefix("cmdstat_")] = int(fields["calls"])
    return calls


def names_on(server: RedisServer, pattern: str) -> list[bytes]:
    """The keys matching ``pattern`` on this one server (one node of a cluster)."""
    names: list[bytes] = []
    cursor: object = b"0"
    while True:
        reply = server.command("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
        assert isinstance(reply, list)
        cursor, batch = reply
        names.extend(batch)
        if cursor == b"0":
            return names


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    changed = {name: n - before.get(name, 0) for name, n in after.items()}
    return {name: n for name, n in changed.items() if n and name != "info"}


# -- registry, URLs and options --------------------------------------------------------------


def test_entry_points_declare_both_schemes_with_the_redis_extra() -> None:
    infos = {info.scheme: info for info in leasekit.available_backends()}
    for scheme in ("redis", "rediss"):
        assert infos[scheme].target == "leasekit_redis:RedisLeaseProvider"
        assert infos[scheme].extras == ("redis",)


async def test_connect_builds_a_provider_without_io() -> None:
    # Port 1 answers nothing; building must not try.
    provider = leasekit.connect("redis://127.0.0.1:1/0", require=("fencing", "atomic_transfer"))
    assert isinstance(provider, RedisLeaseProvider)
    assert provider.prefix == "leasekit:"
    assert provider.timeout_s == 5.0
    assert provider.counter_ttl_ms == 3_600_000
    await provider.aclose()


async def test_url_query_and_keywords_set_options_keywords_winning() -> None:
    provider = leasekit.connect(
        "redis://127.0.0.1:1/3?prefix=app%3Aleases%3A&timeout_s=0.25&counter_ttl_ms=none"
        "&client_name=worker&health_check_interval=30",
        timeout_s=1.5,
    )
    assert isinstance(provider, RedisLeaseProvider)
    assert provider.prefix == "app:leases:"
    assert provider.timeout_s == 1.5
    assert provider.counter_ttl_ms is None
    kwargs = provider.client.connection_pool.connection_kwargs
    assert kwargs["db"] == 3
    assert kwargs["client_name"] == "worker"
    # No socket timeout of redis-py's own: the provider's deadline bounds every call.
    assert kwargs["socket_timeout"] is None
    assert kwargs["socket_connect_timeout"] == 1.5
    await provider.aclose()


async def test_cluster_url_builds_a_cluster_client_without_io() -> None:
    provider = leasekit.connect("redis://127.0.0.1:1?cluster=true&prefix=c%3A")
    assert isinstance(provider, RedisLeaseProvider)
    assert isinstance(provider.client, redis.asyncio.RedisCluster)
    assert provider.prefix == "c:"
    await provider.aclose()
    with pytest.raises(leasekit.InvalidLeaseArgument, match="db"):
        leasekit.connect("redis://127.0.0.1:1/2?cluster=true")


async def test_rediss_url_builds_a_tls_client() -> None:
    provider = leasekit.connect("rediss://127.0.0.1:1?ssl_cert_reqs=none")
    assert isinstance(provider, RedisLeaseProvider)
    pool = provider.client.connection_pool
    assert pool.connection_class is redis.asyncio.SSLConnection
    await provider.aclose()


@pytest.mark.parametrize(
    ("url", "options", "argument"),
    [
        ("redis://h?colour=blue", {}, "url"),
        ("redis://h?decode_responses=true", {}, "url"),
        ("redis://h?ssl_cert_reqs=none", {}, "url"),  # TLS settings need rediss://
        ("redis://h:notaport", {}, "url"),
        ("redis://h", {"colour": "blue"}, "options"),
        ("redis://h", {"socket_timeout": 1}, "options"),
        ("redis://h?timeout_s=soon", {}, "timeout_s"),
        ("redis://h?timeout_s=0", {}, "timeout_s"),
        ("redis://h", {"timeout_s": True}, "timeout_s"),
        ("redis://h?counter_ttl_ms=0", {}, "counter_ttl_ms"),
        ("redis://h?autopipeline=maybe", {}, "autopipeline"),
        ("redis://h", {"counter_ttl_ms": 1.5}, "counter_ttl_ms"),
        ("redis://h?prefix=%7Bapp%7D", {}, "prefix"),
        ("redis://h", {"prefix": "a}b"}, "prefix"),
        ("redis://h", {"prefix": b"app:"}, "prefix"),
        ("redis://h?cluster=maybe", {}, "cluster"),
        ("redis://h", {"cluster": "yes"}, "cluster"),
        ("redis://h?max_connections=0", {}, "max_connections"),
        ("redis://h?max_connections=many", {}, "max_connections"),
        ("redis://h", {"max_connections": 2.5}, "max_connections"),
        ("redis://h?timeout=3", {}, "url"),  # the pool's wait is bounded by timeout_s
        ("redis://h?timeout_s=1&timeout_s=2", {}, "url"),
        ("redis://h1,h2/0", {}, "url"),
    ],
)
def test_bad_urls_and_options_name_the_problem(
    url: str, options: dict[str, Any], argument: str
) -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument) as info:
        leasekit.connect(url, **options)
    assert info.value.argument == argument


def test_from_url_refuses_other_schemes() -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument, match=r"redis://"):
        RedisLeaseProvider.from_url("unix:///tmp/redis.sock")


@pytest.mark.parametrize("path", ["/abc", "/1O", "/0/1", "/-1", "/ 1", "/0x1", "//0"])
def test_a_database_that_is_not_a_number_is_refused_naming_it(path: str) -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument) as info:
        leasekit.connect(f"redis://127.0.0.1:1{path}")
    assert info.value.argument == "url"
    assert "database" in str(info.value)
    assert repr(path) in str(info.value)


@pytest.mark.parametrize(("path", "db"), [("", 0), ("/", 0), ("/0", 0), ("/7", 7), ("/15", 15)])
async def test_a_database_number_or_none_is_taken(path: str, db: int) -> None:
    provider = leasekit.connect(f"redis://127.0.0.1:1{path}")
    assert isinstance(provider, RedisLeaseProvider)
    assert provider.client.connection_pool.connection_kwargs.get("db", 0) == db
    await provider.aclose()


@pytest.mark.parametrize(("flag", "cluster"), [("on", True), ("yes", True), ("off", False)])
async def test_booleans_read_the_same_as_every_backend(flag: str, cluster: bool) -> None:
    provider = leasekit.connect(f"redis://127.0.0.1:1?cluster={flag}")
    assert isinstance(provider, RedisLeaseProvider)
    assert isinstance(provider.client, redis.asyncio.RedisCluster) is cluster
    await provider.aclose()


async def test_the_built_pool_blocks_at_max_connections_default_50() -> None:
    provider = leasekit.connect("redis://127.0.0.1:1/0")
    assert isinstance(provider, RedisLeaseProvider)
    pool = provider.client.connection_pool
    assert isinstance(pool, redis.asyncio.BlockingConnectionPool)
    assert pool.max_connections == 50
    await provider.aclose()
    provider = leasekit.connect("redis://127.0.0.1:1/0?max_connections=7", max_connections=3)
    assert isinstance(provider, RedisLeaseProvider)
    assert provider.client.connection_pool.max_connections == 3  # keywords win
    await provider.aclose()


SECRET_URLS = [
    "redis:/user:s3cret@host",
    "redis//user:s3cret@host",
    "redis://user:s3cret@h/0?colour=blue",
    "redis://user:s3cret@h:notaport/0",
    "redis://user:s3cret@h/abc",
    "redis://:s3cret@h/0?max_connections=none",
    "redis://user:s3cret@h/0?socket_timeout=soon",
    "redis://user:s3cret@h/3?cluster=true",
    "redis://user:s3cret@h1,h2/0",
    "redis://h/0?password=s3cret&colour=blue",
]


@pytest.mark.parametrize("url", SECRET_URLS)
def test_errors_never_show_the_password(url: str) -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument) as info:
        leasekit.connect(url)
    for shown in (str(info.value), repr(info.value), repr(vars(info.value))):
        assert "s3cret" not in shown


async def test_repr_never_shows_the_password() -> None:
    provider = leasekit.connect("redis://user:s3cret@127.0.0.1:1/0")
    assert "s3cret" not in repr(provider)
    assert "127.0.0.1:1" in repr(provider)
    await provider.aclose()
    assert "s3cret" not in repr(provider)


async def test_a_sync_client_is_refused_with_a_hint() -> None:
    import redis as sync_redis  # noqa: PLC0415

    client = sync_redis.Redis(host="127.0.0.1", port=1)
    with pytest.raises(leasekit.InvalidLeaseArgument, match=r"asyncio"):
        RedisLeaseProvider(client)
    client.close()


async def test_unreachable_server_fails_at_async_with_at_once() -> None:
    # A refused connection is an answer: it must not wait for timeout_s.
    provider = RedisLeaseProvider.from_url(f"redis://127.0.0.1:{free_port()}/0", timeout_s=30)
    started = time.monotonic()
    with pytest.raises(leasekit.LeaseBackendUnreachable) as info:
        async with provider:
            pass
    assert time.monotonic() - started < 10
    assert info.value.backend == "redis"
    assert isinstance(info.value.__cause__, redis.exceptions.ConnectionError)
    await provider.aclose()


# -- clients and closing -------------------------------------------------------------------


async def test_an_unreachable_cluster_is_unreachable_at_once() -> None:
    provider = RedisLeaseProvider.from_url(
        f"redis://127.0.0.1:{free_port()}?cluster=true", timeout_s=30
    )
    started = time.monotonic()
    with pytest.raises(leasekit.LeaseBackendUnreachable) as info:
        await provider.acquire_lease("k", "a", LONG_MS)
    assert time.monotonic() - started < 10
    assert info.value.key == "k"
    assert isinstance(info.value.__cause__, redis.exceptions.RedisClusterException)
    await provider.aclose()


async def test_a_callers_client_is_used_and_never_closed(
    own_client: redis.asyncio.Redis, redis_prefix: str
) -> None:
    async with RedisLeaseProvider(own_client, prefix=redis_prefix) as provider:
        await exercise_every_operation(provider, "k")
    with pytest.raises(leasekit.LeaseProviderClosed):
        await provider.get_lease_owner("k")
    assert await own_client.ping()  # still open and usable


async def test_a_built_client_is_closed_by_aclose(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    def clients() -> int:
        # The INFO itself arrives on one connection of its own.
        return int(private_redis_server.info("clients")["connected_clients"]) - 1

    assert clients() == 0
    provider = RedisLeaseProvider.from_url(private_redis_server.url, prefix=redis_prefix)
    async with provider:
        await exercise_every_operation(provider, "k")
        assert clients() >= 1
    assert clients() == 0
    for call in (provider.get_lease_owner("k"), provider.inspect()):
        with pytest.raises(leasekit.LeaseProviderClosed):
            await call
    await provider.aclose()  # idempotent


async def test_a_callers_client_decoding_responses_works(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    client = redis.asyncio.Redis.from_url(private_redis_server.url, decode_responses=True)
    async with RedisLeaseProvider(client, prefix=redis_prefix) as provider:
        await exercise_every_operation(provider, "k\0é")
        await provider.acquire_lease("k\0é", "ö\0wner", LONG_MS)
        [record] = await provider.inspect()
        assert (record.key, record.owner) == ("k\0é", "ö\0wner")
    await client.aclose()


async def test_a_callers_cluster_client_spreads_keys_over_every_node(
    redis_cluster: RedisClusterServer, redis_prefix: str
) -> None:
    node = redis_cluster.nodes[0]
    client = redis.asyncio.RedisCluster(host=node.host, port=node.port)
    async with RedisLeaseProvider(client, prefix=redis_prefix) as provider:
        keys = [f"thread/{i}" for i in range(30)]
        for key in keys:
            await exercise_every_operation(provider, key)
            assert (await provider.acquire_lease(key, "w", LONG_MS)).acquired
        records = await provider.inspect("thread/")
        assert [r.key for r in records] == sorted(keys)
    await client.aclose()
    pattern = redis_prefix + "*"
    per_node = [len(names_on(node, pattern)) for node in redis_cluster.nodes]
    assert sum(per_node) == 2 * len(keys)  # a lease and a counter per key
    assert all(count > 0 for count in per_node), per_node


def client_connections(server: RedisServer) -> int:
    """Connections the server has open now, not counting the one asking (``CLIENT LIST``)."""
    reply = server.command("CLIENT", "LIST")
    assert isinstance(reply, bytes)
    return sum(1 for line in reply.decode().splitlines() if line and "cmd=client|list" not in line)


def connections_accepted(server: RedisServer) -> int:
    """Connections the server accepted so far, the one asking included."""
    return int(server.info("stats")["total_connections_received"])


async def test_aclose_with_operations_in_flight_leaves_no_server_connection(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    before = client_connections(private_redis_server)
    provider = RedisLeaseProvider.from_url(private_redis_server.url, prefix=redis_prefix)
    await provider.__aenter__()
    calls = [
        asyncio.ensure_future(provider.acquire_lease(f"k{i}", "a", LONG_MS)) for i in range(60)
    ]
    await asyncio.sleep(0)  # every call is under way: some on a connection, some waiting
    await provider.aclose()
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        # Each finished with its result, or was refused as closed: never cancelled.
        assert isinstance(result, leasekit.LeaseResult | leasekit.LeaseProviderClosed), result
    assert any(isinstance(result, leasekit.LeaseResult) for result in results)
    await eventually(
        lambda: client_connections(private_redis_server) == before, "the connections to close"
    )


# -- the pool: operations wait for a connection, within timeout_s ------------------------------


async def test_operations_beyond_max_connections_wait_for_a_free_one(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    url = f"{private_redis_server.url}?max_connections=2"
    accepted = connections_accepted(private_redis_server)
    async with RedisLeaseProvider.from_url(url, prefix=redis_prefix) as provider:
        results = await asyncio.gather(
            *(provider.acquire_lease(f"k{i}", "a", LONG_MS) for i in range(50)),
            return_exceptions=True,
        )
    assert [r for r in results if not isinstance(r, leasekit.LeaseResult)] == []
    assert all(isinstance(r, leasekit.LeaseResult) and r.acquired for r in results)
    # One more than the provider's: the INFO that asks.
    assert connections_accepted(private_redis_server) - accepted <= 2 + 1


async def test_a_cluster_client_waits_for_a_free_connection_too(
    redis_cluster: RedisClusterServer, redis_prefix: str
) -> None:
    url = f"{redis_cluster.url}?cluster=true&max_connections=2"
    async with RedisLeaseProvider.from_url(url, prefix=redis_prefix) as provider:
        results = await asyncio.gather(
            *(provider.acquire_lease(f"k{i}", "a", LONG_MS) for i in range(50)),
            return_exceptions=True,
        )
        assert [r for r in results if not isinstance(r, leasekit.LeaseResult)] == []
        assert len(await provider.inspect()) == 50


async def contend(
    provider: RedisLeaseProvider, tasks: int, seconds: float
) -> tuple[int, list[Any]]:
    """``tasks`` tasks acquiring and releasing 50 keys for ``seconds``: (operations, errors)."""
    loop = asyncio.get_running_loop()
    stop = loop.time() + seconds
    errors: list[Any] = []
    done = 0

    async def worker(i: int) -> None:
        nonlocal done
        key, owner = f"k{i % 50}", f"o{i}"
        while True:  # at least once, however loaded the machine: all 500 at once
            try:
                if (await provider.acquire_lease(key, owner, 10_000)).acquired:
                    await provider.release_lease(key, owner)
            except leasekit.LeaseError as exc:
                errors.append(exc)
            done += 1
            if loop.time() >= stop:
                return

    await asyncio.gather(*(worker(i) for i in range(tasks)))
    return done, errors


@pytest.mark.parametrize("seconds", [2, pytest.param(10, marks=pytest.mark.slow)])
async def test_500_tasks_on_one_provider_at_default_settings_get_no_error(
    redis_url: str, redis_prefix: str, seconds: float
) -> None:
    async with RedisLeaseProvider.from_url(redis_url, prefix=redis_prefix) as provider:
        done, errors = await contend(provider, 500, seconds)
    assert errors == []
    assert done >= 500


class PasswordRedisServer(RedisServer):
    """``redis-server --requirepass``: up once it refuses a PING for want of a password."""

    def probe(self) -> bool:
        try:
            self.command("PING", timeout_s=1.0)
        except RespError as exc:
            return "NOAUTH" in str(exc)
        except OSError:
            return False
        return True


@pytest.fixture
def password_redis_server(tmp_path: Any) -> Iterator[RedisServer]:
    binary = RedisServer.find()
    if binary is None:
        missing_server("redis-server is not installed", RedisServer.install_hint)
    with PasswordRedisServer(
        binary, tmp_path / "redis", extra_args=["--requirepass", "right-pw"]
    ) as server:
        yield server


@pytest.mark.parametrize("user", ["", "default"])
async def test_a_wrong_password_is_unreachable_at_once_and_never_shown(
    password_redis_server: RedisServer, redis_prefix: str, user: str
) -> None:
    server = password_redis_server
    url = f"redis://{user}:wr0ng-pw@{server.host}:{server.port}/0"
    provider = RedisLeaseProvider.from_url(url, prefix=redis_prefix, timeout_s=30)
    assert "wr0ng-pw" not in repr(provider)
    started = time.monotonic()
    with pytest.raises(leasekit.LeaseBackendUnreachable) as info:
        async with provider:
            pass
    assert time.monotonic() - started < 10  # an answer, not a wait for timeout_s
    assert isinstance(info.value.__cause__, redis.exceptions.AuthenticationError)
    for shown in (str(info.value), repr(info.value), repr(vars(info.value)), repr(provider)):
        assert "wr0ng-pw" not in shown
        assert "right-pw" not in shown
    good = f"redis://{user}:right-pw@{server.host}:{server.port}/0"
    async with RedisLeaseProvider.from_url(good, prefix=redis_prefix) as provider:
        await exercise_every_operation(provider, "k")


# -- names: binary-safe, hash-tagged, listed -----------------------------------------------

AWKWARD_KEYS = [
    "plain",
    "resource\0thread",
    "{already-tagged}",
    "}{",
    "{",
    "a}b{c}",
    "100%",
    "%7B",
    "%%25",
    "glob*?[x]\\",
    "space and\ttab\nnewline",
    "emoji 🎉 and 中文",
    "\0",
    "x" * 1024,
]


@pytest.mark.parametrize("key", AWKWARD_KEYS, ids=range(len(AWKWARD_KEYS)))
async def test_awkward_keys_and_owners_round_trip_in_one_slot(
    provider: RedisLeaseProvider, key: str
) -> None:
    owner = f"own{key[:50]} {{}}\0🎉"
    await exercise_every_operation(provider, key)
    assert (await provider.acquire_lease(key, owner, LONG_MS)).acquired
    assert await provider.get_lease_owner(key) == owner
    [record] = await provider.inspect(key)
    assert (record.key, record.owner) == (key, owner)
    # The lease and its counter share a hash tag, so a cluster keeps them in one slot.
    client = provider.client
    names = [n async for n in client.scan_iter(match=provider.prefix.encode() + b"*")]
    assert len(names) == 2
    assert len({key_slot(name) for name in names}) == 1


async def test_awkward_keys_stay_distinct(provider: RedisLeaseProvider) -> None:
    for i, key in enumerate(AWKWARD_KEYS):
        assert (await provider.acquire_lease(key, f"o{i}", LONG_MS)).acquired
    for i, key in enumerate(AWKWARD_KEYS):
        assert await provider.get_lease_owner(key) == f"o{i}"
    records = await provider.inspect()
    assert [(r.key, r.owner) for r in records] == sorted(
        (key, f"o{i}") for i, key in enumerate(AWKWARD_KEYS)
    )


async def test_inspect_filters_by_prefix_orders_and_limits(provider: RedisLeaseProvider) -> None:
    for i in range(5):
        await provider.acquire_lease(f"job/{i}", f"w{i}", LONG_MS)
    await provider.acquire_lease("job*/x", "star", LONG_MS)
    await provider.acquire_lease("other", "o", LONG_MS)
    await provider.acquire_lease("job/gone", "g", LONG_MS)
    await provider.release_lease("job/gone", "g")
    records = await provider.inspect("job/")
    assert [(r.key, r.owner) for r in records] == [(f"job/{i}", f"w{i}") for i in range(5)]
    assert all(isinstance(r, LeaseRecord) and 0 < r.remaining_ms <= LONG_MS for r in records)
    for r in records:
        assert r.token == (await provider.acquire_lease(r.key, r.owner, LONG_MS)).token
    assert [r.key for r in await provider.inspect("job*")] == ["job*/x"]  # '*' is literal
    assert [r.key for r in await provider.inspect(limit=2)] == ["job*/x", "job/0"]
    assert len(await provider.inspect()) == 7
    for bad in ("", 5):
        with pytest.raises(leasekit.InvalidLeaseArgument):
            await provider.inspect(bad)
    with pytest.raises(leasekit.InvalidLeaseArgument):
        await provider.inspect(limit=0)


async def test_other_providers_prefixes_are_invisible(redis_url: str, redis_prefix: str) -> None:
    async with (
        RedisLeaseProvider.from_url(redis_url, prefix=redis_prefix + "a:") as a,
        RedisLeaseProvider.from_url(redis_url, prefix=redis_prefix + "b:") as b,
    ):
        assert (await a.acquire_lease("k", "x", LONG_MS)).acquired
        assert (await b.acquire_lease("k", "y", LONG_MS)).acquired
        assert [r.owner for r in await a.inspect()] == ["x"]
        assert [r.owner for r in await b.inspect()] == ["y"]


async def test_foreign_data_under_the_prefix_is_a_backend_error(
    provider: RedisLeaseProvider,
) -> None:
    client = provider.client
    await client.set(provider.prefix.encode() + b"{garbled}", b"not a lease")
    await client.hset(provider.prefix.encode() + b"{hash}", "f", "v")
    with pytest.raises(leasekit.LeaseBackendError, match="unexpected data"):
        await provider.get_lease_owner("garbled")
    with pytest.raises(leasekit.LeaseBackendError) as info:
        await provider.acquire_lease("hash", "a", LONG_MS)
    assert isinstance(info.value.__cause__, redis.exceptions.ResponseError)
    assert info.value.key == "hash"
    assert await provider.inspect() == []


# -- fencing counters ------------------------------------------------------------------------


async def test_fencing_counter_outlives_the_lease_by_counter_ttl(
    redis_url: str, redis_prefix: str
) -> None:
    async with RedisLeaseProvider.from_url(
        redis_url, prefix=redis_prefix, counter_ttl_ms=600_000
    ) as provider:
        await provider.acquire_lease("k", "a", 1000)
        counter = provider.prefix.encode() + b"{k}:fence"
        assert 600_000 < await provider.client.pttl(counter) <= 601_000
        await provider.renew_lease("k", "a", 5000)
        assert 601_000 < await provider.client.pttl(counter) <= 605_000
        await provider.release_lease("k", "a")
        assert await provider.client.exists(counter)


@pytest.mark.parametrize("counter_ttl_ms", [600_000, None])
async def test_batched_renewal_keeps_the_fencing_counter_as_renew_does(
    redis_url: str, redis_prefix: str, counter_ttl_ms: int | None
) -> None:
    async with RedisLeaseProvider.from_url(
        redis_url, prefix=redis_prefix, counter_ttl_ms=counter_ttl_ms
    ) as provider:
        await provider.acquire_lease("k", "a", 1000)
        await provider.acquire_lease("j", "b", 1000)
        assert await provider.renew_leases([("k", "a", 5000), ("j", "a", 5000)]) == [True, False]
        counters = [provider.prefix.encode() + name for name in (b"{k}:fence", b"{j}:fence")]
        ttls = [await provider.client.pttl(counter) for counter in counters]
        if counter_ttl_ms is None:
            assert ttls == [-1, -1]
        else:
            assert 601_000 < ttls[0] <= 605_000  # the renewed lease's TTL + counter_ttl_ms
            assert 599_000 < ttls[1] <= 601_000  # the refused one's untouched
        assert 4000 < await provider.client.pttl(provider.prefix.encode() + b"{k}") <= 5000


async def test_fencing_counter_can_be_kept_forever(redis_url: str, redis_prefix: str) -> None:
    async with RedisLeaseProvider.from_url(
        redis_url, prefix=redis_prefix, counter_ttl_ms=None
    ) as provider:
        first = await provider.acquire_lease("k", "a", 1000)
        assert await provider.client.pttl(provider.prefix.encode() + b"{k}:fence") == -1
        await provider.release_lease("k", "a")
        again = await provider.acquire_lease("k", "b", 1000)
        assert first.token is not None
        assert again.token is not None
        assert again.token > first.token


async def test_tokens_keep_increasing_after_the_counter_expired(
    redis_url: str, redis_prefix: str
) -> None:
    async with RedisLeaseProvider.from_url(
        redis_url, prefix=redis_prefix, counter_ttl_ms=1
    ) as provider:
        counter = provider.prefix.encode() + b"{k}:fence"
        tokens = []
        for _ in range(5):
            result = await provider.acquire_lease("k", "a", 1)
            tokens.append(result.token)
            deadline = time.monotonic() + 5
            while await provider.client.exists(counter):
                assert time.monotonic() < deadline
                await anyio.sleep(0.002)
        assert tokens == sorted(set(tokens)), tokens


async def test_a_counter_ahead_of_the_server_clock_still_orders_tokens(
    redis_url: str, redis_prefix: str
) -> None:
    # The counter is ahead of TIME when the server's clock stepped back, or after a
    # failover to a replica with a slower clock: the next token must still exceed it.
    async with RedisLeaseProvider.from_url(redis_url, prefix=redis_prefix) as provider:
        counter = provider.prefix.encode() + b"{k}:fence"
        seconds, micros = await provider.client.time()
        ahead = seconds * 1_000_000 + micros + 3_600 * 1_000_000  # an hour past TIME
        await provider.client.set(counter, ahead)
        first = await provider.acquire_lease("k", "a", LONG_MS)
        assert first.acquired
        assert first.token is not None
        assert first.token > ahead, (ahead, first.token)
        assert await provider.transfer_lease("k", "a", "b", LONG_MS)
        second = await provider.acquire_lease("k", "b", LONG_MS)
        assert second.token is not None
        assert second.token > first.token


async def test_counter_memory_per_key_is_what_the_docs_say(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    """What docs/backends/redis.md states; if Redis changes, update the page."""
    async with RedisLeaseProvider.from_url(
        private_redis_server.url, prefix="leasekit:"
    ) as provider:
        key = "conversation/8f14e45fceea167a5a36dedd4bea2543"
        await provider.acquire_lease(key, "worker-1", LONG_MS)
        await provider.release_lease(key, "worker-1")
        usage = await provider.client.memory_usage(f"leasekit:{{{key}}}:fence")
        assert usage is not None
        assert 40 <= usage <= 160, usage


# -- one round trip per operation -------------------------------------------------------------


async def test_every_operation_is_one_round_trip(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    commands: list[str] = []  # what the client sent, by command name
    writes: list[int] = []  # one entry per write to the socket

    class CountingConnection(redis.asyncio.Connection):
        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            writes.append(1)
            await super().send_packed_command(command, check_health)

        async def send_command(self, *args: Any, **kwargs: Any) -> None:
            commands.append(str(args[0]))
            await super().send_command(*args, **kwargs)

    pool = redis.asyncio.ConnectionPool(
        connection_class=CountingConnection,
        host=private_redis_server.host,
        port=private_redis_server.port,
    )
    client = redis.asyncio.Redis(connection_pool=pool)
    async with RedisLeaseProvider(client, prefix=redis_prefix) as provider:
        await exercise_every_operation(provider, "warm-up")  # connects, caches the scripts
        commands.clear()
        writes.clear()
        before = command_calls(private_redis_server)
        rounds = 10
        for i in range(rounds):
            await exercise_every_operation(provider, f"k{i}")
        after = command_calls(private_redis_server)
    await client.aclose()
    await pool.aclose()
    scripted = rounds * (EXERCISE_OPERATIONS - EXERCISE_READS)
    reads = rounds * EXERCISE_READS
    assert len(writes) == scripted + reads
    assert sorted(set(commands)) == ["EVALSHA", "GET"]
    assert commands.count("EVALSHA") == scripted
    assert commands.count("GET") == reads
    # The server agrees: one EVALSHA per write, no EVAL or SCRIPT LOAD fallback.
    changed = delta(after, before)
    assert changed["evalsha"] == scripted
    assert "eval" not in changed
    assert "script|load" not in changed


async def test_metadata_and_records_take_one_script_each_and_old_leases_keep_working(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    client = redis.asyncio.Redis(host=private_redis_server.host, port=private_redis_server.port)
    name = f"{redis_prefix}{{k}}".encode()
    async with RedisLeaseProvider(client, prefix=redis_prefix) as provider:
        # A lease as a leasekit without metadata stored it: it reads as one with none.
        await client.set(name, b"17 alice", px=60_000)
        record = await provider.get_lease_record("k")
        assert record is not None
        assert (record.owner, record.token, record.metadata) == ("alice", 17, None)
        assert 0 < record.remaining_ms <= 60_000
        assert await provider.acquire_lease("k", "bob", 60_000) == LeaseResult(False, "alice")
        # The holder's re-acquire adds metadata in place: same token, same key.
        again = await provider.acquire_lease("k", "alice", 60_000, metadata=b"a:1")
        assert again == LeaseResult(True, "alice", 17, b"a:1")
        assert await client.get(name) == b"17:3 alicea:1"
        before = command_calls(private_redis_server)
        denied = await provider.acquire_lease("k", "bob", 60_000)
        record = await provider.get_lease_record("k")
        changed = delta(command_calls(private_redis_server), before)
        assert denied == LeaseResult(False, "alice", None, b"a:1")
        assert record == LeaseRecord("k", "alice", 17, record.remaining_ms, b"a:1")
        # One script each: the holder's metadata comes with the denial, the record's
        # remaining time with its read (the server counts the GETs and the PTTL the
        # scripts ran too).
        assert changed["evalsha"] == 2, changed
        assert set(changed) <= {"evalsha", "get", "pttl"}, changed
        await provider.release_lease("k", "alice")
        assert await client.get(name) is None
        assert await provider.get_lease_record("k") is None
    await client.aclose()


# -- auto-pipelining: operations started together are written together ------------------------


def counting_client(server: RedisServer, writes: list[int]) -> redis.asyncio.Redis:
    """A caller's client that records, per write to a socket, how many lease commands it held.

    Writes without ``EVALSHA``, ``EVAL`` or ``GET`` (a connection's own handshake) are not
    recorded.
    """

    class CountingConnection(redis.asyncio.Connection):
        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            data = command if isinstance(command, bytes) else b"".join(command)
            sent = sum(data.count(name) for name in (b"\r\nEVALSHA\r\n", b"\r\nEVAL\r\n"))
            sent += data.count(b"\r\nGET\r\n")
            if sent:
                writes.append(sent)
            await super().send_packed_command(command, check_health)

    pool = redis.asyncio.ConnectionPool(
        connection_class=CountingConnection, host=server.host, port=server.port
    )
    return redis.asyncio.Redis.from_pool(pool)  # closing the client closes its pool


def pipelines_written(provider: RedisLeaseProvider) -> int:
    """Pipelines (two commands or more) the provider has written so far."""
    return provider._pipeline.batches


async def test_operations_started_together_go_out_in_one_pipeline(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    writes: list[int] = []
    client = counting_client(private_redis_server, writes)
    async with RedisLeaseProvider(client, prefix=redis_prefix) as provider:
        assert provider.autopipeline
        for i in range(0, 64, 4):  # a quarter held by someone else
            await provider.acquire_lease(f"k{i}", f"holder{i}", LONG_MS)
        writes.clear()
        before = command_calls(private_redis_server)
        pipelines = pipelines_written(provider)
        results = await asyncio.gather(
            *(provider.acquire_lease(f"k{i}", f"o{i}", LONG_MS) for i in range(64))
        )
        changed = delta(command_calls(private_redis_server), before)
        # The first went out at once (nothing else was in flight), the other 63 together.
        assert writes == [1, 63]
        assert pipelines_written(provider) == pipelines + 1
        assert changed["evalsha"] == 64
        for i, result in enumerate(results):
            if i % 4 == 0:
                assert result == leasekit.LeaseResult(False, f"holder{i}", None)
            else:
                assert result.acquired
                assert result.owner == f"o{i}"
        tokens = [r.token for r in results if r.acquired]
        assert len(set(tokens)) == len(tokens)
        # The server agrees: each key is held by the caller that was told so.
        owners = await asyncio.gather(*(provider.get_lease_owner(f"k{i}") for i in range(64)))
        assert owners == [f"holder{i}" if i % 4 == 0 else f"o{i}" for i in range(64)]
    await client.aclose()


async def test_each_caller_in_a_pipeline_gets_its_own_reply(
    provider: RedisLeaseProvider,
) -> None:
    n = 16
    await asyncio.gather(
        *(
            provider.acquire_lease(f"{kind}{i}", f"x{i}", LONG_MS)
            for kind in ("held", "moved", "gone")
            for i in range(n)
        )
    )
    pipelines = pipelines_written(provider)
    expected: list[Any] = []
    calls: list[Any] = []
    for i in range(n):
        calls += [
            provider.acquire_lease(f"free{i}", f"o{i}", LONG_MS),
            provider.acquire_lease(f"held{i}", f"o{i}", LONG_MS),
            provider.get_lease_owner(f"held{i}"),
            provider.renew_lease(f"held{i}", f"x{i}", LONG_MS),
            provider.renew_lease(f"held{i}", f"o{i}", LONG_MS),
            provider.transfer_lease(f"moved{i}", f"x{i}", f"y{i}", LONG_MS),
            provider.transfer_lease(f"held{i}", f"o{i}", f"y{i}", LONG_MS),
            provider.release_lease(f"gone{i}", f"x{i}"),
            provider.release_lease(f"held{i}", f"o{i}"),
        ]
        expected += [
            (True, f"o{i}"),
            leasekit.LeaseResult(False, f"x{i}", None),
            f"x{i}",
            True,
            False,
            True,
            False,
            None,
            None,
        ]
    results = await asyncio.gather(*calls)
    assert pipelines_written(provider) > pipelines
    for result, want in zip(results, expected, strict=True):
        if isinstance(want, tuple):
            assert isinstance(result, leasekit.LeaseResult)
            assert (result.acquired, result.owner) == want
        else:
            assert result == want
    owners = await asyncio.gather(
        *(
            provider.get_lease_owner(f"{kind}{i}")
            for kind in ("held", "moved", "gone")
            for i in range(n)
        )
    )
    assert owners == [f"x{i}" for i in range(n)] + [f"y{i}" for i in range(n)] + [None] * n


async def test_a_batch_waiting_for_a_connection_takes_in_what_is_started_meanwhile(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    url = f"{private_redis_server.url}?max_connections=1"
    async with RedisLeaseProvider.from_url(url, prefix=redis_prefix) as provider:
        slots = provider._pipeline.slots
        assert slots is not None
        await slots.acquire()  # the only connection is busy, as if with another command
        try:
            first = [
                asyncio.ensure_future(provider.acquire_lease(f"a{i}", "o", LONG_MS))
                for i in range(10)
            ]
            for _ in range(3):
                await asyncio.sleep(0)  # the batch is open, waiting for the connection
            later = [
                asyncio.ensure_future(provider.acquire_lease(f"b{i}", "o", LONG_MS))
                for i in range(10)
            ]
            await asyncio.sleep(0)
            pipelines = pipelines_written(provider)
        finally:
            slots.release()
        results = await asyncio.gather(*first, *later)
        assert all(r.acquired for r in results)
        assert pipelines_written(provider) == pipelines + 1  # all 20 in one pipeline


async def test_a_failing_script_in_a_pipeline_fails_only_its_caller(
    provider: RedisLeaseProvider,
) -> None:
    await provider.client.hset(provider.prefix.encode() + b"{hash}", "f", "v")
    keys = [f"k{i}" for i in range(10)]
    keys[5] = "hash"  # not a lease: the script's GET fails on it
    pipelines = pipelines_written(provider)
    results = await asyncio.gather(
        *(provider.acquire_lease(key, "a", LONG_MS) for key in keys), return_exceptions=True
    )
    assert pipelines_written(provider) == pipelines + 1
    for key, result in zip(keys, results, strict=True):
        if key == "hash":
            assert isinstance(result, leasekit.LeaseBackendError)
            assert result.key == "hash"
            assert isinstance(result.__cause__, redis.exceptions.ResponseError)
        else:
            assert isinstance(result, leasekit.LeaseResult)
            assert result.acquired


async def test_a_cancelled_caller_leaves_the_others_in_its_pipeline_alone(
    provider: RedisLeaseProvider,
) -> None:
    tasks = [
        asyncio.ensure_future(provider.acquire_lease(f"k{i}", "a", LONG_MS)) for i in range(10)
    ]
    await asyncio.sleep(0)  # every call started: the first sent, the others in one batch
    tasks[5].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[5], asyncio.CancelledError)
    assert all(
        isinstance(r, leasekit.LeaseResult) and r.acquired for r in results[:5] + results[6:]
    )
    # The batch had not been written yet: the cancelled caller's write was never sent.
    assert await provider.get_lease_owner("k5") is None


async def test_a_flushed_script_cache_is_invisible_to_a_pipeline(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    async with RedisLeaseProvider.from_url(private_redis_server.url, prefix=redis_prefix) as p:
        await exercise_every_operation(p, "before")
        private_redis_server.command("SCRIPT", "FLUSH")
        before = command_calls(private_redis_server)
        pipelines = pipelines_written(p)
        # A GET goes out first, alone; the 20 scripts follow together, all unknown.
        owner, *results = await asyncio.gather(
            p.get_lease_owner("k0"),
            *(p.acquire_lease(f"k{i}", f"o{i}", LONG_MS) for i in range(20)),
        )
        changed = delta(command_calls(private_redis_server), before)
        assert owner is None
        assert [(r.acquired, r.owner) for r in results] == [(True, f"o{i}") for i in range(20)]
        # One pipeline of EVALSHA, answered NOSCRIPT, then one of EVAL.
        assert pipelines_written(p) == pipelines + 2
        assert changed["eval"] == 20
        await exercise_every_operation(p, "after")


@contextlib.asynccontextmanager
async def provider_of_kind(
    client_kind: str, server: RedisServer, prefix: str, timeout_s: float
) -> AsyncIterator[RedisLeaseProvider]:
    """An open provider built from the URL (``built``) or on a caller's client (``callers``)."""
    if client_kind == "built":
        async with RedisLeaseProvider.from_url(
            server.url, prefix=prefix, timeout_s=timeout_s
        ) as provider:
            yield provider
        return
    # redis-py's defaults: no socket timeout, so only the provider's bound helps.
    client = redis.asyncio.Redis(host=server.host, port=server.port)
    try:
        async with RedisLeaseProvider(client, prefix=prefix, timeout_s=timeout_s) as provider:
            yield provider
    finally:
        await client.aclose()


@pytest.mark.parametrize("client_kind", ["built", "callers"])
async def test_a_paused_server_gives_every_caller_in_a_pipeline_a_timeout(
    private_redis_server: RedisServer, redis_prefix: str, client_kind: str
) -> None:
    timeout_s = 0.5
    async with provider_of_kind(
        client_kind, private_redis_server, redis_prefix, timeout_s
    ) as provider:
        await asyncio.gather(*(exercise_every_operation(provider, f"warm{i}") for i in range(4)))
        pipelines = pipelines_written(provider)
        private_redis_server.pause()
        try:
            results = await asyncio.gather(
                *(provider.acquire_lease(f"k{i}", "a", LONG_MS) for i in range(20)),
                return_exceptions=True,
            )
        finally:
            private_redis_server.resume()
        assert pipelines_written(provider) == pipelines + 1
        for i, result in enumerate(results):
            assert isinstance(result, leasekit.LeaseBackendTimeout), result
            assert result.key == f"k{i}"
        await exercise_every_operation(provider, "after-pause")


async def test_a_dead_server_fails_every_caller_in_a_pipeline_as_unreachable(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    async with RedisLeaseProvider.from_url(
        private_redis_server.url, prefix=redis_prefix, timeout_s=2
    ) as provider:
        await exercise_every_operation(provider, "k")
        private_redis_server.kill()
        pipelines = pipelines_written(provider)
        results = await asyncio.gather(
            *(provider.acquire_lease(f"k{i}", "a", LONG_MS) for i in range(10)),
            return_exceptions=True,
        )
        assert pipelines_written(provider) == pipelines + 1
        for i, result in enumerate(results):
            assert isinstance(result, leasekit.LeaseBackendUnreachable), result
            assert result.key == f"k{i}"
            assert isinstance(result.__cause__, redis.exceptions.ConnectionError)
        private_redis_server.restart()
        await exercise_every_operation(provider, "k")


async def test_aclose_with_a_pipeline_in_flight_settles_every_caller(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    before = client_connections(private_redis_server)
    provider = RedisLeaseProvider.from_url(
        private_redis_server.url, prefix=redis_prefix, timeout_s=0.5
    )
    await provider.__aenter__()
    private_redis_server.pause()
    try:
        calls = [
            asyncio.ensure_future(provider.acquire_lease(f"k{i}", "a", LONG_MS)) for i in range(20)
        ]
        for _ in range(3):
            await asyncio.sleep(0)  # the first call sent, then the batch of the others
        await provider.aclose()
        later = await asyncio.gather(
            provider.acquire_lease("late", "a", LONG_MS), return_exceptions=True
        )
    finally:
        private_redis_server.resume()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert pipelines_written(provider) == 1
    for result in results:
        # Each finished with its own timeout, never a CancelledError.
        assert isinstance(result, leasekit.LeaseBackendTimeout), result
    assert isinstance(later[0], leasekit.LeaseProviderClosed)
    await eventually(
        lambda: client_connections(private_redis_server) == before, "the connections to close"
    )


async def test_autopipeline_false_sends_every_operation_alone(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    writes: list[int] = []
    client = counting_client(private_redis_server, writes)
    async with RedisLeaseProvider(client, prefix=redis_prefix, autopipeline=False) as provider:
        assert not provider.autopipeline
        await exercise_every_operation(provider, "warm-up")  # caches the scripts
        writes.clear()
        results = await asyncio.gather(
            *(provider.acquire_lease(f"k{i}", "a", LONG_MS) for i in range(20))
        )
        assert all(r.acquired for r in results)
        assert writes == [1] * 20
        assert pipelines_written(provider) == 0
    await client.aclose()


async def test_autopipeline_is_an_option_like_the_others() -> None:
    provider = leasekit.connect("redis://127.0.0.1:1/0")
    assert isinstance(provider, RedisLeaseProvider)
    assert provider.autopipeline
    await provider.aclose()
    provider = leasekit.connect("redis://127.0.0.1:1/0?autopipeline=off")
    assert isinstance(provider, RedisLeaseProvider)
    assert not provider.autopipeline
    await provider.aclose()
    provider = leasekit.connect("redis://127.0.0.1:1/0?autopipeline=false", autopipeline=True)
    assert isinstance(provider, RedisLeaseProvider)
    assert provider.autopipeline  # keywords win
    await provider.aclose()


async def test_a_pipeline_on_a_cluster_goes_to_each_keys_node(
    redis_cluster: RedisClusterServer, redis_prefix: str
) -> None:
    url = f"{redis_cluster.url}?cluster=true"
    async with RedisLeaseProvider.from_url(url, prefix=redis_prefix) as provider:
        pipelines = pipelines_written(provider)
        results = await asyncio.gather(
            *(provider.acquire_lease(f"k{i}", f"o{i}", LONG_MS) for i in range(64))
        )
        assert pipelines_written(provider) > pipelines
        assert [(r.acquired, r.owner) for r in results] == [(True, f"o{i}") for i in range(64)]
        owners = await asyncio.gather(*(provider.get_lease_owner(f"k{i}") for i in range(64)))
        assert owners == [f"o{i}" for i in range(64)]
    per_node = [len(names_on(node, redis_prefix + "*")) for node in redis_cluster.nodes]
    assert sum(per_node) == 2 * 64  # a lease and a counter per key
    assert all(count > 0 for count in per_node), per_node


# -- faults -------------------------------------------------------------------------------------


async def test_script_cache_flush_between_calls_is_invisible(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    async with RedisLeaseProvider.from_url(private_redis_server.url, prefix=redis_prefix) as p:
        await exercise_every_operation(p, "before")
        before = command_calls(private_redis_server)
        private_redis_server.command("SCRIPT", "FLUSH")
        await exercise_every_operation(p, "after")
        private_redis_server.command("SCRIPT", "FLUSH")
        await exercise_every_operation(p, "again")
        changed = delta(command_calls(private_redis_server), before)
    # One NOSCRIPT and one EVAL per script per flush; everything else by EVALSHA.
    assert changed["eval"] == 2 * 4, changed


# How much later than its timeout_s a call against a paused server may fail: the timer
# runs late on a loaded machine; a call with no bound at all would never fail. The same
# allowance as the PostgreSQL and MySQL files.
SLACK_S = 5.0


@pytest.mark.parametrize("client_kind", ["built", "callers"])
async def test_a_paused_server_is_a_timeout_within_timeout_s_then_recovers(
    private_redis_server: RedisServer, redis_prefix: str, client_kind: str
) -> None:
    timeout_s = 0.5
    loop = asyncio.get_running_loop()
    async with provider_of_kind(
        client_kind, private_redis_server, redis_prefix, timeout_s
    ) as provider:
        assert (await provider.acquire_lease("k", "a", LONG_MS)).acquired
        private_redis_server.pause()
        try:
            for call in (
                lambda: provider.acquire_lease("k", "a", LONG_MS),
                lambda: provider.get_lease_owner("k"),
                lambda: provider.renew_lease("k", "a", LONG_MS),
                lambda: provider.release_lease("k", "z"),
                lambda: provider.transfer_lease("k", "a", "b", LONG_MS),
                provider.inspect,
            ):
                started = loop.time()
                with pytest.raises(leasekit.LeaseBackendTimeout) as info:
                    await call()
                elapsed = loop.time() - started
                assert elapsed < timeout_s + SLACK_S, elapsed
                assert info.value.backend == "redis"
        finally:
            private_redis_server.resume()
        # The last write may or may not have run once the server woke; either is fine.
        assert await provider.get_lease_owner("k") in ("a", "b")
        await exercise_every_operation(provider, "after-pause")


async def test_async_with_on_a_paused_server_is_a_timeout_within_timeout_s(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    timeout_s = 0.5
    loop = asyncio.get_running_loop()
    private_redis_server.pause()  # the kernel still accepts connections; nothing answers
    try:
        provider = RedisLeaseProvider.from_url(
            private_redis_server.url, prefix=redis_prefix, timeout_s=timeout_s
        )
        started = loop.time()
        with pytest.raises(leasekit.LeaseBackendTimeout):
            async with provider:
                pass
        assert loop.time() - started < timeout_s + SLACK_S
        assert provider.closed
    finally:
        private_redis_server.resume()


async def test_waiting_for_a_connection_that_never_frees_is_a_timeout(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    timeout_s = 0.5
    loop = asyncio.get_running_loop()
    async with RedisLeaseProvider.from_url(
        f"{private_redis_server.url}?max_connections=1", prefix=redis_prefix, timeout_s=timeout_s
    ) as provider:
        private_redis_server.pause()
        try:
            started = loop.time()
            # The first holds the only connection; the others wait for it in the pool.
            results = await asyncio.gather(
                *(provider.get_lease_owner(f"k{i}") for i in range(3)), return_exceptions=True
            )
            elapsed = loop.time() - started
        finally:
            private_redis_server.resume()
        assert all(isinstance(r, leasekit.LeaseBackendTimeout) for r in results), results
        assert elapsed < timeout_s + SLACK_S
        await exercise_every_operation(provider, "after-pause")


async def test_a_killed_server_is_a_prompt_backend_error_and_a_restart_recovers(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    async with RedisLeaseProvider.from_url(
        private_redis_server.url, prefix=redis_prefix, timeout_s=2
    ) as provider:
        await exercise_every_operation(provider, "k")
        private_redis_server.kill()
        started = time.monotonic()
        with pytest.raises(leasekit.LeaseBackendUnreachable) as info:
            await provider.acquire_lease("k", "a", LONG_MS)
        assert time.monotonic() - started < 2 + 5
        assert isinstance(info.value.__cause__, redis.exceptions.ConnectionError)
        private_redis_server.restart()
        await exercise_every_operation(provider, "k")


@pytest.mark.parametrize("client_kind", ["built", "callers"])
async def test_a_restarted_server_loses_leases_but_tokens_keep_increasing(
    private_redis_server: RedisServer, redis_prefix: str, client_kind: str
) -> None:
    client = None
    if client_kind == "built":
        provider = RedisLeaseProvider.from_url(private_redis_server.url, prefix=redis_prefix)
    else:
        client = redis.asyncio.Redis(host=private_redis_server.host, port=private_redis_server.port)
        provider = RedisLeaseProvider(client, prefix=redis_prefix)
    async with provider:
        before = await provider.acquire_lease("k", "a", LONG_MS)
        assert before.token is not None
        private_redis_server.restart()  # no persistence: every key is gone
        # The pooled connection died with the server; the client reconnects on its own.
        assert await provider.get_lease_owner("k") is None
        after = await provider.acquire_lease("k", "b", LONG_MS)
        assert after.token is not None
        assert after.token > before.token
        await exercise_every_operation(provider, "after-restart")
    if client is not None:
        await client.aclose()


class TestRedisContractAfterRestart(LeaseProviderContract):
    """The suite on a provider whose server restarted (all data lost) after it connected."""

    # These race fresh providers in spawned processes, which never saw the restart; they
    # already run in TestRedisContract, and would only double this class's time here.
    test_racing_processes_get_exactly_one_winner_per_round = None
    test_churning_processes_never_overlap_as_holders = None

    @pytest.fixture(scope="class")
    @classmethod
    def restarting_server(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
        binary = RedisServer.find()
        if binary is None:
            missing_server("redis-server is not installed", RedisServer.install_hint)
        with RedisServer(binary, tmp_path_factory.mktemp("redis-restart")) as server:
            yield server

    @pytest.fixture
    async def provider(
        self, restarting_server: RedisServer, redis_prefix: str
    ) -> AsyncIterator[Any]:
        async with RedisLeaseProvider.from_url(restarting_server.url, prefix=redis_prefix) as p:
            assert (await p.acquire_lease("warm", "a", LONG_MS)).acquired
            restarting_server.restart()
            yield p

    @pytest.fixture
    def provider_factory(self, restarting_server: RedisServer, redis_prefix: str) -> Any:
        return functools.partial(leasekit.connect, restarting_server.url, prefix=redis_prefix)

    @pytest.fixture
    def break_notifications(self) -> Any:
        async def cut(provider: RedisLeaseProvider) -> None:
            await provider.break_notifications()

        return cut


@pytest.mark.parametrize("key", AWKWARD_KEYS, ids=range(len(AWKWARD_KEYS)))
async def test_slots_and_the_line_share_the_leases_hash_slot_and_expire(
    provider: RedisLeaseProvider, key: str
) -> None:
    owner = f"own{key[:50]} {{}}\0🎉"
    granted = await provider.acquire_slot(key, owner, LONG_MS, limit=2)
    assert (granted.acquired, granted.owner) == (True, owner)
    [record] = await provider.get_slot_holders(key)
    assert (record.owner, record.token) == (owner, granted.token)
    assert (await provider.acquire_lease_in_turn(key, "a", LONG_MS, place_ttl_ms=LONG_MS)).acquired
    behind = await provider.acquire_lease_in_turn(key, "b", LONG_MS, place_ttl_ms=LONG_MS)
    assert behind == leasekit.LeaseResult(False, "a", None)
    client = provider.client
    names = [n async for n in client.scan_iter(match=provider.prefix.encode() + b"*")]
    # The lease, its counter, the slots, their hash, the line and its places.
    assert len(names) == 6
    assert len({key_slot(name) for name in names}) == 1
    for name in names:
        assert await client.pttl(name) > 0, name
    # Counting keys and the line are not leases: inspect lists the lease alone.
    assert [(r.key, r.owner) for r in await provider.inspect(key)] == [(key, "a")]
