"""A ``timeout=None`` :class:`leasekit.Lock`'s lease: a :class:`LeaseHold` kept in a task."""

from __future__ import annotations

import asyncio

from ._errors import LeaseHeld
from ._hold import LeaseHold

__all__ = ["Keeper"]


class Keeper:
    """A ``timeout=None`` lock's lease, held and renewed by a :class:`LeaseHold` in a task."""

    def __init__(self, lease: LeaseHold) -> None:
        self.lease = lease
        self._release = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def lost_reason(self) -> str | None:
        return self.lease.lost_reason

    async def _hold(self, entered: asyncio.Future[None]) -> None:
        try:
            async with self.lease:
                entered.set_result(None)
                await self._release.wait()
        except BaseException as exc:
            if not entered.done():
                if isinstance(exc, asyncio.CancelledError):
                    entered.cancel()
                else:
                    entered.set_exception(exc)
                return
            raise

    async def start(self) -> bool:
        loop = asyncio.get_running_loop()
        entered: asyncio.Future[None] = loop.create_future()
        task = self._task = loop.create_task(
            self._hold(entered), name=f"leasekit lock {self.lease.key!r}"
        )
        try:
            await asyncio.wait([entered, task], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()  # the hold leaves nothing held when cancelled while entering
            raise
        try:
            await entered
        except LeaseHeld:
            await task
            return False
        return True

    async def stop(self) -> None:
        """Leave the hold: it releases the lease unless it was lost."""
        task = self._task
        if task is None:
            return
        self._release.set()
        await task
