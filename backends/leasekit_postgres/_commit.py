"""The watch for commits a synchronous standby never acknowledged (``synchronous_commit``)."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import psycopg

from leasekit import LeaseBackendTimeout

from ._options import BACKEND

__all__ = ["CommitWatch"]


class CommitWatch:
    """Notes, on one connection, a commit the standby never acknowledged.

    With ``synchronous_commit``, a commit waits for the synchronous standby; when the
    statement is cancelled meanwhile (``statement_timeout``: ``timeout_s``), PostgreSQL
    stops waiting, keeps the commit on the primary, and answers as if all went well,
    with a ``WARNING`` ("canceling wait for synchronous replication"). Installed as the
    connection's notice handler (:meth:`notice`); :meth:`check` after each operation
    turns such a warning into :class:`~leasekit.LeaseBackendTimeout`: the outcome is
    unknown, as for any timeout. Any warning of the generic class ``01000`` counts,
    whatever the server's language; leasekit's statements raise no other.
    """

    __slots__ = ("unconfirmed",)

    def __init__(self) -> None:
        self.unconfirmed = False

    @classmethod
    def on(cls, watches: MutableMapping[Any, CommitWatch] | None, conn: Any) -> CommitWatch:
        """``conn``'s watch in ``watches``, installed on first use, cleared for the
        operation about to run (a warning some other statement on the connection drew
        is not this operation's)."""
        assert watches is not None
        watch = watches.get(conn)
        if watch is None:
            watch = watches[conn] = cls()
            conn.add_notice_handler(watch.notice)
        watch.unconfirmed = False
        return watch

    def notice(self, diag: psycopg.errors.Diagnostic) -> None:
        if diag.severity_nonlocalized == "WARNING" and diag.sqlstate == "01000":
            self.unconfirmed = True

    def check(self, where: str, key: str | None = None) -> None:
        """Raise if the last operation's commit went unacknowledged; forget it."""
        if self.unconfirmed:
            self.unconfirmed = False
            raise LeaseBackendTimeout(
                "the synchronous standby did not acknowledge the commit within timeout_s: "
                f"it stands on the primary but may be lost in a failover{where}",
                backend=BACKEND,
                key=key,
            )
