"""The SQLite backend's options, capabilities and error table, shared by both providers.

A ``sqlite://`` URL and keyword options become one frozen :class:`SQLiteSettings`
(:func:`url_settings`, or :func:`settings` for a path), which the async provider, the
blocking provider and the benchmark's floor all read. The checks every constructor
makes (the path, the linked SQLite's version) live here once.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from leasekit import (
    BackendUnavailable,
    Capabilities,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
)
from leasekit.backend import ErrorMap, Option, OptionSet, parse_url, timeout_option

__all__ = [
    "BACKEND",
    "CAPABILITIES",
    "DEFAULT_PATH",
    "ERRORS",
    "OPTIONS",
    "DatabaseLocked",
    "DatabaseUnavailable",
    "SQLiteSettings",
    "settings",
    "url_settings",
]

BACKEND = "sqlite"
DEFAULT_PATH = "leasekit.db"
_MIN_SQLITE = (3, 35, 0)  # UPSERT with RETURNING
_SYNCHRONOUS = ("off", "normal", "full", "extra")


class DatabaseLocked(sqlite3.OperationalError):
    """Another connection held the file's write lock until this call's deadline."""


class DatabaseUnavailable(sqlite3.OperationalError):
    """The file cannot be opened: its directory is missing, or it is and ``create=false``."""


CAPABILITIES = Capabilities(
    atomic_transfer=True,
    fencing=True,
    ttl_resolution_ms=1,
    min_ttl_ms=1,
    server_clock=False,
    shared_across_processes=True,
    shared_across_hosts=False,
    persistent=True,
    metadata=True,
    slots=True,
    fair_waiting=True,
)

ERRORS = ErrorMap(
    {
        DatabaseLocked: LeaseBackendTimeout,
        DatabaseUnavailable: LeaseBackendUnreachable,
        sqlite3.Error: LeaseBackendError,
    },
    backend=BACKEND,
)


def _synchronous(value: str) -> str:
    level = value.strip().lower()
    if level not in _SYNCHRONOUS:
        raise InvalidLeaseArgument.for_argument(
            "synchronous", f"must be one of {', '.join(_SYNCHRONOUS)}, got {value!r}", value
        )
    return level


OPTIONS = OptionSet(
    BACKEND,
    (
        timeout_option(5.0),
        Option("synchronous", str, "full", check=_synchronous),
        Option("sweep_every", int, 32, minimum=1),
        Option("sweep_batch", int, 256, minimum=1),
        Option("create", bool, None, nullable=True),
        # The name PostgreSQL and MySQL give the same switch (create what is missing on
        # first use), so a caller can turn it off alike on every backend with a schema.
        Option("create_schema", bool, None, nullable=True),
    ),
)


@dataclass(frozen=True, slots=True)
class SQLiteSettings:
    """A SQLite file and the options both providers run it with, parsed and checked.

    ``create`` (option ``create`` or ``create_schema``, default true): a missing file
    and its tables are created on first use; false, a missing file or one without
    leasekit's tables is an error. ``options``: every option's value, defaults filled
    in, which a provider is built again from (after a fork).
    """

    path: str
    timeout_s: float
    synchronous: str
    sweep_every: int
    sweep_batch: int
    create: bool
    options: Mapping[str, Any]


def settings(
    path: object = DEFAULT_PATH, options: Mapping[str, object] | None = None
) -> SQLiteSettings:
    """Check ``path`` and ``options`` as both providers' constructors do; no I/O.

    Raises :class:`~leasekit.InvalidLeaseArgument` for an unusable path (an in-memory
    database coordinates nothing) or option, and :class:`~leasekit.BackendUnavailable`
    when the linked SQLite is too old for the statements.
    """
    return _settings(path, OPTIONS.parse((), options).values)


def url_settings(url: str, **options: Any) -> SQLiteSettings:
    """Parse ``url`` and ``options`` as ``SQLiteLeaseProvider.from_url`` does; no I/O.

    ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``, or ``sqlite://``
    for ``leasekit.db``; keyword ``options`` win over the URL's query.
    """
    parsed = parse_url(url, schemes=(BACKEND,))
    if parsed.endpoints or parsed.username is not None:
        raise InvalidLeaseArgument.for_argument(
            "url",
            "must be sqlite:///relative/path.db or sqlite:////absolute/path.db "
            f"(no host part), got {parsed.redacted!r}",
        )
    path = unquote(parsed.path[1:]) or DEFAULT_PATH
    return _settings(path, OPTIONS.parse(parsed.query, options, url=url).values)


def _settings(path: object, values: dict[str, Any]) -> SQLiteSettings:
    checked = _check_path(path)
    if sqlite3.sqlite_version_info < _MIN_SQLITE:
        raise BackendUnavailable(
            f"the SQLite backend needs SQLite >= 3.35 (UPSERT ... RETURNING); this "
            f"Python links SQLite {sqlite3.sqlite_version}",
            scheme=BACKEND,
        )
    create, create_schema = values["create"], values["create_schema"]
    if create is not None and create_schema is not None and create != create_schema:
        raise InvalidLeaseArgument.for_argument(
            "create_schema",
            f"create_schema={create_schema} contradicts create={create} (two names for "
            "one option: give one)",
            create_schema,
        )
    return SQLiteSettings(
        path=checked,
        timeout_s=values["timeout_s"],
        synchronous=values["synchronous"],
        sweep_every=values["sweep_every"],
        sweep_batch=values["sweep_batch"],
        create=next((v for v in (create, create_schema) if v is not None), True),
        options=values,
    )


def _check_path(path: object) -> str:
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise InvalidLeaseArgument.for_argument(
            "path", f"must be a non-empty file path, got {path!r}"
        )
    if path == ":memory:" or path.startswith("file::memory:") or "mode=memory" in path:
        raise InvalidLeaseArgument.for_argument(
            "path",
            "an in-memory SQLite database is private to one connection and cannot "
            "coordinate anything; use memory:// for in-process leases, or a file path",
        )
    return path
