"""``PostgresSyncLeaseProvider``: PostgreSQL on psycopg's blocking pool, for leasekit.sync.

Not a second backend: the statements (``_sql``), the operations as sans-I/O generators
(``_calls``), the URL and option parsing (``_options``), the error table and the
capabilities are the async provider's own. What is here is only the blocking I/O:
:func:`run` drives an operation on a ``psycopg.Connection`` exactly as
``_calls.run`` does on an asyncio one, and the provider takes connections from a
``psycopg_pool.ConnectionPool``.

Bounds: the wait for a pooled connection is the pool's ``timeout`` (``timeout_s``);
a statement is cancelled by the server at ``statement_timeout`` (``timeout_s``, in the
connections' startup options); and a server that answers nothing at all (stopped,
or a dead link) is cut off at ``timeout_s`` by :class:`leasekit.backend.SyncDeadlines`,
which shuts the connection's socket down. All three are
:class:`~leasekit.LeaseBackendTimeout`.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import psycopg
from psycopg import pq
from psycopg_pool import ConnectionPool, PoolClosed

from leasekit import (
    LeaseBackendTimeout,
    LeaseError,
    LeaseProviderClosed,
    LeaseResult,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)
from leasekit.backend import SyncBackendProvider, SyncDeadlines

from . import _calls, _sql
from ._notify import channel_for
from ._options import BACKEND, check_grace, pool_settings, table_name
from ._provider import PostgresLeaseProvider

__all__ = ["PostgresSyncLeaseProvider", "run"]

_T = TypeVar("_T")
log = logging.getLogger("leasekit.postgres")
_pool_numbers = itertools.count(1)


def run(conn: psycopg.Connection[Any], operation: _calls.Operation[_T]) -> _T:
    """Drive ``operation`` on a blocking ``conn``: send each query, hand back its reply."""
    try:
        query = next(operation)
        while True:
            try:
                cursor = conn.execute(query.statement, query.params, prepare=query.prepare)
                reply: Any
                if query.reads == "rowcount":
                    reply = cursor.rowcount
                elif query.reads == "rows":
                    reply = cursor.fetchall()
                else:
                    reply = cursor.fetchone()
            except psycopg.Error as exc:  # noqa: PERF203 (handed to the operation)
                if not conn.broken and conn.info.transaction_status == pq.TransactionStatus.INERROR:
                    conn.rollback()
                query = operation.throw(exc)
            else:
                query = operation.send(reply)
    except StopIteration as stop:
        result: _T = stop.value
        return result


def _end_process(pid: int, wait_ms: int) -> _calls.Operation[bool]:
    """Terminate server process ``pid`` and wait for it: True once it is gone (or was)."""
    rows = yield _calls.Query(_sql.END_PROCESS, {"pid": pid, "wait_ms": wait_ms}, reads="rows")
    return not rows or bool(rows[0][0])


def _break(conn: psycopg.Connection[Any]) -> None:
    """Shut ``conn``'s socket down (from the watchdog): its blocked read fails at once."""
    fd = conn.pgconn.socket
    with socket.socket(fileno=socket.dup(fd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


class PostgresSyncLeaseProvider(SyncBackendProvider):
    """Leases in PostgreSQL from blocking code: the async provider's statements on psycopg's pool.

    Safe to share between threads. Made by ``leasekit.sync.connect("postgresql://...")``
    (through :meth:`PostgresLeaseProvider.sync_from_url`) or by :meth:`from_url`, with
    the same URL and options. The schema is checked (or created) on first use, expired
    rows are swept every ``sweep_every`` writes (in the writing thread), and releases
    and transfers notify the async provider's waiters.
    """

    backend = PostgresLeaseProvider.backend
    capabilities = PostgresLeaseProvider.capabilities
    errors = PostgresLeaseProvider.errors

    def __init__(
        self,
        pool: ConnectionPool[Any],
        *,
        options: dict[str, Any],
        close_client: bool = False,
    ) -> None:
        check_grace(options)
        super().__init__(timeout_s=options["timeout_s"], owns_client=bool(close_client))
        self._pool = pool
        self.table: str = options["table"]
        self.create_schema: bool = options["create_schema"]
        self.sweep_every: int = options["sweep_every"]
        self.sweep_batch: int = options["sweep_batch"]
        self.sweep_grace_s: float = options["sweep_grace_s"]
        self._sql = _sql.Statements(table_name(self.table))
        self._channel: str | None = None
        if options["notifications"]:
            self._channel = channel_for(str(table_name(self.table)))
        else:
            self.capabilities = replace(self.capabilities, release_notifications=False)
        self._ready = False
        self._ready_lock = threading.Lock()
        self._writes = 0
        self._deadlines = SyncDeadlines(self.timeout_s)
        # key -> the server process of a call abandoned at its deadline on that key. Its
        # statement may still sit in that (frozen) process's socket and run when it
        # wakes, after the caller went on: the next call on the key ends it first.
        self._abandoned: dict[str, int] = {}

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresSyncLeaseProvider:
        """A provider and its own blocking pool; see :meth:`PostgresLeaseProvider.from_url`."""
        settings = pool_settings(url, options)
        pool: ConnectionPool[Any] = ConnectionPool(
            settings.conninfo,
            kwargs=settings.connection_kwargs,
            min_size=settings.min_size,
            max_size=settings.max_size,
            timeout=settings.provider["timeout_s"],
            name=f"leasekit-blocking-{next(_pool_numbers)}",
            open=False,
        )
        return cls(pool, options=settings.provider, close_client=True)

    # -- one call -------------------------------------------------------------------------

    def _run(
        self,
        operation: Callable[[], _calls.Operation[_T]],
        key: str | None,
        *,
        write: bool = False,
        idempotent: bool = True,
    ) -> _T:
        result: _T = self._call(self._attempt, operation, idempotent, key, key=key)
        if write and self.sweep_every:
            self._writes += 1  # racy under threads: a sweep a little early or late
            if self._writes >= self.sweep_every:
                self._writes = 0
                self._sweep_quietly()
        return result

    def _attempt(
        self, operation: Callable[[], _calls.Operation[_T]], idempotent: bool, key: str | None
    ) -> _T:
        """Run ``operation`` on a pooled connection; once more if that one was dead."""
        if not self._ready:
            self._ensure_ready()
        if self._abandoned and key is not None and key in self._abandoned:
            self._end_abandoned(key)
        retried = False
        while True:
            conn: psycopg.Connection[Any] | None = None
            try:
                with self._pool.connection() as conn:
                    result: _T = self._bounded(conn, operation(), key)
                    return result
            except psycopg.OperationalError as exc:
                lost = conn is not None and (conn.closed or conn.broken)
                if retried or not idempotent or not lost:
                    raise
                # As the async provider's _attempt: a dead connection (server restart, a proxy
                # dropping idle links); let the pool replace it, run once more.
                log.info("connection lost (%s); retrying once on a fresh one", exc)
                retried = True
                self._pool.check()
            except PoolClosed:
                if self.closed:
                    raise LeaseProviderClosed(backend=BACKEND) from None
                raise

    def _end_abandoned(self, key: str) -> None:
        """End the server process that may still run a call abandoned on ``key``, or raise.

        Ordered as the async provider's calls on a key are: a release abandoned at its
        deadline against a frozen server process would otherwise run when it wakes,
        after the same owner's next acquire, and end that newer lease. The process is
        terminated and waited for (``pg_terminate_backend(pid, timeout)``, PostgreSQL
        14+); if it is still there at this call's deadline, this call is not sent and
        raises :class:`~leasekit.LeaseBackendTimeout`, and the next call tries again.
        """
        pid = self._abandoned[key]
        wait_ms = max(1, int(self.timeout_s * 1000 * 0.8))
        with self._pool.connection() as conn:
            # Not timed as a call on key: that would note this connection as abandoned.
            ended = self._bounded(conn, _end_process(pid, wait_ms), None)
        if not ended:
            raise LeaseBackendTimeout(
                f"a call abandoned on this key is still in server process {pid}, which did "
                f"not end within {self.timeout_s:g} s{self._where()}",
                backend=BACKEND,
                key=key,
            )
        if self._abandoned.get(key) == pid:
            del self._abandoned[key]

    def _bounded(
        self, conn: psycopg.Connection[Any], operation: _calls.Operation[_T], key: str | None
    ) -> _T:
        def expire() -> None:
            # Noted before the break (a broken connection forgets its server process).
            if key is not None:
                self._abandoned[key] = conn.pgconn.backend_pid
            _break(conn)

        watch = self._deadlines.open(expire)
        try:
            return run(conn, operation)
        except psycopg.Error as exc:
            if self._deadlines.close(watch):
                raise LeaseBackendTimeout(
                    f"no answer within {self.timeout_s:g} s{self._where()}",
                    backend=BACKEND,
                    key=key,
                ) from exc
            raise
        finally:
            self._deadlines.close(watch)

    def _ensure_ready(self) -> None:
        """Open the pool (first connection made directly) and check or create the schema."""
        with self._ready_lock:
            if self._ready:
                return
            pool = self._pool
            if pool.closed:
                conninfo, kwargs = pool.conninfo, pool.kwargs
                if isinstance(conninfo, str) and isinstance(kwargs, dict):
                    # A refusal, a wrong password or an unknown host: raised now, not
                    # retried by the pool's workers until the timeout.
                    with _calls._CONNECT_ERRORS.mapping(where=self._where()):
                        first = psycopg.Connection.connect(conninfo, **kwargs)
                    try:
                        self._bounded(first, self._ensure_schema(), None)
                    finally:
                        first.close()
                    self._ready = True
                pool.open(wait=False)
                if self._ready:
                    return
            with pool.connection() as conn:
                self._bounded(conn, self._ensure_schema(), None)
            self._ready = True

    def _ensure_schema(self) -> _calls.Operation[None]:
        return _calls.ensure_schema(self._sql, self.table, create=self.create_schema)

    def _sweep_quietly(self) -> None:
        try:
            self.sweep()
        except LeaseError as exc:
            log.debug("sweep failed: %s", exc)

    def _connect(self) -> None:
        self._ensure_ready()

    def _close_client(self) -> None:
        self._deadlines.stop()
        self._pool.close(timeout=0.1)

    def close(self) -> None:
        """Refuse new operations, close the pool (if built here) and stop the watchdog."""
        super().close()
        self._deadlines.stop()

    def _describe(self) -> str:
        return f"table={self.table!r}" + (f", server={self._server()!r}" if self._server() else "")

    def _where(self) -> str:
        server = self._server()
        return f" (server {server}, table {self.table})" if server else f" (table {self.table})"

    def _server(self) -> str:
        conninfo = self._pool.conninfo
        if not isinstance(conninfo, str):
            return ""
        try:
            params = psycopg.conninfo.conninfo_to_dict(conninfo)
        except (psycopg.Error, ValueError):
            return ""
        host, port = params.get("host", "localhost"), params.get("port", "5432")
        return f"{host}:{port}/{params.get('dbname', '')}"

    # -- the contract ---------------------------------------------------------------------

    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        """Blocking :meth:`PostgresLeaseProvider.acquire_lease`."""
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        return self._run(lambda: _calls.acquire(self._sql, key, owner, ttl_ms), key, write=True)

    def get_lease_owner(self, key: str) -> str | None:
        """Blocking :meth:`PostgresLeaseProvider.get_lease_owner`."""
        validate_key(key)
        return self._run(lambda: _calls.owner(self._sql, key), key)

    def release_lease(self, key: str, owner: str) -> None:
        """Blocking :meth:`PostgresLeaseProvider.release_lease`."""
        validate_key(key)
        validate_owner(owner)
        self._run(lambda: _calls.release(self._sql, key, owner, self._channel), key, write=True)

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`PostgresLeaseProvider.renew_lease`."""
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        return self._run(lambda: _calls.renew(self._sql, key, owner, ttl_ms), key, write=True)

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`PostgresLeaseProvider.transfer_lease` (not retried, as there)."""
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        return self._run(
            lambda: _calls.transfer(
                self._sql, key, from_owner, to_owner, ttl_ms, channel=self._channel
            ),
            key,
            write=True,
            idempotent=False,
        )

    def sweep(self) -> int:
        """Delete one batch of rows expired more than ``sweep_grace_s`` ago; how many went."""
        return self._run(
            lambda: _calls.sweep(self._sql, self.sweep_grace_s, self.sweep_batch), None
        )
