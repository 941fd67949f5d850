"""Native blocking providers: how a backend offers :mod:`leasekit.sync` its driver's own speed.

:func:`leasekit.sync.connect` serves any backend by running its async provider on an
event loop in a background thread: one thread hop per call, which costs more CPU than
the round trip on a fast store. A backend whose driver also has a blocking client can
instead offer a *native* blocking provider, driven straight from the caller's thread:

- the backend class (the one its entry point names) gains a classmethod
  ``sync_from_url(url, **options)`` returning a :class:`SyncProvider`, with the same
  URL, options and errors as its ``from_url`` (:class:`SupportsSyncProvider`);
- the blocking provider subclasses :class:`SyncBackendProvider` (optional, as for
  :class:`~leasekit.backend.BackendProvider`): closing, refusal after closing and
  error mapping through the backend's own :class:`~leasekit.backend.ErrorMap`.

No second copy of the backend: the sync and async providers share the backend's
statements or scripts, option parsing, validation, error table and reply parsing
(each operation as "the request to send, and how to read the reply", driven by a
blocking or an asyncio connection), and differ only in which connection sends it.

Deadlines work differently without an event loop: a thread cannot be interrupted, so
the blocking provider bounds every call by ``timeout_s`` through its driver (socket
timeouts, a pool's wait, a statement timeout), and a stalled store then raises
:class:`~leasekit.LeaseBackendTimeout` as the async provider does. A driver without a
client-side read timeout (psycopg's blocking connection) uses :class:`SyncDeadlines`:
one watchdog thread per provider that, at an operation's deadline, breaks its
connection (shuts its socket down), so the blocked read fails at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol, TypeVar

from .._capabilities import Capabilities
from .._contract import LeaseResult
from .._errors import LeaseError, LeaseProviderClosed
from ._base import ProviderBase
from ._fork import (
    callers_client_in_child,
    keep_forever,
)

__all__ = [
    "SupportsSyncProvider",
    "SyncBackendProvider",
    "SyncDeadlines",
    "SyncProvider",
    "sync_factory",
]

_T = TypeVar("_T")
_S = TypeVar("_S", bound="SyncBackendProvider")


class SyncProvider(Protocol):
    """The blocking contract a native provider implements, safe to call from many threads.

    The five operations have the names, arguments, semantics and errors of
    :class:`leasekit.LeaseProvider`'s, and block until done. ``open()`` connects and
    checks the store (what ``async with`` does on the async side); ``close()`` is
    idempotent, after which operations raise :class:`~leasekit.LeaseProviderClosed`.
    Implementers need not inherit from this class: it is a structural protocol.
    """

    backend: str

    @property
    def capabilities(self) -> Capabilities:
        """The guarantees this backend declares (those of its async provider)."""
        ...

    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult: ...

    def get_lease_owner(self, key: str) -> str | None: ...

    def release_lease(self, key: str, owner: str) -> None: ...

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool: ...

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool: ...

    def open(self) -> object:
        """Connect and check the store now, so a wrong address shows up here."""
        ...

    def close(self) -> None:
        """Close the provider (and the client, if it built it); idempotent."""
        ...


class SupportsSyncProvider(Protocol):
    """A backend class that offers :mod:`leasekit.sync` a native blocking provider.

    ``sync_from_url`` takes what the backend's ``from_url`` takes and raises what it
    raises (:class:`~leasekit.InvalidLeaseArgument` for a bad URL or option), does no
    I/O, and returns a :class:`SyncProvider` that owns the client it built.
    """

    @classmethod
    def sync_from_url(cls, url: str, **options: Any) -> SyncProvider: ...


def sync_factory(backend_class: object) -> Callable[..., SyncProvider] | None:
    """The backend class's ``sync_from_url``, or ``None`` if it offers no native provider."""
    factory = getattr(backend_class, "sync_from_url", None)
    return factory if callable(factory) else None


class SyncBackendProvider(ProviderBase):
    """Base class for native blocking providers: closing and error mapping, once.

    Subclasses set :attr:`backend`, :attr:`capabilities` and :attr:`errors` (usually
    those of the backend's async provider class), call
    ``super().__init__(timeout_s=..., owns_client=...)``, implement the five
    operations around :meth:`_call`, and override :meth:`_connect`,
    :meth:`_close_client`, :meth:`_describe` and :meth:`_where` as needed.

    Every driver call must be bounded by ``timeout_s`` by the driver itself (socket
    timeouts, a pool's wait): :meth:`_call` maps what the driver raises, and a driver
    timeout becomes :class:`~leasekit.LeaseBackendTimeout` through :attr:`errors`.
    """

    def _after_fork_in_child(self) -> None:
        """In a forked child: take a new provider's state, keeping the parent's untouched.

        Runs before ``fork()`` returns in the child (see
        :func:`~leasekit.backend.on_fork_in_child`): building does no I/O. A provider
        on a caller's own client cannot be rebuilt and refuses to work from now on.
        """
        if self._closing:
            return
        rebuild = self._rebuild
        if rebuild is None:
            self._closing = True
            self._closed_reason = callers_client_in_child(self.backend)
            return
        try:
            fresh = rebuild()
        except Exception as exc:  # noqa: BLE001 (reported by every later call)
            self._closing = True
            self._closed_reason = f"{self.backend}: could not be rebuilt after fork(): {exc}"
            return
        fresh._rebuild = rebuild
        keep_forever(self.__dict__)  # the parent's connections and threads: never closed here
        self.__dict__ = fresh.__dict__

    # -- what subclasses override ---------------------------------------------------------

    def _connect(self) -> None:
        """Check the store at :meth:`open` (a PING, a schema check); run through ``_call``."""

    def _close_client(self) -> None:
        """Close the client the provider built; called by :meth:`close` only if it owns one."""

    # -- the call path --------------------------------------------------------------------

    def _refuse_if_closed(self) -> None:
        if self._closing:
            raise LeaseProviderClosed(self._closed_reason, backend=self.backend)

    def _call(self, send: Callable[..., _T], /, *args: Any, key: str | None = None) -> _T:
        """``send(*args)``: refused once closed, driver errors mapped through :attr:`errors`.

        A call that fails because :meth:`close` ran under it (from another thread)
        raises :class:`~leasekit.LeaseProviderClosed`, as on the async side.
        """
        if self._closing:
            raise LeaseProviderClosed(self._closed_reason, backend=self.backend)
        try:
            return send(*args)
        except self.errors.types as exc:
            if self._closing:
                raise LeaseProviderClosed(backend=self.backend) from exc
            raise self.errors.translate(exc, key=key, where=self._where()) from exc
        except LeaseError:
            raise
        except Exception as exc:
            # Whatever a driver raises from a client closed under the call (grpc's
            # ValueError "Channel closed!", say) means just that.
            if self._closing:
                raise LeaseProviderClosed(backend=self.backend) from exc
            raise

    # -- lifecycle ------------------------------------------------------------------------

    def open(self: _S) -> _S:
        """Connect and check the store now; closes the provider and raises on failure."""
        self._refuse_if_closed()
        try:
            self._call(self._connect)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Refuse new operations, then close the client if the provider built it.

        Idempotent and safe from any thread. An operation still running in another
        thread ends with its result or :class:`~leasekit.LeaseProviderClosed`. A
        caller's own client is never closed.
        """
        if self._closing:
            return
        self._closing = True
        if self._owns_client:
            # A connection already broken leaves nothing to close.
            with contextlib.suppress(*self.errors.types):
                self._close_client()

    def __enter__(self: _S) -> _S:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _Watch:
    """One blocking call in flight: its deadline, what breaks it, whether that ran."""

    __slots__ = ("closed", "deadline", "expired", "on_expire")

    def __init__(self, deadline: float, on_expire: Callable[[], object]) -> None:
        self.deadline = deadline
        self.on_expire = on_expire
        self.closed = False
        self.expired = False


class SyncDeadlines:
    """Bounds blocking calls by ``timeout_s`` with one watchdog thread, for drivers without.

    Every call of a provider has the same ``timeout_s``, so deadlines fall due in the
    order calls began: a FIFO and one thread sleeping until the oldest open one bound
    them all (the thread wakes about once per ``timeout_s`` under steady load, and
    starts on first use). :meth:`open` before the blocking call, with ``on_expire``
    that makes it fail promptly (shut the connection's socket down);
    :meth:`close` after it, which says whether the deadline fired, so the caller
    raises :class:`~leasekit.LeaseBackendTimeout` instead of the driver's error.
    ``on_expire`` runs on the watchdog thread and must not block.
    """

    __slots__ = ("_cond", "_open", "_stopped", "_thread", "timeout_s")

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._open: deque[_Watch] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._stopped = False

    def open(self, on_expire: Callable[[], object]) -> _Watch:
        """Start timing one call; ``on_expire()`` runs if it is still open at its deadline."""
        watch = _Watch(time.monotonic() + self.timeout_s, on_expire)
        with self._cond:
            idle = not self._open
            self._open.append(watch)
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(
                    target=self._watch, name="leasekit-deadlines", daemon=True
                )
                self._thread.start()
            elif idle:
                self._cond.notify()
        return watch

    @staticmethod
    def close(watch: _Watch) -> bool:
        """End timing ``watch``; True if its deadline fired (and ``on_expire`` ran or runs)."""
        watch.closed = True
        return watch.expired

    def stop(self) -> None:
        """End the watchdog thread (calls still open are no longer bounded by it)."""
        with self._cond:
            self._stopped = True
            thread = self._thread
            self._cond.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _watch(self) -> None:
        pending = self._open
        while True:
            due: list[_Watch] = []
            with self._cond:
                while not due:
                    if self._stopped:
                        return
                    while pending and pending[0].closed:
                        pending.popleft()
                    if not pending:
                        self._cond.wait()
                        continue
                    now = time.monotonic()
                    while pending and (pending[0].closed or pending[0].deadline <= now):
                        watch = pending.popleft()
                        if not watch.closed:
                            watch.expired = True
                            due.append(watch)
                    if not due and pending:
                        self._cond.wait(pending[0].deadline - now)
            for watch in due:
                # A driver that breaks while being broken: nothing more to do for it.
                with contextlib.suppress(Exception):
                    watch.on_expire()
