"""Fencing guards: make the protected resource refuse writes that carry a stale token.

A fencing token only protects a resource if the resource itself rejects a write whose
token is lower than one it has already seen (Martin Kleppmann, "How to do distributed
locking"). leasekit issues the tokens (:attr:`leasekit.LeaseResult.token`,
:attr:`leasekit.LeaseHold.token`); the guards here are the rejecting side, each one
call atomic with the caller's own write:

- **SQL** (:func:`fence_postgres`, :func:`fence_postgres_sync`, :func:`fence_sqlite`,
  :func:`fence_mysql`): run inside the caller's own transaction, before its write. One
  conditional upsert on a small fence table records the token for the resource, or
  raises :class:`leasekit.StaleFencingToken` when a higher token is already recorded. The row
  lock orders competing writers, and the fence advances only if the caller's
  transaction commits. Create the table once with :func:`ensure_postgres_fence_table`
  (or its ``_sync`` twin) or :func:`ensure_mysql_fence_table`; :func:`fence_sqlite`
  creates its table on first use.
- **Redis** (:func:`fenced_redis_write`, :func:`fenced_redis_write_sync`): one Lua
  script checks the token and then runs the caller's write commands (``SET``,
  ``HSET``, ``DEL``, ``XADD``, ``EXPIRE``), so no other command runs in between.

Equal tokens pass: the holder of a lease writes as often as it likes. Resources are
named like lease keys (any non-empty ``str`` of at most 1024 UTF-8 bytes, NUL
included) and stored as UTF-8 bytes; tokens are ``int`` in ``1..2**63-1``. Bad input
raises :class:`leasekit.InvalidLeaseArgument` before anything is sent.

The guards run on the caller's own connection or client, inside the caller's own
transaction, so the driver's exceptions (a serialization failure to retry, a lost
connection) reach the caller unchanged, exactly as they would from its own write.

No driver is imported here: ``psycopg``, ``asyncmy`` and ``redis`` load only when a guard
that needs them is called (the caller has them imported already).
"""

from __future__ import annotations

from ._mysql import ensure_mysql_fence_table, fence_mysql
from ._postgres import (
    ensure_postgres_fence_table,
    ensure_postgres_fence_table_sync,
    fence_postgres,
    fence_postgres_sync,
)
from ._redis import REDIS_COMMANDS, fenced_redis_write, fenced_redis_write_sync
from ._shared import (
    DEFAULT_FENCE_TABLE,
    DEFAULT_REDIS_FENCE_PREFIX,
    MAX_FENCING_TOKEN,
    validate_token,
)
from ._sqlite import ensure_sqlite_fence_table, fence_sqlite

__all__ = [
    "DEFAULT_FENCE_TABLE",
    "DEFAULT_REDIS_FENCE_PREFIX",
    "MAX_FENCING_TOKEN",
    "REDIS_COMMANDS",
    "ensure_mysql_fence_table",
    "ensure_postgres_fence_table",
    "ensure_postgres_fence_table_sync",
    "ensure_sqlite_fence_table",
    "fence_mysql",
    "fence_postgres",
    "fence_postgres_sync",
    "fence_sqlite",
    "fenced_redis_write",
    "fenced_redis_write_sync",
    "validate_token",
]
