"""The etcd backend's options, capabilities and error table, shared by both providers.

``url_settings`` reads an ``etcd://`` URL and ``from_url``'s keyword options;
:func:`check_settings` checks a provider's constructor arguments into one frozen
:class:`EtcdSettings`, which the async and the blocking provider both build from, so
neither repeats a check. The error table refines gRPC's one error class by its status
code (:class:`EtcdErrorMap`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
)
from leasekit.backend import Endpoint, ErrorMap, Option, OptionSet, parse_url, timeout_option

from . import _rpc
from ._members import (
    Credentials,
    Member,
    Members,
    OpenChannel,
    TlsFiles,
    describe,
    failed_to_connect,
    status,
)

__all__ = [
    "BACKEND",
    "CAPABILITIES",
    "ERRORS",
    "FORKED_AFTER_GRPC",
    "LIMIT",
    "OPTIONS",
    "EtcdErrorMap",
    "EtcdSettings",
    "EtcdURLSettings",
    "check_settings",
    "read_pem",
    "url_settings",
]

BACKEND = "etcd"
SCHEMES = ("etcd", "etcds")
DEFAULT_PORT = 2379
DEFAULT_PREFIX = "leasekit/"
_MAX_PREFIX_BYTES = 256
# etcd's default minimum lease TTL: 1.5 election timeouts (1 s by default), rounded up
# to whole seconds. A grant of 1 s comes back as 2 s.
DEFAULT_MIN_TTL_S = 2

CAPABILITIES = Capabilities(
    atomic_transfer=True,
    fencing=True,
    ttl_resolution_ms=1000,
    min_ttl_ms=DEFAULT_MIN_TTL_S * 1000,
    server_clock=True,
    shared_across_processes=True,
    shared_across_hosts=True,
    persistent=True,
    # A watch on the key's records, all on one watch stream (_notify): its deletes are
    # releases, transfers and expiries, its creations grants and transfers.
    release_notifications=True,
    grant_notifications=True,
    # In the record's value, after the owner (_keys.record_value).
    metadata=True,
    # Slots under a range of their own, each on its own etcd lease; a grant is a read
    # and a transaction that compares the key's generation (_slots).
    slots=True,
    # A line of places under a range of their own, in create_revision order (_fair).
    fair_waiting=True,
)


def _valid_prefix(prefix: str) -> str:
    try:
        raw = prefix.encode()
    except UnicodeEncodeError:
        raise InvalidLeaseArgument.for_argument(
            "prefix", "must be encodable as UTF-8", prefix
        ) from None
    if not 1 <= len(raw) <= _MAX_PREFIX_BYTES:
        raise InvalidLeaseArgument.for_argument(
            "prefix", f"must be 1 to {_MAX_PREFIX_BYTES} UTF-8 bytes, got {len(raw)}", prefix
        )
    return prefix


_TLS_FILES = ("ca_file", "cert_file", "key_file")
OPTIONS = OptionSet(
    "etcd",
    [
        Option("prefix", str, DEFAULT_PREFIX, check=_valid_prefix),
        timeout_option(5.0),
        Option("connect_timeout_s", float, 1.0, above=0, maximum=3600),
        Option("username", str),
        Option("password", str),
        Option("reuse_leases", bool, True),
        *(Option(name, str) for name in _TLS_FILES),
    ],
)
LIMIT = Option("limit", int, 1000, minimum=1)

#: Why a provider refuses to work in a process forked after gRPC started in it.
FORKED_AFTER_GRPC = (
    "etcd: this provider was made in a process that has since forked, and gRPC "
    "cannot work in a forked child once it has started; build the etcd provider "
    "in each child, after the fork (gunicorn: in post_fork or at first request), "
    "and use no etcd client in the parent before forking"
)


@dataclass(frozen=True, slots=True)
class EtcdURLSettings:
    """An ``etcd://`` URL and ``from_url``'s keyword options, parsed and checked.

    ``options`` holds the provider's options, defaults filled in (``prefix``,
    ``timeout_s``, ``connect_timeout_s``, and ``username``/``password``, the URL's
    unless given); ``tls_files`` the PEM paths of ``etcds://`` (not read here). The
    benchmark's floor and peer (``leasekit_etcd._bench``) connect from the same
    settings as the provider.
    """

    endpoints: tuple[Endpoint, ...]
    tls: bool
    options: dict[str, Any]
    tls_files: dict[str, str | None]

    def provider_arguments(self) -> dict[str, Any]:
        """The keyword arguments of a provider's constructor (PEM files read now)."""
        pem = {
            name: None if path is None else read_pem(name, path)
            for name, path in self.tls_files.items()
        }
        return {
            "endpoints": [str(endpoint) for endpoint in self.endpoints],
            "tls": self.tls,
            "ca": pem["ca_file"],
            "cert": pem["cert_file"],
            "key": pem["key_file"],
            **self.options,
        }


def url_settings(url: str, **options: Any) -> EtcdURLSettings:
    """Parse ``url`` and ``options`` as :meth:`EtcdLeaseProvider.from_url` does; no I/O.

    Raises :class:`~leasekit.InvalidLeaseArgument` for anything ``from_url`` refuses.
    """
    parsed = parse_url(url, schemes=SCHEMES, default_port=DEFAULT_PORT)
    if parsed.path not in ("", "/") or parsed.fragment:
        raise InvalidLeaseArgument.for_argument(
            "url",
            f"must be etcd://host:port[,host:port...] with no path, got {parsed.redacted!r}",
        )
    if not parsed.endpoints:
        raise InvalidLeaseArgument.for_argument(
            "url", f"must name at least one host[:port], got {parsed.redacted!r}"
        )
    values = OPTIONS.parse(parsed.query, options, url=url).values
    given = {name for name, _ in parsed.query} | set(options)
    if "username" not in given:
        values["username"] = parsed.username
    if "password" not in given:
        values["password"] = parsed.password
    tls = parsed.scheme == "etcds"
    tls_files: dict[str, str | None] = {name: values.pop(name) for name in _TLS_FILES}
    for name, path in tls_files.items():
        if path is not None and not tls:
            raise InvalidLeaseArgument.for_argument(name, "is a TLS setting: use etcds://")
    return EtcdURLSettings(tuple(parsed.endpoints), tls, values, tls_files)


@dataclass(frozen=True, slots=True)
class EtcdSettings:
    """A provider's constructor arguments, checked: what both providers are built from.

    ``endpoints`` is empty for a provider on a caller's ``aetcd.Client``.
    """

    endpoints: tuple[str, ...]
    prefix: str
    timeout_s: float
    connect_timeout_s: float
    credentials: Credentials | None
    reuse_leases: bool
    tls: TlsFiles | None

    @property
    def prefix_bytes(self) -> bytes:
        return self.prefix.encode()

    def members(self, open_channel: OpenChannel) -> Members:
        """The endpoints as members, each opening its channel with ``open_channel``."""
        return Members(
            [
                Member(
                    address, tls=self.tls, credentials=self.credentials, open_channel=open_channel
                )
                for address in self.endpoints
            ],
            connect_timeout_s=self.connect_timeout_s,
        )


_TLS_ARGUMENTS: dict[str, Any] = {"tls": False, "ca": None, "cert": None, "key": None}


def check_settings(
    client: object, endpoints: Sequence[str] | None, **arguments: Any
) -> EtcdSettings:
    """Check a provider's constructor arguments (no I/O): those of
    :class:`~leasekit_etcd.EtcdLeaseProvider`, whose docstring says what each means,
    with its defaults for those left out; ``client`` is a caller's aetcd.Client, given
    instead of ``endpoints``."""
    given = {**{name: o.default for name, o in OPTIONS.options.items()}, **_TLS_ARGUMENTS}
    unknown = sorted(set(arguments) - (set(given) - set(_TLS_FILES)))  # paths: from_url
    if unknown:
        raise InvalidLeaseArgument.for_argument(unknown[0], "is not an option of etcd providers")
    given.update(arguments)
    tls, ca, cert, key = (given[name] for name in _TLS_ARGUMENTS)
    if (client is None) == (endpoints is None):
        raise InvalidLeaseArgument.for_argument(
            "client", "give either an aetcd.Client or endpoints=[...], not both or neither"
        )
    if client is not None and not _is_aetcd_client(client):
        raise InvalidLeaseArgument.for_argument(
            "client",
            f"must be an aetcd.Client, got {type(client).__module__}.{type(client).__qualname__}",
        )
    option = OPTIONS.options
    checked_prefix = option["prefix"].validate(given["prefix"])
    checked_timeout_s = option["timeout_s"].validate(given["timeout_s"])
    checked_connect_s = option["connect_timeout_s"].validate(given["connect_timeout_s"])
    credentials = _check_credentials(given["username"], given["password"])
    if not tls and (ca or cert or key):
        raise InvalidLeaseArgument.for_argument("tls", "ca, cert and key need tls=True (etcds://)")
    if (cert is None) != (key is None):
        raise InvalidLeaseArgument.for_argument(
            "cert", "a client certificate needs its key, and back"
        )
    addresses = () if endpoints is None else tuple(map(_check_endpoint, _check_list(endpoints)))
    return EtcdSettings(
        endpoints=addresses,
        prefix=checked_prefix,
        timeout_s=checked_timeout_s,
        connect_timeout_s=checked_connect_s,
        credentials=credentials,
        reuse_leases=option["reuse_leases"].validate(given["reuse_leases"]),
        tls=TlsFiles(ca, cert, key) if tls else None,
    )


def _is_aetcd_client(client: object) -> bool:
    cls = type(client)
    return cls.__module__.startswith("aetcd") and all(
        hasattr(client, name) for name in ("connect", "channel", "metadata")
    )


def read_pem(name: str, path: object) -> bytes:
    """The contents of the PEM file ``path`` (option ``name``), or InvalidLeaseArgument."""
    if not isinstance(path, str) or not path:
        raise InvalidLeaseArgument.for_argument(name, f"must be a file path, got {path!r}")
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise InvalidLeaseArgument.for_argument(
            name, f"cannot read {path!r}: {exc.strerror}"
        ) from None


def _check_list(endpoints: object) -> list[str]:
    if isinstance(endpoints, str) or not isinstance(endpoints, Sequence):
        raise InvalidLeaseArgument.for_argument(
            "endpoints", f"must be a list of 'host:port' strings, got {endpoints!r}"
        )
    if not endpoints:
        raise InvalidLeaseArgument.for_argument("endpoints", "must name at least one host:port")
    return list(endpoints)


def _check_endpoint(endpoint: object) -> str:
    """``host:port`` as the URL parser reads it (IPv6 in brackets, port 2379 by default)."""
    if not isinstance(endpoint, str) or not endpoint or any(c in endpoint for c in "/?#@, "):
        raise InvalidLeaseArgument.for_argument(
            "endpoints", f"each must be 'host:port', got {endpoint!r}"
        )
    try:
        parsed = parse_url(f"etcd://{endpoint}", schemes=("etcd",), default_port=DEFAULT_PORT)
    except InvalidLeaseArgument as exc:
        raise InvalidLeaseArgument.for_argument("endpoints", f"{exc} ({endpoint!r})") from None
    return str(parsed.endpoints[0])


def _check_credentials(username: object, password: object) -> Credentials | None:
    if username is None and password is None:
        return None
    if not isinstance(username, str) or not username:
        raise InvalidLeaseArgument.for_argument("username", "a password needs a non-empty username")
    if not isinstance(password, str):
        raise InvalidLeaseArgument.for_argument("password", "a username needs a password (a str)")
    return Credentials(username, password)


# -- errors ---------------------------------------------------------------------------------

_UNREACHABLE_CODES = ("UNAUTHENTICATED", "PERMISSION_DENIED")
# etcd answers a wrong user or password, and a call without one while authentication
# is on, with INVALID_ARGUMENT and these words.
_AUTH_FAILED = ("authentication failed", "user name is empty")


class EtcdErrorMap(ErrorMap):
    """gRPC's and aetcd's errors as leasekit's, by gRPC status code where a class says too
    little.

    Every failed etcd call is one class, ``grpc.RpcError`` (``grpc.aio.AioRpcError`` on
    asyncio); what went wrong is its status code:

    - ``DEADLINE_EXCEEDED``: :class:`~leasekit.LeaseBackendTimeout` (no answer in time).
    - ``UNAVAILABLE`` with no connection made (refused, unresolvable, TLS handshake),
      ``UNAUTHENTICATED``, ``PERMISSION_DENIED``, and a failed ``Authenticate``:
      :class:`~leasekit.LeaseBackendUnreachable`.
    - anything else, a connection lost mid-call included (a write's outcome is then
      unknown): :class:`~leasekit.LeaseBackendError`.

    The message is the status code and etcd's own first line, never gRPC's multi-line
    dump.
    """

    __slots__ = ()

    def classify(self, exc: BaseException) -> type[LeaseBackendError]:
        if isinstance(exc, _rpc.RpcError):
            code, details = status(exc)
            name = getattr(code, "name", "")
            if name == "DEADLINE_EXCEEDED":
                return LeaseBackendTimeout
            if (
                name in _UNREACHABLE_CODES
                or any(words in details for words in _AUTH_FAILED)
                or failed_to_connect(exc)
            ):
                return LeaseBackendUnreachable
            return LeaseBackendError
        return super().classify(exc)

    def translate(
        self, exc: BaseException, *, key: str | None = None, where: str = ""
    ) -> LeaseBackendError:
        if isinstance(exc, _rpc.RpcError):
            detail = describe(exc)
            # ``where`` names the member that failed last and how: this very failure,
            # as a rule, which need not be said twice.
            repeated = f": {detail})"
            if where.endswith(repeated):
                where = f"{where[: -len(repeated)]})"
            return self.classify(exc)(f"{detail}{where}", backend=self.backend, key=key)
        return super().translate(exc, key=key, where=where)


ERRORS = EtcdErrorMap(
    {
        _rpc.RpcError: LeaseBackendError,  # refined by status code above
        _rpc.AetcdConnectionTimeout: LeaseBackendTimeout,
        _rpc.AetcdConnectionFailed: LeaseBackendUnreachable,
        _rpc.AetcdUnauthenticated: LeaseBackendUnreachable,
        _rpc.AetcdClientError: LeaseBackendError,
    },
    backend=BACKEND,
)
