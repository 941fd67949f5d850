"""The blocking API, for code without an event loop: Flask views, Celery tasks, scripts.

::

    with leasekit.sync.connect("sqlite:///leases.db") as leases:
        result = leases.acquire_lease("thread-42", owner, ttl_ms=30_000)

A facade (:class:`SyncLeaseProvider`) drives the backend one of two ways. Where the
backend offers a native blocking provider (:class:`leasekit.backend.SupportsSyncProvider`:
Redis, PostgreSQL, SQLite), the five operations run on the driver's own blocking client in
the calling thread, with no thread hop; that provider shares the backend's scripts
or statements, options, validation, errors and reply parsing with its async one.
Otherwise (and for :func:`wrap`, ``native=False``, or while an event plugin is
registered) the facade runs one event loop in one background thread and runs the
async provider there; each blocking call submits one coroutine to that loop and
waits for it. Nothing is written twice either way: :func:`hold` is
:func:`leasekit.hold` running on the facade's loop (started on first use on a native
facade). Any number of threads may share one facade.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypeVar, cast

from . import _hooks
from ._capabilities import Capabilities, capabilities_of
from ._contract import LeaseProvider, LeaseResult
from ._errors import (
    BackendLacksCapability,
    BackendUnavailable,
    InvalidLeaseArgument,
    LeaseLost,
    LeaseProviderClosed,
)
from ._hold import LeaseHold
from ._registry import BackendRegistry, _validate_require, scheme_of
from ._waiting import DEFAULT_MAX_POLL_S, DEFAULT_POLL_S
from ._waiting import wait_for as _async_wait_for
from ._watch import watch_owner as _async_watch_owner
from .backend._fork import keep_forever, on_fork_in_child
from .backend._sync import SyncProvider, sync_factory

__all__ = [
    "SyncLeaseHold",
    "SyncLeaseProvider",
    "SyncOnLost",
    "connect",
    "elect",
    "hold",
    "leaders",
    "wait_for",
    "watch_owner",
    "wrap",
]

_T = TypeVar("_T")
_P = ParamSpec("_P")

SyncOnLost = Literal["flag", "raise"]
"""What :func:`hold` does on loss: set ``.lost`` only, or also raise on leaving the block."""


class _LoopThread:
    """One event loop running forever in one daemon thread, until stop()."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                # Whatever still runs (a hold's task, a call racing close()) is
                # cancelled and awaited, so its cleanup runs here and not never.
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self.thread

    def stop(self) -> None:
        """Stop the loop and wait for the thread (after its cleanup) to end."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


def _stop_abandoned(loop: asyncio.AbstractEventLoop) -> None:
    # A facade garbage-collected without close(): let its thread end rather than run
    # an idle loop until the process exits. Its provider is left unclosed.
    if not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)


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
        self._runner: _LoopThread | None = None
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

    def _loop_runner(self) -> _LoopThread:
        """The loop thread, started (and the async provider built on it) on first need."""
        runner = self._runner
        if runner is not None:
            return runner
        with self._start_lock:
            if self._runner is None:
                if self._closed:
                    raise LeaseProviderClosed(backend=getattr(self, "backend", "sync"))
                runner = _LoopThread(self._thread_name)
                finalizer = weakref.finalize(self, _stop_abandoned, runner.loop)
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

    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        """Blocking :meth:`leasekit.LeaseProvider.acquire_lease`."""
        native = self._native
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

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Blocking :meth:`leasekit.LeaseProvider.transfer_lease`."""
        native = self._native
        if native is not None:
            return native.transfer_lease(key, from_owner, to_owner, ttl_ms)
        return self.run(self.provider.transfer_lease, key, from_owner, to_owner, ttl_ms)

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


def connect(
    url: str,
    *,
    require: Iterable[str] | str = (),
    thread_name: str | None = None,
    native: bool = True,
    **options: Any,
) -> SyncLeaseProvider:
    """The blocking twin of :func:`leasekit.connect`: a facade owning a new provider.

    Where the backend offers a native blocking provider (Redis, PostgreSQL, SQLite:
    :class:`leasekit.backend.SupportsSyncProvider`), the five operations run on the
    driver's own blocking client in the calling thread, with no thread hop; other
    backends (and every backend while an event plugin is registered, so that events
    fire, or with ``native=False``) run the async provider on a loop thread named
    ``thread_name``. Either way the provider is opened by ``with`` (or
    :meth:`SyncLeaseProvider.open`, or lazily by the first operation), and
    :func:`connect` raises what :func:`leasekit.connect` raises.
    """
    import leasekit  # noqa: PLC0415 (leasekit/__init__ imports us lazily)

    name = thread_name or f"leasekit-sync {url}"

    async def build() -> LeaseProvider:
        return leasekit.connect(url, require=require, **options)

    blocking = _native_provider(leasekit._registry, url, require, options) if native else None
    return SyncLeaseProvider(build, owns_provider=True, thread_name=name, native=blocking)


def _native_provider(
    registry: BackendRegistry,
    url: str,
    require: Iterable[str] | str,
    options: dict[str, Any],
) -> SyncProvider | None:
    """The backend's native blocking provider for ``url``, or ``None`` to use the loop."""
    if _hooks.relay() is not None:
        return None  # events are emitted around the async provider's operations
    scheme = scheme_of(url)
    wanted = _validate_require(require)
    factory = sync_factory(registry.load(scheme))
    if factory is None:
        return None
    provider: object = factory(url, **options)
    needed = (*_OPERATIONS, "open", "close")
    if not all(callable(getattr(provider, method, None)) for method in needed):
        raise BackendUnavailable(
            f"backend {scheme!r} returned {type(provider).__name__} from sync_from_url, "
            f"which is not a blocking lease provider with open() and close()",
            scheme=scheme,
        )
    blocking = cast("SyncProvider", provider)
    missing = tuple(name for name in wanted if not getattr(blocking.capabilities, name))
    if missing:
        blocking.close()  # sync_from_url does no I/O; this only drops the client
        raise BackendLacksCapability(backend=scheme, missing=missing)
    return blocking


_OPERATIONS = (
    "acquire_lease",
    "get_lease_owner",
    "release_lease",
    "renew_lease",
    "transfer_lease",
)


def wrap(
    provider: LeaseProvider, *, close: bool = False, thread_name: str = "leasekit-sync"
) -> SyncLeaseProvider:
    """A blocking facade over an existing async ``provider``.

    The provider then runs on the facade's loop thread: it must not be bound to another
    event loop (most providers bind on first use, so hand it over unused). The
    facade opens and closes it only with ``close=True``.
    """

    async def build() -> LeaseProvider:
        return provider

    return SyncLeaseProvider(build, owns_provider=close, thread_name=thread_name)


def _facade(provider: object) -> SyncLeaseProvider:
    if not isinstance(provider, SyncLeaseProvider):
        raise TypeError(
            f"expected a leasekit.sync facade, got {type(provider).__name__}; make one with "
            "leasekit.sync.connect(url) or leasekit.sync.wrap(async_provider)"
        )
    return provider


def wait_for(
    provider: SyncLeaseProvider,
    key: str,
    owner: str,
    ttl_ms: int,
    timeout_s: float | None,
    *,
    poll_s: float = DEFAULT_POLL_S,
    max_poll_s: float = DEFAULT_MAX_POLL_S,
) -> LeaseResult:
    """The blocking :func:`leasekit.wait_for`: poll until acquired, or raise ``LeaseHeld``."""
    facade = _facade(provider)
    return facade.run(
        _async_wait_for,
        facade.provider,
        key,
        owner,
        ttl_ms,
        timeout_s,
        poll_s=poll_s,
        max_poll_s=max_poll_s,
    )


class SyncLeaseHold:
    """A lease held by :func:`hold`, renewed on the facade's loop while the block runs.

    ``key``, ``owner``, ``ttl_ms``, ``safety_margin_ms``, ``token``, ``lost_reason``,
    ``transferred_to``, ``valid_until`` and ``remaining()`` are those of the underlying
    :class:`leasekit.LeaseHold`; ``lost`` is a :class:`threading.Event`, set from the
    loop thread the moment the lease is lost: at the latest at ``valid_until``, a
    safety margin before the store can give the key to anyone else.
    """

    def __init__(self, facade: SyncLeaseProvider, lease: LeaseHold, on_lost: SyncOnLost) -> None:
        self._facade = facade
        self._lease = lease
        self.on_lost = on_lost
        self.lost = threading.Event()
        lease._add_lost_callback(self.lost.set)
        self._closed_by_facade = False
        self._release: asyncio.Event | None = None
        self._done: concurrent.futures.Future[None] | None = None
        self._pid = os.getpid()

    @property
    def key(self) -> str:
        """The lease key."""
        return self._lease.key

    @property
    def owner(self) -> str:
        """The holder's owner id."""
        return self._lease.owner

    @property
    def ttl_ms(self) -> int:
        """The TTL the grant and each renewal set."""
        return self._lease.ttl_ms

    @property
    def token(self) -> int | None:
        """The fencing token of the grant (``None`` on a backend without fencing)."""
        return self._lease.token

    @property
    def safety_margin_ms(self) -> int:
        """How long before the TTL, counted from the last renewal, the holder stops believing."""
        return self._lease.safety_margin_ms

    @property
    def valid_until(self) -> float:
        """The deadline on :func:`time.monotonic`; see :attr:`leasekit.LeaseHold.valid_until`."""
        return self._lease.valid_until

    def remaining(self) -> float:
        """Seconds the lease is still believed held (``0.0`` once lost or ended).

        Safe from any thread. A blocking body checks it (or ``lost``) right before each
        side effect: the loop thread sets ``lost`` at the deadline, but cannot stop a
        call the body is already in.
        """
        return self._lease.remaining()

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost (see :class:`leasekit.LeaseHold`), ``"closed"`` if the
        facade was closed under the hold, or ``None``."""
        if self._closed_by_facade:
            return "closed"
        if self._pid != os.getpid():
            return "forked"
        return self._lease.lost_reason

    @property
    def transferred_to(self) -> str | None:
        """The owner the lease was handed to by :meth:`transfer_to`, if any."""
        return self._lease.transferred_to

    async def _hold_until_released(self, entered: concurrent.futures.Future[None]) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._facade._holds.add(task)
        release = self._release = asyncio.Event()
        try:
            async with self._lease:
                entered.set_result(None)
                await release.wait()
        except asyncio.CancelledError:
            if entered.done():
                self._closed_by_facade = True
                self.lost.set()
            raise
        except Exception as exc:
            if not entered.done():
                entered.set_exception(exc)
                return
            raise
        finally:
            self._facade._holds.discard(task)

    def __enter__(self) -> SyncLeaseHold:
        if self._done is not None:
            raise RuntimeError("a SyncLeaseHold is entered once; call leasekit.sync.hold() again")
        self._pid = os.getpid()
        entered: concurrent.futures.Future[None] = concurrent.futures.Future()
        done = self._done = self._facade._submit(self._hold_until_released(entered))
        try:
            concurrent.futures.wait([entered, done], return_when=concurrent.futures.FIRST_COMPLETED)
            if not entered.done():
                self._facade._wait(done)  # raises: it ended before acquiring
                raise LeaseProviderClosed(backend=self._facade.backend)  # pragma: no cover
            entered.result()
        except BaseException:
            done.cancel()  # a Ctrl-C while acquiring: give up (a lease got is released)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        done = self._done
        release = self._release
        if done is None or release is None:
            return
        if self._pid != os.getpid():
            # A forked child leaving a block the parent entered: the lease is the
            # parent's, renewed and released by the parent; this process never held it.
            self.lost.set()
            return
        loop = self._facade._loop_runner().loop
        if not done.done():
            # RuntimeError: the loop already shut down, the facade was closed under us.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(release.set)
        try:
            self._facade._wait(done)
        except LeaseProviderClosed:
            pass  # closed under us: already released (or left to expire) and flagged lost
        except Exception:
            if exc_type is None:
                raise  # the release failed, and nothing else is being reported
        if self.on_lost == "raise" and self.lost.is_set() and exc_type is None:
            raise LeaseLost(key=self.key, owner=self.owner, reason=self.lost_reason)

    def transfer_to(self, next_owner: str, ttl_ms: int | None = None) -> None:
        """Hand the lease to ``next_owner``; see :meth:`leasekit.LeaseHold.transfer_to`."""
        self._facade.run(self._lease.transfer_to, next_owner, ttl_ms)

    def __repr__(self) -> str:
        return repr(self._lease).replace("<LeaseHold", "<SyncLeaseHold", 1)


def hold(
    provider: SyncLeaseProvider,
    key: str,
    owner: str,
    ttl_ms: int,
    *,
    renew_every_ms: int | None = None,
    safety_margin_ms: int | None = None,
    on_lost: SyncOnLost = "flag",
    wait_s: float | None = 0.0,
) -> SyncLeaseHold:
    """The blocking :func:`leasekit.hold`: a ``with`` block holding ``key`` for ``owner``.

    ::

        with leasekit.sync.hold(leases, "thread-42", owner, ttl_ms=30_000) as lease:
            do_work(fencing_token=lease.token)

    Acquisition, renewal every ``renew_every_ms``, the deadline ``safety_margin_ms``
    before the TTL, loss detection and release are :func:`leasekit.hold`'s, running on
    the facade's loop thread while the block runs in the calling thread. A thread
    cannot be cancelled from outside, so on loss the body is not interrupted:
    ``.lost`` (a :class:`threading.Event`) is set at the deadline, and the body must
    check it (or ``remaining()``) before each side effect. ``on_lost="raise"`` also raises
    :class:`leasekit.LeaseLost` when the block ends normally after a loss, so work done
    without the lease does not pass as done with it.
    """
    facade = _facade(provider)
    checked: object = on_lost
    if checked not in ("flag", "raise"):
        raise InvalidLeaseArgument.for_argument(
            "on_lost",
            f"must be 'flag' or 'raise' in leasekit.sync (a thread cannot be cancelled), "
            f"got {on_lost!r}",
        )
    lease = LeaseHold(
        facade.provider,
        key,
        owner,
        ttl_ms,
        renew_every_ms=renew_every_ms,
        safety_margin_ms=safety_margin_ms,
        on_lost="flag",
        wait_s=wait_s,
    )
    return SyncLeaseHold(facade, lease, on_lost)


def watch_owner(
    provider: SyncLeaseProvider, key: str, *, poll_s: float = 0.5
) -> Iterator[str | None]:
    """The blocking :func:`leasekit.watch_owner`: the owner now, then at each change.

    ``for owner in leasekit.sync.watch_owner(leases, key): ...``. Each step waits on the
    facade's loop thread (woken by release notifications where the backend has them);
    close the generator (or leave the ``for``) to stop watching.
    """
    facade = _facade(provider)
    changes = _async_watch_owner(facade.provider, key, poll_s=poll_s)
    try:
        while True:  # watch_owner never ends by itself
            yield facade.run(changes.__anext__)
    finally:
        if not facade.closed:
            facade.run(changes.aclose)


def leaders(
    provider: SyncLeaseProvider, group: str, *, poll_s: float = 0.5
) -> Iterator[str | None]:
    """The blocking :func:`leasekit.leaders`: the leader of ``group`` now and at each change."""
    return watch_owner(provider, group, poll_s=poll_s)


def elect(
    provider: SyncLeaseProvider,
    group: str,
    candidate: str,
    ttl_ms: int,
    *,
    timeout_s: float | None = None,
    renew_every_ms: int | None = None,
    safety_margin_ms: int | None = None,
    on_lost: SyncOnLost = "flag",
) -> SyncLeaseHold:
    """The blocking :func:`leasekit.elect`: campaign, then lead inside the ``with`` block.

    Waits (woken by notifications where the backend has them) until ``candidate`` holds
    the group's lease or ``timeout_s`` passes (:class:`leasekit.LeaseHeld`); leadership
    is a :func:`hold`, so the body must check ``.lost`` or ``remaining()`` before each
    side effect. Leaving the block resigns.
    """
    return hold(
        provider,
        group,
        candidate,
        ttl_ms,
        renew_every_ms=renew_every_ms,
        safety_margin_ms=safety_margin_ms,
        on_lost=on_lost,
        wait_s=timeout_s,
    )
