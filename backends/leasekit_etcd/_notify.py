"""Release and grant notifications from etcd watches, on the client's one watch stream.

A lease's records live under one key range (``holder_range``); a release, a transfer
(the old holder's record is deleted) and an expiry (etcd deletes the records of an
expired etcd lease) all show up as a ``DELETE`` event in that range. So one watch per
waited-for key covers every way a key may become free, expiry included. A grant of a
free key and a transfer create a record (the holder is in its name): a ``PUT`` event
of version 1. The holder's own re-puts (moved to another etcd lease for a new TTL, or
given new metadata by its re-acquire) are later versions of its record, and renewals
by keep-alive touch no key, so neither is a grant. aetcd multiplexes every watch of a
``Watcher`` on one gRPC stream.

:class:`EtcdReleaseListener` starts a key's watch with its first waiter and cancels it
with its last; each delete wakes that key's waiters, and each creation its grant
watchers, through the toolkit's :class:`~leasekit.backend.ReleaseHub`. A watch that
fails (the member went away) wakes its waiters, who look again, and is created afresh
by the next wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from leasekit.backend import ReleaseHub, ReleaseWatch

from . import _rpc
from ._aio import AioTransport

__all__ = ["EtcdReleaseListener", "WatchStream"]

_log = logging.getLogger("leasekit.etcd")


class EtcdReleaseListener:
    """Per-key record watches on one multiplexed watch stream, fanned out to waiters.

    ``watcher()`` returns the ``aetcd.watcher.Watcher`` to use (one per channel; the
    provider builds it on its current member's channel, TLS and auth included), and
    ``lost()`` is called when a watch fails, so the next one starts on a fresh stream.
    """

    def __init__(
        self,
        watcher: Callable[[], Awaitable[Any]],
        *,
        timeout_s: float,
        lost: Callable[[], None] | None = None,
    ) -> None:
        self._watcher = watcher
        self._timeout_s = timeout_s
        self._on_lost = lost
        self.hub = ReleaseHub(on_last=self._drop)
        self._watching: dict[str, tuple[Any, int]] = {}  # key -> (watcher, watch id)
        # Held while a watch is created, so that waiters of one key arriving together
        # create one watch (each created its own, and all but the last outlived them).
        self._creating: asyncio.Lock | None = None
        # Every Watcher a watch was created on: each holds a gRPC stream open until it is
        # shut down, which must happen before the event loop closes.
        self._watchers: dict[int, Any] = {}

    async def watch(
        self, key: str, start: bytes, end: bytes, *, grants: bool = False
    ) -> ReleaseWatch:
        """Watch ``key`` (records in ``[start, end)``), for grants too with ``grants``;
        returns once etcd created the watch."""
        watch = self.hub.watch(key, grants=grants)
        try:
            if key not in self._watching:
                await asyncio.wait_for(self._ensure(key, start, end), self._timeout_s)
        except BaseException:
            watch.close()
            raise
        return watch

    async def _ensure(self, key: str, start: bytes, end: bytes) -> None:
        """Create ``key``'s watch unless another waiter did meanwhile."""
        if self._creating is None:
            self._creating = asyncio.Lock()
        # aetcd creates one watch at a time on a stream anyway: the lock costs no overlap.
        async with self._creating:
            if key not in self._watching:
                await self._create(key, start, end)

    async def _create(self, key: str, start: bytes, end: bytes) -> None:
        from aetcd.rtypes import EventKind  # type: ignore[import-untyped]  # noqa: PLC0415

        watcher = await self._watcher()

        async def on_event(event_or_error: Any) -> None:
            if isinstance(event_or_error, Exception):
                # The stream failed (the member went away): look again, start over.
                _log.debug("watch on %r lost (%s)", key, event_or_error)
                self._watching.pop(key, None)
                if self._on_lost is not None:
                    self._on_lost()
            elif event_or_error.kind == EventKind.PUT:
                if event_or_error.kv.version == 1:  # a record created: a new holder
                    self.hub.notify(key, granted=True)
                return
            self.hub.notify(key)

        self._watchers[id(watcher)] = watcher
        callback = await watcher.add_callback(start, on_event, range_end=end)
        self._watching[key] = (watcher, callback.watch_id)

    def _drop(self, key: str) -> None:
        entry = self._watching.pop(key, None)
        if entry is not None:
            watcher, watch_id = entry
            cancel = asyncio.get_running_loop().create_task(watcher.cancel(watch_id))
            cancel.add_done_callback(_ignore_outcome)

    async def aclose(self) -> None:
        """Cancel every watch and shut the watch streams down; waiters are woken."""
        watchers, self._watchers = self._watchers, {}
        self._watching.clear()
        for watcher in watchers.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(watcher.shutdown(), self._timeout_s)
        self.hub.notify_all()


class WatchStream:
    """The watch stream a provider's listener uses: an ``aetcd.watcher.Watcher`` made on
    first use on the member operations are pinned to then, and made afresh after a
    failure (:meth:`lost`). ``spawn`` runs the old stream's shutdown in the background."""

    def __init__(
        self,
        transport: Callable[[], Awaitable[AioTransport]],
        *,
        timeout_s: float,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
    ) -> None:
        self._transport = transport
        self._timeout_s = timeout_s
        self._spawn = spawn
        self._watcher: Any = None

    async def __call__(self) -> Any:
        if self._watcher is None:
            transport = await self._transport()
            member = transport.members.pinned
            if member.needs_token:
                await transport.authenticate(member, self._timeout_s)
            self._watcher = _rpc.release_watcher(member.stubs, member.metadata)
            transport.members.streams_opened = True
        return self._watcher

    def lost(self) -> None:
        """A watch failed: the next wait starts a stream on whichever member is pinned."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            self._spawn(watcher.shutdown())

    async def cut(self) -> None:
        """Cut the stream, as a failed member would (for tests)."""
        if self._watcher is not None:
            await self._watcher._terminate_stream(ConnectionError("watch stream cut"))


def _ignore_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
