"""Auto-pipelining: commands that tasks issue in one event-loop iteration, written together.

When an operation starts while none of the provider's is in flight, its command goes
out at once, alone: a single task pays nothing for pipelining. When others are in
flight, it joins the open *batch* (or opens one). A batch is written at the next
event-loop iteration, or, on a client built from a URL, as soon as a connection is
free (``max_connections``): until then it takes in every command issued meanwhile.
It goes out as one non-transactional pipeline (redis-py's ``pipeline(transaction=
False)``): one write, its replies read back in order, each handed to the caller that
issued it. On Redis Cluster the pipeline splits itself by node (redis-py's cluster
pipeline), one write per node.

Non-transactional means each script stays atomic on its own, exactly as when sent
alone, and a script that fails (its reply is an error) fails only its caller. A
connection that fails fails every caller in the batch, each with its own mapped
error. Each caller keeps its own deadline (``timeout_s``, on the provider's timer):
a caller who runs out stops waiting and gets a timeout, and its command is not sent
if the batch was still waiting for a connection. The batch itself is bounded by
``timeout_s`` from the moment it is written, which is no earlier than any of its
callers began, so it never outlives them by more than that; ``aclose`` drains it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from redis.exceptions import NoScriptError

from leasekit.backend import Deadlines

from ._replies import ScriptCall

__all__ = ["AutoPipeline"]

Command = tuple[Any, ...]


class _Batch:
    """The commands of one batch, with the callers waiting for their replies."""

    __slots__ = ("commands", "futures", "keys", "scripts")

    def __init__(self) -> None:
        self.commands: list[Command] = []
        self.scripts: list[ScriptCall | None] = []  # for the EVAL fallback on NOSCRIPT
        self.keys: list[str | None] = []
        self.futures: list[asyncio.Future[Any]] = []


class AutoPipeline:
    """Sends the provider's commands: alone when nothing else is in flight, else batched.

    ``deadlines`` is the provider's timer, ``spawn`` its way to start background work
    that ``aclose`` drains, and ``timeout(key)`` the error a caller gets when the
    batch it waits for ran out of time. ``slots`` (set by ``from_url``) lets at most
    that many commands or batches run at once.
    """

    __slots__ = (
        "_batch",
        "_busy",
        "_client",
        "_deadlines",
        "_spawn",
        "_timeout",
        "batches",
        "enabled",
        "slots",
    )

    def __init__(
        self,
        client: Any,
        *,
        enabled: bool,
        deadlines: Deadlines,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
        timeout: Callable[[str | None], BaseException],
    ) -> None:
        self._client = client
        self.enabled = enabled
        self._deadlines = deadlines
        self._spawn = spawn
        self._timeout = timeout
        self.slots: asyncio.Semaphore | None = None
        self._batch: _Batch | None = None
        self._busy = 0  # commands sent or queued and not yet answered
        self.batches = 0  # pipelines written (two commands or more), for tests and curiosity

    def submit(
        self, command: Command, script: ScriptCall | None, key: str | None
    ) -> Awaitable[Any]:
        """What to await for ``command``'s reply (``script`` when it is an ``EVALSHA``).

        Never raises by itself: errors arrive through the awaitable, raw from redis-py
        (the provider maps them for its caller). The provider refuses calls once closed
        before submitting them, so nothing joins a batch after ``aclose`` began.
        """
        batch = self._batch
        if batch is None:
            if not self._busy or not self.enabled:
                return self._alone(command, script)
            batch = self._batch = _Batch()
            self._spawn(self._flush(batch))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        batch.commands.append(command)
        batch.scripts.append(script)
        batch.keys.append(key)
        batch.futures.append(future)
        self._busy += 1
        return future

    # -- one command alone: the caller's own task does the I/O --------------------------

    async def _alone(self, command: Command, script: ScriptCall | None) -> Any:
        client = self._client
        slots = self.slots
        self._busy += 1
        try:
            if slots is not None:
                await slots.acquire()
            try:
                return await client.execute_command(*command)
            except NoScriptError:
                # The server's script cache was flushed, or this is its first call here:
                # EVAL runs the script and caches it again, so EVALSHA works next time.
                if script is None:
                    raise
                return await client.execute_command(*script.eval())
            finally:
                if slots is not None:
                    slots.release()
        finally:
            self._busy -= 1

    # -- a batch: its own task writes it and hands out the replies ----------------------

    async def _flush(self, batch: _Batch) -> None:
        slots = self.slots
        acquired = False
        try:
            if slots is not None:
                await slots.acquire()  # the batch stays open meanwhile, taking in more
                acquired = True
            if self._batch is batch:
                self._batch = None
            # Callers who ran out of time while the batch waited: their writes stay unsent.
            live = [i for i, future in enumerate(batch.futures) if not future.done()]
            if live:
                await self._write(batch, live)
        finally:
            if self._batch is batch:
                self._batch = None  # cancelled while waiting for a connection (aclose)
            if acquired and slots is not None:
                slots.release()
            self._busy -= len(batch.futures)
            for future, key in zip(batch.futures, batch.keys, strict=True):
                if not future.done():
                    future.set_exception(self._timeout(key))

    async def _write(self, batch: _Batch, live: list[int]) -> None:
        commands = [batch.commands[i] for i in live]
        scripts = [batch.scripts[i] for i in live]
        futures = [batch.futures[i] for i in live]
        deadlines = self._deadlines
        watch = deadlines.open()
        try:
            if watch is None:  # Python 3.10, where the timer cannot cancel a task
                replies = await asyncio.wait_for(self._send(commands, scripts), deadlines.timeout_s)
            else:
                replies = await self._send(commands, scripts)
        except asyncio.CancelledError:
            if deadlines.close(watch):
                return  # our own deadline: _flush gives each caller left a timeout
            raise
        except Exception as exc:  # noqa: BLE001 (handed to every caller, who maps it)
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            return
        finally:
            deadlines.close(watch)
        for future, reply in zip(futures, replies, strict=True):
            if future.done():
                continue  # its caller gave up
            if isinstance(reply, BaseException):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _send(self, commands: list[Command], scripts: list[ScriptCall | None]) -> list[Any]:
        """The replies to ``commands`` in order; an error reply stands in its own place."""
        if len(commands) == 1:
            return [await self._execute(commands[0], scripts[0])]
        replies = await self._pipelined(commands)
        retry = [
            (i, script)
            for i, (reply, script) in enumerate(zip(replies, scripts, strict=True))
            if script is not None and isinstance(reply, NoScriptError)
        ]
        if retry:
            # The script cache was flushed: EVAL those (which caches them again), in one
            # more pipeline.
            again = await self._pipelined([script.eval() for _, script in retry])
            for (i, _), reply in zip(retry, again, strict=True):
                replies[i] = reply
        return replies

    async def _pipelined(self, commands: list[Command]) -> list[Any]:
        """``commands`` in one non-transactional pipeline: replies, error replies in place."""
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        self.batches += 1
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        return replies

    async def _execute(self, command: Command, script: ScriptCall | None) -> Any:
        """One command on its own (as in :meth:`_alone`, whose copy saves a frame)."""
        client = self._client
        try:
            return await client.execute_command(*command)
        except NoScriptError:
            if script is None:
                raise
            return await client.execute_command(*script.eval())
