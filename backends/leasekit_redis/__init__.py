"""The Redis backend for leasekit: ``redis://`` and ``rediss://``, single server or Cluster.

Every operation is one round trip: a Lua script run by ``EVALSHA`` (or one ``GET``).
Install with ``pip install 'leasekit[redis]'``; see ``docs/backends/redis.md``.
``RedisSyncLeaseProvider`` is the same backend on redis-py's blocking client, which
:func:`leasekit.sync.connect` uses for ``redis://`` URLs.
"""

from __future__ import annotations

from ._blocking import RedisSyncClient
from ._provider import LeaseRecord, RedisClient, RedisLeaseProvider, RedisSyncLeaseProvider

__all__ = [
    "LeaseRecord",
    "RedisClient",
    "RedisLeaseProvider",
    "RedisSyncClient",
    "RedisSyncLeaseProvider",
]
