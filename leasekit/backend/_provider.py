"""``BackendProvider``: the lifecycle, deadline and error path every backend shares.

One module, over 500 lines: the call path, its deadlines, the undo of unknown grants and
closing work on one shared state, so they stay in one class.

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
  promptly: the call runs in the caller's task (no task or loop iteration of its own)
  and is abandoned at the deadline, to unwind in the background. Detached calls on
  one key are sent in the order they were made: a call waits (within its own
  deadline) for the abandoned calls on its key to settle first.
- :meth:`~BackendProvider._spawn` for background work (a sweep, a revoke) that
  ``aclose`` drains within ``timeout_s``.
- the undo of a grant nobody learned of: a call that may grant ``key`` to an owner
  (acquire, transfer) passes ``grant=owner`` to ``_call`` or ``_call_detached``, after
  ``await self._after_undo(key, owner)`` when :attr:`_undos` is non-empty. If the
  caller is cancelled, the grant is released in the background, once the call has
  settled; :meth:`~BackendProvider.undo_grant` does the same for a timed-out call.
- a ``repr`` built from :meth:`~BackendProvider._describe`, which must hold no secret
  (use :func:`~leasekit.backend.redact_url`).
- safety across ``fork()`` and event loops (:mod:`leasekit.backend._fork`): in a forked
  child, or on a new loop once the one it ran on is closed, a provider built by its
  backend's ``from_url`` builds itself anew on first use there, never touching the
  connections, tasks or timers it had; one built on a caller's own client refuses to
  work in a forked child (:class:`~leasekit.LeaseProviderClosed`, saying why).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from types import TracebackType
from typing import Any, ClassVar, NamedTuple, NoReturn, TypeAlias, TypeVar

from .._contract import LeaseResult, validate_key, validate_owner
from .._errors import LeaseBackendTimeout, LeaseError, LeaseProviderClosed
from .._slots import SlotResult
from ._base import ProviderBase
from ._deadlines import Deadlines, Overdue
from ._fork import (
    callers_client_in_child,
    keep_forever,
)
from ._undo import UNDOING

__all__ = ["BackendProvider", "Grant", "SlotGrant"]


class SlotGrant(NamedTuple):
    """``grant=`` of a call that may grant a slot of a counting lease to ``owner``.

    Undone (when its caller is cancelled) with ``release_slot_grant(key, owner,
    token)`` where the provider has it, else ``release_slot(key, owner)``: the slot
    methods, not the lease ones.
    """

    owner: str


Grant: TypeAlias = "str | SlotGrant"
"""What a call may grant: a lease to an owner (``str``), or a slot (:class:`SlotGrant`)."""

_T = TypeVar("_T")
_P = TypeVar("_P", bound="BackendProvider")

_log = logging.getLogger("leasekit")

# aclose() gives background work and the client's own close at least this long, even
# when operations in flight used up the whole timeout.
_CLOSE_FLOOR_S = 0.2

# The running loop, or None outside one (asyncio.get_running_loop() without the raise).
_running_loop = asyncio.events._get_running_loop


class _Forked:
    """Stands for "the loop of the parent process" in a forked child: never running here."""

    def __repr__(self) -> str:
        return "<the parent's event loop>"


_FORKED: Any = _Forked()

# How long after its first release an undo whose call's reply was never read releases
# again, for a request that was still on its way to the store.
_UNDO_SETTLE_S = 0.05

# How many times an undo's release is sent when it times out.
_UNDO_ATTEMPTS = 3


class BackendProvider(ProviderBase):
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

    #: A backend with release notifications sets this to its listener (an object with
    #: ``async aclose()``, and ``async break_connection()`` for the suite's lost-channel
    #: check): ``aclose`` closes it first, waking every waiter.
    _release_listener: Any = None

    #: Whether the client's connections belong to the event loop they were made on
    #: (asyncio streams do; a backend running its driver in threads sets False): then
    #: a provider whose loop has closed is rebuilt on the next one.
    _loop_bound: ClassVar[bool] = True

    def __init__(self, *, timeout_s: float, owns_client: bool) -> None:
        super().__init__(timeout_s=timeout_s, owns_client=owns_client)
        self._deadlines = Deadlines(timeout_s)
        self._inflight = 0
        self._drained: asyncio.Future[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._abandoned: set[asyncio.Future[Any]] = set()
        # (key, owner) -> the undo of a grant of key to owner that its caller never
        # learned of; a new grant of the same (key, owner) waits for it (_after_undo).
        self._undos: dict[tuple[str, Grant], asyncio.Task[None]] = {}
        # (key, owner) -> a timed-out grant call still unwinding, for undo_grant.
        self._unsettled: dict[tuple[str, Grant], asyncio.Future[Any]] = {}
        # The abandoned detached calls by key, while they unwind: a later call on the
        # key waits for them (see _call_detached).
        self._abandoned_by_key: dict[str, set[asyncio.Future[Any]]] = {}
        # The loop the client's connections belong to (None until first used).
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- what subclasses override ---------------------------------------------------------

    async def _connect(self) -> None:
        """Check the store at ``async with`` (a PING, a schema check); bounded by ``_call``."""

    async def _close_client(self) -> None:
        """Close the client the provider built; called by ``aclose`` only if it owns one."""

    # -- the call path --------------------------------------------------------------------

    def _refuse_if_closed(self) -> None:
        """Raise if closed; on a loop other than the client's, build anew first if need be.

        A backend calls it before it touches its client outside :meth:`_call` (building
        a request that holds a connection, say).
        """
        if self._closing and not UNDOING.get():
            raise LeaseProviderClosed(self._closed_reason, backend=self.backend)
        if _running_loop() is not self._loop:
            self._enter_loop()

    def _enter_loop(self) -> None:
        """The provider runs on a loop that is not its client's: first use, a new loop, a fork.

        First use binds the provider to the running loop. In a forked child, or once the
        loop it ran on is closed, its connections (and tasks, timers, listeners) are
        unusable: a provider that can be rebuilt (:attr:`_rebuild`) builds itself anew,
        the same object taking the new one's state, and the old state is kept, never
        closed (after a fork, closing would write to the parent's connections). On a loop
        that is still open the provider goes on as it is: whether its driver works
        from two loops is the driver's business.
        """
        loop = _running_loop()
        old = self._loop
        if loop is None or loop is old:
            return
        if old is None or (old is not _FORKED and (not self._loop_bound or not old.is_closed())):
            self._loop = loop
            return
        rebuild = self._rebuild
        if rebuild is None:
            if old is _FORKED:
                self._closing = True
                self._closed_reason = callers_client_in_child(self.backend)
                raise LeaseProviderClosed(self._closed_reason, backend=self.backend)
            self._loop = loop  # the caller's client, on a closed loop: the caller's to rebuild
            return
        fresh = rebuild()
        fresh._rebuild = rebuild
        # The state the old loop (or the parent) owned: kept, not closed (see above).
        keep_forever(self.__dict__)
        self.__dict__ = fresh.__dict__
        self._loop = loop

    def _after_fork_in_child(self) -> None:
        """In a forked child: forget the parent's loop, so the next call builds anew."""
        if not self._closing:
            self._loop = _FORKED

    def _timeout(self, key: str | None) -> LeaseBackendTimeout:
        return LeaseBackendTimeout(
            f"no answer within {self.timeout_s:g} s{self._where()}", backend=self.backend, key=key
        )

    async def _call(
        self, awaitable: Awaitable[_T], key: str | None = None, grant: Grant | None = None
    ) -> _T:
        """Await one driver call: refused once closed, bounded by ``timeout_s``, errors mapped.

        The deadline cancels the call (the driver must unwind promptly when cancelled)
        and raises :class:`~leasekit.LeaseBackendTimeout`; a cancellation from
        elsewhere propagates unchanged. Driver errors become leasekit's through
        :attr:`errors`, with the driver's exception chained. ``grant``: the owner the
        call may grant ``key`` to; cancelled, the call is undone (:meth:`_start_undo`).
        """
        if self._closing and not UNDOING.get():
            _drop(awaitable)
            raise LeaseProviderClosed(self._closed_reason, backend=self.backend)
        if _running_loop() is not self._loop:
            try:
                self._enter_loop()
            except BaseException:
                _drop(awaitable)
                raise
        deadlines = self._deadlines
        watch = deadlines.open()
        self._inflight += 1
        try:
            if watch is None:  # Python 3.10, or called outside a task
                return await asyncio.wait_for(awaitable, self.timeout_s)
            result = await awaitable
        except BaseException as exc:  # noqa: BLE001 (re-raised: mapped, or as it was)
            raise self._failed(exc, watch, key, grant, None)  # noqa: B904 (_failed chains it)
        finally:  # _left's, inline: the hot path of every call
            deadlines.close(watch)
            self._inflight -= 1
            if not self._inflight and self._drained is not None and not self._drained.done():
                self._drained.set_result(None)
        if watch.task.cancelling() > watch.cancelling:  # type: ignore[union-attr]
            self._swallowed(key, grant, result)
        return result

    @types.coroutine
    def _call_detached(  # noqa: PLR0912 (one frame per call: this is every call's hot path)
        self, coroutine: Coroutine[Any, Any, _T], key: str | None = None, grant: Grant | None = None
    ) -> Generator[Any, Any, _T]:
        """Await ``coroutine``; at the deadline, raise without waiting for it to unwind.

        For drivers whose cancellation waits on the server (psycopg sends a cancel
        request and waits for the query to end), or that cannot be cancelled at all.
        The coroutine runs in the caller's task, in a copy of its context (as a task of
        its own would), with no task or loop iteration of its own: each step is handed
        on, as ``await`` does. Only when the caller's task is cancelled (the deadline
        does that, or anyone else) is the coroutine handed to a background task, where
        it unwinds from the cancellation as slowly as it must (``aclose`` waits for it
        within ``timeout_s``) and its outcome is discarded; the caller goes on at once.
        A failure or cancellation of a future the coroutine awaits, without its task
        being cancelled, is the coroutine's own business and is thrown into it.
        ``grant``: as for :meth:`_call`; a grant call whose reply had already arrived
        when its caller was cancelled is resumed rather than cancelled, so the undo
        knows what it granted.

        An abandoned call may still reach the store after the caller went on: its
        request sits in a frozen server's socket, and runs when the server wakes. So
        a call on a ``key`` with abandoned calls still unwinding waits for them first,
        within its own deadline, and the store sees one provider's calls on a key in
        the order they were made. Without that, a release abandoned at the deadline
        could run after the same owner's next acquire had been answered "acquired",
        and end that newer lease (issue 22).
        """
        if self._closing and not UNDOING.get():
            coroutine.close()
            raise LeaseProviderClosed(self._closed_reason, backend=self.backend)
        if _running_loop() is not self._loop:
            try:
                self._enter_loop()
            except BaseException:
                coroutine.close()
                raise
        if self._abandoned_by_key and key is not None:
            earlier = self._abandoned_by_key.get(key)
            if earlier:
                coroutine = _after(set(earlier), coroutine)
        deadlines = self._deadlines
        watch = deadlines.open()
        if watch is None:  # Python 3.10, or called outside a task
            return (yield from self._call_in_task(coroutine, key, grant).__await__())
        self._inflight += 1
        abandoned: asyncio.Future[Any] | None = None
        try:
            context = contextvars.copy_context()
            run = context.run
            send: Callable[[Any], Any] = coroutine.send
            step = send
            argument: Any = None
            while True:
                try:
                    yielded = run(step, argument)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                try:
                    argument = yield yielded
                except GeneratorExit:
                    coroutine.close()
                    raise
                except asyncio.CancelledError as exc:
                    if watch.cancel_requested():
                        abandoned = self._abandon_coroutine(
                            coroutine,
                            context,
                            key,
                            resume=grant is not None and _answered(yielded),
                        )
                        raise
                    step, argument = coroutine.throw, exc
                except BaseException as exc:  # noqa: BLE001 (thrown into the coroutine, as a task does)
                    step, argument = coroutine.throw, exc
                else:
                    step = send
        except BaseException as exc:  # noqa: BLE001 (re-raised: mapped, or as it was)
            raise self._failed(exc, watch, key, grant, abandoned)  # noqa: B904 (_failed chains it)
        finally:
            self._left(watch)

    def _failed(
        self,
        exc: BaseException,
        watch: Any,
        key: str | None,
        grant: Grant | None,
        abandoned: asyncio.Future[Any] | None,
    ) -> BaseException:
        """What a call that raised ``exc`` raises in turn (both call paths end here).

        Its own deadline's cancellation becomes :class:`~leasekit.LeaseBackendTimeout`
        (an abandoned grant is kept as unsettled); any other cancellation propagates,
        undoing a grant it may have made; a driver error becomes leasekit's, chained.
        """
        if isinstance(exc, asyncio.CancelledError):
            if self._deadlines.close(watch):
                if grant is not None and key is not None and abandoned is not None:
                    self._keep_unsettled(key, grant, abandoned)
                timeout = self._timeout(key)
                timeout.__cause__ = None
                timeout.__suppress_context__ = True
                return timeout
            if grant is not None and key is not None:
                self._start_undo(key, grant, abandoned)
            return exc
        if isinstance(exc, self.errors.types):
            mapped = self.errors.translate(exc, key=key, where=self._where())
            mapped.__cause__ = exc  # as ``raise mapped from exc``
            mapped.__suppress_context__ = True
            return mapped
        return exc

    def _left(self, watch: Any) -> None:
        """A call ends: its deadline closed, and ``aclose`` told when none is in flight."""
        self._deadlines.close(watch)
        self._inflight -= 1
        if not self._inflight and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def _call_in_task(
        self, coroutine: Coroutine[Any, Any, _T], key: str | None, grant: Grant | None = None
    ) -> _T:
        """:meth:`_call_detached` where a task's own deadline cannot be used: a task per call."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[_T] = loop.create_future()
        task = loop.create_task(_settle(coroutine, waiter))
        watch = self._deadlines.start(waiter)
        self._inflight += 1
        try:
            return await waiter
        except Overdue:
            self._abandon(task, key)
            if grant is not None and key is not None:
                self._keep_unsettled(key, grant, task)
            raise self._timeout(key) from None
        except self.errors.types as exc:
            raise self.errors.translate(exc, key=key, where=self._where()) from exc
        except BaseException:
            if not task.done():
                self._abandon(task, key)  # the caller was cancelled: so is the call
            if grant is not None and key is not None:
                self._start_undo(key, grant, task)
            raise
        finally:
            self._left(watch)

    def _abandon_coroutine(
        self,
        coroutine: Coroutine[Any, Any, Any],
        context: contextvars.Context,
        key: str | None = None,
        *,
        resume: bool = False,
    ) -> asyncio.Task[Any]:
        """Cancel a detached call in a task of its own (in its context); ``aclose`` waits.

        With ``resume``, the call goes on instead, its awaited reply handed to it.
        """
        loop = asyncio.get_running_loop()
        thrown = _Thrown(coroutine, None if resume else asyncio.CancelledError())
        task = context.run(loop.create_task, thrown.run())
        self._abandon(task, key, cancel=False)
        return task

    def _abandon(
        self, future: asyncio.Future[Any], key: str | None = None, *, cancel: bool = True
    ) -> None:
        """Cancel a call nobody waits for any more; ``aclose`` waits for it to settle.

        Until it has, later detached calls on ``key`` wait for it.
        """
        if cancel:
            future.cancel()
        self._abandoned.add(future)
        future.add_done_callback(self._abandoned.discard)
        future.add_done_callback(_consume_outcome)
        if key is not None:
            self._abandoned_by_key.setdefault(key, set()).add(future)
            future.add_done_callback(functools.partial(self._settled, key))

    def _settled(self, key: str, future: asyncio.Future[Any]) -> None:
        unsettled = self._abandoned_by_key.get(key)
        if unsettled is not None:
            unsettled.discard(future)
            if not unsettled:
                del self._abandoned_by_key[key]

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run background work that ``aclose`` drains (then cancels) within ``timeout_s``."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_consume_outcome)
        return task

    def _swallowed(self, key: str | None, grant: Grant | None, result: object) -> NoReturn:
        """Raise the cancellation a driver swallowed (undoing the grant it answered).

        The driver answered although the caller's task was cancelled meanwhile (Python
        3.11's ``asyncio.wait_for``, which drivers use to connect, drops a cancellation
        that races its result): the caller must still be cancelled, and what the call
        granted is undone, by its token where the backend can.
        """
        if grant is not None and key is not None:
            answered = asyncio.get_running_loop().create_future()
            answered.set_result(result)
            self._start_undo(key, grant, answered)
        raise asyncio.CancelledError

    # -- undoing a grant nobody learned of ------------------------------------------------

    async def _after_undo(self, key: str, owner: Grant) -> None:
        """Wait for a pending undo of a grant of ``key`` to ``owner`` (bounded by its own).

        A backend awaits this before it sends a new grant of ``(key, owner)`` (when
        :attr:`_undos` is non-empty): so an undo can never release a grant made after
        the one it undoes, not even an idempotent re-acquire that kept the token.
        """
        pending = self._undos.get((key, owner))
        if pending is not None:
            await asyncio.wait((pending,))

    def undo_grant(self, key: str, owner: str) -> None:
        """Release, in the background, the grant of ``key`` to ``owner`` if one landed.

        For an acquire or transfer whose outcome is unknown to its caller (it raised
        :class:`~leasekit.LeaseBackendTimeout`) and that the caller gives up on;
        :func:`leasekit.hold` calls it then. A cancelled call is undone without being
        asked. The release waits for the timed-out call to settle, is bounded by
        ``timeout_s``, and holds back this provider's next grant of ``(key, owner)``
        until it is done; :meth:`aclose` waits for it.
        """
        validate_key(key)
        validate_owner(owner)
        self._start_undo(key, owner, self._unsettled.get((key, owner)))

    def _keep_unsettled(self, key: str, owner: Grant, call: asyncio.Future[Any]) -> None:
        """Remember a timed-out grant call still unwinding, so an undo can wait for it."""
        slot = (key, owner)
        self._unsettled[slot] = call

        def forget(_: object) -> None:
            if self._unsettled.get(slot) is call:
                del self._unsettled[slot]

        call.add_done_callback(forget)

    def _start_undo(self, key: str, owner: Grant, call: asyncio.Future[Any] | None) -> None:
        """Undo, in the background, what the interrupted grant ``call`` may have granted."""
        slot = (key, owner)
        context = contextvars.copy_context()
        context.run(UNDOING.set, True)
        undo = self._undo(key, owner, call, self._undos.get(slot))
        task: asyncio.Task[None] = context.run(self._spawn, undo)
        self._undos[slot] = task

        def forget(_: object) -> None:
            if self._undos.get(slot) is task:
                del self._undos[slot]

        task.add_done_callback(forget)

    async def _undo(
        self,
        key: str,
        grant: Grant,
        call: asyncio.Future[Any] | None,
        previous: asyncio.Task[None] | None,
    ) -> None:
        # After the call has settled (its request can no longer land later) and after
        # an earlier undo of the same grant, each within timeout_s.
        for waited in (previous, call):
            if waited is not None and not waited.done():
                await asyncio.wait((waited,), timeout=self.timeout_s)
        granted, token = _granted(call)
        if not granted:
            return
        if isinstance(grant, SlotGrant):
            owner = grant.owner
            release_grant = getattr(self, "release_slot_grant", None)
            release: Callable[[str, str], Awaitable[Any]] = getattr(self, "release_slot")  # noqa: B009 (not every backend has it)
        else:
            owner = grant
            release_grant = getattr(self, "release_grant", None)
            release = self.release_lease  # type: ignore[attr-defined]
        failure: LeaseError | None = None
        # A release that times out (a busy pool, a loaded store) is tried again, up to
        # _UNDO_ATTEMPTS times, each bounded by timeout_s: what is left held otherwise
        # stays held for its whole TTL. Exact all the same: no new grant of (key, owner)
        # is sent meanwhile. aclose() bounds the whole of it.
        for _ in range(_UNDO_ATTEMPTS):
            try:
                if token is not None and callable(release_grant):
                    await release_grant(key, owner, token)
                    return
                # The request may still be on its way (written to a socket the driver
                # then closed, queued on a server thread): release once more after it
                # had time to land.
                await release(key, owner)
                await asyncio.sleep(_UNDO_SETTLE_S)
                await release(key, owner)
            except LeaseBackendTimeout as exc:  # noqa: PERF203 (rare: a timed-out undo)
                failure = exc
                if self._closing:
                    break
            except LeaseError as exc:
                failure = exc
                break
            else:
                return
        _log.warning(
            "undoing a cancelled grant of %r to %r failed (%s); it expires after its TTL",
            key,
            owner,
            failure,
        )

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
        if self._loop is _FORKED:
            return  # the parent's connections and tasks: the parent closes them
        if self._release_listener is not None:
            # Woken waiters look again, and are refused: the provider is closing.
            await self._release_listener.aclose()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        if self._inflight:
            self._drained = loop.create_future()
            await asyncio.wait((self._drained,), timeout=self.timeout_s + _CLOSE_FLOOR_S)
        self._housekeep_before_close()
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

    def _housekeep_before_close(self) -> None:
        """Start the last background work, once no operation is in flight (a hook).

        Called by :meth:`aclose` after the operations in flight have finished and
        before background work is drained, so the work it starts with :meth:`_spawn`
        is given the rest of ``timeout_s`` like any other. The etcd backend revokes the idle etcd
        leases it kept for reuse here. Does nothing by default.
        """

    async def break_notifications(self) -> None:
        """Cut the release-notification channel, as a network failure would (for tests)."""
        if self._release_listener is not None:
            await self._release_listener.break_connection()

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


class _Thrown:
    """A coroutine resumed by throwing ``exc`` into it, then awaited as usual."""

    __slots__ = ("_coroutine", "_exc")

    def __init__(self, coroutine: Coroutine[Any, Any, Any], exc: BaseException | None) -> None:
        self._coroutine = coroutine
        self._exc = exc

    async def run(self) -> Any:
        """The coroutine's outcome, once it has unwound."""
        return await self

    def __await__(self) -> Generator[Any, Any, Any]:
        coroutine = self._coroutine
        # No exception: resumed with the reply it awaited, which has arrived.
        step: Callable[[Any], Any] = coroutine.send if self._exc is None else coroutine.throw
        argument: Any = self._exc
        while True:
            try:
                yielded = step(argument)
            except StopIteration as stop:
                return stop.value
            try:
                argument = yield yielded
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as exc:  # noqa: BLE001 (thrown into the coroutine, as a task does)
                step, argument = coroutine.throw, exc
            else:
                step = coroutine.send


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


async def _after(earlier: set[asyncio.Future[Any]], coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coroutine`` once the ``earlier`` calls on its key have settled.

    Cancelled while waiting (the caller's deadline), the coroutine is closed unstarted:
    nothing of it was sent.
    """
    try:
        await asyncio.wait(earlier)
    except BaseException:
        coroutine.close()
        raise
    return await coroutine


def _drop(awaitable: Awaitable[Any]) -> None:
    """An awaitable the call will not await: never started, or, a future, cancelled.

    A coroutine is closed (no "was never awaited" warning). A future stands for work
    the driver has queued already (the SQLite transport's group commit): cancelled, the
    driver drops that work before it starts."""
    if inspect.iscoroutine(awaitable):
        awaitable.close()
    elif isinstance(awaitable, asyncio.Future):
        awaitable.cancel()


def _answered(yielded: object) -> bool:
    """Whether a suspended call's awaited future holds its reply (so it can go on)."""
    return isinstance(yielded, asyncio.Future) and yielded.done() and not yielded.cancelled()


def _granted(call: asyncio.Future[Any] | None) -> tuple[bool, int | None]:
    """Whether an interrupted grant call may have granted, and its token if known."""
    if call is None or not call.done() or call.cancelled() or call.exception() is not None:
        return True, None  # unknown: assume it landed
    result = call.result()
    if isinstance(result, LeaseResult | SlotResult):
        return result.acquired, result.token
    return result is not False, None


def _consume_outcome(future: asyncio.Future[Any]) -> None:
    # An abandoned call's error was already reported as a timeout; retrieve it so
    # asyncio does not log "exception was never retrieved".
    if not future.cancelled():
        future.exception()
