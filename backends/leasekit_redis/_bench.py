"""Redis: the raw-driver floor and the peer lock libraries for ``leasekit bench redis://``.

Registered in the ``leasekit.bench`` entry-point group for ``redis`` and ``rediss``,
and imported only when such a URL is benchmarked. Every contender reads the URL with
the provider's own parser (:func:`~leasekit_redis._options.url_settings`): the host,
database, credentials and redis-py settings mean the same to each, and a URL the
provider refuses is refused before anything runs. leasekit's own options (``prefix``,
``timeout_s``, ``max_connections``, ...) shape only leasekit's client; the floor and
the peers keep their drivers' defaults, except ``cluster=true``, which gives the
floor and redis-py's locks a ``RedisCluster`` client too. The floor is
what a careful hand-written lease takes with redis-py's asyncio client: ``SET key
owner NX PX ttl`` to acquire and a Lua compare-and-delete (by ``EVALSHA``) to
release, two round trips per cycle like leasekit's, but without fencing tokens,
the holder on denial, timeouts or error translation. Peers need their package
(``pip install 'leasekit[bench]'``); each is used the way its documentation shows,
a lock object per acquisition. The handoff scenario (``--scenarios handoff``) measures
redis-py's asyncio ``Lock(blocking=True)`` and python-redis-lock (BLPOP-based, in
threads) waiting for a released lock.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from leasekit.bench import (
    LEASEKIT_SYNC,
    AsyncCycler,
    BenchTarget,
    Contender,
    HandoffPeer,
    SchemeBench,
    SyncCycler,
    open_tooz,
)

if TYPE_CHECKING:
    import redis
    import redis.asyncio

    from ._options import RedisURLSettings

__all__ = ["BENCH"]

# KEYS: the lock. ARGV: the owner. Deletes the key only while ARGV[1] holds it, so a
# late release never frees someone else's lock; the check and the delete are one step.
_COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def _settings(target: BenchTarget) -> RedisURLSettings:
    from ._options import url_settings  # noqa: PLC0415 (drivers load only when benchmarked)

    return url_settings(target.url)


def _async_client(settings: RedisURLSettings) -> Any:
    """A redis-py asyncio client on the driver's defaults, a cluster one for ``cluster``."""
    import redis.asyncio  # noqa: PLC0415

    if settings.cluster:
        return redis.asyncio.RedisCluster.from_url(settings.driver_url)
    return redis.asyncio.Redis.from_url(settings.driver_url)


def _sync_client(settings: RedisURLSettings) -> Any:
    import redis  # noqa: PLC0415

    if settings.cluster:
        return redis.RedisCluster.from_url(settings.driver_url)
    return redis.Redis.from_url(settings.driver_url)


def _single_server(settings: RedisURLSettings, peer: str) -> redis.Redis:
    """A blocking client for a peer that takes a single server's client only."""
    import redis  # noqa: PLC0415

    if settings.cluster:
        raise RuntimeError(f"{peer} does not run on Redis Cluster")
    return redis.Redis.from_url(settings.driver_url)


def _ttl_s(target: BenchTarget) -> int:
    # python-redis-lock and tooz take whole seconds; the bench TTL is 30 s.
    return max(1, target.ttl_ms // 1000)


# -- the floor: SET NX PX + Lua compare-and-delete on redis.asyncio --------------------------


class _RawCycler:
    def __init__(self, client: Any, sha: str, ttl_ms: int) -> None:
        self._client = client
        self._sha = sha
        self._ttl_ms = ttl_ms

    async def cycle(self, key: str, owner: str) -> bool:
        client = self._client
        if not await client.set(key, owner, nx=True, px=self._ttl_ms):
            return False
        await client.evalsha(self._sha, 1, key, owner)
        return True

    async def aclose(self) -> None:
        await self._client.aclose()


async def _open_raw(target: BenchTarget) -> AsyncCycler:
    client = _async_client(_settings(target))
    try:
        sha = await client.script_load(_COMPARE_AND_DELETE)
    except BaseException:
        await client.aclose()
        raise
    return _RawCycler(client, str(sha), target.ttl_ms)


class _SyncRawCycler:
    def __init__(self, client: redis.Redis, sha: str, ttl_ms: int) -> None:
        self._client = client
        self._sha = sha
        self._ttl_ms = ttl_ms

    def cycle(self, key: str, owner: str) -> bool:
        client = self._client
        if not client.set(key, owner, nx=True, px=self._ttl_ms):
            return False
        client.evalsha(self._sha, 1, key, owner)
        return True

    def close(self) -> None:
        self._client.close()


def _open_sync_raw(target: BenchTarget) -> SyncCycler:
    client = _sync_client(_settings(target))
    try:
        sha = client.script_load(_COMPARE_AND_DELETE)
    except BaseException:
        client.close()
        raise
    return _SyncRawCycler(client, str(sha), target.ttl_ms)


# -- redis-py's Lock, asyncio and blocking --------------------------------------------------


class _AsyncLockCycler:
    def __init__(self, client: Any, ttl_s: float) -> None:
        self._client = client
        self._ttl_s = ttl_s

    async def cycle(self, key: str, owner: str) -> bool:
        lock = self._client.lock(key, timeout=self._ttl_s, blocking=False)
        if not await lock.acquire():
            return False
        await lock.release()
        return True

    async def aclose(self) -> None:
        await self._client.aclose()


async def _open_async_lock(target: BenchTarget) -> AsyncCycler:
    client = _async_client(_settings(target))
    return _AsyncLockCycler(client, target.ttl_ms / 1000)


class _SyncLockCycler:
    def __init__(self, client: Any, ttl_s: float) -> None:
        self._client = client
        self._ttl_s = ttl_s

    def cycle(self, key: str, owner: str) -> bool:
        lock = self._client.lock(key, timeout=self._ttl_s, blocking=False)
        if not lock.acquire():
            return False
        lock.release()
        return True

    def close(self) -> None:
        self._client.close()


def _open_sync_lock(target: BenchTarget) -> SyncCycler:
    return _SyncLockCycler(_sync_client(_settings(target)), target.ttl_ms / 1000)


# -- python-redis-lock ----------------------------------------------------------------------


class _RedisLockCycler:
    def __init__(self, client: redis.Redis, ttl_s: int) -> None:
        import redis_lock  # noqa: PLC0415

        self._lock_class: Any = redis_lock.Lock
        self._client = client
        self._ttl_s = ttl_s
        # It logs a warning for every denied acquire: muted while it runs, or the
        # contended scenario prints thousands of lines (the level check stays in).
        self._logger = logging.getLogger("redis_lock.acquire")
        self._level = self._logger.level
        self._logger.setLevel(logging.ERROR)

    def cycle(self, key: str, owner: str) -> bool:
        lock = self._lock_class(self._client, key, expire=self._ttl_s)
        if not lock.acquire(blocking=False):
            return False
        lock.release()
        return True

    def close(self) -> None:
        self._logger.setLevel(self._level)
        self._client.close()


def _open_redis_lock(target: BenchTarget) -> SyncCycler:
    client = _single_server(_settings(target), "python-redis-lock")
    return _RedisLockCycler(client, _ttl_s(target))


# -- tooz -----------------------------------------------------------------------------------


def _tooz_url(target: BenchTarget) -> str:
    """tooz's redis URL for ``target.url``: host and port, the db and TLS as options."""
    settings = _settings(target)
    if settings.cluster:
        raise RuntimeError("tooz's redis driver does not run on Redis Cluster")
    parts = urlsplit(settings.driver_url)
    query: dict[str, str] = {"lock_timeout": str(_ttl_s(target))}
    db = parts.path.strip("/")
    if db:
        query["db"] = db
    if parts.scheme.lower() == "rediss":
        query["ssl"] = "true"
    return urlunsplit(("redis", parts.netloc, "", urlencode(query), ""))


def _open_tooz(target: BenchTarget) -> SyncCycler:
    # The member id carries the run's namespace, so cleanup finds tooz's own keys too.
    return open_tooz(_tooz_url(target), target.namespace.encode())


# -- the handoff scenario's peers: a waiter blocks on a held lock ---------------------------


async def _handoff_redis_lock(target: BenchTarget, handoffs: int) -> list[float]:
    """redis-py's asyncio ``Lock``: the waiter polls (its ``sleep``, 0.1 s) until released."""
    client = _async_client(_settings(target))
    ttl_s = target.ttl_ms / 1000
    latencies: list[float] = []
    try:
        for index in range(handoffs):
            name = f"{target.namespace}:redispy:{index}"
            held = client.lock(name, timeout=ttl_s)
            await held.acquire()
            done = asyncio.get_running_loop().create_future()

            async def wait(name: str = name, done: asyncio.Future[float] = done) -> None:
                lock = client.lock(name, timeout=ttl_s)
                await lock.acquire(blocking=True, blocking_timeout=ttl_s)
                done.set_result(time.perf_counter())
                await lock.release()

            task = asyncio.ensure_future(wait())
            await asyncio.sleep(0.02)  # the waiter is denied and waiting by then
            t0 = time.perf_counter()
            await held.release()
            latencies.append((await done - t0) * 1000)
            await task
    finally:
        await client.aclose()
    return latencies


def _handoff_python_redis_lock_sync(target: BenchTarget, handoffs: int) -> list[float]:
    import redis_lock  # noqa: PLC0415

    client = _single_server(_settings(target), "python-redis-lock")
    expire = _ttl_s(target)
    latencies: list[float] = []
    try:
        for index in range(handoffs):
            name = f"{target.namespace}:prl:{index}"
            held = redis_lock.Lock(client, name, expire=expire)
            held.acquire()
            got: list[float] = []
            ready = threading.Event()

            def wait(
                name: str = name, got: list[float] = got, ready: threading.Event = ready
            ) -> None:
                lock = redis_lock.Lock(client, name, expire=expire)
                ready.set()
                lock.acquire(blocking=True, timeout=expire)
                got.append(time.perf_counter())
                lock.release()

            thread = threading.Thread(target=wait)
            thread.start()
            ready.wait()
            time.sleep(0.02)
            t0 = time.perf_counter()
            held.release()
            thread.join(60)
            if got:
                latencies.append((got[0] - t0) * 1000)
    finally:
        client.close()
    return latencies


async def _handoff_python_redis_lock(target: BenchTarget, handoffs: int) -> list[float]:
    """python-redis-lock: the waiter blocks in BLPOP on the lock's signal list."""
    return await asyncio.to_thread(_handoff_python_redis_lock_sync, target, handoffs)


# -- around the run -------------------------------------------------------------------------


async def _cleanup(target: BenchTarget) -> None:
    """Delete every name containing the run's namespace (locks, counters, signals)."""
    settings = _settings(target)
    client = _async_client(settings)
    try:
        batch: list[Any] = []
        async for name in client.scan_iter(match=f"*{target.namespace}*", count=1000):
            batch.append(name)
            if len(batch) == 500:
                await _unlink(client, batch, cluster=settings.cluster)
                batch.clear()
        if batch:
            await _unlink(client, batch, cluster=settings.cluster)
    finally:
        await client.aclose()


async def _unlink(client: Any, names: list[Any], *, cluster: bool) -> None:
    if cluster:  # names in different slots cannot go in one command
        for name in names:
            await client.unlink(name)
    else:
        await client.unlink(*names)


async def _describe_server(target: BenchTarget) -> str | None:
    settings = _settings(target)
    client = _async_client(settings)
    try:
        info = await client.info("server")
        if info and all(isinstance(reply, dict) for reply in info.values()):
            info = next(iter(info.values()))  # a cluster's: one reply per node
    finally:
        await client.aclose()
    version = info.get("valkey_version") or info.get("redis_version")
    name = "valkey" if "valkey_version" in info else "redis"
    return f"{name} {version}" if version else None


BENCH = SchemeBench(
    contenders=(
        LEASEKIT_SYNC,
        Contender(
            "redis-raw",
            "redis-py raw",
            "floor",
            open_async=_open_raw,
            requires=("redis",),
            install="pip install 'leasekit[redis]'",
            how="redis.asyncio: SET key owner NX PX ttl, then EVALSHA compare-and-delete",
        ),
        Contender(
            "redis-raw-sync",
            "redis-py raw (sync)",
            "peer",
            open_sync=_open_sync_raw,
            requires=("redis",),
            install="pip install 'leasekit[redis]'",
            how="redis.Redis: SET key owner NX PX ttl, then EVALSHA compare-and-delete",
        ),
        Contender(
            "redis-py-lock-async",
            "redis-py Lock (asyncio)",
            "peer",
            open_async=_open_async_lock,
            requires=("redis",),
            install="pip install redis",
            how="redis.asyncio.Redis.lock(key, timeout, blocking=False): acquire, release",
        ),
        Contender(
            "redis-py-lock-sync",
            "redis-py Lock (sync)",
            "peer",
            open_sync=_open_sync_lock,
            requires=("redis",),
            install="pip install redis",
            how="redis.Redis.lock(key, timeout, blocking=False): acquire, release",
        ),
        Contender(
            "python-redis-lock",
            "python-redis-lock (sync)",
            "peer",
            open_sync=_open_redis_lock,
            requires=("redis_lock",),
            install="pip install python-redis-lock",
            how="redis_lock.Lock(client, key, expire): acquire(blocking=False), release",
        ),
        Contender(
            "tooz",
            "tooz redis (sync)",
            "peer",
            open_sync=_open_tooz,
            requires=("tooz",),
            install="pip install tooz",
            how="tooz coordinator (redis driver) get_lock(key): acquire(blocking=False), release",
        ),
    ),
    cleanup=_cleanup,
    describe_server=_describe_server,
    handoff_peers=(
        HandoffPeer(
            "redis-py asyncio Lock(blocking=True)",
            _handoff_redis_lock,
            requires=("redis",),
            install="pip install redis",
        ),
        HandoffPeer(
            "python-redis-lock (BLPOP)",
            _handoff_python_redis_lock,
            requires=("redis_lock",),
            install="pip install python-redis-lock",
        ),
    ),
)
