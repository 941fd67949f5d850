"""What the async and the blocking MySQL providers share: options, settings, errors.

One source for both: :func:`settings` reads the constructor's options (and
:func:`url_settings` a ``mysql://`` / ``mariadb://`` URL) into one frozen
:class:`MySQLSettings`, with every check both providers make; :data:`ERRORS` maps
asyncmy's and PyMySQL's exceptions (one error-number scheme for both) to leasekit's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from asyncmy import errors as asyncmy_errors
from pymysql import err as pymysql_errors  # type: ignore[import-untyped]  # (no stubs)

from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
)
from leasekit.backend import Endpoint, ErrorMap, Option, OptionSet, parse_url, timeout_option

from . import _sql

__all__ = [
    "BACKEND",
    "CAPABILITIES",
    "DEADLOCK",
    "ERRORS",
    "LOST",
    "MySQLSettings",
    "error_code",
    "settings",
    "url_settings",
]

BACKEND = "mysql"
SCHEMES = ("mysql", "mariadb")
DEFAULT_PORT = 3306

CAPABILITIES = Capabilities(
    atomic_transfer=True,
    fencing=True,
    server_clock=True,  # microsecond resolution: ttl_resolution_ms=1, the default
    shared_across_processes=True,
    shared_across_hosts=True,
    persistent=True,
    metadata=True,  # grant_notifications: no channel to send them on; watchers poll
    slots=True,
    fair_waiting=True,
)

# Error numbers, the same from both drivers (exc.args[0]): below 2000 the server's,
# 2000 and up the client's.
DEADLOCK = 1213
NO_SUCH_TABLE = 1146
LOST = frozenset({2006, 2013, 2055, 4031})  # gone away, lost during query, killed idle
_BY_CODE: dict[int, type[LeaseBackendError]] = {
    **dict.fromkeys((1040, 1044, 1045, 1049, 2003, 2005, 2026), LeaseBackendUnreachable),
    **dict.fromkeys((1205, 1969, 3024), LeaseBackendTimeout),  # lock wait, statement time
}


def error_code(exc: BaseException) -> int | None:
    """The driver's error number of ``exc``, or None."""
    code = exc.args[0] if exc.args else None
    return code if isinstance(code, int) else None


class _MySQLErrors(ErrorMap):
    """Classifies a driver error by its error number first, then by its class."""

    __slots__ = ()

    def classify(self, exc: BaseException) -> type[LeaseBackendError]:
        code = error_code(exc)
        if code in LOST and isinstance(exc.__context__, TimeoutError):
            return LeaseBackendTimeout  # PyMySQL's read or write timeout (timeout_s)
        kind = _BY_CODE.get(code or 0)
        return super().classify(exc) if kind is None else kind


ERRORS: ErrorMap = _MySQLErrors(
    {asyncmy_errors.MySQLError: LeaseBackendError, pymysql_errors.MySQLError: LeaseBackendError},
    backend=BACKEND,
)

# [database.]table; 48 characters leave room for "_token_seq" within MySQL's 64.
_TABLE = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]{0,63}\.)?[A-Za-z_][A-Za-z0-9_]{0,47}")


def _check_table(table: str) -> str:
    if not _TABLE.fullmatch(table):
        rule = "must be [database.]table of letters, digits and _ (a table of at most 48)"
        raise InvalidLeaseArgument.for_argument("table", f"{rule}, got {table!r}", table)
    return table


def _check_tokens(tokens: str) -> str:
    if tokens != "auto" and tokens not in _sql.TOKEN_SOURCES:
        rule = f"must be auto, sequence or clock, got {tokens!r}"
        raise InvalidLeaseArgument.for_argument("tokens", rule, tokens)
    return tokens


PROVIDER_OPTIONS = OptionSet(
    BACKEND,
    [
        Option("table", str, _sql.DEFAULT_TABLE, check=_check_table),
        timeout_option(),
        Option("create_schema", bool, True),
        Option("tokens", str, "auto", check=_check_tokens),
        Option("sweep_every", int, 100, minimum=0),
        Option("sweep_batch", int, 1000, minimum=1),
        Option("sweep_grace_s", float, 600.0, above=0),
    ],
)
URL_OPTIONS = OptionSet(
    BACKEND,
    [
        *PROVIDER_OPTIONS.options.values(),
        Option("pool_min_size", int, 1, minimum=0),
        Option("pool_max_size", int, 10, minimum=1),
        Option("charset", str, "utf8mb4"),
    ],
)


@dataclass(frozen=True, slots=True)
class MySQLSettings:
    """Everything a provider needs, validated; ``connect`` is None on a caller's client."""

    table: _sql.TableName
    timeout_s: float
    create_schema: bool
    tokens: str
    sweep_every: int
    sweep_batch: int
    sweep_grace_s: float
    connect: Mapping[str, Any] | None = None
    """host, port, user, password, database, charset, connect_timeout, init_command."""
    pool_min_size: int = 1
    pool_max_size: int = 10

    @property
    def token_source(self) -> int | None:
        """The ``tokens`` option as the meta table records it (None: by the server)."""
        return _sql.TOKEN_SOURCES.get(self.tokens)

    def options(self) -> dict[str, Any]:
        """The constructor's options that give these settings."""
        return {
            "table": str(self.table),
            "timeout_s": self.timeout_s,
            "create_schema": self.create_schema,
            "tokens": self.tokens,
            "sweep_every": self.sweep_every,
            "sweep_batch": self.sweep_batch,
            "sweep_grace_s": self.sweep_grace_s,
        }

    def where(self) -> str:
        """For error messages: the server (unless a caller's) and the table; no secret."""
        options = self.connect
        server = f"server {options['host']}:{options['port']}, " if options else ""
        return f" ({server}table {self.table})"


def settings(options: Mapping[str, Any], connect: Mapping[str, Any] | None = None) -> MySQLSettings:
    """The constructor's ``options`` (and ``connect``, the server to build a pool for)."""
    values = PROVIDER_OPTIONS.parse(overrides=options).values
    return _settings(values, connect)


def _settings(values: dict[str, Any], connect: Mapping[str, Any] | None) -> MySQLSettings:
    if values["sweep_grace_s"] <= values["timeout_s"]:
        rule = "must be longer than timeout_s: fencing tokens need every statement done"
        raise InvalidLeaseArgument.for_argument("sweep_grace_s", rule, values["sweep_grace_s"])
    name = values.pop("table").split(".")
    table = _sql.TableName(*name) if len(name) == 2 else _sql.TableName(None, name[0])
    return MySQLSettings(table=table, connect=connect, **values)


def url_settings(url: str, options: Mapping[str, Any]) -> MySQLSettings:
    """``mysql://user:password@host:port/db`` (or ``mariadb://``) and ``options``: no I/O.

    leasekit's options come from the query or keyword arguments (which win): the
    constructor's, plus ``pool_min_size``, ``pool_max_size`` and ``charset``.
    """
    parsed = parse_url(url, schemes=SCHEMES, default_port=DEFAULT_PORT)
    if len(parsed.endpoints) > 1:
        rule = f"takes one host, got {len(parsed.endpoints)} ({parsed.redacted!r})"
        raise InvalidLeaseArgument.for_argument("url", rule)
    values = URL_OPTIONS.parse(parsed.query, options, url=url).values
    endpoint = parsed.endpoints[0] if parsed.endpoints else Endpoint("127.0.0.1", DEFAULT_PORT)
    timeout_s = values["timeout_s"]
    connect = {
        "host": endpoint.host,
        "port": endpoint.port or DEFAULT_PORT,
        "user": parsed.username or "root",
        "password": parsed.password or "",
        "database": parsed.path.strip("/") or None,
        "charset": values.pop("charset"),
        "connect_timeout": max(1, math.ceil(timeout_s)),
        # A statement waiting on a row lock gives up on the server soon after the
        # client has: whole seconds, the only unit both servers take.
        "init_command": f"SET SESSION innodb_lock_wait_timeout = {math.ceil(timeout_s)}",
    }
    if values["pool_max_size"] < values["pool_min_size"]:
        rule = "must be at least pool_min_size"
        raise InvalidLeaseArgument.for_argument("pool_max_size", rule, values["pool_max_size"])
    return _settings(values, connect)
