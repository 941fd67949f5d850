"""The lease contract: what every backend implements, and the one argument validator.

Implementers need not inherit from :class:`LeaseProvider`: it is a
:class:`typing.Protocol`, and leasekit detects providers structurally
(:func:`leasekit.is_lease_provider`), so a class written without importing leasekit
at all still qualifies. Inheriting is allowed and gives type checkers something to
check against.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from ._capabilities import Capabilities, capabilities_of
from ._errors import BackendLacksCapability, InvalidLeaseArgument

__all__ = [
    "MAX_METADATA_BYTES",
    "MAX_NAME_BYTES",
    "MAX_TTL_MS",
    "LeaseProvider",
    "LeaseResult",
    "ManagedLeaseProvider",
    "metadata_for",
    "validate_key",
    "validate_metadata",
    "validate_owner",
    "validate_ttl_ms",
]

MAX_NAME_BYTES = 1024
"""Longest key or owner, in UTF-8 bytes."""

MAX_TTL_MS = 2**31 - 1
"""Longest lease, in milliseconds (about 24.8 days): fits every backend's TTL type."""

MAX_METADATA_BYTES = 4096
"""Largest lease metadata, in bytes (a ``str`` counts its UTF-8 bytes): an address, a
queue name or a small JSON object, not a payload."""


@dataclass(frozen=True, slots=True, init=False)
class LeaseResult:
    """The outcome of :meth:`LeaseProvider.acquire_lease`.

    ``acquired`` says whether the caller holds the lease now. ``owner`` is the holder:
    the caller when acquired, otherwise the current holder (``None`` only when the
    holder's lease expired between the check and the answer). ``token`` is the fencing
    token of the caller's lease on backends that declare ``fencing=True``; ``None``
    when denied or when the backend has no fencing. ``metadata`` is the holder's
    metadata (:data:`MAX_METADATA_BYTES` at most, stored with the grant on backends that
    declare ``metadata=True``): the caller's own when acquired, the holder's when denied,
    so a loser learns where to route in the same round trip; ``None`` when the holder
    stored none.
    """

    acquired: bool
    owner: str | None
    token: int | None = None
    metadata: bytes | None = None

    def __init__(
        self,
        acquired: bool,
        owner: str | None,
        token: int | None = None,
        metadata: bytes | None = None,
    ) -> None:
        # What dataclass's frozen __init__ does (object.__setattr__ per field), through
        # the slots' own setters, at a third less: every acquire builds one.
        _set_acquired(self, acquired)
        _set_owner(self, owner)
        _set_token(self, token)
        _set_metadata(self, metadata)

    def __repr__(self) -> str:
        # Metadata shows only when there is some: most backends and callers have none.
        extra = "" if self.metadata is None else f", metadata={self.metadata!r}"
        return (
            f"LeaseResult(acquired={self.acquired!r}, owner={self.owner!r}, "
            f"token={self.token!r}{extra})"
        )


_set_acquired = LeaseResult.__dict__["acquired"].__set__
_set_owner = LeaseResult.__dict__["owner"].__set__
_set_token = LeaseResult.__dict__["token"].__set__
_set_metadata = LeaseResult.__dict__["metadata"].__set__


class LeaseProvider(Protocol):
    """The five operations every lease backend implements, with identical semantics.

    All five are atomic on the store and decided by the store's clock. Every backend
    validates its arguments with :func:`validate_key`, :func:`validate_owner` and
    :func:`validate_ttl_ms` before any I/O.
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        """Take ``key`` for ``owner`` for ``ttl_ms`` if it is free, expired, or already ours.

        Re-acquiring a lease the owner already holds resets its TTL and keeps its
        token. A denied acquire reports the current holder.
        """
        ...

    async def get_lease_owner(self, key: str) -> str | None:
        """Return the live holder of ``key``, or ``None`` if it is free or expired."""
        ...

    async def release_lease(self, key: str, owner: str) -> None:
        """Free ``key`` if ``owner`` holds it; otherwise do nothing (never disturbs the holder)."""
        ...

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Reset the TTL of ``owner``'s live lease; ``False`` (and no change) if not the holder."""
        ...

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Hand ``from_owner``'s live lease to ``to_owner`` with a fresh ``ttl_ms``.

        On backends with ``atomic_transfer=True`` the key is never free in between.
        ``False`` (and no change) if ``from_owner`` is not the live holder.
        """
        ...


class ManagedLeaseProvider(LeaseProvider, Protocol):
    """A provider as backends build it: the contract plus capabilities and a lifecycle.

    What :func:`leasekit.connect` returns. Use it as ``async with`` (or call
    :meth:`aclose`); operations after closing raise :class:`LeaseProviderClosed`.
    """

    @property
    def capabilities(self) -> Capabilities:
        """The guarantees this backend declares."""
        ...

    async def aclose(self) -> None:
        """Release connections the provider opened (never a caller's own client)."""
        ...

    async def __aenter__(self) -> ManagedLeaseProvider: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def _describe(value: object) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _validate_name(value: object, argument: str) -> str:
    """The full check, for what the callers' fast path did not accept at once.

    That fast path: a plain ASCII ``str`` (``isascii`` is O(1) in CPython) of 1 to 1024
    characters has one UTF-8 byte per character and no surrogate, so it needs no
    encoding to be judged.
    """
    if not isinstance(value, str):
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be a str, got {_describe(value)}", value
        )
    if not value:
        raise InvalidLeaseArgument.for_argument(argument, "must not be empty", value)
    # The encode has to run to reject lone surrogates, which no store can round-trip.
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidLeaseArgument.for_argument(
            argument,
            f"must be encodable as UTF-8 (lone surrogate at index {exc.start})",
            value,
        ) from None
    if size > MAX_NAME_BYTES:
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be at most {MAX_NAME_BYTES} UTF-8 bytes, got {size}", value
        )
    return value


def validate_key(key: object, argument: str = "key") -> str:
    """Check a lease key and return it: a non-empty ``str`` of at most 1024 UTF-8 bytes.

    Any code point UTF-8 can encode is allowed, NUL included; lone surrogates are not.
    Raises :class:`InvalidLeaseArgument` naming ``argument``.
    """
    if type(key) is str and key.isascii() and 0 < len(key) <= MAX_NAME_BYTES:
        return key  # the common case, without a second call
    return _validate_name(key, argument)


def validate_owner(owner: object, argument: str = "owner") -> str:
    """Check an owner id and return it; the same rules as :func:`validate_key`."""
    if type(owner) is str and owner.isascii() and 0 < len(owner) <= MAX_NAME_BYTES:
        return owner  # the common case, without a second call
    return _validate_name(owner, argument)


def validate_ttl_ms(ttl_ms: object, argument: str = "ttl_ms") -> int:
    """Check a TTL and return it: an ``int`` (not ``bool``, not ``float``) in 1..2**31-1."""
    if type(ttl_ms) is int and 1 <= ttl_ms <= MAX_TTL_MS:
        return ttl_ms  # the common case
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int):
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be an int number of milliseconds, got {_describe(ttl_ms)}", ttl_ms
        )
    if not 1 <= ttl_ms <= MAX_TTL_MS:
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be between 1 and {MAX_TTL_MS} milliseconds, got {ttl_ms}", ttl_ms
        )
    return int(ttl_ms)


def validate_metadata(metadata: object, argument: str = "metadata") -> bytes | None:
    """Check lease metadata and return it as ``bytes`` (``None`` stays ``None``).

    ``bytes`` (or a ``bytearray``/``memoryview``) are stored as they are, any byte
    included; a ``str`` is stored as its UTF-8 bytes (lone surrogates refused). At most
    :data:`MAX_METADATA_BYTES` bytes. Raises :class:`InvalidLeaseArgument` naming
    ``argument`` for anything else, before any I/O.
    """
    if metadata is None or type(metadata) is bytes:
        data = metadata
    elif isinstance(metadata, str):
        try:
            data = metadata.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidLeaseArgument.for_argument(
                argument,
                f"must be encodable as UTF-8 (lone surrogate at index {exc.start})",
                metadata,
            ) from None
    elif isinstance(metadata, bytes | bytearray | memoryview):
        data = bytes(metadata)
    else:
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be bytes, str or None, got {_describe(metadata)}", metadata
        )
    if data is not None and len(data) > MAX_METADATA_BYTES:
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be at most {MAX_METADATA_BYTES} bytes, got {len(data)}", metadata
        )
    return data


def metadata_for(provider: object, metadata: object, argument: str = "metadata") -> bytes | None:
    """Check ``metadata`` for an acquire or transfer on ``provider``, before any I/O.

    Returns it as ``bytes`` (:func:`leasekit.validate_metadata`), or ``None``. Metadata
    on a provider that does not declare ``Capabilities(metadata=True)`` raises
    :class:`BackendLacksCapability`: it would be dropped, and the callers routing by it
    would be sent nowhere.
    """
    data = validate_metadata(metadata, argument)
    if data is not None and not capabilities_of(provider).metadata:
        name = getattr(provider, "backend", None) or type(provider).__name__
        raise BackendLacksCapability(
            f"backend {name!r} cannot store lease metadata (Capabilities.metadata is false)",
            backend=str(name),
            missing=("metadata",),
        )
    return data
