"""Redis: the raw-driver floor and the peer lock libraries for ``leasekit bench redis://``.

Imported only when a ``redis://`` or ``rediss://`` URL is benchmarked. The floor is
what a careful hand-written lease takes with redis-py's asyncio client: ``SET key
owner NX PX ttl`` to acquire and a Lua compare-and-delete (by ``EVALSHA``) to
release, two round trips per cycle like leasekit's, but without fencing tokens,
the holder on denial, timeouts or error translation. Peers need their package
(``pip install 'leasekit[bench]'``); each is used the way its documentation shows,
a lock object per acquisition.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ._core import AsyncCycler, BenchTarget, Contender, SchemeBench, SyncCycler

if TYPE_CHECKING:
    import redis
    import redis.asyncio

__all__ = ["BENCH"]

# leasekit's own URL options: the driver would reject them, or (max_connections, which
# sizes leasekit's blocking pool) read them differently, failing at once when a
# non-blocking pool is full; the floor and the peers keep their drivers' defaults.
_LEASEKIT_OPTIONS = frozenset(
    {"prefix", "timeout_s", "counter_ttl_ms", "cluster", "max_connections", "autopipeline"}
)

# KEYS: the lock. ARGV: the owner. Deletes the key only while ARGV[1] holds it, so a
# late release never frees someone else's lock; the check and the delete are one step.
_COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def _driver_url(url: str) -> str:
    """``url`` without leasekit's options in its query, for redis-py and the peers."""
    parts = urlsplit(url)
    query = [
        (name, value)
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
        if name not in _LEASEKIT_OPTIONS
    ]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _ttl_s(target: BenchTarget) -> int:
    # python-redis-lock and tooz take whole seconds; the bench TTL is 30 s.
    return max(1, target.ttl_ms // 1000)


# -- the floor: SET NX PX + Lua compare-and-delete on redis.asyncio --------------------------


class _RawCycler:
    def __init__(self, client: redis.asyncio.Redis, sha: str, ttl_ms: int) -> None:
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
    import redis.asyncio  # noqa: PLC0415 (drivers load only when benchmarked)

    client = redis.asyncio.Redis.from_url(_driver_url(target.url))
    try:
        sha = await client.script_load(_COMPARE_AND_DELETE)
    except BaseException:
        await client.aclose()
        raise
    return _RawCycler(client, str(sha), target.ttl_ms)


# -- redis-py's Lock, asyncio and blocking --------------------------------------------------


class _AsyncLockCycler:
    def __init__(self, client: redis.asyncio.Redis, ttl_s: float) -> None:
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
    import redis.asyncio  # noqa: PLC0415

    client = redis.asyncio.Redis.from_url(_driver_url(target.url))
    return _AsyncLockCycler(client, target.ttl_ms / 1000)


class _SyncLockCycler:
    def __init__(self, client: redis.Redis, ttl_s: float) -> None:
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
    import redis  # noqa: PLC0415

    return _SyncLockCycler(redis.Redis.from_url(_driver_url(target.url)), target.ttl_ms / 1000)


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
    import redis  # noqa: PLC0415

    return _RedisLockCycler(redis.Redis.from_url(_driver_url(target.url)), _ttl_s(target))


# -- tooz -----------------------------------------------------------------------------------


class _ToozCycler:
    def __init__(self, coordinator: Any) -> None:
        self._coordinator = coordinator

    def cycle(self, key: str, owner: str) -> bool:
        lock = self._coordinator.get_lock(key.encode())
        if not lock.acquire(blocking=False):
            return False
        lock.release()
        return True

    def close(self) -> None:
        self._coordinator.stop()


def _tooz_url(target: BenchTarget) -> str:
    """tooz's redis URL for ``target.url``: host and port, the db and TLS as options."""
    parts = urlsplit(target.url)
    query: dict[str, str] = {"lock_timeout": str(_ttl_s(target))}
    db = parts.path.strip("/")
    if db:
        query["db"] = db
    if parts.scheme.lower() == "rediss":
        query["ssl"] = "true"
    return urlunsplit(("redis", parts.netloc, "", urlencode(query), ""))


def _open_tooz(target: BenchTarget) -> SyncCycler:
    from tooz import coordination  # noqa: PLC0415

    # The member id carries the run's namespace, so cleanup finds tooz's own keys too.
    coordinator = coordination.get_coordinator(_tooz_url(target), target.namespace.encode())
    coordinator.start(start_heart=False)
    return _ToozCycler(coordinator)


# -- around the run -------------------------------------------------------------------------


async def _cleanup(target: BenchTarget) -> None:
    """Delete every name containing the run's namespace (locks, counters, signals)."""
    import redis.asyncio  # noqa: PLC0415

    client = redis.asyncio.Redis.from_url(_driver_url(target.url))
    try:
        batch: list[Any] = []
        async for name in client.scan_iter(match=f"*{target.namespace}*", count=1000):
            batch.append(name)
            if len(batch) == 500:
                await client.unlink(*batch)
                batch.clear()
        if batch:
            await client.unlink(*batch)
    finally:
        await client.aclose()


async def _describe_server(target: BenchTarget) -> str | None:
    import redis.asyncio  # noqa: PLC0415

    client = redis.asyncio.Redis.from_url(_driver_url(target.url))
    try:
        info = await client.info("server")
    finally:
        await client.aclose()
    version = info.get("valkey_version") or info.get("redis_version")
    name = "valkey" if "valkey_version" in info else "redis"
    return f"{name} {version}" if version else None


BENCH = SchemeBench(
    contenders=(
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
)
