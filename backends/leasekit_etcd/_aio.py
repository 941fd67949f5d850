"""The asyncio transport: grpc.aio channels, one per member, and the operations' calls.

:class:`AioTransport` runs an operation of ``_ops`` with
:func:`~leasekit.backend.drive_async`: each :class:`~leasekit_etcd._ops.Call` it yields
goes to a member by the failover rules of ``_members`` (whose steps are run here on
asyncio), all of one operation's calls sharing its deadline. Only I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from leasekit.backend import Operation, drive_async

from . import _rpc
from ._members import (
    SETTLE_S,
    Attempt,
    Connected,
    Member,
    Members,
    Pause,
    Refuses,
    Step,
    channel_opener,
)
from ._ops import Call, Request

__all__ = ["AioTransport", "call_at", "open_channel"]

_T = TypeVar("_T")
# How often a connecting channel's state is looked at.
_STATE_POLL_S = 0.005
# At most this many calls of one operation at a time (inspect's LeaseTimeToLive).
_PARALLEL = 32


open_channel = channel_opener(blocking=False)
"""Opens this transport's kind of channel to an address, with TLS when given."""


async def _keep_alive(stubs: _rpc.Stubs, request: Any, metadata: Any, timeout_s: float) -> Any:
    call = stubs.lease.LeaseKeepAlive(timeout=timeout_s, metadata=metadata)
    try:
        await call.write(request)
        response = await call.read()
        # Half-close and wait for etcd to end the stream, so that no event of this
        # call is still in flight when the caller's event loop closes.
        await call.done_writing()
        await call.code()
    except BaseException:
        call.cancel()
        raise
    return response


class _LoopTimer:
    """A :class:`~leasekit_etcd._pool.Timer` on an event loop: pending while that loop runs."""

    __slots__ = ("_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, handle: asyncio.TimerHandle) -> None:
        self._loop = loop
        self._handle = handle

    def cancel(self) -> None:
        self._handle.cancel()

    def pending(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop and not self._handle.cancelled()
        except RuntimeError:  # no loop running: the timer's is gone
            return False


def call_at(when: float, callback: Callable[[], None]) -> _LoopTimer:
    """Run ``callback`` at loop time ``when`` on the running loop (the lease pool's timers)."""
    loop = asyncio.get_running_loop()
    return _LoopTimer(loop, loop.call_at(when, callback))


class AioTransport:
    """An operation's calls on grpc.aio channels, with failover (``_members``)."""

    def __init__(self, members: Members) -> None:
        self.members = members
        self.closed = False

    async def run(self, operation: Operation[Request, _T], deadline: float) -> _T:
        """Drive ``operation`` to its result, its calls done by ``deadline`` (loop time)."""
        return await drive_async(operation, lambda request: self._exchange(request, deadline))

    async def _exchange(self, request: Request, deadline: float) -> Any:
        if type(request) is tuple:
            gate = asyncio.Semaphore(_PARALLEL)

            async def one(call: Call) -> Any:
                async with gate:
                    return await self.call(call, deadline)

            return await asyncio.gather(*(one(call) for call in request))
        assert isinstance(request, Call)
        return await self.call(request, deadline)

    async def call(self, call: Call, deadline: float) -> Any:
        """One call on a member, failing over by the rules of ``_members``."""
        loop = asyncio.get_running_loop()
        policy = self.members.failover(deadline=deadline, safe=call.safe, now=loop.time)
        return await drive_async(policy, lambda step: self._step(step, call), throws=_rpc.RpcError)

    async def _step(self, step: Step, call: Call) -> Any:
        if type(step) is Attempt:
            member, timeout_s = step
            self.members.in_flight += 1
            try:
                if member.needs_token:
                    await self.authenticate(member, timeout_s)
                if call.method == "LeaseKeepAlive":
                    return await _keep_alive(member.stubs, call.request, member.metadata, timeout_s)
                return await _rpc.unary(
                    member.stubs, call.method, call.request, member.metadata, timeout_s
                )
            finally:
                self.members.in_flight -= 1
        if type(step) is Connected:
            return await _wait_connected(step.member, step.wait_s)
        if type(step) is Refuses:
            return await _refuses_connections(step.member, step.wait_s)
        assert isinstance(step, Pause)
        await asyncio.sleep(step.seconds)
        return None

    @classmethod
    async def adopt(cls, client: Any, address: str, *, connect_timeout_s: float) -> AioTransport:
        """A transport on a caller's ``aetcd.Client``: its channel (and auth token), once
        it is connected; the channel stays the client's to close."""
        await client.connect()
        member = Member(
            address,
            tls=None,
            credentials=None,
            channel=client.channel,
            metadata=tuple(client.metadata or ()),
        )
        return cls(Members([member], connect_timeout_s=connect_timeout_s))

    @staticmethod
    async def authenticate(member: Member, timeout_s: float) -> None:
        """Get ``member`` an auth token (etcd's simple tokens are per member)."""
        request = member.authenticate_request()
        member.got_token(await member.stubs.auth.Authenticate(request, timeout=timeout_s))

    async def close(self) -> None:
        """Close every channel, then let gRPC deliver what the cancelled calls still owe.

        Closing a channel cancels the calls still on it; a call that a deadline
        cancelled, or that failed, moments ago is in the same state. Both are given
        ``SETTLE_S`` on this event loop, so that no event of theirs outlives it.
        """
        self.closed = True
        members = self.members
        loop = asyncio.get_running_loop()
        cancelled = members.in_flight > 0 or members.streams_opened
        for member in members.members:
            channel = member.take_channel()
            if channel is not None:
                await channel.close()
        settle_until = loop.time() + SETTLE_S if cancelled else None
        if members.cut_off_at is not None:
            recent = members.cut_off_at + SETTLE_S
            settle_until = recent if settle_until is None else max(settle_until, recent)
        if settle_until is not None and settle_until > loop.time():
            await asyncio.sleep(settle_until - loop.time())


async def _wait_connected(member: Member, wait_s: float) -> bool:
    """Whether the channel is (or becomes, within ``wait_s``) connected.

    A channel that failed to connect (refused, unreachable) is reported at once, so the
    caller can move on to another member without waiting.
    """
    channel = member.channel
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    state = channel.get_state(try_to_connect=True)
    while state != _rpc.ChannelState.READY:
        if state in (_rpc.ChannelState.TRANSIENT_FAILURE, _rpc.ChannelState.SHUTDOWN):
            return False
        remaining = deadline - loop.time()
        if remaining <= 0:
            return False
        # Look again shortly rather than await wait_for_state_change(): cancelling that
        # at a timeout leaves gRPC's watch pending in its completion queue, and when it
        # completes after this event loop closed, gRPC's poller raises "Event loop is
        # closed" into whichever loop runs it next.
        await asyncio.sleep(min(_STATE_POLL_S, remaining))
        state = channel.get_state(try_to_connect=True)
    return True


async def _refuses_connections(member: Member, wait_s: float) -> bool:
    """Whether a new TCP connection to the member is refused right now (see ``Refuses``)."""
    host, _, port = member.address.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port)), wait_s
        )
    except ConnectionRefusedError:
        return True
    except (OSError, ValueError, TimeoutError, asyncio.TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False
