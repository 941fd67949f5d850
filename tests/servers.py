"""Real servers for the test suite: our own processes, on free loopback ports, in temp dirs.

Every backend's tests run against a real server, never a mock (docs/testing.md).
:class:`ServerProcess` is the common shape: start one server process in its own
process group, wait until it answers, and tear the whole group down at the end. It
also injects faults for reliability tests: :meth:`~ServerProcess.pause` (SIGSTOP),
:meth:`~ServerProcess.resume`, :meth:`~ServerProcess.kill` and
:meth:`~ServerProcess.restart` on the same port. A backend's server is a small
subclass that says how to start it and how to tell it is ready
(:class:`RedisServer`; PostgreSQL and etcd follow the same pattern).

Nothing here touches a server the machine already runs: ports are fresh ones the
kernel hands out on 127.0.0.1, never a well-known port, and data lives in a temp dir.

When a server binary is missing, :func:`missing_server` skips the test with the install
command in the reason, or fails it when ``LEASEKIT_REQUIRE_SERVERS=1`` (set by CI), so
a CI machine can never pass by skipping. A missing Python package (a backend's driver,
a peer the tests need) goes through :func:`require_module`, under the same rule
(``pytest.importorskip`` would skip on CI too; it is left for standard-library modules
of newer Pythons only).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import math
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, BinaryIO, ClassVar, NoReturn, Self

import pytest

__all__ = [
    "REQUIRE_SERVERS_ENV",
    "MariaDBServer",
    "PostgresServer",
    "RedisClusterServer",
    "RedisSentinelGroup",
    "RedisSentinelServer",
    "RedisServer",
    "RespError",
    "ServerProcess",
    "ServerStartError",
    "find_binary",
    "free_port",
    "mariadb_ready",
    "missing_extra",
    "missing_server",
    "pg_ready",
    "require_module",
    "resp_command",
    "servers_required",
]

REQUIRE_SERVERS_ENV = "LEASEKIT_REQUIRE_SERVERS"

LOOPBACK = "127.0.0.1"

# Ports a developer's own servers listen on; never ours, even if the kernel offers one.
_WELL_KNOWN_PORTS = frozenset({2379, 2380, 3306, 5432, 6379, 6380, 16379})


# Every server started and not yet stopped, so an interrupted run leaves no orphans.
_RUNNING: weakref.WeakSet[ServerProcess] = weakref.WeakSet()


def servers_required() -> bool:
    """Whether a missing server must fail the tests rather than skip them (CI sets it)."""
    return os.environ.get(REQUIRE_SERVERS_ENV, "").strip().lower() in ("1", "true", "yes")


def missing_server(what: str, install: str) -> NoReturn:
    """Skip the calling test because ``what`` is unavailable, or fail it under CI.

    ``install`` is the command that fixes it (``apt-get install redis-server``), and
    goes into the reason either way.
    """
    reason = f"{what}; install it with: {install}"
    if servers_required():
        pytest.fail(f"{reason} ({REQUIRE_SERVERS_ENV}=1, so this fails instead of skipping)")
    pytest.skip(reason)


def missing_extra(extra: str, tests: str) -> NoReturn:
    """Skip a whole test module whose backend driver is not installed, or fail it under CI.

    Call it from the ``except ImportError`` around the module's driver imports.
    """
    install = f"pip install -e '.[{extra}]'"
    if servers_required():
        pytest.fail(
            f"{tests} need the {extra} extra: {install} "
            f"({REQUIRE_SERVERS_ENV}=1, so this fails instead of skipping)",
            pytrace=False,
        )
    pytest.skip(f"the {extra} extra is not installed: {install}", allow_module_level=True)


def require_module(name: str, *, extra: str | None = None, install: str = "") -> ModuleType:
    """Import module ``name``; if it is not installed, skip the caller, or fail it under CI.

    Works in a test and at a module's top (it then skips the whole module). ``extra``
    names leasekit's extra that brings the module (the reason says
    ``pip install -e '.[extra]'``); ``install`` is the command otherwise. Only a missing
    module skips: a module that is installed and fails to import is an error.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (name == exc.name or name.startswith(f"{exc.name}.")):
            raise
        command = f"pip install -e '.[{extra}]'" if extra else install or f"pip install {name}"
        reason = f"{name} is not installed; install it with: {command}"
        if servers_required():
            pytest.fail(
                f"{reason} ({REQUIRE_SERVERS_ENV}=1, so this fails instead of skipping)",
                pytrace=False,
            )
        pytest.skip(reason, allow_module_level=True)


def find_binary(name: str, extra_dirs: Iterable[str | Path] = ()) -> str | None:
    """The path of executable ``name`` on PATH, or in ``extra_dirs``, the sbin dirs."""
    found = shutil.which(name)
    if found:
        return found
    for directory in (*extra_dirs, "/usr/sbin", "/usr/local/sbin", "/sbin"):
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def free_port(host: str = LOOPBACK, *, companion_offset: int | None = None) -> int:
    """A TCP port nothing listens on right now (the caller may still lose a race for it).

    With ``companion_offset``, ``port + companion_offset`` must be free too (Redis
    Cluster's bus listens 10000 above the client port).
    """
    while True:
        with contextlib.ExitStack() as stack:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
            if port in _WELL_KNOWN_PORTS:
                continue
            if companion_offset is not None:
                if port + companion_offset > 65535 or port + companion_offset in _WELL_KNOWN_PORTS:
                    continue
                other = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                try:
                    other.bind((host, port + companion_offset))
                except OSError:
                    continue
            return port


class ServerStartError(RuntimeError):
    """A server process exited or never became ready; the message ends with its log."""


class Started:
    """``with`` a server (or a group of them): :meth:`start` on entry, :meth:`stop` on exit."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ServerProcess(Started):
    """One server process in its own process group, on a loopback port, in ``workdir``.

    Subclasses implement :meth:`argv` (the command line for ``self.port``) and
    :meth:`probe` (does it answer yet?). Use as a context manager or call
    :meth:`start` and :meth:`stop`. Output goes to ``workdir/server.log``, whose tail
    is shown when the server fails to start.
    """

    name: ClassVar[str] = "server"
    start_timeout_s: ClassVar[float] = 20.0
    stop_timeout_s: ClassVar[float] = 5.0

    def __init__(self, binary: str, workdir: Path, *, port: int | None = None) -> None:
        self.binary = binary
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host = LOOPBACK
        self._fixed_port = port is not None
        self.port = port if port is not None else self.pick_port()
        self.log_path = self.workdir / "server.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._paused = False

    # -- what a subclass says -----------------------------------------------------------

    def argv(self) -> list[str]:
        """The command line that starts the server on ``self.port`` in ``self.workdir``."""
        raise NotImplementedError

    def probe(self) -> bool:
        """Whether the server answers requests now; must not raise for "not yet"."""
        raise NotImplementedError

    def pick_port(self) -> int:
        """A free port to listen on; override when the server needs more than one."""
        return free_port(self.host)

    def popen_kwargs(self) -> dict[str, Any]:
        """Extra ``subprocess.Popen`` arguments (``user=`` to drop root); none by default."""
        return {}

    # -- lifecycle --------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the server and wait until :meth:`probe` succeeds.

        A port lost to a race is retried on a fresh one, unless the port was fixed
        (a restart must come back where clients expect it).
        """
        attempts = 1 if self._fixed_port else 3
        for attempt in range(1, attempts + 1):
            if self._try_start(last=attempt == attempts):
                return
            self.port = self.pick_port()

    def _try_start(self, *, last: bool) -> bool:
        """Start once; ``False`` if the port was taken meanwhile (worth another port)."""
        try:
            self._spawn()
            self._wait_ready()
        except ServerStartError:
            self._terminate()
            if last or "in use" not in self.log_tail():
                raise
            return False
        return True

    def _spawn(self) -> None:
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self.argv(),
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, torn down as one
                **self.popen_kwargs(),
            )
        self._paused = False
        _RUNNING.add(self)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            process = self._process
            if process is None or process.poll() is not None:
                code = None if process is None else process.returncode
                raise ServerStartError(
                    f"{self.name} exited with code {code} while starting\n{self.log_tail()}"
                )
            if self.probe():
                return
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"{self.name} on port {self.port} not ready after "
                    f"{self.start_timeout_s:g} s\n{self.log_tail()}"
                )
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL if it lingers."""
        self._terminate()

    def _terminate(self) -> None:
        process, self._process = self._process, None
        _RUNNING.discard(self)
        if process is None:
            return
        # Reaped before this call (its exit seen by a poll() since): its pid may have
        # been handed out again by now (pid_max is 32,768 here, and the suite makes
        # threads and processes by the thousand), so its group is not signalled: that
        # could kill a stranger, such as another test's server that leads a group of
        # the same number.
        reaped_before = process.returncode is not None
        if process.poll() is None:
            # A stopped process would hold SIGTERM pending forever; wake it first.
            self._signal_group(process, signal.SIGCONT)
            self._signal_group(process, signal.SIGTERM)
            try:
                process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(process, signal.SIGKILL)
                process.wait(self.stop_timeout_s)
        # Children the server forked (if any) die with the group, even after it exited,
        # right after the leader was reaped: its pid is not handed out again so soon.
        if not reaped_before:
            self._signal_group(process, signal.SIGKILL)
        self._paused = False

    @staticmethod
    def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)

    def _require_process(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            raise RuntimeError(f"{self.name} on port {self.port} is not running")
        return self._process

    # -- faults -------------------------------------------------------------------------

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open and nothing answers.

        Returns once every thread of every process in the server's group has stopped:
        ``killpg`` only queues the signal, and on a loaded machine a thread that is
        running on the other core can still answer a request sent right after it.
        """
        process = self._require_process()
        self._signal_group(process, signal.SIGSTOP)
        self._paused = True
        _wait_stopped(process.pid)

    def resume(self) -> None:
        """Undo :meth:`pause` (SIGCONT)."""
        self._signal_group(self._require_process(), signal.SIGCONT)
        self._paused = False

    def kill(self) -> None:
        """Crash the server (SIGKILL to the group): no shutdown, connections reset."""
        process = self._require_process()
        self._signal_group(process, signal.SIGKILL)
        process.wait(self.stop_timeout_s)
        self._process = None
        self._paused = False
        _RUNNING.discard(self)

    def restart(self) -> None:
        """Kill the server and start it again on the same port (data not persisted is lost)."""
        if self.running:
            self.kill()
        self._fixed_port = True
        self.start()

    @property
    def paused(self) -> bool:
        return self._paused

    # -- diagnostics --------------------------------------------------------------------

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __repr__(self) -> str:
        state = "paused" if self._paused else "running" if self.running else "stopped"
        return f"{type(self).__name__}({self.host}:{self.port}, {state})"


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_RUNNING):
        with contextlib.suppress(Exception):
            server.stop()


# -- Redis --------------------------------------------------------------------------------


class RespError(Exception):
    """An error reply from a Redis server (``-ERR ...``)."""


def _encode_command(args: Sequence[str | bytes | int]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _read_reply(stream: BinaryIO) -> object:
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed mid-reply")
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body.decode()
    if kind == b"-":
        raise RespError(body.decode(errors="replace"))
    if kind == b":":
        return int(body)
    if kind == b"$":
        size = int(body)
        if size < 0:
            return None
        return stream.read(size + 2)[:-2]
    if kind == b"*":
        count = int(body)
        return None if count < 0 else [_read_reply(stream) for _ in range(count)]
    raise ConnectionError(f"unexpected RESP reply {line!r}")


def resp_command(host: str, port: int, *args: str | bytes | int, timeout_s: float = 5.0) -> object:
    """Send one command to a Redis server over a fresh connection and return the reply.

    A dependency-free client for the harness itself (readiness, cluster setup, fault
    injection), so starting a server never needs the driver under test.
    """
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(_encode_command(args))
        with sock.makefile("rb") as stream:
            return _read_reply(stream)


class RedisServer(ServerProcess):
    """``redis-server`` on a loopback port, no persistence (``save ""``, no AOF).

    A restart therefore loses every key, which is what the data-loss tests want.
    ``extra_args`` are appended to the command line (``["--cluster-enabled", "yes"]``).
    """

    name = "redis-server"
    install_hint = "apt-get install redis-server"

    def __init__(
        self,
        binary: str,
        workdir: Path,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.extra_args = list(extra_args)
        super().__init__(binary, workdir, port=port)

    @property
    def cluster_enabled(self) -> bool:
        return "--cluster-enabled" in self.extra_args

    def pick_port(self) -> int:
        # A cluster node also listens on port + 10000 for the cluster bus.
        return free_port(self.host, companion_offset=10000 if self.cluster_enabled else None)

    def argv(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            "--daemonize", "no",
            "--logfile", "",
            *self.extra_args,
        ]  # fmt: skip

    def probe(self) -> bool:
        try:
            return self.command("PING", timeout_s=1.0) == "PONG"
        except (OSError, RespError):
            return False

    def command(self, *args: str | bytes | int, timeout_s: float = 5.0) -> object:
        """Run one command on this server (outside the code under test)."""
        return resp_command(self.host, self.port, *args, timeout_s=timeout_s)

    def info(self, section: str) -> dict[str, str]:
        """``INFO section`` as a dict of its ``name:value`` lines."""
        return _parse_info(self.command("INFO", section))

    def cluster_info(self) -> dict[str, str]:
        """``CLUSTER INFO`` as a dict (``cluster_state``, ``cluster_known_nodes``, ...)."""
        return _parse_info(self.command("CLUSTER", "INFO"))

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @classmethod
    def find(cls) -> str | None:
        return find_binary("redis-server")


_CLUSTER_NODE_ARGS = (
    "--cluster-enabled", "yes",
    "--cluster-config-file", "nodes.conf",
    "--cluster-node-timeout", "5000",
)  # fmt: skip


class RedisClusterServer(Started):
    """A Redis Cluster of ``size`` primaries (no replicas) on loopback ports.

    Slots are split evenly, the nodes are joined with ``CLUSTER MEET``, and
    :meth:`start` returns once every node reports ``cluster_state:ok``. Enough to
    check that keys and scripts respect slots (a wrong hash tag is a ``CROSSSLOT``
    error) and that scans cover every node.
    """

    slots = 16384
    start_timeout_s = 30.0

    def __init__(self, binary: str, workdir: Path, *, size: int = 3) -> None:
        self.nodes = [
            RedisServer(binary, Path(workdir) / f"node{i}", extra_args=_CLUSTER_NODE_ARGS)
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        """A URL of one node; a cluster client discovers the others from it."""
        return self.nodes[0].url

    def start(self) -> None:
        try:
            for node in self.nodes:
                node.start()
            per_node = -(-self.slots // len(self.nodes))
            for i, node in enumerate(self.nodes):
                first, last = i * per_node, min(self.slots, (i + 1) * per_node) - 1
                node.command("CLUSTER", "ADDSLOTSRANGE", first, last)
                # Distinct epochs up front, as redis-cli --cluster create does, so the
                # nodes need not resolve a collision before agreeing on slot owners.
                node.command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            # Introduce every pair directly rather than waiting for gossip to do it.
            for i, node in enumerate(self.nodes):
                for other in self.nodes[i + 1 :]:
                    node.command("CLUSTER", "MEET", other.host, other.port)
            self._wait_ok()
        except BaseException:
            self.stop()
            raise

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            # Each node has its own view of the cluster; all must agree before use.
            states = [node.cluster_info() for node in self.nodes]
            if all(_cluster_settled(state, len(self.nodes)) for state in states):
                return
            if time.monotonic() > deadline:
                raise ServerStartError(f"redis cluster did not settle: {states}")
            time.sleep(0.05)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _parse_info(reply: object) -> dict[str, str]:
    assert isinstance(reply, bytes), reply
    fields: dict[str, str] = {}
    for line in reply.decode().splitlines():
        name, sep, value = line.partition(":")
        if sep and not line.startswith("#"):
            fields[name] = value.strip()
    return fields


def _cluster_settled(info: dict[str, str], size: int) -> bool:
    return (
        info.get("cluster_state") == "ok"
        and info.get("cluster_known_nodes") == str(size)
        and info.get("cluster_slots_ok") == str(RedisClusterServer.slots)
    )


# -- Redis Sentinel ---------------------------------------------------------------------


class RedisSentinelServer(ServerProcess):
    """``redis-sentinel`` on a loopback port, watching ``service`` at ``primary_port``.

    Its configuration file is written fresh in ``workdir`` at each start (Sentinel
    rewrites it as it learns). ``down_after_ms`` and ``failover_timeout_ms`` are small,
    so a killed primary is replaced within a couple of seconds on loopback.
    """

    name = "redis-sentinel"
    install_hint = "apt-get install redis-sentinel"

    def __init__(
        self,
        binary: str,
        workdir: Path,
        *,
        service: str,
        primary_port: int,
        quorum: int,
        down_after_ms: int,
        failover_timeout_ms: int,
    ) -> None:
        self.service = service
        self.primary_port = primary_port
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        super().__init__(binary, workdir)

    def argv(self) -> list[str]:
        config = self.workdir / "sentinel.conf"
        config.write_text(
            "\n".join(
                [
                    f"port {self.port}",
                    f"bind {self.host}",
                    "daemonize no",
                    'logfile ""',
                    f"dir {self.workdir}",
                    f"sentinel monitor {self.service} {self.host} {self.primary_port} "
                    f"{self.quorum}",
                    f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
                    f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}",
                    f"sentinel parallel-syncs {self.service} 1",
                    "",
                ]
            )
        )
        return [self.binary, str(config)]

    def probe(self) -> bool:
        try:
            return self.command("PING", timeout_s=1.0) == "PONG"
        except (OSError, RespError):
            return False

    def command(self, *args: str | bytes | int, timeout_s: float = 5.0) -> object:
        """Run one command on this sentinel."""
        return resp_command(self.host, self.port, *args, timeout_s=timeout_s)

    def primary_port_now(self) -> int | None:
        """The port of the primary this sentinel names now (None if it names none)."""
        reply = self.command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        if not isinstance(reply, list) or len(reply) != 2:
            return None
        return int(reply[1])

    def replicas(self) -> list[dict[str, str]]:
        """``SENTINEL REPLICAS service``: each replica this sentinel knows, as a dict."""
        return _sentinel_table(self.command("SENTINEL", "REPLICAS", self.service))

    def other_sentinels(self) -> list[dict[str, str]]:
        """``SENTINEL SENTINELS service``: the other sentinels this one has heard of."""
        return _sentinel_table(self.command("SENTINEL", "SENTINELS", self.service))

    @classmethod
    def find(cls) -> str | None:
        return find_binary("redis-sentinel")


def _sentinel_table(reply: object) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for row in reply if isinstance(reply, list) else []:
        fields = [item.decode() if isinstance(item, bytes) else str(item) for item in row]
        rows.append(dict(zip(fields[::2], fields[1::2], strict=True)))
    return rows


class RedisSentinelGroup(Started):
    """A Redis primary, one replica and three sentinels (quorum 2) on loopback ports.

    :meth:`fail_over` kills the primary (SIGKILL), waits until every sentinel names the
    replica as the new primary and it answers as one, then restarts the killed server
    empty on its port as the new primary's replica and waits until the sentinels know
    it as a healthy replica: ready for the next failover. :attr:`primary` and
    :attr:`replica` follow the roles. ``url`` is the ``redis+sentinel://`` URL.
    """

    service = "leasekit"
    start_timeout_s = 30.0

    def __init__(
        self,
        redis_binary: str,
        sentinel_binary: str,
        workdir: Path,
        *,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
    ) -> None:
        workdir = Path(workdir)
        # A replica's full sync starts at once (Redis 7 waits 5 s for more replicas).
        self._quick_sync = ["--repl-diskless-sync-delay", "0"]
        self.primary = RedisServer(redis_binary, workdir / "a", extra_args=self._quick_sync)
        self.replica = RedisServer(redis_binary, workdir / "b", extra_args=self._quick_sync)
        self._sentinel_args = (sentinel_binary, workdir, down_after_ms, failover_timeout_ms)
        self.sentinels: list[RedisSentinelServer] = []
        self.failovers = 0

    @property
    def url(self) -> str:
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def start(self) -> None:
        binary, workdir, down_after_ms, failover_timeout_ms = self._sentinel_args
        try:
            self.primary.start()
            self.replica.start()
            self._follow(self.replica, self.primary)
            self.sentinels = [
                RedisSentinelServer(
                    binary,
                    workdir / f"sentinel{i}",
                    service=self.service,
                    primary_port=self.primary.port,
                    quorum=2,
                    down_after_ms=down_after_ms,
                    failover_timeout_ms=failover_timeout_ms,
                )
                for i in range(3)
            ]
            for sentinel in self.sentinels:
                sentinel.start()
            self._wait(self._settled, "the sentinels did not settle")
        except BaseException:
            self.stop()
            raise

    def _follow(self, replica: RedisServer, primary: RedisServer) -> None:
        replica.command("REPLICAOF", primary.host, primary.port)
        self._wait(
            lambda: replica.info("replication").get("master_link_status") == "up",
            f"{replica} did not sync with {primary}",
        )

    def _settled(self, *, peers: bool = True) -> bool:
        """Every sentinel names the primary and knows the replica, healthy (and its peers).

        ``peers``: each also knows the two others (at the start; after a failover
        they already have, and how many it lists for a while is its own business).
        """
        for sentinel in self.sentinels:
            if sentinel.primary_port_now() != self.primary.port:
                return False
            if peers and len(sentinel.other_sentinels()) < len(self.sentinels) - 1:
                return False
            # Listed as the primary's replica and up (no s_down, no disconnected flag):
            # enough to be chosen, since Sentinel refreshes what it knows of replicas
            # every second once their primary is down (what it last read of the role
            # may be ten seconds old). The replica's own link is checked by _follow.
            healthy = [
                row
                for row in sentinel.replicas()
                if row.get("port") == str(self.replica.port) and row.get("flags") == "slave"
            ]
            if not healthy:
                return False
        return True

    def _wait(
        self,
        condition: Any,
        failure: str,
        timeout_s: float | None = None,
        detail: Any = None,
    ) -> None:
        deadline = time.monotonic() + (self.start_timeout_s if timeout_s is None else timeout_s)
        while True:
            try:
                if condition():
                    return
            except (OSError, RespError):
                pass
            if time.monotonic() > deadline:
                logs = "\n".join(f"{s}: {s.log_tail(8)}" for s in self.sentinels)
                seen = f"\n{detail()}" if detail is not None else ""
                raise ServerStartError(f"{failure}{seen}\n{logs}")
            time.sleep(0.02)

    def kill_primary(self) -> None:
        """SIGKILL the primary (the first half of :meth:`fail_over`)."""
        self.primary.kill()

    def wait_promoted(self) -> RedisServer:
        """Wait until every sentinel names the replica and it answers as a primary."""
        promoted = self.replica

        def promoted_everywhere() -> bool:
            ports = {sentinel.primary_port_now() for sentinel in self.sentinels}
            role = promoted.info("replication").get("role")
            return ports == {promoted.port} and role == "master"

        self._wait(promoted_everywhere, "Sentinel did not promote the replica")
        return promoted

    def rejoin(self) -> None:
        """Restart the killed primary, empty, as the new primary's replica; wait until ready.

        It starts as a replica (``--replicaof``): a sentinel that looked at it while it
        briefly answered as a primary would not look again for ten seconds.
        """
        old, self.primary, self.replica = self.primary, self.replica, self.primary
        old.extra_args = [
            *self._quick_sync,
            "--replicaof",
            self.primary.host,
            str(self.primary.port),
        ]
        old.restart()
        self._follow(old, self.primary)
        self._wait(
            self._settled_either_way,
            "the sentinels did not take the old primary back",
            detail=lambda: [
                (sentinel.primary_port_now(), self.primary.port, sentinel.replicas())
                for sentinel in self.sentinels
            ],
        )
        self.failovers += 1

    def _settled_either_way(self) -> bool:
        """:meth:`_settled`, or settled with the two servers' roles the other way round.

        On a loaded machine the sentinels may fail over once more on their own, the new
        primary having looked down for ``down_after_ms`` while it fed the rejoined
        replica: both servers are up, and the group takes the roles they now have.
        """
        if self._settled(peers=False):
            return True
        self.primary, self.replica = self.replica, self.primary
        swapped = False
        try:
            swapped = self._settled(peers=False)
        finally:
            if not swapped:
                self.primary, self.replica = self.replica, self.primary
        return swapped

    def settle_roles(self) -> None:
        """Wait until the sentinels agree on the primary (either server) and its replica."""
        self._wait(self._settled_either_way, "the sentinels do not agree on a primary")

    def ready(self) -> None:
        """:meth:`settle_roles`, then wait until the replica's link to the primary is up.

        What a test sharing the group starts from: on a loaded machine the sentinels
        may have failed over on their own since the last test (the roles swapped), or
        the replica may still be in a full sync.
        """
        self.settle_roles()
        self._wait(
            lambda: self.replica.info("replication").get("master_link_status") == "up",
            f"{self.replica} is not in sync with {self.primary}",
        )

    def fail_over(self) -> RedisServer:
        """Kill the primary, wait for its replica's promotion, rejoin it; the new primary."""
        self.kill_primary()
        self.wait_promoted()
        self.rejoin()
        return self.primary

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        self.primary.stop()
        self.replica.stop()


# -- PostgreSQL ---------------------------------------------------------------------------

_PG_PROTOCOL_V3 = 196608


def _pg_startup_packet(user: str, database: str) -> bytes:
    body = b"".join(
        [
            _PG_PROTOCOL_V3.to_bytes(4, "big"),
            b"user\0", user.encode(), b"\0",
            b"database\0", database.encode(), b"\0",
            b"\0",
        ]
    )  # fmt: skip
    return (len(body) + 4).to_bytes(4, "big") + body


def pg_ready(host: str, port: int, user: str, *, timeout_s: float = 1.0) -> bool:
    """Whether a PostgreSQL server accepts ``user`` (trust auth) and is ready for queries.

    Speaks just enough of the wire protocol (a startup message, then messages until
    ReadyForQuery or an error such as "the database system is starting up") that the
    harness never needs the driver under test.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(_pg_startup_packet(user, user))
            with sock.makefile("rb") as stream:
                while True:
                    header = stream.read(5)
                    if len(header) < 5:
                        return False
                    kind, size = header[:1], int.from_bytes(header[1:], "big")
                    stream.read(size - 4)
                    if kind == b"Z":
                        sock.sendall(b"X\0\0\0\4")  # Terminate
                        return True
                    if kind == b"E":
                        return False
    except OSError:
        return False


def _unprivileged_account(
    names: Sequence[str] = ("postgres", "nobody"), server: str = "PostgreSQL"
) -> tuple[int, int] | None:
    """``(uid, gid)`` to run a server as when we are root (PostgreSQL refuses root).

    The first of ``names`` that exists (the account Debian's packages create, else
    ``nobody``); ``None`` when we are not root and need not switch.
    """
    if os.geteuid() != 0:
        return None
    import pwd  # noqa: PLC0415 (POSIX only, and only needed as root)

    for name in names:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return entry.pw_uid, entry.pw_gid
    raise ServerStartError(
        f"running as root, and none of the accounts {', '.join(names)} exists to run "
        f"{server} as; create one, e.g. useradd {names[0]}"
    )


_TEMPLATES: dict[tuple[str, ...], Path] = {}
"""Initialized data directories, one per tool and account, that this process copies."""
_TEMPLATES_PID = os.getpid()


@atexit.register
def _remove_templates() -> None:
    if os.getpid() == _TEMPLATES_PID:  # never a forked child's exit
        for template in _TEMPLATES.values():
            shutil.rmtree(template, ignore_errors=True)


class DataDirServer(ServerProcess):
    """A server whose data directory is created (``_initialize``) before its first start.

    A first start that fails leaves no data dir behind; a restart keeps its data.
    The initializing tool (``initdb``, ``mariadb-install-db``: seconds each, mostly
    waiting) runs once per process into a template; every server then starts on a copy
    of it (``cp -a``, ownership and modes kept), as fresh as its own run of the tool.
    """

    data_dir: Path | None = None
    account: tuple[int, int] | None = None

    def _initialize(self) -> Path:
        raise NotImplementedError

    def _copy_template(
        self, key: tuple[str, ...], target: Path, build: Callable[[Path], None]
    ) -> None:
        """Fill the empty directory ``target`` with a copy of what ``build(dir)`` makes.

        ``build`` runs once per ``key`` in this process, into a temp dir owned by the
        server's account; the template is removed when the process exits.
        """
        key = (*key, repr(self.account))
        template = _TEMPLATES.get(key)
        if template is None or not template.is_dir():
            template = Path(tempfile.mkdtemp(prefix=f"leasekit-{self.name}-template-"))
            if self.account is not None:
                os.chown(template, *self.account)
            try:
                build(template)
            except BaseException:
                shutil.rmtree(template, ignore_errors=True)
                raise
            _TEMPLATES[key] = template
        copied = subprocess.run(
            ["cp", "-a", f"{template}/.", str(target)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
        )
        if copied.returncode != 0:
            raise ServerStartError(
                f"copying the {self.name} data directory template {template} failed: "
                f"{copied.stderr.decode(errors='replace').strip()}"
            )

    def start(self) -> None:
        fresh = self.data_dir is None
        try:
            if fresh:
                self._initialize()
            super().start()
        except BaseException:
            if fresh:  # leave no data dir behind (a restart keeps its data for a retry)
                self.stop()
            raise


class PostgresServer(DataDirServer):
    """``postgres`` with a fresh cluster of its own (``initdb``) on a loopback port.

    Durability against power loss is off (``fsync=off``, ``full_page_writes=off``), while
    ``synchronous_commit`` stays on: a killed server keeps everything it reported as
    committed (the kernel's page cache outlives the process), which the restart tests
    rely on. Authentication is ``trust`` for the superuser ``postgres`` on 127.0.0.1
    only; no Unix socket is created.

    Run as root, initdb and postgres run as the ``postgres`` account (or ``nobody``), and
    the data directory is a fresh temp dir owned by it (``workdir`` itself may sit under
    a root-only directory, such as pytest's); the log stays in ``workdir``. The data
    directory survives :meth:`restart` and is removed by :meth:`stop`.
    """

    name = "postgres"
    install_hint = "apt-get install postgresql"
    start_timeout_s = 30.0
    superuser = "postgres"
    database = "postgres"

    def __init__(
        self,
        binary: str,
        workdir: Path,
        *,
        port: int | None = None,
        extra_settings: dict[str, str] | None = None,
    ) -> None:
        self.initdb_binary = str(Path(binary).resolve().with_name("initdb"))
        self.extra_settings = dict(extra_settings or {})
        self.account = _unprivileged_account()
        self.data_dir: Path | None = None
        super().__init__(binary, workdir, port=port)

    def popen_kwargs(self) -> dict[str, Any]:
        if self.account is None:
            return {}
        uid, gid = self.account
        return {"user": uid, "group": gid, "extra_groups": []}

    def _make_data_dir(self) -> Path:
        if self.account is None:
            data_dir = self.workdir / "data"
            data_dir.mkdir(mode=0o700)
            return data_dir
        data_dir = Path(tempfile.mkdtemp(prefix="leasekit-pg-"))  # mode 0700
        os.chown(data_dir, *self.account)
        return data_dir

    def _initialize(self) -> Path:
        data_dir = self._make_data_dir()
        self.data_dir = data_dir
        self._copy_template(("initdb", self.initdb_binary), data_dir, self._initdb)
        return data_dir

    def _initdb(self, data_dir: Path) -> None:
        with self.log_path.open("ab") as log:
            done = subprocess.run(
                [
                    self.initdb_binary,
                    "--pgdata", str(data_dir),
                    "--username", self.superuser,
                    "--auth", "trust",
                    "--encoding", "UTF8",
                    "--locale", "C",
                    "--no-sync",
                ],
                cwd=data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
                **self.popen_kwargs(),
            )  # fmt: skip
        if done.returncode != 0:
            raise ServerStartError(f"initdb exited with code {done.returncode}\n{self.log_tail()}")

    def argv(self) -> list[str]:
        assert self.data_dir is not None
        settings = {
            "listen_addresses": self.host,
            "port": str(self.port),
            "unix_socket_directories": "",
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "300",
            "shared_buffers": "128MB",
            **self.extra_settings,
        }
        argv = [self.binary, "-D", str(self.data_dir)]
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        return argv

    def probe(self) -> bool:
        return pg_ready(self.host, self.port, self.superuser)

    # Each backend makes itself a process group leader (setsid), so signalling the
    # postmaster's group reaches the postmaster alone: faults signal every process.

    def _backends(self) -> list[int]:
        """The pids of the postmaster's children (backends, background workers), Linux only."""
        parent = self.pid
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                # "pid (comm) state ppid ...": comm may contain spaces; split after it.
                if int(stat.read_text().rpartition(")")[2].split()[1]) == parent:
                    found.append(int(stat.parent.name))
        return found

    def _signal_backends(self, pids: Iterable[int], sig: signal.Signals) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def pause(self) -> None:
        """Freeze the postmaster and every backend (SIGSTOP): nothing answers."""
        super().pause()  # the postmaster first, so it forks nothing new meanwhile
        self._signal_backends(self._backends(), signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_backends(self._backends(), signal.SIGCONT)
        super().resume()

    def kill(self) -> None:
        """Crash the server: SIGKILL to the postmaster and every backend at once."""
        backends = self._backends()
        self._signal_backends(backends, signal.SIGKILL)
        super().kill()
        self._signal_backends(backends, signal.SIGKILL)

    def stop(self) -> None:
        """Stop the server (fast shutdown, then the base class's escalation), remove its data."""
        process = self._process
        if process is not None and process.poll() is None:
            self._signal_backends(self._backends(), signal.SIGCONT)
            self._signal_group(process, signal.SIGCONT)
            self._signal_group(process, signal.SIGINT)  # fast shutdown: ends every session
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(self.stop_timeout_s)
        super().stop()
        data_dir, self.data_dir = self.data_dir, None
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"postgresql://{self.superuser}@{self.host}:{self.port}/{self.database}"

    @classmethod
    def find(cls) -> str | None:
        """The ``postgres`` binary: on PATH, or the newest in Debian's versioned dirs."""
        # Debian keeps each major version's binaries out of PATH.
        versioned = sorted(
            Path("/usr/lib/postgresql").glob("*/bin"),
            key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0,
            reverse=True,
        )
        found = find_binary("postgres", versioned)
        if found is None or not Path(found).resolve().with_name("initdb").is_file():
            return None
        return found


# -- PostgreSQL streaming replication -------------------------------------------------------

__all__ += ["PostgresReplicatedPair", "PostgresStandby"]


class PostgresStandby(PostgresServer):
    """A streaming standby of ``primary``: its data directory is ``pg_basebackup -R``.

    It replays the primary's WAL until :meth:`promote` (``pg_ctl promote``) makes it a
    primary of its own. ``application_name`` (what the primary's
    ``synchronous_standby_names`` names) is in the ``primary_conninfo`` that ``-R``
    writes. :meth:`pause` (SIGSTOP) makes it lag: it receives nothing meanwhile.
    """

    name = "postgres-standby"

    def __init__(
        self,
        binary: str,
        workdir: Path,
        primary: PostgresServer,
        *,
        application_name: str = "standby1",
        port: int | None = None,
    ) -> None:
        self.primary = primary
        self.application_name = application_name
        self._primary_conninfo = ""  # what pg_basebackup -R wrote
        # The primary's settings too: once promoted, it is the primary of the next standby.
        settings = {**primary.extra_settings, "hot_standby": "on"}
        super().__init__(binary, workdir, port=port, extra_settings=settings)

    def _initialize(self) -> Path:
        data_dir = self._make_data_dir()
        self.data_dir = data_dir
        basebackup = str(Path(self.binary).resolve().with_name("pg_basebackup"))
        source = (
            f"host={self.primary.host} port={self.primary.port} "
            f"user={self.primary.superuser} application_name={self.application_name}"
        )
        with self.log_path.open("ab") as log:
            done = subprocess.run(
                [basebackup, "--pgdata", str(data_dir), "--dbname", source,
                 "--write-recovery-conf", "--wal-method", "stream", "--checkpoint", "fast",
                 "--no-sync"],
                cwd=data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
                **self.popen_kwargs(),
            )  # fmt: skip
        if done.returncode != 0:
            raise ServerStartError(
                f"pg_basebackup exited with code {done.returncode}\n{self.log_tail()}"
            )
        written = (data_dir / "postgresql.auto.conf").read_text()
        self._primary_conninfo = next(
            line.split("=", 1)[1].strip()[1:-1]  # the quoted value, quotes doubled inside
            for line in written.splitlines()
            if line.startswith("primary_conninfo")
        )
        return data_dir

    def stop_streaming(self) -> None:
        """Stop receiving WAL (``primary_conninfo`` emptied, configuration reloaded).

        The standby falls behind by everything the primary commits from now on, as one
        on a slow link would, while it still answers queries and can be promoted.
        (Pausing it would not do: the kernel buffers what the primary sends meanwhile,
        and the standby reads it all when it wakes, even after the primary died.)
        """
        self._set_primary_conninfo("")

    def resume_streaming(self) -> None:
        """Undo :meth:`stop_streaming`: connect to the primary again."""
        self._set_primary_conninfo(self._primary_conninfo)

    def _set_primary_conninfo(self, conninfo: str) -> None:
        assert self.data_dir is not None
        path = self.data_dir / "postgresql.auto.conf"
        lines = [
            line
            for line in path.read_text().splitlines()
            if not line.startswith("primary_conninfo")
        ]
        lines.append(f"primary_conninfo = '{conninfo}'")
        path.write_text("\n".join(lines) + "\n")
        self._signal_group(self._require_process(), signal.SIGHUP)

    def promote(self, timeout_s: float = 20.0) -> None:
        """``pg_ctl promote --wait``: returns once the standby accepts writes."""
        assert self.data_dir is not None
        pg_ctl = str(Path(self.binary).resolve().with_name("pg_ctl"))
        with self.log_path.open("ab") as log:
            done = subprocess.run(
                [pg_ctl, "promote", "--wait", "--timeout", str(math.ceil(timeout_s)),
                 "--pgdata", str(self.data_dir)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
                **self.popen_kwargs(),
            )  # fmt: skip
        if done.returncode != 0:
            raise ServerStartError(f"pg_ctl promote exited with code {done.returncode}")


class PostgresReplicatedPair(Started):
    """A PostgreSQL primary and one streaming standby, replication asynchronous or not.

    ``synchronous=True`` names the standby in the primary's ``synchronous_standby_names``
    (``synchronous_commit`` stays ``on``): a commit returns once the standby flushed it.
    :attr:`url` names both servers (``target_session_attrs=read-write``), the way an
    application reaches a failover pair; :meth:`fail_over` kills the primary
    (SIGKILL) and promotes the standby, which the URL then reaches; :meth:`rebuild`
    then makes a fresh standby of the new primary on the old primary's port (so the
    URL stays the same), ready for the next failover.
    """

    def __init__(self, binary: str, workdir: Path, *, synchronous: bool = False) -> None:
        self.workdir = Path(workdir)
        self.synchronous = synchronous
        settings = {"wal_level": "replica", "max_wal_senders": "5"}
        if synchronous:
            settings["synchronous_standby_names"] = "standby1"
        self.primary = PostgresServer(binary, self.workdir / "primary", extra_settings=settings)
        self.binary = binary
        self.generation = 0
        self.standby = PostgresStandby(binary, self.workdir / "standby0", self.primary)

    @property
    def url(self) -> str:
        hosts = ",".join(f"{s.host}:{s.port}" for s in (self.primary, self.standby))
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"

    def start(self) -> None:
        try:
            self.primary.start()
            self.standby.start()
        except BaseException:
            self.stop()
            raise

    def fail_over(self) -> None:
        """Kill the primary (SIGKILL), promote the standby: the pair has one primary left."""
        self.primary.kill()
        if self.standby.paused:
            self.standby.resume()
        self.standby.promote()

    def rebuild(self) -> None:
        """After :meth:`fail_over`: the promoted standby is the primary; a new standby
        (``pg_basebackup`` of it) takes the old primary's port."""
        old, self.primary = self.primary, self.standby
        old.stop()  # already killed: removes its data directory
        self.generation += 1
        self.standby = PostgresStandby(
            self.binary, self.workdir / f"standby{self.generation}", self.primary, port=old.port
        )
        self.standby.start()

    def stop(self) -> None:
        self.standby.stop()
        self.primary.stop()


# -- etcd ---------------------------------------------------------------------------------

__all__ += ["EtcdCluster", "EtcdServer", "etcd_http"]


def etcd_http(
    host: str,
    port: int,
    path: str,
    body: dict[str, object] | None = None,
    *,
    timeout_s: float = 5.0,
) -> dict[str, object]:
    """Call etcd's HTTP API (``/health``, or the ``/v3/...`` JSON gateway) and decode it.

    A dependency-free client for the harness itself (readiness, leader, lease counts),
    so starting a server never needs the driver under test. The gateway answers
    64-bit numbers as strings and keys as base64.
    """
    import json  # noqa: PLC0415 (only the etcd harness needs these)
    import urllib.request  # noqa: PLC0415

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{host}:{port}{path}", data=data, method="GET" if data is None else "POST"
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        decoded: dict[str, object] = json.loads(response.read() or b"{}")
        return decoded


class EtcdServer(ServerProcess):
    """One ``etcd`` member on loopback client and peer ports, its data in ``workdir/data``.

    Alone by default (a one-member cluster). :class:`EtcdCluster` passes
    ``initial_cluster`` and fixed ports to make it one of several; its members are
    ready when their client port answers (``/version``), a single node when it is
    healthy (has a leader). Data is persisted (``--data-dir``), so a restart keeps
    every key, lease and revision.
    """

    name = "etcd"
    install_hint = "apt-get install etcd-server"

    def __init__(
        self,
        binary: str,
        workdir: Path,
        *,
        port: int | None = None,
        peer_port: int | None = None,
        member_name: str = "leasekit0",
        initial_cluster: str | None = None,
        cluster_token: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.member_name = member_name
        self.cluster_token = cluster_token
        self.peer_port = peer_port if peer_port is not None else free_port()
        self.initial_cluster = initial_cluster
        self.extra_args = list(extra_args)
        super().__init__(binary, workdir, port=port)

    def pick_port(self) -> int:
        while True:
            port = free_port(self.host)
            if port != self.peer_port:
                return port

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    def argv(self) -> list[str]:
        cluster = self.initial_cluster or f"{self.member_name}={self.peer_url}"
        return [
            self.binary,
            "--name", self.member_name,
            "--data-dir", str(self.workdir / "data"),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", cluster,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", self.cluster_token or f"leasekit-{self.peer_port}",
            "--logger", "zap",
            "--log-outputs", "stderr",
            *self.extra_args,
        ]  # fmt: skip

    def probe(self) -> bool:
        try:
            if self.initial_cluster is not None:
                return "etcdserver" in etcd_http(self.host, self.port, "/version", timeout_s=1.0)
            return self.healthy()
        except (OSError, ValueError):
            return False

    def healthy(self, timeout_s: float = 1.0) -> bool:
        """Whether the member has a leader and serves (``/health``)."""
        try:
            reply = etcd_http(self.host, self.port, "/health", timeout_s=timeout_s)
        except (OSError, ValueError):
            return False
        return reply.get("health") == "true"

    def status(self, timeout_s: float = 2.0) -> dict[str, object]:
        """``Maintenance.Status`` of this member: its ``header.member_id``, ``leader``, ..."""
        return etcd_http(self.host, self.port, "/v3/maintenance/status", {}, timeout_s=timeout_s)

    def member_id(self) -> int:
        header = self.status()["header"]
        assert isinstance(header, dict), header
        return int(header["member_id"])

    def lease_ids(self) -> list[int]:
        """Every etcd lease in the cluster (``LeaseLeases``), as this member reports them."""
        reply = etcd_http(self.host, self.port, "/v3/lease/leases", {})
        leases = reply.get("leases") or []
        assert isinstance(leases, list), reply
        return sorted(int(lease["ID"]) for lease in leases)

    def lease_ttl(self, lease_id: int) -> tuple[int, int]:
        """``(remaining, granted)`` seconds of an etcd lease (``LeaseTimeToLive``), as
        the member reports them; ``remaining`` is -1 once the lease is gone."""
        reply = etcd_http(self.host, self.port, "/v3/lease/timetolive", {"ID": lease_id})
        return int(str(reply.get("TTL", -1))), int(str(reply.get("grantedTTL", 0)))

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke an etcd lease behind every client's back, as an operator would."""
        etcd_http(self.host, self.port, "/v3/lease/revoke", {"ID": lease_id})

    @property
    def url(self) -> str:
        return f"etcd://{self.host}:{self.port}"

    @classmethod
    def find(cls) -> str | None:
        return find_binary("etcd")


class EtcdCluster(Started):
    """A cluster of ``size`` etcd members on loopback ports, each with its own data dir.

    :meth:`start` launches every member at once (none can become healthy alone) and
    returns when all of them report a healthy cluster with one leader. Inject faults
    per member (``cluster.members[i].pause()``, ``.kill()``, ``.restart()``) or on the
    leader (:meth:`leader`).
    """

    start_timeout_s = 30.0

    def __init__(self, binary: str, workdir: Path, *, size: int = 3) -> None:
        ports: list[int] = []
        while len(ports) < 2 * size:
            port = free_port()
            if port not in ports:
                ports.append(port)
        clients, peers = ports[:size], ports[size:]
        names = [f"m{i}" for i in range(size)]
        cluster = ",".join(
            f"{name}=http://{LOOPBACK}:{peer}" for name, peer in zip(names, peers, strict=True)
        )
        self.members = [
            EtcdServer(
                binary,
                Path(workdir) / name,
                port=client,
                peer_port=peer,
                member_name=name,
                initial_cluster=cluster,
                cluster_token=f"leasekit-{peers[0]}",
            )
            for name, client, peer in zip(names, clients, peers, strict=True)
        ]

    @property
    def url(self) -> str:
        """``etcd://`` with every member's client address."""
        return "etcd://" + ",".join(f"{m.host}:{m.port}" for m in self.members)

    def start(self) -> None:
        try:
            for member in self.members:
                member._spawn()  # all at once: a member cannot become ready alone
            for member in self.members:
                member._wait_ready()
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise

    def live_members(self) -> list[EtcdServer]:
        return [m for m in self.members if m.running and not m.paused]

    def wait_healthy(self, timeout_s: float | None = None) -> EtcdServer:
        """Wait until every live member is healthy and they agree on a leader; return it."""
        deadline = time.monotonic() + (self.start_timeout_s if timeout_s is None else timeout_s)
        while True:
            try:
                leader = self.leader()
                if leader is not None and all(m.healthy() for m in self.live_members()):
                    return leader
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                logs = "\n".join(f"{m.member_name}: {m.log_tail(5)}" for m in self.members)
                raise ServerStartError(f"etcd cluster did not settle\n{logs}")
            time.sleep(0.05)

    def leader(self) -> EtcdServer | None:
        """The member the live members agree is the leader, or None while they do not."""
        live = self.live_members()
        ids = {m.member_id(): m for m in live}
        leaders = {int(str(m.status()["leader"])) for m in live}
        if len(leaders) != 1:
            return None
        return ids.get(leaders.pop())

    def stop(self) -> None:
        # SIGKILL: the data dirs are thrown away, and a member asked to stop politely
        # may first spend seconds trying to hand leadership to peers that are gone.
        for member in self.members:
            if member.running:
                member.kill()
            member.stop()


# -- MariaDB ----------------------------------------------------------------------------


def mariadb_ready(host: str, port: int, *, timeout_s: float = 1.0) -> bool:
    """Whether a MySQL or MariaDB server greets a client on ``host:port``.

    Reads just the server's first packet: protocol version 10 is the handshake it sends
    once it accepts connections (it opens the port after InnoDB has started); an error
    packet (0xFF, such as "too many connections") or nothing means not ready. The
    harness never needs the driver under test.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            header = sock.recv(4)
            first = sock.recv(1)
    except OSError:
        return False
    return len(header) == 4 and first == b"\x0a"


class MariaDBServer(DataDirServer):
    """``mariadbd`` with a fresh data directory of its own on a loopback port.

    ``mariadb-install-db --no-defaults`` creates the data directory (no test database,
    ``root`` without a password, for 127.0.0.1 only since the server listens nowhere
    else); the server reads no option file either. Commits reach the OS at once but
    are not fsynced (``innodb_flush_log_at_trx_commit=2``): a killed server keeps
    everything it reported committed, which the restart tests rely on.

    Run as root, both run as the ``mysql`` account Debian creates (or ``nobody``) in a
    fresh temp dir owned by it; the log stays in ``workdir``. The data directory
    survives :meth:`restart` and is removed by :meth:`stop`.
    """

    name = "mariadbd"
    install_hint = "apt-get install mariadb-server"
    start_timeout_s = 30.0
    user = "root"

    def __init__(self, binary: str, workdir: Path, *, port: int | None = None) -> None:
        self.install_db_binary = MariaDBServer.find_install_db() or "mariadb-install-db"
        self.account = _unprivileged_account(("mysql", "nobody"), "MariaDB")
        self.data_dir: Path | None = None
        super().__init__(binary, workdir, port=port)

    def popen_kwargs(self) -> dict[str, Any]:
        if self.account is None:
            return {}
        uid, gid = self.account
        return {"user": uid, "group": gid, "extra_groups": []}

    def _initialize(self) -> Path:
        data_dir = Path(tempfile.mkdtemp(prefix="leasekit-mariadb-"))  # mode 0700
        if self.account is not None:
            os.chown(data_dir, *self.account)
        self.data_dir = data_dir
        self._copy_template(("install-db", self.install_db_binary), data_dir, self._install_db)
        return data_dir

    def _install_db(self, data_dir: Path) -> None:
        with self.log_path.open("ab") as log:
            done = subprocess.run(
                [
                    self.install_db_binary,
                    "--no-defaults",
                    f"--datadir={data_dir / 'data'}",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    "--skip-name-resolve",
                    # Passed on to the bootstrapping server: a throwaway directory
                    # needs no fsync, and a small buffer pool starts faster.
                    "--innodb-flush-log-at-trx-commit=0",
                    "--innodb-flush-method=nosync",
                    "--innodb-buffer-pool-size=64M",
                    # Its own directory for temporary tables: bootstraps running at
                    # once (one per xdist worker) name theirs alike in a shared /tmp
                    # and fail ("Unknown table 'mysql.tmp_user_sys'"), and the file
                    # a failed one leaves behind fails every later one.
                    f"--tmpdir={data_dir}",
                ],
                cwd=data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
                **self.popen_kwargs(),
            )
        if done.returncode != 0:
            raise ServerStartError(
                f"mariadb-install-db exited with code {done.returncode}\n{self.log_tail()}"
            )

    def argv(self) -> list[str]:
        assert self.data_dir is not None
        return [
            self.binary,
            "--no-defaults",  # must come first: no /etc/mysql option file applies
            f"--datadir={self.data_dir / 'data'}",
            f"--socket={self.data_dir / 'mariadbd.sock'}",
            f"--pid-file={self.data_dir / 'mariadbd.pid'}",
            f"--tmpdir={self.data_dir}",  # as the bootstrap's: not a /tmp shared with others
            f"--bind-address={self.host}",
            f"--port={self.port}",
            "--skip-name-resolve",
            "--skip-log-bin",
            "--innodb-flush-log-at-trx-commit=2",
            "--innodb-buffer-pool-size=64M",
            "--innodb-log-file-size=32M",
            "--max-connections=300",
            "--character-set-server=utf8mb4",
        ]

    def probe(self) -> bool:
        return mariadb_ready(self.host, self.port)

    def stop(self) -> None:
        super().stop()  # SIGTERM: mariadbd shuts down cleanly, ending every session
        data_dir, self.data_dir = self.data_dir, None
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"mysql://{self.user}@{self.host}:{self.port}/mysql"

    @classmethod
    def find(cls) -> str | None:
        """The ``mariadbd`` binary (Debian's ``mariadb-server``), with its install tool."""
        found = find_binary("mariadbd") or find_binary("mysqld")
        if found is None or cls.find_install_db() is None:
            return None
        return found

    @staticmethod
    def find_install_db() -> str | None:
        return find_binary("mariadb-install-db") or find_binary("mysql_install_db")


def _wait_stopped(pgid: int, limit_s: float = 10.0) -> None:
    """Wait until every thread of process group ``pgid`` is stopped (Linux ``/proc``)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if all(state in "Tt" for state in _group_thread_states(proc, pgid)):
            return
        time.sleep(0.001)


def _group_thread_states(proc: Path, pgid: int) -> list[str]:
    states: list[str] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            if int(fields[2]) != pgid:  # after the name: state, ppid, pgrp
                continue
            states.extend(
                (task / "stat").read_text().rpartition(")")[2].split()[0]
                for task in (entry / "task").iterdir()
            )
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return states


def with_options(url: str, **options: object) -> str:
    """``url`` with ``options`` added to its query string."""
    query = "&".join(f"{name}={value}" for name, value in options.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"
