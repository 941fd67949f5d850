"""``RedisLeaseProvider``: leases in Redis, one Lua script (one round trip) per operation.

Each write is one script (``_lua``) that reads, checks ownership and writes without
any other command in between; the owner lookup is a single ``GET``. Expiry is Redis's
own ``PX`` TTL on the server clock. Works on a single server, behind Sentinel-managed
clients, and on Redis Cluster: the names a script touches share one hash tag
(``_keys``).
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeAlias, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio
from redis.asyncio.connection import URL_QUERY_ARGUMENT_PARSERS, parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseProviderClosed,
    LeaseResult,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)

from . import _keys, _lua

__all__ = ["LeaseRecord", "RedisClient", "RedisLeaseProvider"]

RedisClient: TypeAlias = redis.asyncio.Redis | redis.asyncio.RedisCluster
"""The clients the provider accepts: redis-py's asyncio client, single server or cluster."""

_T = TypeVar("_T")
_BACKEND = "redis"
_SCHEMES = ("redis", "rediss")
_DEFAULT_PREFIX = "leasekit:"
_DEFAULT_TIMEOUT_S = 5.0
_DEFAULT_COUNTER_TTL_MS = 3_600_000  # one hour; see docs/backends/redis.md
_MAX_COUNTER_TTL_MS = 2**40  # about 35 years: far beyond any use, far below PX's limit
_MAX_PREFIX_BYTES = 256
_OPTIONS = ("prefix", "timeout_s", "counter_ttl_ms", "cluster")
# Connection settings that redis-py reads from a URL's query, passed through to it.
_DRIVER_QUERY = frozenset(URL_QUERY_ARGUMENT_PARSERS) | {
    "client_name",
    "ssl_keyfile",
    "ssl_certfile",
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_ca_path",
    "ssl_ciphers",
    "ssl_password",
}
_INSPECT_BATCH = 256


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One live lease, as ``inspect`` reports it."""

    key: str
    owner: str
    token: int
    remaining_ms: int


class RedisLeaseProvider:
    """Leases in Redis: atomic Lua scripts, server-clock TTLs, fencing tokens.

    Pass your own ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` (which
    the provider then never closes), or use :meth:`from_url` /
    ``leasekit.connect("redis://...")`` (the provider builds the client and closes it
    in :meth:`aclose`).

    - ``prefix`` (default ``"leasekit:"``) starts every Redis name the provider uses;
      it may not contain ``{`` or ``}``, which are reserved for the hash tag.
    - ``timeout_s`` (default 5) bounds every operation, end to end: a stalled or
      unreachable server raises :class:`~leasekit.LeaseBackendError`, never hangs.
    - ``counter_ttl_ms`` (default one hour) is how long a key's fencing counter is kept
      beyond its lease's TTL; ``None`` keeps it forever. Tokens keep increasing either
      way, because a new token is also at least the server's clock in microseconds;
      the counter guards against that clock stepping back, for that long. A counter
      costs about 150-200 bytes of Redis memory per distinct key.

    No persistence is assumed (``persistent=False``): what survives a Redis restart
    depends on the server's RDB/AOF configuration, and a failover may lose the last
    writes. Fencing tokens keep increasing across both.
    """

    capabilities = Capabilities(
        atomic_transfer=True,
        fencing=True,
        ttl_resolution_ms=1,
        min_ttl_ms=1,
        server_clock=True,
        shared_across_processes=True,
        shared_across_hosts=True,
        persistent=False,
    )

    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str = _DEFAULT_PREFIX,
        timeout_s: float = _DEFAULT_TIMEOUT_S,
        counter_ttl_ms: int | None = _DEFAULT_COUNTER_TTL_MS,
        close_client: bool = False,
    ) -> None:
        if not isinstance(client, (redis.asyncio.Redis, redis.asyncio.RedisCluster)):
            raise InvalidLeaseArgument.for_argument(
                "client",
                "must be a redis.asyncio.Redis or redis.asyncio.RedisCluster (the asyncio "
                f"client), got {type(client).__module__}.{type(client).__qualname__}",
            )
        self._client: RedisClient = client
        self._prefix = _check_prefix(prefix)
        self.prefix = prefix
        self.timeout_s = _check_timeout(timeout_s)
        self.counter_ttl_ms = _check_counter_ttl(counter_ttl_ms)
        self._close_client = bool(close_client)
        self._closed = False
        self._deadlines = _Deadlines(self.timeout_s)

    @property
    def client(self) -> RedisClient:
        """The redis-py client the provider runs on (the caller's, or the one it built)."""
        return self._client

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisLeaseProvider:
        """Build a provider and its own client from ``redis://`` or ``rediss://`` URL.

        The URL is redis-py's (``redis://[user:password@]host:port/db``), whose query
        may also carry redis-py connection settings (``ssl_cert_reqs``,
        ``client_name``, ...). leasekit's options (``prefix``, ``timeout_s``,
        ``counter_ttl_ms``, and ``cluster=true`` for a ``RedisCluster`` client) come
        from the query or from keyword arguments, which win. Anything else is an
        :class:`~leasekit.InvalidLeaseArgument`. No I/O happens here.
        """
        if not isinstance(url, str):
            raise InvalidLeaseArgument.for_argument(
                "url", f"must be a str, got {type(url).__name__}"
            )
        parts = urlsplit(url)
        if parts.scheme.lower() not in _SCHEMES:
            raise InvalidLeaseArgument.for_argument(
                "url", f"must start with redis:// or rediss://, got {_redact(url)!r}"
            )
        ours: dict[str, Any] = {}
        driver: list[tuple[str, str]] = []
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name in _OPTIONS:
                ours[name] = _coerce_option(name, value)
            elif name in _DRIVER_QUERY and (
                parts.scheme == "rediss" or not name.startswith("ssl_")
            ):
                driver.append((name, value))
            else:
                raise InvalidLeaseArgument.for_argument(
                    "url",
                    f"unknown query parameter {name!r} in {_redact(url)!r}; leasekit's options "
                    f"are {', '.join(_OPTIONS)}, and redis-py's connection settings "
                    f"{', '.join(sorted(_DRIVER_QUERY))} pass through (ssl_* with rediss://)",
                )
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise InvalidLeaseArgument.for_argument(
                "options",
                f"unknown redis option(s) {', '.join(unknown)}; known: {', '.join(_OPTIONS)} "
                "(pass your own client as RedisLeaseProvider(client) for anything else)",
            )
        ours.update(options)
        cluster = ours.pop("cluster", False)
        if not isinstance(cluster, bool):
            raise InvalidLeaseArgument.for_argument("cluster", f"must be a bool, got {cluster!r}")
        # Check the options before the client exists, so a bad one leaks nothing.
        prefix = ours.get("prefix", _DEFAULT_PREFIX)
        _check_prefix(prefix)
        timeout_s = _check_timeout(ours.get("timeout_s", _DEFAULT_TIMEOUT_S))
        _check_counter_ttl(ours.get("counter_ttl_ms", _DEFAULT_COUNTER_TTL_MS))
        driver_url = urlunsplit(parts._replace(query=urlencode(driver)))
        try:
            parse_url(driver_url)
        except ValueError as exc:
            raise InvalidLeaseArgument.for_argument("url", f"{exc} ({_redact(url)!r})") from None
        settings: dict[str, Any] = {
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            # One immediate retry on a dropped connection (a restarted server, an idle
            # link cut by a proxy) and none on timeouts; see docs/backends/redis.md.
            "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            "retry_on_error": [RedisConnectionError],  # redis-py 5 retries only these
        }
        client: RedisClient
        try:
            if cluster:
                client = redis.asyncio.RedisCluster.from_url(driver_url, **settings)
            else:
                client = redis.asyncio.Redis.from_url(driver_url, **settings)
        except (RedisError, RedisClusterException, ValueError, TypeError) as exc:
            raise InvalidLeaseArgument.for_argument("url", f"{exc} ({_redact(url)!r})") from None
        return cls(client, close_client=True, **ours)

    # -- one round trip, bounded and translated ----------------------------------------

    async def _bounded(self, awaitable: Awaitable[_T], key: str | None) -> _T:
        """Await one round trip within ``timeout_s``; driver errors become ours."""
        watch = self._deadlines.open()
        try:
            if watch is None:  # Python 3.10, or called outside a task
                return await asyncio.wait_for(awaitable, self.timeout_s)
            return await awaitable
        except asyncio.CancelledError:
            if watch is not None and self._deadlines.close(watch):
                raise self._no_answer(key) from TimeoutError()
            raise
        except (TimeoutError, asyncio.TimeoutError) as exc:
            raise self._no_answer(key) from exc
        except (RedisError, RedisClusterException, OSError) as exc:
            # RedisClusterException is not a RedisError: a cluster with no reachable node.
            raise LeaseBackendError(
                f"{type(exc).__name__}: {exc}{self._where()}", backend=_BACKEND, key=key
            ) from exc
        finally:
            if watch is not None:
                self._deadlines.close(watch)

    def _no_answer(self, key: str | None) -> LeaseBackendError:
        return LeaseBackendError(
            f"no answer within {self.timeout_s:g} s{self._where()}", backend=_BACKEND, key=key
        )

    async def _run(self, script: _lua.Script, key: str, keys: tuple[bytes, ...], *args: Any) -> Any:
        if self._closed:
            raise LeaseProviderClosed(backend=_BACKEND)
        return await self._bounded(self._evalsha(script, keys, args), key)

    async def _evalsha(
        self, script: _lua.Script, keys: tuple[bytes, ...], args: tuple[Any, ...]
    ) -> Any:
        client = self._client
        try:
            return await client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            # The server's script cache was flushed, or this is its first call here:
            # EVAL runs the script and caches it again, so EVALSHA works next time.
            return await client.execute_command("EVAL", script.source, len(keys), *keys, *args)

    def _where(self) -> str:
        kwargs: Mapping[str, Any] | None = getattr(
            getattr(self._client, "connection_pool", None), "connection_kwargs", None
        )
        if kwargs and "host" in kwargs:
            return f" (server {kwargs['host']}:{kwargs.get('port', 6379)})"
        return ""

    def _names(self, key: str) -> tuple[bytes, bytes]:
        lease = _keys.lease_name(self._prefix, key)
        return lease, _keys.counter_name(lease)

    def _counter_px(self, ttl_ms: int) -> int:
        # The counter outlives the lease's current TTL by counter_ttl_ms; 0 means forever.
        return 0 if self.counter_ttl_ms is None else ttl_ms + self.counter_ttl_ms

    # -- the contract -------------------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        reply = await self._run(
            _lua.ACQUIRE, key, self._names(key), owner.encode(), ttl_ms, self._counter_px(ttl_ms)
        )
        # The script answers with the token (an int) or the holder (a string).
        if isinstance(reply, int):
            return LeaseResult(True, owner, reply)
        if not isinstance(reply, bytes | str):
            raise self._garbled(key, reply)
        try:
            return LeaseResult(False, _text(reply), None)
        except UnicodeDecodeError as exc:
            raise self._garbled(key, reply) from exc

    async def get_lease_owner(self, key: str) -> str | None:
        validate_key(key)
        if self._closed:
            raise LeaseProviderClosed(backend=_BACKEND)
        lease = _keys.lease_name(self._prefix, key)
        value = await self._bounded(self._client.execute_command("GET", lease), key)
        if value is None:
            return None
        try:
            return _parse_value(value)[0]
        except ValueError as exc:
            raise self._garbled(key, value) from exc

    async def release_lease(self, key: str, owner: str) -> None:
        validate_key(key)
        validate_owner(owner)
        await self._run(_lua.RELEASE, key, (_keys.lease_name(self._prefix, key),), owner.encode())

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        reply = await self._run(
            _lua.RENEW, key, self._names(key), owner.encode(), ttl_ms, self._counter_px(ttl_ms)
        )
        return bool(reply == 1)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        reply = await self._run(
            _lua.TRANSFER,
            key,
            self._names(key),
            from_owner.encode(),
            to_owner.encode(),
            ttl_ms,
            self._counter_px(ttl_ms),
        )
        return bool(reply == 1)

    def _garbled(self, key: str, reply: object) -> LeaseBackendError:
        return LeaseBackendError(
            f"unexpected data at the lease's Redis key ({reply!r:.80}); is another program "
            f"writing under the prefix {self.prefix!r}?",
            backend=_BACKEND,
            key=key,
        )

    # -- beyond the contract ------------------------------------------------------------

    async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases in key order, optionally only keys starting with ``prefix``.

        Uses ``SCAN`` (every node of a cluster), so it costs time in proportion to the
        keys under the provider's prefix and never blocks the server; each round trip
        is bounded by ``timeout_s``. Not a snapshot: leases that change meanwhile may
        or may not be listed.
        """
        if prefix is not None:
            validate_key(prefix, "prefix")
        limit = _check_limit(limit)
        if self._closed:
            raise LeaseProviderClosed(backend=_BACKEND)
        found = await self._scan(prefix)
        records: list[LeaseRecord] = []
        ordered = sorted(found)
        for start in range(0, len(ordered), _INSPECT_BATCH):
            batch = ordered[start : start + _INSPECT_BATCH]
            pipe = self._client.pipeline(transaction=False)
            for key in batch:
                pipe.get(found[key])
                pipe.pttl(found[key])
            # Errors come back per command (a foreign key of another type), not raised.
            replies = await self._bounded(pipe.execute(raise_on_error=False), prefix)
            for key, value, remaining in zip(batch, replies[::2], replies[1::2], strict=True):
                if not isinstance(value, bytes | str) or not isinstance(remaining, int):
                    continue  # not a lease value: not ours, or gone since the scan
                if remaining <= 0:
                    continue  # expired or released since the scan
                try:
                    owner, token = _parse_value(value)
                except ValueError:
                    continue  # not ours; inspect reports, it does not judge
                records.append(LeaseRecord(key, owner, token, remaining))
                if len(records) == limit:
                    return records
        return records

    async def _scan(self, prefix: str | None) -> dict[str, bytes]:
        """The lease names under ``prefix``, by lease key; one bounded round trip per step."""
        pattern = _keys.lease_scan_pattern(self._prefix, prefix)
        found: dict[str, bytes] = {}
        names: AsyncIterator[bytes | str] = self._client.scan_iter(match=pattern, count=1000)
        try:
            while True:
                try:
                    name = _raw(await self._bounded(names.__anext__(), prefix))
                except StopAsyncIteration:
                    return found
                key = _keys.key_from_lease_name(self._prefix, name)
                if key is not None and (prefix is None or key.startswith(prefix)):
                    found[key] = name
        finally:
            aclose = getattr(names, "aclose", None)
            if aclose is not None:
                await aclose()

    # -- lifecycle ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the client if the provider built it; later operations raise."""
        if self._closed:
            return
        self._closed = True
        if self._close_client:
            await self._client.aclose()

    async def __aenter__(self) -> RedisLeaseProvider:
        # PING now, so a wrong address or password shows up at the `async with`.
        if self._closed:
            raise LeaseProviderClosed(backend=_BACKEND)
        await self._bounded(self._client.execute_command("PING"), None)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return f"RedisLeaseProvider(prefix={self.prefix!r}{self._where()}{state})"


class _Watch:
    """One operation in flight: its task, when it is due, and whether it ran out."""

    __slots__ = ("cancelling", "closed", "deadline", "expired", "task")

    def __init__(self, task: asyncio.Task[Any], deadline: float) -> None:
        self.task = task
        self.deadline = deadline
        # Cancellations already requested when the operation began (asyncio.timeout's
        # bookkeeping): a deadline's own cancel is taken back only if it is the one
        # that arrived, so a cancel from elsewhere still propagates as CancelledError.
        self.cancelling = 0
        if sys.version_info >= (3, 11):
            self.cancelling = task.cancelling()
        self.closed = False
        self.expired = False


class _Deadlines:
    """The timeout of every in-flight operation of one provider, on a single timer.

    ``async with asyncio.timeout()`` arms and cancels one timer per call, about 4 us
    of Python per round trip, one of the two largest costs leasekit added to a raw
    redis-py call (``leasekit bench``, docs/benchmarks.md). Every operation of a
    provider has the same ``timeout_s``, so deadlines fall due in the order the
    operations began: a FIFO of watches, and one timer set for the oldest open one,
    bound them all. When it fires, it cancels each overdue task, as asyncio.timeout
    would, and :meth:`close` tells ``_bounded`` to turn that cancellation into
    :class:`~leasekit.LeaseBackendError`. The semantics are asyncio.timeout's: an
    end-to-end bound per operation, and a cancellation from elsewhere still wins.
    """

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._open: deque[_Watch] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def open(self) -> _Watch | None:
        """Start timing the current task's operation; None where ``wait_for`` must do it."""
        if sys.version_info < (3, 11):
            return None  # Task.uncancel(), needed to take a cancellation back, is 3.11+
        task = asyncio.current_task()
        if task is None:
            return None
        loop = task.get_loop()
        if loop is not self._loop:  # first use, or the provider now runs on another loop
            self._loop, self._open, self._timer = loop, deque(), None
        watch = _Watch(task, loop.time() + self._timeout_s)
        self._open.append(watch)
        if self._timer is None:
            self._timer = loop.call_at(watch.deadline, self._expire, loop)
        return watch

    def close(self, watch: _Watch) -> bool:
        """End ``watch`` (idempotent); True if its deadline alone cancelled the task."""
        if watch.closed:
            return False
        watch.closed = True
        pending = self._open
        while pending and pending[0].closed:
            pending.popleft()
        if sys.version_info >= (3, 11) and watch.expired:
            return watch.task.uncancel() <= watch.cancelling
        return False

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:
            return  # a timer left on a loop the provider no longer runs on
        self._timer = None
        now = loop.time()
        pending = self._open
        while pending and (pending[0].closed or pending[0].deadline <= now):
            watch = pending.popleft()
            if not watch.closed:
                watch.expired = True
                watch.task.cancel()
        if pending:
            self._timer = loop.call_at(pending[0].deadline, self._expire, loop)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _raw(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _parse_value(value: bytes | str) -> tuple[str, int]:
    """Split a lease value ``b"<token> <owner>"`` into ``(owner, token)``."""
    token, sep, owner = _raw(value).partition(b" ")
    if not sep or not owner or not token.isdigit():
        raise ValueError(f"not a lease value: {value!r:.80}")
    return owner.decode(), int(token)


def _check_prefix(prefix: object) -> bytes:
    if not isinstance(prefix, str):
        raise InvalidLeaseArgument.for_argument(
            "prefix", f"must be a str, got {type(prefix).__name__}"
        )
    if "{" in prefix or "}" in prefix:
        raise InvalidLeaseArgument.for_argument(
            "prefix",
            f"must not contain '{{' or '}}' (leasekit puts the Redis Cluster hash tag "
            f"after the prefix), got {prefix!r}",
        )
    try:
        raw = prefix.encode()
    except UnicodeEncodeError:
        raise InvalidLeaseArgument.for_argument("prefix", "must be encodable as UTF-8") from None
    if len(raw) > _MAX_PREFIX_BYTES:
        raise InvalidLeaseArgument.for_argument(
            "prefix", f"must be at most {_MAX_PREFIX_BYTES} UTF-8 bytes"
        )
    return raw


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidLeaseArgument.for_argument("limit", f"must be an int >= 1, got {limit!r}")
    return limit


def _check_timeout(timeout_s: object) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
        raise InvalidLeaseArgument.for_argument("timeout_s", f"must be a number, got {timeout_s!r}")
    if not 0 < timeout_s <= 3600:
        raise InvalidLeaseArgument.for_argument(
            "timeout_s", f"must be in (0, 3600], got {timeout_s!r}"
        )
    return float(timeout_s)


def _check_counter_ttl(counter_ttl_ms: object) -> int | None:
    if counter_ttl_ms is None:
        return None
    if isinstance(counter_ttl_ms, bool) or not isinstance(counter_ttl_ms, int):
        raise InvalidLeaseArgument.for_argument(
            "counter_ttl_ms",
            f"must be an int number of milliseconds or None, got {counter_ttl_ms!r}",
        )
    if not 1 <= counter_ttl_ms <= _MAX_COUNTER_TTL_MS:
        raise InvalidLeaseArgument.for_argument(
            "counter_ttl_ms",
            f"must be between 1 and {_MAX_COUNTER_TTL_MS} milliseconds (or None: keep "
            f"forever), got {counter_ttl_ms}",
        )
    return counter_ttl_ms


def _coerce_option(name: str, value: str) -> Any:
    try:
        if name == "timeout_s":
            return float(value)
        if name == "counter_ttl_ms":
            return None if value.lower() in ("none", "") else int(value)
    except ValueError:
        raise InvalidLeaseArgument.for_argument(name, f"must be a number, got {value!r}") from None
    if name == "cluster":
        flag = value.lower()
        if flag in ("true", "yes", "1"):
            return True
        if flag in ("false", "no", "0", ""):
            return False
        raise InvalidLeaseArgument.for_argument(name, f"must be true or false, got {value!r}")
    return value


def _redact(url: str) -> str:
    """``url`` with any password replaced, fit for error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))
