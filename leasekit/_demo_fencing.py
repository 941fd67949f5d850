"""``leasekit demo --fencing``: Kleppmann's paused lease holder, reproduced with real processes.

Two worker processes share a lease store and a protected resource:

1. worker-a acquires the lease (fencing token *n*), checks that it is still valid by its
   own clock, and is about to write;
2. the driver freezes it right there with ``SIGSTOP`` (a GC pause, a swapped-out VM);
3. worker-b keeps trying to acquire; the store itself expires worker-a's lease after
   its TTL, and worker-b gets the key with a higher token and writes through the
   fencing guard;
4. the driver resumes worker-a with ``SIGCONT``; it goes on with the write it had
   decided to make, carrying its old token, and the guard must reject it.

The resource is a SQLite table guarded by :func:`leasekit.fencing.fence_sqlite` (in a
temporary file), or, when the lease store is Redis, a Redis key written by
:func:`leasekit.fencing.fenced_redis_write_sync`. The verdict is drawn from what the
workers reported and what the resource holds at the end.

Run as ``python -m leasekit._demo_fencing CONFIG_JSON`` this module is a worker: it
reports each step as one JSON line on stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import leasekit

from . import connect
from ._capabilities import capabilities_of
from ._errors import InvalidLeaseArgument, LeaseError, StaleFencingToken
from ._registry import scheme_of
from .backend import sync_factory
from .fencing import fence_sqlite, fenced_redis_write_sync

__all__ = ["FencingConfig", "FencingVerdict", "judge_fencing", "run_fencing_demo"]

_REDIS_SCHEMES = frozenset({"redis", "rediss"})
_STEP_TIMEOUT_S = 60.0  # per step, far above anything a working store needs
_POLL_S = 0.02  # how often worker-b retries its acquire


@dataclass(frozen=True, slots=True)
class FencingConfig:
    """One run, as the workers receive it (JSON on the command line)."""

    url: str  # the lease store
    key: str  # the lease key, also the guarded resource's name
    ttl_ms: int
    redis_url: str | None = None  # the resource is a key on this Redis server ...
    sqlite_path: str | None = None  # ... or a table in this SQLite file

    @property
    def resource(self) -> str:
        """The name the guard fences; on Redis a hash tag, so that the fence key and the
        document key share one Cluster slot."""
        return f"{{{self.key}}}" if self.redis_url else self.key

    @property
    def document_key(self) -> str:
        """The Redis key the workers write."""
        return f"{self.resource}:document"


@dataclass(frozen=True, slots=True)
class FencingVerdict:
    """What the run showed."""

    fenced: bool
    summary: str
    stale_token: int | None
    fresh_token: int | None
    final_value: str | None


# -- the protected resource --------------------------------------------------------------------


class _Resource:
    """The resource both workers write, and the guard in front of it."""

    def __init__(self, config: FencingConfig) -> None:
        self.config = config
        self.redis = config.redis_url is not None
        self.path = config.sqlite_path or ""

    def describe(self) -> str:
        if self.redis:
            return f"Redis key {self.config.document_key!r} (guard: one Lua script)"
        return f"SQLite table 'document' in {self.path} (guard: fence_sqlite, BEGIN IMMEDIATE)"

    @contextlib.contextmanager
    def _redis_client(self) -> Iterator[Any]:
        """redis-py's blocking client on the lease store, built by the backend itself.

        The backend's native blocking provider (its ``sync_from_url``) reads the URL with
        the backend's own parser, so every option means what it means to the lease
        store, and only the driver's settings reach redis-py; its ``client`` is the one
        the fenced writes go through.
        """
        url = self.config.redis_url or ""
        factory = sync_factory(leasekit._registry.load(scheme_of(url)))
        if factory is None:
            raise InvalidLeaseArgument(f"the backend for {url.split(':', 1)[0]}:// has no client")
        provider: Any = factory(url)
        try:
            yield provider.client
        finally:
            provider.close()

    def _sqlite(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=_STEP_TIMEOUT_S)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    def create(self) -> None:
        if self.redis:
            return
        with contextlib.closing(self._sqlite()) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS document (id INTEGER PRIMARY KEY, body TEXT)")
            conn.execute("INSERT OR IGNORE INTO document (id, body) VALUES (1, NULL)")

    def write(self, token: int, body: str) -> None:
        """Write ``body`` with ``token``; raises :class:`StaleFencingToken` if it is stale."""
        if self.redis:
            with self._redis_client() as client:
                fenced_redis_write_sync(
                    client, self.config.resource, token, [("SET", self.config.document_key, body)]
                )
            return
        with contextlib.closing(self._sqlite()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                fence_sqlite(conn, self.config.resource, token)
                conn.execute("UPDATE document SET body = ? WHERE id = 1", (body,))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def read(self) -> str | None:
        if self.redis:
            with self._redis_client() as client:
                value = client.get(self.config.document_key)
            return None if value is None else bytes(value).decode()
        with contextlib.closing(self._sqlite()) as conn:
            row = conn.execute("SELECT body FROM document WHERE id = 1").fetchone()
        return None if row is None else row[0]

    def remove(self) -> None:
        """Delete what the run wrote to a Redis server (a SQLite file goes with its dir)."""
        if self.redis:
            from .fencing import DEFAULT_REDIS_FENCE_PREFIX  # noqa: PLC0415

            with self._redis_client() as client:
                client.delete(self.config.document_key)
                client.delete(DEFAULT_REDIS_FENCE_PREFIX + self.config.resource)


# -- the workers -------------------------------------------------------------------------------


def _report(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


async def _worker_a(config: FencingConfig, resource: _Resource) -> None:
    owner = "worker-a"
    async with connect(config.url) as leases:
        started = time.monotonic()
        granted = await leases.acquire_lease(config.key, owner, config.ttl_ms)
        if not granted.acquired or granted.token is None:
            _report("error", message=f"worker-a could not acquire: {granted}")
            return
        _report("acquired", token=granted.token)
        # The careful holder checks, by its own clock, that its lease is still valid...
        remaining_ms = config.ttl_ms - (time.monotonic() - started) * 1000
        _report("checked", remaining_ms=round(remaining_ms))
        # ... and is frozen by the driver before the write it decided to make.
        sys.stdin.readline()
        body = f"written by {owner} with token {granted.token}"
        try:
            resource.write(granted.token, body)
        except StaleFencingToken as exc:
            _report("rejected", token=granted.token, current=exc.current, message=str(exc))
        else:
            _report("written", token=granted.token, body=body)
        await leases.release_lease(config.key, owner)  # a no-op: worker-b holds the key


async def _worker_b(config: FencingConfig, resource: _Resource) -> None:
    owner = "worker-b"
    async with connect(config.url) as leases:
        started = time.monotonic()
        while True:
            granted = await leases.acquire_lease(config.key, owner, config.ttl_ms)
            if granted.acquired:
                break
            if time.monotonic() - started > _STEP_TIMEOUT_S:
                _report("error", message=f"worker-b never got the key: held by {granted.owner}")
                return
            await asyncio.sleep(_POLL_S)
        if granted.token is None:
            _report("error", message="the lease store returned no fencing token")
            return
        waited_ms = round((time.monotonic() - started) * 1000)
        _report("acquired", token=granted.token, waited_ms=waited_ms)
        body = f"written by {owner} with token {granted.token}"
        try:
            resource.write(granted.token, body)
        except StaleFencingToken as exc:
            _report("rejected", token=granted.token, current=exc.current, message=str(exc))
            return
        _report("written", token=granted.token, body=body)
        await leases.release_lease(config.key, owner)


def _worker_main(argv: list[str]) -> int:
    role, raw = argv
    config = FencingConfig(**json.loads(raw))
    work = _worker_a if role == "a" else _worker_b
    try:
        asyncio.run(work(config, _Resource(config)))
    except Exception as exc:  # noqa: BLE001 (any failure is reported to the driver)
        _report("error", message=f"{type(exc).__name__}: {exc}")
        return 1
    return 0


# -- the driver --------------------------------------------------------------------------------


class _Worker:
    """A worker process and the events it reported, read by a thread."""

    def __init__(self, name: str, role: str, config: FencingConfig) -> None:
        self.name = name
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.process = subprocess.Popen(  # noqa: S603 (this interpreter, our own module)
            [sys.executable, "-m", __name__, role, json.dumps(asdict(config))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,))
        self._reader.daemon = True
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with contextlib.suppress(ValueError):
                self.events.put(json.loads(line))
        self.events.put(None)

    def expect(self, *kinds: str) -> dict[str, Any]:
        """The worker's next event, which must be one of ``kinds``."""
        try:
            event = self.events.get(timeout=_STEP_TIMEOUT_S)
        except queue.Empty:
            raise LeaseError(f"{self.name} reported nothing for {_STEP_TIMEOUT_S:g} s") from None
        if event is None or event["event"] not in kinds:
            raise LeaseError(f"{self.name} failed: {self._failure(event)}")
        return event

    def _failure(self, event: dict[str, Any] | None) -> str:
        if event is not None and event.get("event") == "error":
            return str(event.get("message"))
        if event is not None:
            return f"unexpected report {event}"
        stderr = self.process.stderr.read() if self.process.stderr is not None else ""
        return f"exited ({self.process.wait()}) {stderr.strip()[-2000:]}"

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signum)

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def finish(self, *, completed: bool) -> None:
        """Let a worker that reported everything exit (``completed``), or end one cut
        short at once; resume it first if it is stopped. Then close its pipes."""
        if self.process.poll() is None:
            if not completed:
                self.process.kill()  # SIGKILL ends a stopped process too
            self.signal(signal.SIGCONT)
            try:
                self.process.wait(timeout=_STEP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def judge_fencing(
    stale: dict[str, Any], fresh: dict[str, Any], stale_write: dict[str, Any], final: str | None
) -> FencingVerdict:
    """The verdict from worker-a's grant (``stale``), worker-b's (``fresh``), what happened
    to worker-a's late write, and the resource's final value."""
    old, new = stale.get("token"), fresh.get("token")
    expected = f"written by worker-b with token {new}"
    if stale_write.get("event") != "rejected":
        summary = "NOT FENCED: the stale write went through and overwrote the newer one"
        return FencingVerdict(False, summary, old, new, final)
    if not (isinstance(old, int) and isinstance(new, int) and old < new):
        summary = f"NOT FENCED: tokens did not increase ({old} then {new})"
        return FencingVerdict(False, summary, old, new, final)
    if final != expected:
        summary = f"NOT FENCED: the resource holds {final!r}, not worker-b's write"
        return FencingVerdict(False, summary, old, new, final)
    return FencingVerdict(True, "fenced: the stale write was rejected", old, new, final)


def run_fencing_demo(
    url: str | None, *, ttl_ms: int = 600, echo: Callable[[str], None] = lambda _: None
) -> FencingVerdict:
    """Run the scenario on lease store ``url`` (default: a temporary SQLite file).

    Raises :class:`InvalidLeaseArgument` where the scenario cannot run (no POSIX
    signals, a store not shared across processes), and :class:`LeaseError` subclasses
    when a store or a worker fails.
    """
    if not hasattr(signal, "SIGSTOP"):
        raise InvalidLeaseArgument("demo --fencing pauses a process with SIGSTOP: POSIX only")
    with tempfile.TemporaryDirectory(prefix="leasekit-fencing-") as tmp:
        url = url or f"sqlite:///{Path(tmp) / 'leases.db'}"
        redis = urlsplit(url).scheme.lower() in _REDIS_SCHEMES
        config = FencingConfig(
            url=url,
            key=f"leasekit-demo-fencing-{uuid.uuid4().hex[:8]}",
            ttl_ms=ttl_ms,
            redis_url=url if redis else None,
            sqlite_path=None if redis else str(Path(tmp) / "resource.db"),
        )
        asyncio.run(_check_store(url))
        resource = _Resource(config)
        resource.create()
        try:
            return _drive(config, resource, echo)
        finally:
            resource.remove()


async def _check_store(url: str) -> None:
    async with connect(url, require="fencing") as leases:
        if not capabilities_of(leases).shared_across_processes:
            raise InvalidLeaseArgument(
                f"demo --fencing needs a store that worker processes share; {url} is not"
            )
        await leases.get_lease_owner("leasekit-demo-fencing-probe")  # reachable at all?


def _drive(
    config: FencingConfig, resource: _Resource, echo: Callable[[str], None]
) -> FencingVerdict:
    origin = time.monotonic()

    def say(who: str, text: str) -> None:
        echo(f"{time.monotonic() - origin:6.2f}s  {who:<9} {text}")

    echo(f"leasekit demo --fencing: a lease holder paused past its TTL, on {config.url}")
    echo(f"lease key {config.key!r}, TTL {config.ttl_ms} ms")
    echo(f"resource: {resource.describe()}")
    a = _Worker("worker-a", "a", config)
    b: _Worker | None = None
    completed = False
    try:
        stale = a.expect("acquired")
        say("worker-a", f"acquired the lease, fencing token {stale['token']}")
        checked = a.expect("checked")
        say("worker-a", f"checked: lease valid for {checked['remaining_ms']} ms more; writing")
        a.signal(signal.SIGSTOP)
        paused = time.monotonic()
        say("driver", f"SIGSTOP worker-a (pid {a.process.pid}) before its write")
        a.send("write")  # waits in the pipe until worker-a runs again
        b = _Worker("worker-b", "b", config)
        fresh = b.expect("acquired")
        say(
            "worker-b",
            f"acquired the lease, fencing token {fresh['token']}, once the store expired "
            f"worker-a's (tried for {fresh['waited_ms']} ms)",
        )
        written = b.expect("written", "rejected")
        say("worker-b", _outcome(written))
        a.signal(signal.SIGCONT)
        say("driver", f"SIGCONT worker-a after {time.monotonic() - paused:.2f} s paused")
        late = a.expect("written", "rejected")
        say("worker-a", f"resumed, still believing it holds the lease; {_outcome(late)}")
        completed = True
    finally:
        for worker in (a, b):
            if worker is not None:
                worker.finish(completed=completed)
    final = resource.read()
    verdict = judge_fencing(stale, fresh, late, final)
    echo(f"resource holds {final!r}")
    echo(f"verdict: {verdict.summary}")
    return verdict


def _outcome(event: dict[str, Any]) -> str:
    if event["event"] == "written":
        return f"wrote with token {event['token']}: accepted"
    return f"wrote with token {event['token']}: REJECTED ({event['message']})"


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
