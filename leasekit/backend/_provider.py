"""``BackendProvider``: the lifecycle, deadline and error path every backend shares.

A backend subclasses it and keeps only its atomic mechanism: statements or scripts,
reply parsing and capabilities. What it gets:

- ``async with`` (connect-and-check through :meth:`BackendProvider._connect`) and an
  idempotent :meth:`~BackendProvider.aclose` that refuses new operations at once, lets
  the ones in flight finish (each is bounded by ``timeout_s``, so that takes at most
  ``timeout_s``), drains background work, and only then closes the client, and only
  when the provider built it. No caller ever sees a bare ``CancelledError`` that
  nobody asked for, and no server connection is left open.
- :meth:`~BackendProvider._call`: the one way a backend awaits its driver. It refuses
  calls on a closed provider, bounds the call by ``timeout_s`` on the provider's single
  timer (:class:`~leasekit.backend.Deadlines`), and maps the driver's errors through
  the class's :attr:`~BackendProvider.errors` table.
- :meth:`~BackendProvider._call_detached` for drivers that cannot be cancelled
  promptly: the call runs in its own task and is abandoned at the deadline.
- :meth:`~BackendProvider._spawn` for background work (a sweep, a revoke) that
  ``aclose`` drains within ``timeout_s``.
- a ``repr`` built from :meth:`~BackendProvider._describe`, which must hold no secret
  (use :func:`~leasekit.backend.redact_url`).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Coroutine
from types import TracebackType
from typing import Any, ClassVar, TypeVar

from .._capabilities import Capabilities
from .._errors import LeaseBackendTimeout, LeaseProviderClosed
from ._deadlines import Deadlines, Overdue
from ._errors import ErrorMap

__all__ = ["BackendProvider"]

_T = TypeVar("_T")
_P = TypeVar("_P", bound="BackendProvider")

# aclose() gives background work and the client's own close at least this long, even
# when operations in flight used up the whole timeout.
_CLOSE_FLOOR_S = 0.2


class BackendProvider:
    """Base class for lease backends: lifecycle, deadlines and error mapping, once.

    Subclasses set :attr:`backend` (the name in messages), :attr:`capabilities` (on the
    class, what the backend can promise; an instance may narrow it, for instance when
    an option turns notifications off) and :attr:`errors` (an
    :class:`~leasekit.backend.ErrorMap`), call
    ``super().__init__(timeout_s=..., owns_client=...)``, implement the five contract
    methods with :meth:`_call`, and override :meth:`_connect`, :meth:`_close_client`,
    :meth:`_describe` and :meth:`_where` as needed. Inheriting is optional for a
    backend: leasekit detects providers structurally; this class is a convenience.
    """

    backend: ClassVar[str] = "backend"
    capabilities: Capabilities = Capabilities()
    errors: ClassVar[ErrorMap] = ErrorMap({}, backend="backend")

    def __init__(self, *, timeout_s: float, owns_client: bool) -> None:
        self.timeout_s = timeout_s
        self._owns_client = owns_client
        self._deadlines = Deadlines(timeout_s)
        self._closing = False
        self._inflight = 0
        self._drained: asyncio.Future[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._abandoned: set[asyncio.Future[Any]] = set()

    # -- what subclasses override ---------------------------------------------------------

    async def _connect(self) -> None:
        """Check the store at ``async with`` (a PING, a schema check); bounded by ``_call``."""

    async def _close_client(self) -> None:
        """Close the client the provider built; called by ``aclose`` only if it owns one."""

    def _describe(self) -> str:
        """What ``repr`` shows inside the parentheses; never a password."""
        return ""

    def _where(self) -> str:
        """Appended to error messages, such as ``" (server host:6379)"``; never a secret."""
        return ""

    # -- the call path --------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` has begun: every new operation raises."""
        return self._closing

    def _refuse_if_closed(self) -> None:
        if self._closing:
            raise LeaseProviderClosed(backend=self.backend)

    def _timeout(self, key: str | None) -> LeaseBackendTimeout:
        return LeaseBackendTimeout(
            f"no answer within {self.timeout_s:g} s{self._where()}", backend=self.backend, key=key
        )

    async def _call(self, awaitable: Awaitable[_T], key: str | None = None) -> _T:
        """Await one driver call: refused once closed, bounded by ``timeout_s``, errors mapped.

        The deadline cancels the call (the driver must unwind promptly when cancelled)
        and raises :class:`~leasekit.LeaseBackendTimeout`; a cancellation from
        elsewhere propagates unchanged. Driver errors become leasekit's through
        :attr:`errors`, with the driver's exception chained.
        """
        if self._closing:
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # never started: no "was never awaited" warning
            raise LeaseProviderClosed(backend=self.backend)
        deadlines = self._deadlines
        watch = deadlines.open()
        self._inflight += 1
        try:
            if watch is None:  # Python 3.10, or called outside a task
                return await asyncio.wait_for(awaitable, self.timeout_s)
            return await awaitable
        except asyncio.CancelledError:
            if deadlines.close(watch):
                raise self._timeout(key) from None
            raise
        except self.errors.types as exc:
            raise self.errors.translate(exc, key=key, where=self._where()) from exc
        finally:
            deadlines.close(watch)
            self._inflight -= 1
            if not self._inflight and self._drained is not None and not self._drained.done():
                self._drained.set_result(None)

    async def _call_detached(
        self, coroutine: Coroutine[Any, Any, _T], key: str | None = None
    ) -> _T:
        """Run ``coroutine`` in its own task; at the deadline, raise without waiting for it.

        The abandoned task is cancelled and finishes in the background (``aclose``
        waits for it within ``timeout_s``); its outcome is discarded. For drivers whose
        cancellation waits on the server, or a thread that cannot be interrupted.
        """
        if self._closing:
            coroutine.close()
            raise LeaseProviderClosed(backend=self.backend)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[_T] = loop.create_future()
        task = loop.create_task(_settle(coroutine, waiter))
        watch = self._deadlines.start(waiter)
        self._inflight += 1
        try:
            return await waiter
        except Overdue:
            self._abandon(task)
            raise self._timeout(key) from None
        except self.errors.types as exc:
            raise self.errors.translate(exc, key=key, where=self._where()) from exc
        except BaseException:
            if not task.done():
                self._abandon(task)  # the caller was cancelled: so is the call
            raise
        finally:
            self._deadlines.close(watch)
            self._inflight -= 1
            if not self._inflight and self._drained is not None and not self._drained.done():
                self._drained.set_result(None)

    def _abandon(self, future: asyncio.Future[Any]) -> None:
        """Cancel a call nobody waits for any more; ``aclose`` waits for it to settle."""
        future.cancel()
        self._abandoned.add(future)
        future.add_done_callback(self._abandoned.discard)
        future.add_done_callback(_consume_outcome)

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run background work that ``aclose`` drains (then cancels) within ``timeout_s``."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_consume_outcome)
        return task

    # -- lifecycle ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the provider; idempotent, and done within about ``timeout_s``.

        New operations raise :class:`~leasekit.LeaseProviderClosed` at once. Operations
        in flight finish with their result or their own error (each is bounded by
        ``timeout_s``); background work and abandoned calls are then given what is
        left of ``timeout_s`` before they are cancelled; last, the client is closed if
        the provider built it. A caller's own client is never closed.
        """
        if self._closing:
            return
        self._closing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        if self._inflight:
            self._drained = loop.create_future()
            await asyncio.wait((self._drained,), timeout=self.timeout_s + _CLOSE_FLOOR_S)
        for pending in (self._background, self._abandoned):
            if pending:
                left = max(deadline - loop.time(), _CLOSE_FLOOR_S)
                _, late = await asyncio.wait(set(pending), timeout=left)
                for future in late:
                    future.cancel()
                if late:
                    await asyncio.wait(late, timeout=_CLOSE_FLOOR_S)
        if self._owns_client:
            left = max(deadline - loop.time(), _CLOSE_FLOOR_S)
            try:
                await asyncio.wait_for(self._close_client(), left)
            except (TimeoutError, asyncio.TimeoutError):
                pass  # the server stopped answering; its sockets close with the process
            except self.errors.types:
                pass  # the connection was already broken: nothing left to close

    async def __aenter__(self: _P) -> _P:
        """Connect and check the store now, so a wrong address shows up at the ``async with``."""
        self._refuse_if_closed()
        try:
            await self._call(self._connect(), None)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        parts = [self._describe()] + (["closed"] if self._closing else [])
        return f"{type(self).__name__}({', '.join(part for part in parts if part)})"


async def _settle(coroutine: Coroutine[Any, Any, _T], waiter: asyncio.Future[_T]) -> None:
    """Run a detached call and hand its outcome to whoever still waits for it."""
    try:
        result = await coroutine
    except asyncio.CancelledError:
        if not waiter.done():
            waiter.cancel()
        raise
    except Exception as exc:  # noqa: BLE001 (handed to the waiting caller, who raises it)
        if not waiter.done():
            waiter.set_exception(exc)
    else:
        if not waiter.done():
            waiter.set_result(result)


def _consume_outcome(future: asyncio.Future[Any]) -> None:
    # An abandoned call's error was already reported as a timeout; retrieve it so
    # asyncio does not log "exception was never retrieved".
    if not future.cancelled():
        future.exception()
