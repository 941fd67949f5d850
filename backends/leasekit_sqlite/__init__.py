"""The SQLite backend for leasekit: ``sqlite:///path``, one file shared by a host's processes.

``SQLiteSyncLeaseProvider`` runs the same operations in the caller's thread, which
:func:`leasekit.sync.connect` uses for ``sqlite://`` URLs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._provider import SQLiteLeaseProvider

if TYPE_CHECKING:
    from ._sync import SQLiteSyncLeaseProvider

__all__ = ["SQLiteLeaseProvider", "SQLiteSyncLeaseProvider"]


def __getattr__(name: str) -> Any:
    # The blocking provider loads on first use: async code never imports it.
    if name == "SQLiteSyncLeaseProvider":
        from ._sync import SQLiteSyncLeaseProvider  # noqa: PLC0415

        return SQLiteSyncLeaseProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
