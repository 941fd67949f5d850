"""The blocking transport: grpc's blocking channels, with the same stubs and failover.

:class:`BlockingTransport` runs an operation of ``_ops`` with
:func:`~leasekit.backend.drive` from the caller's thread: each call goes to a member by
the failover rules of ``_members`` (whose steps are run here with blocking calls),
with ``timeout=`` the time left of the operation's ``timeout_s``, so a stalled cluster
raises ``DEADLINE_EXCEEDED`` (a :class:`~leasekit.LeaseBackendTimeout`) in time. The
etcd leases the operations leave empty are revoked, and those kept for reuse timed,
by one background thread (:class:`Revoker`). Only I/O.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from leasekit.backend import Operation, drive

from . import _ops, _rpc
from ._members import Attempt, Connected, Member, Members, Pause, Refuses, Step, channel_opener
from ._ops import Call, Request

__all__ = ["BlockingTransport", "Revoker", "open_channel"]

_T = TypeVar("_T")
_READY = _rpc.ChannelState.READY
_FAILED = (_rpc.ChannelState.TRANSIENT_FAILURE, _rpc.ChannelState.SHUTDOWN)


open_channel = channel_opener(blocking=True)
"""Opens this transport's kind of channel to an address, with TLS when given."""


def _keep_alive(stubs: _rpc.Stubs, request: Any, metadata: Any, timeout_s: float) -> Any:
    # One request on the stream, then half-closed; etcd answers it and ends the stream.
    responses = stubs.lease.LeaseKeepAlive(iter((request,)), timeout=timeout_s, metadata=metadata)
    try:
        return next(responses)
    finally:
        responses.cancel()


# How long closing waits for gRPC's connectivity polling thread (one 0.2 s poll) to end.
_POLL_END_S = 0.5


class _Connectivity:
    """A blocking channel's state as gRPC reports it (``subscribe``), to wait on."""

    def __init__(self, channel: _rpc.Channel) -> None:
        self.state: Any = None
        self._changed = threading.Condition()
        self._channel = channel
        channel.subscribe(self._update, try_to_connect=True)

    def stop(self, wait_s: float) -> None:
        """Unsubscribe, and wait (up to ``wait_s``) for gRPC's polling thread to end.

        That thread asks the channel for its state every 0.2 s until nothing is
        subscribed; a channel closed under it makes it raise in its own thread ("Cannot
        monitor channel state: Channel closed!"), so the channel is closed after it ends.
        """
        self._channel.unsubscribe(self._update)
        state = getattr(self._channel, "_connectivity_state", None)
        deadline = time.monotonic() + wait_s
        while getattr(state, "polling", False) and time.monotonic() < deadline:
            time.sleep(0.01)

    def _update(self, state: Any) -> None:
        with self._changed:
            self.state = state
            self._changed.notify_all()

    def wait_connected(self, wait_s: float) -> bool:
        with self._changed:
            self._changed.wait_for(
                lambda: self.state == _READY or self.state in _FAILED, timeout=wait_s
            )
            return bool(self.state == _READY)


class BlockingTransport:
    """An operation's calls on blocking grpc channels, with failover; thread-safe."""

    def __init__(self, members: Members) -> None:
        self.members = members
        self._opening = threading.Lock()
        self._connectivity: dict[int, _Connectivity] = {}

    def run(self, operation: Operation[Request, _T], timeout_s: float) -> _T:
        """Drive ``operation`` to its result, all its calls within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        return drive(operation, lambda request: self._exchange(request, deadline))

    def _exchange(self, request: Request, deadline: float) -> Any:
        if type(request) is tuple:
            return [self.call(call, deadline) for call in request]
        assert isinstance(request, Call)
        return self.call(request, deadline)

    def call(self, call: Call, deadline: float) -> Any:
        """One call on a member, failing over by the rules of ``_members``."""
        policy = self.members.failover(deadline=deadline, safe=call.safe, now=time.monotonic)
        return drive(policy, lambda step: self._step(step, call), throws=_rpc.RpcError)

    def _stubs(self, member: Member) -> _rpc.Stubs:
        if not member.opened:
            with self._opening:
                if not member.opened:
                    self._connectivity[id(member)] = _Connectivity(member.channel)
        return member.stubs

    def _step(self, step: Step, call: Call) -> Any:
        if type(step) is Attempt:
            member, timeout_s = step
            stubs = self._stubs(member)
            if member.needs_token:
                request = member.authenticate_request()
                member.got_token(stubs.auth.Authenticate(request, timeout=timeout_s))
            if call.method == "LeaseKeepAlive":
                return _keep_alive(stubs, call.request, member.metadata, timeout_s)
            return _rpc.unary(stubs, call.method, call.request, member.metadata, timeout_s)
        if type(step) is Connected:
            self._stubs(step.member)
            return self._connectivity[id(step.member)].wait_connected(step.wait_s)
        if type(step) is Refuses:
            return _refuses_connections(step.member, step.wait_s)
        assert isinstance(step, Pause)
        time.sleep(step.seconds)
        return None

    def close(self) -> None:
        """Close every channel this transport opened; calls on them fail (CANCELLED)."""
        with self._opening:
            watched, self._connectivity = self._connectivity, {}
            for connectivity in watched.values():
                connectivity.stop(_POLL_END_S)
            for member in self.members.members:
                channel = member.take_channel()
                if channel is not None:
                    channel.close()


def _refuses_connections(member: Member, wait_s: float) -> bool:
    """Whether a new TCP connection to the member is refused right now (see ``Refuses``)."""
    host, _, port = member.address.rpartition(":")
    try:
        connection = socket.create_connection((host.strip("[]"), int(port)), timeout=wait_s)
    except ConnectionRefusedError:
        return True
    except (OSError, ValueError):
        return False
    connection.close()
    return False


class _ThreadTimer:
    """A :class:`~leasekit_etcd._pool.Timer` on the :class:`Revoker`'s thread."""

    __slots__ = ("callback", "done")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.done = False  # run or cancelled

    def cancel(self) -> None:
        self.done = True

    def pending(self) -> bool:
        return not self.done


class Revoker:
    """Revokes etcd leases, and runs the lease pool's timers, on one background thread.

    The etcd leases a release, a transfer or a denied acquire leaves without a record
    (unless kept for reuse), and those an operation that failed may have bound, are
    revoked here, off the callers' path, each bounded by ``timeout_s``; one that
    cannot be revoked ends at its TTL. The pool's timers (:meth:`call_at`, on
    ``time.monotonic``) revoke an idle lease once it can no longer be bound. The
    thread starts with the first of either; :meth:`flush` waits for the revocations
    queued, :meth:`drain` too, then stops the thread (timers still due are dropped).
    """

    def __init__(self, transport: BlockingTransport, timeout_s: float) -> None:
        self._transport = transport
        self._timeout_s = timeout_s
        self._work_ready = threading.Condition(threading.Lock())
        self._revocations: deque[int] = deque()
        self._timers: list[tuple[float, int, _ThreadTimer]] = []  # a heap, soonest first
        self._order = itertools.count()
        self._busy = 0  # revocations queued or being sent
        self._stopping = False
        self._thread: threading.Thread | None = None

    def __call__(self, lease_id: int) -> None:
        with self._work_ready:
            self._revocations.append(lease_id)
            self._busy += 1
            self._wake()

    def call_at(self, when: float, callback: Callable[[], None]) -> _ThreadTimer:
        """Run ``callback`` at ``when`` (``time.monotonic``) on this thread."""
        timer = _ThreadTimer(callback)
        with self._work_ready:
            heapq.heappush(self._timers, (when, next(self._order), timer))
            self._wake()
        return timer

    def _wake(self) -> None:
        if self._thread is None and not self._stopping:
            self._thread = threading.Thread(
                target=self._work, name="leasekit-etcd-revoke", daemon=True
            )
            self._thread.start()
        self._work_ready.notify()

    def _next(self) -> int | _ThreadTimer | None:
        """The next revocation, or the next timer due; None once stopping and done."""
        with self._work_ready:
            while True:
                if self._revocations:
                    return self._revocations.popleft()
                if self._stopping:
                    return None
                timers = self._timers
                wait_s = None
                while timers:
                    when, _, timer = timers[0]
                    if timer.done:
                        heapq.heappop(timers)
                        continue
                    wait_s = when - time.monotonic()
                    if wait_s <= 0:
                        heapq.heappop(timers)
                        timer.done = True
                        return timer
                    break
                self._work_ready.wait(wait_s)

    def _work(self) -> None:
        while (work := self._next()) is not None:
            if isinstance(work, _ThreadTimer):
                # The pool's own bookkeeping; a bug there must not stop the revocations.
                with contextlib.suppress(Exception):
                    work.callback()
                continue
            # If the store is failing, the lease expires with its TTL anyway.
            with contextlib.suppress(Exception):
                self._transport.run(_ops.revoke(work), self._timeout_s)
            with self._work_ready:
                self._busy -= 1
                self._work_ready.notify_all()

    def flush(self) -> None:
        """Wait (up to ``timeout_s`` more per revocation) for those queued now and since."""
        with self._work_ready:
            thread = self._thread
            while self._busy and thread is not None and thread.is_alive():
                self._work_ready.wait(self._timeout_s)

    def drain(self) -> None:
        """Wait (up to ``timeout_s`` more) for the queued revocations, then stop the thread."""
        with self._work_ready:
            self._stopping = True
            self._work_ready.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(self._timeout_s)
