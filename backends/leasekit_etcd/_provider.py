"""``EtcdLeaseProvider``: leases as etcd keys bound to etcd leases, decided by transactions.

Each lease is one record bound to an etcd lease of its own (``_txn`` has the layout and
the transactions). Expiry is etcd's: the leader revokes the etcd lease when its TTL
runs out and deletes the record in the same step.

No etcd lease is left behind. Every etcd lease the provider grants ends up bound to a
record or revoked. An operation waits only for the round trips that decide its
answer: the etcd lease a transaction has just detached from its record (release,
transfer, a move to a new TTL) or never bound (a denied acquire) is revoked in the
background right after, and so is one that an operation failing midway may have left.
Such a lease carries no record and never will (only a lease just granted is ever bound
to one), so revoking it changes nothing but the lease count; :meth:`flush` waits for
these revocations and :meth:`aclose` does too.

Round trips per operation that the caller waits for (RT; *w* = a write through the
raft log), then what follows in the background (bg):

- acquire of a free key: grant (w), transaction (w): 2 RT.
- acquire of a held key: the first time, grant (w), transaction (w, denied: it
  returns the holder): 2 RT, + revoke (w, bg). The provider then remembers the key
  as held (the last 4096 such keys), and later acquires of it look first: one
  linearizable read, 1 RT and no write while it stays held; 3 RT (read, grant,
  transaction) once it is free again.
- re-acquire by the holder, same TTL: read, keep-alive: 2 RT, no write.
- renew, same TTL: read, keep-alive: 2 RT, no write.
- renew or re-acquire with a different TTL: + grant, transaction (2 w), + revoke
  (w, bg).
- release: transaction (w): 1 RT, + revoke (w, bg); by a non-holder 1 RT.
- transfer: grant (w), transaction (w): 2 RT, + revoke (w, bg).
- get_lease_owner: one linearizable read: 1 RT.

Release does not revoke the holder's etcd lease *instead* of running its transaction
(which would save a write: revoking deletes the record bound to the lease), because
a revoke cannot be made conditional and its reply does not say whether it deleted
anything. Another provider using the same owner may have moved the record onto a new
etcd lease and not yet revoked the old one (a window of one round trip, or up to a
TTL if that revoke failed); revoking the old lease then succeeds, deletes nothing,
and would report a release that left the key held. ``docs/backends/etcd.md`` has the
whole argument.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

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

from . import _keys, _rpc, _txn
from ._members import Credentials, Member, Members, TlsFiles, describe

__all__ = ["EtcdLeaseProvider", "LeaseRecord"]

_T = TypeVar("_T")
_BACKEND = "etcd"
_SCHEMES = ("etcd", "etcds")
_DEFAULT_PORT = 2379
_DEFAULT_PREFIX = "leasekit/"
_DEFAULT_TIMEOUT_S = 5.0
_DEFAULT_CONNECT_TIMEOUT_S = 1.0
_MAX_PREFIX_BYTES = 256
_OPTIONS = (
    "prefix",
    "timeout_s",
    "connect_timeout_s",
    "username",
    "password",
    "ca_file",
    "cert_file",
    "key_file",
)
_TLS_OPTIONS = ("ca_file", "cert_file", "key_file")
_INSPECT_BATCH = 256
_INSPECT_PARALLEL = 32
_CLEANUP_TIMEOUT_S = 5.0
_SEEN_HELD_KEYS = 4096
# etcd's default minimum lease TTL: 1.5 election timeouts (1 s by default), rounded up
# to whole seconds. A grant of 1 s comes back as 2 s.
_DEFAULT_MIN_TTL_S = 2


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One live lease, as ``inspect`` reports it (``remaining_ms`` in whole seconds)."""

    key: str
    owner: str
    token: int
    remaining_ms: int


class EtcdLeaseProvider:
    """Leases in etcd: transactions on the raft log, etcd-lease TTLs, fencing tokens.

    Use :meth:`from_url` / ``leasekit.connect("etcd://host:port,host:port")`` (the
    provider opens one gRPC channel per endpoint and closes them in :meth:`aclose`),
    or pass endpoints (``["10.0.0.1:2379", ...]``) or your own connected-or-not
    ``aetcd.Client`` (used through its channel, never closed by the provider; one
    endpoint, so no failover).

    - ``prefix`` (default ``"leasekit/"``) starts every etcd key the provider writes.
    - ``timeout_s`` (default 5) bounds every operation end to end, all its round trips
      and any failover included: a stalled cluster raises
      :class:`~leasekit.LeaseBackendError`, never hangs.
    - ``connect_timeout_s`` (default 1): with several endpoints, how long to wait for a
      member's connection before trying the next.
    - ``username``/``password`` for etcd's authentication; ``tls`` with ``ca``,
      ``cert``, ``key`` (PEM bytes) for ``etcds://``.

    TTLs are whole seconds (rounded up) and at least the server's minimum (2 s with
    etcd's default election timeout). See ``docs/backends/etcd.md``.
    """

    capabilities = Capabilities(
        atomic_transfer=True,
        fencing=True,
        ttl_resolution_ms=1000,
        min_ttl_ms=_DEFAULT_MIN_TTL_S * 1000,
        server_clock=True,
        shared_across_processes=True,
        shared_across_hosts=True,
        persistent=True,
    )

    def __init__(
        self,
        client: Any = None,
        *,
        endpoints: Sequence[str] | None = None,
        prefix: str = _DEFAULT_PREFIX,
        timeout_s: float = _DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = _DEFAULT_CONNECT_TIMEOUT_S,
        username: str | None = None,
        password: str | None = None,
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
        self._prefix = _check_prefix(prefix)
        self.prefix = prefix
        self.timeout_s = _check_timeout("timeout_s", timeout_s)
        self.connect_timeout_s = _check_timeout("connect_timeout_s", connect_timeout_s)
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
        self._cleanups: set[asyncio.Task[None]] = set()
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> EtcdLeaseProvider:
        """Build a provider from ``etcd://[user:password@]host:port[,host:port...]``.

        ``etcds://`` uses TLS, with ``ca_file``, ``cert_file`` and ``key_file`` (PEM
        paths, read now) for a private CA and a client certificate. Other options
        (``prefix``, ``timeout_s``, ``connect_timeout_s``, and ``username``/``password``
        instead of the URL's) come from the query or from keyword arguments, which win.
        Anything else is an :class:`~leasekit.InvalidLeaseArgument`. No network I/O.
        """
        if not isinstance(url, str):
            raise InvalidLeaseArgument.for_argument(
                "url", f"must be a str, got {type(url).__name__}"
            )
        try:
            parts = urlsplit(url)
        except ValueError as exc:
            raise InvalidLeaseArgument.for_argument("url", f"{exc} ({_redact(url)!r})") from None
        scheme = parts.scheme.lower()
        if scheme not in _SCHEMES:
            raise InvalidLeaseArgument.for_argument(
                "url", f"must start with etcd:// or etcds://, got {_redact(url)!r}"
            )
        if parts.path not in ("", "/") or parts.fragment:
            raise InvalidLeaseArgument.for_argument(
                "url",
                f"must be etcd://host:port[,host:port...] with no path, got {_redact(url)!r}",
            )
        merged: dict[str, Any] = {}
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name not in _OPTIONS:
                raise InvalidLeaseArgument.for_argument(
                    "url",
                    f"unknown query parameter {name!r} in {_redact(url)!r}; "
                    f"known: {', '.join(_OPTIONS)}",
                )
            merged[name] = _coerce_option(name, value)
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise InvalidLeaseArgument.for_argument(
                "options",
                f"unknown etcd option(s) {', '.join(unknown)}; known: {', '.join(_OPTIONS)}",
            )
        userinfo, _, hosts = parts.netloc.rpartition("@")
        if userinfo:
            user, has_password, password = userinfo.partition(":")
            merged.setdefault("username", unquote(user))
            if has_password:
                merged.setdefault("password", unquote(password))
        merged.update(options)
        tls = scheme == "etcds"
        pem: dict[str, bytes | None] = {}
        for name in _TLS_OPTIONS:
            path = merged.pop(name, None)
            if path is not None and not tls:
                raise InvalidLeaseArgument.for_argument(name, "is a TLS setting: use etcds://")
            pem[name] = None if path is None else _read_pem(name, path)
        endpoints = [h.strip() for h in hosts.split(",")] if hosts else []
        return cls(
            endpoints=endpoints,
            tls=tls,
            ca=pem["ca_file"],
            cert=pem["cert_file"],
            key=pem["key_file"],
            **merged,
        )

    # -- one operation: its deadline, its round trips, its errors ---------------------

    async def _run(self, key: str | None, work: Callable[[_Operation], Awaitable[_T]]) -> _T:
        """Run one operation within ``timeout_s``, translating failures at one boundary."""
        if self._closed:
            raise LeaseProviderClosed(backend=_BACKEND)
        members = await self._cluster(key)
        loop = asyncio.get_running_loop()
        op = _Operation(self, members, loop.time() + self.timeout_s)
        try:
            return await _bounded(work(op), self.timeout_s)
        except (TimeoutError, asyncio.TimeoutError) as exc:
            why = members.last_failure or f"endpoints {', '.join(self.endpoints)}"
            raise LeaseBackendError(
                f"no answer within {self.timeout_s:g} s ({why})", backend=_BACKEND, key=key
            ) from exc
        except _rpc.AioRpcError as exc:
            raise LeaseBackendError(
                f"{describe(exc)} ({members.last_failure or self._where()})",
                backend=_BACKEND,
                key=key,
            ) from exc

    async def _cluster(self, key: str | None) -> Members:
        if self._members is None:
            # A caller's aetcd.Client: its channel (and auth token) once it is connected.
            client = self._client
            try:
                await _bounded(client.connect(), self.timeout_s)
            except Exception as exc:
                raise LeaseBackendError(
                    f"cannot connect the aetcd client: {type(exc).__name__}: {exc}",
                    backend=_BACKEND,
                    key=key,
                ) from exc
            member = Member(
                self.endpoints[0],
                tls=None,
                credentials=None,
                channel=client.channel,
                metadata=tuple(client.metadata or ()),
            )
            self._members = Members([member], connect_timeout_s=self.connect_timeout_s)
        return self._members

    def _where(self) -> str:
        return f"etcd {', '.join(self.endpoints)}"

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
        """
        members = self._members
        if members is None or self._closed:
            return

        async def revoke() -> None:
            loop = asyncio.get_running_loop()
            op = _Operation(self, members, loop.time() + _CLEANUP_TIMEOUT_S)
            # If the store is failing, the lease expires with its TTL anyway.
            with contextlib.suppress(
                TimeoutError, asyncio.TimeoutError, _rpc.AioRpcError, LeaseBackendError
            ):
                await _bounded(op.revoke(lease_id), _CLEANUP_TIMEOUT_S)

        task = asyncio.get_running_loop().create_task(revoke())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    # -- the contract -------------------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        return await self._run(key, lambda op: op.acquire(key, owner, _ttl_s(ttl_ms)))

    async def get_lease_owner(self, key: str) -> str | None:
        validate_key(key)
        return await self._run(key, lambda op: op.owner(key))

    async def release_lease(self, key: str, owner: str) -> None:
        validate_key(key)
        validate_owner(owner)
        await self._run(key, lambda op: op.release(key, owner))

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
        return await self._run(key, lambda op: op.transfer(key, from_owner, to_owner, ttl_s))

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
        limit = _check_limit(limit)
        return await self._run(prefix, lambda op: op.inspect(prefix, limit))

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
        at its TTL). Never raises for them.
        """
        while self._cleanups:
            await asyncio.gather(*self._cleanups, return_exceptions=True)

    # -- lifecycle ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the channels the provider opened (never a caller's client's)."""
        if self._closed:
            return
        self._closed = True
        # Let pending revocations finish: they are bounded, and they are the
        # difference between no leaked etcd lease and one that waits out its TTL.
        await self.flush()
        if self._members is not None:
            await self._members.close()

    async def __aenter__(self) -> EtcdLeaseProvider:
        # One read now, so a wrong address, TLS setting or password shows up here.
        await self._run(None, lambda op: op.ping())
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
        return f"EtcdLeaseProvider({self._where()}, prefix={self.prefix!r}{state})"


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


class _Operation:
    """One contract operation: its round trips share one deadline and one member list."""

    def __init__(self, provider: EtcdLeaseProvider, members: Members, deadline: float) -> None:
        self.provider = provider
        self.members = members
        self.deadline = deadline
        self.prefix = provider._prefix

    # -- round trips ------------------------------------------------------------------

    async def _call(
        self, invoke: Callable[[_rpc.Stubs, Any, float], Awaitable[_T]], *, safe: bool
    ) -> _T:
        return await self.members.call(invoke, deadline=self.deadline, safe=safe)

    async def range(self, request: _rpc.Request) -> _rpc.RangeResponse:
        response: _rpc.RangeResponse = await self._call(
            lambda s, md, t: s.kv.Range(request, timeout=t, metadata=md), safe=True
        )
        return response

    async def txn(self, request: _rpc.Request) -> _rpc.TxnResponse:
        response: _rpc.TxnResponse = await self._call(
            lambda s, md, t: s.kv.Txn(request, timeout=t, metadata=md), safe=False
        )
        return response

    async def grant(self, ttl_s: int) -> int:
        request = _rpc.lease_grant_request(ttl_s)
        response: _rpc.LeaseGrantResponse = await self._call(
            lambda s, md, t: s.lease.LeaseGrant(request, timeout=t, metadata=md), safe=False
        )
        if response.error:
            raise LeaseBackendError(f"lease grant refused: {response.error}", backend=_BACKEND)
        self.provider._learn_min_ttl(ttl_s, response.TTL)
        return response.ID

    async def revoke(self, lease_id: int) -> None:
        """Revoke an etcd lease (and delete what is bound to it); gone already is fine."""
        request = _rpc.lease_revoke_request(lease_id)

        async def invoke(stubs: _rpc.Stubs, metadata: Any, timeout_s: float) -> None:
            try:
                await stubs.lease.LeaseRevoke(request, timeout=timeout_s, metadata=metadata)
            except _rpc.AioRpcError as exc:
                if exc.code() != _rpc.StatusCode.NOT_FOUND:  # type: ignore[attr-defined]
                    raise

        # Safe to repeat on another member: revoking twice ends the same way.
        await self._call(invoke, safe=True)

    async def keep_alive(self, lease_id: int) -> int:
        """Reset a lease's TTL to its granted TTL; returns that TTL, 0 if the lease is gone."""
        request = _rpc.lease_keep_alive_request(lease_id)

        async def invoke(stubs: _rpc.Stubs, metadata: Any, timeout_s: float) -> int:
            call = stubs.lease.LeaseKeepAlive(timeout=timeout_s, metadata=metadata)
            try:
                await call.write(request)
                response: _rpc.LeaseKeepAliveResponse = await call.read()
                # Half-close and wait for etcd to end the stream, so that no event of
                # this call is still in flight when the caller's event loop closes.
                await call.done_writing()
                await call.code()
            except BaseException:
                call.cancel()
                raise
            return response.TTL

        return await self._call(invoke, safe=True)

    # -- the operations -------------------------------------------------------------------

    def _owner_in(self, kv: _rpc.KeyValue, key: str | None) -> str:
        """The owner a record names, checked against its value."""
        parsed = _keys.split_record_name(self.prefix, kv.key)
        if parsed is None or parsed[1].encode() != kv.value or not kv.lease:
            raise LeaseBackendError(
                f"unexpected data at etcd key {kv.key!r:.80} ({kv.value!r:.40}); is another "
                f"program writing under the prefix {self.provider.prefix!r}?",
                backend=_BACKEND,
                key=key,
            )
        return parsed[1]

    async def owner(self, key: str) -> str | None:
        start, end = _keys.holder_range(self.prefix, key)
        response = await self.range(_txn.read_holder(start, end))
        return self._owner_in(response.kvs[0], key) if response.kvs else None

    async def acquire(self, key: str, owner: str, ttl_s: int) -> LeaseResult:
        start, end = _keys.holder_range(self.prefix, key)
        record = _keys.record_name(self.prefix, key, owner)
        seen = self.provider._seen_held
        look_first = key in seen
        while True:
            if look_first:
                # A key this provider saw held: look before granting, so a held key
                # costs one read and writes nothing.
                found = await self.range(_txn.read_holder(start, end))
                if found.kvs:
                    kv = found.kvs[0]
                    holder = self._owner_in(kv, key)
                    if holder != owner:
                        seen.add(key)
                        return LeaseResult(False, holder, None)
                    if await self._reset_ttl(record, owner, kv.lease, ttl_s):
                        seen.add(key)
                        return LeaseResult(True, owner, kv.create_revision)
                    continue  # our record ended meanwhile (expired): look again
            # Otherwise expect it free: grant, then take it in one transaction.
            lease = await self.grant(ttl_s)
            try:
                reply = await self.txn(_txn.acquire_free(start, end, record, owner.encode(), lease))
            except BaseException:
                self.provider._revoke_later(lease)
                raise
            if reply.succeeded:
                seen.add(key)
                return LeaseResult(True, owner, reply.header.revision)
            kvs = reply.responses[0].response_range.kvs
            holder_now = self._owner_in(kvs[0], key) if kvs else None
            if holder_now == owner:
                # Already ours: move our record onto the lease just granted (the
                # requested TTL), keeping its token.
                token = await self._relet_onto(record, owner, lease)
                if token is not None:
                    seen.add(key)
                    return LeaseResult(True, owner, token)
            else:
                # Never bound (the transaction took its failure branch): revoking it
                # can delete nothing, so the answer need not wait for it.
                self.provider._revoke_later(lease)
                if holder_now is not None:
                    seen.add(key)
                    return LeaseResult(False, holder_now, None)
            look_first = True  # it changed under us: look, then decide

    async def renew(self, key: str, owner: str, ttl_s: int) -> bool:
        record = _keys.record_name(self.prefix, key, owner)
        found = await self.range(_txn.read_record(record))
        if not found.kvs:
            return False
        self._owner_in(found.kvs[0], key)
        return await self._reset_ttl(record, owner, found.kvs[0].lease, ttl_s)

    async def _reset_ttl(self, record: bytes, owner: str, lease: int, ttl_s: int) -> bool:
        """Give ``owner``'s live record a full ``ttl_s`` again; False if it ended."""
        granted_s = await self.keep_alive(lease)
        if granted_s <= 0:
            return False  # the etcd lease expired: the record is gone with it
        if granted_s == self.provider._granted_ttl_s(ttl_s):
            return True
        # A keep-alive restores the TTL the etcd lease was granted with; a different
        # TTL needs a new etcd lease, and the record moved onto it.
        return await self._relet_onto(record, owner, await self.grant(ttl_s)) is not None

    async def _relet_onto(self, record: bytes, owner: str, fresh: int) -> int | None:
        """Move ``owner``'s live record onto the etcd lease ``fresh`` and revoke the old
        one; returns the (unchanged) token, or None (and revokes ``fresh``) if it ended.

        Both revocations run in the background: neither lease carries a record then.
        """
        try:
            reply = await self.txn(_txn.relet(record, owner.encode(), fresh))
        except BaseException:
            self.provider._revoke_later(fresh)
            raise
        if not reply.succeeded:
            self.provider._revoke_later(fresh)
            return None
        previous = reply.responses[0].response_put.prev_kv
        if previous.lease and previous.lease != fresh:
            self.provider._revoke_later(previous.lease)
        return previous.create_revision

    async def release(self, key: str, owner: str) -> None:
        record = _keys.record_name(self.prefix, key, owner)
        reply = await self.txn(_txn.release(record, owner.encode()))
        if reply.succeeded:
            # The key is free from this transaction on. The etcd lease the record was
            # on now carries nothing: revoking it is housekeeping, off the caller's path.
            self.provider._seen_held.discard(key)
            for kv in reply.responses[0].response_delete_range.prev_kvs:
                if kv.lease:
                    self.provider._revoke_later(kv.lease)

    async def transfer(self, key: str, from_owner: str, to_owner: str, ttl_s: int) -> bool:
        from_record = _keys.record_name(self.prefix, key, from_owner)
        to_record = _keys.record_name(self.prefix, key, to_owner)
        lease = await self.grant(ttl_s)
        try:
            reply = await self.txn(
                _txn.transfer(from_record, from_owner.encode(), to_record, to_owner.encode(), lease)
            )
        except BaseException:
            self.provider._revoke_later(lease)
            raise
        if not reply.succeeded:
            self.provider._revoke_later(lease)  # never bound
            return False
        for kv in reply.responses[0].response_delete_range.prev_kvs:
            if kv.lease and kv.lease != lease:
                self.provider._revoke_later(kv.lease)  # its record was just deleted
        return True

    async def inspect(self, key_prefix: str | None, limit: int) -> list[LeaseRecord]:
        start, end = _keys.prefix_range(self.prefix, key_prefix)
        found: list[tuple[str, str, int, int]] = []
        while len(found) < limit:
            batch = await self.range(
                _rpc.range_request(start, end, limit=min(_INSPECT_BATCH, limit - len(found)))
            )
            for kv in batch.kvs:
                parsed = _keys.split_record_name(self.prefix, kv.key)
                if parsed is None or parsed[1].encode() != kv.value or not kv.lease:
                    continue  # not ours; inspect reports, it does not judge
                found.append((parsed[0], parsed[1], kv.create_revision, kv.lease))
            if not batch.more or not batch.kvs:
                break
            start = batch.kvs[-1].key + b"\x00"
        gate = asyncio.Semaphore(_INSPECT_PARALLEL)

        async def remaining_s(lease_id: int) -> int:
            request = _rpc.lease_time_to_live_request(lease_id)
            async with gate:
                response: _rpc.LeaseTimeToLiveResponse = await self._call(
                    lambda s, md, t: s.lease.LeaseTimeToLive(request, timeout=t, metadata=md),
                    safe=True,
                )
            return response.TTL

        ttls = await asyncio.gather(*(remaining_s(lease) for *_, lease in found))
        return [
            LeaseRecord(key, owner, token, ttl * 1000)
            for (key, owner, token, _), ttl in zip(found, ttls, strict=True)
            if ttl > 0
        ]

    async def lease_ids(self) -> list[int]:
        request = _rpc.lease_leases_request()
        response: _rpc.LeaseLeasesResponse = await self._call(
            lambda s, md, t: s.lease.LeaseLeases(request, timeout=t, metadata=md), safe=True
        )
        return sorted(status.ID for status in response.leases)

    async def ping(self) -> None:
        await self.range(_rpc.range_request(self.prefix, keys_only=True))


async def _bounded(awaitable: Awaitable[_T], timeout_s: float) -> _T:
    """Await within ``timeout_s``; raises ``TimeoutError`` when it runs out."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout_s):
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout_s)  # pragma: no cover (3.10)


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
    if not isinstance(endpoint, str) or not endpoint:
        raise InvalidLeaseArgument.for_argument(
            "endpoints", f"each must be 'host:port', got {endpoint!r}"
        )
    host, port = endpoint, ""
    if endpoint.startswith("["):
        end = endpoint.find("]")
        if end < 0:
            raise InvalidLeaseArgument.for_argument("endpoints", f"unclosed '[' in {endpoint!r}")
        host, rest = endpoint[: end + 1], endpoint[end + 1 :]
        if rest and not rest.startswith(":"):
            raise InvalidLeaseArgument.for_argument("endpoints", f"not host:port: {endpoint!r}")
        port = rest[1:]
    elif ":" in endpoint:
        host, _, port = endpoint.rpartition(":")
    if host in ("", "[]") or any(c in host for c in "/?#@, "):
        raise InvalidLeaseArgument.for_argument("endpoints", f"not host:port: {endpoint!r}")
    if port:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidLeaseArgument.for_argument("endpoints", f"bad port in {endpoint!r}")
        return f"{host}:{int(port)}"
    return f"{host}:{_DEFAULT_PORT}"


def _check_prefix(prefix: object) -> bytes:
    if not isinstance(prefix, str):
        raise InvalidLeaseArgument.for_argument(
            "prefix", f"must be a str, got {type(prefix).__name__}"
        )
    try:
        raw = prefix.encode()
    except UnicodeEncodeError:
        raise InvalidLeaseArgument.for_argument("prefix", "must be encodable as UTF-8") from None
    if not 1 <= len(raw) <= _MAX_PREFIX_BYTES:
        raise InvalidLeaseArgument.for_argument(
            "prefix", f"must be 1 to {_MAX_PREFIX_BYTES} UTF-8 bytes, got {len(raw)}"
        )
    return raw


def _check_credentials(username: object, password: object) -> Credentials | None:
    if username is None and password is None:
        return None
    if not isinstance(username, str) or not username:
        raise InvalidLeaseArgument.for_argument("username", "a password needs a non-empty username")
    if not isinstance(password, str):
        raise InvalidLeaseArgument.for_argument("password", "a username needs a password (a str)")
    return Credentials(username, password)


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidLeaseArgument.for_argument("limit", f"must be an int >= 1, got {limit!r}")
    return limit


def _check_timeout(name: str, timeout_s: object) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
        raise InvalidLeaseArgument.for_argument(name, f"must be a number, got {timeout_s!r}")
    if not 0 < timeout_s <= 3600:
        raise InvalidLeaseArgument.for_argument(name, f"must be in (0, 3600], got {timeout_s!r}")
    return float(timeout_s)


def _coerce_option(name: str, value: str) -> Any:
    if name in ("timeout_s", "connect_timeout_s"):
        try:
            return float(value)
        except ValueError:
            raise InvalidLeaseArgument.for_argument(
                name, f"must be a number, got {value!r}"
            ) from None
    return value


def _redact(url: str) -> str:
    """``url`` with any password replaced, fit for error messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.partition("@")[2] or url
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hosts}"))
