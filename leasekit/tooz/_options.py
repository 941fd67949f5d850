"""A ``leasekit+<scheme>://`` tooz URL, parsed once into the driver's frozen settings.

tooz hands a driver its URL split, and every query parameter and keyword argument of
``get_coordinator`` as lists of values (the keyword arguments first). The driver's own
options are read here; everything else is leasekit's: a text value goes back into the
leasekit URL's query, any other value to :func:`leasekit.sync.connect` as a keyword
argument, where the backend checks it and refuses what it does not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from .._errors import InvalidLeaseArgument
from ..backend import Option, OptionSet

__all__ = ["PREFIX", "SCHEMES", "ToozSettings", "parse_settings"]

PREFIX = "leasekit+"
SCHEMES = (
    "redis",
    "rediss",
    "sqlite",
    "postgresql",
    "postgres",
    "etcd",
    "etcds",
    "mysql",
    "mariadb",
)
"""The leasekit schemes registered as ``leasekit+<scheme>`` under ``tooz.backends``."""


def _namespace(value: str) -> str:
    if not value or "/" in value:
        raise InvalidLeaseArgument.for_argument(
            "namespace", f"must be non-empty and contain no '/', got {value!r}", value
        )
    return value


TIMEOUT = Option("timeout", float, 30.0, minimum=0.001, maximum=2_000_000)
"""Seconds a member (and a leader) stays without a heartbeat, as tooz's redis ``timeout``."""
LOCK_TIMEOUT = Option("lock_timeout", float, 30.0, minimum=0.001, maximum=2_000_000)
"""Seconds a lock is held without a heartbeat renewing it."""
NAMESPACE = Option("namespace", str, "tooz", check=_namespace)
"""The first segment of every lease key the driver writes: coordinators meet in one."""
EXECUTOR = Option("executor", str, "threaded")
"""tooz's own: which executor runs the group calls (``threaded`` or ``synchronous``)."""

_OPTIONS = OptionSet("the leasekit tooz driver", (TIMEOUT, LOCK_TIMEOUT, NAMESPACE, EXECUTOR))


@dataclass(frozen=True, slots=True)
class ToozSettings:
    """What the driver runs with: the leasekit URL and options, TTLs in ms, the namespace."""

    url: str
    scheme: str
    connect_options: Mapping[str, Any] = field(default_factory=dict)
    member_ttl_ms: int = 30_000
    lock_ttl_ms: int = 30_000
    namespace: str = "tooz"


_PATHLESS = frozenset({"redis", "rediss", "etcd", "etcds"})
"""Schemes whose tooz drivers read no path from a URL (tooz's redis and etcd3gw)."""


def _path(scheme: str, path: str) -> str:
    """The path leasekit's URL keeps: tooz's key-value stores ignore one, as tooz does.

    A Redis database number (``/3``) is leasekit's own form and stays; any other path
    on ``redis``/``etcd`` (``leasekit+redis://host:6379/anything``) is dropped, as
    tooz's own drivers for those stores drop it, so URLs written for them keep working.
    """
    if scheme not in _PATHLESS:
        return path
    if scheme.startswith("redis") and path.strip("/").isdecimal():
        return path
    return ""


def parse_settings(parsed_url: Any, options: Mapping[str, Any]) -> ToozSettings:
    """Settings from tooz's split URL and its option lists; refuses a bad URL or option.

    Raises :class:`~leasekit.InvalidLeaseArgument` naming the problem.
    """
    full_scheme = str(parsed_url.scheme)
    if not full_scheme.startswith(PREFIX) or full_scheme[len(PREFIX) :] not in SCHEMES:
        raise InvalidLeaseArgument.for_argument(
            "url",
            f"scheme {full_scheme!r} is not one of "
            + ", ".join(PREFIX + scheme for scheme in SCHEMES),
            full_scheme,
        )
    scheme = full_scheme[len(PREFIX) :]
    ours: dict[str, object] = {}
    query: list[tuple[str, str]] = []
    keywords: dict[str, Any] = {}
    for name, values in options.items():
        value = values[-1] if isinstance(values, list | tuple) else values
        if isinstance(values, list | tuple) and not values:
            continue
        if name in _OPTIONS.options:
            ours[name] = (
                _OPTIONS.options[name].from_text(value) if isinstance(value, str) else value
            )
        elif isinstance(value, str):
            query.append((name, value))
        else:
            keywords[name] = value
    parsed = _OPTIONS.parse((), ours)
    url = f"{scheme}://{parsed_url.netloc}{_path(scheme, str(parsed_url.path))}"
    if query:
        url += "?" + urlencode(query)
    return ToozSettings(
        url=url,
        scheme=scheme,
        connect_options=keywords,
        member_ttl_ms=max(1, round(parsed["timeout"] * 1000)),
        lock_ttl_ms=max(1, round(parsed["lock_timeout"] * 1000)),
        namespace=parsed["namespace"],
    )
