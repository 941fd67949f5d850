"""The SQLite backend for leasekit: ``sqlite:///path``, one file shared by a host's processes."""

from ._provider import SQLiteLeaseProvider

__all__ = ["SQLiteLeaseProvider"]
