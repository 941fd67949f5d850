"""The PostgreSQL backend for leasekit: ``postgresql://`` and ``postgres://``.

Every operation is one conditional statement on an autocommit connection, timed by the
server's ``clock_timestamp()``; no session state, so transaction-mode pgbouncer works.
Install with ``pip install 'leasekit[postgres]'``; see ``docs/backends/postgresql.md``.
``PostgresSyncLeaseProvider`` is the same backend on psycopg's blocking pool, which
:func:`leasekit.sync.connect` uses for ``postgresql://`` URLs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._provider import LeaseRecord, PostgresClient, PostgresLeaseProvider

if TYPE_CHECKING:
    from ._sync_provider import PostgresSyncLeaseProvider

__all__ = ["LeaseRecord", "PostgresClient", "PostgresLeaseProvider", "PostgresSyncLeaseProvider"]


def __getattr__(name: str) -> Any:
    # The blocking provider loads on first use: async code never imports it.
    if name == "PostgresSyncLeaseProvider":
        from ._sync_provider import PostgresSyncLeaseProvider  # noqa: PLC0415

        return PostgresSyncLeaseProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
