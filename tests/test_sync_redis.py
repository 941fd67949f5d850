"""leasekit.sync on Redis: the native blocking provider, not a thread hop.

That the native path is taken (no thread started), that it is exclusive under 16
threads on one key, that a stalled server is a typed timeout, that driver errors map
as on the async side, and that sync and async providers share one store's leases.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from servers import RedisServer, require_module, resp_command, with_options

import leasekit
import leasekit.plugins
import leasekit.sync
from leasekit import (
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
    LeaseProviderClosed,
)
from leasekit.backend import SupportsSyncProvider, SyncBackendProvider, sync_factory
from leasekit.testing import FakeClock

redis = require_module("redis", extra="redis")
leasekit_redis = require_module("leasekit_redis", extra="redis")

LONG_TTL_MS = 60_000
THREADS = 16


@pytest.fixture
def url(redis_url: str, redis_prefix: str) -> str:
    return with_options(redis_url, prefix=redis_prefix)


@pytest.fixture
def leases(url: str) -> Iterator[leasekit.sync.SyncLeaseProvider]:
    with leasekit.sync.connect(url) as facade:
        yield facade


def leasekit_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("leasekit")}


# -- the native path ------------------------------------------------------------------------


def test_redis_offers_a_native_provider_through_the_toolkit_interface() -> None:
    backend = leasekit_redis.RedisLeaseProvider
    assert sync_factory(backend) == backend.sync_from_url
    assert sync_factory(leasekit.MemoryLeaseProvider) is None  # memory:// keeps the loop
    _typed: type[SupportsSyncProvider] = backend
    assert issubclass(leasekit_redis.RedisSyncLeaseProvider, SyncBackendProvider)


def test_the_five_operations_start_no_thread(url: str) -> None:
    before = leasekit_threads()
    with leasekit.sync.connect(url) as leases:
        assert leases.native
        assert leases.acquire_lease("k", "a", LONG_TTL_MS).acquired
        assert leases.get_lease_owner("k") == "a"
        assert leases.renew_lease("k", "a", LONG_TTL_MS)
        assert leases.transfer_lease("k", "a", "b", LONG_TTL_MS)
        leases.release_lease("k", "b")
        assert leases.get_lease_owner("k") is None
        assert leasekit_threads() == before
        assert "RedisSyncLeaseProvider" in repr(leases)
    with leasekit.sync.connect(url, native=False) as hopping:
        assert not hopping.native
        assert hopping.get_lease_owner("k") is None
        assert len(leasekit_threads() - before) == 1  # the loop path's thread


def test_an_event_plugin_keeps_the_loop_path_so_events_fire(url: str) -> None:
    seen: list[str] = []

    class Recorder:
        @leasekit.hookimpl
        def leasekit_acquired(
            self, key: str, owner: str, backend: str, token: int | None, latency_s: float
        ) -> None:
            seen.append(key)

    recorder = Recorder()
    leasekit.plugins.register(recorder)
    try:
        with leasekit.sync.connect(url) as leases:
            assert not leases.native
            leases.acquire_lease("evented", "a", LONG_TTL_MS)
    finally:
        leasekit.plugins.unregister(recorder)
    assert seen == ["evented"]


def test_sixteen_threads_on_one_key_never_make_two_owners(
    leases: leasekit.sync.SyncLeaseProvider,
) -> None:
    # One winner per round, every loser told the winner's name...
    for round_no in range(5):
        key = f"race-{round_no}"
        start = threading.Barrier(THREADS)

        def contend(index: int, key: str = key, start: threading.Barrier = start) -> Any:
            start.wait()
            return leases.acquire_lease(key, f"worker-{index}", LONG_TTL_MS)

        with ThreadPoolExecutor(THREADS) as pool:
            results = list(pool.map(contend, range(THREADS)))
        winners = [r.owner for r in results if r.acquired]
        assert len(winners) == 1, results
        assert {r.owner for r in results} == set(winners)
        assert leases.get_lease_owner(key) == winners[0]
    # ...and threads cycling acquire/release on one key are never inside together.
    inside = most = acquired = 0
    guard = threading.Lock()

    def cycle(index: int) -> None:
        nonlocal inside, most, acquired
        owner = f"cycler-{index}"
        for _ in range(30):
            if not leases.acquire_lease("cycled", owner, LONG_TTL_MS).acquired:
                continue
            with guard:
                inside += 1
                most = max(most, inside)
                acquired += 1
            with guard:
                inside -= 1
            leases.release_lease("cycled", owner)

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(cycle, range(THREADS)))
    assert most == 1
    assert acquired >= 1
    assert leases.get_lease_owner("cycled") is None


def test_fencing_tokens_increase_across_threads(leases: leasekit.sync.SyncLeaseProvider) -> None:
    tokens: list[int] = []
    guard = threading.Lock()

    def take(index: int) -> None:
        owner = f"t{index}"
        for _ in range(10):
            result = leases.acquire_lease("fenced", owner, LONG_TTL_MS)
            if result.acquired:
                assert result.token is not None
                with guard:  # recorded while held: grants are in token order
                    tokens.append(result.token)
                leases.release_lease("fenced", owner)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(take, range(8)))
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)


# -- one store, two drivers ------------------------------------------------------------------


def test_sync_and_async_providers_share_leases_and_wake_waiters(url: str) -> None:
    async def scenario(leases: leasekit.sync.SyncLeaseProvider) -> None:
        async with leasekit.connect(url) as provider:
            assert await provider.get_lease_owner("shared") == "sync-owner"
            assert not (await provider.acquire_lease("shared", "async", LONG_TTL_MS)).acquired
            # The blocking release publishes on the lease's channel. The async waiter
            # paces its polls and its periodic re-looks on a clock that never moves, so
            # only that notification can wake it (30 s only bounds a failing run).
            waiting = asyncio.ensure_future(
                leasekit.wait_for(
                    provider, "shared", "async", LONG_TTL_MS, timeout_s=None, clock=FakeClock()
                )
            )
            await asyncio.sleep(0.05)
            await asyncio.to_thread(leases.release_lease, "shared", "sync-owner")
            result = await asyncio.wait_for(waiting, 30)
            assert (result.acquired, result.owner) == (True, "async")

    with leasekit.sync.connect(url) as leases:
        assert leases.acquire_lease("shared", "sync-owner", LONG_TTL_MS).acquired
        asyncio.run(scenario(leases))
        assert leases.get_lease_owner("shared") == "async"


def test_a_flushed_script_cache_is_reloaded(
    leases: leasekit.sync.SyncLeaseProvider, redis_url: str
) -> None:
    with redis.Redis.from_url(redis_url) as client:
        client.script_flush()
    assert leases.acquire_lease("after-flush", "a", LONG_TTL_MS).acquired
    leases.release_lease("after-flush", "a")
    assert leases.get_lease_owner("after-flush") is None


def test_reloading_a_flushed_script_keeps_the_connection(
    leases: leasekit.sync.SyncLeaseProvider, redis_url: str
) -> None:
    # NOSCRIPT is a whole reply: the EVAL that follows goes on the same connection. (It
    # used to disconnect and reconnect, and the new socket was left for the GC to close.)
    assert leases.acquire_lease("warm", "a", LONG_TTL_MS).acquired  # the connection exists
    with redis.Redis.from_url(redis_url) as client:
        client.script_flush()
        before = client.info("stats")["total_connections_received"]
        assert leases.renew_lease("warm", "a", LONG_TTL_MS)  # EVALSHA: NOSCRIPT, then EVAL
        leases.release_lease("warm", "a")
        assert client.info("stats")["total_connections_received"] == before


def test_a_callers_own_client_is_used_and_left_open(redis_url: str, redis_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    provider = leasekit_redis.RedisSyncLeaseProvider(client, prefix=redis_prefix)
    with provider:
        assert provider.acquire_lease("mine", "a", LONG_TTL_MS).acquired
    assert provider.closed
    with pytest.raises(LeaseProviderClosed):
        provider.get_lease_owner("mine")
    assert client.ping()  # not closed by the provider
    client.close()


# -- faults and errors ----------------------------------------------------------------------


def test_a_paused_server_is_a_typed_timeout_then_recovers(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    url = with_options(private_redis_server.url, prefix=redis_prefix, timeout_s=0.5)
    with leasekit.sync.connect(url) as leases:
        assert leases.native
        assert leases.acquire_lease("k", "a", LONG_TTL_MS).acquired
        private_redis_server.pause()
        try:
            for call in (
                lambda: leases.acquire_lease("k", "a", LONG_TTL_MS),
                lambda: leases.get_lease_owner("k"),
                lambda: leases.renew_lease("k", "a", LONG_TTL_MS),
                lambda: leases.release_lease("k", "z"),
                lambda: leases.transfer_lease("k", "a", "b", LONG_TTL_MS),
            ):
                with pytest.raises(LeaseBackendTimeout) as caught:
                    call()
                assert caught.value.backend == "redis"
                assert isinstance(caught.value.__cause__, redis.exceptions.TimeoutError)
        finally:
            private_redis_server.resume()
        # The last write may or may not have run once the server woke; either is fine.
        assert leases.get_lease_owner("k") in ("a", "b")


def test_waiting_for_a_busy_connection_is_bounded_by_timeout_s(
    private_redis_server: RedisServer, redis_prefix: str
) -> None:
    url = with_options(
        private_redis_server.url, prefix=redis_prefix, timeout_s=0.5, max_connections=1
    )
    with leasekit.sync.connect(url) as leases:
        private_redis_server.pause()
        errors: list[BaseException] = []
        in_flight = threading.Thread(
            target=lambda: _record(errors, lambda: leases.get_lease_owner("k"))
        )
        try:
            in_flight.start()
            # Whichever thread gets the one connection times out on its socket; the
            # other on its wait for the connection. Both are typed timeouts.
            _record(errors, lambda: leases.get_lease_owner("k"))
            in_flight.join()
        finally:
            private_redis_server.resume()
        assert len(errors) == 2
        assert all(isinstance(e, LeaseBackendTimeout) for e in errors), errors
        assert leases.get_lease_owner("k") is None


def _record(errors: list[BaseException], call: Any) -> None:
    try:
        call()
    except LeaseBackendError as exc:
        errors.append(exc)


def test_a_refused_connection_is_unreachable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(LeaseBackendUnreachable) as caught:
        leasekit.sync.connect(f"redis://127.0.0.1:{port}/0").open()
    assert caught.value.backend == "redis"
    assert isinstance(caught.value.__cause__, redis.exceptions.ConnectionError)


def test_bad_input_and_bad_options_raise_before_any_io(url: str) -> None:
    with pytest.raises(InvalidLeaseArgument, match="prefix"):
        leasekit.sync.connect(url, prefix="a{b")
    with pytest.raises(InvalidLeaseArgument, match="bogus"):
        leasekit.sync.connect(with_options(url, bogus=1))
    with leasekit.sync.connect(url) as leases:
        for call, argument in (
            (lambda: leases.acquire_lease("", "a", 1000), "key"),
            (lambda: leases.acquire_lease("k", "a", 0), "ttl_ms"),
            (lambda: leases.renew_lease("k", "", 1000), "owner"),
            (lambda: leases.transfer_lease("k", "a", "", 1000), "to_owner"),
            (lambda: leases.release_lease("k", 3), "owner"),  # type: ignore[arg-type]
        ):
            with pytest.raises(InvalidLeaseArgument) as caught:
                call()
            assert caught.value.argument == argument


def test_garbled_data_under_the_prefix_is_a_backend_error(
    leases: leasekit.sync.SyncLeaseProvider, redis_url: str, redis_prefix: str
) -> None:
    with redis.Redis.from_url(redis_url) as client:
        client.set(f"{redis_prefix}{{odd}}", b"not a lease")
    with pytest.raises(LeaseBackendError, match="unexpected data") as caught:
        leases.get_lease_owner("odd")
    assert caught.value.key == "odd"


def test_required_capabilities_are_checked_on_the_native_path(url: str) -> None:
    with leasekit.sync.connect(url, require=["fencing", "atomic_transfer"]) as leases:
        assert leases.native
        assert leases.capabilities.fencing


def test_closing_disconnects_the_connections_of_the_client_it_built(
    private_redis_server: RedisServer,
) -> None:
    # from_url's client owns its pool: closing the provider must close its sockets, not
    # leave them open for the garbage collector (a ResourceWarning at exit).
    server = private_redis_server

    def connected() -> int:  # the clients the server has, this INFO's own included
        reply = resp_command(server.host, server.port, "INFO", "clients")
        assert isinstance(reply, bytes)
        fields = dict(line.split(":", 1) for line in reply.decode().splitlines() if ":" in line)
        return int(fields["connected_clients"])

    alone = connected()
    with leasekit.sync.connect(server.url) as leases:
        assert leases.native
        assert leases.acquire_lease("closing", "a", 30_000).acquired
        leases.release_lease("closing", "a")
        assert connected() > alone
    deadline = time.monotonic() + 10.0
    while connected() > alone:
        assert time.monotonic() < deadline, "the provider's connection is still open"
        time.sleep(0.01)
