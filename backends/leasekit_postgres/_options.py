"""The PostgreSQL backend's options, and how ``from_url`` turns a URL into a pool.

Parsing and coercion are the toolkit's (:class:`~leasekit.backend.OptionSet`); what is
left here is what only PostgreSQL has: the table name's rules, the sweep's grace
period that must outlast ``timeout_s``, and the libpq connection string (the URL minus
leasekit's options, with ``statement_timeout`` in its startup options).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from leasekit import InvalidLeaseArgument
from leasekit.backend import Option, OptionSet, ParsedOptions, parse_url, redact_url, timeout_option

from . import _sql

__all__ = [
    "BACKEND",
    "PROVIDER_OPTIONS",
    "URL_OPTIONS",
    "PoolSettings",
    "check_grace",
    "pool_settings",
    "table_name",
]

BACKEND = "postgresql"
SCHEMES = ("postgresql", "postgres")

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
_PROVIDER = (
    _TABLE,
    timeout_option(5.0),
    Option("create_schema", bool, True),
    Option("sweep_every", int, 100, minimum=0),
    Option("sweep_batch", int, 1000, minimum=1),
    Option("sweep_grace_s", float, 600.0, above=0),
    # LISTEN/NOTIFY wake-ups for waiters; off behind a transaction-mode pgbouncer.
    Option("notifications", bool, True),
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
class PoolSettings:
    """What ``from_url`` builds its pool from, and the provider's own options."""

    conninfo: str
    connection_kwargs: dict[str, Any]
    min_size: int
    max_size: int
    provider: dict[str, Any]


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
    except psycopg.Error as exc:
        raise InvalidLeaseArgument.for_argument(
            "url", f"{exc} ({redact_url(parsed.original)!r})"
        ) from None
    timeout_s: float = options["timeout_s"]
    if options["server_timeout"]:
        # A startup option, not a SET: it holds for the whole connection without any
        # session state, and the server cancels a statement stuck past timeout_s.
        extra = f"-c statement_timeout={max(1, math.ceil(timeout_s * 1000))}"
        params["options"] = f"{params.get('options', '')} {extra}".strip()
    params.setdefault("connect_timeout", str(max(2, math.ceil(timeout_s))))
    params.setdefault("fallback_application_name", "leasekit")
    return PoolSettings(
        conninfo=make_conninfo("", **params),
        connection_kwargs={"autocommit": True, "prepare_threshold": options["prepare_threshold"]},
        min_size=options["pool_min_size"],
        max_size=options["pool_max_size"],
        provider={name: options[name] for name in PROVIDER_OPTIONS.names},
    )


def _check_pool_sizes(options: ParsedOptions) -> None:
    low, high = options["pool_min_size"], options["pool_max_size"]
    if high < low:
        raise InvalidLeaseArgument.for_argument(
            "pool_max_size", f"must be at least pool_min_size ({low}), got {high}", high
        )
