"""``PostgresSyncLeaseProvider``: PostgreSQL on psycopg's blocking pool, for leasekit.sync.

Not a second backend: the same operations (``_ops``), options, capabilities and error
table (``_options``) as :class:`~leasekit_postgres.PostgresLeaseProvider`, run by the
blocking transport (``_blocking``) instead of the asyncio one. Lifecycle only, on the
toolkit's :class:`~leasekit.backend.SyncBackendProvider`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from psycopg_pool import ConnectionPool

from leasekit import Capabilities, LeaseError, LeaseResult
from leasekit.backend import ErrorMap, SyncBackendProvider

from . import _ops
from ._blocking import BlockingTransport, log, own_pool
from ._options import (
    BACKEND,
    CAPABILITIES,
    ERRORS,
    SettingsAttributes,
    describe,
    pool_settings,
    provider_settings,
)

__all__ = ["PostgresSyncLeaseProvider"]

_T = TypeVar("_T")


class PostgresSyncLeaseProvider(SettingsAttributes, SyncBackendProvider):
    """Leases in PostgreSQL from blocking code: the async provider's operations on psycopg's pool.

    Safe to share between threads. Made by ``leasekit.sync.connect("postgresql://...")``
    (through :meth:`PostgresLeaseProvider.sync_from_url`) or by :meth:`from_url`, with
    the same URL and options; or on a caller's ``psycopg_pool.ConnectionPool`` with the
    async provider's keyword options. The schema is checked (or created) on first use,
    expired rows are swept every ``sweep_every`` writes (in the writing thread), and
    releases and transfers notify the async provider's waiters.
    """

    backend: ClassVar[str] = BACKEND
    capabilities: Capabilities = CAPABILITIES
    errors: ClassVar[ErrorMap] = ERRORS

    def __init__(self, pool: ConnectionPool[Any], *, close_client: bool = False, **options: Any):
        settings = provider_settings(options)
        self._io = BlockingTransport(pool, settings)
        super().__init__(timeout_s=settings.timeout_s, owns_client=bool(close_client))
        self._settings = settings
        self._sql = settings.statements
        self._channel = settings.channel
        if not settings.notifications:
            self.capabilities = settings.capabilities
        self._sweeps = _ops.SweepSchedule(settings.sweep_every, settings.sweep_batch)

    @property
    def client(self) -> ConnectionPool[Any]:
        """The pool the provider runs on (the caller's, or the one it built)."""
        return self._io.pool

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresSyncLeaseProvider:
        """A provider and its own blocking pool; see :meth:`PostgresLeaseProvider.from_url`."""
        settings = pool_settings(url, options)
        return cls(own_pool(settings), close_client=True, **settings.provider)

    # -- one call ---------------------------------------------------------------------------

    def _send(
        self,
        operation: _ops.Operation[_T],
        key: str | None,
        again: Callable[..., _ops.Operation[_T]] | None = None,
        args: tuple[Any, ...] = (),
        *,
        write: bool = False,
    ) -> _T:
        """Run ``operation`` (built, so validated) through the transport; as the async one's."""
        result: _T = self._call(self._io.run, operation, again, args, key, key=key)
        if write and self._sweeps.wrote():
            self._sweeps.started()
            try:
                self._sweeps.swept(self.sweep())
            except LeaseError as exc:
                log.debug("sweep failed: %s", exc)
        return result

    def _connect(self) -> None:
        self._io.ensure_ready()

    def _close_client(self) -> None:
        self._io.close()

    def close(self) -> None:
        """Refuse new operations, close the pool (if built here) and stop the watchdog."""
        super().close()
        self._io.deadlines.stop()

    def _describe(self) -> str:
        return describe(self._io.server, self.table)

    def _where(self) -> str:
        return self._io.where

    # -- the contract ---------------------------------------------------------------------

    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        """Blocking :meth:`PostgresLeaseProvider.acquire_lease`."""
        args = (self._sql, key, owner, ttl_ms)
        return self._send(_ops.acquire(*args), key, _ops.acquire, args, write=True)

    def get_lease_owner(self, key: str) -> str | None:
        """Blocking :meth:`PostgresLeaseProvider.get_lease_owner`."""
        return self._send(_ops.owner(self._sql, key), key, _ops.owner, (self._sql, key))

    def release_lease(self, key: str, owner: str) -> None:
        """Blocking :meth:`PostgresLeaseProvider.release_lease`."""
        args = (self._sql, key, owner, self._channel)
        self._send(_ops.release(*args), key, _ops.release, args, write=True)

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`PostgresLeaseProvider.renew_lease`."""
        args = (self._sql, key, owner, ttl_ms)
        return self._send(_ops.renew(*args), key, _ops.renew, args, write=True)

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`PostgresLeaseProvider.transfer_lease` (not retried, as there)."""
        operation = _ops.transfer(
            self._sql, key, from_owner, to_owner, ttl_ms, channel=self._channel
        )
        return self._send(operation, key, write=True)

    def sweep(self) -> int:
        """Delete one batch of rows expired more than ``sweep_grace_s`` ago; how many went."""
        args = (self._sql, self.sweep_grace_s, self.sweep_batch)
        return self._send(_ops.sweep(*args), None, _ops.sweep, args)
