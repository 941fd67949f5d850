"""etcd: the raw aetcd floor and python-etcd3's ``Lock`` for ``leasekit bench etcd://``.

Registered in the ``leasekit.bench`` entry-point group for ``etcd`` and ``etcds``, and
imported only when such a URL is benchmarked. Both read the URL with the provider's
own parser (:func:`~leasekit_etcd._options.url_settings`: endpoints, credentials,
``prefix`` and the TLS files mean the same to each) and talk to its first endpoint.

The floor is the least an owner-checked lease that leaves no etcd lease behind takes
with raw aetcd (the client leasekit builds on): grant an etcd lease; one transaction
that puts the key on it if the key does not exist; release by revoking that etcd
lease, which deletes the key bound to it in the same step. Three round trips per
cycle, all writes through the raft log; a denial costs the same (grant, transaction,
revoke). The revoke is the owner check: the floor's key is only ever on the lease the
floor granted for it. leasekit cannot release that way (its holders move records
between etcd leases for a new TTL or a transfer, from any process, so a bare revoke
could miss; ``docs/backends/etcd.md`` explains), and its cycle waits for three round
trips too: grant and transaction, then a transaction that deletes the record, whose
lease it revokes in the background. The floor has no fencing token, no holder on
denial, no timeouts, no failover and no TLS (``aetcd.Client`` speaks plaintext only).

The peer is python-etcd3's ``Lock`` (``pip install etcd3``), used the way its
documentation shows: ``client.lock(key, ttl)``, ``acquire(timeout=0)``, ``release()``.
python-etcd3 0.12 cannot load with the C protobuf runtime of protobuf 4 and newer,
and the pure-Python one it needs would slow aetcd down too if they shared a process,
so it runs in a child process with ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python``,
one thread per benchmark task, each cycle asked for and answered over a pipe (tens of
microseconds, next to milliseconds for a cycle). Its ``release`` deletes the key but
never revokes the etcd lease, which stays until its TTL runs out: one left behind per
cycle, and per denial. With tenacity 8.3 and newer its ``acquire(timeout=0)`` raises
``TypeError`` after a denied attempt (it hands tenacity an old-style wait callback);
the child counts that, and only that, as the denial it is.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from leasekit.bench import AsyncCycler, BenchTarget, Contender, SchemeBench, SyncCycler

from ._options import url_settings

if TYPE_CHECKING:
    import aetcd  # type: ignore[import-untyped]

__all__ = ["BENCH"]

_DEFAULT_PORT = 2379
# python-etcd3 names every lock's key "/locks/<name>".
_ETCD3_LOCK_PREFIX = "/locks/"
# More than the most tasks of any scenario: every benchmark thread gets one of its own.
_CHILD_THREADS = 128
_CHILD_START_TIMEOUT_S = 60.0
_CYCLE_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """What the floor and the peer need from an ``etcd://`` URL: its first endpoint."""

    host: str
    port: int
    tls: bool
    username: str | None
    password: str | None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        """leasekit's key prefix for this URL (its ``prefix`` option)."""
        prefix: str = self.options["prefix"]
        return prefix


def _endpoint(url: str) -> _Endpoint:
    """The URL's first endpoint and its options, as the provider reads them."""
    settings = url_settings(url)
    first = settings.endpoints[0]
    return _Endpoint(
        host=first.host,
        port=first.port or _DEFAULT_PORT,
        tls=settings.tls,
        username=settings.options["username"],
        password=settings.options["password"],
        options={
            **settings.options,
            **{name: path for name, path in settings.tls_files.items() if path is not None},
        },
    )


def _ttl_s(target: BenchTarget) -> int:
    # etcd lease TTLs are whole seconds; leasekit rounds up, and so do the others here.
    return max(1, math.ceil(target.ttl_ms / 1000))


async def _aetcd_client(endpoint: _Endpoint) -> aetcd.Client:
    import aetcd  # noqa: PLC0415 (drivers load only when benchmarked)

    if endpoint.tls:
        raise RuntimeError("aetcd.Client has no TLS: the aetcd floor runs on etcd:// only")
    client = aetcd.Client(
        host=endpoint.host,
        port=endpoint.port,
        username=endpoint.username,
        password=endpoint.password,
    )
    try:
        await client.connect()
    except BaseException:
        await client.close()
        raise
    return client


# -- the floor: grant, put-if-absent transaction, revoke on raw aetcd -------------------------


class _RawCycler:
    def __init__(self, client: aetcd.Client, ttl_s: int) -> None:
        self._client = client
        self._txn = client.transactions
        self._ttl_s = ttl_s

    async def cycle(self, key: str, owner: str) -> bool:
        client, txn = self._client, self._txn
        name = key.encode()
        lease = await client.lease(self._ttl_s)
        acquired, _ = await client.transaction(
            compare=[txn.create(name) == 0],
            success=[txn.put(name, owner.encode(), lease=lease.id)],
            failure=[],
        )
        # Releases the key if acquired (it is on this lease alone), else the lease only.
        await client.revoke_lease(lease.id)
        return bool(acquired)

    async def aclose(self) -> None:
        await self._client.close()


async def _open_raw(target: BenchTarget) -> AsyncCycler:
    client = await _aetcd_client(_endpoint(target.url))
    return _RawCycler(client, _ttl_s(target))


# -- python-etcd3's Lock, in a child process --------------------------------------------------

# Reads one JSON line of settings, connects, says so, then answers each request line
# [id, key] with [id, acquired] (or [id, null, error]) from a pool of threads.
_ETCD3_CHILD = r"""
import json, sys, threading
from concurrent.futures import ThreadPoolExecutor

settings = json.loads(sys.stdin.readline())
try:
    import etcd3
    client = etcd3.client(**settings["client"])
    client.status()
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
    sys.exit(1)
ttl = settings["ttl_s"]
out = threading.Lock()

def acquire(lock):
    try:
        return lock.acquire(timeout=0)
    except TypeError as exc:
        # With tenacity >= 8.3, Lock.acquire calls its old-style wait callback after a
        # denied attempt, which raises; the denial (lease cleared) has happened.
        if lock.lease is None and "delay_since_first_attempt" in str(exc):
            return False
        raise

def cycle(ident, key):
    try:
        lock = client.lock(key, ttl=ttl)
        acquired = acquire(lock)
        if acquired:
            lock.release()
        reply = [ident, acquired]
    except Exception as exc:
        reply = [ident, None, f"{type(exc).__name__}: {exc}"]
    line = json.dumps(reply) + "\n"
    with out:
        sys.stdout.write(line)
        sys.stdout.flush()

print(json.dumps({"ready": True}), flush=True)
with ThreadPoolExecutor(max_workers=settings["threads"]) as pool:
    for request in sys.stdin:
        ident, key = json.loads(request)
        pool.submit(cycle, ident, key)
client.close()
"""


class _Answer:
    __slots__ = ("acquired", "done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.acquired = False
        self.error: str | None = None


class _ChildLockCycler:
    """Forwards each cycle to python-etcd3 in the child and waits for its answer."""

    def __init__(self, process: subprocess.Popen[str], stderr: IO[str]) -> None:
        self._process = process
        self._stderr = stderr
        self._ids = itertools.count()
        self._pending: dict[int, _Answer] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(
            target=self._read, name="leasekit-bench-etcd3-reader", daemon=True
        )
        self._reader.start()

    def cycle(self, key: str, owner: str) -> bool:
        assert self._process.stdin is not None
        answer = _Answer()
        with self._lock:
            ident = next(self._ids)
            self._pending[ident] = answer
            self._process.stdin.write(json.dumps([ident, key]) + "\n")
            self._process.stdin.flush()
        if not answer.done.wait(_CYCLE_TIMEOUT_S):
            raise TimeoutError(f"python-etcd3 gave no answer within {_CYCLE_TIMEOUT_S:g} s")
        if answer.error is not None:
            raise RuntimeError(answer.error)
        return answer.acquired

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            ident, acquired, *error = json.loads(line)
            with self._lock:
                answer = self._pending.pop(ident)
            answer.acquired = bool(acquired)
            answer.error = error[0] if error else None
            answer.done.set()
        # The child is gone: nothing waits forever.
        with self._lock:
            orphans, self._pending = list(self._pending.values()), {}
        for answer in orphans:
            answer.error = f"python-etcd3's process ended: {_last_line(self._stderr)}"
            answer.done.set()

    def close(self) -> None:
        process = self._process
        try:
            if process.stdin is not None:
                process.stdin.close()
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        finally:
            self._reader.join(timeout=30)
            if process.stdout is not None:
                process.stdout.close()
            self._stderr.close()


def _last_line(stderr: IO[str]) -> str:
    stderr.seek(0)
    lines = stderr.read().strip().splitlines()
    return lines[-1] if lines else "no message"


def _etcd3_settings(target: BenchTarget) -> dict[str, Any]:
    endpoint = _endpoint(target.url)
    client: dict[str, Any] = {"host": endpoint.host, "port": endpoint.port}
    if endpoint.username is not None:
        client["user"] = endpoint.username
        client["password"] = endpoint.password
    if endpoint.tls:
        for ours, theirs in (("ca_file", "ca_cert"), ("cert_file", "cert_cert")):
            if ours in endpoint.options:
                client[theirs] = endpoint.options[ours]
        if "key_file" in endpoint.options:
            client["cert_key"] = endpoint.options["key_file"]
    return {"client": client, "ttl_s": _ttl_s(target), "threads": _CHILD_THREADS}


def _open_etcd3_lock(target: BenchTarget) -> SyncCycler:
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 (the cycler closes it)
    process = subprocess.Popen(  # noqa: S603 (this interpreter, our own script)
        [sys.executable, "-W", "ignore", "-c", _ETCD3_CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=env,
        text=True,
        bufsize=1,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    try:
        # The settings (a password, perhaps) go over the pipe, never on a command line.
        process.stdin.write(json.dumps(_etcd3_settings(target)) + "\n")
        process.stdin.flush()
        hello = _first_line(process.stdout, _CHILD_START_TIMEOUT_S)
        reply = json.loads(hello) if hello else {"error": _last_line(stderr)}
        if "error" in reply:
            raise RuntimeError(f"python-etcd3: {reply['error']}")
    except BaseException:
        process.kill()
        process.wait()
        process.stdout.close()
        process.stdin.close()
        stderr.close()
        raise
    return _ChildLockCycler(process, stderr)


def _first_line(stdout: IO[str], timeout_s: float) -> str:
    """The child's first line of output, or "" if it ends or says nothing in time."""
    line: list[str] = []
    # A pipe's readline has no timeout; a thread waits in it (and ends with the child).
    reader = threading.Thread(target=lambda: line.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return line[0] if line else ""


# -- around the run -------------------------------------------------------------------------


async def _cleanup(target: BenchTarget) -> None:
    """Delete every key of the run: leasekit's, the floor's and python-etcd3's.

    Each is bound to an etcd lease and would go at its TTL anyway (and every cycle
    released its own); this makes it immediate. python-etcd3's leftover etcd leases
    carry no key and end at their TTL. Needs plaintext ``etcd://`` (aetcd).
    """
    endpoint = _endpoint(target.url)
    if endpoint.tls:
        return
    client = await _aetcd_client(endpoint)
    try:
        for prefix in (endpoint.prefix, "", _ETCD3_LOCK_PREFIX):
            await client.delete_prefix(f"{prefix}{target.namespace}".encode())
    finally:
        await client.close()


async def _describe_server(target: BenchTarget) -> str | None:
    endpoint = _endpoint(target.url)
    if endpoint.tls:
        return None
    client = await _aetcd_client(endpoint)
    try:
        status = await client.status()
    finally:
        await client.close()
    return f"etcd {status.version}"


BENCH = SchemeBench(
    contenders=(
        Contender(
            "aetcd-raw",
            "aetcd raw",
            "floor",
            open_async=_open_raw,
            requires=("aetcd",),
            install="pip install 'leasekit[etcd]'",
            how="aetcd: grant a lease, txn put-if-absent on it, revoke it (3 writes)",
        ),
        Contender(
            "etcd3-lock",
            "python-etcd3 Lock (sync, child process)",
            "peer",
            open_sync=_open_etcd3_lock,
            requires=("etcd3",),
            install="pip install etcd3",
            how=(
                "etcd3 client.lock(key, ttl): acquire(timeout=0), release, in a child "
                "process on pure-Python protobuf; never revokes its lease"
            ),
        ),
    ),
    cleanup=_cleanup,
    describe_server=_describe_server,
)
