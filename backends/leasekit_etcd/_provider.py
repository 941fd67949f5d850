"""``EtcdLeaseProvider``: leases as etcd keys bound to etcd leases, decided by transactions.

Each lease is one record bound to an etcd lease of its own (``_txn`` has the layout and
the transactions, ``_operation`` each operation's round trips). Expiry is etcd's: the
leader revokes the etcd lease when its TTL runs out and deletes the record in the same
step.

No etcd lease is left behind. Every etcd lease the provider grants ends up bound to a
record whose operation returned to its caller, or revoked. An operation waits only for
the round trips that decide its answer: an etcd lease that a transaction has just
detached from its record or never bound, or that an operation failing midway may have
left (a release whose outcome is lost: the lease it bound the record to,
``_pool.Bindings``), is revoked in the background (:meth:`BackendProvider._spawn
<leasekit.backend.BackendProvider._spawn>`), which :meth:`flush` waits for and
``aclose`` drains within ``timeout_s``. A revocation that cannot reach the server in
time, or a reply that never came back, leaves a lease that ends on its own at its
granted TTL; nothing keeps such a lease alive. ``aclose`` lets operations in flight finish
first, so a record an acquire created is always one its caller was told about.
``docs/backends/etcd.md`` has the round trips per operation and the argument for each
choice.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseResult,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)
from leasekit.backend import (
    BackendProvider,
    Endpoint,
    ErrorMap,
    LeaseRecord,
    Option,
    OptionSet,
    ReleaseWatch,
    parse_url,
    timeout_option,
)

from . import _rpc
from ._errors import ERRORS
from ._keys import holder_range
from ._members import SETTLE_S, Credentials, Member, Members, TlsFiles
from ._notify import EtcdReleaseListener
from ._operation import Operation
from ._pool import Bindings, LeasePool

__all__ = ["EtcdLeaseProvider", "EtcdURLSettings", "url_settings"]

_T = TypeVar("_T")
_SCHEMES = ("etcd", "etcds")
_DEFAULT_PORT = 2379
_DEFAULT_PREFIX = "leasekit/"
_MAX_PREFIX_BYTES = 256
_SEEN_HELD_KEYS = 4096
# etcd's default minimum lease TTL: 1.5 election timeouts (1 s by default), rounded up
# to whole seconds. A grant of 1 s comes back as 2 s.
_DEFAULT_MIN_TTL_S = 2


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
        Option("prefix", str, _DEFAULT_PREFIX, check=_valid_prefix),
        timeout_option(5.0),
        Option("connect_timeout_s", float, 1.0, above=0, maximum=3600),
        Option("username", str),
        Option("password", str),
        Option("reuse_leases", bool, True),
        *(Option(name, str) for name in _TLS_FILES),
    ],
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


def url_settings(url: str, **options: Any) -> EtcdURLSettings:
    """Parse ``url`` and ``options`` as :meth:`EtcdLeaseProvider.from_url` does; no I/O.

    Raises :class:`~leasekit.InvalidLeaseArgument` for anything ``from_url`` refuses.
    """
    parsed = parse_url(url, schemes=_SCHEMES, default_port=_DEFAULT_PORT)
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


_LIMIT = Option("limit", int, 1000, minimum=1)


class EtcdLeaseProvider(BackendProvider):
    """Leases in etcd: transactions on the raft log, etcd-lease TTLs, fencing tokens.

    Use :meth:`from_url` / ``leasekit.connect("etcd://host:port,host:port")`` (the
    provider opens one gRPC channel per endpoint and closes them in ``aclose``), or
    pass endpoints (``["10.0.0.1:2379", ...]``) or your own connected-or-not
    ``aetcd.Client`` (used through its channel, never closed by the provider; one
    endpoint, so no failover).

    - ``prefix`` (default ``"leasekit/"``) starts every etcd key the provider writes.
    - ``timeout_s`` (default 5) bounds every operation end to end, all its round trips
      and any failover included: a stalled cluster raises
      :class:`~leasekit.LeaseBackendTimeout`, never hangs; a cluster whose every
      member refuses connections raises :class:`~leasekit.LeaseBackendUnreachable`
      at once.
    - ``connect_timeout_s`` (default 1): with several endpoints, how long to wait for a
      member's connection before trying the next.
    - ``username``/``password`` for etcd's authentication; ``tls`` with ``ca``,
      ``cert``, ``key`` (PEM bytes) for ``etcds://``.
    - ``reuse_leases`` (default True): for TTLs of 10 s and more, bind the etcd leases
      this provider's operations left empty again, granted one second longer than the
      TTL for that, so that a free key costs one transaction; False (and any shorter
      TTL) grants a lease of exactly the TTL (rounded up) per acquire and revokes each
      when it is left empty.

    TTLs are whole seconds (rounded up) and at least the server's minimum (2 s with
    etcd's default election timeout). See ``docs/backends/etcd.md``.
    """

    backend: ClassVar[str] = "etcd"
    errors: ClassVar[ErrorMap] = ERRORS
    capabilities: Capabilities = Capabilities(
        atomic_transfer=True,
        fencing=True,
        ttl_resolution_ms=1000,
        min_ttl_ms=_DEFAULT_MIN_TTL_S * 1000,
        server_clock=True,
        shared_across_processes=True,
        shared_across_hosts=True,
        persistent=True,
        # A delete watch on the key's records, all on one watch stream (_notify).
        release_notifications=True,
    )

    def __init__(
        self,
        client: Any = None,
        *,
        endpoints: Sequence[str] | None = None,
        prefix: str = _DEFAULT_PREFIX,
        timeout_s: float = 5.0,
        connect_timeout_s: float = 1.0,
        username: str | None = None,
        password: str | None = None,
        reuse_leases: bool = True,
        tls: bool = False,
        ca: bytes | None = None,
        cert: bytes | None = None,
        key: bytes | None = None,
    ) -> None:
        if (client is None) == (endpoints is None):
            raise InvalidLeaseArgument.for_argument(
                "client", "give either an aetcd.Client or endpoints=[...], not both or neither"
            )
        if client is not None and not _is_aetcd_client(client):
            raise InvalidLeaseArgument.for_argument(
                "client",
                "must be an aetcd.Client, got "
                f"{type(client).__module__}.{type(client).__qualname__}",
            )
        settings = OPTIONS.options
        self.prefix: str = settings["prefix"].validate(prefix)
        self._prefix = self.prefix.encode()
        super().__init__(
            timeout_s=settings["timeout_s"].validate(timeout_s), owns_client=client is None
        )
        self.connect_timeout_s: float = settings["connect_timeout_s"].validate(connect_timeout_s)
        credentials = _check_credentials(username, password)
        if not tls and (ca or cert or key):
            raise InvalidLeaseArgument.for_argument(
                "tls", "ca, cert and key need tls=True (etcds://)"
            )
        if (cert is None) != (key is None):
            raise InvalidLeaseArgument.for_argument(
                "cert", "a client certificate needs its key, and back"
            )
        self._client = client
        if endpoints is not None:
            addresses = [_check_endpoint(e) for e in _check_endpoints(endpoints)]
            files = TlsFiles(ca, cert, key) if tls else None
            self.endpoints = tuple(addresses)
            self._members: Members | None = Members(
                [Member(a, tls=files, credentials=credentials) for a in addresses],
                connect_timeout_s=self.connect_timeout_s,
            )
        else:
            self.endpoints = (f"{client._host}:{client._port}",)
            self._members = None
        self._min_ttl_s = _DEFAULT_MIN_TTL_S
        self._seen_held = _RecentKeys(_SEEN_HELD_KEYS)
        reuse = settings["reuse_leases"].validate(reuse_leases)
        self._pool = LeasePool(self._revoke_later, enabled=reuse)
        self._bindings = Bindings()
        self._channels_closed = False
        self._watcher: Any = None
        self._listener = self._release_listener = EtcdReleaseListener(
            self._release_watcher, timeout_s=self.timeout_s, lost=self._forget_watcher
        )

    @classmethod
    def from_url(cls, url: str, **options: Any) -> EtcdLeaseProvider:
        """Build a provider from ``etcd://[user:password@]host:port[,host:port...]``.

        Hosts are names, IPv4 or bracketed IPv6 addresses (``[::1]:2379``), the port
        2379 if left out. ``etcds://`` uses TLS, with ``ca_file``, ``cert_file`` and
        ``key_file`` (PEM paths, read now) for a private CA and a client certificate.
        Other options (``prefix``, ``timeout_s``, ``connect_timeout_s``, and
        ``username``/``password`` instead of the URL's) come from the query or from
        keyword arguments, which win. Anything else is an
        :class:`~leasekit.InvalidLeaseArgument`. No network I/O.
        """
        settings = url_settings(url, **options)
        pem = {
            name: None if path is None else _read_pem(name, path)
            for name, path in settings.tls_files.items()
        }
        return cls(
            endpoints=[str(endpoint) for endpoint in settings.endpoints],
            tls=settings.tls,
            ca=pem["ca_file"],
            cert=pem["cert_file"],
            key=pem["key_file"],
            **settings.options,
        )

    # -- one operation: its deadline, its round trips, its errors ---------------------

    def _after_fork_in_child(self) -> None:
        """In a forked child: refuse every call, with the reason, instead of crashing.

        gRPC cannot run in a process forked after it started (its C core's threads and
        pollers are not in the child, and grpc.aio has no fork support: a call aborts
        the process or never answers), whether on the parent's channel or a new one.
        An etcd provider is built and first used after the fork, in each child.
        """
        if not self._closing and self._loop is not None:  # used, so gRPC has started
            self._closing = True
            self._closed_reason = (
                "etcd: this provider was made in a process that has since forked, and gRPC "
                "cannot work in a forked child once it has started; build the etcd provider "
                "in each child, after the fork (gunicorn: in post_fork or at first request), "
                "and use no etcd client in the parent before forking"
            )

    async def _run(
        self,
        key: str | None,
        work: Callable[[Operation], Awaitable[_T]],
        grant: str | None = None,
    ) -> _T:
        """Run one operation within ``timeout_s``, its errors mapped at one boundary."""
        if grant is not None and key is not None and self._undos:
            await self._after_undo(key, grant)
        return await self._call(self._operate(work), key, grant)

    async def _operate(self, work: Callable[[Operation], Awaitable[_T]]) -> _T:
        members = self._members if self._members is not None else await self._adopt_client()
        loop = asyncio.get_running_loop()
        return await work(Operation(self, members, loop.time() + self.timeout_s))

    async def _adopt_client(self) -> Members:
        """A caller's aetcd.Client: its channel (and auth token) once it is connected."""
        client = self._client
        await client.connect()
        member = Member(
            self.endpoints[0],
            tls=None,
            credentials=None,
            channel=client.channel,
            metadata=tuple(client.metadata or ()),
        )
        self._members = Members([member], connect_timeout_s=self.connect_timeout_s)
        return self._members

    async def _connect(self) -> None:
        # One read now, so a wrong address, TLS setting or password shows up here. A
        # failed check closes the provider before `async with` raises, and closing gives
        # gRPC SETTLE_S after the call it cut off: the check ends that much before
        # timeout_s, so that `async with`, close included, ends by timeout_s.
        members = self._members if self._members is not None else await self._adopt_client()
        budget_s = max(self.timeout_s - SETTLE_S, self.timeout_s / 2)
        try:
            await Operation(self, members, asyncio.get_running_loop().time() + budget_s).ping()
        except TimeoutError:  # the check's own deadline ran out between attempts
            raise self._timeout(None) from None

    def _housekeep_before_close(self) -> None:
        self._revoke_idle()

    def _revoke_idle(self) -> None:
        for lease in self._pool.take_all_idle():
            self._revoke_later(lease)

    async def _close_client(self) -> None:
        self._channels_closed = True
        if self._members is not None:
            await self._members.close()

    def _describe(self) -> str:
        return f"etcd {', '.join(self.endpoints)}, prefix={self.prefix!r}"

    def _where(self) -> str:
        members = self._members
        failure = members.last_failure if members is not None else None
        return f" (etcd {failure or ', '.join(self.endpoints)})"

    def _granted_ttl_s(self, ttl_s: int) -> int:
        """The TTL etcd grants for a request of ``ttl_s``: never below its minimum."""
        return max(ttl_s, self._min_ttl_s)

    def _learn_min_ttl(self, requested_s: int, granted_s: int) -> None:
        # etcd raises a short TTL to its minimum (1.5 election timeouts) and says so in
        # the grant; remembering it tells whether a keep-alive gives the TTL asked for.
        if granted_s > requested_s or granted_s == requested_s < self._min_ttl_s:
            self._min_ttl_s = granted_s

    def _revoke_later(self, lease_id: int) -> None:
        """Revoke an etcd lease in the background; the caller does not wait for it.

        Either a lease that no record is bound to (one a transaction has just
        detached or never bound), or one that a failed operation may have left.
        ``aclose`` drains these, so a closing provider still revokes what its last
        operations left.
        """
        self._pool.forget(lease_id)
        self._bindings.drop_lease(lease_id)
        members = self._members
        if members is None or self._channels_closed:
            return  # nothing left to send it on: the empty lease ends at its TTL

        async def revoke() -> None:
            loop = asyncio.get_running_loop()
            operation = Operation(self, members, loop.time() + self.timeout_s)
            # If the store is failing, the lease expires with its TTL anyway.
            with contextlib.suppress(LeaseBackendError, *self.errors.types):
                await operation.revoke(lease_id)

        self._spawn(revoke())

    # -- the contract -------------------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        return await self._run(key, lambda op: op.acquire(key, owner, _ttl_s(ttl_ms)), owner)

    async def get_lease_owner(self, key: str) -> str | None:
        validate_key(key)
        return await self._run(key, lambda op: op.owner(key))

    async def release_lease(self, key: str, owner: str) -> None:
        validate_key(key)
        validate_owner(owner)
        await self._run(key, lambda op: op.release(key, owner))

    async def release_grant(self, key: str, owner: str, token: int) -> None:
        """Release ``key`` if ``owner`` holds it with ``token`` (``SupportsReleaseGrant``).

        One transaction comparing the record's value and its ``create_revision`` (the
        token), then deleting it.
        """
        validate_key(key)
        validate_owner(owner)
        await self._run(key, lambda op: op.release_grant(key, owner, token))

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        return await self._run(key, lambda op: op.renew(key, owner, _ttl_s(ttl_ms)))

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        ttl_s = _ttl_s(ttl_ms)
        if from_owner == to_owner:
            return await self._run(key, lambda op: op.renew(key, from_owner, ttl_s))
        return await self._run(
            key, lambda op: op.transfer(key, from_owner, to_owner, ttl_s), to_owner
        )

    # -- beyond the contract ------------------------------------------------------------

    async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """List live leases in key order, optionally only keys starting with ``prefix``.

        One range read per batch of records, then one ``LeaseTimeToLive`` per lease for
        the remaining time (whole seconds, as etcd reports it). The whole listing is
        bounded by ``timeout_s``. Not a snapshot: leases that change meanwhile may or
        may not be listed.
        """
        if prefix is not None:
            validate_key(prefix, "prefix")
        limit = _LIMIT.validate(limit)
        return await self._run(prefix, lambda op: op.inspect(prefix, limit))

    async def watch_release(self, key: str) -> ReleaseWatch:
        """Watch ``key`` for release, transfer and expiry: a delete watch on its records."""
        validate_key(key)
        start, end = holder_range(self._prefix, key)
        self._refuse_if_closed()
        return await self._call(self._listener.watch(key, start, end), key)

    async def _release_watcher(self) -> Any:
        """The watch stream's ``Watcher``, on the member operations are pinned to now."""
        if self._watcher is None:
            members = self._members if self._members is not None else await self._adopt_client()
            member = members.pinned
            if member.needs_token:
                await member.authenticate(self.timeout_s)
            self._watcher = _rpc.release_watcher(member.stubs, member.metadata)
            members.streams_opened = True
        return self._watcher

    def _forget_watcher(self) -> None:
        """A watch failed: the next wait starts a stream on whichever member is pinned."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None and not self.closed:
            self._spawn(watcher.shutdown())

    async def break_notifications(self) -> None:
        """Cut the watch stream, as a failed member would (for tests)."""
        watcher = self._watcher
        if watcher is not None:
            await watcher._terminate_stream(ConnectionError("watch stream cut"))

    async def lease_ids(self) -> list[int]:
        """Every etcd lease in the cluster (``LeaseLeases``), not only this provider's.

        For tests and diagnostics: leasekit leaves no etcd lease behind, so on an
        otherwise idle cluster this returns to what it was after any number of
        operations. It first waits for this provider's background revocations
        (:meth:`flush`), so that the list is settled.
        """
        await self.flush()
        return await self._run(None, lambda op: op.lease_ids())

    async def flush(self) -> None:
        """Wait for the etcd leases this provider is revoking in the background.

        Release, transfer, a denied acquire and a move to a new TTL return once their
        transaction has decided; the etcd lease they left without a record is revoked
        right after, off the caller's path. This waits until those revocations have
        finished (each is bounded; one that fails leaves its empty etcd lease to end
        at its TTL). The idle etcd leases kept for reuse are revoked first, so after a
        flush every etcd lease this provider granted carries a record. Never raises for
        them.
        """
        self._revoke_idle()
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


class _RecentKeys:
    """The last ``size`` keys this provider saw held (by anyone), oldest forgotten first.

    Only a hint for how to acquire (look first, or grant first): a stale entry costs a
    round trip, never a wrong answer.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._keys: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def add(self, key: str) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        if len(self._keys) > self._size:
            self._keys.popitem(last=False)

    def discard(self, key: str) -> None:
        self._keys.pop(key, None)


def _ttl_s(ttl_ms: int) -> int:
    """Whole seconds, rounded up: etcd lease TTLs are seconds."""
    return math.ceil(ttl_ms / 1000)


def _is_aetcd_client(client: object) -> bool:
    cls = type(client)
    return cls.__module__.startswith("aetcd") and all(
        hasattr(client, name) for name in ("connect", "channel", "metadata")
    )


def _read_pem(name: str, path: object) -> bytes:
    if not isinstance(path, str) or not path:
        raise InvalidLeaseArgument.for_argument(name, f"must be a file path, got {path!r}")
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise InvalidLeaseArgument.for_argument(
            name, f"cannot read {path!r}: {exc.strerror}"
        ) from None


def _check_endpoints(endpoints: object) -> list[str]:
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
        parsed = parse_url(f"etcd://{endpoint}", schemes=("etcd",), default_port=_DEFAULT_PORT)
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
