"""The Redis backend for leasekit: ``redis://`` and ``rediss://``, single server or Cluster.

Every operation is one round trip: a Lua script run by ``EVALSHA`` (or one ``GET``).
Install with ``pip install 'leasekit[redis]'``; see ``docs/backends/redis.md``.
``RedisSyncLeaseProvider`` is the same backend on redis-py's blocking client, which
:func:`leasekit.sync.connect` uses for ``redis://`` URLs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._provider import LeaseRecord, RedisClient, RedisLeaseProvider

if TYPE_CHECKING:
    from ._sync import RedisSyncClient, RedisSyncLeaseProvider

__all__ = [
    "LeaseRecord",
    "RedisClient",
    "RedisLeaseProvider",
    "RedisSyncClient",
    "RedisSyncLeaseProvider",
]


def __getattr__(name: str) -> Any:
    # The blocking provider loads on first use: async code never imports it.
    if name in {"RedisSyncClient", "RedisSyncLeaseProvider"}:
        from . import _sync  # noqa: PLC0415

        return getattr(_sync, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
