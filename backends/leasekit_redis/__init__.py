"""The Redis backend for leasekit: ``redis://`` and ``rediss://``, single server or Cluster.

Every operation is one round trip: a Lua script run by ``EVALSHA`` (or one ``GET``).
Install with ``pip install 'leasekit[redis]'``; see ``docs/backends/redis.md``.
"""

from ._provider import LeaseRecord, RedisClient, RedisLeaseProvider

__all__ = ["LeaseRecord", "RedisClient", "RedisLeaseProvider"]
