"""The Redis release listener: one pub/sub connection feeding the toolkit's hub.

Driven here with raw PUBLISH commands on a real redis-server, so the listener's own
behaviour (confirmed subscriptions, fan-out, unsubscribe, a dropped connection) is
checked apart from the scripts; the provider-level checks live in the conformance
suite's NotificationChecks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from anyio import fail_after as anyio_fail_after
from servers import RedisClusterServer, RedisServer, RespError, missing_extra

import leasekit
import leasekit.sync

try:
    import redis.asyncio
except ImportError:  # pragma: no cover
    missing_extra("redis", "tests/test_redis_notify.py")

from leasekit_redis import RedisLeaseProvider
from leasekit_redis._notify import RedisReleaseListener, channel_name

pytestmark = pytest.mark.anyio
BOUND_S = 20.0


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    connection = redis.asyncio.Redis.from_url(redis_url)
    yield connection
    await connection.aclose()


async def test_a_publish_after_watch_returns_wakes_the_waiter(client: redis.asyncio.Redis) -> None:
    listener = RedisReleaseListener(client, sharded=False, timeout_s=5)
    try:
        watch = await listener.watch("k", b"lease:{k}")
        assert await client.publish(channel_name(b"lease:{k}"), b"") == 1  # subscribed already
        assert await watch.wait(BOUND_S)
        other = await listener.watch("k", b"lease:{k}")  # a second waiter shares the channel
        await client.publish(channel_name(b"lease:{k}"), b"")
        assert await watch.wait(BOUND_S)
        assert await other.wait(BOUND_S)
        watch.close()
        other.close()
        for _ in range(100):  # the unsubscribe runs in the background
            if (await client.pubsub_numsub(channel_name(b"lease:{k}")))[0][1] == 0:
                break
            await asyncio.sleep(0.01)
        assert (await client.pubsub_numsub(channel_name(b"lease:{k}")))[0][1] == 0
    finally:
        await listener.aclose()


async def test_other_keys_do_not_wake_a_waiter(client: redis.asyncio.Redis) -> None:
    listener = RedisReleaseListener(client, sharded=False, timeout_s=5)
    try:
        watch = await listener.watch("a", b"lease:{a}")
        await listener.watch("b", b"lease:{b}")
        await client.publish(channel_name(b"lease:{b}"), b"")
        assert not await watch.wait(0.2)
    finally:
        await listener.aclose()


async def test_a_dropped_connection_wakes_waiters_and_watching_resumes(
    client: redis.asyncio.Redis,
) -> None:
    listener = RedisReleaseListener(client, sharded=False, timeout_s=5)
    try:
        watch = await listener.watch("k", b"lease:{k}")
        await listener.break_connection()
        assert await watch.wait(BOUND_S)  # it may have missed a message: look again
        again = await listener.watch("k", b"lease:{k}")
        for _ in range(100):
            if await client.publish(channel_name(b"lease:{k}"), b"") >= 1:
                break
            await asyncio.sleep(0.01)
        assert await again.wait(BOUND_S)
    finally:
        await listener.aclose()


async def test_closing_wakes_every_waiter(client: redis.asyncio.Redis) -> None:
    listener = RedisReleaseListener(client, sharded=False, timeout_s=5)
    watch = await listener.watch("k", b"lease:{k}")
    await listener.aclose()
    assert await watch.wait(0)


async def test_waiters_arriving_together_share_one_confirmed_subscription(
    client: redis.asyncio.Redis,
) -> None:
    """Eight watches of one key started in the same loop turn: one SUBSCRIBE, and every
    one of them returns once the server confirmed it (none waits for a confirmation
    that another waiter's reply already consumed)."""
    listener = RedisReleaseListener(client, sharded=False, timeout_s=5)
    try:
        with anyio_fail_after(BOUND_S):
            watches = await asyncio.gather(*(listener.watch("k", b"lease:{k}") for _ in range(8)))
        assert (await client.pubsub_numsub(channel_name(b"lease:{k}")))[0][1] == 1
        await client.publish(channel_name(b"lease:{k}"), b"")
        for watch in watches:
            assert await watch.wait(BOUND_S)
            watch.close()
    finally:
        await listener.aclose()


async def test_a_waiter_who_comes_back_as_the_last_one_left_is_still_subscribed(
    client: redis.asyncio.Redis,
) -> None:
    """The last waiter leaves (an UNSUBSCRIBE goes out in the background) and a new one
    watches the key at once: whatever order the two commands reach the server in, the
    new waiter hears the next release."""
    listener = RedisReleaseListener(client, sharded=False, timeout_s=5)
    channel = channel_name(b"lease:{k}")
    try:
        for _ in range(20):
            first = await listener.watch("k", b"lease:{k}")
            first.close()  # the last waiter: unsubscribes in the background
            again = await listener.watch("k", b"lease:{k}")
            try:
                with anyio_fail_after(BOUND_S):
                    while (await client.pubsub_numsub(channel))[0][1] != 1:  # noqa: ASYNC110 (the server's count)
                        await asyncio.sleep(0.005)
                await client.publish(channel, b"")
                assert await again.wait(BOUND_S), "the new waiter was left unsubscribed"
            finally:
                again.close()
    finally:
        await listener.aclose()


async def test_a_cluster_listener_with_nothing_left_to_watch_lets_the_loop_run(
    redis_cluster: RedisClusterServer,
) -> None:
    # Once the last channel is unsubscribed, redis-py's cluster pub/sub has no node left
    # to read and answers at once: a reader that kept asking starved the event loop,
    # and this test (like an aclose after the last wait) never got control back.
    client = redis.asyncio.RedisCluster.from_url(redis_cluster.url)
    await client.initialize()
    listener = RedisReleaseListener(client, sharded=True, timeout_s=5)
    try:
        for _ in range(2):  # and a later watch starts reading again
            watch = await listener.watch("k", b"lease:{k}")
            assert await client.spublish(channel_name(b"lease:{k}"), b"") == 1
            assert await watch.wait(BOUND_S)
            watch.close()
            for _ in range(100):
                await asyncio.sleep(0.01)
                reader = listener._reader
                if reader is None or reader.done():
                    break
            assert reader is None or reader.done()
    finally:
        await listener.aclose()
        await client.aclose()


async def test_an_acl_user_without_channel_rights_releases_transfers_and_waits_by_polling(
    private_redis_server: RedisServer,
) -> None:
    """Redis 7 gives a new ACL user no pub/sub channels (``acl-pubsub-default
    resetchannels``), so the server refuses the scripts' PUBLISH and the waiters'
    SUBSCRIBE. Release and transfer must still succeed (they used to raise after their
    write had happened), and a waiter falls back to polling instead of failing."""
    server = private_redis_server
    try:
        server.command("ACL", "SETUSER", "app", "on", ">app-secret", "~*", "+@all", "resetchannels")
    except RespError as exc:  # pragma: no cover (Redis < 6.2 has no channel permissions)
        pytest.skip(f"this redis-server has no pub/sub channel permissions: {exc}")
    url = f"redis://app:app-secret@{server.host}:{server.port}/0"
    async with RedisLeaseProvider.from_url(url) as provider:
        assert (await provider.acquire_lease("k", "alice", 60_000)).acquired
        await provider.release_lease("k", "alice")
        assert await provider.get_lease_owner("k") is None
        assert (await provider.acquire_lease("k", "alice", 60_000)).acquired
        assert await provider.transfer_lease("k", "alice", "carol", 60_000)
        assert await provider.get_lease_owner("k") == "carol"
        with pytest.raises(leasekit.LeaseBackendError):
            await provider.watch_release("k")  # the premise: no channel for this user
        # Denied, the waiter tries to subscribe, is refused, and polls until its timeout:
        # LeaseHeld naming the holder, not the refusal.
        with pytest.raises(leasekit.LeaseHeld) as held:
            await leasekit.wait_for(provider, "k", "bob", 60_000, 0.5, poll_s=0.01)
        assert held.value.holder == "carol"
        stats = server.info("commandstats")["cmdstat_subscribe"]
        assert "rejected_calls=0," not in stats, stats  # both refusals reached the server
        with anyio_fail_after(BOUND_S):
            waiter = asyncio.ensure_future(
                leasekit.wait_for(provider, "k", "bob", 60_000, None, poll_s=0.01, max_poll_s=0.05)
            )
            await asyncio.sleep(0.05)
            await provider.release_lease("k", "carol")
            assert (await waiter).owner == "bob"
    with leasekit.sync.connect(url) as blocking:  # the blocking provider runs the same scripts
        assert blocking.acquire_lease("s", "alice", 60_000).acquired
        blocking.release_lease("s", "alice")
        assert blocking.get_lease_owner("s") is None


async def test_a_granted_payload_wakes_only_the_watchers_that_asked_for_grants(
    client: redis.asyncio.Redis,
) -> None:
    listener = RedisReleaseListener(client, sharded=False, timeout_s=5)
    try:
        acquirer = await listener.watch("k", b"lease:{k}")
        observer = await listener.watch("k", b"lease:{k}", grants=True)
        await client.publish(channel_name(b"lease:{k}"), b"granted")
        assert await observer.wait(BOUND_S)
        await client.publish(channel_name(b"lease:{k}"), b"")  # a release wakes both
        assert await observer.wait(BOUND_S)
        assert await acquirer.wait(0)  # set by the release: the grant before it did not
        assert not await acquirer.wait(0)
    finally:
        await listener.aclose()


async def _hints(
    client: redis.asyncio.Redis, lease: bytes, steps: Callable[[], Awaitable[None]]
) -> list[bytes]:
    """The payloads published on ``lease``'s channel while ``steps`` run."""
    pubsub = client.pubsub()
    channel = channel_name(lease)
    try:
        await pubsub.subscribe(channel)
        await steps()
        await client.publish(channel, b"end")  # one channel keeps its order: the last one
        payloads: list[bytes] = []
        with anyio_fail_after(BOUND_S):
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                if message is None:
                    continue
                if message["data"] == b"end":
                    return payloads
                payloads.append(message["data"])
    finally:
        await pubsub.aclose()


@pytest.mark.parametrize("driver", ["async", "blocking"])
async def test_only_a_change_of_hands_publishes_a_grant_hint(
    client: redis.asyncio.Redis, redis_url: str, redis_prefix: str, driver: str
) -> None:
    """A grant of a free key says 'granted'; a transfer to another owner and a release
    say '' (every waiter looks again); a denied acquire, the holder's re-acquire, its
    renewal and its transfer to itself, metadata changed or not, say nothing."""

    async def steps() -> None:
        async with leasekit.connect(redis_url, prefix=redis_prefix) as leases:
            with leasekit.sync.connect(redis_url, prefix=redis_prefix) as blocking:

                async def call(name: str, *args: Any, **kwargs: Any) -> Any:
                    if driver == "async":
                        return await getattr(leases, name)(*args, **kwargs)
                    method = getattr(blocking, name)
                    return await asyncio.to_thread(lambda: method(*args, **kwargs))

                assert (await call("acquire_lease", "k", "alice", 60_000)).acquired
                assert (await call("acquire_lease", "k", "alice", 60_000)).acquired
                await call("acquire_lease", "k", "alice", 60_000, metadata=b"a:1")
                assert await call("renew_lease", "k", "alice", 60_000)
                assert await call("transfer_lease", "k", "alice", "alice", 60_000, metadata=b"2")
                assert not (await call("acquire_lease", "k", "bob", 60_000)).acquired
                assert await call("transfer_lease", "k", "alice", "bob", 60_000, metadata=b"b")
                await call("release_lease", "k", "bob")

    lease = redis_prefix.encode() + b"{k}"
    assert await _hints(client, lease, steps) == [b"granted", b"", b""]
