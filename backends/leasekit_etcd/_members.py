"""The cluster as the backend sees it: one gRPC channel per endpoint, and failover.

The failover rules below are written once, as a sans-I/O generator
(:meth:`Members.failover`) that yields steps (:class:`Connected`, :class:`Refuses`,
:class:`Attempt`, :class:`Pause`); the asyncio transport (``_aio``) and the blocking
one (``_blocking``) each run those steps on their own kind of channel.

``aetcd.Client`` talks to one endpoint. A consensus store is worth its price only if
the client survives losing a member, so this thin layer does what etcd's Go client
(clientv3) does, and no more:

- Calls go to a *pinned* member, the last one that answered. With several endpoints,
  a member whose channel is not connected (refused, down, still connecting after
  ``connect_timeout_s``) is skipped before anything is sent to it.
- Every call carries gRPC metadata ``hasleader: true``: a member cut off from the
  quorum then refuses at once with "etcdserver: no leader" instead of waiting, and
  nothing was applied, so the call moves on to the next member. So does a call that
  found no connection to make (refused): it was never sent.
- While no member takes a call, it is tried again until the operation's deadline:
  an election or a restart that ends in time is invisible, one that does not is a
  timeout naming the last failure. When every member refuses connections outright
  (nothing listening), waiting would only delay the same answer: the call fails at
  once.
- Reads and keep-alives (*safe* calls: repeating them changes nothing) also move on
  after a timeout or a lost connection; they get a share of the time budget per
  member, so a frozen member cannot eat all of it. Writes never do: a write that
  may have reached a member has an unknown outcome, and is reported as such
  (``LeaseBackendError``) rather than repeated. This is clientv3's rule for
  mutations.
- A member that timed out or dropped its connection loses the pin, so the next call
  starts with another one.

Authentication (``user:password@`` in the URL) uses etcd's ``Authenticate`` per
member (simple tokens are only valid on the member that issued them), again when
the member says the token expired.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import _rpc

__all__ = [
    "CHANNEL_OPTIONS",
    "SETTLE_S",
    "Attempt",
    "Connected",
    "Credentials",
    "GrpcState",
    "Member",
    "Members",
    "Pause",
    "Refuses",
    "Step",
    "TlsFiles",
    "channel_opener",
    "describe",
    "failed_to_connect",
    "status",
]

# How long ``close`` lets gRPC deliver the last events of calls that were cancelled
# or failed (by a deadline, a reset stream, or closing the channel under them). A
# cancelled call's final batch completes in gRPC's core at once, but reaches this
# event loop through gRPC's poller thread; if the loop closes first, gRPC forwards it
# to the closed loop later, from whatever loop runs gRPC next, and that loop reports
# "Event loop is closed".
SETTLE_S = 0.25

Metadata = tuple[tuple[str, str], ...]

_BASE_METADATA: Metadata = (("hasleader", "true"),)

# gRPC channel settings: reconnect quickly once a member is back (the default backoff
# grows to two minutes), and notice a dead connection while calls are waiting on it.
# etcd refuses keepalive pings more often than every 5 s (--grpc-keepalive-min-time).
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
)


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM contents (already read) for a TLS channel; ``None`` means gRPC's default."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None


def _was_not_applied(exc: Exception) -> bool:
    """Whether the call certainly changed nothing: it never reached a member (no
    connection could be made), or the member refused it for want of a leader."""
    code, details = status(exc)
    return code == _rpc.StatusCode.UNAVAILABLE and (
        "no leader" in details or "failed to connect to all addresses" in details
    )


def failed_to_connect(exc: Exception) -> bool:
    """Whether gRPC found no connection to make: refused, unresolvable, or a TLS failure."""
    code, details = status(exc)
    return code == _rpc.StatusCode.UNAVAILABLE and "failed to connect to all addresses" in details


def _is_tls_failure(exc: Exception) -> bool:
    # A handshake that failed fails the same way next time: no point in waiting.
    _, details = status(exc)
    return "handshake" in details.lower() or "ssl" in details.lower()


def _is_expired_token(exc: Exception) -> bool:
    code, details = status(exc)
    return code == _rpc.StatusCode.UNAUTHENTICATED and "invalid auth token" in details


def _is_transient(exc: Exception) -> bool:
    code, _ = status(exc)
    return code in (_rpc.StatusCode.UNAVAILABLE, _rpc.StatusCode.DEADLINE_EXCEEDED)


def status(exc: Exception) -> tuple[Any, str]:
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    return (
        code() if callable(code) else None,
        (details() if callable(details) else None) or "",
    )


def describe(exc: BaseException) -> str:
    """A one-line account of a gRPC failure: status code and etcd's message."""
    code, details = status(exc) if isinstance(exc, Exception) else (None, "")
    if code is None:
        return f"{type(exc).__name__}: {exc}"
    return f"{getattr(code, 'name', code)}: {details or 'no details'}"


class GrpcState:
    """Whether this process has opened a gRPC channel, so gRPC's core has started: a
    child forked after that cannot use gRPC at all (its core's threads and pollers are
    not in the child; grpc.aio has no fork support), on any channel, old or new."""

    started = False


OpenChannel = Callable[[str, TlsFiles | None], _rpc.Channel]
"""Opens a transport's kind of channel (asyncio or blocking) to an address."""


def channel_opener(*, blocking: bool) -> OpenChannel:
    """Opens grpc.aio channels, or blocking ones, with this module's settings and TLS."""

    def open_channel(address: str, tls: TlsFiles | None) -> _rpc.Channel:
        if tls is None:
            insecure = _rpc.blocking_insecure_channel if blocking else _rpc.insecure_channel
            return insecure(address, CHANNEL_OPTIONS)
        creds = _rpc.ssl_credentials(tls.ca, tls.key, tls.cert)
        secure = _rpc.blocking_secure_channel if blocking else _rpc.secure_channel
        return secure(address, creds, CHANNEL_OPTIONS)

    return open_channel


class Member:
    """One endpoint: its channel (opened on first use by ``open_channel``), stubs, token."""

    def __init__(
        self,
        address: str,
        *,
        tls: TlsFiles | None,
        credentials: Credentials | None,
        open_channel: OpenChannel | None = None,
        channel: _rpc.Channel | None = None,
        metadata: Metadata = (),
    ) -> None:
        self.address = address
        self._tls = tls
        self._credentials = credentials
        self._open_channel = open_channel
        self._channel = channel
        self._closed = False
        if channel is not None:
            GrpcState.started = True
        self.owns_channel = channel is None
        self._stubs = None if channel is None else _rpc.Stubs(channel)
        self._extra_metadata = metadata
        self._token: str | None = None

    @property
    def channel(self) -> _rpc.Channel:
        if self._channel is None:
            if self._closed or self._open_channel is None:
                # Closed: a late call (a background revocation) must not open it again.
                raise ConnectionError(f"{self.address}: the provider closed its channel")
            GrpcState.started = True
            self._channel = self._open_channel(self.address, self._tls)
            self._stubs = _rpc.Stubs(self._channel)
        return self._channel

    @property
    def opened(self) -> bool:
        return self._channel is not None

    def take_channel(self) -> _rpc.Channel | None:
        """The channel to close (None if never opened or a caller's); never opened again."""
        channel, self._channel = self._channel, None
        self._closed = True
        return channel if self.owns_channel else None

    @property
    def stubs(self) -> _rpc.Stubs:
        _ = self.channel
        assert self._stubs is not None
        return self._stubs

    @property
    def metadata(self) -> Metadata:
        token: Metadata = () if self._token is None else (("token", self._token),)
        return _BASE_METADATA + self._extra_metadata + token

    @property
    def needs_token(self) -> bool:
        return self._credentials is not None and self._token is None

    @property
    def authenticates(self) -> bool:
        return self._credentials is not None

    def authenticate_request(self) -> _rpc.Request:
        assert self._credentials is not None
        return _rpc.authenticate_request(self._credentials.username, self._credentials.password)

    def got_token(self, response: Any) -> None:
        self._token = str(response.token)

    def forget_token(self) -> None:
        self._token = None


class Connected(NamedTuple):
    """Step: is ``member``'s channel connected, or does it connect within ``wait_s``?
    Answered with a bool; a channel that failed to connect is reported at once."""

    member: Member
    wait_s: float


class Refuses(NamedTuple):
    """Step: is a new TCP connection to ``member`` refused right now? (a bool)

    gRPC repeats the refusal of its last attempt for as long as it waits before the
    next one (up to a second here), so a member that has just come back would still
    look down; the member's port itself tells. Anything but a refusal (a timeout, an
    unreachable network) is not one.
    """

    member: Member
    wait_s: float


class Attempt(NamedTuple):
    """Step: the call itself on ``member`` (authenticating first if it needs a token),
    bounded by ``timeout_s``; answered with its reply, or its gRPC error thrown in."""

    member: Member
    timeout_s: float


class Pause(NamedTuple):
    """Step: sleep ``seconds`` before the next pass over the members."""

    seconds: float


Step = Connected | Refuses | Attempt | Pause


class Members:
    """The endpoints of one cluster, with the failover rules described above."""

    def __init__(self, members: Sequence[Member], *, connect_timeout_s: float) -> None:
        self.members = list(members)
        self.connect_timeout_s = connect_timeout_s
        self._pinned = 0
        self.last_failure: str | None = None
        self.in_flight = 0
        #: when a call was last cut off (cancelled, or failed): see ``SETTLE_S``
        self.cut_off_at: float | None = None
        self.streams_opened = False
        """Set by a caller that opened a stream of its own (a watch) on a member's channel."""

    @property
    def pinned(self) -> Member:
        return self.members[self._pinned]

    def _unpin(self, member: Member) -> None:
        if self.members[self._pinned] is member:
            self._pinned = (self._pinned + 1) % len(self.members)

    def failover(
        self, *, deadline: float, safe: bool, now: Callable[[], float]
    ) -> Generator[Step, Any, Any]:
        """One call on a member, failing over as above: yields steps, returns the reply.

        ``deadline`` is the ``now()`` by which the whole call must be done (the provider
        also bounds it, so this never outlives it). While no member can take the call
        (no leader yet, a member restarting) it keeps trying, so a restart or an
        election within the deadline is invisible to the caller. But when every member
        refuses connections, nobody is listening: that is raised at once
        (``ConnectionRefusedError``, or gRPC's own error for a failed TLS handshake).
        """
        count = len(self.members)
        pause_s = 0.02
        while True:
            unreachable = 0
            connect_error: Exception | None = None
            for offset in range(count):
                index = (self._pinned + offset) % count
                member = self.members[index]
                remaining = deadline - now()
                if remaining <= 0:
                    raise TimeoutError
                if count > 1 and not (
                    yield Connected(member, min(remaining, self.connect_timeout_s))
                ):
                    self.last_failure = f"{member.address}: not connected"
                    unreachable += yield Refuses(member, self.connect_timeout_s)
                    continue
                try:
                    result = yield from self._attempt(member, deadline, safe=safe, now=now)
                except _rpc.RpcError as exc:
                    self.last_failure = f"{member.address}: {describe(exc)}"
                    if _was_not_applied(exc) or (safe and _is_transient(exc)):
                        if failed_to_connect(exc) and (
                            _is_tls_failure(exc) or (yield Refuses(member, self.connect_timeout_s))
                        ):
                            unreachable += 1
                            connect_error = exc
                        self._unpin(member)
                        continue
                    if _is_transient(exc):
                        self._unpin(member)
                    raise
                self._pinned = index
                self.last_failure = None
                return result
            if unreachable == count:
                if connect_error is not None and (count == 1 or _is_tls_failure(connect_error)):
                    raise connect_error
                self.last_failure = None  # the message names them all
                raise ConnectionRefusedError("every member refused the connection")
            # No member took the call in this pass: give them a moment, then try again.
            yield Pause(min(pause_s, max(0.0, deadline - now())))
            pause_s = min(pause_s * 2, 0.25)

    def _attempt(
        self, member: Member, deadline: float, *, safe: bool, now: Callable[[], float]
    ) -> Generator[Step, Any, Any]:
        for tries in range(2):
            remaining = deadline - now()
            if remaining <= 0:
                raise TimeoutError
            if safe and len(self.members) > 1:
                # A frozen member must leave time for the others.
                remaining = min(remaining, max(0.25, remaining / 2))
            try:
                return (yield Attempt(member, remaining))
            except GeneratorExit:  # cancelled
                self.cut_off_at = now()
                raise
            except _rpc.RpcError as exc:
                # A call that failed (its gRPC deadline passed, its stream was reset) may
                # still owe this loop completions of its other operations, as a
                # cancelled one does.
                self.cut_off_at = now()
                # An expired token is refused before anything is applied: renew, repeat.
                if tries == 0 and _is_expired_token(exc) and member.authenticates:
                    member.forget_token()
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover
