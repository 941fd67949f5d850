"""What the async and the blocking Redis providers share: options, URL parsing, errors.

One module, over 500 lines: every URL form and option, checked once for both providers.

One source for both: :func:`parse` reads a ``redis://`` / ``rediss://`` /
``redis+sentinel://`` URL and options into :class:`RedisSettings` (everything
validated, nothing connected);
:func:`check` and :func:`check_client` are both constructors' checks;
:data:`CAPABILITIES` is what the backend promises; and :data:`ERRORS` maps
redis-py's exceptions, which its asyncio and blocking clients share, to leasekit's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlencode

from redis.asyncio.connection import URL_QUERY_ARGUMENT_PARSERS
from redis.asyncio.connection import parse_url as redis_parse_url
from redis.exceptions import (
    AuthenticationWrongNumberOfArgsError,
    MaxConnectionsError,
    RedisClusterException,
    RedisError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
)
from leasekit.backend import (
    ErrorMap,
    Option,
    OptionSet,
    parse_url,
    redact_url,
    timeout_option,
)

__all__ = [
    "BACKEND",
    "CAPABILITIES",
    "COUNTER_TTL",
    "ERRORS",
    "INSPECT_LIMIT",
    "MIN_REPLICAS",
    "PREFIX",
    "REPLICA_TIMEOUT",
    "SENTINEL_SCHEME",
    "TIMEOUT",
    "Checked",
    "RedisSettings",
    "SentinelSettings",
    "check",
    "check_client",
    "connection_settings",
    "describe_server",
    "garbled",
    "parse",
    "sentinel_settings",
]

BACKEND = "redis"
CAPABILITIES = Capabilities(
    atomic_transfer=True,
    fencing=True,
    ttl_resolution_ms=1,
    min_ttl_ms=1,
    server_clock=True,
    shared_across_processes=True,
    shared_across_hosts=True,
    persistent=False,
    release_notifications=True,
    grant_notifications=True,
    metadata=True,
    slots=True,
    fair_waiting=True,
)
"""Both providers'; the async one turns notifications (release and grant) off on a
cluster client without pub/sub (redis-py before 8)."""

SENTINEL_SCHEME = "redis+sentinel"
_SCHEMES = ("redis", "rediss", SENTINEL_SCHEME)
DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379
_SERVICE = re.compile(r"/([^/?#]+)(?:/([0-9]+)?)?/?")
_MAX_COUNTER_TTL_MS = 2**40  # about 35 years: far beyond any use, far below PX's limit
_MAX_PREFIX_BYTES = 256
_DATABASE = re.compile(r"/([0-9]+)?")


def _check_prefix(prefix: str) -> str:
    if "{" in prefix or "}" in prefix:
        raise InvalidLeaseArgument.for_argument(
            "prefix",
            f"must not contain '{{' or '}}' (leasekit puts the Redis Cluster hash tag "
            f"after the prefix), got {prefix!r}",
            prefix,
        )
    try:
        raw = prefix.encode()
    except UnicodeEncodeError:
        raise InvalidLeaseArgument.for_argument("prefix", "must be encodable as UTF-8") from None
    if len(raw) > _MAX_PREFIX_BYTES:
        raise InvalidLeaseArgument.for_argument(
            "prefix", f"must be at most {_MAX_PREFIX_BYTES} UTF-8 bytes"
        )
    return prefix


PREFIX = Option("prefix", str, "leasekit:", check=_check_prefix)
TIMEOUT = timeout_option(5.0)
# One hour; see docs/backends/redis.md. None keeps counters forever.
COUNTER_TTL = Option(
    "counter_ttl_ms", int, 3_600_000, minimum=1, maximum=_MAX_COUNTER_TTL_MS, nullable=True
)
_CLUSTER = Option("cluster", bool, False)
# Connections the built client opens at most (per node on a cluster); operations beyond
# that wait for a free one within timeout_s. 50 is redis-py's BlockingConnectionPool's.
_MAX_CONNECTIONS = Option("max_connections", int, 50, minimum=1, maximum=100_000)

# Connection settings that redis-py reads from a URL's query, passed through to it.
# max_connections is leasekit's own (it sizes the blocking pool), and the pool's wait
# ("timeout") is bounded by timeout_s, so neither passes through.
_DRIVER_QUERY = (frozenset(URL_QUERY_ARGUMENT_PARSERS) - {"max_connections", "timeout"}) | {
    "client_name",
    "ssl_keyfile",
    "ssl_certfile",
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_ca_path",
    "ssl_ciphers",
    "ssl_password",
}
# Operations started in one event-loop iteration share one pipeline (see _aio).
AUTOPIPELINE = Option("autopipeline", bool, True)
INSPECT_LIMIT = Option("limit", int, 1000, minimum=1)  # inspect's
# Replica acknowledgement: WAIT min_replicas replica_timeout_ms after every grant,
# renewal and transfer (0: none). WAIT 0 would block forever, hence the minimum of 1 ms.
MIN_REPLICAS = Option("min_replicas", int, 0, minimum=0, maximum=1000)
REPLICA_TIMEOUT = Option("replica_timeout_ms", int, 500, minimum=1, maximum=3_600_000)
# Sentinel's own settings (redis+sentinel:// only): its credentials, and how long one
# sentinel may take to answer before the next is asked (None: min(1 s, timeout_s)).
_SENTINEL_USERNAME = Option("sentinel_username", str, None, nullable=True)
_SENTINEL_PASSWORD = Option("sentinel_password", str, None, nullable=True)
_SENTINEL_TIMEOUT = Option("sentinel_timeout_s", float, None, above=0, maximum=3600, nullable=True)
_COMMON = (PREFIX, TIMEOUT, COUNTER_TTL, _MAX_CONNECTIONS, AUTOPIPELINE, MIN_REPLICAS)
_OPTIONS = (*_COMMON, REPLICA_TIMEOUT, _CLUSTER)
_SENTINEL_OPTIONS = (
    *_COMMON,
    REPLICA_TIMEOUT,
    _SENTINEL_USERNAME,
    _SENTINEL_PASSWORD,
    _SENTINEL_TIMEOUT,
)
_PLAIN_DRIVER = frozenset(n for n in _DRIVER_QUERY if not n.startswith("ssl_"))
# TLS settings only make sense, and only pass through, with rediss://.
_OPTION_SETS = {
    "redis": OptionSet("redis", _OPTIONS, driver=_PLAIN_DRIVER),
    "rediss": OptionSet("redis", _OPTIONS, driver=_DRIVER_QUERY),
    SENTINEL_SCHEME: OptionSet("redis", _SENTINEL_OPTIONS, driver=_PLAIN_DRIVER),
}


class _RedisErrors(ErrorMap):
    """The toolkit's table, plus one rule: a cluster failure is judged by its cause.

    A cluster client with no reachable node raises ``RedisClusterException`` ("cannot
    be connected") from the ``ConnectionError`` of its last attempt; that cause (a
    refused connection, a name that does not resolve, a wrong password) says what
    happened, so it decides the class.
    """

    __slots__ = ()

    def classify(self, exc: BaseException) -> type[LeaseBackendError]:
        cause = exc.__cause__
        if isinstance(exc, RedisClusterException) and isinstance(cause, RedisError | OSError):
            return super().classify(cause)
        return super().classify(exc)


# Subclasses before their bases: MaxConnectionsError is a ConnectionError (a
# caller's non-blocking pool ran out, not an unreachable server), the AUTH
# arity error a ResponseError. AuthenticationError, AuthorizationError, refused
# connections, DNS and TLS failures all arrive as redis-py's ConnectionError.
# RedisClusterException is not a RedisError.
ERRORS: ErrorMap = _RedisErrors(
    {
        MaxConnectionsError: LeaseBackendError,
        AuthenticationWrongNumberOfArgsError: LeaseBackendUnreachable,
        RedisTimeoutError: LeaseBackendTimeout,
        RedisConnectionError: LeaseBackendUnreachable,
        RedisClusterException: LeaseBackendError,
        RedisError: LeaseBackendError,
    },
    backend=BACKEND,
)


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """A parsed URL and its options: what either provider builds its client from."""

    driver_url: str
    """The URL redis-py gets: host, credentials, db and the passed-through query."""
    prefix: str
    timeout_s: float
    counter_ttl_ms: int | None
    cluster: bool
    max_connections: int
    redacted: str
    """The URL as messages show it: no password."""
    autopipeline: bool = True
    """Whether the async provider writes operations started together as one pipeline."""
    min_replicas: int = 0
    """Replicas that must acknowledge each grant, renewal and transfer (0: none)."""
    replica_timeout_ms: int = REPLICA_TIMEOUT.default
    """How long ``WAIT`` waits for them."""
    sentinel: SentinelSettings | None = None
    """For ``redis+sentinel://``: where the sentinels are and which service to follow."""


@dataclass(frozen=True, slots=True)
class SentinelSettings:
    """The sentinels of a ``redis+sentinel://`` URL, the service they watch, their login."""

    addresses: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None
    timeout_s: float

    def describe(self) -> str:
        """``service mymaster via h1:26379,h2:26379``, for messages."""
        where = ",".join(f"{host}:{port}" for host, port in self.addresses)
        return f"service {self.service} via sentinels {where}"


class Checked(NamedTuple):
    """A constructor's settings, each checked (see :func:`check`)."""

    prefix: str
    timeout_s: float
    counter_ttl_ms: int | None
    min_replicas: int = 0
    replica_timeout_ms: int = REPLICA_TIMEOUT.default


def check(
    prefix: str,
    timeout_s: float,
    counter_ttl_ms: int | None,
    min_replicas: int = 0,
    replica_timeout_ms: int = REPLICA_TIMEOUT.default,
    *,
    cluster: bool = False,
) -> Checked:
    """Both providers' constructor checks; raises :class:`~leasekit.InvalidLeaseArgument`."""
    checked = Checked(
        PREFIX.validate(prefix),
        TIMEOUT.validate(timeout_s),
        COUNTER_TTL.validate(counter_ttl_ms),
        MIN_REPLICAS.validate(min_replicas),
        REPLICA_TIMEOUT.validate(replica_timeout_ms),
    )
    _check_acknowledgement(checked, cluster=cluster)
    return checked


def _check_acknowledgement(checked: Checked, *, cluster: bool) -> None:
    """``min_replicas`` with what it needs: one server's connection, time left for WAIT."""
    if not checked.min_replicas:
        return
    if cluster:
        raise InvalidLeaseArgument.for_argument(
            "min_replicas",
            "is not supported on Redis Cluster (WAIT must follow the script on the same "
            "node's connection, and a cluster pipeline routes a keyless WAIT elsewhere)",
            checked.min_replicas,
        )
    if checked.replica_timeout_ms >= checked.timeout_s * 1000:
        raise InvalidLeaseArgument.for_argument(
            "replica_timeout_ms",
            f"must be below timeout_s ({checked.timeout_s:g} s), so that a missing "
            f"acknowledgement is reported as such rather than as a timeout, got "
            f"{checked.replica_timeout_ms}",
            checked.replica_timeout_ms,
        )


def check_client(client: object, accepted: tuple[type, ...], what: str) -> None:
    """Refuse a client that is not one of ``accepted`` (``what`` names them for the message)."""
    if not isinstance(client, accepted):
        raise InvalidLeaseArgument.for_argument(
            "client",
            f"must be {what}, got {type(client).__module__}.{type(client).__qualname__}",
        )


def describe_server(connection_kwargs: dict[str, Any]) -> str:
    """``host:port`` (or the socket path) of a single server's pool, for messages."""
    if "host" in connection_kwargs:
        return f"{connection_kwargs['host']}:{connection_kwargs.get('port', DEFAULT_PORT)}"
    if "path" in connection_kwargs:
        return redact_url(str(connection_kwargs["path"]))
    return ""


def parse(url: str, options: dict[str, Any]) -> RedisSettings:
    """Read ``url`` and ``options`` (which override the query); no I/O.

    Raises :class:`~leasekit.InvalidLeaseArgument` for anything redis-py or leasekit
    would refuse, naming the redacted URL.
    """
    parsed = parse_url(url, schemes=_SCHEMES, default_port=DEFAULT_PORT)
    settled = _OPTION_SETS[parsed.scheme].parse(parsed.query, options, url=url)
    values = settled.values
    if parsed.scheme == SENTINEL_SCHEME:
        return _parse_sentinel(url, settled.values, settled.driver)
    if len(parsed.endpoints) > 1:
        raise InvalidLeaseArgument.for_argument(
            "url",
            f"takes one host (a cluster client finds the other nodes itself), got "
            f"{len(parsed.endpoints)} in {parsed.redacted!r}",
        )
    database = _DATABASE.fullmatch(parsed.path) if parsed.path else None
    if parsed.path and database is None:
        raise InvalidLeaseArgument.for_argument(
            "url",
            f"the database must be a number after the host, as in /0, got "
            f"{parsed.path!r} in {parsed.redacted!r}",
        )
    cluster: bool = values["cluster"]
    if cluster and database is not None and int(database.group(1) or 0) != 0:
        raise InvalidLeaseArgument.for_argument(
            "url",
            f"Redis Cluster has only database 0, got db {parsed.path!r} in {parsed.redacted!r}",
        )
    query = urlencode(settled.driver)
    driver_url = parsed.without_query() + (f"?{query}" if query else "")
    try:
        redis_parse_url(driver_url)
    except ValueError as exc:
        raise InvalidLeaseArgument.for_argument("url", f"{exc} ({parsed.redacted!r})") from None
    checked = _checked(values, cluster=cluster)
    return RedisSettings(
        driver_url,
        checked.prefix,
        checked.timeout_s,
        checked.counter_ttl_ms,
        cluster,
        values["max_connections"],
        parsed.redacted,
        values["autopipeline"],
        checked.min_replicas,
        checked.replica_timeout_ms,
    )


def _checked(values: dict[str, Any], *, cluster: bool) -> Checked:
    checked = Checked(
        values["prefix"],
        values["timeout_s"],
        values["counter_ttl_ms"],
        values["min_replicas"],
        values["replica_timeout_ms"],
    )
    _check_acknowledgement(checked, cluster=cluster)
    return checked


def _parse_sentinel(
    url: str, values: dict[str, Any], driver: tuple[tuple[str, str], ...]
) -> RedisSettings:
    """``redis+sentinel://[user:password@]host[:port][,host[:port]...]/service[/db]``.

    The hosts are the sentinels (port 26379 by default); the login is the data
    servers', and the sentinels' own comes from ``sentinel_username`` /
    ``sentinel_password``.
    """
    parsed = parse_url(url, schemes=(SENTINEL_SCHEME,), default_port=DEFAULT_SENTINEL_PORT)
    if not parsed.endpoints:
        raise InvalidLeaseArgument.for_argument(
            "url", f"names no sentinel (host:port before the service) in {parsed.redacted!r}"
        )
    shape = _SERVICE.fullmatch(parsed.path) if parsed.path else None
    if shape is None:
        raise InvalidLeaseArgument.for_argument(
            "url",
            f"must name the service Sentinel watches after the sentinels, then optionally "
            f"the database, as in /mymaster/0, got {parsed.path or '(nothing)'!r} in "
            f"{parsed.redacted!r}",
        )
    service, db_text = shape.group(1), shape.group(2)
    db = int(db_text) if db_text else 0
    # The data servers' connection settings, read by redis-py from a URL of our making
    # (its host is a stand-in: the sentinels say which server is the primary).
    userinfo = parsed.without_query()[len(SENTINEL_SCHEME) + 3 :].partition("/")[0]
    login = userinfo.rpartition("@")[0]
    query = urlencode(driver)
    driver_url = f"redis://{login + '@' if login else ''}primary/{db}" + (
        f"?{query}" if query else ""
    )
    try:
        redis_parse_url(driver_url)
    except ValueError as exc:
        raise InvalidLeaseArgument.for_argument("url", f"{exc} ({parsed.redacted!r})") from None
    checked = _checked(values, cluster=False)
    sentinel_timeout = values["sentinel_timeout_s"]
    if sentinel_timeout is None:
        sentinel_timeout = min(1.0, checked.timeout_s)
    elif sentinel_timeout > checked.timeout_s:
        raise InvalidLeaseArgument.for_argument(
            "sentinel_timeout_s",
            f"must be at most timeout_s ({checked.timeout_s:g} s), got {sentinel_timeout:g}",
            sentinel_timeout,
        )
    sentinel = SentinelSettings(
        tuple((e.host, e.port or DEFAULT_SENTINEL_PORT) for e in parsed.endpoints),
        service,
        db,
        values["sentinel_username"],
        values["sentinel_password"],
        sentinel_timeout,
    )
    return RedisSettings(
        driver_url,
        checked.prefix,
        checked.timeout_s,
        checked.counter_ttl_ms,
        False,
        values["max_connections"],
        parsed.redacted,
        values["autopipeline"],
        checked.min_replicas,
        checked.replica_timeout_ms,
        sentinel,
    )


def connection_settings(timeout_s: float, retry: Any) -> dict[str, Any]:
    """The connection keywords both clients get; ``retry`` is the client's ``Retry`` class.

    Every socket wait is bounded by ``timeout_s``. One immediate retry on a dropped
    connection (a restarted server, an idle link cut by a proxy) and none on
    timeouts; see docs/backends/redis.md.
    """
    from redis.backoff import NoBackoff  # noqa: PLC0415

    return {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        "retry_on_error": [RedisConnectionError],
    }


def sentinel_settings(settings: RedisSettings, retry: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keywords of redis-py's ``Sentinel``: the sentinels' own, then the data servers'.

    A sentinel that does not answer within ``sentinel_timeout_s`` is skipped for the
    next, with no retry of its own. The data servers' keywords are the URL's login,
    database and passed-through query (the stand-in host dropped).
    """
    from redis.backoff import NoBackoff  # noqa: PLC0415

    sentinel = settings.sentinel
    assert sentinel is not None
    own: dict[str, Any] = {
        "socket_timeout": sentinel.timeout_s,
        "socket_connect_timeout": sentinel.timeout_s,
        "retry": retry(NoBackoff(), 0),
    }
    if sentinel.username is not None:
        own["username"] = sentinel.username
    if sentinel.password is not None:
        own["password"] = sentinel.password
    servers: dict[str, Any] = dict(redis_parse_url(settings.driver_url))
    servers.pop("host", None)
    servers.pop("port", None)
    return own, servers


def garbled(exc: ValueError, *, prefix: str, key: str | None) -> LeaseBackendError:
    """The error for data at a lease's name that no leasekit script wrote."""
    return LeaseBackendError(
        f"unexpected data at the lease's Redis key ({exc}); is another program "
        f"writing under the prefix {prefix!r}?",
        backend=BACKEND,
        key=key,
    )


RedisURLSettings = RedisSettings
"""The name the benchmark (``leasekit_redis._bench``) knows the parsed settings by."""


def url_settings(url: str, **options: Any) -> RedisSettings:
    """Parse ``url`` and ``options`` as :meth:`RedisLeaseProvider.from_url` does; no I/O.

    Raises :class:`~leasekit.InvalidLeaseArgument` for anything ``from_url`` refuses. The
    benchmark's floor and peers connect from the same settings as the provider.
    """
    return parse(url, dict(options))
