"""``SQLiteSyncLeaseProvider``: the SQLite backend run in the caller's thread, for leasekit.sync.

It wraps a :class:`SQLiteLeaseProvider` and runs that provider's own operations
(``_work``), connection setup, busy-timeout handling and sweeping directly in the
calling thread, one operation at a time on the provider's one connection, instead of
hopping to a loop thread and then to the provider's thread. Deadlines: the wait for
the connection and SQLite's busy timeout both end at ``timeout_s``.
"""

from __future__ import annotations

import threading
import time
from typing import TypeVar

from leasekit import LeaseBackendTimeout, LeaseResult
from leasekit.backend import SyncBackendProvider

from . import _work
from ._provider import SQLiteLeaseProvider

__all__ = ["SQLiteSyncLeaseProvider"]

_T = TypeVar("_T")


class SQLiteSyncLeaseProvider(SyncBackendProvider):
    """Leases in a SQLite file from blocking code; safe to share between threads.

    Made by ``leasekit.sync.connect("sqlite:///path.db")`` with the options of
    :class:`SQLiteLeaseProvider`, which it runs. Threads take turns on the file's one
    connection (SQLite serialises writers to a file anyway); processes share the file
    as with the async provider.
    """

    backend = SQLiteLeaseProvider.backend
    capabilities = SQLiteLeaseProvider.capabilities
    errors = SQLiteLeaseProvider.errors

    def __init__(self, provider: SQLiteLeaseProvider) -> None:
        super().__init__(timeout_s=provider.timeout_s, owns_client=True)
        self._provider = provider
        self._turn = threading.Lock()
        self.path = provider.path

    def _run(self, work: _work.Work[_T], key: str | None, *, write: bool) -> _T:
        deadline = time.monotonic() + self.timeout_s
        if not self._turn.acquire(timeout=self.timeout_s):
            raise LeaseBackendTimeout(
                f"no turn on the connection within {self.timeout_s:g} s{self._where()}",
                backend=self.backend,
                key=key,
            )
        try:
            provider = self._provider
            result: _T = self._call(
                provider._in_thread, provider._sweeping(work, write=write), deadline, key=key
            )
            return result
        finally:
            self._turn.release()

    def _connect(self) -> None:
        self._run(lambda conn: None, None, write=False)

    def _close_client(self) -> None:
        with self._turn:
            provider = self._provider
            provider._shut = True
            conn, provider._conn = provider._conn, None
            if conn is not None:
                conn.close()

    def _describe(self) -> str:
        return repr(self.path)

    def _where(self) -> str:
        return f" (file {self.path!r})"

    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        """Blocking :meth:`SQLiteLeaseProvider.acquire_lease`."""
        return self._run(_work.acquire(key, owner, ttl_ms), key, write=True)

    def get_lease_owner(self, key: str) -> str | None:
        """Blocking :meth:`SQLiteLeaseProvider.get_lease_owner`."""
        return self._run(_work.owner(key), key, write=False)

    def release_lease(self, key: str, owner: str) -> None:
        """Blocking :meth:`SQLiteLeaseProvider.release_lease`."""
        self._run(_work.release(key, owner), key, write=True)

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`SQLiteLeaseProvider.renew_lease`."""
        return self._run(_work.renew(key, owner, ttl_ms), key, write=True)

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`SQLiteLeaseProvider.transfer_lease`."""
        return self._run(_work.transfer(key, from_owner, to_owner, ttl_ms), key, write=True)
