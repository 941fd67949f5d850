"""The PostgreSQL backend for leasekit: ``postgresql://`` and ``postgres://``.

Every operation is one conditional statement on an autocommit connection, timed by the
server's ``clock_timestamp()``; no session state, so transaction-mode pgbouncer works.
Install with ``pip install 'leasekit[postgres]'``; see ``docs/backends/postgresql.md``.
``PostgresSyncLeaseProvider`` is the same backend on psycopg's blocking pool, which
:func:`leasekit.sync.connect` uses for ``postgresql://`` URLs.
"""

from __future__ import annotations

from ._provider import (
    LeaseRecord,
    PostgresClient,
    PostgresLeaseProvider,
    PostgresSyncLeaseProvider,
)

__all__ = ["LeaseRecord", "PostgresClient", "PostgresLeaseProvider", "PostgresSyncLeaseProvider"]
