"""The PostgreSQL backend for leasekit: ``postgresql://`` and ``postgres://``.

Every operation is one conditional statement on an autocommit connection, timed by the
server's ``clock_timestamp()``; no session state, so transaction-mode pgbouncer works.
Install with ``pip install 'leasekit[postgres]'``; see ``docs/backends/postgresql.md``.
"""

from ._provider import LeaseRecord, PostgresClient, PostgresLeaseProvider

__all__ = ["LeaseRecord", "PostgresClient", "PostgresLeaseProvider"]
