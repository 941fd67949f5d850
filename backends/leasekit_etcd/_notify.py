"""Release notifications from etcd watches, multiplexed on the client's one watch stream.

A lease's records live under one key range (``holder_range``); a release, a transfer
(the old holder's record is deleted) and an expiry (etcd deletes the records of an
expired etcd lease) all show up as a ``DELETE`` event in that range. So one watch per
waited-for key, filtered to deletes at the server, covers every way a key may become
free, expiry included. aetcd multiplexes every watch of a client on one gRPC stream.

:class:`EtcdReleaseListener` starts a key's watch with its first waiter and cancels it
with its last; each delete wakes that key's waiters through the toolkit's
:class:`~leasekit.backend.ReleaseHub`. A watch that fails (the member went away) wakes
its waiters, who look again, and is started afresh by the next wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from leasekit.backend import ReleaseHub, ReleaseWatch

__all__ = ["EtcdReleaseListener"]

_log = logging.getLogger("leasekit.etcd")


class _KeyWatch:
    __slots__ = ("ready", "task", "watch")

    def __init__(self, ready: asyncio.Future[None]) -> None:
        self.ready = ready
        self.task: asyncio.Task[None] | None = None
        self.watch: Any = None


class EtcdReleaseListener:
    """Per-key delete watches on the current member's client, fanned out to waiters."""

    def __init__(self, client: Callable[[], Awaitable[Any]], *, timeout_s: float) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self.hub = ReleaseHub(on_last=self._drop)
        self._watches: dict[str, _KeyWatch] = {}

    async def watch(self, key: str, start: bytes, end: bytes) -> ReleaseWatch:
        """Watch ``key`` (records in ``[start, end)``); returns once the watch is created."""
        watch = self.hub.watch(key)
        try:
            current = self._watches.get(key)
            if current is None or (current.task is not None and current.task.done()):
                current = _KeyWatch(asyncio.get_running_loop().create_future())
                self._watches[key] = current
                current.task = asyncio.get_running_loop().create_task(
                    self._run(key, start, end, current)
                )
            await asyncio.wait_for(asyncio.shield(current.ready), self._timeout_s)
        except BaseException:
            watch.close()
            raise
        return watch

    async def _run(self, key: str, start: bytes, end: bytes, state: _KeyWatch) -> None:
        from aetcd.rtypes import EventKind  # type: ignore[import-untyped]  # noqa: PLC0415

        try:
            client = await self._client()
            state.watch = await client.watch(start, range_end=end, kind=EventKind.DELETE)
            state.ready.set_result(None)
            async for _event in state.watch:
                self.hub.notify(key)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 (the watch is lost: its waiters look again)
            _log.debug("watch on %r lost (%s: %s)", key, type(exc).__name__, exc)
            if not state.ready.done():
                state.ready.set_exception(exc)
                state.ready.add_done_callback(_ignore_outcome)
        finally:
            if self._watches.get(key) is state:
                del self._watches[key]
            self.hub.notify(key)

    def _drop(self, key: str) -> None:
        state = self._watches.pop(key, None)
        if state is not None and state.task is not None:
            state.task.cancel()
            if state.watch is not None:
                cancel = asyncio.get_running_loop().create_task(state.watch.cancel())
                cancel.add_done_callback(_ignore_outcome)

    async def aclose(self) -> None:
        """Cancel every watch; waiters are woken."""
        tasks = [state.task for state in self._watches.values() if state.task is not None]
        watches = [state.watch for state in self._watches.values() if state.watch is not None]
        self._watches.clear()
        for task in tasks:
            task.cancel()
        for watch in watches:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(watch.cancel(), self._timeout_s)
        if tasks:
            await asyncio.wait(tasks, timeout=self._timeout_s)
        self.hub.notify_all()


def _ignore_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
