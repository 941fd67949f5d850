"""Helpers for the hold(), sync and hook tests: a provider with scripted renewals, polling.

Nothing here sleeps for a fixed time and then asserts: tests wait for a condition,
with a generous limit that only a hung test reaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from leasekit import LeaseBackendError, LeaseProvider, LeaseResult

ROOT = Path(__file__).resolve().parent.parent

PATIENCE_S = 10.0
"""How long a test waits for something that should happen in milliseconds."""


class ScriptedProvider:
    """A real provider whose renewals can be made to fail, hang, or be refused.

    ``fail_renewals`` makes that many next renewals raise :class:`LeaseBackendError`;
    ``renew_mode`` then decides the rest: ``"ok"`` (the real provider answers),
    ``"fail"``, ``"hang"`` (never returns) or ``"refuse"`` (returns False).
    """

    def __init__(self, inner: LeaseProvider) -> None:
        self.inner = inner
        self.renew_mode = "ok"
        self.fail_renewals = 0
        self.renew_calls = 0
        self.renewed = 0
        self.hanging = 0

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        return await self.inner.acquire_lease(key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        return await self.inner.get_lease_owner(key)

    async def release_lease(self, key: str, owner: str) -> None:
        await self.inner.release_lease(key, owner)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)

    async def _follow_script(self, failure: str, key: str | None = None) -> bool:
        """Fail, hang or go on as scripted; whether the renewal is to be refused."""
        if self.fail_renewals > 0:
            self.fail_renewals -= 1
            raise LeaseBackendError(failure, backend="scripted", key=key)
        if self.renew_mode == "fail":
            raise LeaseBackendError(failure, backend="scripted", key=key)
        if self.renew_mode == "hang":
            self.hanging += 1
            try:
                await asyncio.Event().wait()
            finally:
                self.hanging -= 1
        return self.renew_mode == "refuse"

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        self.renew_calls += 1
        if await self._follow_script("injected failure", key):
            return False
        renewed = await self.inner.renew_lease(key, owner, ttl_ms)
        self.renewed += renewed
        return renewed


class BatchingScriptedProvider(ScriptedProvider):
    """A :class:`ScriptedProvider` that also renews in batches (``renew_leases``).

    hold() sends its renewals here instead of to ``renew_lease``. The same script
    applies to a whole batch: a failure or a hang is the batch's, a refusal answers
    every item False. ``batches`` counts the calls; ``renew_calls`` and ``renewed``
    count items, as for single renewals. The real work is the inner provider's own
    ``renew_leases`` when it has one, else its ``renew_lease`` per item.
    """

    def __init__(self, inner: LeaseProvider) -> None:
        super().__init__(inner)
        self.batches = 0
        self.largest_batch = 0

    async def renew_leases(self, items: Sequence[tuple[str, str, int]]) -> list[bool]:
        self.batches += 1
        self.largest_batch = max(self.largest_batch, len(items))
        self.renew_calls += len(items)
        if await self._follow_script("injected batch failure"):
            return [False] * len(items)
        many = getattr(self.inner, "renew_leases", None)
        if callable(many):
            results: list[bool] = await many(items)
        else:
            results = [await self.inner.renew_lease(*item) for item in items]
        self.renewed += sum(results)
        return results


def scripted_provider(inner: LeaseProvider, renewals: str) -> ScriptedProvider:
    """A scripted provider renewing ``"one_by_one"`` or ``"batched"``."""
    if renewals == "batched":
        return BatchingScriptedProvider(inner)
    assert renewals == "one_by_one", renewals
    return ScriptedProvider(inner)


RENEWAL_PATHS = ["one_by_one", "batched"]
"""How hold() can renew: ``renew_lease`` per lease, or coalesced ``renew_leases`` calls."""


async def eventually(predicate: Callable[[], bool], what: str = "condition") -> None:
    """Wait until ``predicate()`` is true; fail after :data:`PATIENCE_S`."""
    deadline = time.monotonic() + PATIENCE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)


def leasekit_tasks() -> list[asyncio.Task[object]]:
    """Tasks running leasekit code (renewers, in-flight operations) on this loop."""
    found = []
    for task in asyncio.all_tasks():
        name = getattr(task.get_coro(), "__qualname__", "")
        if name.startswith(
            (
                "LeaseHold.",
                "Renewing.",  # LeaseHold's renew loop (leasekit._renewer)
                "HookedLeaseProvider.",
                "ScriptedProvider.",
                "BatchingScriptedProvider.",
                "RenewalBatcher.",
            )
        ):
            found.append(task)
    return found


class LoopTurns:
    """Counts event-loop turns: a task that steps once per turn while running.

    Latency in loop turns is what the code controls; latency in milliseconds is what
    the machine's load adds on top. Tests assert the former.

    ``count`` is the ticking task's step count. ``between()`` uses the loop's own turn
    boundaries instead: the time each turn's poll for I/O returned, which is just
    before the turn collects its due timers. A ticking task's step is not a turn
    boundary: on a loaded machine the process can be preempted between the turn's start
    and the tick, so a tick can fall after a deadline whose timer that turn did not yet
    see as due, and a one-turn delay would be counted as two.
    """

    def __init__(self) -> None:
        self.count = 0
        self.times: list[float] = []  # time.monotonic() at each tick
        self.starts: list[float] = []  # time.monotonic() as each turn polled for I/O
        self._task: asyncio.Task[None] | None = None
        self._selector: Any = None
        self._watched = False  # whether `starts` was recorded (kept after the block ends)

    async def _tick(self) -> None:
        while True:
            self.count += 1
            self.times.append(time.monotonic())
            await asyncio.sleep(0)

    def between(self, start: float, end: float) -> int:
        """How many loop turns began at or after ``start`` and before ``end``."""
        starts = self.starts if self._watched else self.times
        return sum(1 for t in starts if start <= t < end)

    def _watch_turns(self) -> None:
        # asyncio's selector loops call their selector's select() once per turn, before
        # they look at the timers; record when each call returns. (Other loops, uvloop
        # for one, fall back to the ticks.)
        selector = getattr(asyncio.get_running_loop(), "_selector", None)
        if selector is None or not callable(getattr(selector, "select", None)):
            return
        select = selector.select
        starts = self.starts

        def watched(timeout: float | None = None) -> Any:
            events = select(timeout)
            starts.append(time.monotonic())
            return events

        selector.select = watched
        self._selector = selector
        self._watched = True

    async def __aenter__(self) -> LoopTurns:
        self._watch_turns()
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
        if self._selector is not None:
            del self._selector.select  # the class's own method again
            self._selector = None


class FreezableProxy:
    """A loopback TCP proxy to ``host:port`` that can freeze its connections.

    ``freeze()`` stops forwarding in both directions while every connection stays
    open: to the client the server looks alive but silent, the way a stalled network
    path or a hung middlebox looks (unlike SIGSTOP, the server itself keeps running,
    so its leases expire on time and other clients are served). ``thaw()`` forwards
    what was held back. Threads, not the test's event loop, do the forwarding, so a
    busy or blocked loop does not slow the proxy.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.host, self.port = self._listener.getsockname()[:2]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="leasekit-test-proxy", daemon=True).start()

    def freeze(self) -> None:
        """Stop forwarding: whatever either side sends from now on is held back."""
        self._flowing.clear()

    def thaw(self) -> None:
        """Forward again, starting with what was held back."""
        self._flowing.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = source.recv(65536)
                self._flowing.wait()
                if not data or self._closed:
                    break
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Close the listener and every connection."""
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        self._flowing.set()
        self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> FreezableProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def shared_url(backend: str, tmp_path_str: str, name: str) -> str:
    """A URL whose connections share leases: a named memory store or one SQLite file."""
    if backend == "memory":
        return f"memory://{name}"
    return f"sqlite:///{tmp_path_str}/leases.db"


def run_example(name: str, cwd: Path) -> str:
    """Run ``examples/<name>`` in a fresh interpreter (warnings are errors); its stdout."""
    done = subprocess.run(
        [sys.executable, "-W", "error", str(ROOT / "examples" / name)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert done.stderr == ""
    return done.stdout


def documented_output(page: str, example: str) -> str:
    """What ``docs/<page>`` shows an example printing; the page must quote it verbatim."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    source = (ROOT / "examples" / example).read_text(encoding="utf-8")
    quoted = f"```python\n{source}```\n"
    assert quoted in text, f"docs/{page} must quote examples/{example} verbatim"
    shown = re.search(r"```text\n(.*?)```", text.split(quoted, 1)[1], re.DOTALL)
    assert shown is not None, f"docs/{page} must show what examples/{example} prints"
    return shown.group(1)


__all__ = [
    "PATIENCE_S",
    "RENEWAL_PATHS",
    "ROOT",
    "BatchingScriptedProvider",
    "FreezableProxy",
    "LoopTurns",
    "ScriptedProvider",
    "documented_output",
    "eventually",
    "leasekit_tasks",
    "run_example",
    "scripted_provider",
    "shared_url",
]
