"""The SQLite backend for leasekit: ``sqlite:///path``, one file shared by a host's processes.

``SQLiteSyncLeaseProvider`` runs the same operations in the caller's thread, which
:func:`leasekit.sync.connect` uses for ``sqlite://`` URLs.
"""

from __future__ import annotations

from ._provider import SQLiteLeaseProvider, SQLiteSyncLeaseProvider

__all__ = ["SQLiteLeaseProvider", "SQLiteSyncLeaseProvider"]
