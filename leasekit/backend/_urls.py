"""URLs and options, parsed once, coerced one way for every backend, passwords redacted.

A backend declares its options as :class:`Option` values in an :class:`OptionSet`;
``OptionSet.parse`` takes a URL's query and the keyword arguments of ``from_url``
(which win), coerces text the same way everywhere (``true/false/yes/no/on/off/1/0``;
plain decimal integers; finite numbers; ``none`` for an option that may be unset),
checks types and bounds, refuses unknown names, and hands the driver's own query
parameters back untouched. :func:`parse_url` splits a URL without
:func:`urllib.parse.urlsplit`, whose netloc checks reject a list of hosts with an IPv6
member on some Python releases. :func:`redact_url` is the only password redactor.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

from .._errors import InvalidLeaseArgument

__all__ = [
    "Endpoint",
    "Option",
    "OptionSet",
    "ParsedOptions",
    "ParsedURL",
    "coerce_bool",
    "parse_url",
    "redact_url",
    "timeout_option",
]

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_PORT = re.compile(r"[0-9]{1,5}")
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})
_NONE = frozenset({"none", "null", ""})
_REDACTED = "***"
_LOOSE_SECRET = re.compile(r":[^:@/?#]*@")


def redact_url(url: object) -> str:
    """``url`` with its password (and any ``*password*`` query value) replaced by ``***``.

    Works on any text, well-formed or not, so an error message about a malformed URL
    cannot leak what it was meant to hide. Non-strings are shown by type only.
    """
    if not isinstance(url, str):
        return f"<{type(url).__name__}>"
    match = _SCHEME.match(url)
    if match is None:
        # Not scheme://...: no telling where the authority is, so hide every
        # ":secret@" that could be one ("redis:/user:secret@host").
        return _LOOSE_SECRET.sub(f":{_REDACTED}@", url)
    start = match.end()
    end = len(url)
    for stop in "/?#":
        found = url.find(stop, start)
        if found != -1:
            end = min(end, found)
    authority = url[start:end]
    at = authority.rfind("@")
    if at != -1:
        user, colon, _ = authority[:at].partition(":")
        if colon:
            authority = f"{user}:{_REDACTED}{authority[at:]}"
    rest = url[end:]
    query_at = rest.find("?")
    if query_at != -1:
        fragment_at = rest.find("#", query_at)
        query_end = len(rest) if fragment_at == -1 else fragment_at
        pairs = rest[query_at + 1 : query_end].split("&")
        for index, pair in enumerate(pairs):
            name, equals, _ = pair.partition("=")
            if equals and "password" in unquote(name).lower():
                pairs[index] = f"{name}={_REDACTED}"
        rest = f"{rest[: query_at + 1]}{'&'.join(pairs)}{rest[query_end:]}"
    return f"{url[:start]}{authority}{rest}"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One ``host[:port]`` of a URL; ``host`` is bare (no brackets around IPv6)."""

    host: str
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ParsedURL:
    """A URL split into the parts backends need, percent-decoding userinfo only."""

    scheme: str
    username: str | None
    password: str | None
    endpoints: tuple[Endpoint, ...]
    path: str
    query: tuple[tuple[str, str], ...]
    fragment: str
    original: str = field(repr=False)

    @property
    def redacted(self) -> str:
        """The URL as it may appear in messages: see :func:`redact_url`."""
        return redact_url(self.original)

    def without_query(self) -> str:
        """The URL up to (not including) its query, for drivers that parse URLs themselves."""
        cut = len(self.original)
        for stop in "?#":
            found = self.original.find(stop, len(self.scheme) + 3)
            if found != -1:
                cut = min(cut, found)
        return self.original[:cut]


def _bad_url(url: str, rule: str) -> InvalidLeaseArgument:
    return InvalidLeaseArgument.for_argument("url", f"{rule} ({redact_url(url)!r})")


def _endpoint(url: str, text: str, default_port: int | None) -> Endpoint:
    if text.startswith("["):
        host, bracket, tail = text[1:].partition("]")
        if not bracket or not host:
            raise _bad_url(url, f"malformed IPv6 address {text!r}")
        if tail and not tail.startswith(":"):
            raise _bad_url(url, f"unexpected {tail!r} after an IPv6 address")
        port_text = tail[1:] if tail else None
    else:
        host, colon, port_text_ = text.rpartition(":") if ":" in text else (text, "", "")
        if ":" in host:
            raise _bad_url(url, f"an IPv6 address must be in brackets, got {text!r}")
        port_text = port_text_ if colon else None
    if not host:
        raise _bad_url(url, f"missing host in {text!r}")
    if port_text is None or port_text == "":
        if port_text == "":
            raise _bad_url(url, f"empty port in {text!r}")
        return Endpoint(host, default_port)
    if not _PORT.fullmatch(port_text) or not 0 < int(port_text) < 65536:
        raise _bad_url(url, f"port must be a number in 1..65535, got {port_text!r}")
    return Endpoint(host, int(port_text))


def parse_url(url: object, *, schemes: Iterable[str], default_port: int | None = None) -> ParsedURL:
    """Split ``scheme://[user[:password]@]host[:port][,host[:port]...][/path][?query]``.

    Hosts may be names, IPv4 or bracketed IPv6 addresses, several of them separated by
    commas; the authority may also be empty (``sqlite:///path``) or a bare name
    (``memory://name``). Raises :class:`~leasekit.InvalidLeaseArgument` naming the
    problem, with the password redacted, for anything malformed or a scheme not in
    ``schemes``.
    """
    if not isinstance(url, str):
        raise InvalidLeaseArgument.for_argument(
            "url", f"must be a str, got {type(url).__name__}", url
        )
    allowed = tuple(schemes)
    match = _SCHEME.match(url)
    scheme = match.group(1).lower() if match else ""
    if scheme not in allowed:
        wanted = " or ".join(f"{name}://" for name in allowed)
        raise _bad_url(url, f"must start with {wanted}")
    assert match is not None
    rest = url[match.end() :]
    rest, _, fragment = rest.partition("#")
    rest, _, query_text = rest.partition("?")
    slash = rest.find("/")
    authority, path = (rest, "") if slash == -1 else (rest[:slash], rest[slash:])
    username = password = None
    userinfo, at, hosts = authority.rpartition("@")
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    endpoints: tuple[Endpoint, ...] = ()
    if hosts:
        endpoints = tuple(_endpoint(url, part.strip(), default_port) for part in hosts.split(","))
    try:
        query = tuple(parse_qsl(query_text, keep_blank_values=True, strict_parsing=False))
    except ValueError as exc:
        raise _bad_url(url, f"malformed query: {exc}") from None
    return ParsedURL(scheme, username, password, endpoints, path, query, fragment, url)


def coerce_bool(name: str, text: str) -> bool:
    """``true/yes/on/1`` or ``false/no/off/0`` (any case), else ``InvalidLeaseArgument``."""
    flag = text.strip().lower()
    if flag in _TRUE:
        return True
    if flag in _FALSE:
        return False
    raise InvalidLeaseArgument.for_argument(
        name, f"must be true or false (yes/no, on/off, 1/0), got {text!r}", text
    )


@dataclass(frozen=True, slots=True)
class Option:
    """One option a backend takes, from a URL's query or a keyword argument.

    ``kind`` is ``bool``, ``int``, ``float`` or ``str``; ``minimum``/``maximum`` bound
    numbers (inclusive; ``above`` is an exclusive lower bound); ``nullable`` allows
    ``None`` (``none`` in a URL); ``check`` runs last on the coerced value and returns
    it (or raises :class:`~leasekit.InvalidLeaseArgument`).
    """

    name: str
    kind: type
    default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    nullable: bool = False
    check: Callable[[Any], Any] | None = None

    def from_text(self, text: str) -> Any:
        """Coerce a URL query value the one way every backend does."""
        if self.nullable and text.strip().lower() in _NONE:
            return None
        if self.kind is bool:
            return coerce_bool(self.name, text)
        if self.kind is int:
            if not _INTEGER.fullmatch(text.strip()):
                raise InvalidLeaseArgument.for_argument(
                    self.name, f"must be a whole number, got {text!r}", text
                )
            return int(text)
        if self.kind is float:
            try:
                number = float(text)
            except ValueError:
                raise InvalidLeaseArgument.for_argument(
                    self.name, f"must be a number, got {text!r}", text
                ) from None
            return number
        return text

    def validate(self, value: object) -> Any:
        """Check a value's type and bounds (text from a URL goes through :meth:`from_text`)."""
        if value is None:
            if self.nullable:
                return None
            raise InvalidLeaseArgument.for_argument(self.name, "must not be None", value)
        kind = self.kind
        if kind is bool:
            if not isinstance(value, bool):
                raise InvalidLeaseArgument.for_argument(
                    self.name, f"must be a bool, got {value!r}", value
                )
        elif kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidLeaseArgument.for_argument(
                    self.name, f"must be an int, got {value!r}", value
                )
        elif kind is float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidLeaseArgument.for_argument(
                    self.name, f"must be a number, got {value!r}", value
                )
            if not math.isfinite(value):
                raise InvalidLeaseArgument.for_argument(
                    self.name, f"must be a finite number, got {value!r}", value
                )
            value = float(value)
        elif not isinstance(value, kind):
            raise InvalidLeaseArgument.for_argument(
                self.name, f"must be a {kind.__name__}, got {type(value).__name__}", value
            )
        if isinstance(value, int | float) and not isinstance(value, bool):
            self._check_bounds(value)
        return self.check(value) if self.check is not None else value

    def _check_bounds(self, value: float) -> None:
        low, high, above = self.minimum, self.maximum, self.above
        if (
            (low is not None and value < low)
            or (high is not None and value > high)
            or (above is not None and value <= above)
        ):
            lower = (
                f"> {above:g}" if above is not None else f">= {low:g}" if low is not None else ""
            )
            upper = f"<= {high:g}" if high is not None else ""
            rule = " and ".join(part for part in (lower, upper) if part)
            raise InvalidLeaseArgument.for_argument(
                self.name, f"must be {rule}, got {value!r}", value
            )


def timeout_option(default: float = 5.0) -> Option:
    """The ``timeout_s`` option every backend takes: seconds in (0, 3600]."""
    return Option("timeout_s", float, default, above=0, maximum=3600)


@dataclass(frozen=True, slots=True)
class ParsedOptions:
    """The outcome of :meth:`OptionSet.parse`: leasekit's values and the driver's query."""

    values: dict[str, Any]
    driver: tuple[tuple[str, str], ...]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]


class OptionSet:
    """The options one backend takes, with their defaults, checked the same way everywhere.

    ``driver`` says which other query parameters pass through to the driver: a
    collection of names, or a predicate. Anything else is refused, naming it and the
    known options.
    """

    def __init__(
        self,
        backend: str,
        options: Iterable[Option],
        *,
        driver: Iterable[str] | Callable[[str], bool] = (),
    ) -> None:
        self.backend = backend
        self.options = {option.name: option for option in options}
        if callable(driver):
            self._driver: Callable[[str], bool] = driver
        else:
            names = frozenset(driver)
            self._driver = names.__contains__

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.options)

    def parse(
        self,
        query: Iterable[tuple[str, str]] = (),
        overrides: Mapping[str, object] | None = None,
        *,
        url: str = "",
    ) -> ParsedOptions:
        """Every option's value (defaults filled in) and the driver's query parameters.

        Keyword ``overrides`` win over the query. Raises
        :class:`~leasekit.InvalidLeaseArgument` for an unknown or repeated name, or a
        malformed value, naming it; ``url`` (redacted) is quoted in the message.
        """
        where = f" in {redact_url(url)!r}" if url else ""
        known = ", ".join(self.options)
        from_query: dict[str, Any] = {}
        driver: list[tuple[str, str]] = []
        seen: set[str] = set()
        for name, text in query:
            if name in seen:
                raise InvalidLeaseArgument.for_argument(
                    "url", f"query parameter {name!r} given twice{where}"
                )
            seen.add(name)
            option = self.options.get(name)
            if option is not None:
                from_query[name] = option.from_text(text)
            elif self._driver(name):
                driver.append((name, text))
            else:
                raise InvalidLeaseArgument.for_argument(
                    "url",
                    f"unknown query parameter {name!r}{where}; {self.backend}'s options are "
                    f"{known}",
                )
        given = dict(overrides or {})
        unknown = sorted(set(given) - set(self.options))
        if unknown:
            raise InvalidLeaseArgument.for_argument(
                "options",
                f"unknown {self.backend} option(s) {', '.join(unknown)}; known: {known}",
            )
        merged = {**from_query, **given}
        values = {
            name: option.validate(merged[name]) if name in merged else option.default
            for name, option in self.options.items()
        }
        return ParsedOptions(values, tuple(driver))
