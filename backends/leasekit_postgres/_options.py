"""The PostgreSQL backend's options, capabilities and error table, for both providers.

Parsing and coercion are the toolkit's (:class:`~leasekit.backend.OptionSet`); what is
left here is what only PostgreSQL has: the table name's rules, the sweep's grace
period that must outlast ``timeout_s``, and the libpq connection string (the URL minus
leasekit's options, with ``statement_timeout`` in its startup options). The async and
the blocking provider both build their :class:`Settings` with :func:`provider_settings`
and check their client with :func:`check_client`: one set of constructor checks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
import psycopg.errors
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo, timeout_from_conninfo
from psycopg_pool import PoolTimeout

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
    ParsedOptions,
    parse_url,
    redact_url,
    timeout_option,
)

from . import _sql
from ._notify import channel_for

__all__ = [
    "BACKEND",
    "CAPABILITIES",
    "CONNECT_ERRORS",
    "ERRORS",
    "INSPECT_LIMIT",
    "PROVIDER_OPTIONS",
    "URL_FORMS",
    "URL_OPTIONS",
    "PoolSettings",
    "Settings",
    "SettingsAttributes",
    "check_client",
    "check_grace",
    "describe",
    "pool_settings",
    "provider_settings",
    "server_of",
    "table_name",
    "where",
]

BACKEND = "postgresql"
SCHEMES = ("postgresql", "postgres")
URL_FORMS = (
    "postgresql://h1:5432,h2:5432/db (primary and standbys: the writable one is used)",
    "?synchronous_commit=on (grants acknowledged by a synchronous standby)",
)
"""What ``leasekit backends`` shows beside the plain URL."""

CAPABILITIES = Capabilities(
    atomic_transfer=True,
    fencing=True,
    ttl_resolution_ms=1,
    min_ttl_ms=1,
    server_clock=True,
    shared_across_processes=True,
    shared_across_hosts=True,
    persistent=True,
    release_notifications=True,
    grant_notifications=True,
    metadata=True,
    slots=True,
    fair_waiting=True,
)
"""What both providers declare (``release_notifications`` and ``grant_notifications``
off with ``notifications=false``)."""

ERRORS = ErrorMap(
    {
        PoolTimeout: LeaseBackendTimeout,  # no connection available within timeout_s
        psycopg.errors.QueryCanceled: LeaseBackendTimeout,  # statement_timeout
        # A connection that reached a standby (or a demoted primary): nothing was written,
        # and no writable primary was reached through it.
        psycopg.errors.ReadOnlySqlTransaction: LeaseBackendUnreachable,
        psycopg.Error: LeaseBackendError,
    },
    backend=BACKEND,
)
"""psycopg's errors as leasekit's, for both providers."""

CONNECT_ERRORS = ErrorMap({psycopg.OperationalError: LeaseBackendUnreachable}, backend=BACKEND)
"""Connecting failed: refused, DNS, TLS, authentication. Only for a provider's own first
connection (and its LISTEN one); once connected, an OperationalError is a lost connection."""

INSPECT_LIMIT = Option("limit", int, 1000, minimum=1)

DEFAULT_POOL_MIN_SIZE = 1
DEFAULT_POOL_MAX_SIZE = 10

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_TABLE_CHARS = 48  # leaves room for the derived names ("_token_seq") within 63 bytes


def _check_table(table: str) -> str:
    table_name(table)
    return table


def table_name(table: str) -> _sql.TableName:
    """``table`` (``name`` or ``schema.name``), checked and split into its parts."""
    parts = table.split(".")
    if len(parts) > 2 or not all(_IDENTIFIER.fullmatch(part) for part in parts):
        raise InvalidLeaseArgument.for_argument(
            "table",
            "must be an identifier (letters, digits, underscores; not starting with a "
            f"digit), optionally schema-qualified as schema.table, got {table!r}",
            table,
        )
    if len(parts[-1]) > _MAX_TABLE_CHARS or len(parts[0]) > 63:
        raise InvalidLeaseArgument.for_argument(
            "table", f"the table name may have at most {_MAX_TABLE_CHARS} characters", table
        )
    if len(parts) == 2:
        return _sql.TableName(parts[0], parts[1])
    return _sql.TableName(None, parts[0])


_TABLE = Option("table", str, _sql.DEFAULT_TABLE, check=_check_table)

SYNCHRONOUS_COMMIT_LEVELS = ("remote_write", "on", "remote_apply")
"""The ``synchronous_commit`` levels that wait for a synchronous standby, weakest first."""


def _check_synchronous_commit(level: str) -> str:
    if level not in SYNCHRONOUS_COMMIT_LEVELS:
        raise InvalidLeaseArgument.for_argument(
            "synchronous_commit",
            "must be one of remote_write, on, remote_apply (the levels at which a commit "
            "waits for a synchronous standby; leave it unset for the server's own "
            f"setting), got {level!r}",
            level,
        )
    return level


_PROVIDER = (
    _TABLE,
    timeout_option(5.0),
    Option("create_schema", bool, True),
    Option("sweep_every", int, 100, minimum=0),
    Option("sweep_batch", int, 1000, minimum=1),
    Option("sweep_grace_s", float, 600.0, above=0),
    # LISTEN/NOTIFY wake-ups for waiters; off behind a transaction-mode pgbouncer.
    Option("notifications", bool, True),
    # A grant counts only once a synchronous standby has it; checked when the provider
    # starts (synchronous_standby_names must name one).
    Option("synchronous_commit", str, None, nullable=True, check=_check_synchronous_commit),
)

PROVIDER_OPTIONS = OptionSet(BACKEND, _PROVIDER)
"""What ``PostgresLeaseProvider(client, ...)`` takes besides the client."""

URL_OPTIONS = OptionSet(
    BACKEND,
    (
        *_PROVIDER,
        Option("pool_min_size", int, DEFAULT_POOL_MIN_SIZE, minimum=0),
        Option("pool_max_size", int, DEFAULT_POOL_MAX_SIZE, minimum=1),
        Option("prepare_threshold", int, None, minimum=0, nullable=True),
        Option("server_timeout", bool, True),
    ),
    # Every other query parameter is libpq's; libpq itself refuses the ones it lacks.
    driver=lambda name: True,
)
"""What ``from_url`` takes: the provider's options, plus the pool's and the connections'."""


def check_grace(options: Mapping[str, Any]) -> None:
    """``sweep_grace_s`` must outlast ``timeout_s``: no statement may outlive the grace."""
    grace_s, timeout_s = options["sweep_grace_s"], options["timeout_s"]
    if not grace_s > timeout_s:
        raise InvalidLeaseArgument.for_argument(
            "sweep_grace_s",
            f"must be longer than timeout_s ({timeout_s:g}), so no statement outlives it "
            f"(fencing tokens depend on that), got {grace_s!r}",
            grace_s,
        )


@dataclass(frozen=True, slots=True)
class Settings:
    """A provider's options, checked, and what follows from them; the same for both providers."""

    table: str
    timeout_s: float
    create_schema: bool
    sweep_every: int
    sweep_batch: int
    sweep_grace_s: float
    notifications: bool
    synchronous_commit: str | None
    """The level every leasekit session must run at, checked at start; ``None``: any."""
    statements: _sql.Statements
    channel: str | None
    """The ``NOTIFY`` channel releases and transfers notify on; ``None`` when off."""
    capabilities: Capabilities


class SettingsAttributes:
    """The options both providers show as read-only attributes (``provider.table``, ...)."""

    _settings: Settings

    @property
    def table(self) -> str:
        """The lease table (``name`` or ``schema.name``)."""
        return self._settings.table

    @property
    def create_schema(self) -> bool:
        """Whether the schema is created on first use if it is missing."""
        return self._settings.create_schema

    @property
    def sweep_every(self) -> int:
        """Writes between two background sweeps (0: never by itself)."""
        return self._settings.sweep_every

    @property
    def sweep_batch(self) -> int:
        """Rows one sweep deletes at most."""
        return self._settings.sweep_batch

    @property
    def sweep_grace_s(self) -> float:
        """How long after expiry a row may be swept."""
        return self._settings.sweep_grace_s

    @property
    def notifications(self) -> bool:
        """Whether releases and transfers notify waiters (``LISTEN``/``NOTIFY``)."""
        return self._settings.notifications

    @property
    def synchronous_commit(self) -> str | None:
        """The ``synchronous_commit`` level leasekit's sessions must run at (``None``: any)."""
        return self._settings.synchronous_commit


def provider_settings(options: Mapping[str, object]) -> Settings:
    """A provider's keyword options (those of :data:`PROVIDER_OPTIONS`) as :class:`Settings`.

    Raises :class:`~leasekit.InvalidLeaseArgument` naming a bad option; no I/O.
    """
    values = PROVIDER_OPTIONS.parse(overrides=options).values
    check_grace(values)
    table = table_name(values["table"])
    notifications: bool = values["notifications"]
    return Settings(
        table=values["table"],
        timeout_s=values["timeout_s"],
        create_schema=values["create_schema"],
        sweep_every=values["sweep_every"],
        sweep_batch=values["sweep_batch"],
        sweep_grace_s=values["sweep_grace_s"],
        notifications=notifications,
        synchronous_commit=values["synchronous_commit"],
        statements=_sql.Statements(table),
        channel=channel_for(str(table)) if notifications else None,
        capabilities=(
            CAPABILITIES
            if notifications
            else replace(CAPABILITIES, release_notifications=False, grant_notifications=False)
        ),
    )


def check_client(
    client: object, pool_type: type, connection_type: type | None, *, expected: str
) -> None:
    """Refuse a client that is not a pool of ``pool_type`` (or an autocommit connection).

    ``expected`` names what is accepted, for the message.
    """
    if isinstance(client, pool_type):
        return
    if connection_type is not None and isinstance(client, connection_type):
        if not getattr(client, "autocommit", False):
            raise InvalidLeaseArgument.for_argument(
                "client",
                "the connection must be in autocommit mode (connect with "
                "autocommit=True): each lease operation is its own transaction",
            )
        return
    raise InvalidLeaseArgument.for_argument(
        "client",
        f"must be {expected}, got {type(client).__module__}.{type(client).__qualname__}",
    )


def server_of(conninfo: object) -> str:
    """``host:port/dbname`` of a connection string, for messages (never the password).

    Several hosts (a multi-host URL): ``host1:port1,host2:port2/dbname``.
    """
    if not isinstance(conninfo, str):
        return ""  # a callable that computes it (psycopg_pool >= 3.3)
    try:
        params = conninfo_to_dict(conninfo)
    except (psycopg.Error, ValueError):
        return ""
    hosts = str(params.get("host") or "localhost").split(",")
    ports = str(params.get("port") or "5432").split(",")
    if len(ports) == 1:  # one port for every host
        ports *= len(hosts)
    endpoints = ",".join(f"{host}:{port}" for host, port in zip(hosts, ports, strict=False))
    return f"{endpoints}/{params.get('dbname', '')}"


def where(server: str, table: str) -> str:
    """What error messages end with: ``" (server host:port/db, table t)"``."""
    return f" (server {server}, table {table})" if server else f" (table {table})"


def describe(server: str, table: str) -> str:
    """What a provider's ``repr`` shows inside its parentheses."""
    return f"table={table!r}" + (f", server={server!r}" if server else "")


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """What ``from_url`` builds its pool from, and the provider's own options."""

    conninfo: str
    connection_kwargs: dict[str, Any]
    min_size: int
    max_size: int
    provider: dict[str, Any]

    def pool_arguments(self, name: str) -> dict[str, Any]:
        """What ``ConnectionPool`` and ``AsyncConnectionPool`` take besides the conninfo."""
        return {
            "kwargs": self.connection_kwargs,
            "min_size": self.min_size,
            "max_size": self.max_size,
            "timeout": self.provider["timeout_s"],
            "name": name,
            "open": False,
        }


def pool_settings(url: object, overrides: Mapping[str, object]) -> PoolSettings:
    """Parse a ``postgresql://`` URL and keyword options; no I/O.

    Raises :class:`~leasekit.InvalidLeaseArgument` naming the problem (with the
    password redacted) for a malformed URL, an unknown or bad option, or a query
    parameter libpq does not know.
    """
    parsed = parse_url(url, schemes=SCHEMES)
    try:
        options = URL_OPTIONS.parse(parsed.query, overrides, url=parsed.original)
    except InvalidLeaseArgument as exc:
        if exc.argument == "options":
            raise InvalidLeaseArgument.for_argument(
                "options",
                f"{exc.rule} (libpq parameters go in the URL's query; or pass your own pool "
                "as PostgresLeaseProvider(pool))",
            ) from None
        raise
    check_grace(options.values)
    _check_pool_sizes(options)
    driver_url = parsed.without_query()
    if options.driver:
        driver_url += "?" + urlencode(options.driver, quote_via=quote)
    try:
        params = conninfo_to_dict(driver_url)
        timeout_from_conninfo(params)  # psycopg's own check of connect_timeout
    except psycopg.Error as exc:
        raise InvalidLeaseArgument.for_argument(
            "url", f"{_one_line(exc)} ({redact_url(parsed.original)!r})"
        ) from None
    _check_libpq_values(params, parsed.original)
    timeout_s: float = options["timeout_s"]
    startup = []
    if options["server_timeout"]:
        # A startup option, not a SET: it holds for the whole connection without any
        # session state, and the server cancels a statement stuck past timeout_s.
        startup.append(f"-c statement_timeout={max(1, math.ceil(timeout_s * 1000))}")
    if options["synchronous_commit"] is not None:
        # Also a startup option: every commit of leasekit's sessions waits for the standby.
        startup.append(f"-c synchronous_commit={options['synchronous_commit']}")
    if startup:
        params["options"] = " ".join([str(params.get("options") or ""), *startup]).strip()
    if "," in str(params.get("host") or "") and "target_session_attrs" not in params:
        # Several hosts (a primary and its standbys): connect only to the one that
        # accepts writes, whichever it is now. libpq's default would take the first
        # that answers, a standby included.
        params["target_session_attrs"] = "read-write"
    params.setdefault("connect_timeout", str(max(2, math.ceil(timeout_s))))
    params.setdefault("fallback_application_name", "leasekit")
    return PoolSettings(
        conninfo=make_conninfo("", **params),
        connection_kwargs={"autocommit": True, "prepare_threshold": options["prepare_threshold"]},
        min_size=options["pool_min_size"],
        max_size=options["pool_max_size"],
        provider={name: options[name] for name in PROVIDER_OPTIONS.names},
    )


def _one_line(exc: BaseException) -> str:
    # libpq's messages end with a newline, some span lines: a CLI error is one line.
    return " ".join(str(exc).split())


# libpq's integer parameters that it reads only when it opens a TCP socket, so that the
# dry run below, on a Unix socket, never sees them; an integer as libpq parses one.
_TCP_ONLY_INTEGERS = (
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)
_LIBPQ_INTEGER = re.compile(r"\s*[-+]?\d+\s*")

# A socket directory that does not exist: libpq's dry run below fails there, locally.
_NO_SERVER = "/nonexistent/leasekit-option-check"


def _check_libpq_values(params: dict[str, Any], url: str) -> None:
    """Refuse a value libpq would refuse (``sslmode=bogus``, ``port=abc``), before any I/O.

    libpq checks its parameters' values only when it starts connecting. So it starts
    a connection here with the same parameters but every host replaced by a Unix
    socket directory that does not exist: libpq checks the values first, and if they
    pass, fails at once on the missing socket, having sent nothing anywhere. A failure
    that is not that one is a bad value. The values libpq checks only on a TCP
    connection (``keepalives``, ``tcp_user_timeout``: integers all) are checked here.
    """
    for name in _TCP_ONLY_INTEGERS:
        value = params.get(name)
        if value is not None and not _LIBPQ_INTEGER.fullmatch(str(value)):
            raise InvalidLeaseArgument.for_argument(
                "url",
                f"invalid integer value {str(value)!r} for connection option {name!r} "
                f"({redact_url(url)!r})",
            )
    probe = dict(params)
    hosts = str(probe.pop("hostaddr", None) or probe.get("host") or "").split(",")
    probe["host"] = ",".join([_NO_SERVER] * len(hosts))
    probe["hostaddr"] = ""  # set, so that no PGHOSTADDR in the environment applies
    conn = pq.PGconn.connect_start(make_conninfo("", **probe).encode())
    try:
        if conn.status != pq.ConnStatus.BAD:
            return
        message = conn.get_error_message()
    finally:
        conn.finish()
    if _NO_SERVER not in message:
        raise InvalidLeaseArgument.for_argument(
            "url", f"{' '.join(message.split())} ({redact_url(url)!r})"
        )


def _check_pool_sizes(options: ParsedOptions) -> None:
    low, high = options["pool_min_size"], options["pool_max_size"]
    if high < low:
        raise InvalidLeaseArgument.for_argument(
            "pool_max_size", f"must be at least pool_min_size ({low}), got {high}", high
        )
