"""The blocking facade, :class:`SyncLeaseProvider`: the five operations, open and close.

It runs a native blocking provider in the calling thread, or an async one on a loop
thread (:mod:`leasekit.sync._loop`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, cast

from .. import _hooks
from .._capabilities import Capabilities, capabilities_of
from .._contract import LeaseProvider, LeaseResult, metadata_for
from .._errors import BackendLacksCapability, LeaseProviderClosed
from .._slots import SlotResult
from ..backend._fair import SupportsFairWaiting
from ..backend._fork import keep_forever, on_fork_in_child
from ..backend._records import (
    LeaseRecord,
    SupportsInspect,
    SupportsRecords,
    SupportsReleaseReport,
    supports,
)
from ..backend._slots import SupportsSlots
from ..backend._sync import SyncProvider
from ._loop import LoopThread, stop_abandoned

__all__ = ["SyncLeaseProvider", "facade_of"]

_T = TypeVar("_T")
_P = ParamSpec("_P")


class SyncLeaseProvider:
    """A blocking lease provider over any async one, safe to share between threads.

    Made by :func:`connect` or :func:`wrap`. The five contract operations have the
    same names, arguments and semantics as on :class:`leasekit.LeaseProvider`, and
    block the calling thread until done; errors are the same leasekit errors. Use it
    as a context manager, or call :meth:`close`. After closing, operations raise
    :class:`leasekit.LeaseProviderClosed`.
    """

    def __init__(
        self,
        build: Callable[[], Awaitable[LeaseProvider]],
        *,
        owns_provider: bool,
        thread_name: str = "leasekit-sync",
        native: SyncProvider | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._closed = False
        self._owns = owns_provider
        self._opened = False
        self._holds: set[asyncio.Task[None]] = set()
        self._build = build
        self._thread_name = thread_name
        self._native = native
        self._runner: LoopThread | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._async_provider: LeaseProvider | None = None
        if native is not None:
            self.backend: str = native.backend
        else:
            # The loop path builds the provider now, so a bad URL raises here.
            self._loop_runner()
            self.backend = _hooks.backend_name(self._async_provider)
        on_fork_in_child(self)

    def _after_fork_in_child(self) -> None:
        """In a forked child: forget the parent's loop thread, its holds and its locks.

        The thread does not exist here, and its loop's wake-up pipe is shared with the
        parent: both are kept untouched, and the next call that needs a loop starts one
        of the child's own. The async provider stays: it builds itself anew on that
        loop (:class:`leasekit.backend.BackendProvider`); the native provider did so
        already. Leases the parent holds in :func:`hold` stay the parent's.
        """
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        if self._finalizer is not None:
            self._finalizer.detach()  # its callback would wake the parent's loop
            self._finalizer = None
        if self._runner is not None:
            keep_forever(self._runner)
            self._runner = None
        self._holds = set()

    def _loop_runner(self) -> LoopThread:
        """The loop thread, started (and the async provider built on it) on first need."""
        runner = self._runner
        if runner is not None:
            return runner
        with self._start_lock:
            if self._runner is None:
                if self._closed:
                    raise LeaseProviderClosed(backend=getattr(self, "backend", "sync"))
                runner = LoopThread(self._thread_name)
                finalizer = weakref.finalize(self, stop_abandoned, runner.loop)
                if self._async_provider is not None:
                    # A forked child: the provider was built (and opened) in the parent.
                    self._finalizer = finalizer
                    self._runner = runner
                    return runner
                try:
                    built = asyncio.run_coroutine_threadsafe(_call(self._build), runner.loop)
                    self._async_provider = provider = self._wait(built)
                    enter = getattr(provider, "__aenter__", None)
                    if self._native is not None and self._owns and enter is not None:
                        # Built for a native facade, which is open: open it too, as
                        # `with` opens the loop path's provider.
                        opened = asyncio.run_coroutine_threadsafe(_call(enter), runner.loop)
                        self._wait(opened)
                except BaseException:
                    finalizer.detach()
                    runner.stop()
                    raise
                self._finalizer = finalizer
                self._runner = runner
            return self._runner

    @property
    def native(self) -> bool:
        """True when the five operations run on the backend's own blocking client.

        Then no thread is started for them; :meth:`run`, :attr:`provider`,
        :func:`hold`, :func:`wait_for` and :func:`watch_owner` still use the async
        provider, built on a loop thread the first time one of them is called.
        """
        return self._native is not None

    @property
    def provider(self) -> LeaseProvider:
        """The async provider underneath; use it only on this facade's loop (see :meth:`run`).

        On a native facade, the first access starts the loop thread and builds it.
        """
        self._loop_runner()
        assert self._async_provider is not None
        return self._async_provider

    @property
    def capabilities(self) -> Capabilities:
        """The provider's declared capabilities."""
        if self._native is not None:
            return self._native.capabilities
        return capabilities_of(self.provider)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has begun."""
        return self._closed

    # -- running on the loop ---------------------------------------------------------------

    def _submit(
        self, coro: Coroutine[Any, Any, _T], *, internal: bool = False
    ) -> concurrent.futures.Future[_T]:
        try:
            runner = self._loop_runner()
        except BaseException:
            coro.close()
            raise
        if runner.in_loop_thread():
            coro.close()
            raise RuntimeError(
                "a leasekit.sync call was made from the facade's own event-loop thread "
                "(from a hook?); it would wait for itself forever"
            )
        # Submitting under the lock orders every submission before close() stops the
        # loop, so no call is queued on a loop that will never run it.
        with self._lock:
            if self._closed and not internal:
                coro.close()
                raise LeaseProviderClosed(backend=getattr(self, "backend", "sync"))
            return asyncio.run_coroutine_threadsafe(coro, runner.loop)

    def _wait(self, future: concurrent.futures.Future[_T]) -> _T:
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            # Cancelled by close() from another thread, or by a Ctrl-C in this one.
            raise LeaseProviderClosed(backend=getattr(self, "backend", "sync")) from None
        except BaseException:
            future.cancel()  # KeyboardInterrupt while waiting: stop the operation too
            raise

    def _run_coroutine(self, coro: Coroutine[Any, Any, _T], *, internal: bool = False) -> _T:
        return self._wait(self._submit(coro, internal=internal))

    def run(self, fn: Callable[_P, Awaitable[_T]], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run ``await fn(*args, **kwargs)`` on the facade's loop and return its result.

        For what the facade does not wrap, such as a backend's extras:
        ``leases.run(leases.provider.inspect)`` on SQLite.
        """
        return self._run_coroutine(_call(fn, *args, **kwargs))

    # -- the contract ----------------------------------------------------------------------

    def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, metadata: bytes | str | None = None
    ) -> LeaseResult:
        """Blocking :meth:`leasekit.LeaseProvider.acquire_lease`.

        ``metadata`` is stored with the grant on a backend with ``Capabilities.metadata``
        (else :class:`~leasekit.BackendLacksCapability`, before any I/O).
        """
        native = self._native
        if metadata is not None:
            data = metadata_for(self, metadata)
            if native is not None:
                return native.acquire_lease(key, owner, ttl_ms, metadata=data)  # type: ignore[call-arg]
            acquire: Callable[..., Awaitable[LeaseResult]] = self.provider.acquire_lease
            return self.run(acquire, key, owner, ttl_ms, metadata=data)
        if native is not None:
            return native.acquire_lease(key, owner, ttl_ms)
        return self.run(self.provider.acquire_lease, key, owner, ttl_ms)

    def get_lease_owner(self, key: str) -> str | None:
        """Blocking :meth:`leasekit.LeaseProvider.get_lease_owner`."""
        native = self._native
        if native is not None:
            return native.get_lease_owner(key)
        return self.run(self.provider.get_lease_owner, key)

    def release_lease(self, key: str, owner: str) -> None:
        """Blocking :meth:`leasekit.LeaseProvider.release_lease`."""
        native = self._native
        if native is not None:
            return native.release_lease(key, owner)
        return self.run(self.provider.release_lease, key, owner)

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`leasekit.LeaseProvider.renew_lease`."""
        native = self._native
        if native is not None:
            return native.renew_lease(key, owner, ttl_ms)
        return self.run(self.provider.renew_lease, key, owner, ttl_ms)

    def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int,
        *,
        metadata: bytes | str | None = None,
    ) -> bool:
        """Blocking :meth:`leasekit.LeaseProvider.transfer_lease`; ``metadata`` replaces
        the holder's, for the new owner (``Capabilities.metadata``)."""
        native = self._native
        if metadata is not None:
            data = metadata_for(self, metadata)
            if native is not None:
                return native.transfer_lease(key, from_owner, to_owner, ttl_ms, metadata=data)  # type: ignore[call-arg]
            transfer: Callable[..., Awaitable[bool]] = self.provider.transfer_lease
            return self.run(transfer, key, from_owner, to_owner, ttl_ms, metadata=data)
        if native is not None:
            return native.transfer_lease(key, from_owner, to_owner, ttl_ms)
        return self.run(self.provider.transfer_lease, key, from_owner, to_owner, ttl_ms)

    # -- optional extras -------------------------------------------------------------------

    def _extra(self, protocol: type, method: str) -> Callable[..., Any] | None:
        """The blocking provider's ``method``, else the async provider's on the loop thread."""
        native = self._native
        if native is not None:
            found = getattr(native, method, None)
            if callable(found):
                return cast("Callable[..., Any]", found)
        provider = self.provider
        if supports(provider, protocol):
            bound: Callable[..., Awaitable[Any]] = getattr(provider, method)
            return lambda *args, **kwargs: self.run(bound, *args, **kwargs)
        return None

    def _lacks(self, method: str, what: str) -> BackendLacksCapability:
        return BackendLacksCapability(
            f"backend {self.backend!r} has no {what} ({method})",
            backend=self.backend,
            missing=(method,),
        )

    @property
    def reports_releases(self) -> bool:
        """Whether :meth:`release_if_held` is available on this backend."""
        return self._extra(SupportsReleaseReport, "release_if_held") is not None

    def release_if_held(self, key: str, owner: str) -> bool:
        """Release ``key`` if ``owner`` holds it live, in one atomic step; True if it did.

        Blocking :meth:`leasekit.backend.SupportsReleaseReport.release_if_held`: the
        contract's ``release_lease`` says nothing back, and asking the owner first races
        with expiry. :class:`~leasekit.BackendLacksCapability` on a backend without it
        (:attr:`reports_releases`).
        """
        method = self._extra(SupportsReleaseReport, "release_if_held")
        if method is None:
            raise self._lacks("release_if_held", "atomic release that says whether it released")
        return bool(method(key, owner))

    def get_lease_record(self, key: str) -> LeaseRecord | None:
        """Blocking :meth:`leasekit.backend.SupportsRecords.get_lease_record`: owner, token,
        metadata and time left of the live lease of ``key`` in one round trip, or ``None``.

        :class:`~leasekit.BackendLacksCapability` on a backend that cannot read records.
        """
        method = self._extra(SupportsRecords, "get_lease_record")
        if method is None:
            raise self._lacks("get_lease_record", "way to read a lease's record")
        record: LeaseRecord | None = method(key)
        return record

    def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """Blocking :meth:`leasekit.backend.SupportsInspect.inspect`: live leases in key order.

        :class:`~leasekit.BackendLacksCapability` on a backend that cannot list its leases.
        """
        method = self._extra(SupportsInspect, "inspect")
        if method is None:
            raise self._lacks("inspect", "way to list its leases")
        records: list[LeaseRecord] = method(prefix, limit=limit)
        return records

    def acquire_lease_in_turn(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        *,
        place_ttl_ms: int,
        metadata: bytes | str | None = None,
    ) -> LeaseResult:
        """Blocking :meth:`leasekit.backend.SupportsFairWaiting.acquire_lease_in_turn`."""
        method = self._extra(SupportsFairWaiting, "acquire_lease_in_turn")
        if method is None:
            raise self._lacks("acquire_lease_in_turn", "line of waiters (fair waiting)")
        if metadata is None:
            result: LeaseResult = method(key, owner, ttl_ms, place_ttl_ms=place_ttl_ms)
        else:
            data = metadata_for(self, metadata)
            result = method(key, owner, ttl_ms, place_ttl_ms=place_ttl_ms, metadata=data)
        return result

    # -- counting leases (SupportsSlots) ---------------------------------------------------

    def _slots(self, method: str) -> Callable[..., Any]:
        found = self._extra(SupportsSlots, method)
        if found is None:
            raise self._lacks(method, "counting leases")
        return found

    def acquire_slot(
        self, key: str, owner: str, ttl_ms: int, *, limit: int, exclusive: bool = False
    ) -> SlotResult:
        """Blocking :meth:`leasekit.backend.SupportsSlots.acquire_slot`: one of ``limit`` slots."""
        method = self._slots("acquire_slot")
        if exclusive is False:  # as the backend's own default
            result: SlotResult = method(key, owner, ttl_ms, limit=limit)
        else:
            result = method(key, owner, ttl_ms, limit=limit, exclusive=exclusive)
        return result

    def renew_slot(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`leasekit.backend.SupportsSlots.renew_slot`."""
        return bool(self._slots("renew_slot")(key, owner, ttl_ms))

    def release_slot(self, key: str, owner: str) -> bool:
        """Blocking :meth:`leasekit.backend.SupportsSlots.release_slot`."""
        return bool(self._slots("release_slot")(key, owner))

    def transfer_slot(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`leasekit.backend.SupportsSlots.transfer_slot`."""
        return bool(self._slots("transfer_slot")(key, from_owner, to_owner, ttl_ms))

    def get_slot_holders(self, key: str) -> list[LeaseRecord]:
        """Blocking :meth:`leasekit.backend.SupportsSlots.get_slot_holders`."""
        records: list[LeaseRecord] = self._slots("get_slot_holders")(key)
        return records

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> SyncLeaseProvider:
        """Open the provider's connections now (what ``with`` does); returns self.

        Only for providers the facade owns (from :func:`connect`); for a wrapped
        provider the caller opens and closes it.
        """
        if self._owns and not self._opened:
            if self._native is not None:
                if self._closed:
                    raise LeaseProviderClosed(backend=self.backend)
                self._native.open()
            else:
                enter = getattr(self.provider, "__aenter__", None)
                if enter is not None:
                    self.run(enter)
            self._opened = True
        return self

    def close(self) -> None:
        """Stop every hold, close the provider (if the facade owns it), stop the thread.

        Leases still held in :func:`hold` blocks of other threads are released first
        and those holds are marked lost. Idempotent; safe from any thread but the
        facade's own loop thread.
        """
        runner = self._runner
        if runner is not None and runner.in_loop_thread():
            raise RuntimeError("close() cannot run on the facade's own event-loop thread")
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self._native is not None and self._owns:
                self._native.close()
        finally:
            # No loop thread starts from now on (_loop_runner sees _closed); one that
            # is starting has finished once this lock is ours.
            with self._start_lock:
                runner = self._runner
            if runner is not None:
                try:
                    self._run_coroutine(self._shutdown(), internal=True)
                finally:
                    if self._finalizer is not None:
                        self._finalizer.detach()
                    runner.stop()

    async def _shutdown(self) -> None:
        holds = list(self._holds)
        for task in holds:
            task.cancel()
        if holds:
            await asyncio.wait(holds)
        if self._owns:
            close = getattr(self._async_provider, "aclose", None)
            if close is not None:
                await close()

    def __enter__(self) -> SyncLeaseProvider:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        inner = self._native if self._native is not None else self._async_provider
        return f"<SyncLeaseProvider {inner!r}{state}>"


async def _call(fn: Callable[..., Awaitable[_T]], *args: Any, **kwargs: Any) -> _T:
    # Even calling fn happens on the loop: a provider method may do work before its
    # first await, or be a plain function returning an awaitable.
    return await fn(*args, **kwargs)


def facade_of(provider: object) -> SyncLeaseProvider:
    if not isinstance(provider, SyncLeaseProvider):
        raise TypeError(
            f"expected a leasekit.sync facade, got {type(provider).__name__}; make one with "
            "leasekit.sync.connect(url) or leasekit.sync.wrap(async_provider)"
        )
    return provider
